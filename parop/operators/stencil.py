"""`Stencil`: a fixed finite-difference stencil (any small correlation kernel) on a grid."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from .. import _dtypes
from .._dtypes import Flow
from .base import Role, dims
from .convolution import Correlation, adjoint_kernel, check_kernel, shift_sum, sizes


def _weights(weights, dtype) -> tuple[np.ndarray, np.dtype]:
    """The weights as a read-only NumPy array of the operator's precision, and the
    operator's dtype (by default the weights' own float or complex dtype; float32, or
    complex64 for complex values, for lists and integer arrays)."""
    if isinstance(weights, jax.core.Tracer):
        raise TypeError(
            "Stencil: the weights are fixed values, part of the operator, and cannot be traced "
            "(inside jax.jit or jax.grad); for trainable weights use po.Convolution, whose kernel is a parameter")
    try:
        w = np.asarray(weights)
    except ValueError as e:  # a ragged nested list
        raise ValueError(f"Stencil: weights must be a rectangular array of numbers, got {weights!r} ({e})") from None
    if not np.issubdtype(w.dtype, np.number):
        raise TypeError(f"Stencil: weights must be an array of numbers, got {weights!r}")
    complex_weights = np.iscomplexobj(w)
    if dtype is None:
        own = isinstance(weights, (np.ndarray, jax.Array)) and _dtypes.is_float(w.dtype)
        dtype = w.dtype if own else "complex64" if complex_weights else "float32"
    dtype = _dtypes.leaf_dtype(dtype, "float32", "Stencil")
    if complex_weights and not _dtypes.is_complex(dtype):
        raise TypeError(f"Stencil: complex weights need a complex dtype, got dtype {dtype}")
    w = w.astype(dtype if complex_weights else _dtypes.real_of(dtype))
    w.setflags(write=False)
    return w, dtype


class Stencil(Correlation):
    """A fixed stencil on `grid`: `weights`, an array with one odd size per grid axis,
    correlated with the data, with "same" output size:

        y[i] = sum_j weights[j] x[i + j - h],   h = weights.shape // 2,

    with multi-indices `i`, `j`, `h`. Indices outside the grid wrap around
    (`boundary="periodic"`) or read zeros (`boundary="zero"`). The exact adjoint
    (`.H`) correlates with the flipped, conjugated weights and the same boundary rule.
    No parameter: the weights are part of the operator (two stencils are equal when
    their weights are).

    `dtype` defaults to the weights' dtype (float32 for Python lists, complex64 if they
    hold complex numbers); complex weights need a complex dtype, and real weights also
    act on complex data of their precision. Distributed, the grid axes may stay split
    (`Role.HALO`).

    ```python
    >>> n, h = 64, 1 / 64
    >>> D2 = po.Stencil([1, -2, 1], (n,)) / h**2          # 1-D second difference
    >>> I = po.Identity(n)
    >>> L = po.kron(D2, I) + po.kron(I, D2)                # 2-D Laplacian, periodic
    >>> L5 = po.Stencil([[0, 1, 0], [1, -4, 1], [0, 1, 0]], (n, n)) / h**2   # the same
    ```
    """

    grid_offset = 0

    def __init__(self, weights, grid: Sequence[int], boundary: str = "periodic", dtype=None):
        weights, dtype = _weights(weights, dtype)
        grid = sizes(grid, "grid", "Stencil")
        if weights.ndim != len(grid):
            raise ValueError(
                f"Stencil: weights of shape {weights.shape} have {weights.ndim} axes but the "
                f"grid {grid} has {len(grid)}; they must have one axis per grid axis"
            )
        kernel = sizes(weights.shape, "weights", "Stencil")
        check_kernel(kernel, grid, boundary, "Stencil")
        self._freeze(
            weights=weights, kernel=kernel, grid=grid, boundary=boundary,
            domain_shape=grid, range_shape=grid, dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if np.iscomplexobj(weights) else Flow.REAL,
            roles=(Role.HALO,) * len(grid),
        )

    def _valid(self, w, x, axis, adjoint):
        return shift_sum(adjoint_kernel(self.weights, channels=False) if adjoint else self.weights, x, axis)

    def describe(self) -> str:
        w = self.weights  # a short 1-D stencil shows its weights, others their shape
        taps = f"[{', '.join(f'{v.item():g}' for v in w)}]" if w.ndim == 1 and w.size <= 5 else dims(w.shape)
        return f"Stencil({taps}, {self.boundary})"
