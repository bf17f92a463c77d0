"""`po.distribute`: the same linear map as the serial operator, with the fewest
collectives, on 1, 2, 4 and 8 forced CPU devices."""

import contextlib
import math
from collections import Counter

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import parop as po
from parop.distributed.hlo import _instructions, collectives as hlo_collectives
from parop.distributed.layout import default_mesh, sharding
from parop.distributed.plan import Goal, program
from parop.distributed.plan.actions import Permute
from parop.distributed.plan.search import Search
from parop.distributed.plan.plan import walk
from parop.nn import FNO, dry_run
from reference import close_to, dense, pairing, random_array, random_params, random_tree, serial_results


def hlo(D, x, *θ):
    run, specs = D.program(tuple(x.shape[D.ndim:]))
    return run.lower(x, *θ).compile().as_text()


def collectives(text: str) -> dict[str, int]:
    return {name: text.count(f"{name}(") for name in ("all-to-all", "all-gather", "all-reduce", "collective-permute")}


def complex_cube(n=16, dtype=np.complex64):
    return random_array(np.random.default_rng(0), (n, n, n), dtype)


# -- the fewest all_to_alls (the README's table), counted in the compiled HLO ------------

@pytest.mark.parametrize("partition, same, auto", [
    ((1, 1, 8), 2, 1), ((8, 1, 1), 2, 1), ((2, 2, 1), 4, 2), ((1, 2, 2), 4, 2), ((2, 2, 2), 6, 3),
])
def test_3d_fft_all_to_all_counts(partition, same, auto):
    F = po.kron(po.DFT(16), po.DFT(16), po.DFT(16))
    x = jnp.asarray(complex_cube())
    for out, want in ((None, same), ("auto", auto)):
        D = po.distribute(F, partition, out_partition=out)
        counts = collectives(hlo(D, x))
        assert counts == {"all-to-all": want, "all-gather": 0, "all-reduce": 0, "collective-permute": 0}
        assert D.plan.collectives()["all_to_all"] == want
        y = D @ x
        assert y.sharding.is_equivalent_to(D.out_sharding, y.ndim)
        np.testing.assert_allclose(np.asarray(y), np.fft.fftn(np.asarray(x)), atol=2e-3)
    assert D.out_sharding.spec != D.in_sharding.spec or partition == (1, 1, 1)


def test_batch_channel_xy_fft_auto_takes_two():
    F = po.kron(po.Identity(8, "complex64"), po.Identity(4, "complex64"), po.DFT(16), po.DFT(16))
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 4, 16, 16), np.complex64))
    D = po.distribute(F, (1, 1, 2, 4), out_partition="auto")
    assert collectives(hlo(D, x))["all-to-all"] == 2
    np.testing.assert_allclose(np.asarray(D @ x), np.fft.fft2(np.asarray(x)), atol=1e-3)


# -- on one device, the serial program ------------------------------------------------------

def instructions(f, *args) -> Counter:
    """The compiled program of `jit(f)(*args)`: its instructions, `(opcode, shape)`, counted."""
    text = jax.jit(f).lower(*args).compile().as_text()
    return Counter((opcode, shape) for _, shape, opcode, _, _ in _instructions(text))


@pytest.mark.parametrize("case", ["c2c 3-D DFT", "r2c 3-D DFT", "2-D FNO"])
def test_on_one_device_the_program_is_the_serial_operators(case):
    """Distributed over a one-device mesh, an operator compiles to what the serial
    operator compiles to, instruction for instruction, forward and gradient: the
    distributed layer costs nothing where there is nothing to move."""
    rng = np.random.default_rng(0)
    if case == "2-D FNO":
        model = FNO((16, 16), width=4, modes=(4, 4), layers=2)
        θ, x = model.init(jax.random.key(0)), jnp.asarray(random_array(rng, (2, 1, 16, 16), np.float32))
        serial, one = model.apply, model.distribute((1, 1, 1, 1), batch=2).apply
    else:
        real = case.startswith("r2c")
        op = po.kron(po.DFT(8), po.DFT(8), po.DFT(8, dtype=jnp.float32 if real else jnp.complex64))
        θ, x = {}, jnp.asarray(random_array(rng, (8, 8, 8), np.float32 if real else np.complex64))
        serial, one = op.apply, po.distribute(op, (1, 1, 1)).apply
    assert instructions(one, θ, x) == instructions(serial, θ, x)
    if θ:
        def gradient(apply):
            return jax.grad(lambda θ, x: jnp.sum(jnp.abs(apply(θ, x)) ** 2))

        assert instructions(gradient(one), θ, x) == instructions(gradient(serial), θ, x)


# -- the first examples (README's "Distributed" section) -----------------------------------

def test_seed_a_real_3d_dft():
    F = po.kron(po.DFT(30, jnp.complex64), po.DFT(20, jnp.complex64), po.DFT(10, jnp.float32))
    x = random_array(np.random.default_rng(0), (30, 20, 10), np.float32)
    D = po.distribute(F, partition=(2, 1, 1))
    y = D @ x
    assert y.dtype == jnp.complex64 and y.shape == (30, 20, 6) and y.sharding.is_equivalent_to(D.out_sharding, 3)
    np.testing.assert_allclose(np.asarray(y), np.fft.rfftn(x), atol=2e-3)
    np.testing.assert_allclose(np.asarray(D.H @ y), np.asarray(F.H @ y), rtol=1e-4, atol=1e-2)
    assert "all_to_all d0" in str(D.plan) and "forward:  2 all_to_all" in str(D.plan)


