"""The FNO quality bar on Darcy flow with parop's FNO: `darcy_flow(1000, 32, seed=0)`,
800 train / 200 test, width 32, 4 Fourier layers, 12x12 modes, Adam 1e-3 with cosine
decay, batch 20, 1,200 steps, relative L2 loss (the protocol of
`benchmarks/plain_fno.py`). Prints the test error and the median training step time.

    python benchmarks/fno_darcy.py                      # serial
    python benchmarks/fno_darcy.py --partition 1 1 2 4  # on 8 forced CPU devices
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

from parop.datasets import darcy_flow
from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit


def run(steps: int = 1200, partition: tuple[int, ...] | None = None, seed: int = 0) -> dict:
    a, u = darcy_flow(1000, 32, seed=0)
    a_norm, u_norm = UnitGaussianNormalizer.fit(a[:800]), UnitGaussianNormalizer.fit(u[:800])
    x = a_norm.encode(a)[:, None]
    y = u[:, None]
    decode = lambda v: u_norm.decode(v[:, 0])[:, None]
    model = FNO(batch=20, grid=(32, 32), width=32, modes=(12, 12), layers=4)
    if partition:
        model = model.distribute(partition)
    θ = model.init(jax.random.key(seed))
    start = time.perf_counter()
    θ, losses = fit(model, θ, x[:800], y[:800], steps=steps, batch=20, decode=decode, seed=seed, progress=False)
    seconds = time.perf_counter() - start
    error = evaluate(model, θ, x[800:], y[800:], batch=20, decode=decode)
    return {"test_error": error, "seconds": seconds, "step_ms": 1e3 * seconds / steps, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partition", type=int, nargs="+")
    args = parser.parse_args()
    r = run(args.steps, tuple(args.partition) if args.partition else None, args.seed)
    print(f"relative L2 test error: {r['test_error']:.4f}")
    print(f"training: {r['seconds']:.1f} s, {r['step_ms']:.1f} ms per step (mean, compile included)")
    print(f"final training loss: {np.mean(r['losses'][-20:]):.4f}")


if __name__ == "__main__":
    main()
