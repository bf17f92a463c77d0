"""The combinators: `kron`, composition (`@`), sums, scalar multiples, transposes, and
their rules for shapes, dtypes, adjoints and inverses."""

from __future__ import annotations

import functools
import itertools
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes
from .operator import Operator, Params, describe_mesh, input_dtype
from .operators import dft


def _check_operators(where: str, ops) -> None:
    for op in ops:
        if not isinstance(op, Operator):
            raise TypeError(f"{where} takes parop operators, got {type(op).__name__}: {op!r}")
    if where == "kron" and any(op.distributed for op in ops):
        raise TypeError(
            f"kron of a distributed operator ({', '.join(repr(op) for op in ops)}): a distributed program "
            "acts on whole tensors; build the kron first and distribute it: po.distribute(po.kron(A, B), ...)"
        )
    kinds = {op.distributed for op in ops}
    if len(kinds) > 1:
        raise TypeError(
            f"{where} of a distributed and a serial operator ({', '.join(repr(op) for op in ops)}): distribute "
            "the serial one too, or build the whole operator first and distribute it once"
        )
    meshes = list(dict.fromkeys(mesh for op in ops for mesh in op._meshes()))  # in order of appearance
    if len(meshes) > 1:
        # JAX compiles one jitted computation (or gradient) for one mesh: the output sharding of
        # one that holds programs on two is an IndivisibleError or an incompatible-devices error
        raise ValueError(
            f"{where} of operators distributed on different meshes ({', '.join(repr(op) for op in ops)}: "
            f"meshes {' and '.join(map(describe_mesh, meshes))}): a combination runs on one mesh; "
            "distribute them on one: mesh=D.mesh, with a PartitionSpec where a tensor axis takes several "
            "mesh axes, as P(None, ('d0', 'd1'))"
        )


def _settle(op: Operator, candidates, failure: Callable[[], str], **fields) -> None:
    """Sets `fields` on the new combinator `op`, then its `dtype` (the first of
    `candidates` that flows through it) and `range_dtype`; a `TypeError` saying
    `failure()` where none does."""
    for name, value in fields.items():
        object.__setattr__(op, name, value)
    dtype = input_dtype(op, candidates)
    if dtype is None:
        raise TypeError(failure())
    object.__setattr__(op, "dtype", dtype)
    object.__setattr__(op, "range_dtype", op.out_dtype(dtype))


def _flows(ops, sep: str) -> str:
    return sep.join(f"{op!r} [{op.dtype} -> {op.range_dtype}]" for op in ops)


def _ordered(factors, indices):
    """Shrinking factors first, so that later ones see less data."""
    return sorted(indices, key=lambda i: factors[i].range_size / factors[i].domain_size)


def schedule(factors: tuple[Operator, ...], dtype) -> tuple[tuple[int, ...], np.dtype] | None:
    """An order in which to apply kron `factors` to data of `dtype`, and the output
    dtype; `None` if there is none.

    Factors that keep real data real (or complex data complex) go first; then at most
    one factor that changes it (a real `DFT`, or its adjoint or inverse); then the rest.
    That is the one order in which every factor sees data it takes, and in which a
    real-only-linear factor (one that takes a real part) comes after every complex
    factor, so the kron is the tensor product of its factors.
    """
    dtype = _dtypes.canonical(dtype)
    remaining, order, changed = list(range(len(factors))), [], False
    while remaining:
        outs = {i: factors[i].out_dtype(dtype) for i in remaining}
        same = [i for i in remaining if outs[i] is not None
                and _dtypes.is_complex(outs[i]) == _dtypes.is_complex(dtype)]
        if same:
            order += _ordered(factors, same)
            remaining = [i for i in remaining if i not in same]
            continue
        changing = [i for i in remaining if outs[i] is not None]
        if not changing or changed:
            return None
        order.append(changing[0])
        remaining.remove(changing[0])
        dtype, changed = outs[changing[0]], True
    return tuple(order), dtype


