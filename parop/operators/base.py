"""`Leaf`, what every leaf operator shares, and `Adjoint`, the adjoint of a leaf.

A leaf says, besides its shapes and dtypes:

- its dtype `flow` (see `parop._dtypes.Flow`);
- the `roles` of its domain axes for the distribution planner (see `Role`);
- its parameter, if it has one: `param_shape`, `param_dtype`, `param_axes` (which
  operator axis each weight axis runs along, `None` for a weight axis that is
  needed whole), and how to draw it (`init_param`); `dense_axes` for a dense matrix
  (which weight axes run along the output and the input), which lets the planner
  shard the weight (tensor parallelism);
- `_forward(w, x, axis)` and `_backward(w, x, axis)`: the map and its exact adjoint on
  the axes of `x` from `axis` on, with `w` the weight (or `None`).
"""

from __future__ import annotations

from enum import Enum

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _dtypes
from .._dtypes import Flow
from ..operator import Operator, Params


class Role(Enum):
    """What a leaf needs of one of its axes when the axis is partitioned over devices.

    - `LOCAL`: the axis must be whole on each device (DFT, Matrix, Restriction).
    - `POINTWISE`: element i of the output depends only on element i of the input
      (Identity, Diagonal, the mode axes of a `PerModeMatrix`): the axis stays split.
    - `REDUCE`: a sum over the axis (n -> 1): a local sum, then a `psum`.
    - `BROADCAST`: the adjoint of `REDUCE` (1 -> n): each device fills its own part.
    - `HALO`: the axis may stay split: the operator needs only `halo` neighbouring
      planes from each neighbour, brought by a halo exchange (Convolution, Stencil).
    """

    LOCAL = "local"
    POINTWISE = "pointwise"
    REDUCE = "reduce"
    BROADCAST = "broadcast"
    HALO = "halo"

    @property
    def adjoint(self) -> "Role":
        return {Role.REDUCE: Role.BROADCAST, Role.BROADCAST: Role.REDUCE}.get(self, self)


def dims(shape) -> str:
    """A shape as a label shows it: `8×4`."""
    return "×".join(map(str, shape))


def name_label(name: str | None) -> str:
    """` 'w'` for a leaf named `w`; nothing for an unnamed one (its name comes from the
    operator it is used in: `po.tree` and `A.named` show it)."""
    return "" if name is None else f" {name!r}"


def mix(w: jax.Array, x: jax.Array, axis: int, transpose: bool) -> jax.Array:
    """`y[o, m...] = sum_i w[o, i, m...] x[i, m...]` on the axes of `x` from `axis` on:
    `w`'s first two axes contract axis `axis` of `x`, its other axes (the modes of a
    `PerModeMatrix`; none for a `Matrix`) run along the next axes of `x`, elementwise.
    `transpose`: sum over `o` instead (`y[i, m...] = sum_o w[o, i, m...] x[o, m...]`).

    One `dot_general`, whatever the number of axes (integer einsum labels). A real `w`
    on complex `x` acts on the real and imaginary parts: two real products, half the
    work of a complex one.
    """
    if jnp.iscomplexobj(x) and not jnp.iscomplexobj(w):
        return lax.complex(mix(w, x.real, axis, transpose), mix(w, x.imag, axis, transpose))
    o, i = x.ndim, x.ndim + 1  # labels 0 .. x.ndim - 1 are the axes of x
    x_in, y_out = (o, i) if transpose else (i, o)
    labels = list(range(x.ndim))
    modes = labels[axis + 1 : axis + w.ndim - 1]
    before, after = labels[:axis], labels[axis + 1 :]
    return jnp.einsum(w, [o, i, *modes], x, [*before, x_in, *after], [*before, y_out, *after])


class Leaf(Operator):
    """Base class of the leaf operators."""

    flow: Flow
    roles: tuple[Role, ...]
    name: str | None = None  # None: unnamed, named by the operator it is used in (`Operator.named`)
    param_shape: tuple[int, ...] | None = None
    param_dtype: np.dtype | None = None
    param_axes: tuple[int | None, ...] = ()
    dense_axes: tuple[int, int] | None = None  # weight axes along the output, the input

    def _freeze(self, **fields) -> None:
        for key, value in fields.items():
            object.__setattr__(self, key, value)

    def _name(self, name: str | None, prefix: str) -> str | None:
        """`name` checked: `None` (an unnamed leaf, named by the operator it is used in:
        see `parop.params`) or a non-empty str."""
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"{prefix}: name must be a non-empty str, got {name!r}")
        return name

    def out_dtype(self, dtype) -> np.dtype | None:
        return _dtypes.out_dtype(self.flow, self.dtype, _dtypes.canonical(dtype))

    def init_param(self, key: jax.Array) -> jax.Array:
        raise NotImplementedError

    def weight(self, θ: Params):
        """This leaf's weight in `θ` (`None` for a leaf without one), by its name: for
        an unnamed leaf, the name it has alone (`Matrix_0`; in a larger operator, apply
        that operator, which names its leaves)."""
        return None if self.param_shape is None else θ[self.named.name]

    def _forward(self, w, x: jax.Array, axis: int) -> jax.Array:
        raise NotImplementedError

    def _backward(self, w, x: jax.Array, axis: int) -> jax.Array:
        raise NotImplementedError

    def _apply(self, θ: Params, x: jax.Array, axis: int) -> jax.Array:
        return self._forward(self.weight(θ), x, axis)

    def _adjoint(self) -> Operator:
        return Adjoint(self)

    @property
    def leaf(self) -> "Leaf":
        """The leaf that owns the parameter (itself; the wrapped leaf for an adjoint)."""
        return self

    def describe(self) -> str:
        """How the leaf shows in `repr`, `po.tree` and plans (`DFT(8)`, `Matrix(4×4 'w')`)."""
        return type(self).__name__

    def halo_width(self, axis: int) -> int:
        """The planes the leaf reads on either side along its axis `axis` (a `Role.HALO`
        axis: what a halo exchange brings from each neighbour); 0 for other axes."""
        return 0


class Adjoint(Leaf):
    """The adjoint of a leaf: same parameter, domain and range swapped."""

    def __init__(self, of: Leaf):
        self._freeze(
            of=of,
            domain_shape=of.range_shape,
            range_shape=of.domain_shape,
            dtype=of.range_dtype,
            range_dtype=of.dtype,
            flow=of.flow.adjoint,
            roles=tuple(r.adjoint for r in of.roles),
            name=of.name,
            param_shape=of.param_shape,
            param_dtype=of.param_dtype,
            param_axes=of.param_axes,
            dense_axes=None if of.dense_axes is None else of.dense_axes[::-1],
        )

    @property
    def leaf(self) -> Leaf:
        return self.of

    def children(self) -> tuple[Operator, ...]:
        return (self.of,)

    def init_param(self, key: jax.Array) -> jax.Array:
        return self.of.init_param(key)

    def _forward(self, w, x, axis):
        return self.of._backward(w, x, axis)

    def _backward(self, w, x, axis):
        return self.of._forward(w, x, axis)

    def _adjoint(self) -> Operator:
        return self.of

    def inverse(self) -> Operator:
        return self.of.inverse().H

    def describe(self) -> str:
        return f"{self.of.describe()}ᴴ"

    def halo_width(self, axis: int) -> int:
        return self.of.halo_width(axis)
