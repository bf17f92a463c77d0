"""`PerModeMatrix`: a channel-mixing matrix per Fourier mode (the FNO's spectral weights)."""

from __future__ import annotations

from typing import Sequence

import math

import jax
import jax.numpy as jnp

from .. import _dtypes
from .._dtypes import Flow
from .base import EINSUM_LETTERS, Leaf, Role, positive_int

def _mix(w: jax.Array, x: jax.Array, axis: int, transpose: bool) -> jax.Array:
    """`y[o, m...] = sum_i w[o, i, m...] x[i, m...]` on the axes of `x` from `axis` on
    (`transpose`: contract over `o` instead)."""
    modes = w.ndim - 2
    xs = EINSUM_LETTERS[: x.ndim]
    o, i, ms = "Y", "Z", xs[axis + 1 : axis + 1 + modes]
    inp, out = (o, i) if transpose else (i, o)
    x_sub = xs[:axis] + inp + xs[axis + 1 :]
    y_sub = xs[:axis] + out + xs[axis + 1 :]
    return jnp.einsum(f"{o}{i}{ms},{x_sub}->{y_sub}", w.astype(x.dtype), x)


class PerModeMatrix(Leaf):
    """A dense `c_out x c_in` matrix for each mode: domain `(c_in, *modes)`, range
    `(c_out, *modes)`, weight `(c_out, c_in, *modes)`. It mixes channels and is diagonal
    in the modes: the spectral weights of a Fourier neural operator. Distributed, the
    mode axes stay split and the weight is split with them.

    `po.init` draws the weight with variance `1/c_in` (complex for a complex dtype).

    ```python
    >>> W = po.PerModeMatrix(32, 32, modes=(12, 7), name="spectral0")
    >>> W.domain_shape, W.param_shape
    ((32, 12, 7), (32, 32, 12, 7))
    ```
    """

    def __init__(
        self,
        c_out: int,
        c_in: int,
        modes: Sequence[int],
        dtype="complex64",
        name: str | None = None,
    ):
        c_out = positive_int(c_out, "c_out", "PerModeMatrix")
        c_in = positive_int(c_in, "c_in", "PerModeMatrix")
        modes = tuple(positive_int(m, "each mode count", "PerModeMatrix") for m in modes)
        dtype = _dtypes.canonical("complex64" if dtype is None else dtype)
        if not _dtypes.is_float(dtype):
            raise TypeError(f"PerModeMatrix: dtype must be a float or complex dtype, got {dtype}")
        self._freeze(
            c_out=c_out, c_in=c_in, modes=modes,
            domain_shape=(c_in,) + modes, range_shape=(c_out,) + modes,
            dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if _dtypes.is_complex(dtype) else Flow.REAL,
            roles=(Role.LOCAL,) + (Role.POINTWISE,) * len(modes),
            name=self._name(name, "PerModeMatrix"),
            param_shape=(c_out, c_in) + modes, param_dtype=dtype,
            param_axes=(None, None) + tuple(range(1, len(modes) + 1)),
        )

    def init_param(self, key):
        return jax.random.normal(key, self.param_shape, self.param_dtype) / math.sqrt(self.c_in)

    def _forward(self, w, x, axis):
        return _mix(w, x, axis, transpose=False)

    def _backward(self, w, x, axis):
        return _mix(jnp.conj(w), x, axis, transpose=True)
