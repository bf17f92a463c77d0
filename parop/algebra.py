"""The combinators: `kron`, composition (`@`), sums, scalar multiples, and their rules
for shapes, dtypes, adjoints and inverses."""

from __future__ import annotations

import functools
import itertools
import numbers
from typing import Callable

import jax
import numpy as np

from . import _dtypes
from .operator import Operator, Params, input_dtype


def _check_operators(where: str, ops) -> None:
    for op in ops:
        if not isinstance(op, Operator):
            raise TypeError(f"{where} takes parop operators, got {type(op).__name__}: {op!r}")


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
        for i in order:
            x = self.factors[i]._apply(θ, x, axis + self.offsets[i])
        return x

    def children(self):
        return self.factors

    def _adjoint(self):
        return Kron(tuple(f.H for f in self.factors))

    def inverse(self):
        return Kron(tuple(f.inverse() for f in self.factors))


_kron_schedule = functools.lru_cache(maxsize=None)(schedule)


class Compose(Operator):
    """`ops[0] @ ops[1] @ ...`: the last one is applied first. Build it with `@`."""

    def __init__(self, ops: tuple[Operator, ...]):
        _settle(
            self, [ops[-1].dtype] + [op.dtype for op in ops[:-1]],
            lambda: f"cannot compose {_flows(ops, ' @ ')}: no input dtype flows through every operator",
            ops=ops, domain_shape=ops[-1].domain_shape, range_shape=ops[0].range_shape,
        )

    def out_dtype(self, dtype):
        for op in reversed(self.ops):
            dtype = op.out_dtype(dtype)
            if dtype is None:
                return None
        return dtype

    def _apply(self, θ, x, axis):
        for op in reversed(self.ops):
            x = op._apply(θ, x, axis)
        return x

    def children(self):
        return self.ops

    def _adjoint(self):
        return Compose(tuple(op.H for op in reversed(self.ops)))

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
        return functools.reduce(lambda a, b: a + b, (t._apply(θ, x, axis) for t in self.terms))

    def children(self):
        return self.terms

    def _adjoint(self):
        return Sum(tuple(t.H for t in self.terms))


class Scale(Operator):
    """`c * A` for a Python number `c`. Build it with `*` or unary `-`."""

    def __init__(self, c: numbers.Number, op: Operator):
        for name in ("domain_shape", "range_shape", "dtype", "range_dtype"):
            object.__setattr__(self, name, getattr(op, name))
        object.__setattr__(self, "c", c)
        object.__setattr__(self, "op", op)

    def out_dtype(self, dtype):
        out = self.op.out_dtype(dtype)
        return None if out is None or (isinstance(self.c, complex) and not _dtypes.is_complex(out)) else out

    def _apply(self, θ, x, axis):
        return self.c * self.op._apply(θ, x, axis)

    def children(self):
        return (self.op,)

    def _adjoint(self):
        return Scale(self.c.conjugate(), self.op.H)

    def inverse(self):
        return Scale(1 / self.c, self.op.inverse())


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
    flat = tuple(itertools.chain.from_iterable(op.ops if isinstance(op, Compose) else (op,) for op in ops))
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


def scale(c: numbers.Number, op: Operator) -> Operator:
    """`c * op` for a Python or NumPy number `c` (what `*` with a number builds)."""
    _check_operators("*", (op,))
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Number):
        raise TypeError(
            f"an operator can be multiplied by a Python number, got {type(c).__name__}; "
            "for a trainable scale use po.Diagonal"
        )
    c = complex(c) if isinstance(c, numbers.Complex) and not isinstance(c, numbers.Real) else float(c)
    if isinstance(c, complex) and not _dtypes.is_complex(op.range_dtype):
        raise TypeError(f"cannot scale {op!r} (range dtype {op.range_dtype}) by the complex {c}")
    if isinstance(op, Scale):
        return Scale(c * op.c, op.op)
    return Scale(c, op)


def _checked(op: Operator) -> Operator:
    """`op`, after checking that its parameter names do not clash."""
    op.parameters
    return op