def test_seed_b_channel_mixing_and_gradient():
    S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    D = po.distribute(S, partition=(1, 2, 2))
    θ, θs = po.init(D, jax.random.key(0)), po.init(S, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(θ["mix"]), np.asarray(θs["mix"]))
    x = jnp.asarray(random_array(np.random.default_rng(0), (50, 30, 10), np.float32))
    np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(S(θs) @ x), rtol=1e-5, atol=1e-5)
    grad = jax.jit(jax.grad(lambda θ, x: jnp.sum(D(θ) @ x), argnums=(0, 1)))
    serial = jax.grad(lambda θ, x: jnp.sum(S(θ) @ x), argnums=(0, 1))(θs, x)
    for g, s in zip(jax.tree.leaves(grad(θ, x)), jax.tree.leaves(serial)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(s), rtol=1e-4, atol=1e-4)
    counts = collectives(grad.lower(θ, x).compile().as_text())
    assert counts["all-to-all"] == 0 and counts["all-gather"] == 0 and counts["all-reduce"] == 1


def test_seed_c_weight_sharing_over_a_batch_axis():
    M = po.Matrix(20, 20, name="w")
    D = po.distribute(M, partition=(1, 4))
    θ = po.init(D, jax.random.key(0))
    x = jnp.asarray(random_array(np.random.default_rng(0), (20, 100), np.float32))
    np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(M(θ) @ x), rtol=1e-5, atol=1e-5)
    loss = lambda op: (lambda θ: jnp.sum((op(θ) @ x) ** 2))
    want = np.asarray(jax.grad(loss(M))(θ)["w"])
    np.testing.assert_allclose(np.asarray(jax.grad(loss(D))(θ)["w"]), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert D.plan.collectives() == dict.fromkeys(["all_to_all", "psum", "psum_scatter", "all_gather", "ppermute"], 0)
    assert θ["w"].sharding.is_fully_replicated


def test_seed_d_reduce_is_an_all_reduce():
    R = po.kron(po.Reduce(8), po.Identity(100))
    D = po.distribute(R, partition=(8, 1))
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 100), np.float32))
    y = D @ x
    np.testing.assert_allclose(np.asarray(y), np.asarray(x).sum(0, keepdims=True), rtol=1e-5)
    assert D.out_sharding.spec == P(None, None)  # the reduced axis comes back replicated
    assert collectives(hlo(D, x)) == {"all-to-all": 0, "all-gather": 0, "all-reduce": 1, "collective-permute": 0}
    back = D.H @ y
    np.testing.assert_allclose(np.asarray(back), np.broadcast_to(np.asarray(y), (8, 100)))
    assert back.sharding.is_equivalent_to(D.in_sharding, 2)
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda x: jnp.sum(D @ x))(x)), np.ones((8, 100)))


# -- the invariant on random operators and partitions ---------------------------------------

def random_partition(rng, shape, devices):
    """Split `devices` (a power of 2) over the axes of `shape` in factors of 2."""
    counts = [1] * len(shape)
    for _ in range(int(math.log2(devices))):
        fits = [i for i, n in enumerate(shape) if n % (counts[i] * 2) == 0]
        counts[int(rng.choice(fits))] *= 2
    return tuple(counts)


def close(a, b, scale=1.0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-9 * max(1.0, scale), rtol=1e-9)


@pytest.mark.parametrize("seed", [pytest.param(s, marks=[pytest.mark.long] if s >= 12 else []) for s in range(24)])
def test_random_operator_equals_serial(seed):
    rng = np.random.default_rng(100 + seed)
    dtype = ["float64", "complex128"][seed % 2]
    shape = tuple(int(n) for n in rng.choice([2, 4, 8], size=int(rng.integers(1, 4))))
    op = random_tree(rng, shape, dtype, depth=2, sizes=(2, 4, 8))
    devices = [1, 2, 4, 8][seed % 4]
    partition = random_partition(rng, op.domain_shape + (8,), devices)
    out = [None, "auto"][seed // 2 % 2]
    D = po.distribute(op, partition, out_partition=out)
    θ = random_params(op, seed)
    x = jnp.asarray(random_array(rng, op.domain_shape + (8,), op.dtype))
    c = jnp.asarray(random_array(rng, op.range_shape + (8,), op.range_dtype))
    serial = serial_results(op, θ, x, c)
    y = D(θ) @ x
    want = serial["forward"]
    scale = float(jnp.abs(want).max()) if want.size else 1.0
    close(y, want, scale)
    assert y.sharding.is_equivalent_to(sharding(D.mesh, D.plan_for((8,)).out_layout), y.ndim) and y.dtype == want.dtype
    back = serial["adjoint"]
    close(D.H(θ) @ c, back, float(jnp.abs(back).max()))
    got = jax.jit(jax.grad(lambda θ, x: pairing(c, D(θ) @ x), argnums=(0, 1)))(θ, x)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(serial["grads"])):
        close(g, r, float(jnp.abs(r).max()))
    assert po.testing.dot_test(D, θ, batch_shape=(8,)) < 1e-10
    text = hlo(D, x, *(θ[n] for n, _ in D.program((8,))[1]))
    assert "all-gather(" not in text


def test_jit_vmap_linear_transpose_and_caching():
    F = po.kron(po.DFT(8), po.Diagonal(8, "complex64", name="d"), po.DFT(8))
    D = po.distribute(F, (2, 2, 2))
    θ = random_params(F)
    θ = {"d": θ["d"].astype(jnp.complex64)}
    xs = jnp.asarray(random_array(np.random.default_rng(0), (3, 8, 8, 8), np.complex64))
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda x: D(θ) @ x)(xs)), np.asarray(jax.vmap(lambda x: F(θ) @ x)(xs)), atol=1e-3)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: D(θ) @ x)(xs[0])), np.asarray(F(θ) @ xs[0]), atol=1e-3)
    (t,) = jax.linear_transpose(lambda x: D(θ) @ x, xs[0])(xs[1])
    (ts,) = jax.linear_transpose(lambda x: F(θ) @ x, xs[0])(xs[1])
    np.testing.assert_allclose(np.asarray(t), np.asarray(ts), atol=1e-3)
    _, specs = D.program(())
    D(θ) @ xs[0]
    call = D.programs.calls[False]
    before = call._cache_size()
    D(θ) @ xs[1]
    assert call._cache_size() == before == 1  # the second call neither retraces nor recompiles
    # the Diagonal's weight is split with its axis
    assert specs == [("d", P("d1"))] or specs[0][1] != P()
    placed = po.init(D, jax.random.key(0))["d"]
    assert placed.sharding.spec == specs[0][1]
    assert placed.addressable_shards[0].data.shape[0] < 8


