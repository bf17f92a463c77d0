"""One process of a multi-process parop run, launched by `test_multiprocess.py`.

    python multiprocess_worker.py SCENARIO PROCESS_ID NUM_PROCESSES PORT

Each process owns 4 forced CPU devices (the launcher sets `XLA_FLAGS`; this file
must not be imported by pytest, whose conftest forces 8), talks to the others through
gloo collectives, and checks its *addressable* shards of every distributed result
against NumPy or the serial operator computed locally. It prints one line
`RESULT {...json...}` on success. Any exception prints a traceback and ends the
process at once with `os._exit(1)`, skipping `jax.distributed`'s shutdown barrier
(which would otherwise wait for peers that may be stuck in a collective).

Scenarios:

- `fft`: distributed complex and real 3-D DFTs (forward and adjoint) over all 8
  global devices, for several partitions.
- `grad`: a shared weight (`kron(Matrix(c, c, name="w"), Identity(n))`) with a split
  trailing batch axis: `po.init`, `jax.grad` of a loss, one SGD step, eager and jitted.
- `checkpoint`: a distributed θ (a `Matrix` and a `PerModeMatrix`, both sharded over the
  8 devices of the two processes) and its Adam state saved with `parop.checkpoint` to
  a directory both processes see, restored onto the same partition, another
  partition (another mesh) and each process's one device; and a checkpoint with one bit
  flipped in a shard only process 1 holds, which both processes must refuse.
- `store`: a Darcy zarr store written by both processes (half each), then a
  distributed FNO trained for 2 steps from it, the batch split over the processes and
  then a grid axis; the losses and parameters are those of the serial model trained
  from in-memory arrays, and each process reads exactly its share of the bytes.
- `fail`: process 1 raises right after `jax.distributed.initialize`, process 0 goes
  on into a collective that can never complete (the launcher must notice and clean up).
- `exit`: process 1 leaves with `os._exit(7)` before initializing.
- `hang`: every process sleeps (the launcher's timeout must fire).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

SEED = 1234


def main(scenario: str, pid: int, nproc: int, port: int) -> dict:
    if scenario == "exit" and pid == 1:
        os._exit(7)
    if scenario == "hang":
        time.sleep(3600)

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
        initialization_timeout=60,
    )
    assert jax.process_index() == pid and jax.process_count() == nproc, (jax.process_index(), jax.process_count())
    assert jax.local_device_count() == 4 and jax.device_count() == 4 * nproc, (
        jax.local_device_count(), jax.device_count())

    if scenario == "fail" and pid == 1:
        raise RuntimeError("worker 1 fails on purpose")
    if scenario == "fail":
        return run_fft()  # blocks in a collective that process 1 never joins
    if scenario == "fft":
        return run_fft()
    if scenario == "grad":
        return run_grad()
    if scenario == "checkpoint":
        return run_checkpoint()
    if scenario == "store":
        return run_store()
    raise ValueError(f"unknown scenario {scenario!r}")


# -- helpers -----------------------------------------------------------------------------

def global_array(shape, dtype, seed):
    """The same seeded NumPy array on every process."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def place(host, sharding):
    import jax

    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def check_shards(name, array, want, sharding=None, rtol=1e-10, atol=1e-10) -> int:
    """Compare every addressable shard of the global `array` with `want[index]`; return
    how many shards were checked."""
    import numpy as np

    assert array.shape == want.shape, (name, array.shape, want.shape)
    assert array.dtype == want.dtype, (name, array.dtype, want.dtype)
    if sharding is not None:
        assert array.sharding.is_equivalent_to(sharding, array.ndim), (name, array.sharding, sharding)
    shards = array.addressable_shards
    assert len(shards) == 4, (name, len(shards))
    scale = max(1.0, float(np.abs(want).max()))
    for shard in shards:
        np.testing.assert_allclose(
            np.asarray(shard.data), want[shard.index], rtol=rtol, atol=atol * scale,
            err_msg=f"{name}: shard {shard.index} on {shard.device}",
        )
    return len(shards)


# -- scenarios ---------------------------------------------------------------------------

