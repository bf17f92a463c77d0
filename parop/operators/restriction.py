"""`Restriction`: keeps some indices of an axis (the low modes of an FNO)."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _dtypes
from .._checks import is_int, positive_int
from .._dtypes import Flow
from .base import Leaf, Role


def _indices(n: int, keep) -> np.ndarray:
    """The indices `keep` selects on an axis of size `n`, in order, negative ones wrapped."""
    if isinstance(keep, (jax.Array, np.ndarray)):
        if keep.ndim > 1:
            raise TypeError(f"Restriction: keep as an array must be 1-D (or 0-d), got shape {keep.shape}")
        keep = np.asarray(keep).tolist()  # Python ints (or floats or bools, refused below)
    if isinstance(keep, (int, np.integer, slice)):
        keep = [keep]
    if not isinstance(keep, Sequence) or isinstance(keep, str):
        raise TypeError(
            "Restriction: keep takes an int, a slice, or a sequence (or 1-D integer array) of ints "
            f"and slices, got {keep!r}"
        )
    picked = []
    for k in keep:
        if isinstance(k, slice):
            picked.extend(range(*k.indices(n)))
        elif is_int(k):
            if not -n <= k < n:
                raise ValueError(f"Restriction: index {k} is out of range for an axis of size {n}")
            picked.append(int(k) % n)
        else:
            raise TypeError(f"Restriction: keep takes ints and slices, got {k!r}")
    if not picked:
        raise ValueError(f"Restriction: keep={keep!r} selects no index of an axis of size {n}")
    return np.asarray(picked)


def _runs(indices: np.ndarray) -> tuple[tuple[int, int], ...]:
    """`indices` as maximal runs `[start, stop)` of consecutive values, in order."""
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    return tuple((int(r[0]), int(r[-1]) + 1) for r in np.split(indices, breaks))


class Restriction(Leaf):
    """Keeps the indices `keep` (ints and slices, negative ones included, or a 1-D
    integer array, NumPy or JAX) of an axis of size `n`, in the order given:
    `n -> len(kept)`. Its adjoint puts them back in place among zeros.

    ```python
    >>> R = po.Restriction(32, [slice(0, 6), slice(-6, None)])   # both ends of a spectrum
    >>> R.range_shape
    (12,)
    ```
    """

    flow = Flow.ANY
    roles = (Role.LOCAL,)

    def __init__(self, n: int, keep: Sequence[int | slice] | slice | int | np.ndarray | jax.Array,
                 dtype="float32"):
        n = positive_int(n, "n", "Restriction")
        indices = _indices(n, keep)
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Restriction")
        self._freeze(
            n=n, indices=indices, runs=_runs(indices),
            domain_shape=(n,), range_shape=(len(indices),), dtype=dtype, range_dtype=dtype,
        )

    def _forward(self, w, x, axis):
        return jnp.concatenate([lax.slice_in_dim(x, a, b, axis=axis) for a, b in self.runs], axis)

    def _backward(self, w, x, axis):
        shape = x.shape[:axis] + (self.n,) + x.shape[axis + 1 :]
        if np.all(np.diff(self.indices) > 0):
            pieces, start, filled = [], 0, 0
            for a, b in self.runs:
                pieces.append(jnp.zeros(shape[:axis] + (a - filled,) + shape[axis + 1 :], x.dtype))
                pieces.append(lax.slice_in_dim(x, start, start + b - a, axis=axis))
                start, filled = start + b - a, b
            pieces.append(jnp.zeros(shape[:axis] + (self.n - filled,) + shape[axis + 1 :], x.dtype))
            return jnp.concatenate(pieces, axis)
        index = (slice(None),) * axis + (self.indices,)
        return jnp.zeros(shape, x.dtype).at[index].add(x)

    def describe(self) -> str:
        return f"Restriction({self.n}→{self.range_shape[0]})"
