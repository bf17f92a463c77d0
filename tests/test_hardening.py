"""Hardening of `po.distribute`: determinism, per-device memory, and the errors for
sizes a split does not divide.

- `po.init(po.distribute(op, p), key)` is bit for bit `po.init(op, key)`, whatever the
  partition; repeated calls of a distributed operator give bit-identical results.
- A distributed 3-D DFT's per-device temporaries stay within a small multiple of the
  local shard (no hidden gather or full-size temporary), read from
  `compiled.memory_analysis()`.
- parop rejects sizes a split does not divide, with an error that names the axis, the
  size, the split and the nearest sizes that work (and those sizes do work).
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import parop as po
from conftest import LONG
from reference import pairing, random_array, random_params


def host(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


def assert_bit_identical(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), "not bit-identical"


# -- determinism: po.init -----------------------------------------------------------------------

def _fno_like():
    return (po.kron(po.Matrix(8, 8, "float32", name="lift"), po.Identity(16, "float32"), po.Identity(8, "float32"))
            + po.kron(po.Matrix(8, 8, "float32"), po.Diagonal(16, "float32"), po.Identity(8, "float32")))


INIT_CASES = {
    "matrix-identity": (lambda: po.kron(po.Matrix(12, 12, "float32", name="w"), po.Identity(8, "float32"), po.Identity(4, "float32")),
                        [(1, 1, 1), (2, 1, 1), (1, 2, 4), (4, 2, 1), (1, 8, 1), (2, 2, 2), (1, 1, 4, 2)]),
    "shared-weight": (lambda: (lambda M: po.kron(M, po.Identity(8, "float64")) @ po.kron(M.H, po.Diagonal(8, "float64", name="d")))(
                          po.Matrix(8, 8, "float64", name="shared")),
                      [(1, 1), (2, 4), (8, 1), (1, 8), (4, 2, 1), (1, 1, 8)]),
    "complex-mixed": (lambda: po.kron(po.Matrix(6, 4, "complex128", name="a"), po.Diagonal(8, "complex128", name="b"),
                                      po.DFT(8, "complex128")),
                      [(1, 1, 1), (2, 4, 1), (4, 2, 1), (1, 8, 1), (2, 2, 2)]),
    "per-mode": (lambda: po.PerModeMatrix(4, 3, (8, 8), "complex64", name="pm"),
                 [(1, 1, 1), (1, 2, 4), (1, 8, 1), (1, 4, 2)]),
    "fno-like": (_fno_like, [(1, 1, 1), (2, 2, 2), (1, 4, 2), (8, 1, 1), (1, 1, 1, 8)]),
}


@pytest.mark.parametrize("label", sorted(INIT_CASES))
def test_init_is_bit_identical_whatever_the_partition(label):
    make, partitions = INIT_CASES[label]
    op = make()
    key = jax.random.key(42)
    serial = host(po.init(op, key))
    assert serial and all(v.size for v in serial.values())
    # three partitions each in the README's test command, all of them in the long pass
    for partition in partitions if LONG else partitions[:3]:
        for shard in ("auto", False):
            D = po.distribute(op, partition, out_partition="auto", shard_weights=shard)
            θ = po.init(D, key)
            assert sorted(θ) == sorted(serial), (partition, sorted(θ))
            for name, value in θ.items():
                assert value.sharding.mesh == D.mesh
                assert_bit_identical(value, serial[name])
            # and the arrays are usable as they are placed
            D(θ) @ jnp.zeros(D.domain_shape + (8,) * D.n_batch, D.dtype)
    # the same key gives the same values again; another key other random weights
    for k, v in host(po.init(op, key)).items():
        assert_bit_identical(v, serial[k])
    other = host(po.init(op, jax.random.key(43)))
    random = [k for k, v in serial.items() if not np.all(v == 1)]  # a Diagonal starts at ones
    assert random and all(not np.array_equal(other[k], serial[k]) for k in random)


def test_init_on_user_meshes_and_partition_specs_is_bit_identical():
    op = po.kron(po.Matrix(8, 8, "float32", name="w"), po.Diagonal(16, "float32", name="d"), po.Identity(4, "float32"))
    key = jax.random.key(7)
    serial = host(po.init(op, key))
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type,) * 2)
        for spec in (P("a", "b"), P(None, ("a", "b")), P("b", None, "a"), P(None, None, None, ("b", "a"))):
            D = po.distribute(op, spec, mesh=mesh, out_partition="auto")
            θ = po.init(D, key)
            for name, value in θ.items():
                assert_bit_identical(value, serial[name])


def test_init_of_the_adjoint_matches():
    op = po.kron(po.Matrix(6, 8, "float64", name="w"), po.Diagonal(8, "float64", name="d"))
    key = jax.random.key(3)
    D = po.distribute(op, (2, 4))
    for name, value in po.init(D.H, key).items():
        assert_bit_identical(value, po.init(op, key)[name])


# -- determinism: repeated calls ----------------------------------------------------------------

CALL_CASES = {
    "fft-3d": (lambda: po.kron(po.DFT(16, "complex128"), po.DFT(16, "complex128"), po.DFT(16, "complex128")), (2, 2, 2), ()),
    "rfft-3d": (lambda: po.kron(po.DFT(16, "complex64"), po.DFT(8, "complex64"), po.DFT(16, "float32")), (2, 4, 1), ()),
    "reduce-psum": (lambda: po.kron(po.Reduce(8, "float64"), po.Matrix(4, 4, "float64", name="m")), (8, 1), ()),
    "row-parallel": (lambda: po.kron(po.Matrix(8, 16, "float32", name="rp"), po.Identity(8, "float32")), (4, 2), ()),
    "sum-batch": (lambda: po.kron(po.Matrix(4, 4, "float64", name="s"), po.DFT(8, "float64")) + 2.0 * po.kron(po.Identity(4, "float64"), po.DFT(8, "float64")),
                  (2, 1, 4), (16,)),
}


@pytest.mark.parametrize("label", sorted(CALL_CASES))
def test_repeated_calls_are_bit_identical(label):
    make, partition, batch = CALL_CASES[label]
    op = make()
    θ = random_params(op, 0)
    θ = {k: v.astype(op.parameters[k].param_dtype) for k, v in θ.items()}
    x = jnp.asarray(random_array(np.random.default_rng(0), op.domain_shape + batch, op.dtype))
    D = po.distribute(op, partition, out_partition="auto")
    first = np.asarray(D(θ) @ x)
    again = [D(θ) @ x for _ in range(3)]
    again.append(jax.jit(lambda θ, x: D(θ) @ x)(θ, x))
    again.append(po.distribute(op, partition, out_partition="auto")(θ) @ x)  # a fresh plan and program
    for y in again:
        assert_bit_identical(y, first)
    c = jnp.asarray(random_array(np.random.default_rng(1), first.shape, first.dtype))
    back = [D.H(θ) @ c for _ in range(3)]
    for b in back[1:]:
        assert_bit_identical(b, back[0])
    loss = lambda θ, x: pairing(c, D(θ) @ x)
    grads = [jax.grad(loss, argnums=(0, 1))(θ, x) for _ in range(2)]
    grads.append(jax.jit(jax.grad(loss, argnums=(0, 1)))(θ, x))
    for g in grads[1:]:
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(grads[0])):
            assert_bit_identical(a, b)


# -- memory: no hidden gathers or full-size temporaries -----------------------------------------

def memory(D, batch=()):
    run, specs = D.program(batch)
    x = jax.ShapeDtypeStruct(D.domain_shape + batch, D.dtype)
    ws = [jax.ShapeDtypeStruct(D.op.parameters[n].param_shape, D.op.parameters[n].param_dtype) for n, _ in specs]
    return run.lower(x, *ws).compile().memory_analysis()


def local_bytes(shape, dtype, devices):
    return math.prod(shape) * np.dtype(dtype).itemsize / devices


N = 64
MEMORY_CASES = [
    ("c2c", (2, 2, 2), None), ("c2c", (2, 2, 2), "auto"), ("c2c", (8, 1, 1), None), ("c2c", (8, 1, 1), "auto"),
    ("c2c", (1, 2, 4), None), ("c2c", (1, 1, 8), "auto"), ("r2c", (2, 2, 2), "auto"), ("r2c", (8, 1, 1), None),
]


@pytest.mark.parametrize("kind, partition, out", MEMORY_CASES)
def test_3d_dft_temporaries_stay_within_a_small_multiple_of_the_shard(kind, partition, out):
    last = po.DFT(N, "complex64") if kind == "c2c" else po.DFT(N, "float32")
    F = po.kron(po.DFT(N, "complex64"), po.DFT(N, "complex64"), last)
    D = po.distribute(F, partition, out_partition=out)
    devices = D.mesh.devices.size
    assert devices == 8
    for op in (D, D.H):
        m = memory(op)
        x_local = local_bytes(op.domain_shape, op.dtype, devices)
        y_local = local_bytes(op.range_shape, op.range_dtype, devices)
        shard = max(x_local, y_local)
        full = math.prod(op.domain_shape) * np.dtype(op.dtype).itemsize
        # the program takes and returns one shard per device
        assert m.argument_size_in_bytes == x_local, (m.argument_size_in_bytes, x_local)
        assert m.output_size_in_bytes == y_local, (m.output_size_in_bytes, y_local)
        # ... and its temporaries are a few shards, far from the whole array (8 shards)
        assert m.temp_size_in_bytes <= 4 * shard, (m.temp_size_in_bytes / shard, op.plan)
        assert m.temp_size_in_bytes < full / 2


def test_gradient_program_memory_stays_local():
    """The channel-mixing layer's gradient (the seed's example) on 8 devices: no
    temporary near the size of the whole activation."""
    S = po.kron(po.Matrix(16, 16, "float32", name="mix"), po.Identity(32, "float32"), po.Identity(32, "float32"))
    D = po.distribute(S, (1, 2, 4))
    θ = po.init(D, jax.random.key(0))
    x = jnp.zeros((16, 32, 32), jnp.float32)
    grad = jax.jit(jax.grad(lambda θ, x: jnp.sum(D(θ) @ x), argnums=(0, 1)))
    m = grad.lower(θ, x).compile().memory_analysis()
    shard = local_bytes((16, 32, 32), np.float32, 8)
    assert m.temp_size_in_bytes <= 4 * shard, m.temp_size_in_bytes / shard


# -- uneven sizes: rejected with a helpful error ------------------------------------------------

def nearest(n: int, p: int) -> list[int]:
    """The multiples of `p` next to `n` (an independent statement of what parop suggests)."""
    below = (n // p) * p
    return [m for m in (below, below + p) if m > 0]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_message(e: Exception, axis: int, n: int, p: int):
    text = str(e)
    assert re.search(rf"axis {axis} of size {n} cannot be split in {p}\b", text), text
    near = nearest(n, p)
    assert f"divisible by {p}" in text, text
    assert (" or ".join(str(m) for m in near)) in text, (near, text)
    assert str(divisors(n)) in text, text


# (make(size of the uneven axis), domain, axis, split): the operator rebuilt at any size
UNEVEN_INPUT = [
    (lambda n: po.kron(po.DFT(n), po.DFT(16), po.DFT(8)), 0, 4),
    (lambda n: po.kron(po.DFT(16), po.DFT(n), po.DFT(8)), 1, 8),
    (lambda n: po.kron(po.DFT(16), po.DFT(8), po.DFT(n, "float32")), 2, 2),
    (lambda n: po.kron(po.Matrix(4, 4, "float32"), po.Identity(n, "float32")), 1, 8),
    (lambda n: po.kron(po.Matrix(4, n, "float64"), po.Diagonal(8, "float64")), 0, 2),
    (lambda n: po.kron(po.Reduce(n, "float32"), po.Identity(8, "float32")), 0, 4),
    (lambda n: po.kron(po.Restriction(n, [0, 1], "float32"), po.Identity(8, "float32")), 0, 2),
]


@pytest.mark.parametrize("make, axis, p", UNEVEN_INPUT)
@pytest.mark.parametrize("n", [3, 5, 6, 7, 9, 10, 30])
def test_uneven_input_axes_are_rejected_with_the_sizes_that_work(make, axis, p, n):
    if n % p == 0:
        pytest.skip("divides")
    op = make(n)
    partition = tuple(p if i == axis else 1 for i in range(op.ndim))
    with pytest.raises(ValueError) as info:
        po.distribute(op, partition, out_partition="auto")
    check_message(info.value, axis, n, p)
    assert repr(op) in str(info.value) or "distribute(" in str(info.value)
    # the suggested sizes work
    for m in nearest(n, p):
        po.distribute(make(m), partition, out_partition="auto")
    # the suggested splits pass the divisibility check (a plan may still need the split
    # to move to an axis it divides, which is another error)
    for d in divisors(n):
        if d <= 8:
            try:
                po.distribute(op, tuple(d if i == axis else 1 for i in range(op.ndim)), out_partition="auto")
            except ValueError as e:
                assert "cannot be split" not in str(e) and "no plan exists" in str(e), e


def test_uneven_sizes_through_a_partition_spec_and_a_user_mesh():
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    op = po.kron(po.DFT(12), po.DFT(6), po.Identity(8, "complex64"))
    with pytest.raises(ValueError) as info:
        po.distribute(op, P(None, "b"), mesh=mesh)
    check_message(info.value, 1, 6, 4)
    with pytest.raises(ValueError) as info:
        po.distribute(op, P(None, None, None, ("a", "b")), mesh=mesh)(None) @ jnp.zeros((12, 6, 8, 12), jnp.complex64)
    check_message(info.value, 3, 12, 8)
    with pytest.raises(ValueError) as info:
        po.distribute(op, (1, 1, 1, 4), mesh=mesh)(None) @ jnp.zeros((12, 6, 8, 6), jnp.complex64)
    check_message(info.value, 3, 6, 4)


UNEVEN_BATCH = [
    (lambda: po.Matrix(20, 20, "float32", name="w"), (1, 4), [(10,), (6,), (3,), (30,)]),
    (lambda: po.kron(po.DFT(8), po.DFT(8)), (1, 1, 8), [(12,), (4,), (100,)]),
    (lambda: po.kron(po.DFT(8), po.Identity(4, "complex64")), (1, 2, 2, 2), [(8, 3), (5, 4), (7, 7)]),
    (lambda: po.kron(po.Reduce(8, "float64"), po.Identity(4, "float64")), (8, 1, 1), [(2,), (3,)]),  # an unsplit batch axis takes any size
]


@pytest.mark.parametrize("make, partition, batches", UNEVEN_BATCH)
def test_uneven_batch_axes_are_rejected_at_call_time(make, partition, batches):
    op = make()
    D = po.distribute(op, partition, out_partition="auto")
    θ = po.init(D, jax.random.key(0))
    splits = partition[op.ndim:]
    for batch in batches:
        x = jnp.asarray(random_array(np.random.default_rng(0), op.domain_shape + batch, op.dtype))
        bad = [(op.ndim + i, b, p) for i, (b, p) in enumerate(zip(batch, splits)) if b % p]
        if not bad:
            np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(op(θ) @ x), rtol=1e-5, atol=1e-5)
            continue
        for call in (lambda: D(θ) @ x, lambda: jax.jit(lambda x: D(θ) @ x)(x),
                     lambda: D.H(θ) @ jnp.zeros(op.range_shape + batch, op.range_dtype)):
            with pytest.raises(ValueError) as info:
                call()
            axis, b, p = bad[0]
            check_message(info.value, axis, b, p)
        # the sizes it suggests work
        axis, b, p = bad[0]
        for m in nearest(b, p):
            good = list(batch)
            good[axis - op.ndim] = m
            if all(g % q == 0 for g, q in zip(good, splits)):
                x = jnp.asarray(random_array(np.random.default_rng(0), op.domain_shape + tuple(good), op.dtype))
                np.testing.assert_allclose(np.asarray(D(θ) @ x), np.asarray(op(θ) @ x), rtol=1e-4, atol=1e-4)


# -- inputs of any sharding: `D @ x` takes a global array of any sharding, or host data -------

def _inputs_on_other_meshes(x: np.ndarray):
    devices = jax.devices()
    yield "host", x
    yield "one device", jax.device_put(x, devices[3])
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((8,), ("a",), axis_types=(axis_type,))
        yield f"{axis_type.name} mesh, axis 0", jax.device_put(x, NamedSharding(mesh, P("a")))
        yield f"{axis_type.name} mesh, axis 1", jax.device_put(x, NamedSharding(mesh, P(None, "a")))
        mesh = jax.make_mesh((2, 4), ("u", "v"), axis_types=(axis_type,) * 2)
        yield f"{axis_type.name} 2-d mesh", jax.device_put(x, NamedSharding(mesh, P("v", "u")))
        mesh = jax.make_mesh((4,), ("a",), axis_types=(axis_type,), devices=devices[4:])
        yield f"{axis_type.name} mesh on other devices", jax.device_put(x, NamedSharding(mesh, P("a")))


def test_inputs_of_any_sharding_give_the_same_answer():
    F = po.kron(po.DFT(16, "complex128"), po.DFT(16, "complex128"))
    D = po.distribute(F, (8, 1))
    x = random_array(np.random.default_rng(0), (16, 16), np.complex128)
    want = np.fft.fft2(x)
    failures = []
    for label, xs in _inputs_on_other_meshes(x):
        try:
            y = D @ xs
            np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-10)
            assert y.sharding.is_equivalent_to(D.out_sharding, 2)
        except Exception as e:  # collect them all: the report lists every case
            failures.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
    assert not failures, "\n".join(failures)


def test_weights_of_any_placement_give_the_same_answer():
    S = po.kron(po.Matrix(8, 8, "float64", name="w"), po.Diagonal(16, "float64", name="d"))
    D = po.distribute(S, (1, 8))
    θ = random_params(S, 0)
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 16), np.float64))
    want = np.asarray(S(θ) @ x)
    mesh = jax.make_mesh((8,), ("a",), axis_types=(AxisType.Auto,))
    placements = {
        "default": θ,
        "po.init's placement": {k: jax.device_put(v, s) for (k, v), s in
                                zip(θ.items(), (D.param_shardings()[k] for k in θ))},
        "one other device": {k: jax.device_put(v, jax.devices()[5]) for k, v in θ.items()},
        "replicated on a user mesh": {k: jax.device_put(v, NamedSharding(mesh, P())) for k, v in θ.items()},
    }
    failures = []
    for label, θp in placements.items():
        try:
            np.testing.assert_allclose(np.asarray(D(θp) @ x), want, rtol=1e-12, atol=1e-12)
        except Exception as e:
            failures.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
    assert not failures, "\n".join(failures)