def run_fft() -> dict:
    import jax
    import numpy as np

    import parop as po

    n = 16
    checked = {}
    x = global_array((n, n, n), np.complex128, SEED)
    F = po.kron(po.DFT(n, "complex128"), po.DFT(n, "complex128"), po.DFT(n, "complex128"))
    for partition in [(2, 2, 2), (8, 1, 1), (1, 2, 4)]:
        D = po.distribute(F, partition)
        assert len(D.mesh.devices.flat) == 8
        xg = place(x, D.in_sharding)
        assert not xg.is_fully_addressable
        y = D @ xg
        want = np.fft.fftn(x)
        count = check_shards(f"fft {partition}", y, want, D.out_sharding)
        # the adjoint: n^3 ifftn for the unnormalised forward transform
        back = D.H @ y
        count += check_shards(f"fft.H {partition}", back, n**3 * x, D.in_sharding)
        # a jitted call on the same global arrays, and "auto" output layouts
        Da = po.distribute(F, partition, out_partition="auto")
        ya = jax.jit(lambda v: Da @ v)(xg)
        count += check_shards(f"fft auto {partition}", ya, want, Da.out_sharding)
        checked[str(partition)] = count

    # host data (the same NumPy array on every process) is a global array too
    D = po.distribute(F, (2, 2, 2))
    checked["host (2, 2, 2)"] = check_shards("fft host", D @ x, np.fft.fftn(x), D.out_sharding)
    # the dot test runs on global arrays across both processes
    mismatch = po.testing.dot_test(D, key=jax.random.key(1))
    assert mismatch < 1e-12, mismatch
    checked["dot test"] = mismatch < 1e-12

    # two programs laid out differently on one mesh, combined: the planned moves between them
    from jax.sharding import PartitionSpec as P

    D2 = po.distribute(F, P(None, None, ("d0", "d1", "d2")), mesh=D.mesh)
    xg = place(x, D.in_sharding)
    checked["sum of two layouts"] = check_shards("D + D2", (D + D2) @ xg, 2 * np.fft.fftn(x), D.out_sharding)
    checked["product of two layouts"] = check_shards("D2 @ D", jax.jit(lambda v: (D2 @ D) @ v)(xg),
                                                     np.fft.fftn(np.fft.fftn(x)), D2.out_sharding)

    xr = global_array((n, n, 2 * n), np.float64, SEED + 1)
    R = po.kron(po.DFT(n, "complex128"), po.DFT(n, "complex128"), po.DFT(2 * n, "float64"))
    # (the last axis shrinks to n + 1 = 17, which a split of 2 does not divide, so the
    # (2, 2, 2) case lets the planner choose the output layout: out_partition="auto")
    for partition, out in [((2, 2, 2), "auto"), ((8, 1, 1), None), ((2, 4, 1), None)]:
        D = po.distribute(R, partition, out_partition=out)
        y = D @ place(xr, D.in_sharding)
        checked[f"rfft {partition}"] = check_shards(f"rfft {partition}", y, np.fft.rfftn(xr), D.out_sharding)
    return {"checked": checked}


def run_grad() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import parop as po

    c, n, b, lr = 6, 4, 16, 1e-3
    W = po.Matrix(c, c, "float64", name="w")
    ops = {
        # a shared weight replicated on every device: its gradient is the full sum
        "matrix-identity": (po.kron(W, po.Identity(n, "float64")), [(1, 1, 8), (1, 2, 4), (2, 1, 4)]),
        # plus a Diagonal whose weight is split with its axis, across the two processes
        "matrix-diagonal": (po.kron(W, po.Diagonal(n, "float64", name="d")), [(1, 4, 2), (2, 2, 2)]),
    }
    x = global_array((c, n, b), np.float64, SEED)
    t = global_array((c, n, b), np.float64, SEED + 1)
    key = jax.random.key(0)

    def loss_of(A):
        return lambda θ, x, t: jnp.sum((A(θ) @ x - t) ** 2)

    checked, losses = {}, {}
    for label, (op, partitions) in ops.items():
        # the serial reference, on this process's own device, from host data
        θs = {k: np.asarray(v) for k, v in po.init(op, key).items()}
        θs["d"] = global_array((n,), np.float64, SEED + 2) if "d" in θs else None
        θs = {k: v for k, v in θs.items() if v is not None}
        serial_loss = loss_of(op)
        ls, gs = jax.value_and_grad(serial_loss)(θs, x, t)
        gs = {k: np.asarray(v) for k, v in gs.items()}
        θs_new = {k: θs[k] - lr * gs[k] for k in θs}
        ls_new = float(serial_loss(θs_new, x, t))
        assert ls_new < float(ls), (label, ls_new, float(ls))
        losses[label] = [float(ls), ls_new]
        for partition in partitions:
            D = po.distribute(op, partition)
            θ = po.init(D, key)
            count = check_shards(f"{label} init {partition}", θ["w"], θs["w"], rtol=0, atol=0)
            if "d" in θs:  # a non-trivial diagonal, placed like po.init places it
                assert not θ["d"].sharding.is_fully_replicated, θ["d"].sharding
                θ["d"] = place(θs["d"], θ["d"].sharding)
            xg = place(x, D.in_sharding)
            tg = place(t, D.in_sharding)
            loss = loss_of(D)
            # eager
            l, g = jax.value_and_grad(loss)(θ, xg, tg)
            for k in θs:
                count += check_shards(f"{label} grad {k} {partition}", g[k], gs[k])
            np.testing.assert_allclose(np.asarray(l.addressable_shards[0].data), float(ls), rtol=1e-10)
            y = D(θ) @ xg
            count += check_shards(f"{label} forward {partition}", y, np.asarray(op(θs) @ x), D.out_sharding)

            # one SGD step, jitted as a whole
            @jax.jit
            def step(θ, x, t):
                l, g = jax.value_and_grad(loss)(θ, x, t)
                return jax.tree.map(lambda p, q: p - lr * q, θ, g), l

            θ_new, l0 = step(θ, xg, tg)
            for k in θs:
                count += check_shards(f"{label} sgd {k} {partition}", θ_new[k], θs_new[k])
            l1 = loss(θ_new, xg, tg)
            np.testing.assert_allclose(np.asarray(l0.addressable_shards[0].data), float(ls), rtol=1e-10)
            np.testing.assert_allclose(np.asarray(l1.addressable_shards[0].data), ls_new, rtol=1e-10)
            checked[f"{label} {partition}"] = count
    return {"checked": checked, "loss": losses}


