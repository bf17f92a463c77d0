"""`Identity`: the operator that does nothing, and costs nothing."""

from __future__ import annotations

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role


class Identity(Leaf):
    """The identity on an axis of size `n`. Takes data of any float or complex dtype.

    In a kron it marks an axis the other factors leave alone; it applies as a no-op
    (no copy, no transpose) and, distributed, its axis can hold a device split.

    ```python
    >>> C = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    ```
    """

    flow = Flow.ANY

    def __init__(self, n: int, dtype="float32"):
        n = positive_int(n, "n", "Identity")
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Identity")
        self._freeze(
            n=n, domain_shape=(n,), range_shape=(n,), dtype=dtype, range_dtype=dtype,
            roles=(Role.POINTWISE,),
        )

    def _forward(self, w, x, axis):
        return x

    _backward = _forward

    def _adjoint(self):
        return self

    def inverse(self):
        return self

    def describe(self) -> str:
        return f"I({self.n})"
