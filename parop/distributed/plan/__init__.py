"""The planner: in which order the operator's leaves run, and which tensor axes carry
which mesh axes at each step, so that a training step (or, if asked, an inference)
costs least.

**What it searches.** The operator becomes a program (`program.py`): its leaves in
serial order with the dependencies that bind their order. A state is the set of steps
done and the layout (which mesh axes split which tensor axis); inside a sum, also the
term running and the layout its terms start from and must end in. The moves
(`search.py`, `actions.py`):

- run a step whose axes are as it needs them (a `LOCAL` axis whole; a `POINTWISE`
  one may stay split; a stencil's `HALO` axis may stay split where each device's block
  holds at least the halo: a halo exchange, a `ppermute` each way, brings the
  neighbours' planes); a `Reduce` over a split axis sums locally and `psum`s; a dense
  `Matrix` may also run tensor-parallel: column-parallel (its rows split over a free
  mesh axis) or row-parallel (its columns split as its input, then `psum` or
  `psum_scatter`);
- `all_to_all`: move the minor mesh axes of one tensor axis onto another (one
  collective however many mesh axes move). A whole target axis that the new split does
  not divide is padded with zeros (to less than twice its size); a padded axis takes
  only steps that act on each index alone, and is cropped when its split moves away;
- split a replicated tensor axis over a free mesh axis (a local slice);
- a sum runs its terms one after the other from the same layout to a common one.

**What it costs** (`cost.py`): each collective's bytes sent per device plus
`CostModel.latency_bytes`; for training (the default) every action forward and its
transpose backward (an `all_to_all` twice, a `psum` once, a `psum_scatter` and the
`all_gather` of its transpose, a free split or a column-parallel `Matrix` an
all-reduce of the input's gradient) and the all-reduce of each weight's gradient over
the devices that hold it but see different data. Ties go to fewer bytes, then fewer
collectives, then fewer weight bytes held per device. `print(plan)` shows each
action's forward and backward collectives.

**Why the fast search is exact.** It is A* over the same states and moves as the
exhaustive Dijkstra search (`Search(exhaustive=True)`, kept as the test oracle; the
tests compare their costs on hundreds of random operators and partitions), with:

1. *An admissible lower bound.* Each tensor axis that is split now and that a pending
   step needs whole, that is padded, or that holds a mesh axis the output layout does
   not want there, needs a collective of its own with that axis as its source: no
   collective takes the split from two tensor axes. That costs at least the latency
   and the bytes of the smallest tensor any later state can hold (the current bytes
   times every pending step's shrink factor, over all devices), twice when training
   for an `all_to_all`; or one latency where a pending `Reduce` or tensor-parallel
   `Matrix` could `psum` it away. Later terms of a sum add their own needs from the
   sum's entry layout. A* with an admissible bound, reopening states when a cheaper
   route reaches them, returns a cheapest route.
2. *Forced steps.* A step without a weight and with no other form, that runs where
   the tensor is with no collective, does not grow the tensor, and does not change
   which splits may pad its axes, is run at once. Running it later instead cannot be
   cheaper: every move in between acts on a tensor at least as large, every move
   stays valid, and the step itself costs nothing either way. Forced steps run
   within a state's settling, so the search never branches on them (the spectral
   chain of an FNO, `Restriction @ DFT` per axis, collapses this way).
3. *No back-to-back moves of the same mesh axes.* Moving mesh axes `X` from `a` to `b`
   and then `X` from `b` on to `c` (or splitting `X` onto `b`, then moving it), with
   no step in between, is never cheaper than one move from `a` to `c` (or splitting
   onto `c`) from the earlier state, which reaches the same state; so the second move
   is not generated.

The planner knows nothing of JAX arrays: it reads shapes, dtypes and mesh axis sizes
and returns a `Plan` that `lower.py` runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from ... import _dtypes
from ..._dtypes import Flow
from ...operator import Operator
from ...operators import Role
from ..layout import Layout, spec_of
from .actions import Action, AllToAll, Branch, Gather, Local, Split, State
from .cost import ALL_TO_ALL, KINDS, PSUM, PSUM_SCATTER, ALL_GATHER, PPERMUTE, Collective, CostModel
from .goal import Goal, counts_goal, default_goal
from .program import BARRIER, CONJ, Program, Slot, Step, program
from .search import PlanningError, Search

__all__ = ["CostModel", "Goal", "Plan", "PlanningError", "make_plan", "program"]


@dataclass(frozen=True)
class Visit:
    """An action with the state it starts from, and, for a `Branch`, each term's visits."""

    action: Action
    before: State
    terms: tuple[tuple["Visit", ...], ...] = ()


