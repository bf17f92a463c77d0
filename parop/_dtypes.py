"""dtype rules shared by every operator.

An operator declares how it moves dtypes with a *flow* (see `Flow`): whether it
takes any dtype, real data, complex data, or turns one into the other. The
combinators only ever ask `out_dtype(flow, dtype, given)`.

A leaf's dtype is one of `LEAF_DTYPES`: bfloat16, float16, float32, float64,
complex64, complex128. The half precisions are real only (JAX has no complex
bfloat16 or float16, so `complex_of` has no answer for them), and `jnp.fft` has
neither: a `DFT` takes `FFT_DTYPES`.
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
    """float32 for complex64, float64 for complex128; real dtypes (bfloat16 and float16
    included) unchanged."""
    return np.dtype(jnp.finfo(dtype).dtype)


_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


def complex_of(dtype) -> np.dtype:
    """complex64 for float32, complex128 for float64; complex dtypes unchanged. A
    `TypeError` for a half precision: JAX has no complex bfloat16 or float16."""
    dtype = np.dtype(dtype)
    if is_complex(dtype):
        return dtype
    if dtype not in _COMPLEX_OF:
        raise TypeError(f"there is no complex dtype of {dtype} precision: JAX's complex dtypes are "
                        "complex64 (float32 parts) and complex128 (float64 parts)")
    return _COMPLEX_OF[dtype]


FFT_DTYPES = tuple(np.dtype(d) for d in ("float32", "float64", "complex64", "complex128"))  # jnp.fft's
LEAF_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(np.float16)) + FFT_DTYPES  # a leaf's `dtype=`


def leaf_dtype(dtype, default: str, where: str, supported: tuple[np.dtype, ...] = LEAF_DTYPES,
               why: str = "") -> np.dtype:
    """A leaf's `dtype=` argument, canonical (`None` is `default`), or a `TypeError`
    naming the leaf, the dtype and the `supported` ones (and `why`, where some are not)."""
    try:
        canon = canonical(default if dtype is None else dtype)
    except TypeError:  # not a dtype at all
        canon = None
    if canon is None or canon not in supported:  # (np.dtype("float64") == None is True)
        names = ", ".join(d.name for d in supported)
        got = repr(dtype) if canon is None else canon.name
        raise TypeError(f"{where}: dtype must be one of {names}{why}, got {got}")
    return canon


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
