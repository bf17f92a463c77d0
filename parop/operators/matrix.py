"""`Matrix`: a dense, trainable `m x n` matrix acting on one axis."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role, dims, mix, name_label


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
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Matrix")
        self._freeze(
            m=m, n=n, domain_shape=(n,), range_shape=(m,), dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if _dtypes.is_complex(dtype) else Flow.REAL,
            name=self._name(name, "Matrix"), param_shape=(m, n), param_dtype=dtype,
        )

    def init_param(self, key):
        return jax.random.normal(key, self.param_shape, self.param_dtype) / math.sqrt(self.n)

    def _forward(self, w, x, axis):
        return mix(w, x, axis, transpose=False)

    def _backward(self, w, x, axis):
        return mix(jnp.conj(w), x, axis, transpose=True)

    def describe(self) -> str:
        return f"Matrix({dims(self.param_shape)}{name_label(self.name)})"
