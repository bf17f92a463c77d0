"""`PerModeMatrix`: a channel-mixing matrix per Fourier mode (the FNO's spectral weights)."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role, dims, mix, name_label


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
        if (not isinstance(modes, (Sequence, np.ndarray)) or isinstance(modes, str)
                or isinstance(modes, np.ndarray) and modes.ndim != 1):
            raise TypeError(
                f"PerModeMatrix: modes must be a sequence of positive ints, one per mode axis "
                f"(modes=(12, 7) for a 2-D spectrum), got {modes!r}"
            )
        modes = tuple(positive_int(m, "each mode count", "PerModeMatrix") for m in modes)
        dtype = _dtypes.leaf_dtype(dtype, "complex64", "PerModeMatrix")
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
        return mix(w, x, axis, transpose=False)

    def _backward(self, w, x, axis):
        return mix(jnp.conj(w), x, axis, transpose=True)

    def describe(self) -> str:
        return f"PerModeMatrix({dims(self.param_shape)}{name_label(self.name)})"
