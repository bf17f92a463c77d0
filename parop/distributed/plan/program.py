"""An operator as a *program*: its leaves in serial order (`Step`s), with the
dependencies that bind their order.

Two steps keep their order when they share a tensor axis, or when their dtypes do
not let them pass each other: a step that turns real data complex or back (a real
`DFT`, its adjoint or inverse: a *barrier*) keeps its place among the steps that need
complex data, and a conjugation (from `A.T`) keeps its place among every step that is
not real-linear with real coefficients. Everything else may run in any order that
the planner finds cheapest.

A traced scalar (`c * A` with `c` a JAX array) becomes a `Slot`: the plan refers to
the scalar by its position among the operator's pytree leaves, so one plan serves
every value of it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Union

import jax
import numpy as np

from ... import _dtypes
from ..._dtypes import Flow
from ...algebra import Compose, Kron, Scale, Sum, Transpose
from ...operator import Operator
from ...operators import Identity, Leaf, Role
from ...params import named

FREE, COMPLEX, BARRIER, CONJ = "free", "complex", "barrier", "conj"


@dataclass(frozen=True)
class Slot:
    """A traced scalar: the `index`-th pytree leaf of the operator, conjugated or not."""

    index: int
    dtype: np.dtype
    conj: bool = False

    @property
    def complex(self) -> bool:
        return _dtypes.is_complex(self.dtype)

    def conjugate(self) -> "Slot":
        return Slot(self.index, self.dtype, not self.conj)


Scalar = Union[float, complex, Slot]


@dataclass(frozen=True, eq=False)
class Step:
    """One unit of the serial program: a leaf on its axes, a scalar, a conjugation, or
    a sum of sub-programs (`terms`) on `axes`. `in_sizes`/`out_sizes` are the sizes of
    its axes before and after it."""

    axes: tuple[int, ...]
    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    flow: str
    in_dtype: np.dtype
    out_dtype: np.dtype
    leaf: Leaf | None = None
    scalar: Scalar | None = None
    conj: bool = False
    terms: tuple["Program", ...] = ()
    barrier: bool = False  # between two operators of a chain (a pointwise function runs there)

    @property
    def roles(self) -> tuple[Role, ...]:
        return self.leaf.roles if self.leaf is not None else ()

    @property
    def weighted(self) -> bool:
        return self.leaf is not None and self.leaf.param_shape is not None

    @property
    def dense(self) -> bool:
        """A dense `Matrix` step (it has tensor-parallel forms)."""
        return self.leaf is not None and self.leaf.dense_axes is not None

    def resize(self, sizes: list[int]) -> None:
        """`sizes` (a tensor's, in place) after this step."""
        for a, n in zip(self.axes, self.out_sizes):
            sizes[a] = n

    def out_itemsize(self, itemsize: int) -> int:
        """The itemsize of the tensor after this step, `itemsize` before it: only a barrier
        that changes the dtype (a real DFT, its adjoint or inverse) changes it."""
        return self.out_dtype.itemsize if self.flow == BARRIER and self.in_dtype != self.out_dtype else itemsize

    def transposed(self) -> "Step":
        """The step of the adjoint: sizes and dtypes swapped, the leaf's adjoint, the
        scalar conjugated."""
        scalar = self.scalar.conjugate() if isinstance(self.scalar, (Slot, complex)) else self.scalar
        return Step(self.axes, self.out_sizes, self.in_sizes, self.flow, self.out_dtype, self.in_dtype,
                    leaf=None if self.leaf is None else self.leaf.H, scalar=scalar, conj=self.conj)

    def label(self) -> str:
        """What the step runs, as a plan shows it."""
        from ...display import scalar

        if self.leaf is not None:
            return self.leaf.describe()
        if self.conj:
            return "conjugate"
        c = self.scalar
        return f"scale by {'conj(c)' if isinstance(c, Slot) and c.conj else scalar(c)}"

    @property
    def bytes_factor(self) -> float:
        """How much this step multiplies the bytes of the tensor."""
        size = math.prod(self.out_sizes) / max(1, math.prod(self.in_sizes)) if self.axes else 1.0
        return size * self.out_dtype.itemsize / self.in_dtype.itemsize


@dataclass(frozen=True, eq=False)
class Program:
    """`steps` with `preds[j]`, the bit mask of the steps step j must follow, for input
    of `shape` (the sizes its steps see; a sum's terms start from the sizes the sum
    sees) and `dtype`."""

    steps: tuple[Step, ...]
    preds: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def full(self) -> int:
        return (1 << len(self.steps)) - 1

    @functools.cached_property
    def ancestors(self) -> tuple[int, ...]:
        """Per step, the bit mask of the steps that must run before it."""
        found: list[int] = []
        for mask in self.preds:
            for i in range(len(found)):
                if mask >> i & 1:
                    mask |= found[i]
            found.append(mask)
        return tuple(found)

    @functools.cached_property
    def descendants(self) -> tuple[int, ...]:
        """Per step, the bit mask of the steps that must run after it."""
        return tuple(sum(1 << k for k, before in enumerate(self.ancestors) if before >> j & 1)
                     for j in range(len(self.steps)))

    def all_steps(self):
        """Every step, a sum's terms' steps too (after the sum's own)."""
        for step in self.steps:
            yield step
            for term in step.terms:
                yield from term.all_steps()

    def segment(self, i: int, shape: tuple[int, ...], last: int | None = None) -> "Program":
        """The steps of a chain's `i`-th operator (between its barriers), or of its
        operators `i` to `last` with the barriers between them, as a program of their own,
        on a tensor of `shape`."""
        starts = [0] + [j + 1 for j, s in enumerate(self.steps) if s.barrier]
        ends = [j for j, s in enumerate(self.steps) if s.barrier] + [len(self.steps)]
        first, stop = starts[i], ends[i if last is None else last]
        mask = (1 << (stop - first)) - 1
        preds = tuple((p >> first) & mask for p in self.preds[first:stop])
        return Program(self.steps[first:stop], preds, tuple(shape), self.dtype)


def program(op: Operator, shape: tuple[int, ...], dtype=None) -> Program:
    """`op` (acting on the leading axes of a tensor of `shape`) as a `Program`."""
    return chain([op], shape, dtype)


def chain(ops, shape: tuple[int, ...], dtype=None) -> Program:
    """The operators `ops` applied one after the other (each on the leading axes of a
    tensor of `shape` at first) as one `Program`, with a barrier step between two of
    them: every step of one comes before every step of the next (a pointwise function,
    a bias or an activation, runs there). A traced scalar's `Slot` counts the leaves of
    its own operator. The operators' unnamed leaves are named together
    (`parop.params.named`): a step's weight is `step.leaf.name`."""
    ops = named(*ops)
    first = dtype = _dtypes.canonical(ops[0].dtype if dtype is None else dtype)
    sizes, steps = list(shape), []
    for k, op in enumerate(ops):
        if k:
            steps.append(Step(tuple(range(len(sizes))), tuple(sizes), tuple(sizes), FREE, dtype, dtype, barrier=True))
        builder = _Builder({id(leaf): i for i, leaf in enumerate(jax.tree.leaves(op))}, sizes)
        dtype = builder.steps(op, 0, dtype, steps)
    return _order(steps, tuple(shape), first)


def transposed(prog: Program) -> Program:
    """The program of the adjoint: `prog`'s steps in reverse order, each transposed (a
    sum's terms too; a barrier stays one), on the tensor `prog` gives."""
    sizes = list(prog.shape)
    for step in prog.steps:
        step.resize(sizes)
    steps = [step if step.barrier else
             replace(step.transposed(), terms=tuple(map(transposed, step.terms))) if step.terms else step.transposed()
             for step in reversed(prog.steps)]
    return _order(steps, tuple(sizes), prog.steps[-1].out_dtype if prog.steps else prog.dtype)


def prices_alike_backwards(prog: Program, shard_weights) -> bool:
    """Whether, trained, every route of `prog` costs what its transpose costs as a route of
    `transposed(prog)` (the other way between the same layouts), where every mesh axis is
    in use: no step can sum a split away or bring one (`REDUCE`, `BROADCAST`), none runs
    tensor-parallel (a dense `Matrix` where `shard_weights` allows it), and each halo
    exchange sends the same planes either way (the step keeps its sizes). Then each
    action's transpose is an action of the search on the same tensor in the same layout,
    with the same collectives forward and backward swapped (an `all_to_all` and the one
    back; a step and its adjoint in the same form, with the same weight gradient)."""
    for step in prog.all_steps():
        roles = step.roles
        if Role.REDUCE in roles or Role.BROADCAST in roles or (shard_weights and step.dense):
            return False
        if Role.HALO in roles and step.in_sizes != step.out_sizes:
            return False
    return True


def _flow(flow: Flow) -> str:
    if flow in (Flow.R2C, Flow.C2R):
        return BARRIER
    return COMPLEX if flow is Flow.COMPLEX else FREE


def ordered(a: Step, b: Step) -> bool:
    """Whether `a` (earlier in the serial program) must stay before `b`."""
    if set(a.axes) & set(b.axes):
        return True
    flows = {a.flow, b.flow}
    return FREE not in flows and bool(flows & {BARRIER, CONJ})


def _order(steps: list[Step], shape: tuple[int, ...], dtype: np.dtype) -> Program:
    preds = tuple(sum(1 << i for i, a in enumerate(steps[:j]) if ordered(a, b)) for j, b in enumerate(steps))
    return Program(tuple(steps), preds, shape, dtype)


class _Builder:
    """Collects an operator's steps; `sizes` are the tensor's sizes as they go."""

    def __init__(self, slots: dict[int, int], sizes: list[int]):
        self.slots, self.sizes = slots, sizes

    def step(self, steps: list, axes, out_sizes, flow, dtype, out, **kind) -> np.dtype:
        in_sizes = tuple(self.sizes[a] for a in axes)
        for a, n in zip(axes, out_sizes):
            self.sizes[a] = n
        steps.append(Step(tuple(axes), in_sizes, tuple(out_sizes), flow, dtype, out, **kind))
        return out

    def scalar(self, c) -> Scalar:
        if isinstance(c, jax.Array):
            return Slot(self.slots[id(c)], np.dtype(c.dtype))
        return c

    def steps(self, op: Operator, axis: int, dtype: np.dtype, steps: list) -> np.dtype:
        """Appends `op`'s steps (on tensor axes from `axis` on) for `dtype` input;
        returns the output dtype."""
        if isinstance(op, Identity):
            return dtype
        if isinstance(op, Leaf):
            axes = range(axis, axis + op.ndim)
            return self.step(steps, axes, op.range_shape, _flow(op.flow), dtype, op.out_dtype(dtype), leaf=op)
        if isinstance(op, Kron):
            order, _ = op.schedule(dtype)
            for i in order:
                dtype = self.steps(op.factors[i], axis + op.offsets[i], dtype, steps)
            return dtype
        if isinstance(op, Compose):
            for inner in reversed(op.ops):
                dtype = self.steps(inner, axis, dtype, steps)
            return dtype
        if isinstance(op, Scale):
            flow = COMPLEX if op.complex else FREE
            c = self.scalar(op.c)
            if op.first:
                self.step(steps, (), (), flow, dtype, dtype, scalar=c)
                return self.steps(op.op, axis, dtype, steps)
            out = self.steps(op.op, axis, dtype, steps)
            return self.step(steps, (), (), flow, out, out, scalar=c)
        if isinstance(op, Transpose):
            self.step(steps, (), (), CONJ, dtype, dtype, conj=True)
            out = self.steps(op.op.H, axis, dtype, steps)
            return self.step(steps, (), (), CONJ, out, out, conj=True)
        if isinstance(op, Sum):
            sizes = tuple(self.sizes)
            terms = []
            for t in op.terms:
                term: list[Step] = []
                _Builder(self.slots, list(sizes)).steps(t, axis, dtype, term)
                terms.append(_order(term, sizes, dtype))
            flows = {s.flow for t in terms for s in t.steps}
            flow = next((f for f in (BARRIER, CONJ, COMPLEX) if f in flows), FREE)
            axes = range(axis, axis + op.ndim)
            return self.step(steps, axes, op.range_shape, flow, dtype, op.out_dtype(dtype), terms=tuple(terms))
        raise TypeError(f"cannot distribute {op!r}: build it from parop's leaves and combinators")
