"""Hardening, round three: `D.H` of plans that split onto a mesh axis the input leaves
free, the dot test on Explicit meshes, quick answers for output layouts no plan reaches,
and the checks of `CostModel`, `calibrate`, `D.plan_for`, `po.init` and `Stencil`.

Random operators on a mesh with a free axis: tests/test_properties.py
(test_a_mesh_axis_the_input_leaves_free).
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

import parop as po
from reference import close_to, random_array

RNG = np.random.default_rng
FREE_MESH = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


def fft2_matrix(n: int) -> np.ndarray:
    f = np.fft.fft(np.eye(n), axis=0)
    return np.kron(f, f)


def collectives(hlo: str) -> dict[str, list[str]]:
    """The replica groups of each all-gather and reduce-scatter of compiled HLO."""
    return {kind: re.findall(rf"\s{kind}\(.*?replica_groups=(\{{[^ ]*\}}),", hlo)
            for kind in ("all-gather", "reduce-scatter")}


# -- 4. D.H of a plan that splits onto a free mesh axis -------------------------------------------

F2 = po.kron(po.DFT(16, jnp.complex128), po.DFT(16, jnp.complex128))


def test_the_adjoint_of_a_split_onto_a_free_mesh_axis():
    """`po.distribute(F, P("a", None), mesh=m, out_partition="auto")` of a 2-D DFT on a
    (2, 4) mesh splits onto "b" (free at the input): `D @ x`, `D.H @ y` and the
    gradient through `D.H` equal NumPy and the serial operator. `D.H` gathers axis 1
    over "b" alone (groups of 4 devices, never all 8), and its pullback slices
    locally: no reduce-scatter. (`.T` and the dot test: tests/test_properties.py.)"""
    D = po.distribute(F2, P("a", None), mesh=FREE_MESH, out_partition="auto", cost=po.CostModel(training=False))
    assert D.out_sharding.spec == P(None, ("b", "a"))
    M = fft2_matrix(16)
    x = random_array(RNG(0), (16, 16), np.complex128)
    y = random_array(RNG(1), (16, 16), np.complex128)
    close_to(D @ x, (M @ x.reshape(256)).reshape(16, 16))

    def step(y, c):
        out, pull = jax.vjp(lambda y: D.H @ y, y)
        return out, pull(c)[0]
    c = random_array(RNG(2), (16, 16), np.complex128)
    args = jax.device_put(y, D.H.in_sharding), jax.device_put(c, D.H.out_sharding)
    compiled = jax.jit(step).lower(*args).compile()
    assert collectives(compiled.as_text()) == {"all-gather": ["{{0,1,2,3},{4,5,6,7}}"], "reduce-scatter": []}
    back, grad = compiled(*args)
    close_to(back, (M.conj().T @ y.reshape(256)).reshape(16, 16))
    close_to(grad, jax.vjp(lambda y: F2.H @ y, jnp.asarray(y))[1](jnp.asarray(c))[0])
    assert D.H.plan.collectives()["all_gather"] == 1 and D.H.plan.collectives(backward=True)["psum_scatter"] == 0


def test_an_out_partition_adding_a_free_mesh_axis():
    """`out_partition=P("a", "b")` from `P("a", None)` adds the free mesh axis "b" (a
    local slice): planned, and `D.H` is exact."""
    D = po.distribute(F2, P("a", None), mesh=FREE_MESH, out_partition=P("a", "b"), cost=po.CostModel(training=False))
    assert D.out_sharding.spec == P("a", "b")
    y = random_array(RNG(4), (16, 16), np.complex128)
    close_to(D.H @ y, (fft2_matrix(16).conj().T @ y.reshape(256)).reshape(16, 16))


# -- 5. the dot test on an Explicit mesh -----------------------------------------------------------

def test_the_dot_test_on_an_explicit_mesh():
    """`po.testing.dot_test(D, θ)` with `D` on `jax.make_mesh`'s Explicit axes, its output
    (5, 8) split over ("b", "a") on axis 1: no reshape of a sharded array."""
    m = jax.make_mesh((2, 4), ("a", "b"))
    A = po.kron(po.DFT(8, jnp.float64), po.Diagonal(8, jnp.float64, name="d"))
    D = po.distribute(A, P("a", "b"), mesh=m)
    θ = po.init(D, jax.random.key(0))
    assert po.testing.dot_test(D, θ) < 1e-13


# -- 6. an out_partition whose dropped splits nothing can sum away ---------------------------------

def test_an_impossible_count_out_partition_on_a_sum_fails_at_once():
    """`po.distribute(A + B, (1, 4, 2), out_partition=(1, 1, 2))`: splits over 4 devices
    must be summed away, and the Matrix(6) of each term sums at most 2: "no plan exists"
    at once, saying so, as for `A` alone. Dropping 2 of them is planned (row-parallel)."""
    def term(name):
        return po.kron(po.Matrix(6, 6, jnp.float64, name=f"{name}0"), po.Diagonal(16, jnp.float64, name=f"{name}1"),
                       po.Diagonal(12, jnp.float64, name=f"{name}2"))
    A, B = term("a"), term("b")
    for op in (A, A + B):
        start = time.perf_counter()
        with pytest.raises(ValueError, match=r"no plan exists for out_partition \(1, 1, 2\): it splits over 2 "
                                             r"devices, the input over 8 .*: it replicates mesh axes that the input "
                                             r"splits, over 4 devices, .* sums away splits over at most 2 devices"):
            po.distribute(op, (1, 4, 2), out_partition=(1, 1, 2))
        assert time.perf_counter() - start < 1.0
    D = po.distribute(A + B, (1, 4, 2), out_partition=(1, 4, 1), cost=po.CostModel(training=False))
    assert D.plan.collectives()["psum"] == 2


def test_an_out_partition_spec_dropping_more_than_can_be_summed():
    """A `PartitionSpec` output that drops mesh axes of 8 devices where a Matrix(6) sums
    at most 2: the same quick error."""
    m = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    op = po.kron(po.Matrix(6, 6, jnp.float64), po.Diagonal(16, jnp.float64))
    with pytest.raises(ValueError, match=r"leaves out mesh axes \['a', 'b'\] .* at most 2 devices"):
        po.distribute(op, P("a", "b"), mesh=m, out_partition=P())


def test_a_chain_sums_away_a_split_in_a_later_operator():
    """The summing bound of `po.distribute_chain` counts every operator of the chain: the
    `Reduce` of the second sums away the split the output `(1, 1)` drops."""
    c128 = jnp.complex128
    A = po.kron(po.DFT(8, c128), po.Identity(8, c128))
    B = po.kron(po.Identity(8, c128), po.Reduce(8, c128))
    D1, D2 = po.distribute_chain([A, B], (2, 1), out_partition=(1, 1))
    x = random_array(RNG(5), (8, 8), np.complex128)
    close_to(D2 @ (D1 @ x), B @ (A @ x))


# -- 7. CostModel and calibrate --------------------------------------------------------------------

@pytest.mark.parametrize("latency", [float("nan"), float("inf"), -1.0, True, "1"])
def test_cost_model_latency_must_be_a_finite_number(latency):
    with pytest.raises(ValueError, match=r"CostModel: latency_bytes must be a finite number >= 0"):
        po.CostModel(latency_bytes=latency)


@pytest.mark.parametrize("kwargs, message", [
    (dict(repeats=0), r"calibrate: repeats must be a positive int, got 0"),
    (dict(small=0, large=0), r"calibrate: small must be a positive int, got 0"),
    (dict(small=1 << 12, large=1 << 12), r"calibrate: the payloads must differ, small < large"),
])
def test_calibrate_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        po.calibrate(**kwargs)


# -- 8. D.plan_for -----------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, error, message", [
    ((0,), ValueError, r"plan_for: batch sizes must be positive .* got \(0,\)"),
    ((-2,), ValueError, r"plan_for: batch sizes must be positive .* got \(-2,\)"),
    ("ab", TypeError, r"plan_for takes a tuple of batch sizes \(ints\), got 'ab'"),
    ((2.0,), TypeError, r"plan_for takes a tuple of batch sizes \(ints\), got \(2.0,\)"),
])
def test_plan_for_and_program_check_the_batch_shape(batch, error, message):
    """`D.plan_for` and `D.program` (which planned and lowered a program for a negative
    batch size) refuse what is not a tuple of positive ints, naming the method."""
    D = po.distribute(po.kron(po.DFT(16), po.DFT(16)), (2, 1))
    with pytest.raises(error, match=r"distribute\(DFT\(16\) ⊗ DFT\(16\)\): " + message):
        D.plan_for(batch)
    with pytest.raises(error, match=r"distribute\(DFT\(16\) ⊗ DFT\(16\)\): " + message.replace("plan_for", "program")):
        D.program(batch)
    assert D.plan_for((np.int64(4),)).shape == (16, 16, 4) and D.program([np.int64(4)])[1] == []


@pytest.mark.parametrize("batch, error, message", [
    ((0,), ValueError, r"batch_shape: batch sizes must be positive .* got \(0,\)"),
    (4, TypeError, r"batch_shape takes a tuple of batch sizes \(ints\), got 4"),
    ((2.5,), TypeError, r"batch_shape takes a tuple of batch sizes \(ints\), got \(2.5,\)"),
])
def test_distribute_and_plan_check_the_batch_shape(batch, error, message):
    """`batch_shape=` of `po.distribute`, `po.plan` and `po.distribute_chain`, as
    `plan_for`'s argument (a zero size divided by zero in the planner before)."""
    F = po.kron(po.DFT(16), po.DFT(16))
    for make, where in ((po.distribute, "distribute"), (po.plan, "plan"),
                        (lambda F, *a, **k: po.distribute_chain([F], *a, **k), "distribute_chain")):
        with pytest.raises(error, match=where + r"\(.*DFT\(16\) ⊗ DFT\(16\).*\): " + message):
            make(F, (2, 1, 2), batch_shape=batch)
    assert po.distribute(F, (2, 1, 2), batch_shape=[np.int64(4)]).batch_shape == (4,)
    # a 1-D NumPy array, as the partition may be (it was a TypeError)
    assert po.plan(F, np.array([2, 1, 2]), batch_shape=np.array([4])) == po.plan(F, (2, 1, 2), batch_shape=(4,))


