"""The FNO quality bars on Darcy flow with parop's FNO, on the protocols of
`benchmarks/plain_fno.py` (the same data, sizes, optimiser and steps as the plain-JAX
FNO there):

- 2-D: `darcy_flow(1000, 32, seed=0)`, 800 train / 200 test, width 32, 4 Fourier
  layers, modes 12x12, batch 20, 1,200 steps;
- 3-D: `darcy_flow(500, 24, dim=3, seed=0)`, 400 train / 100 test, width 16, 4
  layers, modes 8³, batch 10, 1,200 steps;

Adam 1e-3 with cosine decay, relative L2 loss. Prints the test error and the median
training step time.

    python benchmarks/fno_darcy.py                               # 2-D, serial
    python benchmarks/fno_darcy.py --dim 3 --partition 1 1 2 2 2   # 3-D on 8 forced CPU devices
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if "--partition" in sys.argv and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.plain_fno import PROTOCOLS  # noqa: E402
from parop.datasets import darcy_flow  # noqa: E402
from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit  # noqa: E402


def run(dim: int = 2, steps: int | None = None, partition: tuple[int, ...] | None = None, seed: int = 0) -> dict:
    protocol = PROTOCOLS[dim]
    steps = steps or protocol.steps
    n, split = protocol.n_train + protocol.n_test, protocol.n_train
    a, u = darcy_flow(n, protocol.resolution, dim=dim, seed=0)
    a_norm, u_norm = UnitGaussianNormalizer.fit(a[:split]), UnitGaussianNormalizer.fit(u[:split])
    x, y = a_norm.encode(a)[:, None], u[:, None]
    decode = lambda v: u_norm.decode(v[:, 0])[:, None]  # noqa: E731
    model = FNO((protocol.resolution,) * dim, width=protocol.width, modes=protocol.parop_modes,
                layers=protocol.layers)
    place = None
    if partition:
        model = model.distribute(partition, batch=protocol.batch_size)
        place = lambda v: jax.device_put(v, model.in_sharding)  # noqa: E731
    θ = model.init(jax.random.key(seed))
    ends = [time.perf_counter()]
    θ, losses = fit(model, θ, x[:split], y[:split], steps=steps, batch=protocol.batch_size, decode=decode,
                    seed=seed, progress=False, place=place, callback=lambda i, loss: ends.append(time.perf_counter()))
    seconds, step_times = ends[-1] - ends[0], np.diff(ends)
    error = evaluate(model, θ, x[split:], y[split:], batch=protocol.batch_size, decode=decode, place=place)
    return {"test_error": error, "seconds": seconds, "step_s": float(np.median(step_times[1:])), "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, choices=sorted(PROTOCOLS), default=2)
    parser.add_argument("--steps", type=int, help="default: the protocol's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partition", type=int, nargs="+", help="over (batch, channel, *grid)")
    args = parser.parse_args()
    r = run(args.dim, args.steps, tuple(args.partition) if args.partition else None, args.seed)
    print(f"relative L2 test error: {r['test_error']:.4f}")
    print(f"training: {r['seconds']:.1f} s, median step {1e3 * r['step_s']:.1f} ms")
    print(f"final training loss: {np.mean(r['losses'][-20:]):.4f}")


if __name__ == "__main__":
    main()
