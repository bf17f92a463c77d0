"""Parameters, transformations (jit, grad, vmap, linear_transpose), display, and every
bad input of the serial algebra."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from reference import apply_dense, random_array, random_params


# -- parameters ----------------------------------------------------------------------

def test_init_names_sharing_and_determinism():
    M = po.Matrix(4, 4, name="mix")
    D = po.Diagonal(3)
    op = po.kron(M, D) @ po.kron(M, po.Identity(3))
    θ = po.init(op, jax.random.key(0))
    assert set(θ) == {"mix", "Diagonal_0"}  # an unnamed leaf: named by the operator it is in
    assert θ["mix"].shape == (4, 4) and θ["mix"].dtype == jnp.float32
    np.testing.assert_array_equal(θ["Diagonal_0"], np.ones(3))
    again = po.init(op, jax.random.key(0))
    assert all(np.array_equal(θ[k], again[k]) for k in θ)
    other = po.init(op, jax.random.key(1))
    assert not np.array_equal(θ["mix"], other["mix"])
    # a weight's value depends only on the key and its name
    np.testing.assert_array_equal(po.init(M, jax.random.key(0))["mix"], θ["mix"])


def test_init_drawn_again_compiles_nothing(caplog):
    # each weight's jitted initialiser is kept on the operator, serial or distributed
    for op in (po.kron(po.Matrix(4, 4, name="mix"), po.Diagonal(8)),
               po.distribute(po.kron(po.Matrix(4, 4, name="mix"), po.Diagonal(8)), (2, 4), shard_weights=True)):
        po.init(op, jax.random.key(0))
        with jax.log_compiles(), caplog.at_level("WARNING"):
            po.init(op, jax.random.key(1))
        assert not [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling")]


def test_same_explicit_name_is_one_weight():
    a, b = po.Matrix(3, 3, name="w"), po.Matrix(3, 3, name="w")
    op = a @ b
    assert list(po.init(op, jax.random.key(0))) == ["w"]
    θ = random_params(op)
    x = np.ones(3, np.float32)
    np.testing.assert_allclose(np.asarray(op(θ) @ x), np.asarray(θ["w"] @ (θ["w"] @ x)), rtol=1e-6)


def test_same_name_different_shape_is_an_error():
    with pytest.raises(ValueError, match=r"'w'.*\(3, 3\).*\(4, 4\)"):
        po.kron(po.Matrix(3, 3, name="w"), po.Matrix(4, 4, name="w"))


def test_init_statistics():
    M = po.Matrix(400, 300, name="m")
    w = po.init(M, jax.random.key(0))["m"]
    x = jax.random.normal(jax.random.key(1), (300, 200), jnp.float32)
    assert 0.9 < float(jnp.var(w @ x)) < 1.1
    C = po.Matrix(400, 300, "complex64", name="c")
    wc = po.init(C, jax.random.key(0))["c"]
    assert wc.dtype == jnp.complex64 and float(jnp.abs(wc.imag).mean()) > 0
    assert 0.9 < float(300 * jnp.mean(jnp.abs(wc) ** 2)) < 1.1
    P = po.PerModeMatrix(64, 32, (6, 5), name="p")
    wp = po.init(P, jax.random.key(0))["p"]
    assert wp.dtype == jnp.complex64 and 0.9 < float(32 * jnp.mean(jnp.abs(wp) ** 2)) < 1.1


@pytest.mark.parametrize("bad, match", [
    ({}, r"parameter 'm'.*missing.*\(3, 2\).*float32"),
    ({"m": jnp.ones((2, 3), jnp.float32)}, r"'m'.*shape \(3, 2\).*got shape \(2, 3\)"),
    ({"m": jnp.ones((3, 2), jnp.float64)}, r"'m'.*dtype float32.*got .*float64"),
])
def test_bad_params(bad, match):
    M = po.Matrix(3, 2, name="m")
    with pytest.raises(ValueError, match=match):
        M(bad) @ jnp.ones(2, jnp.float32)


def test_parametric_operator_needs_params():
    with pytest.raises(TypeError, match="has parameters"):
        po.Matrix(3, 2) @ jnp.ones(2)


# -- transformations -----------------------------------------------------------------

def spectral_op():
    W = po.Matrix(4, 4, "complex64", name="w")
    return po.kron(W, po.DFT(6, "complex64"), po.DFT(8, "float32"))


def test_jit_grad_vmap_linear_transpose():
    op = spectral_op()
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(0), (4, 6, 8), "float32"))
    y = op(θ) @ x
    np.testing.assert_allclose(np.asarray(jax.jit(lambda θ, x: op(θ) @ x)(θ, x)), np.asarray(y), atol=1e-4)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda x: op(θ) @ x)(xs)[1]), np.asarray(2 * y), atol=1e-4)
    c = jnp.asarray(random_array(np.random.default_rng(1), y.shape, "complex64"))
    (transposed,) = jax.linear_transpose(lambda x: op(θ) @ x, x)(c)
    # the transpose of a real-to-complex map: <c, A x> bilinear, no conjugation
    want = jax.linear_transpose(lambda x: apply_dense(op, θ, x), x.astype(jnp.float64))(c.astype(jnp.complex128))[0]
    np.testing.assert_allclose(np.asarray(transposed), np.asarray(want), atol=1e-3)
    g = jax.grad(lambda θ: jnp.sum(jnp.abs(op(θ) @ x) ** 2))(θ)
    assert g["w"].shape == (4, 4) and g["w"].dtype == jnp.complex64
    # JAX's gradient of a real loss in a complex weight is the conjugate of the Wirtinger
    # derivative 2 ∂f/∂w̄: for f = ||(W ⊗ F) x||², with F the DFTs acting on x's last two axes
    # as the matrix Z = F x (4 rows of 6 · 5), f = ||W Z||² and ∂f/∂w̄ = (W Z) Zᴴ
    Z = np.fft.fft(np.fft.rfft(np.asarray(x, np.float64), axis=2), axis=1).reshape(4, -1)
    W = np.asarray(θ["w"], np.complex128)
    want = np.conj(2 * (W @ Z) @ Z.conj().T)
    np.testing.assert_allclose(np.asarray(g["w"]), want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_grad_matches_finite_differences():
    M = po.Matrix(3, 5, "float64", name="m")
    op = po.kron(M, po.Diagonal(4, "float64", name="d"))
    θ = random_params(op)
    x = random_array(np.random.default_rng(0), (5, 4), "float64")
    f = lambda θ: jnp.sum(jnp.sin(op(θ) @ x))
    g = jax.grad(f)(θ)
    e = np.zeros((3, 5)); e[1, 2] = 1e-6
    fd = (f({**θ, "m": θ["m"] + e}) - f({**θ, "m": θ["m"] - e})) / 2e-6
    assert abs(float(fd) - float(g["m"][1, 2])) < 1e-6


# -- display -------------------------------------------------------------------------

def test_repr_tree_and_html():
    op = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    assert repr(op) == "Matrix(50×50 'mix') ⊗ I(30) ⊗ I(10)"
    assert repr(op.H) == "Matrix(50×50 'mix')ᴴ ⊗ I(30) ⊗ I(10)"
    R = po.Restriction(32, [slice(0, 4), slice(-4, None)])
    assert repr(2.0 * (R.H @ R) - po.Identity(32)) == "2·(Restriction(32→8)ᴴ @ Restriction(32→8)) - I(32)"
    text = po.tree(op)
    assert "(50, 30, 10) float32 → (50, 30, 10) float32" in text and "I(30)" in text
    html = op._repr_html_()
    assert "<table>" in html and "mix" in html
    named = po.kron(po.Matrix(4, 4, name="<b>a&b</b>"), po.Identity(2))  # names are text, escaped everywhere
    assert "<b>" not in named._repr_html_() and named._repr_html_().count("&lt;b&gt;a&amp;b&lt;/b&gt;") == 3


# -- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("build, error, match", [
    (lambda: po.Matrix(0, 3), ValueError, "Matrix: m must be a positive int"),
    (lambda: po.Matrix(3, 2.5), ValueError, "Matrix: n must be a positive int"),
    (lambda: po.Matrix(3, 3, "int32"), TypeError, "Matrix: dtype"),
    (lambda: po.DFT(8, norm="unitary"), ValueError, "DFT: norm must be one of"),
    (lambda: po.Restriction(8, [8]), ValueError, "index 8 is out of range for an axis of size 8"),
    (lambda: po.Restriction(8, [slice(3, 3)]), ValueError, "selects no index"),
    (lambda: po.Restriction(8, ["a"]), TypeError, "keep takes ints and slices"),
    (lambda: po.kron(po.DFT(8, "float32"), po.DFT(8, "float32")), TypeError,
     r"kron: no order of the factors rDFT\(8\) \[float32 -> complex64\], rDFT\(8\)"),
    (lambda: po.kron(po.DFT(8, "complex64"), po.DFT(8, "complex128")), TypeError, "precisions must agree"),
    (lambda: po.DFT(8) @ po.DFT(6), ValueError, r"DFT\(8\) takes shape \(8,\) but DFT\(6\) gives \(6,\)"),
    (lambda: po.DFT(8, "complex64") @ po.Matrix(8, 8, "float64"), TypeError, "cannot compose"),
    (lambda: po.DFT(8) + po.DFT(6), ValueError, "cannot add"),
    (lambda: po.DFT(8, "float32") + po.Identity(8), ValueError, "cannot add"),
    (lambda: po.Identity(8) * jnp.ones((2,)), TypeError, "multiplied by a scalar, got an array of shape \\(2,\\)"),
    (lambda: po.Identity(8) * "2", TypeError, "multiplied by a number or a 0-d JAX array"),
    (lambda: 1j * po.Identity(8), TypeError, "complex"),
    (lambda: po.kron(), ValueError, "at least one"),
    (lambda: po.kron(po.Identity(3), np.eye(3)), TypeError, "kron takes parop operators"),
    (lambda: po.Matrix(3, 3).inverse(), TypeError, "has no inverse"),
])
def test_bad_construction(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_bad_apply_input():
    F = po.kron(po.DFT(4), po.DFT(6, "float32"))
    with pytest.raises(ValueError, match=r"input of shape \(4, 5\).*domain shape \(4, 6\).*flat \(24,\)"):
        F @ jnp.ones((4, 5), jnp.float32)
    with pytest.raises(TypeError, match="takes float32 input, got complex64"):
        F @ jnp.ones((4, 6), jnp.complex64)
    G = po.DFT(4)
    # real data into a complex operator is cast without loss
    np.testing.assert_allclose(np.asarray(G @ jnp.arange(4.0, dtype=jnp.float32)), np.fft.fft(np.arange(4.0)), atol=1e-5)
    with pytest.raises(TypeError, match="takes complex64 input, got complex128"):
        G @ jnp.ones(4, jnp.complex128)


def test_operators_are_immutable():
    M = po.Matrix(3, 3)
    with pytest.raises(AttributeError, match="immutable"):
        M.m = 4


@pytest.mark.parametrize("factors, ffts", [
    (lambda: (po.DFT(6), po.DFT(4), po.DFT(8, "float32")), 1),  # one rfftn over three axes
    (lambda: (po.DFT(6).inverse(), po.DFT(4).inverse()), 1),
    (lambda: (po.DFT(6), po.Matrix(4, 4, "complex64", name="w"), po.DFT(8)), 2),  # a Matrix between: two runs
    (lambda: (po.Restriction(6, slice(0, 3)) @ po.DFT(6), po.DFT(4)), 2),  # a pruned DFT is no plain DFT
])
def test_consecutive_dfts_of_a_kron_run_as_one_fft(factors, ffts):
    """A serial `kron` gives XLA one FFT for each run of consecutive DFTs (one cuFFT plan
    on a GPU, 1.4 - 1.6x faster there than one per axis), with the same result."""
    op = po.kron(*factors())
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(0), op.domain_shape, str(np.dtype(op.dtype))))
    hlo = jax.jit(lambda θ, x: op(θ) @ x).lower(θ, x).compile().as_text()
    assert hlo.count(" fft(") == ffts
    want = np.asarray(apply_dense(op, θ, x))
    np.testing.assert_allclose(np.asarray(op(θ) @ x), want, atol=2e-5 * float(np.abs(want).max()))
    assert po.testing.dot_test(op, θ) < 1e-4
