"""`Matrix`: a dense, trainable `m x n` matrix acting on one axis."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .. import _dtypes
from .._dtypes import Flow
from .base import EINSUM_LETTERS, Leaf, Role, positive_int


def contract(w: jax.Array, x: jax.Array, w_axis: int, axis: int) -> jax.Array:
    """Contracts axis `w_axis` of the 2-D `w` with axis `axis` of `x`; the other axis of
    `w` takes the place of `axis` in the result. A real `w` on complex `x` acts on the
    real and imaginary parts (two real products, half the work of a complex one)."""
    if jnp.iscomplexobj(x) and not jnp.iscomplexobj(w):
        return lax.complex(contract(w, x.real, w_axis, axis), contract(w, x.imag, w_axis, axis))
    xs = EINSUM_LETTERS[: x.ndim]
    w_sub = "YZ" if w_axis == 1 else "ZY"
    return jnp.einsum(f"{w_sub},{xs[:axis]}Z{xs[axis + 1:]}->{xs[:axis]}Y{xs[axis + 1:]}", w, x)


class Matrix(Leaf):
    """A dense matrix `W` of shape `(m, n)`: maps an axis of size `n` to size `m`.

    Its weight is a parameter (`po.init` draws it with variance `1/n`, so `W x` keeps
    the variance of `x`; complex weights for a complex dtype). A real `Matrix` also
    acts on complex data of its precision.

    ```python
    >>> M = po.Matrix(20, 10, name="lift")
    >>> θ = po.init(M, jax.random.key(0))      # {"lift": Array (20, 10)}
    >>> y = M(θ) @ jnp.ones((10, 5))           # (20, 5)
    ```
    """

    roles = (Role.LOCAL,)
    param_axes = (None, None)
    dense_axes = (0, 1)

    def __init__(self, m: int, n: int, dtype="float32", name: str | None = None):
        m = positive_int(m, "m", "Matrix")
        n = positive_int(n, "n", "Matrix")
        dtype = _dtypes.canonical("float32" if dtype is None else dtype)
        if not _dtypes.is_float(dtype):
            raise TypeError(f"Matrix: dtype must be a float or complex dtype, got {dtype}")
        self._freeze(
            m=m, n=n, domain_shape=(n,), range_shape=(m,), dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if _dtypes.is_complex(dtype) else Flow.REAL,
            name=self._name(name, "Matrix"), param_shape=(m, n), param_dtype=dtype,
        )

    def init_param(self, key):
        return jax.random.normal(key, self.param_shape, self.param_dtype) / math.sqrt(self.n)

    def _forward(self, w, x, axis):
        return contract(w, x, 1, axis)

    def _backward(self, w, x, axis):
        return contract(jnp.conj(w), x, 0, axis)
