"""Inputs an adversarial review found: each is a clear error at the call that is wrong
(naming the operator, the argument and its value), or works.

- Half precisions: bfloat16 and float16 work for `Matrix`, `Diagonal`, a real
  `PerModeMatrix` and the structural leaves (values, `po.init`, `po.to_dense`, the
  dot test, gradients, distributed); a `DFT` refuses them when it is built.
- Integer and boolean input is cast to the operator's input dtype, serial or
  distributed.
- Unchecked arguments: `Restriction`'s `keep`, `PerModeMatrix`'s `modes`, the inverse
  of a zero multiple, weights that are not arrays, more than 26 tensor axes, and
  `po.distribute`'s `partition` entries and `mesh`.
- `dtype=None` is each leaf's default dtype.
- Every argument of every leaf's constructor and `FNO`'s, given odd values (a bool,
  a float, a string, an array, a NumPy integer, ...): an error that names the class, or
  an operator whose sizes are ints.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import parop as po
from parop import _dtypes
from parop.nn import FNO

HALF = [jnp.bfloat16, jnp.float16]


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.complex128), np.asarray(want, np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# -- 1. half precisions ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
def test_a_half_precision_dft_is_refused_when_built(dtype):
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=(
        r"^DFT: dtype must be one of float32, float64, complex64, complex128 \(jnp.fft has no "
        rf"bfloat16 or float16; a float32 DFT takes such data, cast exactly\), got {name}$"
    )):
        po.DFT(8, dtype=dtype)


def test_the_dtype_rules_for_half_precisions():
    bf16, f16 = np.dtype(jnp.bfloat16), np.dtype(jnp.float16)
    assert _dtypes.real_of(bf16) == bf16 and _dtypes.real_of(f16) == f16
    assert _dtypes.real_of(np.complex64) == np.float32
    assert _dtypes.complex_of(np.float32) == np.complex64
    with pytest.raises(TypeError, match="there is no complex dtype of bfloat16 precision: JAX's complex "
                                        r"dtypes are complex64 \(float32 parts\) and complex128"):
        _dtypes.complex_of(bf16)
    M = po.Matrix(4, 4, bf16)
    assert M.out_dtype(bf16) == bf16
    assert M.out_dtype(f16) is None and M.out_dtype(np.float32) is None and M.out_dtype(np.complex64) is None
    assert po.Identity(4).out_dtype(bf16) == bf16  # structural leaves take any float dtype


def test_half_precision_input_is_cast_only_where_that_is_exact():
    x = jnp.arange(8, dtype=jnp.bfloat16)
    assert (po.DFT(8) @ x).dtype == np.complex64  # bfloat16 -> complex64: exact
    np.testing.assert_allclose(po.DFT(8, "float32") @ x, np.fft.rfft(np.arange(8.0)), atol=1e-5)
    W = po.Matrix(4, 4, name="w")
    assert (W({"w": jnp.eye(4, dtype=jnp.float32)}) @ x[:4]).dtype == np.float32
    H = po.Matrix(4, 4, jnp.bfloat16, name="h")
    θ = {"h": jnp.eye(4, dtype=jnp.bfloat16)}
    for given in ("float32", "float16"):
        with pytest.raises(TypeError, match=(
            rf"^Matrix\(4×4 'h'\) takes bfloat16 input, got {given} \(casting would lose information; "
            r"cast it yourself, x.astype\('bfloat16'\), if that is what you mean\)$"
        )):
            H(θ) @ jnp.ones(4, given)


def _every_half_leaf(dtype):
    """A composite of every leaf that supports half precisions: (3, 8, 5, 4) -> (6, 8, 3, 1)."""
    per_mode = po.PerModeMatrix(4, 3, (8,), dtype, name="pm")
    return (po.kron(po.Matrix(6, 4, dtype, name="m"), po.Diagonal(8, dtype, name="d"),
                    po.Restriction(5, [0, 2, 4]), po.Reduce(4))
            @ po.kron(per_mode, po.Identity(5), po.Identity(4)))


@jax.jit
def _outputs(op: po.Operator, θ, x):
    """`op(θ) @ x`, the dense matrix and the gradient of a float64 loss, in one program."""
    def loss(t):
        return jnp.sum(jnp.square((op(t) @ x).astype(np.float64)))

    return op(θ) @ x, po.to_dense(op, θ), jax.grad(loss)(θ)


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_operators_match_a_float64_reference(dtype):
    eps = float(jnp.finfo(dtype).eps)
    op, ref = _every_half_leaf(dtype), _every_half_leaf("float64")
    assert (op.dtype, op.range_dtype) == (np.dtype(dtype), np.dtype(dtype))
    θ = jax.jit(po.init)(op, jax.random.key(0))
    rng = np.random.default_rng(0)
    θ["d"] = jnp.asarray(rng.standard_normal(8).astype(dtype))  # po.init's ones would hide a bug
    assert {v.dtype for v in θ.values()} == {np.dtype(dtype)}
    θ64 = {k: v.astype(np.float64) for k, v in θ.items()}
    x = jnp.asarray(rng.standard_normal(op.domain_shape).astype(dtype))

    (y, dense, g), (y64, dense64, g64) = _outputs(op, θ, x), _outputs(ref, θ64, x.astype(np.float64))
    assert y.dtype == dense.dtype == np.dtype(dtype)
    assert relative_error(y, y64) < 4 * eps and relative_error(dense, dense64) < 4 * eps
    for name in θ:
        assert g[name].dtype == np.dtype(dtype)
        assert relative_error(g[name], g64[name]) < 8 * eps, name
    assert po.testing.dot_test(op, θ) < 4 * eps
    D = po.distribute(op, (1, 2, 1, 2))
    assert relative_error(D(θ) @ x, y) < 2 * eps


# -- 2. integer and boolean input ----------------------------------------------------------------

def test_integer_and_boolean_input_is_cast_to_the_operator_dtype():
    n = np.arange(8)
    want = np.fft.fft(n)
    for F in (po.DFT(8), po.distribute(po.DFT(8), (1,))):
        y = F @ n
        assert y.dtype == np.complex64
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(F @ (n % 2 == 0), np.fft.fft(n % 2 == 0), atol=1e-5)
    np.testing.assert_allclose(po.DFT(8, "float32") @ n, np.fft.rfft(n), rtol=1e-5, atol=1e-4)
    K = po.kron(po.DFT(8), po.Identity(4))
    D = po.distribute(K, (1, 2))
    m = np.arange(32, dtype=np.int32).reshape(8, 4)
    np.testing.assert_allclose(D @ m, np.fft.fft(m, axis=0), rtol=1e-5, atol=1e-4)
    assert (po.Matrix(2, 8, jnp.bfloat16, name="b")({"b": jnp.ones((2, 8), jnp.bfloat16)}) @ n).dtype == jnp.bfloat16
    with pytest.raises(TypeError, match=r"DFT\(8\) takes complex64 input, got float64"):
        po.DFT(8) @ n.astype(np.float64)  # float64 into complex64 is not exact: refused


# -- 3. unchecked arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("build, error, message", [
    (lambda: po.Restriction(4, None), TypeError,
     "Restriction: keep takes an int, a slice, or a sequence (or 1-D integer array) of ints and slices, got None"),
    (lambda: po.Restriction(4, jnp.ones((2, 2), int)), TypeError,
     "Restriction: keep as an array must be 1-D (or 0-d), got shape (2, 2)"),
    (lambda: po.Restriction(4, jnp.array([0.0, 2.0])), TypeError, "Restriction: keep takes ints and slices, got 0.0"),
    (lambda: po.Restriction(4, np.array([True, False, True, False])), TypeError,
     "Restriction: keep takes ints and slices, got True"),
    (lambda: po.PerModeMatrix(2, 3, 4), TypeError,
     "PerModeMatrix: modes must be a sequence of positive ints, one per mode axis (modes=(12, 7) for a "
     "2-D spectrum), got 4"),
    (lambda: po.PerModeMatrix(2, 3, np.array(4)), TypeError,
     "PerModeMatrix: modes must be a sequence of positive ints, one per mode axis (modes=(12, 7) for a "
     "2-D spectrum), got array(4)"),
    (lambda: po.PerModeMatrix(2, 3, (4, 0)), ValueError, "PerModeMatrix: each mode count must be a positive int, got 0"),
    (lambda: po.DFT(8, norm=np.ones(2)), ValueError,
     "DFT: norm must be one of ('backward', 'ortho', 'forward'), got array([1., 1.])"),
    (lambda: (0 * po.DFT(8)).inverse(), ValueError, "0·DFT(8) has no inverse: its scalar is zero"),
    (lambda: (jnp.float32(0) * po.DFT(8)).inverse(), ValueError, "c·DFT(8) has no inverse: its scalar is zero"),
    (lambda: po.DFT(8) / 0, ZeroDivisionError, "DFT(8) / 0: an operator divided by zero"),
    (lambda: po.DFT(8) / np.float64(0), ZeroDivisionError, "DFT(8) / np.float64(0.0): an operator divided by zero"),
    (lambda: po.Identity(4, "int32"), TypeError,
     "Identity: dtype must be one of bfloat16, float16, float32, float64, complex64, complex128, got int32"),
    (lambda: po.Matrix(4, 4, "mystery"), TypeError,
     "Matrix: dtype must be one of bfloat16, float16, float32, float64, complex64, complex128, got 'mystery'"),
])
def test_bad_arguments_are_named(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert str(info.value) == message


def test_restriction_takes_a_jax_array_as_numpy_one():
    keep = [0, 2, -1]
    R = po.Restriction(8, keep)
    assert po.Restriction(8, jnp.array(keep)) == R == po.Restriction(8, np.array(keep))
    assert po.Restriction(8, jnp.array(3)) == po.Restriction(8, 3)
    np.testing.assert_array_equal(po.Restriction(8, jnp.array(keep)) @ jnp.arange(8.0, dtype=jnp.float32), [0, 2, 7])


def test_a_traced_scale_inverts_under_jit():
    F = po.DFT(8)
    x = jnp.arange(8, dtype=jnp.complex64)
    y = jax.jit(lambda c: (c * F).inverse() @ (c * F @ x))(jnp.float32(2))
    np.testing.assert_allclose(y, x, atol=1e-5)


def test_weights_that_are_not_arrays_are_a_type_error():
    message = (r"parameter 'w' of Matrix\(4×4 'w'\) must be a JAX or NumPy array of shape \(4, 4\) and "
               r"dtype float32, got a list; convert it with jnp.asarray\(value, 'float32'\)$")
    M = po.Matrix(4, 4, name="w")
    with pytest.raises(TypeError, match=r"^Matrix\(4×4 'w'\): " + message):
        M({"w": [[1.0] * 4] * 4}) @ jnp.ones(4, jnp.float32)
    D = po.distribute(po.kron(po.Matrix(4, 4, name="w"), po.Identity(8)), (1, 2))
    with pytest.raises(TypeError, match=r"^distribute\(.*\): " + message.rstrip("$")):  # (+ JAX's note)
        D({"w": [[1.0] * 4] * 4}) @ jnp.ones((4, 8), jnp.float32)
    np.testing.assert_allclose(M({"w": np.eye(4, dtype=np.float32)}) @ jnp.ones(4, jnp.float32), np.ones(4))


@pytest.mark.parametrize("key, got", [
    (0, "int 0"),  # a seed, not a key
    (jax.random.split(jax.random.key(0), 2), "a key array of shape (2,)"),
    (np.zeros(3, np.uint32), "an array of shape (3,) and dtype uint32"),
])
def test_a_key_that_is_not_one_random_key_is_a_type_error(key, got):
    A = po.kron(po.Matrix(4, 4, name="w"), po.Identity(8))
    D = po.distribute(A, (1, 2))
    model = FNO((8,), width=4, modes=(2,), layers=1)
    for init, where in [(lambda k: po.init(A, k), f"po.init({A!r})"), (lambda k: po.init(D, k), f"po.init({D!r})"),
                        (model.init, "FNO.init")]:
        with pytest.raises(TypeError) as info:
            init(key)
        assert str(info.value) == (f"{where}: key must be one JAX random key, jax.random.key(0) "
                                   f"(or jax.random.PRNGKey(0)), got {got}")
    raw, typed = po.init(A, jax.random.PRNGKey(3)), po.init(A, jax.random.key(3))  # the two kinds of key agree
    np.testing.assert_array_equal(raw["w"], typed["w"])
    keys = jax.random.split(jax.random.key(0), 2)
    assert jax.vmap(lambda k: po.init(A, k))(keys)["w"].shape == (2, 4, 4)  # one key per call, under vmap


def test_a_dry_run_optimizer_that_is_not_a_gradient_transformation_is_a_type_error():
    from parop.nn import dry_run

    with pytest.raises(TypeError) as info:
        dry_run(FNO((8,), width=4, modes=(2,), layers=1), 2, optimizer="adam")
    assert str(info.value) == ("dry_run: optimizer must be an optax GradientTransformation (with init and update), "
                               "such as optax.adam(1e-3), or None for that, got str 'adam'")


def test_more_tensor_axes_than_letters():
    """31 axes: `Matrix` and `PerModeMatrix` contract with integer einsum labels."""
    rng = np.random.default_rng(0)
    W = jnp.asarray(rng.standard_normal((3, 2)))
    K = po.kron(po.Matrix(3, 2, "float64", name="m"), *[po.Identity(1, "float64")] * 30)
    x = jnp.arange(2.0).reshape((2,) + (1,) * 30)
    np.testing.assert_allclose(K({"m": W}) @ x, (W @ jnp.arange(2.0)).reshape((3,) + (1,) * 30))
    np.testing.assert_allclose(K.H({"m": W}) @ (K({"m": W}) @ x), (W.T @ W @ jnp.arange(2.0)).reshape(x.shape))
    V = jnp.asarray(rng.standard_normal((3, 2, 4)))
    L = po.kron(*[po.Identity(1, "float64")] * 28, po.PerModeMatrix(3, 2, (4,), "float64", name="v"))
    z = jnp.ones((1,) * 28 + (2, 4))
    np.testing.assert_allclose((L({"v": V}) @ z).reshape(3, 4), jnp.einsum("oim,im->om", V, z.reshape(2, 4)))


def test_the_per_mode_contraction_is_one_dot_general():
    """The FNO's spectral weights, forward and adjoint: one `dot_general` each."""
    K = po.kron(po.Identity(4), po.PerModeMatrix(8, 8, (6, 5), name="pm"))
    θ = {"pm": jnp.ones((8, 8, 6, 5), jnp.complex64)}
    x = jnp.ones(K.domain_shape, jnp.complex64)
    for A in (K, K.H):
        eqns = jax.make_jaxpr(lambda t, v: A(t) @ v)(θ, x).jaxpr.eqns
        assert Counter(e.primitive.name for e in eqns)["dot_general"] == 1