class Kron(Operator):
    """The Kronecker product of its factors; factor i acts on its own axes of a
    row-major tensor. Build it with `po.kron`."""

    def __init__(self, factors: tuple[Operator, ...]):
        offsets = tuple(itertools.accumulate((f.ndim for f in factors), initial=0))[:-1]
        _settle(
            self, [f.dtype for f in factors],
            lambda: f"kron: no order of the factors {_flows(factors, ', ')} is valid: every factor "
            "must see the dtype it takes, and at most one factor may turn real data complex (a "
            "real DFT) or complex data real (its adjoint or inverse); precisions must agree",
            factors=factors, offsets=offsets,
            domain_shape=sum((f.domain_shape for f in factors), ()),
            range_shape=sum((f.range_shape for f in factors), ()),
        )

    def schedule(self, dtype) -> tuple[tuple[int, ...], np.dtype] | None:
        return _kron_schedule(self.factors, _dtypes.canonical(dtype))

    def out_dtype(self, dtype):
        s = self.schedule(dtype)
        return None if s is None else s[1]

    def _apply(self, θ: Params, x: jax.Array, axis: int) -> jax.Array:
        order, _ = self.schedule(x.dtype)
        steps = [(self.factors[i], axis + self.offsets[i]) for i in order]
        # consecutive DFTs run as one multi-axis FFT: one FFT op for XLA, not one per axis
        for item in dft.fused_runs(steps, lambda step: step):
            if isinstance(item, list):
                x = dft.apply_fused(item, x)
            else:
                factor, at = item
                x = factor._apply(θ, x, at)
        return x

    def children(self):
        return self.factors

    def _tree_fields(self):
        return ("factors",)

    def _adjoint(self):
        return Kron(tuple(f.H for f in self.factors))

    def inverse(self):
        return Kron(tuple(f.inverse() for f in self.factors))


_kron_schedule = functools.lru_cache(maxsize=4096)(schedule)  # bounded: one entry per (factors, dtype)


class Compose(Operator):
    """`ops[0] @ ops[1] @ ...`: the last one is applied first. Build it with `@`.

    `right_to_left`: its unnamed leaves are named from the last operator to the first.
    `.H` sets it (where there is more than one unnamed leaf to name), so that the
    adjoint `B.H @ A.H` of `A @ B` names its leaves as `A @ B` does."""

    def __init__(self, ops: tuple[Operator, ...], right_to_left: bool = False):
        _settle(
            self, [ops[-1].dtype] + [op.dtype for op in ops[:-1]],
            lambda: f"cannot compose {_flows(ops, ' @ ')}: no input dtype flows through every operator",
            ops=ops, right_to_left=right_to_left, domain_shape=ops[-1].domain_shape, range_shape=ops[0].range_shape,
        )

    def out_dtype(self, dtype):
        for op in reversed(self.ops):
            dtype = op.out_dtype(dtype)
            if dtype is None:
                return None
        return dtype

    def _apply(self, θ, x, axis):
        moves = self._cache("_moves", dict) if self.distributed and x.size > 0 else None  # (empty: no plans)
        for k in reversed(range(len(self.ops))):
            if moves is not None and k < len(self.ops) - 1:
                batch = x.shape[len(self.ops[k].domain_shape):]
                x = handed(x, self.ops[k + 1]._placement(batch, True), self.ops[k]._placement(batch, False), moves)
            x = self.ops[k]._apply(θ, x, axis)
        return x

    def _placement(self, batch_shape, output):
        return (self.ops[0] if output else self.ops[-1])._placement(batch_shape, output)

    def children(self):
        return self.ops

    def naming_order(self):
        return self.ops[::-1] if self.right_to_left else self.ops

    def _tree_fields(self):
        return ("ops",)

    def _adjoint(self):
        from .params import unnamed_owners

        flip = len(unnamed_owners(self)) > 1  # the order of naming matters
        return Compose(tuple(op.H for op in reversed(self.ops)), flip and not self.right_to_left)

    def inverse(self):
        return Compose(tuple(op.inverse() for op in reversed(self.ops)))


class Sum(Operator):
    """`terms[0] + terms[1] + ...`. Build it with `+` and `-`."""

    def __init__(self, terms: tuple[Operator, ...]):
        _settle(
            self, [t.dtype for t in terms],
            lambda: f"cannot add {_flows(terms, ' + ')}: no input dtype gives every term the same output dtype",
            terms=terms, domain_shape=terms[0].domain_shape, range_shape=terms[0].range_shape,
        )

    def out_dtype(self, dtype):
        outs = {t.out_dtype(dtype) for t in self.terms}
        return outs.pop() if len(outs) == 1 else None

    def _apply(self, θ, x, axis):
        if not self.distributed or x.size == 0:  # (an empty batch: nothing to plan or move)
            return functools.reduce(lambda a, b: a + b, (t._apply(θ, x, axis) for t in self.terms))
        # the sum takes `x` where its first term does (`_placement`): each other term gets it
        # where it takes it, and its output is added where the first term leaves its own
        first, moves, batch = self.terms[0], self._cache("_moves", dict), x.shape[len(self.domain_shape):]
        takes, leaves = first._placement(batch, False), first._placement(batch, True)
        y = first._apply(θ, x, axis)
        for term in self.terms[1:]:
            out = term._apply(θ, handed(x, takes, term._placement(batch, False), moves), axis)
            y = y + handed(out, term._placement(batch, True), leaves, moves)
        return y

    def _placement(self, batch_shape, output):
        return self.terms[0]._placement(batch_shape, output)

    def children(self):
        return self.terms

    def _tree_fields(self):
        return ("terms",)

    def _adjoint(self):
        return Sum(tuple(t.H for t in self.terms))


