"""The FNO built from parop operators: serial against a plain-JAX FNO, distributed
against serial (outputs, loss, every gradient, a training run), and its collectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parop.datasets import darcy_flow
from parop.nn import FNO, UnitGaussianNormalizer, fit, relative_l2


def tiny(batch=4, layers=3):
    return FNO(batch=batch, grid=(16, 16), width=8, modes=(8, 6), layers=layers, projection=16)


def inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    shape = (model.batch, 1) + model.grid
    return jnp.asarray(rng.standard_normal(shape), jnp.float32), jnp.asarray(rng.standard_normal(shape), jnp.float32)


def test_serial_fno_matches_a_plain_jax_fno():
    plain = pytest.importorskip("benchmarks.plain_fno")
    model = FNO(batch=3, grid=(16, 16), width=8, modes=(8, 6), layers=2, projection=16)
    θ = model.init(jax.random.key(0))
    a, _ = inputs(model)

    def dense(name):
        return {"w": θ[name], "b": θ[f"{name}.bias"]}

    spectral = lambda k: jnp.stack([θ[f"spectral{k}"].real, θ[f"spectral{k}"].imag], -1)
    params = {
        "lift": dense("lift"), "proj1": dense("proj1"), "proj2": dense("proj2"),
        "layers": [{"spectral": spectral(k), "skip": dense(f"skip{k}")} for k in range(2)],
    }
    want = plain.apply(params, a[:, 0])
    np.testing.assert_allclose(np.asarray(model.apply(θ, a)[:, 0]), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_distributed_fno_equals_serial_forward_and_gradients():
    model = tiny()
    dist = model.distribute((1, 1, 2, 4))
    θ, θd = model.init(jax.random.key(0)), dist.init(jax.random.key(0))
    for name in θ:
        np.testing.assert_array_equal(np.asarray(θd[name]), np.asarray(θ[name]))
    a, u = inputs(model)
    loss = lambda m: jax.jit(jax.value_and_grad(lambda θ: relative_l2(m.apply(θ, a), u)))
    (value, grads), (dvalue, dgrads) = loss(model)(θ), loss(dist)(θd)
    np.testing.assert_allclose(np.asarray(dist.apply(θd, a)), np.asarray(model.apply(θ, a)), rtol=1e-4, atol=1e-5)
    assert abs(float(dvalue) - float(value)) <= 1e-5 * abs(float(value))
    assert set(grads) == set(dgrads)
    for name in grads:
        g, d = np.asarray(grads[name]), np.asarray(dgrads[name])
        np.testing.assert_allclose(d, g, rtol=1e-3, atol=1e-4 * np.abs(g).max(), err_msg=name)
    spectral = θd["spectral0"]
    assert spectral.addressable_shards[0].data.size < spectral.size  # split with its modes


def hlo_all_to_alls(D) -> int:
    run, specs = D._program(())
    x = jnp.zeros(D.domain_shape, D.dtype)
    ws = [jnp.zeros(D.parameters[name].param_shape, D.parameters[name].param_dtype) for name, _ in specs]
    text = run.lower(x, *ws).compile().as_text()
    assert "all-gather(" not in text
    return text.count("all-to-all(")


def test_model_parallel_layer_takes_two_all_to_alls():
    # batch 1: the splits cannot hide in the batch axis; x is split over 4 devices
    dist = tiny(batch=1).distribute((1, 1, 4, 1))
    assert [hlo_all_to_alls(L) for L in dist.ops["layers"]] == [2, 2, 2]


@pytest.mark.parametrize("batch, grid, modes", [
    (4, (16, 16), (8, 6)),
    (1, (32, 32), (12, 12)),  # 7 modes on the real-FFT axis: split 8 ways, padded to 8
    (20, (32, 32), (12, 12)),  # the training protocol's sizes
])
def test_spatial_2x4_split_takes_two_per_layer(batch, grid, modes):
    # the lifting moves the input to the layers' steady layout, so that the first layer
    # pays no more than the others
    model = FNO(batch=batch, grid=grid, width=8, modes=modes, layers=3, projection=16)
    dist = model.distribute((1, 1, 2, 4))
    assert [hlo_all_to_alls(L) for L in dist.ops["layers"]] == [2, 2, 2]
    assert sum(hlo_all_to_alls(dist.ops[k]) for k in ("lift", "proj1", "proj2")) <= 2


def test_planning_by_bytes_alone_keeps_the_spectral_weights_sharded(monkeypatch):
    # the protocol's sizes: with a collective worth nothing, 4 all_to_alls per layer
    # beat padding the 7 real-FFT modes, whose weights would then be kept whole
    import parop.distributed.plan as plan

    monkeypatch.setattr(plan, "LATENCY_BYTES", 0.0)
    dist = FNO(batch=20, grid=(32, 32), width=32, modes=(12, 12), layers=2).distribute((1, 1, 2, 4))
    assert [hlo_all_to_alls(L) for L in dist.ops["layers"]] == [4, 4]
    spectral = dist.init(jax.random.key(0))["spectral1"]
    assert spectral.addressable_shards[0].data.size < spectral.size


def test_distributed_training_follows_serial_step_for_step():
    model = tiny()
    dist = model.distribute((1, 1, 2, 4))
    a, u = darcy_flow(16, 16, seed=1)
    norm = UnitGaussianNormalizer.fit(a)
    a = norm.encode(a)[:, None]
    u = u[:, None]
    run = lambda m: fit(m, m.init(jax.random.key(0)), a, u, steps=20, batch=4, progress=False)[1]
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        serial, distributed = run(model), run(dist)
    np.testing.assert_array_less(np.abs(distributed - serial) / serial, 1e-4)
    assert serial[-1] < serial[0]