def _mesh(*types: AxisType):
    return jax.make_mesh((2,) * len(types), tuple("xyz"[: len(types)]), axis_types=types,
                         devices=jax.devices()[: 2 ** len(types)])


@pytest.mark.parametrize("call, error, match", [
    (lambda: po.distribute(po.DFT(8), P(P.UNCONSTRAINED), mesh=_mesh(AxisType.Auto)), ValueError,
     r"^distribute\(DFT\(8\)\): entry 0 of P\(UNCONSTRAINED,\) is UNCONSTRAINED; parop takes None, a mesh "
     r"axis name, or a tuple of names per axis \(not PartitionSpec.UNCONSTRAINED: the planner fixes every layout\)$"),
    (lambda: po.distribute(po.kron(po.DFT(8), po.Identity(8)), (2, 1), out_partition=P(None, 1), mesh=_mesh(AxisType.Auto)),
     ValueError, r"entry 1 of P\(None, 1\) is 1; parop takes None, a mesh axis name"),
    (lambda: po.distribute(po.DFT(8), (2,), mesh="x"), TypeError,
     r"^distribute\(DFT\(8\)\): mesh must be a jax.sharding.Mesh, got str 'x'$"),
    (lambda: po.distribute(po.kron(po.DFT(8), po.DFT(8)), P("x", "y"), mesh=_mesh(AxisType.Explicit, AxisType.Auto)),
     ValueError, r"^distribute\(DFT\(8\) ⊗ DFT\(8\)\): the mesh mixes Explicit axes \['x'\] and Auto axes \['y'\]; "
     r"parop supports meshes whose axes are all Auto or all Explicit$"),
    (lambda: po.distribute(po.DFT(8), P(), mesh=_mesh(AxisType.Manual)), ValueError,
     r"^distribute\(DFT\(8\)\): mesh axes \['x'\] are Manual \(as inside a shard_map\); parop's program is "
     r"itself a shard_map over the mesh: give a mesh whose axes are all Auto or all Explicit$"),
    # an output axis that the output partition splits unevenly: it named the operator's whole axes, not the size
    (lambda: po.distribute(po.kron(po.Matrix(8, 8), po.DFT(8, dtype=jnp.float32)), (2, 1), out_partition=(1, 2)),
     ValueError, r"^distribute\(Matrix\(8×8\) ⊗ rDFT\(8\)\): out_partition: output axis 1 of size 5 cannot be split "
     r"in 2: split it in one of \[1, 5\]$"),
    # a spec longer than the tensor it lays out: it said "an input" of a weight's or the output's spec
    (lambda: po.distribute(po.kron(po.Matrix(4, 4, name="m"), po.Diagonal(4, name="d")), (2, 1),
                           weights={"d": P(None, "d0")}), ValueError,
     r"^distribute\(.*\): weights\['d'\]: P\(None, 'd0'\) has 2 entries for a weight of 1 axes$"),
    (lambda: po.distribute(po.kron(po.DFT(8), po.Identity(8)), P("x"), mesh=_mesh(AxisType.Auto),
                           out_partition=P(None, None, "x")), ValueError,
     r"^distribute\(DFT\(8\) ⊗ I\(8\)\): out_partition: P\(None, None, 'x'\) has 3 entries for an output of 2 "
     r"axes$"),
    (lambda: po.distribute(po.kron(po.DFT(8, dtype=jnp.float32), po.Identity(8)), P(None, "x", "y"),
                           mesh=_mesh(AxisType.Auto, AxisType.Auto), out_partition=P(("x", "y"))), ValueError,
     r"^distribute\(rDFT\(8\) ⊗ I\(8\)\): out_partition: output axis 0 of size 5 cannot be split in 4: split it "
     r"in one of \[1, 5\]$"),
])
def test_bad_distribute_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- 4. dtype=None ---------------------------------------------------------------------------------