def test_distribute_chain_takes_a_sequence_of_operators():
    F = po.kron(po.DFT(16), po.DFT(16))
    for ops in (F, 3):  # one operator: po.distribute's
        with pytest.raises(TypeError, match=r"^distribute_chain takes a sequence of operators, .*po.distribute"):
            po.distribute_chain(ops, (2, 1))
    (D,) = po.distribute_chain((op for op in [F]), (2, 1))  # any iterable
    assert D.plan.cost == po.distribute(F, (2, 1)).plan.cost


# -- 9. the rest ---------------------------------------------------------------------------------------

def test_init_on_an_abstract_mesh():
    mesh = AbstractMesh((2, 4), ("a", "b"))
    D = po.distribute(po.kron(po.Matrix(16, 16, name="w"), po.DFT(16)), P("a", "b"), mesh=mesh)
    with pytest.raises(ValueError, match=r"po.init\(distribute\(.*\)\): planned on an AbstractMesh .* distribute it "
                                         r"on a jax.sharding.Mesh of devices to initialise it"):
        po.init(D, jax.random.key(0))


def test_stencil_weights():
    """Ragged weights name Stencil; traced weights say they are fixed and point to
    Convolution."""
    with pytest.raises(ValueError, match=r"Stencil: weights must be a rectangular array of numbers, "
                                         r"got \[\[1, 2, 3\], \[1, 2\]\]"):
        po.Stencil([[1, 2, 3], [1, 2]], (4, 4))
    with pytest.raises(TypeError, match=r"Stencil: the weights are fixed .* use po.Convolution"):
        jax.jit(lambda w: po.Stencil(w, (4, 4)) @ jnp.ones((4, 4), jnp.float32))(jnp.ones((3, 3), jnp.float32))
