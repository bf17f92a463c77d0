"""`Reduce`: the sum over an axis."""

from __future__ import annotations

import jax.numpy as jnp

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role


class Reduce(Leaf):
    """The sum over an axis of size `n`, keeping it as an axis of size 1: a `1 x n`
    row of ones. Its adjoint broadcasts. Distributed over a split axis it is a local
    sum and an all-reduce (`psum`); the result comes back replicated.

    ```python
    >>> S = po.kron(po.Reduce(8), po.Identity(100))
    >>> y = S @ jnp.ones((8, 100), jnp.float32)
    >>> y.shape, float(y.min()), float(y.max())
    ((1, 100), 8.0, 8.0)
    ```
    """

    flow = Flow.ANY
    roles = (Role.REDUCE,)

    def __init__(self, n: int, dtype="float32"):
        n = positive_int(n, "n", "Reduce")
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Reduce")
        self._freeze(n=n, domain_shape=(n,), range_shape=(1,), dtype=dtype, range_dtype=dtype)

    def _forward(self, w, x, axis):
        return jnp.sum(x, axis=axis, keepdims=True)

    def _backward(self, w, x, axis):
        shape = x.shape[:axis] + (self.n,) + x.shape[axis + 1 :]
        return jnp.broadcast_to(x, shape)

    def describe(self) -> str:
        return f"Reduce({self.n})"
