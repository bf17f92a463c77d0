"""Operators as JAX values: pytrees under `jit`, `grad`, `vmap`, traced scalars, the
transpose, distributed operators that behave like serial ones.

1. An operator is a pytree with static structure: `jax.jit(lambda A, x: A @ x)(F, x)`
   works, an equal rebuild does not retrace; equality and hash are structural, and
   unnamed parametric leaves are named by the operator they are in (tests/test_names.py).
2. `A(θ)` (a `Bound`) is a pytree whose leaves are θ's arrays: through `jit`, `grad`
   (the gradient is a `Bound`), `vmap` (a batch of weights) and `jax.tree.map`.
3. Traced scalars: `c * A` with `c` a JAX scalar under `jit` and `grad`, `A.H`
   conjugates it, and a distributed program takes it as an input (no recompile).
4. Distributed operators take what serial ones take (unnamed batch axes, flat input,
   `to_dense`, the dot test) and combine (`D2 @ D1`, `D1 + D2`, `2 * D`, `c * D`);
   mixing them with serial operators or `kron` is a `TypeError`; `repr(D)` never plans.
5. `A.T` is the transpose: the dense transpose for complex-linear operators, JAX's
   `linear_transpose` for real-DFT ones, `A.T.T is A`, the bilinear dot test on random
   trees in all four dtypes, and `D.T` for a distributed `D`.

References are NumPy in float64/complex128 (or `reference.dense`, built from NumPy),
never parop's own apply code.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import parop as po
from reference import DTYPES, close_to, dense, random_array, random_params, random_tree

RNG = np.random.default_rng


def fft2_matrix(n: int) -> np.ndarray:
    return np.fft.fft(np.eye(n), axis=0)


# -- 1. operators are pytrees with static structure ------------------------------------------------

def test_jit_takes_an_operator_and_an_equal_rebuild_does_not_retrace():
    """`jax.jit(lambda A, x: A @ x)(F, x)` with a real-to-complex `F` on a (16, 16) tensor and on
    flat input equals NumPy's `fft2`; an equal rebuild of `F` hits the same trace, a
    different operator (another `norm`) traces anew."""
    traces = []

    @jax.jit
    def apply(A, x):
        traces.append(A)
        return A @ x

    F = po.kron(po.DFT(16), po.DFT(16))
    x = jnp.asarray(random_array(RNG(0), (16, 16), np.complex64))
    want = np.fft.fft2(np.asarray(x, np.complex128))
    close_to(apply(F, x), want, 1e-5)
    assert apply(F, x).dtype == np.complex64
    close_to(apply(po.kron(po.DFT(16), po.DFT(16)), x), want, 1e-5)
    close_to(apply(po.kron(po.DFT(16), po.DFT(16)), x), want, 1e-5)
    assert len(traces) == 1  # two equal rebuilds: one trace
    close_to(apply(F, x.reshape(256)), want.reshape(256), 1e-5)  # flat input: a new shape, a new trace
    close_to(apply(po.kron(po.DFT(16), po.DFT(16)), x.reshape(256)), want.reshape(256), 1e-5)
    assert len(traces) == 2
    close_to(apply(po.kron(po.DFT(16, norm="ortho"), po.DFT(16)), x), want / 4, 1e-5)
    assert len(traces) == 3  # a different operator is different static structure
    assert jax.tree.leaves(F) == []  # no arrays: the structure is all static


def test_a_copy_of_an_operator_is_the_operator():
    """Operators are immutable: `copy.copy` and `copy.deepcopy` give the operator itself, so a
    copied distributed operator (equal only to itself: it holds its plans and programs) is
    still equal to it and shares its programs; inside a copied container too."""
    D = po.distribute(po.kron(po.Matrix(8, 8, name="m"), po.DFT(8, dtype=jnp.float32)), (2, 1))
    for op in (D, D.H, po.kron(po.Diagonal(4), po.Identity(2))):
        assert copy.copy(op) is op and copy.deepcopy(op) is op
    held = copy.deepcopy({"model": D, "scale": np.ones(2)})
    assert held["model"] == D and held["model"].programs is D.programs


def _built_twice():
    """Pairs of operators built the same way from the same leaves (names, sizes, dtypes,
    options)."""
    def spectral():
        R = po.Restriction(16, [slice(0, 3), slice(-3, None)], "complex128")
        return (po.kron(po.DFT(16, "complex128").inverse() @ R.H, po.Identity(4, "complex128"))
                @ po.kron(po.Diagonal(6, "complex128", name="d"), po.Matrix(4, 4, "float64", name="w"))
                @ po.kron(R @ po.DFT(16, "complex128"), po.Identity(4, "complex128")))

    return [
        lambda: po.kron(po.DFT(16), po.DFT(16)),
        lambda: po.Matrix(3, 4, name="w"),
        lambda: po.DFT(10, "float32", "ortho"),
        lambda: po.Restriction(8, [0, 2, -1]),
        lambda: po.PerModeMatrix(4, 3, (6, 5), name="pm"),
        lambda: po.Convolution(2, 3, (3,), (8,), "zero", name="conv"),
        lambda: po.Stencil([1.0, -2.0, 1.0], (8,)),
        spectral,
        lambda: 2.5 * spectral() - spectral().H.H,
        lambda: spectral().H,
        lambda: spectral().T,
        lambda: (1 + 1j) * po.DFT(8, "float32"),
    ]


@pytest.mark.parametrize("i", range(len(_built_twice())))
def test_operators_built_the_same_way_are_equal_and_hash_alike(i):
    build = _built_twice()[i]
    a, b = build(), build()
    assert a is not b and a == b and hash(a) == hash(b)
    assert {a: "found"}[b] == "found"
    assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("a, b", [
    (lambda: po.Matrix(3, 3, name="a"), lambda: po.Matrix(3, 3, name="b")),  # names
    (lambda: po.Diagonal(4, name="a"), lambda: po.Diagonal(4, name="b")),
    (lambda: po.kron(po.Matrix(3, 3, name="a"), po.DFT(4)), lambda: po.kron(po.Matrix(3, 3, name="b"), po.DFT(4))),
    (lambda: po.DFT(16), lambda: po.DFT(8)),  # sizes
    (lambda: po.Matrix(3, 4, name="w"), lambda: po.Matrix(4, 3, name="w")),
    (lambda: po.DFT(8), lambda: po.DFT(8, "complex128")),  # dtypes
    (lambda: po.Identity(8), lambda: po.Identity(8, "float64")),
    (lambda: po.DFT(8), lambda: po.DFT(8, norm="ortho")),  # options
    (lambda: po.Restriction(8, [0, 1]), lambda: po.Restriction(8, [0, 2])),
    (lambda: po.Convolution(1, 1, (3,), (8,), "zero", name="c"),
     lambda: po.Convolution(1, 1, (3,), (8,), "periodic", name="c")),
    (lambda: 2.0 * po.DFT(8), lambda: 3.0 * po.DFT(8)),  # scalars
    (lambda: po.DFT(8), lambda: po.DFT(8).H),
    (lambda: po.DFT(8) @ po.DFT(8).H, lambda: po.DFT(8).H @ po.DFT(8)),  # order
])
def test_different_leaves_make_different_operators(a, b):
    assert a() != b()
    assert len({a(), b()}) == 2


def test_unnamed_parametric_leaves_are_named_by_the_operator_they_are_in():
    """Two `po.Matrix(3, 3)` are equal operators (each alone is `Matrix_0`), and two
    weights of `a @ b`: two names, two entries of θ (tests/test_names.py has the rest)."""
    a, b = po.Matrix(3, 3), po.Matrix(3, 3)
    assert a == b and a.name is None and list(a.parameters) == list(b.parameters) == ["Matrix_0"]
    assert set(po.init(a @ b, jax.random.key(0))) == {"Matrix_0", "Matrix_1"} and a @ b != a @ a
    d, e = po.Diagonal(3), po.Diagonal(3)
    assert d == e and sorted((d @ e).parameters) == ["Diagonal_0", "Diagonal_1"]
    assert po.Identity(3) == po.Identity(3)  # no parameter: nothing to name


# -- 2. A(θ) is a pytree of θ's arrays ---------------------------------------------------------------

def _weighted():
    """`kron(M, diag(d))` on (4, 5) in float64, its parameters and an input, plus NumPy
    for its action."""
    A = po.kron(po.Matrix(3, 4, "float64", name="m"), po.Diagonal(5, "float64", name="d"))
    θ = random_params(A, 1)
    x = random_array(RNG(2), (4, 5), np.float64)
    return A, θ, x


def np_apply(θ, x):
    return np.einsum("ik,j,kj->ij", np.asarray(θ["m"]), np.asarray(θ["d"]), x)


def test_a_bound_operator_is_a_pytree_of_the_weights():
    A, θ, x = _weighted()
    B = A(θ)
    leaves = jax.tree.leaves(B)
    assert len(leaves) == 2 and {id(v) for v in leaves} == {id(v) for v in θ.values()}
    rebuilt = jax.tree.unflatten(jax.tree.structure(B), leaves)
    assert isinstance(rebuilt, po.Bound) and rebuilt.operator == A and rebuilt.params == θ
    doubled = jax.tree.map(lambda w: 2 * w, B)
    assert isinstance(doubled, po.Bound) and doubled.operator == A
    close_to(doubled @ x, 4 * np_apply(θ, x))  # both factors doubled
    close_to(jax.jit(lambda B, x: B @ x)(B, x), np_apply(θ, x))
    close_to(jax.jit(lambda B, y: B.H @ y)(B, np_apply(θ, x)),
          np.einsum("ik,j,ij->kj", np.asarray(θ["m"]), np.asarray(θ["d"]), np_apply(θ, x)))


def test_the_gradient_of_a_bound_operator_is_a_bound_of_the_weight_gradients():
    """`jax.grad` of `0.5 |B @ x - t|²` in `B = A(θ)`: a `Bound` of the same structure
    whose leaves are the analytic gradients `r (d x)ᵀ` and `Σ r ⊙ (M x)`."""
    A, θ, x = _weighted()
    t = random_array(RNG(3), (3, 5), np.float64)
    g = jax.grad(lambda B: 0.5 * jnp.sum((B @ x - t) ** 2))(A(θ))
    assert isinstance(g, po.Bound) and g.operator == A
    assert jax.tree.structure(g) == jax.tree.structure(A(θ))
    M, d = np.asarray(θ["m"]), np.asarray(θ["d"])
    r = np_apply(θ, x) - t
    close_to(g.params["m"], np.einsum("ij,j,kj->ik", r, d, x))
    close_to(g.params["d"], np.einsum("ij,ik,kj->j", r, M, x))


def test_vmap_over_a_batch_of_weights():
    A, θ, x = _weighted()
    θs = [random_params(A, s) for s in (4, 5, 6)]
    batch = jax.tree.map(lambda *w: jnp.stack(w), *θs)
    y = jax.vmap(lambda B: B @ x)(A(batch))
    assert y.shape == (3, 3, 5)
    for k, θk in enumerate(θs):
        close_to(y[k], np_apply(θk, x))
    y = jax.jit(jax.vmap(lambda B, x: B @ x, in_axes=(0, None)))(A(batch), x)
    close_to(y[1], np_apply(θs[1], x))


# -- 3. traced scalars ---------------------------------------------------------------------------------

REAL_A = po.kron(po.Matrix(3, 4, "float64", name="m"), po.Diagonal(5, "float64", name="d"))


@pytest.mark.parametrize("make_c", [lambda v: jnp.float64(v), lambda v: jnp.asarray(v, jnp.float64),
                                    lambda v: jnp.asarray(v)], ids=["scalar", "0-d array", "weak 0-d array"])
def test_a_traced_scalar_under_jit_does_not_retrace_per_value(make_c):
    A, θ, x = REAL_A, random_params(REAL_A, 1), random_array(RNG(2), (4, 5), np.float64)
    traces = []

    @jax.jit
    def apply(c, θ, x):
        traces.append(c)
        return (c * A)(θ) @ x

    for v in (2.5, -0.75, 4.0):
        close_to(apply(make_c(v), θ, x), v * np_apply(θ, x))
    assert len(traces) == 1
    S = make_c(2.5) * A
    assert jax.tree.leaves(S) == [S.c] and isinstance(S.c, jax.Array)
    assert len(jax.tree.leaves(S(θ))) == 3  # the scalar and the two weights


def test_the_gradient_in_a_traced_scalar():
    """d/dc of `Σ sin((c A)(θ) @ x)`: analytic `Σ y cos(c y)`, central finite differences
    in float64, and through `jit`; and the gradient with respect to the operator itself
    is an operator-shaped pytree whose leaf is that derivative."""
    A, θ, x = REAL_A, random_params(REAL_A, 1), random_array(RNG(2), (4, 5), np.float64)
    y = np_apply(θ, x)
    f = lambda c: jnp.sum(jnp.sin((c * A)(θ) @ x))  # noqa: E731
    c = jnp.float64(0.7)
    analytic = float(np.sum(y * np.cos(0.7 * y)))
    h = 1e-6
    fd = (float(f(jnp.float64(0.7 + h))) - float(f(jnp.float64(0.7 - h)))) / (2 * h)
    assert abs(float(jax.grad(f)(c)) - analytic) < 1e-12 * max(1, abs(analytic))
    assert abs(float(jax.jit(jax.grad(f))(c)) - analytic) < 1e-12 * max(1, abs(analytic))
    assert abs(fd - analytic) < 1e-6 * max(1, abs(analytic))
    g = jax.grad(lambda S: jnp.sum(jnp.sin(S(θ) @ x)))(c * A)
    assert isinstance(g, po.Scale) and g.op == A
    assert abs(float(g.c) - analytic) < 1e-12 * max(1, abs(analytic))


def test_a_complex_traced_scalar_is_conjugated_by_the_adjoint():
    """`(c * F).H @ y == conj(c) · n · ifft(y)` for a complex `c`, under `jit`; the dot
    test holds; and for a real DFT the adjoint is `Re(Mᴴ conj(c) y)` with the real
    inner product."""
    F = po.DFT(8, "complex128")
    y = random_array(RNG(4), (8,), np.complex128)
    for c in (jnp.complex128(1 + 2j), jnp.asarray(-0.5 + 0.25j, jnp.complex128)):
        want = np.conj(complex(c)) * 8 * np.fft.ifft(y)
        close_to((c * F).H @ y, want)
        close_to(jax.jit(lambda c, y: (c * F).H @ y)(c, y), want)
        assert po.testing.dot_test(c * F) < 1e-14
    rF = po.DFT(8, "float64")
    M = np.fft.rfft(np.eye(8), axis=0)
    z = random_array(RNG(5), (5,), np.complex128)
    c = jnp.complex128(0.3 - 1.1j)
    S = c * rF
    assert (S.dtype, S.range_dtype) == (np.float64, np.complex128)
    assert (S.H.dtype, S.H.range_dtype) == (np.complex128, np.float64)
    close_to(jax.jit(lambda c, z: (c * rF).H @ z)(c, z), (M.conj().T @ (np.conj(complex(c)) * z)).real)
    assert po.testing.dot_test(S) < 1e-14


def test_a_distributed_program_takes_the_scalar_as_an_input():
    """`D = po.distribute(c * A, p)` with a new value of `c` (the same operator structure,
    `jax.tree.map` on `D`) runs the same compiled program (the jitted call's cache does
    not grow) and gives the new answer; so does `jax.jit` over `D`, and `jax.grad` in
    `D`'s scalar equals the serial one."""
    A = po.kron(po.DFT(8, "complex128"), po.Matrix(4, 4, "float64", name="m"))
    θ = random_params(A, 7)
    x = random_array(RNG(8), (8, 4), np.complex128)
    ref = np.fft.fft(np.einsum("ik,jk->ji", np.asarray(θ["m"]), x), axis=0)  # DFT on axis 0, M on axis 1
    D = po.distribute(jnp.asarray(2.0) * A, (2, 1))
    close_to(D(θ) @ x, 2.0 * ref)
    call = D.programs.calls[False]
    compiled = call._cache_size()
    for v in (3.0, -1.5):
        Dv = jax.tree.map(lambda _: jnp.asarray(v), D)
        assert isinstance(Dv, po.DistributedOperator) and Dv.programs is D.programs
        close_to(Dv(θ) @ x, v * ref)
    assert call._cache_size() == compiled
    traces = []

    @jax.jit
    def step(D, x):
        traces.append(D)
        return D(θ) @ x

    for v in (0.5, 4.0):
        close_to(step(jax.tree.map(lambda _: jnp.asarray(v), D), x), v * ref)
    assert len(traces) == 1
    t = jnp.asarray(random_array(RNG(9), (8, 4), np.complex128))
    loss = lambda S: jnp.sum(jnp.abs(S(θ) @ x - t) ** 2)  # noqa: E731
    g, g_serial = jax.grad(loss)(D), jax.grad(loss)(jnp.asarray(2.0) * A)
    assert isinstance(g, po.DistributedOperator)
    close_to(jax.tree.leaves(g)[0], jax.tree.leaves(g_serial)[0])
    r = 2.0 * ref - np.asarray(t)  # d/dc |c y - t|² = 2 Re <y, c y - t>
    close_to(jax.tree.leaves(g)[0], 2 * np.real(np.vdot(ref, r)))