def test_per_mode_weights_stay_sharded_with_their_modes():
    W = po.PerModeMatrix(4, 3, (8, 8), name="w")
    D = po.distribute(W, (1, 2, 4))
    assert not any(D.plan.collectives().values())
    θ = po.init(D, jax.random.key(0))
    assert θ["w"].sharding.spec == P(None, None, "d1", "d2")
    assert θ["w"].addressable_shards[0].data.shape == (4, 3, 4, 2)
    np.testing.assert_array_equal(np.asarray(θ["w"]), np.asarray(po.init(W, jax.random.key(0))["w"]))
    x = jnp.asarray(random_array(np.random.default_rng(0), (3, 8, 8), np.complex64))
    np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(W(θ) @ x), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_split_goes_onto_an_axis_it_does_not_divide_padded_with_zeros(dtype):
    # an FNO's case: the 7 modes kept on a real-FFT axis take the other axis's 8-way split
    cdtype = {"float32": "complex64", "float64": "complex128"}[dtype]
    down = po.kron(po.DFT(16, cdtype), po.Restriction(9, slice(0, 7)) @ po.DFT(16, dtype))
    op = po.kron(po.DFT(16, cdtype).inverse(), po.Diagonal(7, cdtype, name="d")) @ down
    D = po.distribute(op, (8, 1))
    assert D.plan.collectives() == {**dict.fromkeys(["psum", "psum_scatter", "all_gather", "ppermute"], 0), "all_to_all": 2}
    assert "axis 1 padded with 1 zeros" in str(D.plan) and "axis 1 cropped to 7" in str(D.plan)
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(1), (16, 16), dtype))
    tol = {"float32": 1e-5, "float64": 1e-12}[dtype]
    y, want = D(θ) @ x, op(θ) @ x
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), atol=tol * float(jnp.abs(want).max()))
    assert y.sharding.is_equivalent_to(D.out_sharding, 2) and D.out_sharding.spec == P("d0", None)
    assert po.testing.dot_test(D, θ) < 100 * tol
    c = jnp.asarray(random_array(np.random.default_rng(2), y.shape, y.dtype))
    loss = lambda A: (lambda θ, x: pairing(c, A(θ) @ x))  # noqa: E731
    for g, r in zip(jax.grad(loss(D), argnums=(0, 1))(θ, x), jax.grad(loss(op), argnums=(0, 1))(θ, x)):
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(r)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol * float(jnp.abs(b).max()))
    text = hlo(D, x, θ["d"])
    assert collectives(text) == {"all-to-all": 2, "all-gather": 0, "all-reduce": 0, "collective-permute": 0}
    # a sharding must divide the array: the weight is kept whole, and padded and sliced in the program
    placed = po.init(D, jax.random.key(0))["d"]
    assert placed.sharding.spec == P(None) and D.program(())[1] == [("d", P("d0"))]
    np.testing.assert_array_equal(np.asarray(placed), np.asarray(po.init(op, jax.random.key(0))["d"]))
    # trained with Adam, its gradient's pieces are gathered once, in the program, as the plan says (left
    # free, XLA gathered Adam's three updated arrays instead: three all-gathers, on Auto axes)
    import optax

    adam = optax.adam(1e-3)

    def step(w, state, x):
        g = jax.grad(lambda w: pairing(c, D({"d": w}) @ x))(w)
        update, state = adam.update(g, state, w)
        return optax.apply_updates(w, update), state

    assert D.plan.collectives(backward=True)["all_gather"] == 1
    with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes real and complex
        text = jax.jit(step).lower(placed, adam.init(placed), x).compile().as_text()
    found = collectives(text)
    assert found["all-gather"] == 1 and found["all-reduce"] == found["collective-permute"] == 0, found


def test_a_length_one_dft_runs_no_fft():
    """A DFT of length 1 is the identity (real to complex, or complex to its real part,
    whatever its norm) and runs no FFT: in this operator's distributed adjoint, every
    local block is 1 x 1 x 1, and XLA:CPU's FFT refused the layout its layout assignment
    gave such a block (an INTERNAL RET_CHECK error, found by the combination property
    test). Values against the serial operator and the dense reference."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    F = po.kron(po.DFT(1, "float64", "ortho"), po.Identity(1, "float64"), po.Identity(2, "float64"))
    R = po.kron(po.Restriction(2, [0], "float64"), po.Restriction(2, [1], "float64"), po.Identity(2, "float64"))
    M = po.kron(po.Matrix(1, 2, "float64", name="m0"), po.Matrix(1, 2, "float64", name="m1"),
                po.Identity(2, "float64"))
    op = -0.23 * (F.H @ ((-0.8 - 0.3j) * (F @ R) + (-1.4 - 0.8j) * (F @ M)))
    D = po.distribute(op, P("c", None, None), mesh=mesh)
    θ = random_params(op)
    c = jnp.asarray(random_array(np.random.default_rng(8), (1, 1, 2), np.float64))
    x = jnp.asarray(random_array(np.random.default_rng(9), (2, 2, 2), np.float64))
    for got, want in [(D.H(θ) @ c, op.H(θ) @ c), (D(θ) @ x, op(θ) @ x),
                      (po.to_dense(D, θ), dense(op, θ))]:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)
    run, specs = D.H.program(())
    assert " fft(" not in run.lower(c, *(θ[name] for name, _ in specs)).compile().as_text()


def test_an_fft_beside_a_length_one_axis():
    """An FFT of a tensor with a length-1 axis it does not transform: in the jitted
    adjoint of a product of two distributed programs (a DFT(2) on a (1, 2) tensor),
    XLA:CPU's FFT refused the layout its layout assignment gave the operand (an INTERNAL
    RET_CHECK error, found by the combination property test at another seed); each FFT
    now runs on its operand without such axes. Values against the serial operator."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    c = "complex128"
    A = po.kron(po.Reduce(4, c), po.DFT(2, c, norm="forward"))
    B = po.kron(po.Diagonal(1, c, name="d"), po.DFT(2, c, norm="forward")) @ po.kron(po.DFT(1, c), po.Identity(2, c))
    D = po.distribute(B, P(None, None), mesh=mesh) @ po.distribute(A, P(None, "c"), mesh=mesh)
    θ = random_params(B @ A)
    y = jnp.asarray(random_array(np.random.default_rng(11), (1, 2), np.complex128))
    want = (B @ A).H(θ) @ y
    for got in (jax.jit(lambda θ, y: D.H(θ) @ y)(θ, y), D.H(θ) @ y):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-14)


