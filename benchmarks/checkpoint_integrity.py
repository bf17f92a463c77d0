"""What `parop.checkpoint`'s checksums cost: save and restore with them against the same
orbax calls without them.

    python benchmarks/checkpoint_integrity.py [--sizes 64 256] [--repeats 5] [--dir DIR]

An array of SIZE MiB (float32, standard normal) split by columns over 8 devices (forced
CPU devices where there is no accelerator): `checkpoint.save` (the checksum of each
shard, then orbax's save) against a bare orbax `CheckpointManager` save of one standard
pytree item (what `save` did before it wrote checksums), and `checkpoint.restore`
(orbax's restore, then each shard summed and compared) against the bare orbax restore,
onto the same sharding and onto rows (each row block holds a piece of every saved
shard, whose sums add up). Each run writes into a fresh directory under `--dir`; the
two ways take turns going first; the times are the best of `--repeats` runs (on a
shared machine the other processes only ever add time). Prints a markdown table with
the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from parop import checkpoint  # noqa: E402


def orbax_save(path: str, tree) -> None:
    manager = ocp.CheckpointManager(path, item_handlers=ocp.StandardCheckpointHandler())
    try:
        manager.save(1, args=ocp.args.StandardSave(tree))
    finally:
        manager.close()


def orbax_restore(path: str, like):
    manager = ocp.CheckpointManager(path, item_handlers=ocp.StandardCheckpointHandler())
    try:
        return manager.restore(1, args=ocp.args.StandardRestore(like))
    finally:
        manager.close()


def timed(call) -> float:
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def measure(mib: int, repeats: int, root: str) -> dict[str, float]:
    """The best seconds of each way to save and restore a `mib` MiB array."""
    n = int(np.sqrt(mib * 2**20 / 4))
    mesh = jax.make_mesh((8,), ("d",))
    columns, rows = (jax.NamedSharding(mesh, jax.P(*spec)) for spec in ((None, "d"), ("d", None)))
    w = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32)), columns)
    tree = {"w": w}
    like = {name: {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=s)}
            for name, s in (("same", columns), ("rows", rows))}
    times: dict[str, list[float]] = {}
    for i in range(repeats):
        plain, parop = os.path.join(root, f"orbax-{i}"), os.path.join(root, f"parop-{i}")
        ways = {"orbax": (lambda: orbax_save(plain, tree), lambda target: orbax_restore(plain, target)),
                "parop": (lambda: checkpoint.save(parop, tree, step=1),
                          lambda target: checkpoint.restore(parop, target))}
        order = list(ways) if i % 2 == 0 else list(ways)[::-1]
        for way in order:
            times.setdefault(f"save {way}", []).append(timed(ways[way][0]))
        for name, target in like.items():
            got = checkpoint.restore(parop, target)["w"]
            assert got.sharding == target["w"].sharding and np.array_equal(np.asarray(got), np.asarray(w))
            for way in order:
                times.setdefault(f"restore {name} {way}", []).append(timed(lambda: ways[way][1](target)))
        shutil.rmtree(plain)
        shutil.rmtree(parop)
    return {key: min(value) for key, value in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="array sizes in MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary directory)")
    args = p.parse_args()
    print(f"{jax.devices()[0].device_kind} x {jax.device_count()}, orbax-checkpoint {ocp.__version__}, "
          f"best of {args.repeats}")
    print("| array | operation | orbax alone | with checksums | ratio |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        for mib in args.sizes:
            t = measure(mib, args.repeats, root)
            for op in ("save", "restore same", "restore rows"):
                plain, parop = t[f"{op} orbax"], t[f"{op} parop"]
                what = {"save": "save", "restore same": "restore, same sharding",
                        "restore rows": "restore onto rows"}[op]
                print(f"| {mib} MiB | {what} | {plain * 1e3:.0f} ms | {parop * 1e3:.0f} ms | {parop / plain:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
