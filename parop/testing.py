"""Dense references and the dot test."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes
from .operator import Operator, Params


def to_dense(A: Operator, θ: Params | None = None) -> jax.Array:
    """The `A.shape` matrix `M` of `A` (column j is `A` applied to the j-th unit vector
    of the C-order flattened domain).

    For a real-linear operator with a complex domain and a real range (the adjoint or
    inverse of a real `DFT`), `M` is the complex matrix with `A y == Re(M y)`; then
    `to_dense(A.H) == to_dense(A).conj().T` holds for every operator.

    ```python
    >>> po.to_dense(po.DFT(4))                 # == np.fft.fft(np.eye(4), axis=0)
    ```
    """
    return _to_dense(A, θ)


@jax.jit
def _to_dense(A: Operator, θ: Params | None) -> jax.Array:
    """`to_dense` as one program (not a compile per operation)."""
    n = A.domain_size

    def columns(eye):
        return A.apply(θ, eye.reshape(A.domain_shape + (n,))).reshape(A.range_size, n)

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
    would lose the answer). About the dtype's rounding error for a correct adjoint.
    `batch_shape` adds trailing batch axes to `x` and `y` (a distributed operator whose
    partition names batch axes needs them).

    ```python
    >>> po.testing.dot_test(po.DFT(10, dtype=jnp.float64)) < 1e-12
    True
    ```
    """
    return float(_mismatch(A, θ, jax.random.key(0) if key is None else key, tuple(batch_shape)))


@functools.partial(jax.jit, static_argnums=3)
def _mismatch(A: Operator, θ: Params | None, key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    """`dot_test`'s mismatch as one program (not a compile per operation)."""
    kx, ky = jax.random.split(key)
    x = random(kx, A.domain_shape + batch_shape, A.dtype)
    y = random(ky, A.range_shape + batch_shape, A.range_dtype)
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