def run_checkpoint() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils

    import parop as po
    from parop import checkpoint
    from parop.nn import as_real

    c, m = 8, 8
    op = po.kron(po.Matrix(c, c, name="w"), po.Identity(m)) @ po.PerModeMatrix(c, c, (m,), name="s")
    optimizer = optax.adam(1e-2)

    def adam_state(θ):
        """Adam's state after one step (on a made-up gradient), placed like θ."""
        θr = as_real(θ)
        with jax.numpy_dtype_promotion("standard"):  # optax: float ** int32
            return jax.jit(lambda θr: optimizer.update(jax.tree.map(jnp.cos, θr), optimizer.init(θr), θr)[1])(θr)

    D = po.distribute(op, (1, 8), shard_weights=True)
    θ = po.init(D, jax.random.key(0))
    saved = {"θ": θ, "opt": adam_state(θ)}
    assert not any(leaf.is_fully_addressable for leaf in jax.tree.leaves(saved))
    directory = os.path.abspath("checkpoint")  # the launcher runs both workers in one directory
    checkpoint.save(directory, saved, step=1)
    want = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), saved)

    checked = {}
    for label, target_op in [("same (1, 8)", D), ("other (2, 4)", po.distribute(op, (2, 4))), ("serial", op)]:
        θt = po.init(target_op, jax.random.key(1))
        like = {"θ": θt, "opt": optimizer.init(as_real(θt))}  # a local, uncommitted step count
        restored = checkpoint.restore(directory, like)
        count = 0
        for (path, r), w, t in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(want),
                                   jax.tree.leaves(like)):
            name = f"{label} {jax.tree_util.keystr(path)}"
            assert r.sharding == t.sharding and r.committed == t.committed, (name, r.sharding, t.sharding)
            if t.is_fully_addressable:  # on this process's own device
                np.testing.assert_array_equal(np.asarray(r), w, err_msg=name)
                count += 1
            else:
                count += check_shards(name, r, w, rtol=0, atol=0)
        checked[label] = count
    return {"checked": checked, "damaged": restore_damaged_shard(directory + "-bits")}


def restore_damaged_shard(directory: str) -> str:
    """The error each process gets restoring a checkpoint whose shard 6 of 8 (held by
    process 1 alone) has one bit flipped: both processes must name it (the sums of the
    pieces each holds are added up over the processes)."""
    import shutil
    from pathlib import Path

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from parop import checkpoint

    bits = np.random.default_rng(0).integers(0, 2**32, (64, 64), dtype=np.uint32)  # incompressible: stored as is
    sharding = jax.NamedSharding(jax.make_mesh((8,), ("d",)), jax.P(None, "d"))
    w = jax.make_array_from_callback(bits.shape, sharding, lambda index: bits[index])
    checkpoint.save(directory, {"w": w}, step=1)
    if jax.process_index() == 0:
        shutil.copytree(directory, directory + "-damaged")
        raw = np.ascontiguousarray(bits[:, 48:56]).tobytes()
        for path in Path(directory + "-damaged").rglob("*"):
            content = path.read_bytes() if path.is_file() else b""
            if raw in content:
                at = content.find(raw) + 100
                path.write_bytes(content[:at] + bytes([content[at] ^ 1]) + content[at + 1:])
    multihost_utils.sync_global_devices("damaged copy written")
    try:
        checkpoint.restore(directory + "-damaged", {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=sharding)})
    except ValueError as error:
        return str(error)
    return "restored"


