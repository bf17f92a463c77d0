"""Distributed `Convolution`s and `Stencil`s with halo exchanges: the same linear map
as the serial operator (forward, adjoint, gradients) with up to three split grid axes,
`ppermute`s only in the compiled program, and a clear error where a block is thinner
than the halo and no other axis can take the split."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from reference import close, pairing, random_array, random_params, serial_results

F64 = "float64"


def collectives(text: str) -> dict[str, int]:
    return {k: text.count(f"{k}(") for k in ("all-to-all", "all-gather", "collective-permute")}


@pytest.mark.parametrize("boundary", ["periodic", "zero"])
@pytest.mark.parametrize("partition", [(1, 2, 2, 2), (2, 1, 2, 2), (1, 8, 1, 1), (1, 1, 4, 2)])
def test_a_3d_convolution_distributed_equals_serial(partition, boundary):
    """(channel, x, y, z) = (2, 8, 8, 8), a 3³ kernel: forward, `D.H`, the gradients in θ
    and x, and the dot test, against the serial operator in float64; where the grid
    stays split the plan exchanges halos and moves nothing."""
    op = po.Convolution(2, 2, (3, 3, 3), (8, 8, 8), boundary, F64, name="conv")
    D = po.distribute(op, partition)
    θ = random_params(op, 0)
    rng = np.random.default_rng(1)
    x = jnp.asarray(random_array(rng, op.domain_shape, F64))
    c = jnp.asarray(random_array(rng, op.range_shape, F64))
    serial = serial_results(op, θ, x, c)
    close(D(θ) @ x, serial["forward"])
    close(D.H(θ) @ c, serial["adjoint"])
    got = jax.jit(jax.grad(lambda θ, x: pairing(c, D(θ) @ x), argnums=(0, 1)))(θ, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(serial["grads"])):
        close(g, w)
    assert po.testing.dot_test(D, θ) < 1e-12
    if partition[0] == 1:  # the channel axis holds no split: every split grid axis exchanges halos
        split = sum(p > 1 for p in partition[1:])
        assert D.plan.collectives() == {**dict.fromkeys(D.plan.collectives(), 0), "ppermute": 2 * split}


def test_the_compiled_program_exchanges_halos_only():
    """A 3x3x3 convolution on (1, 2, 2, 2): the compiled forward and gradient hold
    collective-permutes (two per split axis forward) and no all-to-all or all-gather."""
    op = po.Convolution(4, 4, (3, 3, 3), (8, 8, 8), "zero", "float32", name="conv")
    D = po.distribute(op, (1, 2, 2, 2))
    θ = po.init(D, jax.random.key(0))
    x = jnp.zeros(op.domain_shape, jnp.float32)
    forward = jax.jit(lambda θ, x: D(θ) @ x).lower(θ, x).compile().as_text()
    assert collectives(forward) == {"all-to-all": 0, "all-gather": 0, "collective-permute": 6}
    grad = jax.jit(jax.grad(lambda θ, x: jnp.sum(D(θ) @ x), argnums=(0, 1))).lower(θ, x).compile().as_text()
    counts = collectives(grad)
    assert counts["all-to-all"] == counts["all-gather"] == 0 and counts["collective-permute"] >= 12, counts


def test_a_stencil_moves_its_split_where_a_block_is_thinner_than_the_halo():
    """A 5-point-wide fourth-order second difference (halo 2) on 16 points split 8
    ways (blocks of 2, as wide as the halo) exchanges halos; next to an identity axis
    with blocks of 1, thinner than the halo, its split moves to the identity's axis."""
    S = po.Stencil(np.array([-1.0, 16.0, -30.0, 16.0, -1.0]) / 12, (16,), dtype=F64)
    x = jnp.asarray(random_array(np.random.default_rng(2), (16,), F64))
    D = po.distribute(S, (8,))
    assert D.plan.collectives() == {**dict.fromkeys(D.plan.collectives(), 0), "ppermute": 2}
    close(D @ x, S @ x)
    K = po.kron(po.Identity(8, F64), po.Stencil(np.array([-1.0, 16.0, -30.0, 16.0, -1.0]) / 12, (8,), dtype=F64))
    D = po.distribute(K, (1, 8))  # blocks of 1, halo 2: the split goes to the identity's axis
    assert D.plan.collectives()["ppermute"] == 0 and D.plan.collectives()["all_to_all"] >= 1
    xk = jnp.asarray(random_array(np.random.default_rng(3), (8, 8), F64))
    close(D @ xk, K @ xk)


def test_a_block_thinner_than_the_halo_with_nowhere_to_go_is_a_clear_error():
    """A kernel 5 wide (halo 2) on 8 points split 8 ways, and no other axis to take the
    split: a `ValueError` that names the axis, the blocks and the halo."""
    op = po.Convolution(2, 2, (5,), (8,), "periodic", F64, name="conv")
    with pytest.raises(ValueError, match=r"(?s)no plan exists.*axis 1 of size 8 split in 8 gives blocks of 1, "
                                         r"fewer than the halo 2"):
        po.distribute(op, (1, 8))
