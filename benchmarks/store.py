"""Reading training data from a zarr store: the read throughput of one process, and the
time a training step waits for its batch with prefetching on and off.

    python -m benchmarks.store [--quick]

A Darcy store (`parop.datasets.write_darcy`, 3-D, float32, the default chunks: a file
per chunk, each sample's first two grid axes cut in 4) is written to a temporary directory; then

- **reads**: `ds.batch(indices, sharding)` of random batches, unsharded (one device)
  and into a distributed FNO's `in_sharding` (8 devices), timed over several batches;
  the bytes are counted by a `CountingStore` (what the process read), the throughput
  is those bytes over the time;
- **steps**: `fit` of a small serial FNO (its step about as long as a read: where
  waiting for data matters) from in-memory arrays (no reading), from
  the store with `prefetch=False` (each batch read when the step needs it) and with
  `prefetch=True` (read in a background thread while the step before runs), the three
  runs alternating, twice. A step's time is the median interval between the
  `callback`s of consecutive steps (the first steps, which compile, are left out); the
  wait for data is a store run's step time less the in-memory one.

The process holds all 8 (forced CPU) devices here, so it reads every block; with the
batch or a grid axis split over P processes each reads 1/P of the data (exactly, as
`tests/test_multiprocess.py` counts), at about this rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from parop.datasets import CountingStore, open_store, write_darcy  # noqa: E402
from parop.nn import FNO, fit  # noqa: E402

SIZES = {  # grid side, samples, batch, steps, model
    False: dict(side=32, samples=64, batch=8, steps=16, width=4, modes=(4, 4, 4), layers=1, rounds=2),
    True: dict(side=16, samples=16, batch=4, steps=8, width=4, modes=(4, 4, 4), layers=1, rounds=1),
}
PARTITION = (2, 1, 2, 2, 1)


def read_rows(ds: object, store: CountingStore, sharding, batch: int, repeats: int, seed: int = 0) -> dict:
    """Bytes read and time taken by `repeats` random batches read into `sharding`."""
    rng = np.random.default_rng(seed)
    batches = [rng.permutation(len(ds))[:batch] for _ in range(repeats)]
    jax.block_until_ready(ds.batch(batches[0], sharding))  # warm: zarr's and JAX's first-call costs
    before, start = store.bytes_read, time.perf_counter()
    for idx in batches:
        jax.block_until_ready(ds.batch(idx, sharding))
    seconds = time.perf_counter() - start
    read = store.bytes_read - before
    return {"batch MiB": read / repeats / 2**20, "ms per batch": 1e3 * seconds / repeats,
            "MiB/s": read / seconds / 2**20}


def step_times(model, θ, data: tuple, steps: int, batch: int, **options) -> list[float]:
    """The times between consecutive training steps of `fit`, the first 3 left out."""
    marks: list[float] = []
    with jax.numpy_dtype_promotion("standard"):
        fit(model, θ, *data, steps=steps, batch=batch, progress=False,
            callback=lambda i, loss: marks.append(time.perf_counter()), **options)
    return list(np.diff(marks[2:]))


def run(quick: bool = False) -> dict:
    size = SIZES[quick]
    side, n, batch = size["side"], size["samples"], size["batch"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "darcy.zarr")
        start = time.perf_counter()
        write_darcy(path, n, side, dim=3)
        written = time.perf_counter() - start
        store = CountingStore(path)
        ds = open_store(store)
        model = FNO((side,) * 3, width=size["width"], modes=size["modes"], layers=size["layers"], projection=8)
        sharding = model.distribute(PARTITION).in_sharding
        reads = {"one device": read_rows(ds, store, None, batch, 2 * size["steps"]),
                 f"8 devices {PARTITION}": read_rows(ds, store, sharding, batch, 2 * size["steps"])}
        a, u = ds.inputs[:], ds.targets[:]
        θ = model.init(jax.random.key(0))
        runs = {"in memory": ((a, u), {}), "store, prefetch off": ((ds,), {"prefetch": False}),
                "store, prefetch on": ((ds,), {"prefetch": True})}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(size["rounds"]):  # the runs alternate, so that a drift in load spreads over all
            for name, (data, options) in runs.items():
                times[name] += step_times(model, θ, data, size["steps"], batch, **options)
    steps = {name: float(np.median(t)) for name, t in times.items()}
    return {"size": size, "written_s": written, "reads": reads, "steps": steps}


def markdown(result: dict) -> str:
    size = result["size"]
    side, n = size["side"], size["samples"]
    sample = side**3 * 4
    lines = [
        f"Store: {n} 3-D Darcy samples at {side}³, float32 ({sample // 1024} KiB per sample and array), "
        f"chunks of {(side + 3) // 4} x {(side + 3) // 4} x {side}, a file each; written in "
        f"{result['written_s']:.1f} s (generation included). Batch {size['batch']}.",
        "",
        "| read of a batch of a and u | MiB read per batch | ms per batch | MiB/s |",
        "|---|---|---|---|",
    ]
    for name, row in result["reads"].items():
        lines.append(f"| {name} | {row['batch MiB']:.2f} | {row['ms per batch']:.1f} | {row['MiB/s']:.0f} |")
    memory = result["steps"]["in memory"]
    lines += [
        "",
        f"Training steps of a serial FNO (width {size['width']}, modes {size['modes'][0]}³, {size['layers']} "
        f"layer(s), projection 8), batch {size['batch']}, median over {size['rounds']} runs of "
        f"{size['steps'] - 3} steps each, the runs alternating:",
        "",
        "| data | ms per step | wait for data per step |",
        "|---|---|---|",
    ]
    for name, seconds in result["steps"].items():
        wait = "–" if name == "in memory" else f"{1e3 * (seconds - memory):.1f} ms"
        lines.append(f"| {name} | {1e3 * seconds:.1f} | {wait} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    print(markdown(run(parser.parse_args().quick)), flush=True)


if __name__ == "__main__":
    main()