def run_store() -> dict:
    import warnings

    import jax
    import numpy as np
    import zarr
    from jax.experimental import multihost_utils

    from parop.datasets import CountingStore, open_store, write_darcy
    from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit

    n, s, steps, batch = 16, 16, 2, 8  # one epoch: the samples of a batch are distinct
    pid = jax.process_index()
    write_darcy("darcy.zarr", n, s, dtype=np.float64, part=(pid, jax.process_count()))  # half each
    multihost_utils.sync_global_devices("store written")
    group = zarr.open_group("darcy.zarr", mode="r")
    a, u = group["a"][:], group["u"][:]  # darcy_flow's samples (test_store.py checks that)

    model = FNO((s, s), width=4, modes=(4, 4), layers=1, projection=8, dtype=np.float64)
    θ0 = model.init(jax.random.key(0))
    data = s * s * 8  # one sample of one array: 16 x 16 float64, in 16 chunks of 4 x 4
    checked, read = {}, {}
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        θ_serial, losses = fit(model, θ0, a, u, steps=steps, batch=batch, progress=False)
        error = evaluate(model, θ_serial, a, u, batch=batch)

        # model parallel, x split over the two processes: each reads half of each sample
        dist = model.distribute((1, 1, 2, 4))
        store = CountingStore("darcy.zarr")
        ds = open_store(store)
        before = store.bytes_read
        θ, l = fit(dist, dist.init(jax.random.key(0)), ds, steps=steps, batch=batch, progress=False)
        e = evaluate(dist, θ, ds, batch=batch)
    read["grid split"] = store.bytes_read - before
    # a normaliser of the targets (on one device in each process) is placed on the global
    # mesh as the targets are, and decodes as the serial model's does
    norm = UnitGaussianNormalizer.fit(u)
    decoded = evaluate(dist, θ, ds, batch=batch, decode=norm.decode)
    np.testing.assert_allclose(decoded, evaluate(model, θ_serial, a, u, batch=batch, decode=norm.decode), rtol=1e-9)
    checked["normaliser"] = 1
    # 2 training batches and 2 evaluation batches, 2 arrays each
    assert read["grid split"] == (steps + 2) * 2 * batch * data // 2, read
    np.testing.assert_allclose(l, losses, rtol=1e-12)
    np.testing.assert_allclose(e, error, rtol=1e-12)
    for k in θ:
        got = np.asarray(multihost_utils.process_allgather(θ[k], tiled=True))
        np.testing.assert_allclose(got, θ_serial[k], rtol=1e-9, atol=1e-12, err_msg=k)
    checked["trained"] = len(θ)

    # data parallel, the batch split over the processes: each reads half of the samples
    sharding = model.distribute((8, 1, 1, 1)).in_sharding
    idx = np.array([9, 2, 15, 4, 0, 11, 7, 3])
    before = store.bytes_read
    x, y = ds.batch(idx, sharding)
    read["batch split"] = store.bytes_read - before
    assert read["batch split"] == 2 * batch // 2 * data, read
    checked["batch split"] = check_shards("a", x, a[idx], sharding, 0, 0) + check_shards("u", y, u[idx], sharding, 0, 0)

    # a store whose chunks are whole samples (the user's own, written with zarr): a
    # process that holds half of each sample is told which chunks would fit
    own = zarr.open_group(f"own{pid}.zarr", mode="w")
    for name, values in (("a", a), ("u", u)):
        own.create_array(name, data=values, chunks=(1, 1, s, s))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, _ = open_store(f"own{pid}.zarr").batch(idx, dist.in_sharding)
    assert len(caught) == 2 and "rewrite the store with chunks of at most (1, 1, 8, 16)" in str(caught[0].message), [
        str(w.message) for w in caught]
    checked["whole-sample chunks"] = check_shards("own a", x, a[idx], dist.in_sharding, 0, 0)
    return {"checked": checked, "read": read, "losses": losses.tolist()}


if __name__ == "__main__":
    scenario, pid, nproc, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    try:
        result = main(scenario, pid, nproc, port)
        result.update(process=pid, scenario=scenario)
        print("RESULT " + json.dumps(result), flush=True)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # skip jax.distributed's at-exit shutdown barrier only after success on every
    # process is not knowable here; a clean exit runs it (both processes got here)
    sys.exit(0)
