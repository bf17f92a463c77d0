"""`DFT`, the discrete Fourier transform along an axis, and `InverseDFT`."""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role
from .diagonal import along

T = TypeVar("T")
NORMS = ("backward", "ortho", "forward")
_DUAL = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _hermitian_weights(n: int, dtype) -> np.ndarray:
    """How often each of the `n//2 + 1` half-spectrum bins stands in the full spectrum:
    1 for the zero (and, for even `n`, the Nyquist) bin, 2 for the others."""
    c = np.full(n // 2 + 1, 2.0, dtype=dtype)
    c[0] = 1.0
    if n % 2 == 0:
        c[-1] = 1.0
    return c


def _norm_label(norm: str) -> str:
    return "" if norm == "backward" else f", {norm}"


class DFT(Leaf):
    """The DFT along an axis of size `n`, normalised as `numpy.fft` (`norm`).

    Complex `dtype`: `fft`, n -> n. Real `dtype`: `rfft`, n real values -> n//2 + 1
    complex ones. `.H` is the exact adjoint (for the real DFT: the map back to n reals
    that passes the dot test with the real inner product; *not* the inverse), and
    `.inverse()` the inverse (`irfft` with length n for the real DFT).

    ```python
    >>> F = po.DFT(10, dtype=jnp.float32)      # rDFT: (10,) float32 -> (6,) complex64
    >>> F.range_shape, F.range_dtype
    ((6,), dtype('complex64'))
    >>> x = jnp.arange(10, dtype=jnp.float32)
    >>> bool(jnp.allclose(F @ x, jnp.fft.rfft(x), atol=1e-4))
    True
    ```
    """

    roles = (Role.LOCAL,)

    def __init__(self, n: int, dtype="complex64", norm: str = "backward"):
        n = positive_int(n, "n", "DFT")
        dtype = _dtypes.leaf_dtype(
            dtype, "complex64", "DFT", _dtypes.FFT_DTYPES,
            " (jnp.fft has no bfloat16 or float16; a float32 DFT takes such data, cast exactly)",
        )
        if not isinstance(norm, str) or norm not in NORMS:
            raise ValueError(f"DFT: norm must be one of {NORMS}, got {norm!r}")
        real = not _dtypes.is_complex(dtype)
        self._freeze(
            n=n, norm=norm, real=real, domain_shape=(n,),
            range_shape=(n // 2 + 1,) if real else (n,),
            dtype=dtype, range_dtype=_dtypes.complex_of(dtype),
            flow=Flow.R2C if real else Flow.COMPLEX,
        )

    def _forward(self, w, x, axis):
        if self.n == 1:
            return _length_one(x, self.real)
        if self.real:
            return _fft(jnp.fft.rfftn, x, (axis,), norm=self.norm)
        return _fft(jnp.fft.fftn, x, (axis,), norm=self.norm)

    def _backward(self, w, x, axis):
        if self.n == 1:
            return _length_one(x, False, self.real)
        dual = _DUAL[self.norm]
        if self.real:
            c = _hermitian_weights(self.n, x.dtype)
            return _fft(jnp.fft.irfftn, x / along(c, x, axis), (axis,), s=(self.n,), norm=dual)
        return _fft(jnp.fft.ifftn, x, (axis,), norm=dual)

    def inverse(self) -> "InverseDFT":
        return self._cache("_inverse", lambda: InverseDFT(self))

    def describe(self) -> str:
        return f"{'r' if self.real else ''}DFT({self.n}{_norm_label(self.norm)})"


class InverseDFT(Leaf):
    """The inverse of a `DFT` (what `DFT(...).inverse()` returns): `ifft`, or `irfft`
    with length `n` for a real DFT."""

    roles = (Role.LOCAL,)

    def __init__(self, of: DFT):
        self._freeze(
            of=of, n=of.n, norm=of.norm, real=of.real,
            domain_shape=of.range_shape, range_shape=of.domain_shape,
            dtype=of.range_dtype, range_dtype=of.dtype, flow=of.flow.adjoint,
        )

    def _forward(self, w, x, axis):
        if self.n == 1:
            return _length_one(x, False, self.real)
        if self.real:
            return _fft(jnp.fft.irfftn, x, (axis,), s=(self.n,), norm=self.norm)
        return _fft(jnp.fft.ifftn, x, (axis,), norm=self.norm)

    def _backward(self, w, x, axis):
        if self.n == 1:
            return _length_one(x, self.real)
        dual = _DUAL[self.norm]
        if self.real:
            y = _fft(jnp.fft.rfftn, x, (axis,), norm=dual)
            return y * along(_hermitian_weights(self.n, y.dtype), y, axis)
        return _fft(jnp.fft.fftn, x, (axis,), norm=dual)

    def inverse(self) -> DFT:
        return self.of

    def describe(self) -> str:
        return f"i{'r' if self.real else ''}DFT({self.n}{_norm_label(self.norm)})"


def _length_one(x: jax.Array, to_complex: bool, to_real: bool = False) -> jax.Array:
    """A DFT of length 1 (or its inverse or adjoint), whatever its norm: the identity, from
    real data to complex (`to_complex`: `rfft`) or from complex to its real part
    (`to_real`: `irfft`, and the adjoint of `rfft`). No FFT runs: XLA:CPU's FFT refused
    an array of ones' shape laid out other than row-major (a RET_CHECK in its FFT thunk),
    as its layout assignment may leave one in a distributed program."""
    if to_complex:
        return x.astype(_dtypes.complex_of(x.dtype))
    return jnp.real(x) if to_real else x


def _fft(transform: Callable, x: jax.Array, axes, **options) -> jax.Array:
    """`transform(x, axes=axes, **options)` (an `fftn` of `jnp.fft`) with its result, and
    the cotangent a transpose hands back for its operand, laid out row-major: XLA:CPU's
    FFT refuses any other layout (an INTERNAL RET_CHECK in its FFT thunk), and its layout
    assignment may give an FFT the layout of a collective next to it (a length-1 axis
    moved anywhere; an all-gather's axis made the most major in a pullback: both found by
    the property tests in jitted products of two distributed programs). Each passes
    through a flat array behind an optimisation barrier, which XLA cannot lay out
    otherwise and cannot simplify away: free reshapes where the layout is row-major
    already, a copy where it was not (the guard on the result also guards the operand of
    the FFT a transpose runs). The operand itself is not guarded, only what a transpose
    hands back for it (`_row_major_cotangent_p`, in a pullback and in
    `jax.linear_transpose` alike): guarded, it kept XLA from fusing the operand's
    producer into the layout it gives the FFT, and the FNO's remat step held one more
    complex block (dfno's block: 9.73 -> 11.07 GB per device), while nothing the tests or
    the property tests draw needed it. Only in a traced program: an FFT run eagerly is a
    program of its own, its operand row-major, and the guard's own dispatches would cost
    more than the FFTs (two DFT(16) on 16 x 16 x 4: 107 -> 170 - 217 us a call).

    >>> x = jnp.arange(8.0).reshape(2, 4)
    >>> y = jax.jit(lambda x: _fft(jnp.fft.fftn, x, (1,)))(x)
    >>> bool(jnp.allclose(y, jnp.fft.fft(x)))
    True
    """
    operand = _row_major_cotangent_p.bind(x) if isinstance(x, jax.core.Tracer) else x
    return _row_major(transform(operand, axes=tuple(a % x.ndim for a in axes), **options))


def _row_major(x: jax.Array) -> jax.Array:
    """`x`, laid out row-major where it meets an FFT in a traced program (see `_fft`)."""
    if not isinstance(x, jax.core.Tracer):
        return x
    return jax.lax.optimization_barrier(x.reshape(-1)).reshape(x.shape)


_row_major_cotangent_p = jax.extend.core.Primitive("parop_row_major_cotangent")
"""The identity (no operation in the compiled program), linear, whose transpose is
`_row_major`: an FFT's operand, so that whatever transposes the FFT (a pullback, or
`jax.linear_transpose` of a user's `A @ x`, which would run a `custom_jvp`'s function
and drop its rule) hands back a row-major cotangent (see `_fft`)."""
_row_major_cotangent_p.def_impl(lambda x: x)
_row_major_cotangent_p.def_abstract_eval(lambda aval: aval)
mlir.register_lowering(_row_major_cotangent_p, lambda ctx, x: [x])
ad.deflinear2(_row_major_cotangent_p, lambda cotangent, x: [_row_major(cotangent)])
batching.defvectorized(_row_major_cotangent_p)


def fusable(run: list, leaf, axis: int) -> bool:
    """Whether `leaf` on `axis` can join `run`, a list of `(DFT or InverseDFT, axis)`
    applied in order, in one multi-axis FFT: another axis, the same class and norm,
    and the real axis where `rfftn` (first) or `irfftn` (last) puts it. A length-1
    transform runs alone (no FFT: `_length_one`)."""
    if not isinstance(leaf, (DFT, InverseDFT)) or leaf.n == 1:
        return False
    if not run:
        return True
    if any(a == axis for _, a in run):
        return False
    first = run[0][0]
    if type(leaf) is not type(first) or leaf.norm != first.norm:
        return False
    if isinstance(leaf, DFT):
        return not leaf.real
    return not any(l.real for l, _ in run)


def fused_runs(items: Iterable[T], leaf_axis: Callable[[T], tuple[Leaf, int] | None]) -> list:
    """`items` in order, with each run of consecutive DFTs that one multi-axis FFT can
    apply (`fusable`) as one list `[(leaf, axis), ...]` for `apply_fused`; `leaf_axis(item)`
    is the item's leaf and the axis it acts on, or None where the item is no such leaf."""
    out: list = []
    for item in items:
        pair = leaf_axis(item)
        if pair is not None and out and isinstance(out[-1], list) and fusable(out[-1], *pair):
            out[-1].append(pair)
        elif pair is not None and fusable([], *pair):
            out.append([pair])
        else:
            out.append(item)
    return out


def apply_fused(run: list, x):
    """`run` (see `fusable`) as one `fftn`/`rfftn`/`ifftn`/`irfftn` call: one FFT op
    for XLA instead of one per axis."""
    leaves = [l for l, _ in run]
    axes = [a for _, a in run]
    norm = leaves[0].norm
    if isinstance(leaves[0], DFT):
        if leaves[0].real:  # rfftn transforms the last of `axes` first, as the real one
            return _fft(jnp.fft.rfftn, x, axes[1:] + axes[:1], norm=norm)
        return _fft(jnp.fft.fftn, x, axes, norm=norm)
    if leaves[-1].real:  # irfftn transforms the last of `axes` last, as the real one
        sizes = [x.shape[a] for a in axes[:-1]] + [leaves[-1].n]
        return _fft(jnp.fft.irfftn, x, axes, s=sizes, norm=norm)
    return _fft(jnp.fft.ifftn, x, axes, norm=norm)
