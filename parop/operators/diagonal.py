"""`Diagonal`: a trainable elementwise scaling along one axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role, name_label


def along(w: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    """`w` shaped to broadcast against the axes of `x` from `axis` on (and cast to the
    dtype of complex `x` where `w` is real)."""
    return w.reshape(w.shape + (1,) * (x.ndim - axis - w.ndim)).astype(x.dtype)


class Diagonal(Leaf):
    """`diag(d)` on an axis of size `n`: `y[i] = d[i] * x[i]`.

    `po.init` starts `d` at ones (the identity). Distributed, its axis stays split and
    `d` is split with it.

    ```python
    >>> D = po.Diagonal(30, name="scale")
    >>> y = D({"scale": jnp.arange(30.0)}) @ jnp.ones(30)
    ```
    """

    roles = (Role.POINTWISE,)
    param_axes = (0,)

    def __init__(self, n: int, dtype="float32", name: str | None = None):
        n = positive_int(n, "n", "Diagonal")
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Diagonal")
        self._freeze(
            n=n, domain_shape=(n,), range_shape=(n,), dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if _dtypes.is_complex(dtype) else Flow.REAL,
            name=self._name(name, "Diagonal"), param_shape=(n,), param_dtype=dtype,
        )

    def init_param(self, key):
        return jnp.ones(self.param_shape, self.param_dtype)

    def _forward(self, w, x, axis):
        return x * along(w, x, axis)

    def _backward(self, w, x, axis):
        return x * along(jnp.conj(w), x, axis)

    def describe(self) -> str:
        return f"Diagonal({self.n}{name_label(self.name)})"