class Scale(Operator):
    """`c * A`: the scalar `c` times `A`'s output, or, with `first=True`, times its
    input (`A @ (c * x)`, where the adjoint of an operator with a real domain or range
    needs it: such an operator is only real-linear, so the conjugated scalar must meet
    the complex side). `c` is a Python number (static: a new value is a new operator)
    or a 0-d JAX array (a pytree leaf: traced under `jit` and `grad`, no retrace per
    value). Build it with `*`, `/` or unary `-`."""

    def __init__(self, c, op: Operator, first: bool = False):
        for name in ("domain_shape", "range_shape", "dtype", "range_dtype"):
            object.__setattr__(self, name, getattr(op, name))
        object.__setattr__(self, "c", c)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "first", first)

    @property
    def complex(self) -> bool:
        """Whether `c` is complex (then the data it meets must be complex)."""
        return is_complex_scalar(self.c)

    def out_dtype(self, dtype):
        if self.first and self.complex and not _dtypes.is_complex(_dtypes.canonical(dtype)):
            return None
        out = self.op.out_dtype(dtype)
        if out is None or (not self.first and self.complex and not _dtypes.is_complex(out)):
            return None
        return out

    def _apply(self, θ, x, axis):
        if self.first:
            return self.op._apply(θ, times(self.c, x), axis)
        return times(self.c, self.op._apply(θ, x, axis))

    def _placement(self, batch_shape, output):
        return self.op._placement(batch_shape, output)

    def children(self):
        return (self.op,)

    def _tree_fields(self):
        return ("c", "op") if isinstance(self.c, jax.Array) else ("op",)

    def _adjoint(self):
        return Scale(conj(self.c), self.op.H, first=not self.first)

    def inverse(self):
        if not isinstance(self.c, jax.core.Tracer) and self.c == 0:  # a traced scalar is not known here
            raise ValueError(f"{self!r} has no inverse: its scalar is zero")
        return Scale(1 / self.c, self.op.inverse(), first=not self.first)


class Transpose(Operator):
    """`A.T`: `conj(A.H conj(y))`, the transpose JAX's `linear_transpose` computes.
    For a complex-linear `A` with matrix `M` it is `M.T`; where `A` has a real domain or
    range (a real `DFT`) it is the transpose of the real-linear map. Build it with `.T`."""

    def __init__(self, op: Operator):
        adjoint = op.H
        for name in ("domain_shape", "range_shape", "dtype", "range_dtype"):
            object.__setattr__(self, name, getattr(adjoint, name))
        object.__setattr__(self, "op", op)

    def out_dtype(self, dtype):
        return self.op.H.out_dtype(dtype)

    def _apply(self, θ, x, axis):
        return conj(self.op.H._apply(θ, conj(x), axis))

    def _placement(self, batch_shape, output):
        return self.op.H._placement(batch_shape, output)

    def children(self):
        return (self.op,)

    def _tree_fields(self):
        return ("op",)

    def _adjoint(self):
        return Transpose(self.op.H)  # (A.T).H is the elementwise conjugate of A

    def inverse(self):
        return Transpose(self.op.inverse())


def handed(x: jax.Array, source, target, moves: dict) -> jax.Array:
    """`x`, laid out as `source` says (a `parop.distributed.operator.Placement`, or
    None: not known), where `target` wants it: from one distributed program to another
    laid out otherwise on the same mesh, moved by a planned repartition
    (`Placement.onto`, its program kept in `moves`); otherwise `x` itself, which the
    next program's input moves if it must. (Left to XLA, the `+` of two outputs laid
    out differently can gather whole arrays onto every device.)"""
    if source is None or target is None or source == target:
        return x
    return source.onto(x, target, moves)


def is_complex_scalar(c) -> bool:
    return isinstance(c, complex) or (isinstance(c, jax.Array) and _dtypes.is_complex(c.dtype))


