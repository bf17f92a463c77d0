"""Dense references and the dot test."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes
from ._checks import batch_sizes, positive_int
from .display import fmt_bytes
from .operator import Operator, Params, _reshaped, check_operator
from .params import check_key


def to_dense(A: Operator, θ: Params | None = None, *, max_bytes: int = 2**30) -> jax.Array:
    """The `A.shape` matrix `M` of `A` (column j is `A` applied to the j-th unit vector
    of the C-order flattened domain).

    For a real-linear operator with a complex domain and a real range (the adjoint or
    inverse of a real `DFT`), `M` is the complex matrix with `A y == Re(M y)`; then
    `to_dense(A.H) == to_dense(A).conj().T` holds for every operator. A matrix of more
    than `max_bytes` (1 GiB by default) is a `ValueError` rather than an allocation that
    can take the machine's memory: pass a larger `max_bytes` to build it anyway.

    ```python
    >>> M = po.to_dense(po.DFT(4))
    >>> bool(np.allclose(M, np.fft.fft(np.eye(4), axis=0)))
    True
    ```
    """
    check_operator(A, "to_dense")
    max_bytes = positive_int(max_bytes, "max_bytes", "to_dense")
    dtype = np.result_type(A.dtype, A.range_dtype)
    nbytes = A.range_size * A.domain_size * dtype.itemsize
    if nbytes > max_bytes:
        raise ValueError(f"to_dense({A!r}): its matrix is {A.range_size} x {A.domain_size} {dtype.name} "
                         f"({fmt_bytes(nbytes)}), more than max_bytes={max_bytes} ({fmt_bytes(max_bytes)}); pass a "
                         "larger max_bytes to build it")
    return _to_dense(A, θ)


@jax.jit
def _to_dense(A: Operator, θ: Params | None) -> jax.Array:
    """`to_dense` as one program (not a compile per operation)."""
    n = A.domain_size

    def columns(eye):
        return _reshaped(A.apply(θ, eye.reshape(A.domain_shape + (n,))), (A.range_size, n))

    eye = jnp.eye(n, dtype=A.dtype)
    if _dtypes.is_complex(A.dtype) and not _dtypes.is_complex(A.range_dtype):
        return jax.lax.complex(columns(eye), -columns(1j * eye))
    return columns(eye)


def random(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """Standard normal values (complex normal for a complex dtype)."""
    return jax.random.normal(key, shape, dtype)


def dot_test(A: Operator, θ: Params | None = None, key: jax.Array | None = None,
             batch_shape: tuple[int, ...] = ()) -> float:
    """The relative mismatch `|<A x, y> - <x, A.H y>| / max(|<A x, y>|, |<x, A.H y>|)`
    for random `x`, `y`, with `<u, v> = sum(conj(u) * v)`, real parts where the domain
    or the range is real, summed in at least float32 (a bfloat16 sum of many terms
    would lose the answer). About the dtype's rounding error for a correct adjoint,
    times the inner product's cancellation (`sum |terms| / |<A x, y>|`, now and then
    10⁴ for small operators: a float64 mismatch of 1e-12 is then rounding, not a bug).
    `batch_shape` adds trailing batch axes to `x` and `y` (a distributed operator whose
    partition names batch axes needs them).

    ```python
    >>> po.testing.dot_test(po.DFT(10)) < 1e-6    # complex64: float32 rounding
    True
    ```
    """
    check_operator(A, "dot_test")
    batch_shape = batch_sizes(batch_shape, "dot_test: batch_shape")  # an empty batch would pass vacuously
    kx, ky = jax.random.split(jax.random.key(0) if key is None else check_key(key, "dot_test"))
    x = _normal_at_least(kx, A.domain_size * math.prod(batch_shape), A.dtype)
    y = _normal_at_least(ky, A.range_size * math.prod(batch_shape), A.range_dtype)
    return float(_mismatch(A, θ, x, y, batch_shape))


def _normal_at_least(key: jax.Array, size: int, dtype) -> jax.Array:
    """At least `size` standard normal values: the next power of two of them, so that
    `jax.random`'s program (most of a small dot test's compile time) is compiled once
    per power of two and dtype, not once per operator."""
    return _random(key, (1 << max(size - 1, 0).bit_length(),), np.dtype(dtype))


_random = jax.jit(random, static_argnums=(1, 2))  # `random` compiled once per shape and dtype


@functools.partial(jax.jit, static_argnums=4)
def _mismatch(A: Operator, θ: Params | None, x: jax.Array, y: jax.Array,
              batch_shape: tuple[int, ...]) -> jax.Array:
    """`dot_test`'s mismatch as one program (not a compile per operation), `x` and `y`
    the first values of the random vectors given."""
    x = x[:A.domain_size * math.prod(batch_shape)].reshape(A.domain_shape + batch_shape)
    y = y[:A.range_size * math.prod(batch_shape)].reshape(A.range_shape + batch_shape)
    lhs = _inner(A.apply(θ, x), y)
    rhs = _inner(x, A.H.apply(θ, y))
    if not (_dtypes.is_complex(A.dtype) and _dtypes.is_complex(A.range_dtype)):
        lhs, rhs = lhs.real, rhs.real
    scale = jnp.maximum(jnp.maximum(jnp.abs(lhs), jnp.abs(rhs)), jnp.finfo(lhs.dtype).tiny)
    return jnp.abs(lhs - rhs) / scale


def _inner(u: jax.Array, v: jax.Array) -> jax.Array:
    """`<u, v> = sum(conj(u) * v)` in at least float32, without flattening (`jnp.vdot`'s
    reshape of an array sharded on an Explicit mesh axis is not defined)."""
    axes = tuple(range(u.ndim))
    return jax.lax.dot_general(jnp.conj(_widened(u)), _widened(v), ((axes, axes), ((), ())))


def _widened(a: jax.Array) -> jax.Array:
    """`a` in float32 where it is in a half precision; unchanged otherwise."""
    return a.astype(np.promote_types(a.dtype, np.float32))