def test_an_fft_beside_a_collective_in_a_pullback():
    """The gradient of a jitted product of two distributed programs, a DFT(2) next to a
    row-parallel `Matrix` whose pullback all-gathers the middle axis: XLA:CPU's layout
    assignment gave the pullback's FFT the all-gather's layout (that axis most major)
    and its FFT refused it (an INTERNAL RET_CHECK error, found by the combination
    property test at seed 109); each FFT's operand and result are now kept row-major.
    Gradients against the serial operator's, and the same product transposed by a
    jitted `jax.linear_transpose` (as lineax transposes an operator), against `.T`."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    c = "complex128"
    A = po.kron(po.Identity(2, c), po.Matrix(8, 8, c), po.DFT(2, c))
    B = po.kron(po.Diagonal(2, c), po.Identity(8, c), po.DFT(2, c, norm="ortho"))
    D = po.distribute(B, P(None, None, None), mesh=mesh) @ po.distribute(A, P(None, "c", None), mesh=mesh)
    θ = random_params(B @ A)
    x = jnp.asarray(random_array(np.random.default_rng(12), (2, 8, 2), np.complex128))
    loss = lambda θ, op: jnp.sum(jnp.abs(op(θ) @ x) ** 2)
    got, want = jax.jit(jax.grad(loss), static_argnums=1)(θ, D), jax.grad(loss)(θ, B @ A)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-12, atol=1e-12)
    _assert_linear_transpose_is_T(D, B @ A, θ, x)


def _assert_linear_transpose_is_T(D, A, θ, x):
    """A jitted `jax.linear_transpose` of `D(θ) @ ·` at `x`'s type is the serial `A.T`."""
    y = jnp.asarray(random_array(np.random.default_rng(14), A.range_shape, A.range_dtype))
    got, = jax.jit(lambda θ, y: jax.linear_transpose(lambda x: D(θ) @ x, x)(y))(θ, y)
    np.testing.assert_allclose(np.asarray(got), np.asarray(A.T(θ) @ y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_a_real_fft_beside_a_length_one_axis_and_beside_a_collective_in_a_pullback(n):
    """The two cases above with a real DFT (`rfft`, and `irfft` in its adjoint and its
    pullback), whose operand, unlike its result, is guarded in transposes only (`_fft`):
    a jitted product and its adjoint beside a length-1 axis, and the gradient and the
    `jax.linear_transpose` of a jitted product whose row-parallel `Matrix` all-gathers
    in its pullback. Values and gradients against the serial operator."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    r, c = "float64", "complex128"
    A = po.kron(po.Reduce(4, r), po.Identity(n, r))
    B = (po.kron(po.Diagonal(1, c, name="d"), po.DFT(n // 2 + 1, c, norm="forward"))
         @ po.kron(po.Identity(1, r), po.DFT(n, r)))
    D = po.distribute(B, P(None, None), mesh=mesh) @ po.distribute(A, P(None, "c"), mesh=mesh)
    θ = random_params(B @ A)
    x = jnp.asarray(random_array(np.random.default_rng(11), (4, n), np.float64))
    y = jnp.asarray(random_array(np.random.default_rng(12), (1, n // 2 + 1), np.complex128))
    for got, want in [(jax.jit(lambda θ, x: D(θ) @ x)(θ, x), (B @ A)(θ) @ x),
                      (jax.jit(lambda θ, y: D.H(θ) @ y)(θ, y), (B @ A).H(θ) @ y)]:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)

    A = po.kron(po.Identity(2, r), po.Matrix(8, 8, r), po.Identity(n, r))
    B = (po.kron(po.Diagonal(2, c), po.Identity(8, c), po.Identity(n // 2 + 1, c))
         @ po.kron(po.Identity(2, r), po.Identity(8, r), po.DFT(n, r, norm="ortho")))
    D = po.distribute(B, P(None, None, None), mesh=mesh) @ po.distribute(A, P(None, "c", None), mesh=mesh)
    θ = random_params(B @ A)
    x = jnp.asarray(random_array(np.random.default_rng(13), (2, 8, n), np.float64))
    loss = lambda θ, op: jnp.sum(jnp.abs(op(θ) @ x) ** 2)
    got, want = jax.jit(jax.grad(loss), static_argnums=1)(θ, D), jax.grad(loss)(θ, B @ A)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-12, atol=1e-12)
    _assert_linear_transpose_is_T(D, B @ A, θ, x)


def _primitives(jaxpr) -> list[str]:
    """The primitives of `jaxpr` in order, those of the jaxprs it calls in place of the call."""
    names = []
    for eqn in jaxpr.eqns:
        inner = list(jax.extend.core.jaxprs_in_params(eqn.params))
        if inner:
            for sub in inner:
                names += _primitives(sub)
        else:
            names.append(eqn.primitive.name)
    return names


def test_an_ffts_operand_is_guarded_in_transposes_only():
    """The row-major guard (`_fft`) puts an optimisation barrier after every FFT, and on
    its operand's side only in a transpose: a forward program's FFT reads its operand as
    the operand's producer made it (guarded, XLA could not fuse that producer into the
    layout the FFT needs, and the FNO's remat step held one more complex block: 9.73 ->
    11.07 GB per device at dfno's block), and the FFT of a gradient, or of a
    `jax.linear_transpose`, hands back a row-major cotangent."""
    op = po.kron(po.Identity(3, "float32"), po.DFT(8, "float32"))
    x = jnp.ones((3, 8), jnp.float32)
    forward = _primitives(jax.make_jaxpr(lambda x: op({}) @ x)(x).jaxpr)
    assert forward.index("fft") < forward.index("optimization_barrier"), forward
    backward = _primitives(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(jnp.abs(op({}) @ x) ** 2)))(x).jaxpr)
    ffts = [i for i, name in enumerate(backward) if name == "fft"]
    assert len(ffts) == 2 and "optimization_barrier" in backward[ffts[-1]:], backward
    transpose = jax.linear_transpose(lambda x: op({}) @ x, x)
    transposed = _primitives(jax.make_jaxpr(transpose)(op({}) @ x).jaxpr)
    assert transposed.count("fft") == 1 and "optimization_barrier" in transposed[transposed.index("fft"):], transposed


def _dealing(D) -> int:
    """How many `ppermute`s deal blocks anew in `D`'s plan (the halo exchanges aside)."""
    return sum(isinstance(visit.action, Permute) for visit in walk(D.plan.visits))


def _random_spec(rng: np.random.Generator, ndim: int, names: tuple[str, ...]) -> P:
    """Each mesh axis of `names` on a random tensor axis of `ndim`, in a random order."""
    axes = [[] for _ in range(ndim)]
    for name in rng.permutation(names):
        axes[int(rng.integers(ndim))].append(str(name))
    return P(*(tuple(a) if len(a) > 1 else a[0] if a else None for a in axes))


def test_mesh_axes_that_trade_tensor_axes_are_dealt_anew():
    """Two mesh axes that must trade tensor axes where no tensor axis holds both on the
    way: `DFT(4)` with a batch of 8 from (4, 2) to `out_partition=(2, 4)` (d0 of 4 from
    axis 0 to the batch axis, d1 of 2 the other way, and the DFT needs axis 0 whole) had
    no plan ("no plan exists"): an `all_to_all` takes only the minor end of an axis. It
    is one `ppermute` that deals the blocks anew (`Permute`, found by a search without a
    lower bound, run only where the usual one proves there is no route to the output). Then
    random operator trees on random layouts of 2 x 4 and 2 x 2 x 2 meshes, Auto and
    Explicit, whose plans deal blocks: values, adjoint and gradients as the serial
    operator's (float64 and complex128), the compiled program's collectives and bytes as
    the plan's (a `collective-permute` per `ppermute`), and the search's cost as the
    exhaustive search's with the same moves."""
    D = po.distribute(po.DFT(4, "complex128"), (4, 2), out_partition=(2, 4), batch_shape=(8,))
    assert D.out_sharding.spec == P("d1", "d0") and _dealing(D) == 1
    assert D.plan.collectives() == {"all_to_all": 2, "psum": 0, "psum_scatter": 0, "all_gather": 0, "ppermute": 1}
    assert D.H.plan.collectives()["ppermute"] == 1
    x = random_array(np.random.default_rng(1), (4, 8), np.complex128)
    np.testing.assert_allclose(np.asarray(D @ x), np.fft.fft(x, axis=0), rtol=0, atol=1e-13)
    assert po.testing.dot_test(D, batch_shape=(8,)) < 1e-13
    assert "ppermute d0+d1: blocks dealt anew" in str(D.plan)
    assert po.Plan.from_json(D.plan.to_json()) == D.plan

    rng = np.random.default_rng(2026)
    checked = 0
    for draw in range(200):
        shape, names = [((2, 4), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))][draw % 2]
        axis_type = [AxisType.Auto, AxisType.Explicit][draw // 2 % 2]
        mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))
        dtype = ["float64", "complex128"][int(rng.integers(2))]
        dims = tuple(int(n) for n in rng.choice([2, 4, 6, 8], size=int(rng.integers(2, 4))))
        op = random_tree(rng, dims, dtype, 1, sizes=(2, 4, 8))
        spec_in, spec_out = _random_spec(rng, len(dims), names), _random_spec(rng, len(op.range_shape), names)
        shard = ["auto", True][draw // 4 % 2]
        try:
            D = po.distribute(op, spec_in, mesh=mesh, out_partition=spec_out, shard_weights=shard)
        except ValueError as e:
            assert "no plan exists" in str(e) or "cannot be split" in str(e) or "divide" in str(e), e
            continue
        if not _dealing(D):
            continue
        θ = random_params(op, draw)
        x = jnp.asarray(random_array(rng, dims, op.dtype))
        c = jnp.asarray(random_array(rng, op.range_shape, op.range_dtype))
        with jax.set_mesh(mesh):
            want = serial_results(op, θ, x, c)
            run = jax.jit(lambda θ, x: D(θ) @ x)
            close_to(run(θ, x), want["forward"])
            close_to(D.H(θ) @ c, want["adjoint"])
            grads = jax.jit(jax.grad(lambda θ, x: pairing(c, D(θ) @ x), argnums=(0, 1)))(θ, x)
            for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want["grads"])):
                close_to(got, ref)
            compiled = run.lower(θ, x).compile().as_text()
        # the search that found it (Dijkstra's, with forced steps and no back-to-back moves) is as cheap
        # as Dijkstra's over every state
        prog, goal = program(op, dims), Goal.layout(D.plan.out_layout)
        fast, exact = (Search(dict(mesh.shape), D.cost, shard, exhaustive=exhaustive, permutes=True).run(
            prog, D.plan.in_layout, goal)[0] for exhaustive in (False, True))
        assert fast == exact, (fast, exact, D.plan)
        found = hlo_collectives(compiled)
        plan = D.plan.collectives()
        assert found["counts"]["collective-permute"] == plan.get("ppermute", 0), (found, D.plan)
        assert found["counts"]["all-to-all"] == plan.get("all_to_all", 0), (found, D.plan)
        assert found["sent_bytes"] == D.plan.bytes, (found, D.plan)
        checked += 1
        if checked == 4:
            break
    assert checked == 4, checked


