"""Data sets in a zarr store: `write_darcy` writes `darcy_flow`'s samples in parts,
`open_store` reads them back block by block, `fit` and `evaluate` take the store in
place of in-memory arrays with the same results, and bad input is named. Reading
across processes (each reads its share) is in test_multiprocess.py."""

import shutil
import warnings

import jax
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from parop.datasets import CountingStore, darcy_flow, open_store, write_darcy  # noqa: E402
from parop.nn import FNO, evaluate, fit  # noqa: E402

N, S = 12, 8  # samples, grid nodes per side


@pytest.fixture(scope="module")
def darcy(tmp_path_factory):
    """A store written in three parts (as three processes would), and the in-memory data."""
    path = tmp_path_factory.mktemp("store") / "darcy.zarr"
    for part in (2, 0, 1):
        write_darcy(path, N, S, part=(part, 3))
    a, u = darcy_flow(N, S)
    return path, np.asarray(a)[:, None], np.asarray(u)[:, None]


def test_write_darcy_in_parts_holds_darcy_flows_samples(darcy):
    path, a, u = darcy
    group = zarr.open_group(path, mode="r")
    for name, want in (("a", a), ("u", u)):
        array = group[name]
        assert array.shape == (N, 1, S, S) and array.dtype == np.float32
        assert array.chunks == (1, 1, 2, 2) and array.shards is None
        np.testing.assert_array_equal(array[:], want)
    ds = open_store(path)
    assert len(ds) == N
    x, y = ds.batch([5, 0, 5, 11])
    np.testing.assert_array_equal(x, a[[5, 0, 5, 11]])
    np.testing.assert_array_equal(y, u[[5, 0, 5, 11]])


def test_numpy_integers_write_the_same_store(darcy, tmp_path):
    """Sizes from NumPy (a job script's arithmetic) are the ints they hold: a part written
    with them and a part written with Python ints fill one store (their settings, kept in
    the store's attributes as JSON, are equal)."""
    path, a, u = darcy
    mixed = tmp_path / "mixed.zarr"
    write_darcy(mixed, np.int64(N), np.int32(S), seed=np.int64(0), chunks=(1, 1, np.int64(2), 2),
                part=(np.int64(0), np.int64(2)))
    write_darcy(mixed, N, S, part=(1, 2))
    ds = open_store(mixed)
    np.testing.assert_array_equal(ds.inputs[:], a)
    np.testing.assert_array_equal(ds.targets[:], u)


def test_the_command_line_writes_its_part(darcy, tmp_path, capsys, monkeypatch):
    from parop.datasets.__main__ import main

    path, a, u = darcy
    monkeypatch.setenv("SLURM_PROCID", "2")  # under srun, the task's part by default
    monkeypatch.setenv("SLURM_NTASKS", "3")
    main(["darcy", str(tmp_path / "cli.zarr"), "--samples", str(N), "--resolution", str(S)])
    assert capsys.readouterr().out == f"{tmp_path / 'cli.zarr'}: samples 8 to 12 of 12 written\n"
    written = zarr.open_group(tmp_path / "cli.zarr", mode="r")["u"]
    np.testing.assert_array_equal(written[8:], u[8:])
    with pytest.raises(SystemExit):
        main(["darcy", str(tmp_path / "cli.zarr"), "--samples", "4", "--part", "1-2"])
    assert "--part must be INDEX/COUNT, e.g. 0/4, got '1-2'" in capsys.readouterr().err
    for bad, message in [(["--samples", "0"], "write_darcy: n_samples must be at least 1, got n_samples=0"),
                         (["--samples", "4", "--part", "2/2"], "write_darcy: part must be (index, count) with "
                                                               "0 <= index < count, got (2, 2)")]:
        with pytest.raises(SystemExit) as exit:  # the message alone, no traceback
            main(["darcy", str(tmp_path / "bad.zarr"), *bad])
        assert exit.value.code == 2 and capsys.readouterr().err == f"python -m parop.datasets darcy: {message}\n"