def replay(actions: tuple[Action, ...], state: State) -> tuple[tuple[Visit, ...], State]:
    """Walk `actions` from `state`: each with the state it starts from, and the final state."""
    visits = []
    for action in actions:
        if isinstance(action, Branch):
            terms = [replay(term, state) for term in action.terms]
            visits.append(Visit(action, state, tuple(v for v, _ in terms)))
            state = replace(terms[0][1], sizes=_after_step(action.step, state).sizes)
            continue
        visits.append(Visit(action, state))
        if isinstance(action, Local):
            state = replace(_after_step(action.step, state), layout=action.after(state))
        else:
            state = replace(state, layout=action.after(state))
    return tuple(visits), state


def _after_step(step: Step, state: State) -> State:
    sizes = list(state.sizes)
    for a, n in zip(step.axes, step.out_sizes):
        sizes[a] = n
    itemsize = step.out_dtype.itemsize if step.flow == BARRIER and step.in_dtype != step.out_dtype else state.itemsize
    return replace(state, sizes=tuple(sizes), itemsize=itemsize)


def _walk(visits):
    for visit in visits:
        yield visit
        for term in visit.terms:
            yield from _walk(term)


def _start(shape: tuple[int, ...], layout: Layout, dtype, mesh_shape: Mapping[str, int]) -> State:
    """The state a program starts from: its input."""
    return State(tuple(shape), layout, _dtypes.canonical(dtype).itemsize, tuple(mesh_shape.items()))


def weight_placements(visits: tuple[Visit, ...]) -> dict[str, list]:
    """`{name: each distinct split of the weight where a step uses it, in order}`."""
    placements: dict = {}
    for visit in _walk(visits):
        if isinstance(visit.action, Local):
            spec = visit.action.weight_spec(visit.before)
            if spec is not None and spec not in placements.setdefault(visit.action.step.leaf.name, []):
                placements[visit.action.step.leaf.name].append(spec)
    return placements