def test_blocks_dealt_anew_on_a_padded_axis():
    """A `ppermute` on an axis padded with zeros (6 split 4 ways: the last device's block
    holds the zeros), which the search may plan but rarely does: a plan written by hand
    (pad, deal, crop) is the identity, forward and (its transpose) backward, on every
    entry."""
    from parop.distributed.lower import lower
    from parop.distributed.plan.actions import AllToAll

    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    actions = (AllToAll(("b", "c"), 1, 0, pad=2), Permute((("c", "b"), ("a",))), AllToAll(("c", "b"), 0, 1, crop=6))
    plan = po.Plan("I", tuple(mesh.shape.items()), (6, 8), (6, 8), ((), ("a", "b", "c")), actions,
                   np.dtype("float64"), po.CostModel())
    assert plan.out_layout == ((), ("a", "c", "b")) and plan.collectives()["ppermute"] == 1
    run, _ = lower(plan, mesh)
    x, w = np.arange(48.0).reshape(6, 8), np.arange(48.0).reshape(6, 8)[::-1]
    np.testing.assert_array_equal(np.asarray(run(x)), x)
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda x: jnp.sum(run(x) * w))(x)), w)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_user_mesh_and_partition_spec(axis_type):
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type, axis_type))
    F = po.kron(po.DFT(8), po.DFT(16), po.DFT(8, "float32"))
    D = po.distribute(F, P("a", "b"), mesh=mesh)
    x = random_array(np.random.default_rng(0), (8, 16, 8), np.float32)
    y = D @ x
    np.testing.assert_allclose(np.asarray(y), np.fft.rfftn(x), atol=1e-3)
    assert D.out_sharding.spec == P("a", "b", None) and y.sharding.mesh == mesh
    D2 = po.distribute(F, (2, 4, 1), mesh=mesh)
    assert D2.in_sharding.spec == P("a", "b", None)
    assert po.distribute(F, np.array([2, 4, 1]), mesh=mesh, shard_weights=np.bool_(False)).plan == D2.plan


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_under_jax_set_mesh_parop_distributes_on_the_context_mesh(axis_type):
    """Inside `with jax.set_mesh(mesh):`, `po.distribute`, `po.plan`,
    `po.distribute_chain` and `FNO.distribute` given no `mesh=` distribute on the context
    mesh (a tuple's counts take its axes, a `PartitionSpec` names them; the partition
    search of `FNO.distribute(devices=N)` looks only at partitions its axes give), and the
    operators run there, jitted and differentiated, as the serial ones (the FNO on input
    placed where it wants it: on Explicit axes its grid coordinates are laid out as the
    input). (They made a mesh of their own, on which JAX refused to run a shard_map
    under the context.) An
    operator distributed on another mesh, applied under the context, is a `ValueError`
    naming both meshes."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(axis_type,) * 3)
    op = po.kron(po.DFT(8, "complex128"), po.Matrix(8, 8, "complex128", name="w"))
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(6), (8, 8), np.complex128))
    outside = po.distribute(op, (2, 4))
    loss = lambda A: lambda θ: pairing(x, A(θ) @ x)  # noqa: E731
    with jax.set_mesh(mesh):
        D = po.distribute(op, (2, 2))
        assert D.mesh == mesh and D.in_sharding.spec == P("a", "b")
        assert po.distribute(op, P("a", ("b", "c"))).in_sharding.spec == P("a", ("b", "c"))
        assert po.plan(op, (2, 2)) == D.plan
        first, second = po.distribute_chain([op, op.H], (2, 2))
        assert first.mesh == second.mesh == mesh
        np.testing.assert_allclose(np.asarray(jax.jit(lambda θ, x: D(θ) @ x)(θ, x)), np.asarray(op(θ) @ x),
                                   rtol=1e-12, atol=1e-12)
        got, want = jax.jit(jax.grad(loss(second @ first)))(θ), jax.grad(loss(op.H @ op))(θ)
        np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(want["w"]), rtol=1e-11, atol=1e-11)
        kind = "" if axis_type == AxisType.Auto else r" \(Explicit axes\)"
        with pytest.raises(ValueError, match=r"distributed on the mesh \{'d0': 2, 'd1': 4\} over devices 0-7, applied "
                                             r"under jax.set_mesh of another, \{'a': 2, 'b': 2, 'c': 2\}" + kind + ":"):
            outside(θ) @ x
        model = FNO((8, 8), width=2, modes=(2, 2), layers=1, dtype="float64")
        dist = model.distribute((2, 1, 2, 2))
        a = jnp.asarray(random_array(np.random.default_rng(7), (2, 1, 8, 8), np.float64))
        θm = model.init(jax.random.key(0))
        assert dist.mesh == mesh
        placed = jax.device_put(a, dist.in_sharding)  # as fit places its batches
        assert model.distribute(P("a", None, "b", "c")).partition == P("a", None, "b", "c")
        assert model.distribute(devices=8, batch=2).partition == (2, 1, 2, 2)  # the one the context's axes give
        want = np.asarray(jax.jit(model.apply)(θm, a))
        for got in (dist.apply(θm, a), jax.jit(dist.apply)(θm, placed)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(outside(θ) @ x), np.asarray(op(θ) @ x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_distributed_inside_jit_under_jax_set_mesh(axis_type):
    """`po.distribute` and `FNO.distribute` called as a function jitted under
    `jax.set_mesh` traces (JAX gives them only the context's abstract mesh): planned on
    that shape, the same plan as outside, and run there, forward and differentiated, as
    the serial operator. (parop made a mesh of its own there, and the call was a
    ValueError telling the user to distribute under the context.) Outside a
    `jax.set_mesh` of its shape such an operator is a ValueError."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(axis_type,) * 3)
    op = po.kron(po.DFT(8, "complex128"), po.Matrix(8, 8, "complex128", name="w"))
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(8), (8, 8), np.complex128))
    made = []

    def loss(θ):
        D = po.distribute(op, (2, 2))
        made.append(D)
        return pairing(x, (D.H @ D)(θ) @ x)

    with jax.set_mesh(mesh):
        got = jax.jit(jax.value_and_grad(loss))(θ)
        plan = po.plan(op, (2, 2))
        model = FNO((8, 8), width=2, modes=(2, 2), layers=1, dtype="float64")
        θm, a = model.init(jax.random.key(0)), jnp.asarray(random_array(np.random.default_rng(9), (2, 1, 8, 8),
                                                                         np.float64))
        y = jax.jit(lambda θm, a: model.distribute((2, 1, 2, 2)).apply(θm, a))(θm, a)
    want = jax.value_and_grad(lambda θ: pairing(x, (op.H @ op)(θ) @ x))(θ)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got[1]["w"]), np.asarray(want[1]["w"]), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(model.apply)(θm, a)), rtol=1e-10, atol=1e-12)
    assert made[0].plan == plan and made[0].mesh == mesh.abstract_mesh
    with pytest.raises(ValueError, match=r"planned on an AbstractMesh \(a mesh shape\), which runs only under a "
                                         r"jax.set_mesh of devices of that shape"):
        made[0](θ) @ x


