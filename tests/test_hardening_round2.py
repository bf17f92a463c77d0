"""Hardening, round two: bad input, exact adjoints of complex scalars, sharded
initialisers, empty batches, padded sums, and the messages users read.

Items covered elsewhere (not repeated here): the FNO's modes errors
(tests/test_fno.py::test_bad_arguments; only the full message of `modes=(20, 4)` is
checked here), `dtype=None` (tests/test_bad_input.py::test_dtype_none_is_the_default),
queued distributed calls in `parop.nn.evaluate` (tests/test_train.py), planning time
(tests/test_planner.py), mixed Explicit/Auto and Manual mesh axes, half precisions,
integer input and the unchecked arguments (tests/test_bad_input.py), the training
helpers' arguments (tests/test_train.py).
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

import parop as po
from parop.nn import FNO
from parop.params import name_key
from reference import close_to, random_array, random_params

RNG = np.random.default_rng
TOL = {"float32": 1e-5, "float64": 1e-12}


def rfft_matrix(n: int) -> np.ndarray:
    return np.fft.rfft(np.eye(n), axis=0)


def fft_matrix(n: int) -> np.ndarray:
    return np.fft.fft(np.eye(n), axis=0)


# -- 1. complex scalars on real-domain operators --------------------------------------------------

def test_a_complex_multiple_of_a_real_dft():
    """`A = 2j * po.DFT(8, dtype=jnp.float32)`: the dot test is small, `A.H` maps back to
    float32 (`(A.H @ y).dtype == A.H.range_dtype == float32`) and is `Re(Mᴴ (-2j) y)`."""
    A = 2j * po.DFT(8, dtype=jnp.float32)
    assert po.testing.dot_test(A) < 1e-6
    y = jnp.asarray(random_array(RNG(0), (5,), np.complex64))
    assert (A.H @ y).dtype == A.H.range_dtype == jnp.float32
    M = rfft_matrix(8)
    close_to(A.H @ y, (M.conj().T @ (-2j * np.asarray(y, np.complex128))).real, TOL["float32"])
    x = random_array(RNG(1), (8,), np.float32)
    close_to(A @ x, 2j * np.fft.rfft(x.astype(np.float64)), TOL["float32"])


def test_a_complex_multiple_of_a_kron_with_a_real_dft_distributed():
    """`po.distribute((1+1j) * po.kron(po.DFT(8), F), (2, 1))` with `F = po.DFT(6,
    jnp.float32)`: the dot test is small, forward and adjoint equal NumPy."""
    F = po.DFT(6, jnp.float32)
    D = po.distribute((1 + 1j) * po.kron(po.DFT(8), F), (2, 1))
    assert po.testing.dot_test(D) < 1e-6
    x = random_array(RNG(2), (8, 6), np.float32)
    close_to(D @ x, (1 + 1j) * np.fft.rfftn(x.astype(np.float64)), TOL["float32"])
    y = random_array(RNG(3), (8, 4), np.complex64)
    M = np.kron(fft_matrix(8), rfft_matrix(6))
    want = (M.conj().T @ ((1 - 1j) * y.astype(np.complex128).reshape(32))).real.reshape(8, 6)
    back = D.H @ y
    assert back.dtype == np.float32
    close_to(back, want, TOL["float32"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adjoints_of_complex_scalars_on_real_dfts_are_exact(dtype):
    """`(F + 1j*F).H`, `po.kron(2j*F, po.DFT(4)).H` and `F.H @ (2j*F)` build, and each
    equals the exact adjoint (the real inner product) computed in NumPy: for `A` with
    complex matrix `N` and a real domain, `A.H y = Re(Nᴴ y)`."""
    cdtype = {"float32": "complex64", "float64": "complex128"}[dtype]
    F = po.DFT(6, dtype)
    M = rfft_matrix(6)
    y = random_array(RNG(4), (4,), cdtype)
    y2 = random_array(RNG(5), (4, 4), cdtype)
    x = random_array(RNG(6), (6,), dtype)

    S = (F + 1j * F).H
    assert (S.dtype, S.range_dtype) == (np.dtype(cdtype), np.dtype(dtype))
    close_to(S @ y, (((1 + 1j) * M).conj().T @ y).real, TOL[dtype])
    K = po.kron(2j * F, po.DFT(4, cdtype)).H
    assert (K.domain_shape, K.range_shape, K.range_dtype) == ((4, 4), (6, 4), np.dtype(dtype))
    N = np.kron(2j * M, fft_matrix(4))
    close_to(K @ y2, (N.conj().T @ y2.reshape(16)).real.reshape(6, 4), TOL[dtype])
    C = F.H @ (2j * F)
    assert (C.dtype, C.range_dtype) == (np.dtype(dtype), np.dtype(dtype))
    close_to(C @ x, (M.conj().T @ (2j * M @ x)).real, TOL[dtype])  # = 0: Mᴴ M is real
    for op in (S, K, C):
        assert po.testing.dot_test(op) < 10 * TOL[dtype], op


# -- 2. the FNO's modes ---------------------------------------------------------------------------

def test_fno_modes_too_large_names_the_axis_its_size_and_the_largest_valid_modes():
    """`FNO(grid=(8, 8), modes=(20, 4))` (tests/test_fno.py checks only the start of this
    message; `modes=(10, 4)` in full)."""
    with pytest.raises(ValueError) as info:
        FNO(grid=(8, 8), modes=(20, 4))
    assert str(info.value) == ("FNO: modes[0] = 20 on axis 0 of size 8 would keep frequencies twice; the "
                               "largest valid count there is 8 (modes at most (8, 9))")


# -- 4. names whose crc32 collide ----------------------------------------------------------------------

def test_names_with_colliding_crc32_give_different_weights():
    """"plumless" and "buckeroo" collide under crc32; their weights differ (serial, in one
    operator, and distributed), and each depends only on its name."""
    assert zlib.crc32(b"plumless") == zlib.crc32(b"buckeroo")
    key = jax.random.key(0)
    a = po.init(po.Matrix(4, 4, name="plumless"), key)["plumless"]
    b = po.init(po.Matrix(4, 4, name="buckeroo"), key)["buckeroo"]
    assert not np.any(np.asarray(a) == np.asarray(b))
    both = po.kron(po.Matrix(4, 4, name="plumless"), po.Matrix(4, 4, name="buckeroo"))
    θ = po.init(both, key)
    np.testing.assert_array_equal(θ["plumless"], a)
    np.testing.assert_array_equal(θ["buckeroo"], b)
    θd = po.init(po.distribute(both, (2, 2)), key)
    np.testing.assert_array_equal(θd["plumless"], a)
    np.testing.assert_array_equal(θd["buckeroo"], b)


# -- 5. sharded weights are initialised shard by shard ------------------------------------------------

@pytest.fixture
def compiled_initialisers(monkeypatch):
    """Records `(out_shardings, compiled.memory_analysis())` of every `jax.jit` made while
    the test patches it in (the initialisers `po.init` and `FNO.init` build), and runs
    the compiled program."""
    seen = []
    real = jax.jit

    def recording(f, **kwargs):
        jitted = real(f, **kwargs)

        def call(*args):
            compiled = jitted.lower(*args).compile()
            seen.append((kwargs.get("out_shardings"), compiled.memory_analysis()))
            return compiled(*args)

        return call

    def patch():
        monkeypatch.setattr(jax, "jit", recording)
        seen.clear()
        return seen

    yield patch


def per_device(stats) -> int:
    """Bytes a device holds for the initialiser: its output and its temporaries."""
    return stats.output_size_in_bytes + stats.temp_size_in_bytes


def test_po_init_draws_a_sharded_weight_shard_by_shard(compiled_initialisers, monkeypatch):
    """For `po.distribute(po.kron(po.Matrix(m, n, name="big"), po.Identity(8)), (1, 8),
    shard_weights=True)` at 4096 x 4096 (64 MiB in float32), the initialiser `po.init`
    compiles outputs one eighth of the weight per device and needs, with its
    temporaries, an eighth of what the serial initialiser needs; the values are the
    serial `po.init`'s."""
    m = n = 4096
    D = po.distribute(po.kron(po.Matrix(m, n, name="big"), po.Identity(8)), (1, 8), shard_weights=True)
    sharding = D.param_shardings()["big"]
    assert sharding.spec == P(None, "d1")
    key = jax.random.key(0)

    seen = compiled_initialisers()
    θd = po.init(D, key)
    ((out, sharded),) = seen
    seen = compiled_initialisers()
    θ = po.init(po.Matrix(m, n, name="big"), key)
    ((_, whole),) = seen
    monkeypatch.undo()

    assert out == {"big": sharding} and θd["big"].sharding == sharding
    assert {s.data.shape for s in θd["big"].addressable_shards} == {(m, n // 8)}
    assert sharded.output_size_in_bytes == m * n * 4 // 8
    assert whole.output_size_in_bytes == m * n * 4
    assert per_device(sharded) * 8 <= 1.001 * per_device(whole), (per_device(sharded), per_device(whole))
    np.testing.assert_array_equal(np.asarray(θd["big"]), np.asarray(θ["big"]))


def test_po_init_of_a_combination_draws_each_weight_where_its_program_keeps_it(compiled_initialisers,
                                                                            monkeypatch):
    """`po.init` of operators distributed apart and combined (`DB @ DA + 2 DA`, unnamed
    leaves that the combination names) draws each weight with the sharding of the
    program that takes it (the first, where two do): `DA`'s `Diagonal` split over
    `('a', 'b')`, `DB`'s `Matrix` split by columns over `c` (row-parallel). The values
    are the serial combination's. (It drew them whole on one device, to be moved at
    every call.)"""
    mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)
    A = po.kron(po.Diagonal(8), po.Identity(8))
    B = po.kron(po.Identity(8), po.Matrix(8, 8))
    DA = po.distribute(A, P(("a", "b"), "c"), mesh=mesh)
    DB = po.distribute(B, P(("a", "b"), "c"), mesh=mesh, shard_weights=True)
    E = DB @ DA + 2 * DA
    key = jax.random.key(3)
    seen = compiled_initialisers()
    θ = po.init(E, key)
    monkeypatch.undo()
    wanted = {"Matrix_0": P(None, "c"), "Diagonal_0": P(("a", "b"))}
    assert {name: value.sharding.spec for name, value in θ.items()} == wanted
    ((out, _),) = seen  # one program draws both, each into its own sharding
    assert {name: sharding.spec for name, sharding in out.items()} == wanted
    serial = po.init(B @ A + 2 * A, key)
    assert sorted(serial) == sorted(θ)
    for name in serial:
        np.testing.assert_array_equal(np.asarray(θ[name]), np.asarray(serial[name]))
    with pytest.raises(ValueError, match="AbstractMesh"):
        po.init(po.distribute(A, (2, 4), mesh=AbstractMesh((2, 4), ("d0", "d1"))), key)


def test_fno_init_draws_the_spectral_weights_shard_by_shard(compiled_initialisers, monkeypatch):
    """`FNO.distribute(...).init`: the spectral weights (64 x 64 x 8 x 8 complex64, split
    in 8 along the kept modes) are drawn on each device's shard: the output is an
    eighth, output + temporaries an eighth of the serial initialiser's; every parameter
    equals the serial `init`'s."""
    model = FNO((16, 16), width=64, modes=(8, 14), layers=1, projection=8)
    dist = model.distribute((1, 1, 2, 4))
    spec = dist.param_shardings()["spectral0"].spec
    assert spec == P(None, None, None, ("d2", "d3"))
    key = jax.random.key(0)

    seen = compiled_initialisers()
    θd = dist.init(key)
    ((outs, sharded),) = seen  # one initialiser for every parameter
    seen = compiled_initialisers()
    θ = model.init(key)
    ((_, whole),) = seen
    monkeypatch.undo()

    spectral = θ["spectral0"].nbytes
    rest = sum(v.nbytes for k, v in θ.items() if k != "spectral0")  # replicated: each device holds them
    assert outs["spectral0"].spec == spec and θd["spectral0"].sharding.spec == spec
    table = 8 * len(θ)  # the output tuple's pointers
    assert sharded.output_size_in_bytes == spectral // 8 + rest + table
    assert whole.output_size_in_bytes == spectral + rest + table
    # an eighth of the serial initialiser's bytes, up to the small replicated parameters' temporaries
    assert per_device(sharded) * 8 <= 1.1 * per_device(whole), (per_device(sharded), per_device(whole))
    assert set(θd) == set(θ)
    for name in θ:
        np.testing.assert_array_equal(np.asarray(θd[name]), np.asarray(θ[name]), err_msg=name)


# -- 9. an empty batch --------------------------------------------------------------------------------

@pytest.mark.parametrize("partition", [None, (1, 1, 2, 2, 2), (2, 1, 4, 1, 1)])
def test_fno_init_draws_each_weight_as_jax_random_draws_it(partition):
    """`FNO.init` draws each weight at a shape with the axes its placement leaves whole
    merged (it compiles faster), and reshapes: every value is the one `jax.random`
    draws at the weight's own shape from the weight's key, serial or distributed (so
    checkpoints and results do not depend on how the draw was shaped)."""
    model = FNO((8, 6, 6), width=4, modes=(4, 4, 4), layers=1, projection=8, local_kernel=3)
    net = model if partition is None else model.distribute(partition)
    key = jax.random.key(7)
    θ = net.init(key)
    draws = model._draws()
    assert {name for name, *_ in draws} == set(θ)
    for name, shape, dtype, kind, bound in draws:
        k = name_key(key, name)
        if kind == "spectral":
            expected = jax.lax.complex(*(jax.random.uniform(k, (2,) + shape, dtype) / bound))
        else:
            expected = jax.random.uniform(k, shape, dtype, -bound, bound)
        np.testing.assert_array_equal(np.asarray(θ[name]), np.asarray(expected), err_msg=name)


@pytest.mark.parametrize("partition", [(2, 1), (2, 1, 2)], ids=["batch not named", "batch named"])
def test_an_empty_batch_gives_the_empty_result(partition):
    """`D @ x` with `x` of shape `domain + (0,)` (and flat `(N, 0)`) returns the empty
    result of the serial operator's shape and dtype, forward and adjoint, also where
    the partition names (splits) the batch axis."""
    op = po.kron(po.DFT(8, "float32"), po.Matrix(3, 4, name="w"))
    θ = po.init(op, jax.random.key(0))
    D = po.distribute(op, partition)
    x = jnp.zeros((8, 4, 0), jnp.float32)
    y, serial = D(θ) @ x, op(θ) @ x
    assert y.shape == serial.shape == (5, 3, 0) and y.dtype == serial.dtype == np.complex64
    flat = D(θ) @ jnp.zeros((32, 0), jnp.float32)
    assert flat.shape == (15, 0) and flat.dtype == np.complex64
    back = D.H(θ) @ jnp.zeros((5, 3, 0), jnp.complex64)
    assert back.shape == (8, 4, 0) and back.dtype == np.float32
    y = D(θ) @ random_array(RNG(7), (8, 4, 2), np.float32)  # and a non-empty batch still runs
    assert y.shape == (5, 3, 2)


def test_an_empty_batch_through_combinations_of_distributed_operators():
    """The same inside `D.T`, `2 * D`, `c * D`, `D2 @ D1` and `D1 + D2`, which apply their
    distributed parts directly (a `ZeroDivisionError` from the planner's cost model
    before the fix in `DistributedOperator._apply`)."""
    op1 = po.kron(po.DFT(8, "complex128"), po.Identity(4, "complex128"))
    op2 = po.kron(po.Identity(8, "complex128"), po.DFT(4, "complex128"))
    D1, D2 = po.distribute(op1, (2, 1)), po.distribute(op2, (2, 1))
    x = jnp.zeros((8, 4, 0), jnp.complex128)
    for D, serial in [(D1.T, op1.T), (2 * D1, 2 * op1), (jnp.complex128(1j) * D1, jnp.complex128(1j) * op1),
                      (D2 @ D1, op2 @ op1), (D1 + D2, op1 + op2), ((D2 @ D1).H, (op2 @ op1).H)]:
        y, want = D @ x, serial @ x
        assert y.shape == want.shape == (8, 4, 0) and y.dtype == want.dtype == np.complex128, D
    assert not D1.programs.kept and not D2.programs.kept  # nothing planned or lowered for them


# -- 10. sums on a padded axis; out_partition on other mesh axes ----------------------------------------

def test_a_sum_of_pointwise_terms_on_a_padded_axis_plans_and_equals_serial():
    """`up @ (P1 + P2) @ down` on (1, 4, 1): a real-FFT axis kept to 7 modes takes the
    4-way split (padded to 8), where the two Diagonal terms of the sum run; forward,
    adjoint and gradient equal serial and NumPy."""
    R = po.Restriction(9, slice(0, 7), "float64")
    down = po.kron(po.Identity(2, "float64"), po.DFT(16, "complex128"), R @ po.DFT(16, "float64"))
    P1 = po.kron(po.Identity(2, "complex128"), po.Diagonal(16, "complex128", name="d1"),
                 po.Diagonal(7, "complex128", name="e1"))
    P2 = po.kron(po.Identity(2, "complex128"), po.Identity(16, "complex128"), po.Diagonal(7, "complex128", name="e2"))
    up = po.kron(po.Identity(2, "float64"), po.DFT(16, "complex128").inverse(), po.DFT(16, "float64").inverse() @ R.H)
    op = up @ (P1 + P2) @ down
    D = po.distribute(op, (1, 4, 1))
    text = str(D.plan)
    assert "sum of 2 terms" in text and "axis 2 padded with 1 zeros" in text and "axis 2 cropped to 7" in text
    θ = random_params(op, 8)
    x = random_array(RNG(9), (2, 16, 16), np.float64)
    spectrum = np.fft.fft(np.fft.rfft(x, axis=2)[..., :7], axis=1)
    d1, e1, e2 = (np.asarray(θ[k]) for k in ("d1", "e1", "e2"))
    full = np.zeros((2, 16, 9), complex)
    full[..., :7] = (d1[:, None] * e1[None, :] + e2[None, :]) * spectrum
    want = np.fft.irfft(np.fft.ifft(full, axis=1), 16, axis=2)
    y = D(θ) @ x
    close_to(y, want, 1e-12)
    close_to(y, op(θ) @ x, 1e-12)
    c = random_array(RNG(10), (2, 16, 16), np.float64)
    close_to(D.H(θ) @ c, op.H(θ) @ c, 1e-12)
    loss = lambda A: (lambda θ: jnp.sum(jnp.asarray(c) * (A(θ) @ x)))  # noqa: E731
    g, r = jax.grad(loss(D))(θ), jax.grad(loss(op))(θ)
    for name in θ:
        close_to(g[name], r[name], 1e-12)


def test_an_out_partition_on_other_mesh_axes_is_a_clear_error():
    """`out_partition=P("b")` with input `P("a")` on a mesh (a, b): a `ValueError` naming
    the mesh axis the output leaves out."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    with pytest.raises(ValueError) as info:
        po.distribute(po.DFT(8), P("a"), mesh=mesh, out_partition=P("b"))
    assert str(info.value) == (
        "distribute(DFT(8)): out_partition P('b',) leaves out mesh axes ['a'] that the input P('a',) splits over: "
        "parop moves a split from one tensor axis to another (or sums it away in a Reduce); it never gathers a "
        "split onto every device")


# -- 11-14. calls not covered elsewhere -----------------------------------------------------

def test_a_3d_fno_with_default_modes_builds_and_runs():
    """`FNO(grid=(8, 8, 8))` is a valid 3-D model: default modes (every frequency of the
    grid), its parameters' shapes, and a forward pass of the right shape that depends on
    its input. (Random parameters, not `model.init`: XLA:CPU takes about 2 s to compile
    the draw of each 6-D spectral weight; `init` of 3-D models is tested in
    tests/test_fno.py.)"""
    model = FNO(grid=(8, 8, 8))
    assert model.modes == (8, 8, 9)
    leaves = model.parameters
    assert leaves["spectral0"].param_shape == (32, 32, 8, 8, 5) and leaves["spectral0"].param_dtype == np.complex64
    θ = {name: jnp.asarray(0.1 * random_array(RNG(i), leaf.param_shape, leaf.param_dtype))
         for i, (name, leaf) in enumerate(sorted(leaves.items()))}
    θ.update({f"{name}.bias": jnp.zeros(leaf.param_shape[0], np.float32)
              for name, leaf in leaves.items() if not name.startswith("spectral")})
    a = jnp.asarray(random_array(RNG(11), (2, 1, 8, 8, 8), np.float32))
    u = jax.jit(model.apply)(θ, a)
    assert u.shape == (2, 1, 8, 8, 8) and u.dtype == np.float32
    assert np.all(np.isfinite(np.asarray(u)))
    assert float(jnp.abs(u[0] - u[1]).max()) > 1e-6