# -- 4. distributed operators take what serial ones take ---------------------------------------------

def _spectral_mix():
    """(8, 4) -> (8, 4): a DFT on axis 0, a trainable matrix on axis 1 (complex128)."""
    return po.kron(po.DFT(8, "complex128"), po.Matrix(4, 4, "complex128", name="w"))


def test_distributed_input_like_serial_input():
    """A trailing batch axis the partition does not name (replicated, planned once per
    batch shape), flat `(N,)` and `(N, b)` input; `to_dense(D) == to_dense(op)`; the dot
    test."""
    op = _spectral_mix()
    θ = random_params(op, 3)
    D = po.distribute(op, (2, 1))
    assert not D.programs.kept and D.batch_shape == () and D.plan.shape == (8, 4)
    x = random_array(RNG(10), (8, 4, 3), np.complex128)
    W = np.asarray(θ["w"])
    want = np.fft.fft(np.einsum("ik,jkb->jib", W, x), axis=0)
    y = D(θ) @ x
    close_to(y, want)
    assert y.sharding.is_equivalent_to(NamedSharding(D.mesh, P("d0", None, None)), 3)  # batch: replicated
    close_to(D(θ) @ x, want)
    close_to(D(θ) @ x[..., :2], want[..., :2])
    assert list(D.programs.kept) == [((), False), ((3,), False), ((2,), False)]  # once per batch shape
    close_to(D(θ) @ x[..., 0].reshape(32), want[..., 0].reshape(32))  # flat (N,)
    close_to(D(θ) @ x.reshape(32, 3), want.reshape(32, 3))  # flat (N, b)
    dense_d = np.asarray(po.to_dense(D, θ))
    close_to(dense_d, po.to_dense(op, θ))
    close_to(dense_d, np.kron(fft2_matrix(8), W))
    assert po.testing.dot_test(D, θ) < 1e-14