def test_a_mesh_shape_in_context_is_planned_on_and_runs_on_devices_of_that_shape():
    """Under `jax.sharding.use_abstract_mesh(shape)` parop plans on that shape, however
    many devices the machine has (it made a mesh of its own: "16 devices asked for, 8
    available"), the plan that `mesh=shape` gives; the partition search too. Such an
    operator runs under a `jax.set_mesh` of devices of its shape (eagerly or jitted, as
    the serial operator, its input committed there or not), and elsewhere `apply`,
    `FNO.init` and `dry_run` are ValueErrors saying so, with the shapes and axis types
    (they were JAX's errors about lowering platforms)."""
    shape = AbstractMesh((4, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    F = po.kron(po.DFT(8, "complex128"), po.DFT(16, "complex128"), po.Identity(4, "complex128"))
    with jax.sharding.use_abstract_mesh(shape):
        D = po.distribute(F, (4, 4, 1))
        model = FNO((16, 16), width=4, modes=(4, 4), layers=1).distribute(devices=16, batch=4)
        assert D.mesh == shape and model.mesh == shape and model.partition == (4, 1, 4, 1)
        with pytest.raises(ValueError, match=r"^FNO.init: the model is distributed on a mesh shape"):
            model.init(jax.random.key(0))
        with pytest.raises(ValueError, match=r"^dry_run: the model is distributed on a mesh shape"):
            dry_run(model, 4)
    assert D.plan == po.plan(F, (4, 4, 1), mesh=shape)
    small = po.distribute(po.kron(po.DFT(8, "complex128"), po.DFT(8, "complex128")), (2, 4),
                          mesh=AbstractMesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2))
    x = jnp.asarray(random_array(np.random.default_rng(10), (8, 8), np.complex128))
    want = np.fft.fft2(np.asarray(x))
    devices = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(devices):
        # input committed to the context's devices, or made there from NumPy, eagerly (they were JAX's error
        # "is_fully_addressable is not implemented for AbstractMesh")
        committed = jax.device_put(x, NamedSharding(devices, P("b", None)))
        for got in (small @ x, jax.jit(lambda x: small @ x)(x), small @ committed, small @ np.asarray(x)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    for where in (jax.set_mesh(jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)),
                  jax.sharding.use_abstract_mesh(small.mesh), contextlib.nullcontext()):
        with where, pytest.raises(ValueError, match=r"planned on an AbstractMesh \(a mesh shape\), which runs only "
                                                    r"under a jax.set_mesh of devices of that shape"):
            small @ x
    with jax.set_mesh(jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)), pytest.raises(
            ValueError, match=r"of that shape and those axis types \(\{'a': 2, 'b': 4\}, Auto axes; the context's: "
                              r"\{'a': 2, 'b': 4\}, Explicit axes\)"):
        small @ x


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("spec, out", [(P("a", "b"), None), (P("a", "b"), P(None, ("a", "b"))),
                                       (P(None, ("a", "b")), None)])