def test_a_batch_is_read_into_the_sharding_once(darcy):
    path, a, u = darcy
    store = CountingStore(path)
    ds = open_store(store)
    dist = FNO((S, S), width=4, modes=(4, 4), layers=1).distribute((2, 1, 2, 2))
    idx = np.array([3, 7, 1, 3])
    before = store.bytes_read
    x, y = ds.batch(idx, dist.in_sharding)
    sharded = store.bytes_read - before
    assert x.sharding == y.sharding == dist.in_sharding
    np.testing.assert_array_equal(x, a[idx])
    np.testing.assert_array_equal(y, u[idx])
    before = store.bytes_read
    ds.batch(idx, None)
    # one process holds every block: it reads the box around them once, as unsharded
    # 3 samples (3, 7 and 1; 3 is read once) of 2 arrays
    assert sharded == store.bytes_read - before == 2 * 3 * S * S * 4


def test_open_store_and_batch_name_bad_input(darcy, tmp_path):
    path, a, u = darcy
    with pytest.raises(FileNotFoundError, match=r"open_store: no zarr group at .*nothing"):
        open_store(tmp_path / "nothing")
    v2 = zarr.open_group(tmp_path / "v2.zarr", mode="w", zarr_format=2)  # zarr format 2: a .zgroup, no zarr.json
    v2.create_array("a", data=np.asarray(a[:4]), chunks=(1,) + a.shape[1:])
    v2.create_array("u", data=np.asarray(u[:4]), chunks=(1,) + u.shape[1:])
    np.testing.assert_array_equal(np.asarray(open_store(tmp_path / "v2.zarr").batch([2, 0], None)[0]), a[[2, 0]])
    zarr.create_array(tmp_path / "array.zarr", shape=(4, 1, 8, 8), dtype="float32")  # an array, not a group
    with pytest.raises(FileNotFoundError, match=r"open_store: no zarr group at .*array.zarr'?: it holds a zarr array"):
        open_store(tmp_path / "array.zarr")
    with pytest.raises(ValueError, match=r"write_darcy: .*array.zarr' holds a zarr array, not a group"):
        write_darcy(tmp_path / "array.zarr", 2, 8)
    with pytest.raises(ValueError, match=r"no array 'v' \(targets=\); its arrays: \['a', 'u'\]"):
        open_store(path, targets="v")
    own = zarr.open_group(tmp_path / "own.zarr", mode="w")  # the user's own arrays
    own.create_array("x", shape=(4, 2, 8, 8), chunks=(2, 1, 8, 8), dtype="float32")
    own.create_array("y", shape=(4, 1, 8, 6), chunks=(1, 1, 8, 6), dtype="float32")
    with pytest.raises(ValueError, match=r"'x' \(4, 2, 8, 8\) and 'y' \(4, 1, 8, 6\) must both be"):
        open_store(tmp_path / "own.zarr", inputs="x", targets="y")
    own.create_array("z", shape=(4, 1, 8, 8), chunks=(1, 1, 8, 8), dtype="float32")
    with pytest.warns(UserWarning, match=r"chunks \(2, 1, 8, 8\) of 2 samples.*chunks of one sample, \(1, 1, 8, 8\)"):
        ds = open_store(tmp_path / "own.zarr", inputs="x", targets="z")
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\), got 0 .. 4"):
        ds.batch([0, 4])
    with pytest.raises(ValueError, match=r"non-empty 1-D sequence of ints"):
        ds.batch([[0, 1]])
    with pytest.raises(TypeError, match=r"sharding must be a jax.sharding.Sharding .*or None, got P\('d0'"):
        ds.batch([0, 1], jax.sharding.PartitionSpec("d0"))
    sharding = FNO((S, S), width=4, modes=(4, 4), layers=1).distribute((2, 1, 2, 2)).in_sharding
    with pytest.raises(ValueError, match=r"batch \(3, 2, 8, 8\) of '/x' does not fit the sharding .*partitioned 2"):
        ds.batch([0, 1, 2], sharding)
    with pytest.raises(ValueError, match=r"write_darcy: part must be \(index, count\)"):
        write_darcy(tmp_path / "w.zarr", 4, 8, part=(3, 3))
    with pytest.raises(ValueError, match=r"write_darcy: chunks must be 4 positive ints starting with 1"):
        write_darcy(tmp_path / "w.zarr", 4, 8, chunks=(2, 1, 4, 4))
    with pytest.raises(ValueError, match=r"write_darcy: resolution must be at least 3, got resolution=2"):
        write_darcy(tmp_path / "w.zarr", 4, 2, part=(3, 5))  # checked even where the part has no samples
    assert not (tmp_path / "w.zarr").exists()
    with pytest.raises(ValueError, match=r"holds another data set .*n_samples': 12.*n_samples': 13"):
        write_darcy(path, N + 1, S, part=(0, 100))  # checks the store before it solves anything


