"""The price of `FNO(..., remat=True)`: one Adam training step with and without, on a
model that runs here (a 4-D FNO, 16³ x 8 grid, width 20, modes 4³ x 4, 4 layers, batch
1, serial and on 8 forced CPU devices as (1, 1, 2, 2, 2, 1)), timed interleaved
(medians over rounds, every step awaited), with the dry run's memory of each.

`python benchmarks/remat_speed.py [--rounds 15]`
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"])

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from parop.nn import FNO, dry_run, relative_l2  # noqa: E402
from parop.nn.train import as_real, make_step  # noqa: E402

GRID, MODES = (16, 16, 16, 8), (4, 4, 4, 4)


def stepper(model):
    """A ready training step of `model` on one sample: `run()` does one step, awaited."""
    θ = model.init(jax.random.key(0))
    optimizer = optax.adam(1e-3)
    θr = as_real(θ)
    state = optimizer.init(θr)
    rng = np.random.default_rng(0)
    a = jax.numpy.asarray(rng.standard_normal((1, 1) + GRID), jax.numpy.float32)
    u = jax.numpy.asarray(rng.standard_normal((1, 1) + GRID), jax.numpy.float32)
    if model.distributed:
        a, u = jax.device_put(a, model.in_sharding), jax.device_put(u, model.operators(1)[-1].out_sharding)
    step = make_step(lambda θ, a, u: relative_l2(model.apply(θ, a), u), optimizer, θ)

    def run():
        jax.block_until_ready(step(θr, state, a, u))

    run()  # compile
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    print("| model | remat=False | remat=True | time ratio | memory per device (dry run) |")
    print("|---|---|---|---|---|")
    for partition in (None, (1, 1, 2, 2, 2, 1)):
        models = [FNO(GRID, width=20, modes=MODES, layers=4, remat=r) for r in (False, True)]
        if partition is not None:
            models = [m.distribute(partition) for m in models]
        runs = [stepper(m) for m in models]
        times = [[], []]
        for _ in range(args.rounds):
            for k, run in enumerate(runs):
                start = time.perf_counter()
                run()
                times[k].append(time.perf_counter() - start)
        t0, t1 = (float(np.median(t)) for t in times)
        m0, m1 = (dry_run(m, 1)["memory_bytes"] / 2**20 for m in models)
        name = "serial" if partition is None else f"{partition}, 8 devices"
        print(f"| {name} | {t0 * 1e3:.0f} ms | {t1 * 1e3:.0f} ms | {t1 / t0:.2f} | "
              f"{m0:.0f} MiB -> {m1:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
