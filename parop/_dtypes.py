"""dtype rules shared by every operator.

An operator declares how it moves dtypes with a *flow* (see `Flow`): whether it
takes any dtype, real data, complex data, or turns one into the other. The
combinators only ever ask `out_dtype(flow, dtype, given)`.
"""

from __future__ import annotations

from enum import Enum

import jax
import jax.numpy as jnp
import numpy as np

DType = np.dtype


class Flow(Enum):
    """How a leaf maps its input dtype to its output dtype.

    - `ANY`: structural operators (Identity, Restriction, Reduce) act on any dtype.
    - `REAL`: a real operator (a real Matrix): real or complex data of its precision.
    - `COMPLEX`: a complex operator: complex data of its precision only.
    - `R2C`: real data in, complex data out (the real DFT).
    - `C2R`: complex data in, real data out (the adjoint or inverse of the real DFT).
    """

    ANY = "any"
    REAL = "real"
    COMPLEX = "complex"
    R2C = "r2c"
    C2R = "c2r"

    @property
    def adjoint(self) -> "Flow":
        return {Flow.R2C: Flow.C2R, Flow.C2R: Flow.R2C}.get(self, self)


def canonical(dtype) -> np.dtype:
    """The dtype as NumPy spells it, with JAX's x64 setting applied."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or is_complex(dtype)


def real_of(dtype) -> np.dtype:
    """float32 for complex64, float64 for complex128; real dtypes unchanged."""
    return np.dtype(np.finfo(dtype).dtype)


def complex_of(dtype) -> np.dtype:
    """complex64 for float32, complex128 for float64; complex dtypes unchanged."""
    return np.dtype(np.result_type(dtype, np.complex64))


def out_dtype(flow: Flow, dtype: np.dtype, given: np.dtype) -> np.dtype | None:
    """The output dtype of an operator of `flow` and nominal `dtype` on `given` data.

    Returns `None` when the operator cannot take `given`.
    """
    if not is_float(given):
        return None  # integer or boolean data is cast first (`Operator.apply`)
    same_precision = real_of(given) == real_of(dtype)
    if flow is Flow.ANY:
        return given
    if flow is Flow.REAL:
        return given if same_precision else None
    if flow is Flow.COMPLEX:
        return given if same_precision and is_complex(given) else None
    if flow is Flow.R2C:
        return complex_of(given) if same_precision and not is_complex(given) else None
    return real_of(given) if same_precision and is_complex(given) else None