def test_combinations_of_distributed_operators_equal_their_serial_counterparts():
    """`D2 @ D1` in one `jit` (D1 hands `D1.out_sharding` to D2: no collective beyond
    their plans'), `D1 + D2`, `2 * D`, `c * D` with a traced `c`."""
    op1 = po.kron(po.DFT(8, "complex128"), po.Identity(4, "complex128"))
    op2 = po.kron(po.Identity(8, "complex128"), po.DFT(4, "complex128"))
    D1, D2 = po.distribute(op1, (2, 1)), po.distribute(op2, (2, 1))
    assert D1.out_sharding == D2.in_sharding
    x = jnp.asarray(random_array(RNG(11), (8, 4), np.complex128))
    xs = np.asarray(x)
    run = jax.jit(lambda x: (D2 @ D1) @ x)
    y = run(x)
    close_to(y, np.fft.fft2(xs))
    close_to(y, (op2 @ op1) @ x)
    assert y.sharding.is_equivalent_to(D2.out_sharding, 2)
    text = run.lower(x).compile().as_text()
    planned = D1.plan.collectives()["all_to_all"] + D2.plan.collectives()["all_to_all"]
    assert text.count("all-to-all(") == planned
    assert text.count("all-gather(") == 0 and text.count("collective-permute(") == 0
    close_to((D1 + D2) @ x, np.fft.fft(xs, axis=0) + np.fft.fft(xs, axis=1))
    close_to((D1 + D2) @ x, (op1 + op2) @ x)
    close_to((2 * D1) @ x, 2 * np.fft.fft(xs, axis=0))
    close_to((D1 - D2) @ x, (op1 - op2) @ x)
    scaled = jax.jit(lambda c, x: (c * D1) @ x)
    for c in (1.5 - 0.5j, -2.0 + 1j):
        close_to(scaled(jnp.complex128(c), x), c * np.fft.fft(xs, axis=0))
        close_to(scaled(jnp.complex128(c), x), (jnp.complex128(c) * op1) @ x)
    assert (2 * D1).distributed and (D1 + D2).distributed and (D2 @ D1).distributed