@pytest.mark.parametrize("build, default", [
    (lambda dtype: po.DFT(8, dtype=dtype), "complex64"),
    (lambda dtype: po.Matrix(3, 2, dtype=dtype, name="m"), "float32"),
    (lambda dtype: po.Diagonal(3, dtype=dtype, name="d"), "float32"),
    (lambda dtype: po.PerModeMatrix(3, 2, (4,), dtype=dtype, name="p"), "complex64"),
    (lambda dtype: po.Identity(3, dtype=dtype), "float32"),
    (lambda dtype: po.Restriction(8, [0, 2], dtype=dtype), "float32"),
    (lambda dtype: po.Reduce(3, dtype=dtype), "float32"),
])
def test_dtype_none_is_the_default(build, default):
    op = build(None)
    assert op.dtype == np.dtype(default) and op == build(default)


# -- every argument of every constructor, given odd values ------------------------------------

ODD_VALUES = [0, -1, 2.5, True, "3", "", None, (3,), (0, 3), [], float("nan"), 1j, "float16", "int32", "zero",
              np.float32, object(), slice(None), np.array(3), np.ones((2, 2)), np.int64(3)]
CONSTRUCTORS = {
    "DFT": (po.DFT, dict(n=4, dtype="complex64", norm="backward")),
    "Matrix": (po.Matrix, dict(m=3, n=4, dtype="float32", name=None)),
    "Identity": (po.Identity, dict(n=4, dtype="float32")),
    "Diagonal": (po.Diagonal, dict(n=4, dtype="float32", name=None)),
    "Reduce": (po.Reduce, dict(n=4, dtype="float32")),
    "Restriction": (po.Restriction, dict(n=4, keep=[0, 2], dtype="float32")),
    "PerModeMatrix": (po.PerModeMatrix, dict(c_out=2, c_in=3, modes=(2, 3), dtype="complex64", name=None)),
    "Convolution": (po.Convolution, dict(c_out=2, c_in=3, kernel=(3, 3), grid=(8, 8), boundary="periodic",
                                         dtype="float32", name=None)),
    "Stencil": (po.Stencil, dict(weights=np.ones((3, 3), np.float32), grid=(8, 8), boundary="periodic", dtype=None)),
    "FNO": (FNO, dict(grid=(8, 8), width=4, modes=(2, 2), layers=1, in_channels=1, out_channels=1,
                      projection=4, dtype="float32", local_kernel=None, remat=False)),
}


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_every_argument_given_an_odd_value_is_named_or_taken(name):
    """Each argument of each constructor, given each of `ODD_VALUES` (the others left at
    good values): the constructor either builds an operator whose shapes are tuples of
    Python ints, or raises a `ValueError` or `TypeError` whose message starts with the
    class's name: never another exception (a NumPy or Python error from deep inside)."""
    make, good = CONSTRUCTORS[name]
    for argument in good:
        for value in ODD_VALUES:
            try:
                built = make(**{**good, argument: value})
            except (ValueError, TypeError) as error:
                assert str(error).startswith(f"{name}:"), (argument, value, str(error))
                continue
            shapes = (built.grid, built.modes) if name == "FNO" else (built.domain_shape, built.range_shape)
            assert all(type(n) is int for shape in shapes for n in shape), (argument, value, shapes)