def conj(c):
    """The complex conjugate of a scalar or an array (itself where it is real)."""
    if isinstance(c, (int, float)):
        return c
    if isinstance(c, complex):
        return c.conjugate()
    return jnp.conj(c) if _dtypes.is_complex(c.dtype) else c


def times(c, x: jax.Array) -> jax.Array:
    """`c * x` in `x`'s dtype (a traced scalar is cast: JAX's strict promotion)."""
    if isinstance(c, jax.Array):
        c = c.astype(x.dtype) if _dtypes.is_complex(x.dtype) or not _dtypes.is_complex(c.dtype) else c
    return c * x


def kron(*factors: Operator) -> Operator:
    """The Kronecker product `A0 ⊗ A1 ⊗ ... ⊗ Ak`.

    Factor i acts on its own axes of a row-major tensor of shape
    `A0.domain_shape + A1.domain_shape + ...`; on C-order flattened vectors the result
    equals `np.kron(dense(A0), dense(A1), ...)`. Nested krons flatten. The factors are
    applied one axis at a time (never as a Kronecker matrix), in an order the dtypes
    allow: a real `DFT` runs before the complex factors.

    ```python
    >>> F = po.kron(po.DFT(30), po.DFT(20), po.DFT(10, dtype=jnp.float32))
    >>> F.domain_shape, F.range_shape, F.dtype, F.range_dtype
    ((30, 20, 10), (30, 20, 6), dtype('float32'), dtype('complex64'))
    ```
    """
    _check_operators("kron", factors)
    if not factors:
        raise ValueError("kron needs at least one operator")
    flat = tuple(itertools.chain.from_iterable(f.factors if isinstance(f, Kron) else (f,) for f in factors))
    return _checked(Kron(flat)) if len(flat) > 1 else flat[0]


def compose(*ops: Operator) -> Operator:
    """`ops[0] @ ops[1] @ ...` (what `@` between operators builds)."""
    _check_operators("@", ops)
    for a, b in zip(ops, ops[1:]):
        if a.domain_shape != b.range_shape:
            raise ValueError(
                f"cannot compose {a!r} @ {b!r}: {a!r} takes shape {a.domain_shape} "
                f"but {b!r} gives {b.range_shape}"
            )
    flat = tuple(itertools.chain.from_iterable(
        op.ops if isinstance(op, Compose) and not op.right_to_left else (op,) for op in ops))
    return _checked(Compose(flat))


def add(*terms: Operator) -> Operator:
    """`terms[0] + terms[1] + ...` (what `+` between operators builds)."""
    _check_operators("+", terms)
    a = terms[0]
    for b in terms[1:]:
        if (a.domain_shape, a.range_shape) != (b.domain_shape, b.range_shape):
            raise ValueError(
                f"cannot add {a!r} and {b!r}: shapes {a.domain_shape} -> {a.range_shape} "
                f"and {b.domain_shape} -> {b.range_shape} differ"
            )
    flat = tuple(itertools.chain.from_iterable(t.terms if isinstance(t, Sum) else (t,) for t in terms))
    return _checked(Sum(flat))


def scale(c, op: Operator) -> Operator:
    """`c * op` (what `*` and `/` with a number build). `c` is a Python or NumPy number,
    or a 0-d JAX array (traced under `jit` and `grad`)."""
    _check_operators("*", (op,))
    if isinstance(c, jax.Array) or (isinstance(c, np.ndarray) and c.ndim == 0):
        if c.ndim != 0 or not _dtypes.is_float(c.dtype):
            raise TypeError(f"an operator can be multiplied by a scalar, got an array of shape {c.shape} "
                            f"and dtype {c.dtype}; for a trainable scale per index use po.Diagonal")
        c = jnp.asarray(c) if isinstance(c, jax.Array) else c.item()
    elif isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Number):
        raise TypeError(
            f"an operator can be multiplied by a number or a 0-d JAX array, got {type(c).__name__}; "
            "for a trainable scale per index use po.Diagonal"
        )
    if not isinstance(c, jax.Array):
        c = complex(c) if isinstance(c, numbers.Complex) and not isinstance(c, numbers.Real) else float(c)
    if is_complex_scalar(c) and not _dtypes.is_complex(op.range_dtype):
        raise TypeError(f"cannot scale {op!r} (range dtype {op.range_dtype}) by the complex {c}")
    if isinstance(op, Scale) and not op.first and not isinstance(c, jax.Array) and not isinstance(op.c, jax.Array):
        return Scale(c * op.c, op.op)
    return Scale(c, op)


def _checked(op: Operator) -> Operator:
    """`op`, after checking that its parameter names do not clash."""
    op.parameters
    return op
