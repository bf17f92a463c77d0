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
- a sum runs its terms one after the other from the same layout to a common one;
- only where the moves above reach no output layout the goal accepts while some route
  runs every step (`route`): a `ppermute` that deals the blocks anew, the same mesh
  axes cutting each tensor axis into as many pieces (two mesh axes that must trade
  tensor axes where none holds both), searched by Dijkstra's algorithm with the
  reductions 2 and 3 below: the lower bound does not count it.

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

1. *An admissible lower bound* (`bound.py`). Each tensor axis that is split now and that a pending
   step needs whole, that is padded, or that holds a mesh axis the output layout does
   not want there, needs a collective of its own with that axis as its source: no
   collective takes the split from two tensor axes. That costs at least the latency
   and the bytes of the smallest tensor any later state can hold (the current bytes
   times every pending step's shrink factor, over all devices), twice when training
   for an `all_to_all`; or one latency where a pending `Reduce` or tensor-parallel
   `Matrix` could `psum` it away. A stencil's `HALO` axis split now costs a halo
   exchange unless it loses every mesh axis first (the cheaper of the two), and one
   exchange at least where the axes the stencil leaves free cannot hold the mesh axes
   in use. In a sum's term, when a step runs with axes it needs whole, an axis without
   which the others cannot hold the mesh axes in use must hold one: it gets one before
   that step and loses it after, where other steps need it whole (`Search.parking`);
   where they fit nowhere at all, no route runs that step: the bound is infinite, and
   a search whose open states all have infinite bounds stops there, with no plan.
   Later terms of a sum add their own needs from the sum's entry layout. Where no mesh
   axis can come or go (and every weight is pinned), an `all_to_all` makes at most one
   new pair of a mesh axis and what comes right before it, so each term of a sum makes
   at least as many moves as its exit has pairs it lacks (`Search.regrouping`). A* with an
   admissible bound, reopening states when a cheaper route reaches them, returns a
   cheapest route.
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

**Before the search** (`room.py`): where the mesh axes the input uses cannot fit the
tensor at some step, even after every `psum` that may run before it, "no plan exists"
at once; a search with sums would otherwise wander through millions of states first.

**After the search** (`plan.smallest_first`): the local steps between two collectives
cost nothing either way, so no cost sees their order, and the search leaves it to
chance. They run in the order, of those their dependencies allow, that keeps the
tensor smallest (the least sum of its bytes after each step): the FNO's restriction
right after the DFT it prunes, before the next axis's FFT; its zero-padding right
before the inverse DFT.

The planner knows nothing of JAX arrays: it reads shapes, dtypes and mesh axis sizes
and returns a `Plan` that `lower.py` runs.
"""

from __future__ import annotations

import math
from typing import Mapping

from ...display import short
from ...operator import Operator
from ...operators import Role
from ..layout import Layout, spec_of
from .actions import StepAction
from .cost import Collective, CostModel
from .errors import PlanningError
from .goal import Goal, counts_goal, default_goal
from .plan import Plan, Visit, replay, smallest_first, start, walk, weight_uses
from .program import Program, Slot, Step, program
from .room import NoRoom, no_room
from .search import Search

# the planner's names for the layers above it: `operator.py` and `chain.py` ask for plans,
# `lower.py` runs them (its visits, slots and steps)
__all__ = [
    "Collective", "CostModel", "Goal", "Plan", "PlanningError", "Slot", "Step", "StepAction", "Visit",
    "counts_goal", "default_goal", "make_plan", "program", "route", "walk",
]


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
    return Plan(short(op), tuple(mesh_shape.items()), shape, out_shape, in_layout, actions, prog.dtype, cost,
                expanded)


def route(prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int], goal: Goal, cost: CostModel,
          where: str, shard_weights: bool | str = "auto", pinned: Mapping | None = None,
          with_cost: bool = False) -> tuple:
    """The cheapest actions for `prog` from `in_layout` to a layout `goal` accepts (with the
    weights in `pinned` split as it says), and the states the search expanded (first its
    cost, `with_cost`); a `ValueError` that says why where there are none."""
    crowded = no_room(prog, in_layout, mesh_shape, shard_weights)
    if crowded is not None:  # proved at once: the search could run out of states first
        raise _no_plan(PlanningError("no plan exists"), prog, in_layout, mesh_shape, where, shard_weights, crowded)
    search = Search(mesh_shape, cost, shard_weights, pinned=pinned)
    try:
        price, actions = search.run(prog, in_layout, goal)
        expanded = search.expanded
    except PlanningError as e:
        price, actions, expanded = _dealing_route(e, prog, in_layout, mesh_shape, goal, cost, where, shard_weights,
                                                  pinned, search.expanded)
    visits = replay(actions, start(prog.shape, in_layout, prog.dtype, tuple(mesh_shape.items())))[0]
    shared = next(((name, specs) for name, specs in weight_uses(visits).items() if len(specs) > 1), None)
    if shared is None:
        actions = smallest_first(visits)
    else:
        # A weight used by several steps enters the program once, so all of them must use
        # it split alike: the cheapest plan with it pinned to one of the splits the free
        # search chose (each re-plan settles any other weight the same way, and orders
        # its local steps).
        name, specs = shared
        plans = []
        for spec in specs:
            try:
                plans.append(route(prog, in_layout, mesh_shape, goal, cost, where, shard_weights,
                                   {**(pinned or {}), name: spec}, with_cost=True))
            except ValueError:
                continue
        if not plans:
            raise _no_plan(PlanningError("no plan exists"), prog, in_layout, mesh_shape, where, shard_weights)
        price, actions, _ = min(plans, key=lambda p: p[0])
        expanded += sum(p[2] for p in plans)
    return (price, actions, expanded) if with_cost else (actions, expanded)


def _dealing_route(error: PlanningError, prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int],
                   goal: Goal, cost: CostModel, where: str, shard_weights: bool | str, pinned: Mapping | None,
                   expanded: int) -> tuple:
    """`(cost, actions, states expanded)` of the cheapest route that deals blocks anew
    (`Permute`) where the search without it (`error`, after `expanded` states) proved
    that none ends where `goal` wants while some route runs every step: the search with
    `Permute` moves (Dijkstra's: the lower bound does not know them). Otherwise, or if
    that finds none, the `ValueError` saying why."""
    if error.gave_up or goal is Goal.any():
        raise _no_plan(error, prog, in_layout, mesh_shape, where, shard_weights) from None
    anywhere = Search(mesh_shape, cost, shard_weights, pinned=pinned)
    try:
        anywhere.run(prog, in_layout, Goal.any())
    except PlanningError:
        raise _no_plan(error, prog, in_layout, mesh_shape, where, shard_weights) from None
    dealing = Search(mesh_shape, cost, shard_weights, pinned=pinned, permutes=True)
    try:
        price, actions = dealing.run(prog, in_layout, goal)
    except PlanningError as e:
        raise _no_plan(e if e.gave_up else error, prog, in_layout, mesh_shape, where, shard_weights) from None
    return price, actions, expanded + anywhere.expanded + dealing.expanded


def _no_plan(error: PlanningError, prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int],
             where: str, shard_weights: bool | str = "auto", crowded: NoRoom | None = None) -> PlanningError:
    """The `ValueError` for a search that found nothing (`error`), or for a program whose
    mesh axes fit no step (`crowded`), saying why where it can (a search that gave up:
    what to do, for an operator or for a network's chain; `shard_weights=True`: that
    every dense `Matrix` must then run tensor-parallel)."""
    if error.gave_up:
        if any(step.barrier for step in prog.steps):
            advice = ("the network is too large to plan as a whole; split fewer axes, or distribute its "
                      "operators one by one")
        else:
            advice = ("the operator is too large to plan exhaustively; distribute its parts separately or split "
                      "fewer axes")
        return PlanningError(f"{where}: {error}: {advice}", gave_up=True)
    split = [(a, n, math.prod(mesh_shape[m] for m in axes))
             for a, (n, axes) in enumerate(zip(prog.shape, in_layout)) if axes]
    needs = sorted({f"axis {a}" for s in prog.all_steps() for a, r in zip(s.axes, s.roles)
                    if r is Role.LOCAL and in_layout[a]})  # a split axis an operator needs whole
    halos = sorted({f"axis {a} of size {n} split in {p} gives blocks of {n // p}, fewer than the halo "
                    f"{width} of {s.leaf.leaf!r}"
                    for s in prog.all_steps() for a, r in zip(s.axes, s.roles) if r is Role.HALO
                    for width in [s.leaf.halo_width(a - s.axes[0])] for b, n, p in split if b == a and n // p < width})
    reasons = [f"{', '.join(needs)} must be whole for an operator, so its split must move to another axis that "
               "can hold it"] if needs else []
    reasons += halos + ([str(crowded)] if crowded is not None else [])
    dense = sorted({repr(s.leaf.leaf) for s in prog.all_steps() if s.dense})
    if not isinstance(shard_weights, str) and shard_weights and dense:
        reasons.append(f"with shard_weights=True {', '.join(dense)} must run column-parallel (a mesh axis free to "
                       "split its rows) or row-parallel (its input split over its columns); shard_weights='auto' "
                       "may keep a weight whole")
    return PlanningError(
        f"{where}: no plan exists for input shape {prog.shape} split as {spec_of(in_layout)} on mesh "
        f"{dict(mesh_shape)}" + "".join(f"{': ' if k == 0 else '; '}{r}" for k, r in enumerate(reasons))
        + " (and the wanted output layout must be reachable without gathering)")

