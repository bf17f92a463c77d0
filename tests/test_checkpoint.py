"""`parop.checkpoint` (orbax-checkpoint): a distributed model's θ and optax state saved
and restored onto the same partition, other partitions and meshes, and one device, bit
for bit and with exactly the target's shardings; `fit` resumed from a checkpoint
equals an uninterrupted run. Skipped where orbax-checkpoint is not installed."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from parop import checkpoint
from parop.nn import as_complex, as_real, fit
from test_train import Tiny, data


@pytest.fixture
def ocp():
    return pytest.importorskip("orbax.checkpoint")


OPTIMIZER = optax.adam(1e-2)


def adam_step(model: Tiny, θ, state, a, u):
    """One Adam step on the real view of θ (so optax sees real arrays)."""

    def loss(θr):
        return jnp.sum((model.apply(as_complex(θr, θ), a) - u) ** 2)

    θr = as_real(θ)
    updates, state = OPTIMIZER.update(jax.grad(loss)(θr), state, θr)
    return as_complex(optax.apply_updates(θr, updates), θ), state


def like(model: Tiny) -> dict:
    """A restore target on `model`'s shardings: its own θ (other values) and Adam state."""
    θ = model.init(jax.random.key(7))
    return {"θ": θ, "opt": OPTIMIZER.init(as_real(θ))}


def assert_restored(restored, saved, target):
    """The values saved, bit for bit, with the target's shardings (and placement)."""
    assert jax.tree.structure(restored) == jax.tree.structure(saved)
    for r, s, t in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), jax.tree.leaves(target)):
        np.testing.assert_array_equal(np.asarray(r), np.asarray(s))
        assert r.dtype == s.dtype
        assert r.sharding == t.sharding, (r.sharding, t.sharding)
        assert r.committed == getattr(t, "committed", True)  # a ShapeDtypeStruct's sharding commits


def test_checkpoint_restores_onto_any_partition_and_serial(ocp, tmp_path):
    source = Tiny((1, 8, 1))  # "w" split by columns, "s" by modes, over mesh (d1: 8)
    a, u = data(8)
    θ = source.init(jax.random.key(0))
    step = jax.jit(lambda θ, state: adam_step(source, θ, state, a, u))
    with jax.numpy_dtype_promotion("standard"):
        saved = dict(zip(("θ", "opt"), step(θ, OPTIMIZER.init(as_real(θ)))))
        θ1, _ = step(saved["θ"], saved["opt"])
    assert not saved["θ"]["s"].sharding.is_fully_replicated
    checkpoint.save(tmp_path, saved, step=1)
    assert checkpoint.latest_step(tmp_path) == 1

    targets = {
        "same": Tiny((1, 8, 1)),
        "(2, 4) mesh, w replicated": Tiny((2, 4, 1), shard_weights=False),
        "(8,) mesh d0": Tiny((8, 1, 1)),
        "serial": Tiny(),
    }
    for name, model in targets.items():
        target = like(model)
        restored = checkpoint.restore(tmp_path, target)
        assert_restored(restored, saved, target)
        # it trains on (the uncommitted step count goes with the rest): one more step
        # equals one more step of the saved state
        with jax.numpy_dtype_promotion("standard"):
            θ2, _ = jax.jit(lambda θ, state: adam_step(model, θ, state, a, u))(restored["θ"], restored["opt"])
        for key in θ1:
            np.testing.assert_allclose(np.asarray(θ2[key]), np.asarray(θ1[key]), rtol=1e-5, atol=1e-6, err_msg=name)

    # shardings alone: ShapeDtypeStructs from another operator's param_shardings()
    D = Tiny((2, 4, 1)).op
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=D.param_shardings()[k]) for k, v in saved["θ"].items()}
    target = {"θ": shapes, "opt": like(Tiny((2, 4, 1)))["opt"]}
    assert_restored(checkpoint.restore(tmp_path, target), saved, target)


def test_checkpoint_errors(ocp, tmp_path):
    θ = Tiny((1, 8, 1)).init(jax.random.key(0))
    assert checkpoint.latest_step(tmp_path / "none") is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.restore(tmp_path / "none", θ)
    checkpoint.save(tmp_path, θ, step=3)
    with pytest.raises(ValueError, match="already exists"):
        checkpoint.save(tmp_path, θ, step=3)
    wrong = {"w": θ["w"].astype(jnp.float64), "s": θ["s"]}
    with pytest.raises(ValueError, match=r"w: float32\(8, 8\) saved, float64\(8, 8\) asked for"):
        checkpoint.restore(tmp_path, wrong)
    checkpoint.save(tmp_path, θ, step=1, allow_older=True)  # the latest is the largest
    assert checkpoint.latest_step(tmp_path) == 3
    # a step that is no int is named as save names it ("1" was "no step 1 (steps: [1, 3])";
    # True and 1.0 read as a damaged checkpoint)
    for step in ("1", True, 1.0):
        with pytest.raises(TypeError, match=r"restore: step must be an int"):
            checkpoint.restore(tmp_path, θ, step=step)
    # a file where the directory should be: at once (orbax's threads then held the process 5 minutes)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"file' is a file, not a checkpoint directory"):
        checkpoint.save(tmp_path / "file", θ, step=0)


def test_checkpoint_needs_orbax_only_when_used():
    code = (
        "import sys; sys.modules['orbax'] = sys.modules['orbax.checkpoint'] = None\n"
        "import parop, parop.nn\n"
        "try:\n"
        "    parop.checkpoint.latest_step('.')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert "pip install 'parop[train]'" in out


class Interrupt(Exception):
    pass


def interrupted_after(calls: int):
    """A `place` that counts its calls (two per step) and raises after `calls` of them."""

    def place(x):
        place.calls += 1
        if place.calls > calls:
            raise Interrupt
        return x

    place.calls = 0
    return place


def test_fit_resumed_from_a_checkpoint_equals_an_uninterrupted_run(ocp, tmp_path):
    model = Tiny((1, 2, 4))
    θ0 = model.init(jax.random.key(0))
    a, u = data(20)
    run = dict(steps=12, batch=8, lr=1e-2, seed=3, progress=False, every=5)  # batches straddle epochs
    with jax.numpy_dtype_promotion("standard"):
        θ_want, want = fit(model, θ0, a, u, **run)
        with pytest.raises(Interrupt):  # stopped during step 8: checkpoints at 5 steps
            fit(model, θ0, a, u, checkpoint=tmp_path, place=interrupted_after(2 * 7 + 1), **run)
        assert checkpoint.latest_step(tmp_path) == 5
        resumed = interrupted_after(10**6)
        θ, losses = fit(model, θ0, a, u, checkpoint=tmp_path, place=resumed, **run)
        assert resumed.calls == 2 * (12 - 5)  # steps 6 to 12 only
        np.testing.assert_array_equal(losses, want)
        for key in θ_want:
            np.testing.assert_array_equal(np.asarray(θ[key]), np.asarray(θ_want[key]))
            assert θ[key].sharding == θ_want[key].sharding
        assert checkpoint.latest_step(tmp_path) == 12
        # a finished run: nothing left to train, the same result
        again = interrupted_after(0)
        θ, losses = fit(model, θ0, a, u, checkpoint=tmp_path, place=again, **run)
        np.testing.assert_array_equal(losses, want)
        # another run's settings
        with pytest.raises(ValueError, match=r"another run \(lr=0.01 there, 0.001 here\)"):
            fit(model, θ0, a, u, checkpoint=tmp_path, **{**run, "lr": 1e-3})