def test_distributed_operators_laid_out_differently_hand_over_by_planned_moves():
    """Where one program leaves its output, or a sum takes its input, in another layout
    than the next program wants on the same mesh, a planned repartition moves it (an
    identity distributed from one layout to the other): the compiled step holds exactly
    the plans' collectives and bytes. Left to XLA, the `+` of two outputs laid out
    differently gathered whole arrays (`D1 + D2` below: two all-gathers, 16,448 bytes
    sent per device, where the plans and their moves send 9,984). Values and gradients
    are the serial operator's. A move where the two mesh axes trade places (4 x 8 between
    `P('a', 'b')` and `P(None, ('a', 'b'))`, where axis 0 cannot hold both), once left to
    XLA, is planned too: a `ppermute` and an `all_to_all`, on Auto and on Explicit mesh
    axes."""
    from parop.distributed.hlo import collectives

    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    op1 = po.kron(po.DFT(16, "complex128"), po.Matrix(16, 16, "complex128", name="w"))
    op2 = po.kron(po.Matrix(16, 16, "complex128", name="v"), po.DFT(16, "complex128"))
    D1 = po.distribute(op1, P("a", "b"), mesh=mesh)
    D2 = po.distribute(op2, P(None, ("a", "b")), mesh=mesh)
    assert D1.out_sharding.spec != D2.in_sharding.spec and D2.out_sharding.spec != D1.out_sharding.spec
    θ = {**random_params(op1, 1), **random_params(op2, 2)}
    x = jnp.asarray(random_array(RNG(12), (16, 16), np.complex128))

    def moved(source, target) -> tuple[int, float]:  # the planned move's all_to_alls and bytes, forward
        identity = po.kron(po.Identity(16, "complex128"), po.Identity(16, "complex128"))
        plan = po.plan(identity, source.spec, mesh=mesh, out_partition=target.spec)
        return plan.collectives()["all_to_all"], plan.bytes

    plans = [(p.collectives()["all_to_all"], p.bytes) for p in (D1.plan, D2.plan)]
    for D, op, moves in [
        (D1 + D2, op1 + op2, [moved(D1.in_sharding, D2.in_sharding), moved(D2.out_sharding, D1.out_sharding)]),
        (D2 @ D1, op2 @ op1, [moved(D1.out_sharding, D2.in_sharding)]),
        (2 * (D1 - 3j * D2), 2 * (op1 - 3j * op2),
         [moved(D1.in_sharding, D2.in_sharding), moved(D2.out_sharding, D1.out_sharding)]),
    ]:
        run = jax.jit(lambda θ, x: D(θ) @ x)
        close_to(run(θ, x), op(θ) @ x)
        close_to(po.to_dense(D, θ), dense(op, θ))  # the independent dense reference, complex128
        assert po.testing.dot_test(D, θ) < 1e-13, D
        found = collectives(run.lower(θ, x).compile().as_text())
        assert found["counts"]["all-to-all"] == sum(n for n, _ in plans + moves), (D, found["counts"])
        assert found["counts"]["all-gather"] == found["counts"]["collective-permute"] == 0, (D, found["counts"])
        assert found["sent_bytes"] == sum(b for _, b in plans + moves), D
        loss = lambda θ, op: jnp.sum(jnp.abs(op(θ) @ x) ** 2)
        grads, want = jax.jit(jax.grad(loss), static_argnums=1)(θ, D), jax.grad(loss)(θ, op)
        for name in want:
            close_to(grads[name], want[name])
    # the move between (4, 8) laid out as P('a', 'b') and as P(None, ('a', 'b')), either way: a planned
    # ppermute that deals the blocks anew, then an all_to_all
    op = po.kron(po.Matrix(4, 4, "complex128", name="m"), po.DFT(8, "complex128"))
    θ, x = random_params(op, 3), jnp.asarray(random_array(RNG(13), (4, 8), np.complex128))
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        on = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type,) * 2)
        D = po.distribute(op, P("a", "b"), mesh=on, out_partition=P(None, ("a", "b")))
        run = jax.jit(lambda θ, x: (D + D.H)(θ) @ x)
        close_to(run(θ, x), (op + op.H)(θ) @ x)
        close_to((D + D.H)(θ) @ x, (op + op.H)(θ) @ x)
        identity = po.kron(po.Identity(4, "complex128"), po.Identity(8, "complex128"))
        moves = [po.plan(identity, a, mesh=on, out_partition=b) for a, b in [(P("a", "b"), P(None, ("a", "b"))),
                                                                            (P(None, ("a", "b")), P("a", "b"))]]
        plans = [D.plan, D.H.plan] + moves
        assert [m.collectives()["ppermute"] for m in moves] == [1, 1]
        found = collectives(run.lower(θ, x).compile().as_text())
        for kind, name in [("all-to-all", "all_to_all"), ("all-gather", "all_gather"), ("all-reduce", "psum"),
                           ("collective-permute", "ppermute")]:
            assert found["counts"][kind] == sum(p.collectives()[name] for p in plans), found
        assert found["sent_bytes"] == sum(p.bytes for p in plans), found


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit])
def test_a_move_that_gathers_between_two_programs(axis_type):
    """Where the next program takes replicated what the last left split (a gather, which
    no plan makes), XLA moves it on Auto axes, and parop reshards it on Explicit ones,
    where JAX refuses the `+` of two layouts (a `ShardingTypeError`, found by the
    combination property test on Explicit meshes). Values and gradients as the serial
    operators'."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type,) * 2)
    op1 = po.kron(po.Identity(8, "float64"), po.Matrix(4, 4, "float64", name="u"))
    op2 = po.kron(po.Diagonal(8, "float64", name="g"), po.Matrix(4, 4, "float64", name="v"))
    D1 = po.distribute(op1, P("a", None), mesh=mesh)  # each leaves its output where it takes its input
    D2 = po.distribute(op2, P("b", None), mesh=mesh)
    θ = {**random_params(op1, 5), **random_params(op2, 6)}
    x = jnp.asarray(random_array(RNG(15), (8, 4), np.float64))
    for D, op in [(D1 + D2, op1 + op2), (D2 - 2 * D1, op2 - 2 * op1), (D2 @ D1, op2 @ op1), (D1 @ D2, op1 @ op2)]:
        close_to(D(θ) @ x, op(θ) @ x)
        close_to(jax.jit(lambda θ, x: D(θ) @ x)(θ, x), op(θ) @ x)
        loss = lambda θ, op: jnp.sum((op(θ) @ x) ** 2)
        grads, want = jax.jit(jax.grad(loss), static_argnums=1)(θ, D), jax.grad(loss)(θ, op)
        for name in want:
            close_to(grads[name], want[name])


def test_a_combination_runs_on_one_mesh():
    """Operators distributed on two meshes (over the same devices, other devices, or a
    mesh shape) do not combine: a `ValueError` naming both meshes when the combination is
    built. (JAX compiles one jitted computation for one mesh: the jit and the gradient of
    `D2 @ D1` below failed inside JAX with an `IndivisibleError`, where the eager product
    ran.) Distributed on one mesh, a `PartitionSpec` giving one tensor axis both mesh
    axes, the same product is the serial one, jitted and differentiated."""
    from jax.sharding import AbstractMesh, AxisType, Mesh

    op = po.kron(po.Matrix(4, 4, "float64", name="a"), po.Matrix(8, 8, "float64", name="b"))
    D1 = po.distribute(op, (2, 4))
    devices = np.array(jax.devices())
    elsewhere = [
        (po.distribute(op, (1, 8)), r"\{'d1': 8\} over devices 0-7"),
        (po.distribute(op, P(None, "c"), mesh=Mesh(devices[4:], ("c",))), r"\{'c': 4\} over devices 4-7"),
        (po.distribute(op, P(None, "d1"), mesh=Mesh(devices[[0, 2, 4, 6]], ("d1",))),
         r"\{'d1': 4\} over devices 0, 2, 4, 6"),
        (po.distribute(op, (2, 4), mesh=AbstractMesh((2, 4), ("d0", "d1"), axis_types=(AxisType.Auto,) * 2)),
         r"\{'d0': 2, 'd1': 4\}( and|\))"),
    ]
    for D2, named in elsewhere:
        for combine, where in [(lambda: D2 @ D1, "@"), (lambda: D1 + D2, r"\+"), (lambda: D1 - 2 * D2.H, r"\+"),
                               (lambda: (D1 + D1) @ D2, "@")]:
            with pytest.raises(ValueError, match=rf"^{where} of operators distributed on different meshes "
                                                 rf"(?=.*{{'d0': 2, 'd1': 4}} over devices 0-7)(?=.*{named}).*mesh=D.mesh"):
                combine()
    D2 = po.distribute(op, P(None, ("d0", "d1")), mesh=D1.mesh)
    θ, x = random_params(op, 4), jnp.asarray(random_array(RNG(14), (4, 8), np.float64))
    close_to(jax.jit(lambda θ, x: (D2 @ D1)(θ) @ x)(θ, x), (op @ op)(θ) @ x)
    loss = lambda θ, op: jnp.sum(((op @ op + op)(θ) @ x) ** 2)
    grads, want = jax.jit(jax.grad(loss), static_argnums=1)(θ, D1), jax.grad(loss)(θ, op)
    grads_mixed = jax.grad(lambda θ: jnp.sum(((D2 @ D1 + D2)(θ) @ x) ** 2))(θ)
    for name in want:
        close_to(grads[name], want[name])
        close_to(grads_mixed[name], want[name])


def test_a_distributed_operator_inverts_from_its_output_layout_back_to_its_input_layout():
    """`D.inverse()` distributes the inverse of `D`'s operator on `D`'s mesh, from `D`'s
    output layout to its input layout (so `D.inverse() @ D` moves nothing between the
    two programs); so do `D.H`, `c * D` and products of them. An operator without an
    inverse is a `TypeError` naming the leaf."""
    F = po.kron(po.DFT(8, "complex128"), po.DFT(8, "complex128", norm="ortho"))
    D = po.distribute(F, (2, 4), out_partition=(1, 8))
    E = D.inverse()
    assert E.distributed and E.in_sharding == D.out_sharding and E.out_sharding == D.in_sharding
    assert D.in_sharding.spec != D.out_sharding.spec
    x = jnp.asarray(random_array(RNG(14), (8, 8, 3), np.complex128))
    for A, B in [(E, D), (D, E), (D.H.inverse(), D.H), ((2j * D).inverse(), 2j * D), ((D.H @ D).inverse(), D.H @ D)]:
        close_to(A @ (B @ x), x)
    close_to(po.to_dense(E), np.linalg.inv(np.asarray(po.to_dense(F))))
    with pytest.raises(TypeError, match=r"^Matrix\(4×4 'w'\) has no inverse in parop$"):
        po.distribute(po.kron(po.DFT(8), po.Matrix(4, 4, name="w")), (2, 1)).inverse()


def test_mixing_distributed_and_serial_is_a_type_error_when_built():
    op = po.kron(po.DFT(8), po.Identity(4, "complex64"))
    D = po.distribute(op, (2, 1))
    with pytest.raises(TypeError, match=r"^kron of a distributed operator \(distribute\(DFT\(8\) ⊗ I\(4\), "
                                        r"P\('d0', None\)\), I\(2\)\): .*po.distribute\(po.kron\(A, B\), \.\.\.\)$"):
        po.kron(D, po.Identity(2))
    with pytest.raises(TypeError, match="kron of a distributed operator"):
        po.kron(po.Identity(2), D)
    for build, sign in [(lambda: D @ op, "@"), (lambda: op @ D, "@"), (lambda: D + op, r"\+"), (lambda: op + D, r"\+"),
                        (lambda: D - op, r"\+")]:
        with pytest.raises(TypeError, match=rf"^{sign} of a distributed and a serial operator .*distribute the "
                                            "serial one too"):
            build()


def test_repr_never_plans_and_never_raises():
    """For a partition that names a batch axis, `repr`, `str`, the HTML and `po.tree`
    leave `D.programs` empty; and a `D` with every weight sharded
    where no tensor-parallel form fits is refused when it is made."""
    D = po.distribute(po.kron(po.Matrix(4, 4, name="w"), po.Identity(8)), (1, 2, 2))
    shown = [repr(D), str(D), D._repr_html_(), po.tree(D), repr(D.H), repr(D.T), repr(2 * D + D), repr(D(None))]
    assert shown[0] == "distribute(Matrix(4×4 'w') ⊗ I(8), P(None, 'd1', 'd2'))"
    assert repr(D.H) == shown[0] + ".H"
    assert not D.programs.kept
    with pytest.raises(ValueError, match="no plan exists with shard_weights=True"):  # said at once
        po.distribute(po.kron(po.Matrix(4, 4, name="q"), po.Identity(8)), (1, 8, 1), shard_weights=True)


# -- 5. the transpose -------------------------------------------------------------------------------------

def test_transpose_is_the_dense_transpose_of_complex_linear_operators():
    for seed in range(4):
        rng = RNG(200 + seed)
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3))))
        A = random_tree(rng, shape, "complex128", depth=2)
        θ = random_params(A, seed)
        M = np.asarray(dense(A, θ))
        close_to(po.to_dense(A.T, θ), M.T)
        close_to(po.to_dense(A.T.H, θ), M.conj())  # (A.T).H is the elementwise conjugate
        assert A.T.T is A and A.T.shape == A.shape[::-1]
        assert (A.T.dtype, A.T.range_dtype) == (A.range_dtype, A.dtype)
    c = jnp.complex128(0.5 + 2j)
    close_to(po.to_dense((c * po.DFT(6, "complex128")).T), complex(c) * fft2_matrix(6).T)


REAL_DFTS = {
    "rDFT": lambda: po.DFT(8, "float64"),
    "rDFT.H": lambda: po.DFT(8, "float64").H,
    "irDFT": lambda: po.DFT(8, "float64").inverse(),
    "2j·rDFT": lambda: 2j * po.DFT(8, "float64"),
    "kron": lambda: po.kron(po.DFT(6, "complex128"), po.DFT(8, "float64", "ortho")),
    "(F + 1j F).H": lambda: (po.DFT(8, "float64") + 1j * po.DFT(8, "float64")).H,
    "traced c": lambda: jnp.complex128(1 - 3j) * po.DFT(8, "float64"),
}


@pytest.mark.parametrize("name", sorted(REAL_DFTS))
def test_transpose_of_real_dft_operators_is_jax_linear_transpose(name):
    """For a real-linear operator `A.T @ y` is what `jax.linear_transpose` gives, of
    parop's own map and of a NumPy dense reference map (`x -> M x` for a real domain,
    `y -> Re(M y)` for a real range)."""
    A = REAL_DFTS[name]()
    x = jnp.asarray(random_array(RNG(12), A.domain_shape, A.dtype))
    y = jnp.asarray(random_array(RNG(13), A.range_shape, A.range_dtype))
    got = A.T @ y
    (by_jax,) = jax.linear_transpose(lambda v: A @ v, x)(y)
    M = jnp.asarray(dense(A))

    def reference(v):
        out = (M @ v.reshape(-1).astype(jnp.complex128)).reshape(A.range_shape)
        return out if jnp.iscomplexobj(y) else out.real

    (by_dense,) = jax.linear_transpose(reference, x)(y)
    assert got.dtype == by_jax.dtype == A.dtype and got.shape == A.domain_shape
    close_to(got, by_jax)
    close_to(got, by_dense)
    assert A.T.T is A
    close_to(jax.jit(lambda A, y: A.T @ y)(A, y), by_jax)


@pytest.mark.parametrize("seed", range(16))
def test_the_transpose_dot_test_on_random_trees(seed):
    """`sum(A x * y) == sum(x * A.T y)` (the bilinear pairing, real parts where the
    domain or range is real) for random trees in all four dtypes, real trees with
    complex scalars included: to 100 ulps of the sums of the terms' magnitudes."""
    rng = RNG(300 + seed)
    dtype = DTYPES[seed % 4]
    shape = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    A = random_tree(rng, shape, dtype, depth=3)
    θ = random_params(A, seed)
    x = jnp.asarray(random_array(rng, A.domain_shape, A.dtype))
    y = jnp.asarray(random_array(rng, A.range_shape, A.range_dtype))
    lhs, rhs, lhs_size, rhs_size = (complex(v) for v in _pairings(A, θ, x, y))
    if not (np.issubdtype(A.dtype, np.complexfloating) and np.issubdtype(A.range_dtype, np.complexfloating)):
        lhs, rhs = lhs.real, rhs.real
    eps = float(np.finfo(dtype).eps)
    assert abs(lhs - rhs) <= 100 * eps * max(lhs_size.real, rhs_size.real), (A, lhs, rhs)
    assert A.T.T is A


