"""The serial algebra against NumPy dense references, in four dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from reference import DTYPES, apply_dense, dense, pairing, random_array, random_params, random_tree, tol

REAL = ["float32", "float64"]
COMPLEX = ["complex64", "complex128"]


def leaves(dtype):
    """One of each leaf that takes `dtype`, with odd and even sizes."""
    out = [
        po.Identity(5, dtype),
        po.Matrix(3, 5, dtype),
        po.Diagonal(6, dtype),
        po.Restriction(9, [slice(0, 3), slice(-3, None)], dtype),
        po.Restriction(8, [5, -1, 0, 5], dtype),  # unsorted, repeated
        po.Reduce(7, dtype),
        po.PerModeMatrix(3, 2, (4, 3), dtype),
    ]
    for n in (7, 8):
        for norm in ("backward", "ortho", "forward"):
            dft = po.DFT(n, dtype, norm)
            out += [dft, dft.inverse()]
    return out


CASES = [(dtype, i) for dtype in DTYPES for i in range(len(leaves(dtype)))]


def case_id(case):
    dtype, i = case
    return f"{leaves(dtype)[i]!r}-{dtype}"


@jax.jit
def dense_both_ways(op, θ):
    """parop's dense matrices of `op` and `op.H` and the reference's of `op`, as one
    program (each small one compiles on its own, which is most of these tests' time)."""
    return po.to_dense(op, θ), po.to_dense(op.H, θ), dense(op, θ)


@jax.jit
def leaf_outputs(op, θ, x, x1, c):
    """What the leaf tests compare, parop's and the dense reference's, as one program per
    leaf: `op` applied to `x` (`domain_shape + (2, 3)`) as a tensor, flattened and as one
    vector, and the gradients of `Re<c, op(θ) x1>` in θ and `x1`."""
    wide = lambda t: t.astype(jnp.complex128 if jnp.iscomplexobj(t) else jnp.float64)
    grads = lambda apply, θ, x1: jax.grad(lambda θ, x1: pairing(c, apply(op, θ, x1)), argnums=(0, 1))(θ, x1)
    return {
        "dense": dense_both_ways(op, θ),
        "tensor": op.apply(θ, x), "flat": op.apply(θ, x.reshape(op.domain_size, 6)),
        "vector": op(θ) @ x[..., 0, 0].reshape(-1), "tensor reference": apply_dense(op, θ, x),
        "grads": grads(lambda op, θ, x1: op.apply(θ, x1), θ, x1),
        "grads reference": grads(apply_dense, jax.tree.map(wide, θ), wide(x1)),
    }


@pytest.fixture(scope="module", params=CASES, ids=[case_id(c) for c in CASES])
def leaf_case(request):
    """A leaf, its parameters, the tensor its apply test applies it to, and `leaf_outputs`
    (computed once for the four tests of a leaf)."""
    dtype, i = request.param
    op = leaves(dtype)[i]
    θ = random_params(op)
    x = random_array(np.random.default_rng(1), op.domain_shape + (2, 3), op.dtype)
    rng = np.random.default_rng(2)
    x1 = random_array(rng, op.domain_shape, op.dtype)
    c = random_array(rng, op.range_shape, op.range_dtype)
    return op, θ, x, jax.tree.map(np.asarray, leaf_outputs(op, θ, x, x1, c))


def test_leaf_dense_matches_numpy(leaf_case):
    op, _, _, out = leaf_case
    got, _, want = out["dense"]
    assert got.shape == op.shape
    np.testing.assert_allclose(got, want, atol=tol(op.dtype) * max(1, np.abs(want).max()))


def test_leaf_adjoint(leaf_case):
    op, θ, _, out = leaf_case
    _, got_H, want = out["dense"]
    assert po.testing.dot_test(op, θ) < tol(op.dtype)
    assert op.H.H is op
    np.testing.assert_allclose(got_H, want.conj().T, atol=tol(op.dtype) * max(1, float(np.abs(want).max())))


def test_leaf_apply_tensor_and_flat(leaf_case):
    op, _, x, out = leaf_case
    want, y = out["tensor reference"], out["tensor"]
    assert y.shape == op.range_shape + (2, 3) and y.dtype == op.range_dtype
    scale = max(1, np.abs(want).max())
    np.testing.assert_allclose(y, want, atol=tol(op.dtype) * scale)
    assert out["flat"].shape == (op.range_size, 6)
    np.testing.assert_allclose(out["flat"], want.reshape(op.range_size, 6), atol=tol(op.dtype) * scale)
    np.testing.assert_allclose(out["vector"], want[..., 0, 0].reshape(-1), atol=tol(op.dtype) * scale)


def test_leaf_gradients_match_dense(leaf_case):
    op, _, _, out = leaf_case
    for g, w in zip(jax.tree.leaves(out["grads"]), jax.tree.leaves(out["grads reference"])):
        np.testing.assert_allclose(g, w.astype(g.dtype), atol=tol(op.dtype) * 10)


@jax.jit
def forward_and_back(F, x):
    y = F @ x
    return y, F.inverse() @ y


@pytest.mark.parametrize("n", [1, 2, 7, 8])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dft_matches_numpy_and_inverts(n, norm, dtype):
    F = po.DFT(n, dtype, norm)
    x = random_array(np.random.default_rng(n), (n, 3), dtype)
    ref = (np.fft.fft if F.real is False else np.fft.rfft)(x.astype(np.complex128 if F.real is False else np.float64), axis=0, norm=norm)
    y, back = forward_and_back(F, x)
    np.testing.assert_allclose(np.asarray(y), ref, atol=tol(dtype) * max(1, np.abs(ref).max()))
    assert F.range_shape == ((n // 2 + 1,) if F.real else (n,))
    np.testing.assert_allclose(np.asarray(back), x, atol=tol(dtype) * 10)
    assert po.testing.dot_test(F) < tol(dtype) and po.testing.dot_test(F.inverse()) < tol(dtype)
    assert F.inverse().inverse() is F


def test_real_dft_adjoint_is_not_the_inverse():
    F = po.DFT(8, "float64")
    y = F @ np.arange(8.0)
    assert not np.allclose(np.asarray(F.H @ y), np.arange(8.0))
    assert po.testing.dot_test(F) < 1e-13


def test_restriction_keeps_and_scatters():
    R = po.Restriction(10, [slice(0, 3), slice(-2, None), 5])
    x = np.arange(10.0, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(R @ x), [0, 1, 2, 8, 9, 5])
    np.testing.assert_array_equal(np.asarray(R.H @ (R @ x)), [0, 1, 2, 0, 0, 5, 0, 0, 8, 9])


def test_reduce_sums_and_broadcasts():
    S = po.kron(po.Reduce(8), po.Identity(100))
    x = np.ones((8, 100), np.float32)
    assert (S @ x).shape == (1, 100) and np.all(np.asarray(S @ x) == 8)
    assert (S.H @ np.ones((1, 100), np.float32)).shape == (8, 100)


# -- combinators ---------------------------------------------------------------------

def test_seed_3d_dft_dtype_flow_and_numpy():
    F = po.kron(po.DFT(30, jnp.complex64), po.DFT(20, jnp.complex64), po.DFT(10, jnp.float32))
    assert (F.domain_shape, F.range_shape) == ((30, 20, 10), (30, 20, 6))
    assert (F.dtype, F.range_dtype) == (np.float32, np.complex64)
    assert F.shape == (30 * 20 * 6, 6000)
    x = np.random.default_rng(0).standard_normal((30, 20, 10)).astype(np.float32)
    y = F @ x
    assert y.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(y), np.fft.rfftn(x), atol=2e-3)
    assert repr(F) == "DFT(30) ⊗ DFT(20) ⊗ rDFT(10)"


def test_kron_is_np_kron():
    θ = {}
    A, B, C = po.Matrix(3, 4, "float64", name="a"), po.DFT(5, "float64"), po.Matrix(2, 3, "float64", name="c")
    K = po.kron(A, po.kron(B, C))
    assert isinstance(K, po.Kron) and len(K.factors) == 3
    θ = random_params(K)
    want = np.kron(np.kron(np.asarray(θ["a"]), np.fft.rfft(np.eye(5), axis=0)), np.asarray(θ["c"]))
    np.testing.assert_allclose(np.asarray(po.to_dense(K, θ)), want, atol=1e-12)


@pytest.mark.parametrize("seed", [pytest.param(s, marks=[pytest.mark.long] if s >= 20 else []) for s in range(40)])
def test_random_trees_match_dense(seed):
    rng = np.random.default_rng(seed)
    dtype = DTYPES[seed % 4]
    shape = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    op = random_tree(rng, shape, dtype, depth=3)
    θ = random_params(op, seed)
    got, got_H, want = (np.asarray(m) for m in dense_both_ways(op, θ))
    scale = max(1, np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=tol(dtype) * scale * 10)
    np.testing.assert_allclose(got_H, want.conj().T, atol=tol(dtype) * scale * 10)
    assert po.testing.dot_test(op, θ) < tol(dtype) * 10
    assert op.H.H is op


def test_fno_spectral_chain_is_real_to_real():
    rF, F = po.DFT(16, "float64"), po.DFT(12, "complex128")
    R1 = po.Restriction(12, [slice(0, 3), slice(-3, None)])
    R2 = po.Restriction(9, slice(0, 4))
    W = po.PerModeMatrix(2, 3, (6, 4), "complex128", name="w")
    down = po.kron(po.Identity(3), R1 @ F, R2 @ rF)
    up = po.kron(po.Identity(2), F.inverse() @ R1.H, rF.inverse() @ R2.H)
    model = up @ W @ down
    assert (model.dtype, model.range_dtype) == (np.float64, np.float64)
    θ = random_params(model)
    x = random_array(np.random.default_rng(0), (3, 12, 16), "float64")
    xh = np.fft.fft(np.fft.rfft(x, axis=2), axis=1)[:, [0, 1, 2, 9, 10, 11], :4]
    yh = np.einsum("oixy,ixy->oxy", np.asarray(θ["w"]), xh)
    full = np.zeros((2, 12, 9), complex)
    full[:, [0, 1, 2, 9, 10, 11], :4] = yh
    want = np.fft.irfft(np.fft.ifft(full, axis=1), 16, axis=2)
    np.testing.assert_allclose(np.asarray(model(θ) @ x), want, atol=1e-12)
    assert po.testing.dot_test(model, θ) < 1e-12
    np.testing.assert_allclose(np.asarray(po.to_dense(model, θ)), np.asarray(dense(model, θ)).real, atol=1e-12)
