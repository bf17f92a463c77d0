"""`Convolution` and `Stencil` against NumPy dense references (`reference._dense`, built
from index loops), in four dtypes and both boundaries; the interface the distributed
version builds on (`halo`, `extend`, `_valid`); naming, dtype rules and bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from parop.operators.base import Role
from reference import DTYPES, apply_dense, dense, pairing, random_array, random_params, tol

BOUNDARIES = ["periodic", "zero"]
REAL, COMPLEX = DTYPES[:2], DTYPES[2:]


def leaves(dtype, boundary):
    """Convolutions and stencils in 1-D to 4-D with kernel sizes 1, 3 and 5."""
    rng = np.random.default_rng(0)
    out = [
        po.Convolution(2, 3, (3,), (5,), boundary, dtype, name="w"),
        po.Convolution(1, 1, (5,), (2,), boundary, dtype, name="w"),  # a scalar per tap, wider than the grid
        po.Convolution(3, 2, (3, 1), (4, 3), boundary, dtype, name="w"),
        po.Convolution(2, 2, (3, 5, 1), (3, 4, 2), boundary, dtype, name="w"),
        # a scalar per tap in 4-D: more taps than shifted slices sum (`SHIFTED_TAPS`), one convolution
        po.Convolution(1, 1, (3, 3, 3, 3), (2, 3, 2, 2), boundary, dtype, name="w"),
        po.Stencil([1, -2, 1], (6,), boundary, dtype),
        po.Stencil(rng.standard_normal(5), (4,), boundary, dtype),
        po.Stencil(rng.standard_normal((3, 3)), (4, 5), boundary, dtype),
        po.Stencil(rng.standard_normal((3, 1, 3)), (3, 2, 4), boundary, dtype),
    ]
    if np.issubdtype(dtype, np.complexfloating):
        out.append(po.Stencil(random_array(rng, (3, 5), dtype), (4, 3), boundary, dtype))
    return out


# Each leaf in a real and a complex dtype, one with each boundary; all four dtypes
# among them (the complex-weighted stencil in both complex dtypes).
CASES = [case for i in range(9) for case in (
    (REAL[i % 2], BOUNDARIES[i % 2], i), (COMPLEX[i // 2 % 2], BOUNDARIES[1 - i % 2], i))
] + [("complex64", "periodic", 9), ("complex128", "zero", 9)]


def check(op: po.Operator, θ, batch=(2, 3), rtol=1.0) -> None:
    """The checks of `test_operators`' leaf tests, in one compiled program (eagerly,
    each small op would compile on its own, ten times slower): `op`'s dense matrix and
    its adjoint's vs the NumPy reference, the dot test, tensor, flat and single-vector
    input with trailing batch axes, and the gradients in θ and x vs the reference's.
    Tolerances are `rtol` times those of `test_operators`."""
    rng = np.random.default_rng(1)
    x = random_array(rng, op.domain_shape + batch, op.dtype)
    c = random_array(rng, op.range_shape + batch, op.range_dtype)
    b = math.prod(batch)
    wide = lambda t: t.astype(jnp.complex128 if jnp.iscomplexobj(t) else jnp.float64)

    @jax.jit
    def run(θ, x, c):
        grad = lambda apply, θ, x: jax.grad(lambda θ, x: pairing(c, apply(θ, x)), argnums=(0, 1))(θ, x)
        return dict(
            dense=po.to_dense(op, θ), dense_h=po.to_dense(op.H, θ), y=op.apply(θ, x),
            flat=op.apply(θ, x.reshape(op.domain_size, b)), one=op(θ) @ x[..., 0, 0].reshape(-1),
            adjoint=op.H.apply(θ, c), grads=grad(op.apply, θ, x),
            ref=dense(op, θ), ref_grads=grad(lambda θ, x: apply_dense(op, θ, x), jax.tree.map(wide, θ), wide(x)),
        )

    r = jax.device_get(run(θ, jnp.asarray(x), jnp.asarray(c)))
    atol = lambda want: rtol * tol(op.dtype) * max(1, np.abs(want).max())
    M = r["ref"]
    assert r["dense"].shape == op.shape
    np.testing.assert_allclose(r["dense"], M, atol=atol(M))
    np.testing.assert_allclose(r["dense_h"], M.conj().T, atol=atol(M))
    want = (M @ x.reshape(op.domain_size, b)).reshape(op.range_shape + batch)
    want = want if np.issubdtype(op.range_dtype, np.complexfloating) else want.real
    assert r["y"].shape == op.range_shape + batch and r["y"].dtype == op.range_dtype
    np.testing.assert_allclose(r["y"], want, atol=atol(want))
    np.testing.assert_allclose(r["flat"], want.reshape(op.range_size, b), atol=atol(want))
    np.testing.assert_allclose(r["one"], want[..., 0, 0].reshape(-1), atol=atol(want))
    lhs, rhs = np.vdot(r["y"], c), np.vdot(x, r["adjoint"])  # the dot test
    if not np.issubdtype(op.dtype, np.complexfloating) or not np.issubdtype(op.range_dtype, np.complexfloating):
        lhs, rhs = lhs.real, rhs.real
    assert abs(lhs - rhs) < rtol * tol(op.dtype) * max(abs(lhs), abs(rhs))
    for g, w in zip(jax.tree.leaves(r["grads"]), jax.tree.leaves(r["ref_grads"])):
        np.testing.assert_allclose(g, w.astype(g.dtype), atol=10 * atol(w))


@pytest.mark.parametrize("dtype, boundary, i", CASES, ids=[f"{leaves(d, b)[i]!r}-{d}" for d, b, i in CASES])
def test_leaf_matches_reference(dtype, boundary, i):
    op = leaves(dtype, boundary)[i]
    check(op, random_params(op))


def correlate(w: np.ndarray, x: np.ndarray, boundary: str) -> np.ndarray:
    """`y[o, i] = sum_{c, j} w[o, c, j] x[c, i + j - h]` in float64/complex128 NumPy, with
    `np.roll` (periodic) or a zero-padded copy (zero): a reference for sizes too large
    for a dense matrix."""
    d = w.ndim - 2
    halo = [k // 2 for k in w.shape[2:]]
    if boundary == "zero":
        x = np.pad(x, [(0, 0)] + [(h, h) for h in halo])
    y = 0
    for j in np.ndindex(w.shape[2:]):
        if boundary == "periodic":
            shifted = np.roll(x, [h - jj for jj, h in zip(j, halo)], axis=tuple(range(1, d + 1)))
        else:
            shifted = x[(slice(None),) + tuple(slice(jj, jj + n) for jj, n in zip(j, x.shape[1:]))][
                (slice(None),) + tuple(slice(0, n - 2 * h) for n, h in zip(x.shape[1:], halo))]
        y = y + np.einsum("oc,c...->o...", w[(slice(None), slice(None)) + j], shifted)
    return y


# -- compositions ----------------------------------------------------------------------

def combinations(dtype):
    C = po.Convolution(3, 2, (3,), (5,), "periodic", dtype)
    S = po.Stencil([[0.5, 1, -1], [2, -4, 1], [0, 1, 0.25]], (4, 3), "zero", dtype)
    return [
        po.kron(po.Matrix(2, 3, dtype), C, po.Identity(2, dtype)),  # axes before and after
        po.kron(C, S),
        po.kron(po.Identity(2, dtype), S) @ po.kron(po.Diagonal(2, dtype), S.H) + 2 * po.kron(po.Identity(2, dtype), S),
        po.Convolution(3, 2, (3, 3), (4, 3), "zero", dtype).H @ po.Convolution(3, 3, (1, 3), (4, 3), "periodic", dtype),
        po.kron(po.DFT(3, dtype), S, po.Identity(2, dtype)),  # a real DFT for a real dtype
    ]


@pytest.mark.parametrize("i", range(5))
def test_in_kron_compose_sum_with_batch(i):
    op = combinations(DTYPES[i % 4])[i]
    check(op, random_params(op), rtol=10)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_laplacian_is_a_sum_of_krons_of_second_differences(boundary):
    n = (6, 5, 4)
    D2 = [po.Stencil([1, -2, 1], (m,), boundary, "float64") for m in n]
    I = [po.Identity(m, "float64") for m in n]
    L = po.kron(D2[0], I[1], I[2]) + po.kron(I[0], D2[1], I[2]) + po.kron(I[0], I[1], D2[2])
    x = np.random.default_rng(0).standard_normal(n + (2,))
    want = 0
    for a in range(3):
        if boundary == "periodic":
            want = want + np.roll(x, 1, a) - 2 * x + np.roll(x, -1, a)
        else:
            widths = [(1, 1) if b == a else (0, 0) for b in range(4)]
            want = want + np.diff(np.pad(x, widths), 2, axis=a)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: L @ x)(x)), want, atol=1e-12)
    L2 = po.kron(D2[0], I[1]) + po.kron(I[0], D2[1])
    five = po.Stencil(np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], "float64"), n[:2], boundary)
    M, M5, MH = (np.asarray(jax.jit(po.to_dense)(op)) for op in (L2, five, five.H))
    np.testing.assert_allclose(M5, M, atol=1e-12)
    np.testing.assert_allclose(MH, M, atol=1e-12)  # symmetric


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_float32_matches_float64_to_rounding(boundary):
    C = po.Convolution(8, 6, (3, 5), (16, 12), boundary)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(C.param_shape) / np.sqrt(6 * 15)
    x = rng.standard_normal(C.domain_shape)
    want = correlate(w, x, boundary)
    y = C({"Convolution_0": jnp.asarray(w, jnp.float32)}) @ jnp.asarray(x, jnp.float32)
    assert np.abs(np.asarray(y) - want).max() < 1e-5 * np.abs(want).max()
    z = random_array(rng, C.range_shape, "complex128")
    want_h = correlate(w[:, :, ::-1, ::-1].swapaxes(0, 1), z, boundary)  # a real kernel
    got_h = C.H({"Convolution_0": jnp.asarray(w, jnp.float32)}) @ z.astype(np.complex64)
    assert np.abs(np.asarray(got_h) - want_h).max() < 1e-5 * np.abs(want_h).max()


def test_real_operators_act_on_complex_data():
    C = po.Convolution(2, 3, (3, 3), (4, 5), "zero", "float64")
    S = po.Stencil([1.0, -2.0, 1.0], (4,), dtype="complex128")
    assert S.weights.dtype == np.float64 and S.flow is po.operators.base.Flow.REAL
    θ = random_params(C)
    z = random_array(np.random.default_rng(0), C.domain_shape, "complex128")
    np.testing.assert_allclose(
        np.asarray(C(θ) @ z), np.asarray(C(θ) @ z.real) + 1j * np.asarray(C(θ) @ z.imag), atol=1e-12)
    y = S @ z[0, :, 0]
    assert y.dtype == np.complex128 and (S @ z[0, :, 0].real).dtype == np.float64


# -- the interface for the distributed version -------------------------------------------

@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("kind", ["conv", "stencil"])
def test_halo_extend_valid_on_blocks(kind, boundary):
    """Each block of a split grid axis, extended by halo planes from its neighbours (a
    ring for periodic, zeros at the ends for zero) and along the other axes locally,
    gives its block of the output through `_valid`: forward and adjoint."""
    rng = np.random.default_rng(0)
    if kind == "conv":
        op = po.Convolution(2, 3, (5, 3), (9, 6), boundary, "float64")
    else:
        op = po.Stencil(rng.standard_normal((5, 3)), (9, 6), boundary, "float64")
    θ = random_params(op)
    w = op.weight(θ)
    assert op.halo == (2, 1)
    pre, first = 2, 1 + op.grid_offset  # a kron neighbour before, a batch axis after
    for leaf, adjoint in [(op, False), (op.H, True)]:
        x = jnp.asarray(rng.standard_normal((pre,) + leaf.domain_shape + (3,)))
        x_np = np.asarray(x)
        ext = op.extend(x, 1, [1])
        widths = [(0, 0)] * x.ndim
        widths[first + 1] = (1, 1)
        np.testing.assert_array_equal(
            np.asarray(ext), np.pad(x_np, widths, mode="wrap" if boundary == "periodic" else "constant"))
        full = np.asarray(leaf._apply(θ, x, 1))
        blocks, h = np.split(x_np, 3, axis=first), op.halo[0]
        for b, block in enumerate(blocks):
            left = blocks[b - 1].take(range(-h, 0), axis=first)
            right = blocks[(b + 1) % 3].take(range(h), axis=first)
            if boundary == "zero":
                left, right = left * (b > 0), right * (b < 2)
            local = op.extend(jnp.asarray(np.concatenate([left, block, right], axis=first)), 1, [1])
            got = op._valid(w, local, 1, adjoint)
            np.testing.assert_allclose(np.asarray(got), np.split(full, 3, axis=first)[b], atol=1e-12)


def test_roles():
    C = po.Convolution(4, 3, (3, 3, 1), (5, 6, 7))
    S = po.Stencil([[1, 2, 1]], (2, 9))
    assert C.roles == (Role.LOCAL, Role.HALO, Role.HALO, Role.HALO) and C.H.roles == C.roles
    assert S.roles == (Role.HALO, Role.HALO) and S.H.roles == S.roles
    assert Role.HALO.adjoint is Role.HALO
    assert C.param_axes == (None,) * 5 and C.dense_axes is None
    assert (C.halo, S.halo) == ((1, 1, 0), (0, 1))


# -- parameters, structure, display --------------------------------------------------

def test_init_names_and_sharing():
    C = po.Convolution(64, 16, (3, 3), (4, 4))
    Z = po.Convolution(64, 16, (3,), (4,), dtype="complex64")
    assert list(po.kron(C, Z).parameters) == ["Convolution_0", "Convolution_1"]  # in order of appearance
    θ = po.init(po.kron(C, Z), jax.random.key(0))
    assert θ["Convolution_0"].shape == (64, 16, 3, 3) and θ["Convolution_0"].dtype == np.float32
    assert θ["Convolution_1"].shape == (64, 16, 3) and θ["Convolution_1"].dtype == np.complex64
    # variance 1 / (c_in * prod(kernel)), complex normal for a complex dtype
    assert abs(float(jnp.var(θ["Convolution_0"])) * 16 * 9 - 1) < 0.05
    assert abs(float(jnp.mean(jnp.abs(θ["Convolution_1"]) ** 2)) * 16 * 3 - 1) < 0.05
    assert abs(float(jnp.var(θ["Convolution_1"].imag)) * 16 * 3 - 0.5) < 0.05
    A = po.Convolution(2, 2, (3,), (5,), name="c")
    B = po.Convolution(2, 2, (3,), (5,), "zero", name="c")  # another leaf, the same weight
    AB = A @ B
    assert list(AB.parameters) == ["c"] and list(po.init(AB, jax.random.key(0))) == ["c"]
    θ = po.init(AB, jax.random.key(0))
    x = jnp.ones((2, 5), jnp.float32)
    np.testing.assert_allclose(np.asarray(AB(θ) @ x), np.asarray(A(θ) @ (B(θ) @ x)), rtol=1e-6)
    with pytest.raises(ValueError, match="'c'"):
        (A @ po.Convolution(2, 2, (5,), (5,), name="c")).parameters
    S = po.Stencil([1, -2, 1], (5,))
    assert S.parameters == {} and po.init(S, jax.random.key(0)) == {}
    np.testing.assert_allclose(np.asarray(S @ np.arange(5.0, dtype=np.float32)), [5, 0, 0, 0, -5])


def test_structural_equality_and_jit():
    S = po.Stencil([1, -2, 1], (5,))
    assert S == po.Stencil(np.array([1, -2, 1], np.float32), (5,))
    assert hash(S) == hash(po.Stencil((1.0, -2.0, 1.0), (5,)))
    assert S != po.Stencil([1, -2, 2], (5,)) and S != po.Stencil([1, -2, 1], (5,), "zero")
    assert po.Convolution(2, 2, (3,), (5,), name="c") == po.Convolution(2, 2, (3,), (5,), name="c")
    with pytest.raises(ValueError):
        S.weights[0] = 3
    with pytest.raises(AttributeError):
        S.boundary = "zero"
    f = jax.jit(lambda A, x: A @ x)
    np.testing.assert_allclose(np.asarray(f(S, jnp.ones(5, jnp.float32))), np.zeros(5), atol=0)
    assert (po.Stencil(np.zeros((3, 3)), (4, 4)) @ jnp.ones((4, 4))).shape == (4, 4)  # no tap at all


def test_dtype_rules():
    assert po.Stencil([1, -2, 1], (4,)).dtype == np.float32
    assert po.Stencil(np.array([1, -2, 1]), (4,)).dtype == np.float32  # integers
    assert po.Stencil(np.array([1.0, -2.0, 1.0]), (4,)).dtype == np.float64
    assert po.Stencil([1j, 2, 1], (4,)).dtype == np.complex64
    assert po.Stencil([1, 2, 1], (4,), dtype="complex128").flow is po.operators.base.Flow.REAL
    assert po.Convolution(2, 2, (3,), (4,), dtype=None).dtype == np.float32
    C = po.Convolution(2, 2, (3,), (4,), dtype="complex64")
    assert C.out_dtype("float32") is None and C.out_dtype("complex64") == np.complex64


def test_repr():
    C = po.Convolution(8, 4, (3, 3), (16, 16), "zero", name="enc")
    assert repr(C) == "Conv(8×4×3×3 'enc', zero)"
    assert repr(C.H) == "Conv(8×4×3×3 'enc', zero)ᴴ"
    assert repr(po.Stencil([1, -2, 1], (8,))) == "Stencil([1, -2, 1], periodic)"
    assert repr(po.Stencil(np.ones((3, 5)), (8, 8), "zero")) == "Stencil(3×5, zero)"


@pytest.mark.parametrize("make, error, match", [
    (lambda: po.Convolution(2, 2, (4,), (8,)), ValueError, r"Convolution: kernel size 4 along spatial axis 0 is even"),
    (lambda: po.Convolution(2, 2, (3, 2), (8, 8)), ValueError, r"Convolution: kernel size 2 along spatial axis 1"),
    (lambda: po.Convolution(2, 2, (3,), (8, 8)), ValueError, r"Convolution: the kernel \(3,\) has 1 axes but the grid"),
    (lambda: po.Convolution(2, 2, (3,), (8,), "reflect"), ValueError, r"Convolution: boundary must be 'periodic' or 'zero', got 'reflect'"),
    (lambda: po.Convolution(0, 2, (3,), (8,)), ValueError, r"Convolution: c_out must be a positive int"),
    (lambda: po.Convolution(2, 2, (3,), (0,)), ValueError, r"Convolution: each grid size must be a positive int"),
    (lambda: po.Convolution(2, 2, (-1,), (8,)), ValueError, r"Convolution: each kernel size must be a positive int"),
    (lambda: po.Convolution(2, 2, 3, (8,)), TypeError, r"Convolution: kernel must be a sequence"),
    (lambda: po.Convolution(2, 2, (), ()), ValueError, r"Convolution: kernel must have at least one axis"),
    (lambda: po.Convolution(2, 2, (3,), (8,), dtype="int32"), TypeError, r"Convolution: dtype must be one of bfloat16, float16, float32, float64, complex64, complex128, got int32$"),
    (lambda: po.Convolution(2, 2, (3,), (8,), dtype=0), TypeError, r"Convolution: dtype must be one of .*, got 0$"),
    (lambda: po.Convolution(2, 2, (3,), (8,), boundary=np.ones(2)), ValueError, r"Convolution: boundary must be"),
    (lambda: po.Stencil([1, -2], (8,)), ValueError, r"Stencil: kernel size 2 along spatial axis 0 is even"),
    (lambda: po.Stencil([1, -2, 1], (8, 8)), ValueError, r"Stencil: weights of shape \(3,\) have 1 axes but the grid"),
    (lambda: po.Stencil([1, -2, 1], (8,), "wrap"), ValueError, r"Stencil: boundary must be"),
    (lambda: po.Stencil([1j, 1, 1], (8,), dtype="float32"), TypeError, r"Stencil: complex weights need a complex dtype"),
    (lambda: po.Stencil([1, -2, 1], (-8,)), ValueError, r"Stencil: each grid size must be a positive int"),
    (lambda: po.Stencil(np.ones((1, 0)), (8, 8)), ValueError, r"Stencil: each weights size must be a positive int"),
    (lambda: po.Stencil(["a", "b", "c"], (8,)), TypeError, r"Stencil: weights must be an array of numbers"),
    (lambda: po.Stencil([1, 1, 1], (8,), dtype="int8"), TypeError, r"Stencil: dtype must be one of bfloat16, float16, float32, float64, complex64, complex128, got int8$"),
    (lambda: po.Stencil([1, 1, 1], (8,), dtype="zero"), TypeError, r"Stencil: dtype must be one of .*, got 'zero'$"),
    (lambda: po.Stencil([1, -2, 1], (8,), np.ones(2)), ValueError, r"Stencil: boundary must be"),
])
def test_bad_input(make, error, match):
    with pytest.raises(error, match=match):
        make()