@dataclass(frozen=True)
class Plan:
    """A distributed program: the actions from `in_layout` to `out_layout`, each with the
    collectives it runs forward and backward. `print(plan)` shows it."""

    operator: Operator
    mesh_shape: Mapping[str, int]
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_layout: Layout
    actions: tuple[Action, ...]
    dtype: object
    cost_model: CostModel
    states_expanded: int = 0

    @property
    def _replayed(self) -> tuple[tuple[Visit, ...], State]:
        cached = self.__dict__.get("_replay")
        if cached is None:
            cached = replay(self.actions, _start(self.shape, self.in_layout, self.dtype, self.mesh_shape))
            object.__setattr__(self, "_replay", cached)
        return cached

    @property
    def visits(self) -> tuple[Visit, ...]:
        return self._replayed[0]

    @property
    def out_layout(self) -> Layout:
        return self._replayed[1].layout

    def traffic(self) -> tuple[list[Collective], list[Collective]]:
        """Every collective of the program, forward and backward (the transpose JAX runs
        for `jax.grad`, with the weight gradients' all-reduces)."""
        fwd, bwd = [], []
        for visit in _walk(self.visits):
            f, b = visit.action.collectives(visit.before)
            fwd += f
            bwd += b
        return fwd, bwd

    @property
    def bytes(self) -> float:
        """Bytes each device sends in one application (forward)."""
        return sum(c.bytes for c in self.traffic()[0])

    @property
    def backward_bytes(self) -> float:
        """Bytes each device sends in the backward pass of `jax.grad`."""
        return sum(c.bytes for c in self.traffic()[1])

    def collectives(self, backward: bool = False) -> dict[str, int]:
        """How many of each collective the program runs forward (or backward)."""
        counts = dict.fromkeys(KINDS, 0)
        for c in self.traffic()[1 if backward else 0]:
            counts[c.kind] += 1
        return counts

    def weight_specs(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """`{name: the mesh axes splitting each of its axes}` where each weight is first used."""
        return {name: specs[0] for name, specs in weight_placements(self.visits).items()}

    @property
    def cost(self) -> tuple[float, float, int]:
        """What the planner minimised: (time in bytes, bytes sent, collectives)."""
        fwd, bwd = self.traffic()
        paid = fwd + bwd if self.cost_model.training else fwd
        nbytes = sum(c.bytes for c in paid)
        return (nbytes + self.cost_model.latency_bytes * len(paid), nbytes, len(paid))

    def transpose(self, operator: Operator) -> "Plan":
        """The plan of `operator` (the adjoint) that runs this plan's actions transposed,
        in reverse order: the same weight placement, from this plan's output layout
        back to its input layout."""
        states = [v.before for v in self.visits] + [self._replayed[1]]
        actions = _transpose(self.actions, states)
        return Plan(operator, self.mesh_shape, self.out_shape, self.shape, self.out_layout, actions,
                    operator.dtype, self.cost_model, 0)

    # -- display -------------------------------------------------------------------------
    def lines(self) -> list[str]:
        from ...display import short

        mesh = ", ".join(f"{k}: {v}" for k, v in self.mesh_shape.items())
        purpose = "training" if self.cost_model.training else "inference"
        out = [f"plan for {short(self.operator)} on mesh ({mesh}), costed for {purpose}",
               f"  in   {self.shape} {spec_of(self.in_layout)}"]
        out += _action_lines(self.visits, "  ")
        out.append(f"  out  {self.out_shape} {spec_of(self.out_layout)}")
        fwd, bwd = self.traffic()
        out.append(f"  forward:  {_summary(fwd)}")
        out.append(f"  backward: {_summary(bwd)}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        from ...display import short

        return f"Plan({short(self.operator)}: {spec_of(self.in_layout)} -> {spec_of(self.out_layout)})"

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(str(self)) + "</pre>"


def _summary(collectives) -> str:
    if not collectives:
        return "no collectives"
    counts = {}
    for c in collectives:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items())
    return f"{kinds}; {fmt_bytes(sum(c.bytes for c in collectives))} sent per device"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _traffic(fwd, bwd, own: str | None = None) -> str:
    """The collectives of an action, forward and backward (those of its own kind, an
    `all_to_all`'s, by their bytes alone)."""
    def one(c):
        return fmt_bytes(c.bytes) if c.kind == own else f"{c.kind} {'+'.join(c.axes)} {fmt_bytes(c.bytes)}"

    parts = [f"{label} " + " + ".join(one(c) for c in cs) for label, cs in (("fwd", fwd), ("bwd", bwd)) if cs]
    return ("   " + ", ".join(parts)) if parts else ""


def _action_lines(visits, indent: str) -> list[str]:
    from ...display import scalar, short

    lines = []
    for visit in visits:
        action, before = visit.action, visit.before
        fwd, bwd = action.collectives(before)
        after = spec_of(action.after(before)) if not isinstance(action, Branch) else None
        if isinstance(action, AllToAll):
            padding = f", axis {action.dst} padded with {action.pad} zeros" if action.pad else ""
            cropping = f", axis {action.src} cropped to {action.crop}" if action.crop else ""
            lines.append(f"{indent}all_to_all {'+'.join(action.axes)}: axis {action.src} -> axis {action.dst}"
                         f"{padding}{cropping}{_traffic(fwd, bwd, ALL_TO_ALL)}   -> {after}")
        elif isinstance(action, Split):
            padding = f", padded with {action.pad} zeros" if action.pad else ""
            lines.append(f"{indent}split axis {action.dst} over {'+'.join(action.axes)} (local slice{padding})"
                         f"{_traffic(fwd, bwd)}   -> {after}")
        elif isinstance(action, Gather):
            lines.append(f"{indent}all_gather axis {action.src} over {'+'.join(action.axes)}"
                         f"{_traffic(fwd, bwd)}   -> {after}")
        elif isinstance(action, Local):
            step = action.step
            if step.leaf is not None:
                what = short(step.leaf)
            elif step.conj:
                what = "conjugate"
            else:
                c = step.scalar
                what = f"scale by {'conj(c)' if isinstance(c, Slot) and c.conj else scalar(c)}"
            where = f" on axis {step.axes[0]}" if len(step.axes) == 1 else f" on axes {step.axes}" if step.axes else ""
            if action.halo:
                where += ", halo exchange on axis " + ", ".join(
                    f"{a} over {'+'.join(before.layout[a])}" for a in action.halo)
            if action.weight_split is not None:
                form = "row" if action.psum else "column"
                axes = "+".join(n for part in action.weight_split for n in part)
                where += f", {form}-parallel: weight split over {axes}"
            moved = f"   -> {after}" if after != spec_of(before.layout) else ""
            lines.append(f"{indent}{what}{where}{_traffic(fwd, bwd)}{moved}")
        else:
            lines.append(f"{indent}sum of {len(action.terms)} terms:")
            for k, term in enumerate(visit.terms):
                lines.append(f"{indent}  term {k + 1}:")
                lines += _action_lines(term, indent + "    ")
    return lines


# -- transposition -------------------------------------------------------------------------

def _transpose_step(step: Step) -> Step:
    scalar = step.scalar
    if isinstance(scalar, Slot):
        scalar = scalar.conjugate()
    elif isinstance(scalar, complex):
        scalar = scalar.conjugate()
    return Step(step.axes, step.out_sizes, step.in_sizes, step.flow, step.out_dtype, step.in_dtype,
                leaf=None if step.leaf is None else step.leaf.H, scalar=scalar, conj=step.conj)


def _transpose(actions: tuple[Action, ...], states: list[State]) -> tuple[Action, ...]:
    """`actions` (with `states[i]` before action i and `states[-1]` after the last)
    transposed and reversed."""
    out: list[Action] = []
    for i in reversed(range(len(actions))):
        action, before, after = actions[i], states[i], states[i + 1]
        if isinstance(action, Branch):
            terms = []
            for term in action.terms:
                visits, end = replay(term, before)
                terms.append(_transpose(term, [v.before for v in visits] + [end]))
            out.append(Branch(_transpose_step(action.step), tuple(terms)))
        elif isinstance(action, AllToAll):
            pad = before.blocks[action.src] * before.splits[action.src] - before.sizes[action.src] if action.crop else 0
            crop = before.sizes[action.dst] if action.pad else 0
            out.append(AllToAll(action.axes, action.dst, action.src, pad, crop))
        elif isinstance(action, Split):
            out.append(Gather(action.axes, action.dst, before.sizes[action.dst] if action.pad else 0))
        elif isinstance(action, Gather):
            pad = before.blocks[action.src] * before.splits[action.src] - before.sizes[action.src] if action.crop else 0
            out.append(Split(action.axes, action.src, pad))
        else:
            step = _transpose_step(action.step)
            ws = action.weight_split
            if ws is None and action.psum:  # a Reduce's psum: broadcast, then split again
                a = next(b for b, r in zip(action.step.axes, action.step.roles) if r is Role.REDUCE)
                out.append(Local(step))
                out.append(Split(action.psum, a, -before.sizes[a] % before.group(action.psum)))
            elif ws is None:
                out.append(Local(step, halo=action.halo))
            elif action.gather:
                out.append(Local(step, psum=action.gather, scatter=True, weight_split=ws))
            elif action.scatter:
                out.append(Local(step, gather=action.psum, weight_split=ws))
            elif action.psum:
                out.append(Local(step, weight_split=ws))
            else:
                out_ax, _ = action.step.leaf.dense_axes
                out.append(Local(step, psum=ws[out_ax], weight_split=ws))
    return tuple(out)


# -- making a plan -----------------------------------------------------------------------

def make_plan(op: Operator, shape, in_layout: Layout, mesh_shape: Mapping[str, int], goal: Goal,
              cost: CostModel, where: str, shard_weights: bool | str = "auto", pinned: Mapping | None = None) -> Plan:
    """The cheapest plan for `op` on a tensor of `shape` (domain + batch) laid out as
    `in_layout`, ending in a layout `goal` accepts, with the weights named in `pinned`
    split as it says; a `ValueError` if there is none."""
    shape = tuple(shape)
    prog = program(op, shape)
    actions, expanded = route(prog, in_layout, mesh_shape, goal, cost, where, shard_weights, pinned)
    out_shape = tuple(op.range_shape) + shape[op.ndim:]
    return Plan(op, dict(mesh_shape), shape, out_shape, in_layout, actions, prog.dtype, cost, expanded)


def route(prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int], goal: Goal, cost: CostModel,
          where: str, shard_weights: bool | str = "auto", pinned: Mapping | None = None,
          with_cost: bool = False) -> tuple:
    """The cheapest actions for `prog` from `in_layout` to a layout `goal` accepts (with the
    weights in `pinned` split as it says), and the states the search expanded (first its
    cost, `with_cost`); a `ValueError` that says why where there are none."""
    search = Search(mesh_shape, cost, shard_weights, pinned=pinned)
    try:
        price, actions = search.run(prog, in_layout, goal)
    except PlanningError as e:
        raise _no_plan(str(e), prog, in_layout, mesh_shape, where) from None
    expanded = search.expanded
    placements = weight_placements(replay(actions, _start(prog.shape, in_layout, prog.dtype, mesh_shape))[0])
    shared = next(((name, specs) for name, specs in placements.items() if len(specs) > 1), None)
    if shared is not None:
        # A weight used by several steps enters the program once, so all of them must use
        # it split alike: the cheapest plan with it pinned to one of the splits the free
        # search chose (each re-plan settles any other weight the same way).
        name, specs = shared
        plans = []
        for spec in specs:
            try:
                plans.append(route(prog, in_layout, mesh_shape, goal, cost, where, shard_weights,
                                   {**(pinned or {}), name: spec}, with_cost=True))
            except ValueError:
                continue
        if not plans:
            raise _no_plan("no plan exists", prog, in_layout, mesh_shape, where)
        price, actions, _ = min(plans, key=lambda p: p[0])
        expanded += sum(p[2] for p in plans)
    return (price, actions, expanded) if with_cost else (actions, expanded)