def test_the_dot_test_refuses_what_would_pass_vacuously():
    """An empty batch gave a mismatch of 0.0 (nothing compared); a batch size, a key or
    an operator of the wrong kind failed deep inside."""
    with pytest.raises(ValueError, match=r"^dot_test: batch_shape: batch sizes must be positive .* got \(0,\)"):
        po.testing.dot_test(po.DFT(4), batch_shape=(0,))
    with pytest.raises(TypeError, match=r"^dot_test: batch_shape takes a tuple of batch sizes \(ints\), got 4"):
        po.testing.dot_test(po.DFT(4), batch_shape=4)
    with pytest.raises(TypeError, match=r"^dot_test takes a parop operator, got ndarray"):
        po.testing.dot_test(np.eye(4))
    for key in (0, jax.random.split(jax.random.key(0), 2)):  # an int seed failed inside jax.random
        with pytest.raises(TypeError, match=r"^dot_test: key must be one JAX random key"):
            po.testing.dot_test(po.DFT(4), key=key)
    assert po.testing.dot_test(po.DFT(4), key=jax.random.PRNGKey(3)) < 1e-6
    assert po.testing.dot_test(po.DFT(4), batch_shape=[np.int64(2)]) < 1e-6


def test_the_dense_matrix_of_a_large_operator_is_refused_with_its_size():
    """`po.to_dense(po.DFT(2**17))` asked XLA for a 128 GiB identity and matrix: an
    allocation error where the memory is limited, and where it is not (overcommitted),
    an out-of-memory kill of the process. Past `max_bytes` (1 GiB by default) it is a
    `ValueError` naming the matrix's shape, dtype and size; `max_bytes` lets a larger
    one through, and an operator of the wrong kind is a `TypeError`."""
    with pytest.raises(ValueError, match=r"^to_dense\(DFT\(131072\)\): its matrix is 131072 x 131072 complex64 "
                                         r"\(128\.0 GiB\), more than max_bytes=1073741824 \(1\.0 GiB\)"):
        po.to_dense(po.DFT(2**17))
    real_to_complex = po.DFT(4, "float64")  # a real domain, a complex range: a complex matrix
    with pytest.raises(ValueError, match=r"its matrix is 3 x 4 complex128 \(192 B\), more than max_bytes=191"):
        po.to_dense(real_to_complex, max_bytes=191)
    assert po.to_dense(real_to_complex, max_bytes=np.int64(192)).shape == (3, 4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"^to_dense: max_bytes must be a positive int"):
            po.to_dense(po.DFT(4), max_bytes=bad)
    with pytest.raises(TypeError, match=r"^to_dense takes a parop operator, got ndarray"):
        po.to_dense(np.eye(4))


def test_every_weight_sharded_with_no_tensor_parallel_form_says_why():
    """`shard_weights=True` where the only mesh axis big enough for the `Matrix`'s rows
    already splits the other axis and its columns (3) take no split of 2: no plan, and
    the error names the `Matrix`, its two forms and `shard_weights='auto'` (which keeps
    the weight whole and plans)."""
    op = po.kron(po.Matrix(8, 3, "float64", name="w"), po.Identity(8, "float64"))
    assert po.distribute(op, (1, 2)).plan.weight_placements == {"w": P(None, None)}
    with pytest.raises(ValueError, match=r"no plan exists .*: with shard_weights=True Matrix\(8×3 'w'\) must run "
                                         r"column-parallel .* or row-parallel .*; shard_weights='auto' may keep a "
                                         r"weight whole"):
        po.distribute(op, (1, 2), shard_weights=True)
