"""`Convolution`: a trainable multi-channel convolution on a grid, and `Correlation`,
what it shares with `Stencil`.

Both are "same"-size cross-correlations with a centred, odd-sized kernel and a
boundary rule (periodic or zero), applied in two steps, which is also how they run on
a grid split over devices:

- `extend(x, axis, axes)` pads spatial axes by their `halo` (`k // 2` planes on each
  side) by the boundary rule; distributed, a halo exchange fills the split axes
  instead, and `extend` pads the whole ones;
- `_valid(w, x_ext, axis, adjoint)` correlates the extended input with the kernel
  where it fits entirely ("valid"), which gives the output on the un-extended grid.

The exact adjoint is the same two steps with the adjoint kernel (flipped along every
spatial axis, conjugated, channel axes swapped): for a periodic boundary because the
flip turns `i + j - h` into `i - j + h`, the transposed index map; for a zero boundary
because the adjoint of "pad with zeros, take the valid part" is again "pad with zeros,
take the valid part" with the flipped kernel (the adjoint of the padding crops, and
the adjoint of the valid correlation is the full correlation with the flipped kernel).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _dtypes
from .._checks import positive_int
from .._dtypes import Flow
from .base import Leaf, Role, dims, name_label

BOUNDARIES = ("periodic", "zero")
# the most taps a single-channel `Convolution` sums as shifted slices (`shift_sum`), a
# convolution beyond: XLA compiles the gradient of each tap's slice apart, and a 4-D
# kernel of 3^4 taps made a small FNO's training step compile in a minute (0.6 s as one
# convolution); 3-D's 27 compile in 3 s
SHIFTED_TAPS = 27


def sizes(values, what: str, op: str) -> tuple[int, ...]:
    """`values` as a non-empty tuple of positive ints, or an error naming `op`."""
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"{op}: {what} must be a sequence of positive ints, got {values!r}") from None
    if not values:
        raise ValueError(f"{op}: {what} must have at least one axis, got {values!r}")
    return tuple(positive_int(v, f"each {what} size", op) for v in values)


def check_kernel(kernel: tuple[int, ...], grid: tuple[int, ...], boundary: str, op: str) -> None:
    """A `ValueError` naming `op` unless `kernel` has one odd size per axis of `grid` and
    `boundary` is one of `BOUNDARIES`."""
    if len(kernel) != len(grid):
        raise ValueError(
            f"{op}: the kernel {kernel} has {len(kernel)} axes but the grid {grid} has "
            f"{len(grid)}; they must have one size per spatial axis each"
        )
    for a, k in enumerate(kernel):
        if k % 2 == 0:
            raise ValueError(
                f"{op}: kernel size {k} along spatial axis {a} is even; only odd sizes "
                "(a centred kernel, k // 2 planes on each side) are supported"
            )
    if not isinstance(boundary, str) or boundary not in BOUNDARIES:
        raise ValueError(f"{op}: boundary must be 'periodic' or 'zero', got {boundary!r}")


def pad_axis(x: jax.Array, axis: int, halo: int, boundary: str) -> jax.Array:
    """`x` with `halo` planes added on both sides of `axis`: zeros (`"zero"`), or the
    planes from the other end (`"periodic"`, as slices: `jnp.pad`'s `"wrap"` mode is
    slower), wrapping around more than once where `halo` exceeds the axis."""
    if boundary == "zero":
        return jnp.pad(x, [(halo, halo) if a == axis else (0, 0) for a in range(x.ndim)])
    index = np.arange(-halo, x.shape[axis] + halo) % x.shape[axis]
    runs = np.split(index, np.flatnonzero(np.diff(index) != 1) + 1)  # of consecutive indices
    return jnp.concatenate([lax.slice_in_dim(x, r[0], r[-1] + 1, axis=axis) for r in runs], axis)


def adjoint_kernel(kernel, channels: bool):
    """The kernel of the adjoint map: flipped along every spatial axis and conjugated,
    with its `(out, in)` channel axes swapped where it has them (NumPy or JAX)."""
    lead = 2 if channels else 0
    flipped = kernel[(slice(None),) * lead + (slice(None, None, -1),) * (kernel.ndim - lead)].conj()
    return flipped.swapaxes(0, 1) if channels else flipped


def shift_sum(taps, x: jax.Array, first: int) -> jax.Array:
    """The valid correlation `y[i] = sum_j taps[j] x[i + j]` on the axes of `x` from
    `first` on, one per axis of `taps` (a scalar per tap, NumPy or JAX): a sum of
    shifted slices, which XLA fuses into one pass over `x`. Zero NumPy taps are
    skipped."""
    out = [x.shape[first + a] - k + 1 for a, k in enumerate(taps.shape)]
    shape = x.shape[:first] + tuple(out) + x.shape[first + taps.ndim :]
    total = None
    for j in np.ndindex(taps.shape):
        if isinstance(taps, np.ndarray) and taps[j] == 0:
            continue
        start = (0,) * first + j + (0,) * (x.ndim - first - taps.ndim)
        term = lax.slice(x, start, tuple(s + n for s, n in zip(start, shape))) * taps[j].astype(x.dtype)
        total = term if total is None else total + term
    return jnp.zeros(shape, x.dtype) if total is None else total


def conv(kernel: jax.Array, x: jax.Array, first: int) -> jax.Array:
    """The valid correlation `y[o, i] = sum_{c, j} kernel[o, c, j] x[c, i + j]` with the
    channel axis of `x` at `first`, followed by its spatial axes. The axes before and
    after are folded into the batch of `lax.conv_general_dilated`."""
    d = kernel.ndim - 2
    pre, core, post = x.shape[:first], x.shape[first : first + 1 + d], x.shape[first + 1 + d :]
    p, q = math.prod(pre), math.prod(post)
    # the axes after the operator's move to the front, where they join those before
    x = jnp.moveaxis(x.reshape((p,) + core + (q,)), -1, 0).reshape((q * p,) + core)
    y = _batch_conv(kernel, x)
    y = jnp.moveaxis(y.reshape((q, p) + y.shape[1:]), 0, -1)
    return y.reshape(pre + y.shape[1:-1] + post)


def _batch_conv(kernel: jax.Array, x: jax.Array) -> jax.Array:
    """The valid correlation of `x` `(batch, c_in, *grid)` with `kernel`
    `(c_out, c_in, *k)`, in full float32 precision (no TF32 on GPUs). XLA has no complex
    convolution on CPU and GPU, so complex data takes real ones: two for a real kernel
    (the real and imaginary parts), four for a complex kernel (which meets complex data
    only), exact to rounding in each part (JAX's own fallback, three convolutions and
    Gauss's trick, has errors relative to the larger part, and is slower on CPU)."""
    run = lambda k, x: lax.conv_general_dilated(
        x, k, (1,) * (k.ndim - 2), "VALID", precision=lax.Precision.HIGHEST)
    if not jnp.iscomplexobj(x):
        return run(kernel, x)
    if not jnp.iscomplexobj(kernel):
        return lax.complex(run(kernel, x.real), run(kernel, x.imag))
    kr, ki = kernel.real, kernel.imag
    return lax.complex(run(kr, x.real) - run(ki, x.imag), run(kr, x.imag) + run(ki, x.real))


class Correlation(Leaf):
    """What `Convolution` and `Stencil` share: a "same"-size cross-correlation on
    `grid` with an odd-sized `kernel` and a `boundary` rule, run as `extend` then
    `_valid` (see the module's docstring). Its spatial axes have `Role.HALO`."""

    grid: tuple[int, ...]
    kernel: tuple[int, ...]
    boundary: str
    grid_offset: int  # where the first spatial axis is among the operator's axes

    @property
    def halo(self) -> tuple[int, ...]:
        """The halo width `k // 2` of each spatial axis: the planes each output point
        reads on either side."""
        return tuple(k // 2 for k in self.kernel)

    def halo_width(self, axis: int) -> int:
        spatial = axis - self.grid_offset
        return self.halo[spatial] if 0 <= spatial < len(self.halo) else 0

    def extend(self, x: jax.Array, axis: int, axes: Iterable[int]) -> jax.Array:
        """`x` with the spatial axes `axes` (0-based among the spatial axes) padded by
        their halo on both sides by the boundary rule: periodic wraps around, zero pads
        zeros. The operator's first axis sits at `axis` of `x`.

        ```python
        >>> S = po.Stencil([1, -2, 1], (4,))
        >>> S.extend(jnp.arange(4.0), 0, [0]).tolist()
        [3.0, 0.0, 1.0, 2.0, 3.0, 0.0]
        ```
        """
        for a in axes:
            x = pad_axis(x, axis + self.grid_offset + a, self.halo[a], self.boundary)
        return x

    def _valid(self, w, x: jax.Array, axis: int, adjoint: bool) -> jax.Array:
        """The map (its adjoint if `adjoint`) on an input whose every spatial axis is
        already extended by its halo on both sides: the output on the grid itself."""
        raise NotImplementedError

    def _forward(self, w, x, axis):
        return self._valid(w, self.extend(x, axis, range(len(self.grid))), axis, adjoint=False)

    def _backward(self, w, x, axis):
        return self._valid(w, self.extend(x, axis, range(len(self.grid))), axis, adjoint=True)


class Convolution(Correlation):
    """A trainable convolution with `c_in` input and `c_out` output channels on `grid`:
    domain `(c_in, *grid)`, range `(c_out, *grid)`, weight `(c_out, c_in, *kernel)`,

        y[o, i] = sum_{c, j} w[o, c, j] x[c, i + j - h],   h = kernel // 2,

    with `i`, `j`, `h` multi-indices over the spatial axes: a cross-correlation, as
    PyTorch's `Conv*d` and `lax.conv_general_dilated` compute, with "same" output size.
    Kernel sizes are odd. Indices outside the grid wrap around (`boundary="periodic"`)
    or read zeros (`boundary="zero"`). The exact adjoint (`.H`) correlates with the
    flipped, conjugated kernel, channels swapped, with the same boundary rule.

    `po.init` draws the weight normal with variance `1 / (c_in * prod(kernel))`, which
    keeps the variance of `x` (complex normal for a complex dtype). A real
    `Convolution` also acts on complex data of its precision. Distributed, the channel
    axis must be whole and the spatial axes may stay split (`Role.HALO`).

    ```python
    >>> C = po.Convolution(8, 4, (3, 3), (64, 64), name="conv")
    >>> θ = po.init(C, jax.random.key(0))        # {"conv": Array (8, 4, 3, 3)}
    >>> y = C(θ) @ jnp.ones((4, 64, 64, 10))     # (8, 64, 64, 10): a batch of 10
    ```
    """

    grid_offset = 1

    def __init__(
        self,
        c_out: int,
        c_in: int,
        kernel: Sequence[int],
        grid: Sequence[int],
        boundary: str = "periodic",
        dtype="float32",
        name: str | None = None,
    ):
        c_out = positive_int(c_out, "c_out", "Convolution")
        c_in = positive_int(c_in, "c_in", "Convolution")
        kernel = sizes(kernel, "kernel", "Convolution")
        grid = sizes(grid, "grid", "Convolution")
        check_kernel(kernel, grid, boundary, "Convolution")
        dtype = _dtypes.leaf_dtype(dtype, "float32", "Convolution")
        self._freeze(
            c_out=c_out, c_in=c_in, kernel=kernel, grid=grid, boundary=boundary,
            domain_shape=(c_in,) + grid, range_shape=(c_out,) + grid,
            dtype=dtype, range_dtype=dtype,
            flow=Flow.COMPLEX if _dtypes.is_complex(dtype) else Flow.REAL,
            roles=(Role.LOCAL,) + (Role.HALO,) * len(grid),
            name=self._name(name, "Convolution"),
            param_shape=(c_out, c_in) + kernel, param_dtype=dtype,
            param_axes=(None,) * (2 + len(grid)),
        )

    def init_param(self, key):
        fan_in = self.c_in * math.prod(self.kernel)
        return jax.random.normal(key, self.param_shape, self.param_dtype) / math.sqrt(fan_in)

    def _valid(self, w, x, axis, adjoint):
        if adjoint:
            w = adjoint_kernel(w, channels=True)
        if w.shape[:2] == (1, 1) and math.prod(w.shape[2:]) <= SHIFTED_TAPS:
            return shift_sum(w[0, 0], x, axis + 1)  # a scalar per tap: shifted slices beat a convolution
        return conv(w, x, axis)

    def describe(self) -> str:
        return f"Conv({dims(self.param_shape)}{name_label(self.name)}, {self.boundary})"