def test_flat_input_and_the_dense_matrix_whatever_the_output_split(axis_type, spec, out):
    """Flat input `(N,)` and `(N, b)`, forward and adjoint, jitted or not, and
    `po.to_dense`, on Auto and Explicit mesh axes, for outputs split on their first or
    their second axis. (On Explicit axes the flat output of a tensor split along its
    second axis failed inside JAX, whose reshape of such a split is not defined: parop
    now replicates it, as flat input enters replicated.)"""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type, axis_type))
    op = po.kron(po.Matrix(4, 4, "complex128", name="m"), po.DFT(8, "complex128"))
    D = po.distribute(op, spec, mesh=mesh, out_partition=out)
    θ = random_params(op)
    rng = np.random.default_rng(5)
    x, xb = (jnp.asarray(random_array(rng, shape, np.complex128)) for shape in [(32,), (32, 3)])
    for got, want in [(D(θ) @ x, op(θ) @ x), (D(θ) @ xb, op(θ) @ xb), (D.H(θ) @ x, op.H(θ) @ x),
                      (jax.jit(lambda θ, x: D(θ) @ x)(θ, x), op(θ) @ x), (po.to_dense(D, θ), po.to_dense(op, θ))]:
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_explicit_out_partition():
    F = po.kron(po.DFT(16), po.DFT(16), po.DFT(16))
    D = po.distribute(F, (8, 1, 1), out_partition=(1, 1, 8))
    x = jnp.asarray(complex_cube())
    assert D.out_sharding.spec == P(None, None, "d0") and D.plan.collectives()["all_to_all"] == 1
    np.testing.assert_allclose(np.asarray(D @ x), np.fft.fftn(np.asarray(x)), atol=2e-3)


# -- bad input -----------------------------------------------------------------------------

