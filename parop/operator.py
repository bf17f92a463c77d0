"""`Operator`, the interface every parop operator has, and `Bound`, an operator with
its parameters.

An operator is an immutable description of a linear map between tensors of
`domain_shape` and `range_shape`. Subclasses implement four things:

- `out_dtype(dtype)`: the output dtype on input of `dtype`, or `None` if refused;
- `_apply(θ, x, axis)`: the map on the axes `axis, axis + 1, ...` of `x`, which may
  have other axes before (kron neighbours) and after (kron neighbours, batch);
- `_adjoint()`: a new operator for the exact adjoint (`.H` caches it);
- `children()`: the operators it is built from.

Everything else (`@`, `+`, `.H`, `.T`, flat/tensor input handling, checks, equality
and the pytree registration) lives here.

**Operators are JAX values.** Every subclass is registered as a pytree when it is
defined (`Operator.__init_subclass__`): an operator's structure (sizes, dtypes, names,
options) is static, and its only array leaves are traced scalars (`c * A` with `c` a
JAX array). So `jax.jit(f)(A, x)` works, and equal operators (`==`: built the same
way from equal leaves, with one leaf object wherever the other has one) hash alike and
share one trace.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from . import _dtypes

Params = Mapping[str, Any]


class Operator:
    """A linear operator from `domain_shape` tensors to `range_shape` tensors.

    ```python
    >>> import parop as po
    >>> A = po.kron(po.DFT(8), po.Identity(4, dtype="complex64"))
    >>> A.domain_shape, A.range_shape, A.shape
    ((8, 4), (8, 4), (32, 32))
    ```
    """

    domain_shape: tuple[int, ...]
    range_shape: tuple[int, ...]
    dtype: np.dtype
    range_dtype: np.dtype

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, _flatten, functools.partial(_unflatten, cls))

    # -- the interface subclasses implement ------------------------------------------
    def out_dtype(self, dtype) -> np.dtype | None:
        raise NotImplementedError

    def _apply(self, θ: Params, x: jax.Array, axis: int) -> jax.Array:
        raise NotImplementedError

    def _adjoint(self) -> "Operator":
        raise NotImplementedError

    def children(self) -> tuple["Operator", ...]:
        return ()

    def naming_order(self) -> tuple["Operator", ...]:
        """The children in the order the walk that names unnamed leaves visits them
        (see `parop.params`): `children()`, unless a subclass says otherwise."""
        return self.children()

    @property
    def distributed(self) -> bool:
        """Whether this is a distributed operator (or built from distributed ones only)."""
        children = self.children()
        return bool(children) and all(c.distributed for c in children)

    def _meshes(self) -> frozenset:
        """The meshes of the distributed operators this one is built from (none for a
        serial operator). A combination of distributed operators runs on one
        (`parop.algebra` checks it where it combines them)."""
        return frozenset().union(*(c._meshes() for c in self.children()))

    def _init_shardings(self) -> dict:
        """`{name: sharding}`: where `po.init` draws each weight of the distributed
        operators this one is built from (named as this operator names them), the first
        that takes a weight deciding; none for a serial operator."""
        found: dict = {}
        for child in self.children():
            for name, sharding in child._init_shardings().items():
                found.setdefault(name, sharding)
        return found

    def _placement(self, batch_shape: tuple[int, ...], output: bool):
        """Where this operator's program takes its input (`output`: leaves its output) of
        these trailing batch axes: a `parop.distributed.operator.Placement` for a distributed
        operator (and what combines them), None for a serial one. The combinators read it
        to hand data from one program to the next (`parop.algebra.handed`)."""
        return None

    def _tree_fields(self) -> tuple[str, ...]:
        """The fields holding this node's pytree children: its child operators and any
        traced scalar. Everything else is static structure."""
        return ()

    def inverse(self) -> "Operator":
        """The inverse operator, where one exists (`DFT`, `Identity` and what is built
        from them); a `TypeError` otherwise."""
        raise TypeError(f"{self!r} has no inverse in parop")

    # -- derived ----------------------------------------------------------------------
    def __setattr__(self, name, value):
        raise AttributeError(f"parop operators are immutable: cannot set {name!r}")

    def _cache(self, name: str, make):
        """Memoise `make()` on this (immutable) instance."""
        try:
            return self.__dict__[name]
        except KeyError:
            value = make()
            object.__setattr__(self, name, value)
            return value

    @property
    def H(self) -> "Operator":
        """The exact adjoint: `<A x, y> == <x, A.H y>`; `A.H.H is A`."""

        def make():
            adjoint = self._adjoint()
            object.__setattr__(adjoint, "_H", self)
            return adjoint

        return self._cache("_H", make)

    @property
    def T(self) -> "Operator":
        """The transpose: `conj(A.H conj(y))`, what `jax.linear_transpose` of `A @ x`
        computes (for a complex-linear `A`, the matrix `M.T`); `A.T.T is A`."""

        def make():
            from .algebra import Transpose

            transpose = Transpose(self)
            object.__setattr__(transpose, "_T", self)
            return transpose

        return self._cache("_T", make)

    # -- equality: structural ----------------------------------------------------------
    def _key(self) -> tuple:
        """What identifies this operator: its class, static fields and children, and
        which of its unnamed leaves are one object (`parop.params.sharing`)."""

        def make():
            fields = tuple(
                (name, _key_of(value)) for name, value in sorted(vars(self).items()) if not name.startswith("_")
            )
            return (type(self).__name__,) + fields + (("sharing", _sharing(self)),)

        return self._cache("_key_cached", make)

    def __eq__(self, other) -> bool:
        return self is other or (type(self) is type(other) and self._key() == other._key())

    def __hash__(self) -> int:
        return self._cache("_hash", lambda: hash(self._key()))

    def __copy__(self) -> "Operator":
        return self  # immutable: a copy is the operator itself (a distributed one keeps its plans and programs)

    def __deepcopy__(self, memo) -> "Operator":
        return self

    @property
    def shape(self) -> tuple[int, int]:
        """`(prod(range_shape), prod(domain_shape))`, the shape of the dense matrix."""
        return (self.range_size, self.domain_size)

    @property
    def domain_size(self) -> int:
        return math.prod(self.domain_shape)

    @property
    def range_size(self) -> int:
        return math.prod(self.range_shape)

    @property
    def ndim(self) -> int:
        """The number of tensor axes the operator acts on (the same in domain and range)."""
        return len(self.domain_shape)

    @property
    def named(self) -> "Operator":
        """This operator with every parametric leaf carrying its name: an unnamed leaf
        gets the name this operator gives it (`Matrix_0`, ...: see `parop.params`).
        Itself where every leaf has a name.

        ```python
        >>> (po.Matrix(3, 3) @ po.Matrix(3, 3)).named
        Matrix(3×3 'Matrix_0') @ Matrix(3×3 'Matrix_1')
        ```
        """
        from .params import named

        def make():
            (root,) = named(self)
            object.__setattr__(root, "_named", root)
            return root

        return self._cache("_named", make)

    @property
    def parameters(self) -> dict[str, "Operator"]:
        """`{name: leaf}` for every parametric leaf, as `po.init` names them."""
        def make():  # imported on the first call only: `A @ x` asks on every call
            from .params import parametric_leaves

            return parametric_leaves(self)

        return self._cache("_parameters", make)

    # -- application --------------------------------------------------------------
    def apply(self, θ: Params | None, x) -> jax.Array:
        """`A(θ) @ x`. `x` is a tensor `domain_shape + batch` or flat `(N,)`/`(N, b)`.

        ```python
        >>> A = po.kron(po.DFT(8), po.Identity(4, dtype="complex64"))
        >>> y = A.apply({}, jnp.ones((8, 4), jnp.complex64))
        >>> y.shape, y.dtype
        ((8, 4), dtype('complex64'))
        ```
        """
        from .params import check_params

        x, unflatten = _as_tensor(self, x)
        x = _as_input_dtype(self, x)
        θ = {} if θ is None else θ
        check_params(self, θ)
        return unflatten(self.named._apply(θ, x, 0))

    def __call__(self, θ: Params) -> "Bound":
        return Bound(self, θ)

    def __matmul__(self, other):
        if isinstance(other, Operator):
            from .algebra import compose

            return compose(self, other)
        if self.parameters:
            raise TypeError(
                f"{self!r} has parameters {sorted(self.parameters)}: apply it as A(θ) @ x "
                "with θ = po.init(A, key)"
            )
        return self.apply({}, other)

    # -- arithmetic ------------------------------------------------------------------
    def __add__(self, other: "Operator") -> "Operator":
        from .algebra import add

        return add(self, other)

    def __sub__(self, other: "Operator") -> "Operator":
        from .algebra import add, scale

        return add(self, scale(-1, other))

    def __mul__(self, c) -> "Operator":
        from .algebra import scale

        return scale(c, self)

    __rmul__ = __mul__

    def __truediv__(self, c) -> "Operator":
        from .algebra import scale

        if isinstance(c, numbers.Number) and not isinstance(c, bool) and c == 0:
            raise ZeroDivisionError(f"{self!r} / {c!r}: an operator divided by zero")
        return scale(1 / c, self)

    def __neg__(self) -> "Operator":
        from .algebra import scale

        return scale(-1, self)

    # -- display ---------------------------------------------------------------------
    def __repr__(self) -> str:
        from .display import short

        return short(self)

    def _repr_html_(self) -> str:
        from .display import html

        return html(self)


def check_operator(value, where: str) -> None:
    """A `TypeError` naming `where` unless `value` is a parop operator (what `po.init`,
    `to_dense` and `dot_test` take)."""
    if not isinstance(value, Operator):
        raise TypeError(f"{where} takes a parop operator, got {type(value).__name__}")


class Bound:
    """An operator together with its parameters: what `A(θ)` returns. A pytree whose
    leaves are θ's arrays (and the operator's traced scalars), so it goes through
    `jax.jit`, `jax.grad` (the gradient is a `Bound` of the weight gradients),
    `jax.vmap` (a batch of weights) and `jax.tree.map`.

    ```python
    >>> A = po.Matrix(3, 2, name="A")
    >>> θ, x = po.init(A, jax.random.key(0)), jnp.ones(2, jnp.float32)
    >>> y = A(θ) @ x          # the same as A.apply(θ, x)
    >>> x2 = A(θ).H @ y
    >>> g = jax.grad(lambda B: jnp.sum(B @ x))(A(θ)).params
    >>> g["A"].tolist()       # d/dA of sum(A x): each row is x
    [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    ```
    """

    __slots__ = ("operator", "params")

    def __init__(self, operator: Operator, params: Params):
        object.__setattr__(self, "operator", operator)
        object.__setattr__(self, "params", params)

    def __setattr__(self, name, value):
        raise AttributeError("Bound is immutable")

    def __matmul__(self, x) -> jax.Array:
        if isinstance(x, (Operator, Bound)):
            raise TypeError("compose operators before binding parameters: (A @ B)(θ) @ x")
        return self.operator.apply(self.params, x)

    def apply(self, x) -> jax.Array:
        return self.operator.apply(self.params, x)

    @property
    def H(self) -> "Bound":
        return Bound(self.operator.H, self.params)

    @property
    def T(self) -> "Bound":
        return Bound(self.operator.T, self.params)

    def __repr__(self) -> str:
        return f"{self.operator!r}(θ)"


jax.tree_util.register_pytree_node(
    Bound, lambda b: ((b.operator, b.params), None), lambda _, children: Bound(*children)
)


def _key_of(value):
    """A hashable stand-in for a field's value in `Operator._key`."""
    if isinstance(value, Operator):
        return value._key()
    if isinstance(value, (tuple, list)):
        return tuple(_key_of(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, jax.Array):  # a traced scalar: the same array, or not equal
        return ("array", id(value))
    return value


def _sharing(op: Operator) -> tuple[int, ...]:
    from .params import sharing

    return sharing(op) if op.children() else ()


def _static(op: Operator, fields: tuple[str, ...]) -> tuple:
    return tuple((k, v) for k, v in sorted(vars(op).items()) if not k.startswith("_") and k not in fields)


def _flatten(op: Operator):
    """An operator as a pytree node: its `_tree_fields` are the children; the rest of
    its fields and its sharing pattern (or, for a node without children, the operator
    itself) the static data. Unflattening rebuilds the combinators around the same leaf
    objects; the sharing pattern in the static data keeps `A @ A` (one weight) and
    `A @ B` (two) from sharing a trace."""
    fields = op._tree_fields()
    if not fields:
        return (), op
    return tuple(getattr(op, f) for f in fields), (fields, _static(op, fields), _sharing(op))


def _unflatten(cls, aux, children):
    if not isinstance(aux, tuple):
        return aux
    fields, static, _ = aux
    return _built(cls, static + tuple(zip(fields, children)))


def _built(cls, fields) -> Operator:
    op = object.__new__(cls)
    for name, value in fields:
        object.__setattr__(op, name, value)
    return op


def map_children(op: Operator, fn) -> Operator:
    """A copy of the combinator `op` with each child operator `c` replaced by `fn(c)`."""
    fields = op._tree_fields()
    return _built(type(op), _static(op, fields) + tuple((f, _mapped(getattr(op, f), fn)) for f in fields))


def _mapped(value, fn):
    """`value` (a child operator, or a tuple of them, nested) with each operator `c` in it
    replaced by `fn(c)` (a function of its own, not a closure calling itself: that would
    be a reference cycle per call, left to the garbage collector)."""
    if isinstance(value, Operator):
        return fn(value)
    return tuple(_mapped(v, fn) for v in value) if isinstance(value, tuple) else value


def _as_tensor(op: Operator, x):
    """`x` as a `domain_shape + batch` tensor, and the function that shapes the result
    back (flat input gives flat output)."""
    if not isinstance(x, jax.Array):  # jnp.asarray is not free, even on an Array
        x = jnp.asarray(x)
    n = op.ndim
    if x.shape[:n] == op.domain_shape:
        return x, lambda y: y
    if x.ndim in (1, 2) and x.shape[0] == op.domain_size:
        batch = x.shape[1:]
        return _reshaped(x, op.domain_shape + batch), lambda y: _reshaped(y, (op.range_size,) + batch)
    raise ValueError(
        f"{op!r}: input of shape {x.shape} is neither a tensor of domain shape "
        f"{op.domain_shape} (+ trailing batch axes) nor flat ({op.domain_size},) or "
        f"({op.domain_size}, b)"
    )


def explicit_sharding(x: jax.Array) -> NamedSharding | None:
    """The sharding `x`'s type carries where `x` is split over Explicit mesh axes (JAX
    types only those, and asks that such arrays be moved explicitly), else None."""
    sharding = jax.typeof(x).sharding
    return sharding if any(entry is not None for entry in sharding.spec) else None


def describe_mesh(mesh) -> str:
    """A mesh as parop's errors name it: its axes and sizes, their type where it is not
    Auto, and the devices of a concrete mesh (an `AbstractMesh` has none):
    `{'d0': 2, 'd1': 4} over devices 0-7`."""
    kinds = {t.name for t in mesh.axis_types}
    out = str(dict(mesh.shape)) + ("" if kinds == {"Auto"} else f" ({', '.join(sorted(kinds))} axes)")
    if isinstance(mesh, AbstractMesh):
        return out
    ids = [d.id for d in np.ravel(mesh.devices)]
    consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
    return f"{out} over devices " + (f"{ids[0]}-{ids[-1]}" if consecutive else ", ".join(map(str, ids)))


def _reshaped(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`x.reshape(shape)`, replicated where `x` is split over Explicit mesh axes: JAX
    defines such a reshape only for some splits (a flat array is whole anyway: it enters
    a distributed program replicated). On Auto axes XLA places the result."""
    sharding = explicit_sharding(x)
    if sharding is not None:
        return jax.lax.reshape(x, shape, out_sharding=NamedSharding(sharding.mesh, PartitionSpec()))
    return x.reshape(shape)


def _as_input_dtype(op: Operator, x: jax.Array) -> jax.Array:
    """`x` itself where `op` takes its dtype; else `x` cast to `op.dtype` where `x` holds
    integers or booleans (numbers, whatever their width) or floats that the cast keeps
    exactly (float32 into complex64, bfloat16 into float32); else a `TypeError`."""
    if op.out_dtype(x.dtype) is not None:
        return x
    if not _dtypes.is_float(x.dtype) or np.can_cast(x.dtype, op.dtype, "safe"):
        return x.astype(op.dtype)
    raise TypeError(
        f"{op!r} takes {op.dtype} input, got {x.dtype} (casting would lose information; "
        f"cast it yourself, x.astype({op.dtype.name!r}), if that is what you mean)"
    )


def input_dtype(op: Operator, candidates) -> np.dtype | None:
    """The first dtype of `candidates` that `op` takes, or `None`."""
    for d in candidates:
        if op.out_dtype(_dtypes.canonical(d)) is not None:
            return _dtypes.canonical(d)
    return None