@jax.jit
def _pairings(A, θ, x, y):
    """`sum(A x * y)`, `sum(x * A.T y)` and the sums of their terms' magnitudes, summed in
    float64."""
    wide = lambda a: a.astype(np.promote_types(a.dtype, np.float64))  # noqa: E731
    ax, aty, x, y = wide(A(θ) @ x), wide(A.T(θ) @ y), wide(x), wide(y)
    return (jnp.sum(ax * y), jnp.sum(x * aty), jnp.sum(jnp.abs(ax) * jnp.abs(y)),
            jnp.sum(jnp.abs(x) * jnp.abs(aty)))


def test_distributed_transpose():
    """`D.T @ y == A.T @ y == M.T y` for a distributed complex operator and a real-DFT
    one; `D.T.T is D`; the plan of `D.T` is `D.H`'s (no new plan)."""
    A = _spectral_mix()
    θ = random_params(A, 5)
    D = po.distribute(A, (2, 2))
    y = random_array(RNG(14), (8, 4), np.complex128)
    want = np.kron(fft2_matrix(8), np.asarray(θ["w"])).T @ y.reshape(32)
    close_to(D.T(θ) @ y, want.reshape(8, 4))
    close_to(D.T(θ) @ y, A.T(θ) @ y)
    assert D.T.T is D and D.T.distributed
    assert set(D.programs.kept) == {((), False), ((), True)}
    R = po.kron(po.DFT(8, "complex128"), po.DFT(8, "float64"))
    DR = po.distribute(R, (2, 1))
    z = jnp.asarray(random_array(RNG(15), R.range_shape, np.complex128))
    x = jnp.zeros(R.domain_shape, np.float64)
    (by_jax,) = jax.linear_transpose(lambda v: R @ v, x)(z)
    close_to(DR.T @ z, by_jax)
    assert (DR.T @ z).dtype == np.float64