F3 = po.kron(po.DFT(30), po.DFT(20), po.DFT(10, "float32"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(partition=(2, 1)), r"partition \(2, 1\) has 2 entries, but the operator's input has 3 axes"),
    (dict(partition=(4, 4, 1)), r"needs 16 devices, but 8 are available"),
    (dict(partition=(0, 1, 1)), r"partition entry 0 must be a positive int, got 0"),
    (dict(partition=(1, -2, 1)), r"partition entry 1 must be a positive int, got -2"),
    (dict(partition=(4, 1, 1)), r"axis 0 of size 30 cannot be split in 4: use a size divisible by 4 \(28 or 32\), or split it in one of \[1, 2, 3, 5, 6, 10, 15, 30\]"),
    (dict(partition=(2, 1, 1), out_partition=(1, 1, 1)), r"replicates mesh axes that the input splits.*never gathers"),
    (dict(partition=P("x")), "needs mesh="),
    (dict(partition=(2, 1, 1), out_partition="autoo"), r"out_partition must be None, 'auto', a tuple of positive "
                                                       r"ints or a PartitionSpec, got 'autoo'"),
    (dict(partition=(2, 1, 1), out_partition=(1, 0, 2)), r"out_partition entry 1 must be a positive int, got 0"),
    (dict(partition=(2, 1, 1), shard_weights=np.ones(2)), r"shard_weights must be True, False or 'auto', got array"),
])
def test_bad_distribute_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        po.distribute(F3, **kwargs)


def test_a_default_mesh_over_given_devices():
    """`default_mesh` (what `po.distribute` builds from a partition) over the devices given,
    or a clear error where they are too few (`python -m parop` passes its own)."""
    mesh, layout = default_mesh((2, 1, 4), "here", devices=jax.devices()[::-1])
    assert dict(mesh.shape) == {"d0": 2, "d2": 4} and layout == (("d0",), (), ("d2",))
    assert list(mesh.devices.flat) == jax.devices()[::-1]
    with pytest.raises(ValueError, match=r"^here: partition \(2, 2\) needs 4 devices, but 2 are available$"):
        default_mesh((2, 2), "here", devices=jax.devices()[:2])


def test_no_plan_is_a_clear_error():
    # a DFT on the only axis, split 8 ways, and nowhere to move the split
    with pytest.raises(ValueError, match=r"no plan exists for input shape \(8,\).*axis 0 must be whole"):
        po.distribute(po.DFT(8), (8,))
    # a halo wider than a block: the reason, and no word of the channel axis, which is not split
    with pytest.raises(ValueError) as info:
        po.distribute(po.Convolution(2, 1, (7,), (8,), name="c"), (1, 4))
    assert str(info.value) == ("distribute(Conv(2×1×7 'c', periodic)): no plan exists for input shape (1, 8) split as "
                               "P(None, 'd1') on mesh {'d1': 4}: axis 1 of size 8 split in 4 gives blocks of 2, fewer "
                               "than the halo 3 of Conv(2×1×7 'c', periodic) (and the wanted output layout must be "
                               "reachable without gathering)")


def test_bad_apply_input():
    D = po.distribute(F3, (2, 1, 1))
    with pytest.raises(ValueError, match=r"input of shape \(30, 20\) is neither"):
        D @ jnp.ones((30, 20), jnp.float32)
    with pytest.raises(TypeError, match="takes float32 input, got complex64"):
        D @ jnp.ones((30, 20, 10), jnp.complex64)
    with pytest.raises(ValueError, match="names 1 batch axes, but the input of shape"):
        po.distribute(po.Matrix(4, 4, name="m"), (1, 2))(po.init(po.Matrix(4, 4, name="m"), jax.random.key(0))) @ jnp.ones(4, jnp.float32)
    B = po.distribute(po.Matrix(20, 20, name="w"), (1, 4))
    with pytest.raises(ValueError, match=r"input axis 1 of size 10 cannot be split in 4"):
        B(po.init(B, jax.random.key(0))) @ jnp.ones((20, 10), jnp.float32)
    with pytest.raises(ValueError, match=r"parameter 'w'.*missing"):
        B({}) @ jnp.ones((20, 8), jnp.float32)
    with pytest.raises(TypeError, match="kron of a distributed operator"):
        po.kron(D, po.Identity(2))


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_forward_mode_and_second_order_derivatives_are_the_serial_operators(axis_type):
    """JAX's other transformations of a distributed operator's application, jitted: a
    JVP in the input and in the weights, a reverse-mode Jacobian (the pullback under
    `vmap`) and a Hessian-vector product (forward over reverse), against the serial
    operator's, in float64: a complex DFT beside a `Matrix`, and a real DFT after a
    halo-exchanging `Convolution`, each with an axis split."""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(axis_type,) * 3)
    r, c = "float64", "complex128"
    cases = [(po.kron(po.Matrix(4, 8, c), po.DFT(8, c), po.Identity(4, c)), P("a", "b", "c")),
             (po.kron(po.Identity(2, r), po.Identity(8, r), po.DFT(8, r)) @ po.Convolution(2, 2, (3, 3), (8, 8), dtype=r),
              P(None, "a", "b"))]
    for op, spec in cases:
        D = po.distribute(op, spec, mesh=mesh)
        θ = random_params(op)
        rng = np.random.default_rng(5)
        x, dx = (jnp.asarray(random_array(rng, op.domain_shape, op.dtype)) for _ in range(2))
        energy = lambda A: lambda t, v: jnp.sum(jnp.abs(A(t) @ v) ** 2)
        transforms = {
            "jvp in x": lambda A: jax.jvp(lambda v: A(θ) @ v, (x,), (dx,))[1],
            "jvp in θ": lambda A: jax.jvp(lambda t: A(t) @ x, (θ,), (θ,))[1],
            "jacrev": lambda A: jax.jacrev(lambda v: jnp.real(A(θ) @ v))(x),
            "hvp": lambda A: jax.jvp(jax.grad(energy(A), argnums=1), (θ, x), (θ, dx))[1],
        }
        for name, transform in transforms.items():
            got, want = (jax.jit(lambda A=A: transform(A))() for A in (D, op))
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-11,
                                           atol=1e-11 * float(jnp.max(jnp.abs(w))), err_msg=f"{op!r}: {name}")