def _no_plan(reason: str, prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int],
             where: str) -> ValueError:
    """The `ValueError` for a search that found nothing, saying why where it can."""
    if reason != "no plan exists":
        return ValueError(f"{where}: {reason}")
    split = [(a, n, math.prod(mesh_shape[m] for m in axes))
             for a, (n, axes) in enumerate(zip(prog.shape, in_layout)) if axes]
    needs = sorted({f"axis {a}" for s in _all_steps(prog) for a, r in zip(s.axes, s.roles) if r is Role.LOCAL})
    halos = sorted({f"axis {a} of size {n} split in {p} gives blocks of {n // p}, fewer than the halo "
                    f"{leaf.halo[a - s.axes[0] - leaf.grid_offset]} of {leaf!r}"
                    for s in _all_steps(prog) for a, r in zip(s.axes, s.roles) if r is Role.HALO
                    for leaf in [s.leaf.leaf] for b, n, p in split if b == a
                    and n // p < leaf.halo[a - s.axes[0] - leaf.grid_offset]})
    return ValueError(
        f"{where}: no plan exists for input shape {prog.shape} split as {spec_of(in_layout)} on mesh "
        f"{dict(mesh_shape)}"
        + (f": {', '.join(needs)} must be whole for an operator, so its split must move to another "
           "axis that can hold it" if needs else "")
        + (f"; {'; '.join(halos)}" if halos else "")
        + " (and the wanted output layout must be reachable without gathering)")


def _all_steps(prog: Program):
    for s in prog.steps:
        yield s
        for t in s.terms:
            yield from _all_steps(t)
