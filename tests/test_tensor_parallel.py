"""Tensor-parallel `Matrix`: sharded weights, row- and column-parallel, chosen by the
planner, against the serial operator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import parop as po
from reference import pairing, random_array, random_params


def mesh_of(*sizes_names):
    sizes, names = zip(*sizes_names)
    n = int(np.prod(sizes))
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(sizes), devices=jax.devices()[:n])


def collectives(f, *args) -> dict[str, int]:
    text = jax.jit(f).lower(*args).compile().as_text()
    return {k: text.count(f"{k}(") for k in ("all-reduce", "all-to-all", "all-gather", "reduce-scatter")}


@pytest.mark.parametrize("form, spec, out", [("row", P(None, "t"), None), ("column", P(None, None), "auto")])
def test_textbook_mse_gradient(form, spec, out):
    """x (2, 4) @ w: the weight gradient of a mean-squared error, row- and column-parallel."""
    mesh = mesh_of((2, "t"))
    op = po.kron(po.Identity(2), po.Matrix(8, 4, name="w"))
    x = jnp.asarray(random_array(np.random.default_rng(0), (2, 4), np.float32))
    target = jnp.asarray(random_array(np.random.default_rng(1), (2, 8), np.float32))
    D = po.distribute(op, spec, mesh=mesh, out_partition=out, shard_weights=True)
    assert f"{form}-parallel" in str(D.plan)
    θ = po.init(D, jax.random.key(0))
    w_spec = P(None, "t") if form == "row" else P("t", None)
    assert θ["w"].sharding.spec == w_spec and θ["w"].addressable_shards[0].data.size == 8 * 4 // 2
    np.testing.assert_array_equal(np.asarray(θ["w"]), np.asarray(po.init(op, jax.random.key(0))["w"]))
    mse = lambda A: (lambda θ: jnp.mean((A(θ) @ x - target) ** 2))
    g = jax.grad(mse(D))(θ)["w"]
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(mse(op))(θ)["w"]), rtol=1e-5, atol=1e-7)
    assert g.sharding.is_equivalent_to(θ["w"].sharding, 2)  # the gradient comes back sharded the same way


def test_megatron_mlp_one_all_reduce_each_way():
    mesh = mesh_of((2, "t"))
    W1 = po.kron(po.Identity(4), po.Matrix(16, 8, name="w1"))
    W2 = po.kron(po.Identity(4), po.Matrix(8, 16, name="w2"))
    D1 = po.distribute(W1, P(), mesh=mesh, out_partition="auto", shard_weights=True)
    D2 = po.distribute(W2, D1.out_sharding.spec, mesh=mesh, out_partition=P(), shard_weights=True)
    assert "column-parallel" in str(D1.plan) and "row-parallel" in str(D2.plan)
    θ = {**po.init(D1, jax.random.key(0)), **po.init(D2, jax.random.key(0))}
    x = jnp.asarray(random_array(np.random.default_rng(0), (4, 8), np.float32))
    mlp = lambda A, B: (lambda θ, x: jnp.sum((B(θ) @ jax.nn.gelu(A(θ) @ x)) ** 2))
    forward = collectives(mlp(D1, D2), θ, x)
    both = collectives(jax.value_and_grad(mlp(D1, D2), argnums=(0, 1)), θ, x)
    assert forward == {"all-reduce": 1, "all-to-all": 0, "all-gather": 0, "reduce-scatter": 0}
    assert both == {"all-reduce": 2, "all-to-all": 0, "all-gather": 0, "reduce-scatter": 0}
    v, g = jax.value_and_grad(mlp(D1, D2), argnums=(0, 1))(θ, x)
    vs, gs = jax.value_and_grad(mlp(W1, W2), argnums=(0, 1))(θ, x)
    np.testing.assert_allclose(float(v), float(vs), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shard_weights", [True, "auto"])
@pytest.mark.parametrize("partition", [(2, 1), (4, 2), (8, 1), (2, 4)])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_sharded_matrix_invariant(shard_weights, partition, dtype):
    op = po.kron(po.Matrix(16, 8, dtype, name="w"), po.Identity(8))
    D = po.distribute(op, partition, shard_weights=shard_weights)
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 8), dtype))
    np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(op(θ) @ x), atol=1e-12)
    c = jnp.asarray(random_array(np.random.default_rng(1), (16, 8), dtype))
    np.testing.assert_allclose(np.asarray(D.H(θ) @ c), np.asarray(op.H(θ) @ c), atol=1e-12)
    loss = lambda A: (lambda θ, x: pairing(c, A(θ) @ x))
    for a, b in zip(jax.grad(loss(D), argnums=(0, 1))(θ, x), jax.grad(loss(op), argnums=(0, 1))(θ, x)):
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=1e-12)
    assert po.testing.dot_test(D, θ) < 1e-12
    if shard_weights is True:
        placed = po.init(D, jax.random.key(0))["w"]
        assert placed.addressable_shards[0].data.size == 16 * 8 // partition[0]


def test_shard_weights_false_replicates_and_bad_values():
    op = po.kron(po.Matrix(16, 8, name="w"), po.Identity(8))
    D = po.distribute(op, (2, 1), shard_weights=False)
    assert "parallel" not in str(D.plan) and D.plan.collectives()["all_to_all"] == 2
    assert po.init(D, jax.random.key(0))["w"].sharding.is_fully_replicated
    with pytest.raises(ValueError, match="shard_weights must be True, False or 'auto'"):
        po.distribute(op, (2, 1), shard_weights="yes")
    with pytest.raises(ValueError, match="no plan exists"):
        po.distribute(po.Matrix(8, 8, name="m"), (1,), mesh=None, shard_weights=True)


def test_auto_prefers_less_weight_memory_when_traffic_ties():
    """For inference, replicated and column-parallel both move nothing here: "auto" takes
    the one that holds less of the weight on each device. For training, column-parallel
    costs an all-reduce of the input's gradient, and the replicated weight none."""
    mesh = mesh_of((2, "t"))
    op = po.kron(po.Identity(2), po.Matrix(8, 4, name="w"))
    D = po.distribute(op, P(), mesh=mesh, out_partition="auto", cost=po.CostModel(training=False))
    assert "column-parallel" in str(D.plan) and D.plan.bytes == 0
    assert po.init(D, jax.random.key(0))["w"].addressable_shards[0].data.shape == (4, 4)
    D = po.distribute(op, P(), mesh=mesh, out_partition="auto")
    assert "parallel" not in str(D.plan) and D.plan.bytes == D.plan.backward_bytes == 0