@pytest.fixture(scope="module")
def tiny():
    return FNO((S, S), width=4, modes=(4, 4), layers=1, projection=8)


def test_fit_and_evaluate_from_a_store_match_in_memory_and_resume(darcy, tiny, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    path, a, u = darcy
    ds = open_store(path)
    θ0 = tiny.init(jax.random.key(0))
    run = dict(steps=4, batch=5, seed=3, progress=False)
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        θ1, l1 = fit(tiny, θ0, a, u, **run)
        θ2, l2 = fit(tiny, θ0, ds, **run, checkpoint=tmp_path / "run", every=2)
        # the same batches in the same order, bit for bit
        np.testing.assert_array_equal(l2, l1)
        assert all(np.array_equal(θ2[k], θ1[k]) for k in θ1)
        shutil.rmtree(tmp_path / "run" / "4")  # as if the run had stopped after step 2
        θ3, l3 = fit(tiny, θ0, ds, **run, checkpoint=tmp_path / "run", every=2, prefetch=False)
        np.testing.assert_array_equal(l3, l1)
        assert all(np.array_equal(θ3[k], θ1[k]) for k in θ1)
        assert evaluate(tiny, θ1, ds, batch=5) == evaluate(tiny, θ1, a, u, batch=5)


@pytest.mark.long  # the 2-process test in test_multiprocess.py trains a distributed FNO from a store
def test_a_distributed_fit_from_a_store_matches_in_memory(darcy, tiny):
    path, a, u = darcy
    dist = tiny.distribute((2, 1, 2, 2))
    θ0 = dist.init(jax.random.key(0))
    with jax.numpy_dtype_promotion("standard"):
        θ1, l1 = fit(dist, θ0, a, u, steps=2, batch=4, progress=False)
        θ2, l2 = fit(dist, θ0, open_store(path), steps=2, batch=4, progress=False)
    np.testing.assert_array_equal(l2, l1)
    assert all(np.array_equal(θ2[k], θ1[k]) for k in θ1)


def test_fit_and_evaluate_name_a_data_set_that_does_not_fit(darcy, tiny):
    path, a, u = darcy
    ds = open_store(path)
    θ = tiny.init(jax.random.key(0))
    with pytest.raises(TypeError, match=r"fit: a data set holds its own targets"):
        fit(tiny, θ, ds, u, steps=1, batch=2)
    with pytest.raises(TypeError, match=r"evaluate: u \(the targets\) is missing"):
        evaluate(tiny, θ, a, batch=2)
    other = FNO((S, 2 * S), width=4, modes=(4, 4), layers=1, in_channels=2)
    with pytest.raises(ValueError, match=r"fit: the data set's inputs are \(12, 1, 8, 8\) .* \+ \(2, 8, 16\)"):
        fit(other, θ, ds, steps=1, batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"evaluate: the data set's targets are \(12, 1, 8, 8\)"):
            evaluate(FNO((S, S), width=4, modes=(4, 4), layers=1, out_channels=3), θ, ds, batch=2)


@pytest.mark.long  # a smoke test of the benchmark; the behaviour it times is tested above
def test_the_store_benchmark_runs():
    from benchmarks.store import markdown, run

    result = run(quick=True)
    for row in result["reads"].values():  # 4 samples of 16³ float32 in each of 2 arrays
        assert row["batch MiB"] * 2**20 == 4 * 2 * 16**3 * 4
    assert set(result["steps"]) == {"in memory", "store, prefetch off", "store, prefetch on"}
    assert "| store, prefetch on |" in markdown(result)
