"""The planner: in which order the operator's leaves run, and which tensor axes carry
which mesh axes at each step, so that the fewest bytes move between devices.

An operator becomes a `Program`: its leaves in serial order (`Step`s), with the
dependencies that bind their order (two steps on a common axis keep their order; a
complex step never crosses a step that turns real data complex or back). The planner
then searches, with Dijkstra's algorithm, the states (steps done, layout) for the
cheapest route from the input layout to a wanted output layout. Moves are:

- run a step whose axes are as it needs them (a `LOCAL` axis unsplit); a `Reduce`
  over a split axis sums locally and `psum`s, leaving its mesh axes replicated;
- `all_to_all`: move the minor-most mesh axes of one tensor axis to another one
  (one collective, whatever the number of mesh axes it moves). Where the target
  axis is whole and its size is not a multiple of the split (the 7 modes an FNO keeps
  on a real-FFT axis, over 8 devices), it is padded with zeros to the next multiple
  (less than doubled); a padded axis takes only steps that act on each index alone
  (`Diagonal`, `PerModeMatrix` modes, `Reduce`), keeps its zeros through them, and
  is cropped when its split moves away whole. Inputs and outputs are never padded;
  JAX arrays must split evenly.
- split a replicated tensor axis over a free mesh axis (a local slice, no traffic).

The cost of a route is an estimate of its time in bytes: the bytes each device
sends plus `LATENCY_BYTES` (1 MiB) per collective, about what a collective's
start-up is worth on GPU interconnects (a model, read when a plan is made: users
may set it for their machine; on forced CPU devices 0 is closer); ties go to fewer
bytes, then fewer collectives, then fewer weight bytes per device. parop plans for
training, so the bytes and collectives include the gradient traffic of weights: an all-reduce over the devices that hold the same
weight (or shard) but different data, and a gather where a weight runs along a
padded axis (a sharding must divide the array, so it is kept whole there). A sum of
operators is planned term by term from a common entry layout to the common exit
layout that costs least in total. The planner knows nothing of JAX arrays: it reads
shapes, dtypes and mesh axis sizes, and returns a `Plan` that `lower.py` runs.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Union

import numpy as np

from .. import _dtypes
from .._dtypes import Flow
from ..algebra import Compose, Kron, Scale, Sum
from ..operator import Operator
from ..operators import Identity, Leaf, Role
from .layout import Layout, spec_of

FREE, COMPLEX, BARRIER = "free", "complex", "barrier"


@dataclass(frozen=True, eq=False)
class Step:
    """One unit of the serial program: a leaf on its axes, a scalar, or a sum of
    sub-programs (`terms`) on `axes`."""

    axes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    flow: str
    out_dtype: np.dtype
    leaf: Leaf | None = None
    c: complex | float | None = None
    terms: tuple["Program", ...] = ()


@dataclass(frozen=True, eq=False)
class Program:
    steps: tuple[Step, ...]
    preds: tuple[int, ...]  # bit mask of the steps each step must follow
    dtype: np.dtype


def _flow(flow: Flow) -> str:
    if flow in (Flow.R2C, Flow.C2R):
        return BARRIER
    return COMPLEX if flow is Flow.COMPLEX else FREE


def _steps(op: Operator, axis: int, dtype: np.dtype) -> tuple[list[Step], np.dtype]:
    """`op`'s leaves on tensor axes from `axis` on, in serial order, for `dtype` input."""
    if isinstance(op, Identity):
        return [], dtype
    if isinstance(op, Leaf):
        out = op.out_dtype(dtype)
        axes = tuple(range(axis, axis + op.ndim))
        return [Step(axes, op.range_shape, _flow(op.flow), out, leaf=op)], out
    if isinstance(op, Kron):
        order, _ = op.schedule(dtype)
        steps = []
        for i in order:
            more, dtype = _steps(op.factors[i], axis + op.offsets[i], dtype)
            steps += more
        return steps, dtype
    if isinstance(op, Compose):
        steps = []
        for inner in reversed(op.ops):
            more, dtype = _steps(inner, axis, dtype)
            steps += more
        return steps, dtype
    if isinstance(op, Scale):
        flow = COMPLEX if op.complex else FREE
        if op.first:
            steps, out = _steps(op.op, axis, dtype)
            return [Step((), (), flow, dtype, c=op.c)] + steps, out
        steps, out = _steps(op.op, axis, dtype)
        return steps + [Step((), (), flow, out, c=op.c)], out
    if isinstance(op, Sum):
        terms = tuple(program(t, dtype, axis) for t in op.terms)
        flows = {s.flow for t in terms for s in t.steps}
        flow = BARRIER if BARRIER in flows else COMPLEX if COMPLEX in flows else FREE
        out = op.out_dtype(dtype)
        return [Step(tuple(range(axis, axis + op.ndim)), op.range_shape, flow, out, terms=terms)], out
    raise TypeError(f"cannot distribute {op!r}: build it from parop's leaves and combinators")


def program(op: Operator, dtype, axis: int = 0) -> Program:
    """`op` as a `Program` for input of `dtype`."""
    dtype = _dtypes.canonical(dtype)
    steps, _ = _steps(op, axis, dtype)
    preds = []
    for j, b in enumerate(steps):
        mask = 0
        for i, a in enumerate(steps[:j]):
            overlap = bool(set(a.axes) & set(b.axes))
            ordered = FREE not in (a.flow, b.flow) and BARRIER in (a.flow, b.flow)
            if overlap or ordered:
                mask |= 1 << i
        preds.append(mask)
    return Program(tuple(steps), tuple(preds), dtype)


# -- the actions of a plan -------------------------------------------------------------

@dataclass(frozen=True)
class Local:
    """Run `step` on each device's block; then `psum` over mesh axes (a `Reduce` over a
    split axis, or a row-parallel `Matrix`), or `psum_scatter` (`scatter`).

    `weight_split` is set for a `Matrix` with a sharded weight: the mesh axes that
    split each weight axis (column-parallel: the output axis; row-parallel: the input
    axis)."""

    step: Step
    layout: Layout  # before the step
    psum: tuple[str, ...] = ()
    bytes: float = 0.0
    scatter: bool = False
    weight_split: tuple[tuple[str, ...], ...] | None = None


@dataclass(frozen=True)
class AllToAll:
    """Move mesh axes `axes` (the minor end of tensor axis `src`) onto axis `dst`;
    first append `pad` zeros to `dst`, after crop `src` to `crop` (if not 0)."""

    axes: tuple[str, ...]
    src: int
    dst: int
    bytes: float
    layout: Layout  # after the move
    pad: int = 0
    crop: int = 0


@dataclass(frozen=True)
class Split:
    """Cut replicated tensor axis `dst` over the free mesh axis `axis` (no traffic)."""

    axis: str
    dst: int
    layout: Layout  # after


@dataclass(frozen=True)
class Branch:
    """A sum: each term's actions from the same layout, then the sum on each device."""

    step: Step
    terms: tuple[tuple["Action", ...], ...]
    layout: Layout  # after


Action = Union[Local, AllToAll, Split, Branch]
# (estimated time in bytes, bytes sent per device, collectives, weight bytes per device)
Cost = tuple[float, float, int, float]
LATENCY_BYTES = float(1 << 20)  # what a collective's start-up costs, in bytes sent


def _cost(nbytes: float = 0.0, count: int = 0, held: float = 0.0) -> Cost:
    return (nbytes + LATENCY_BYTES * count, nbytes, count, held)


FREE_MOVE: Cost = _cost()


def _add(a: Cost, b: Cost) -> Cost:
    return tuple(x + y for x, y in zip(a, b))


@dataclass(frozen=True)
class Route:
    cost: Cost
    actions: tuple[Action, ...]


class Planner:
    """Searches routes through one operator's programs on one mesh (memoised)."""

    def __init__(self, mesh_shape: Mapping[str, int], shard_weights: bool | str = "auto"):
        self.mesh_shape = dict(mesh_shape)
        self.shard_weights = shard_weights
        self._memo: dict = {}
        self._split_memo: dict = {}

    def _splits(self, axes: tuple[str, ...]) -> int:
        if axes not in self._split_memo:
            self._split_memo[axes] = math.prod(self.mesh_shape[n] for n in axes)
        return self._split_memo[axes]

    def explore(self, prog: Program, shape: tuple[int, ...], entry: Layout, enough: "Enough") -> dict[Layout, Route]:
        """The cheapest routes from `entry` (tensor `shape`) to layouts in which all of
        `prog` has run, in order of cost, until `enough` of them are known."""
        key = (id(prog), shape, entry, enough)
        if key not in self._memo:
            self._memo[key] = self._explore(prog, shape, entry, enough)
        return self._memo[key]

    def _explore(self, prog, shape, entry, enough):
        n = len(prog.steps)
        full = (1 << n) - 1
        sizes_of = _memoise(lambda done: _sizes(prog, shape, done))
        itemsize_of = _memoise(lambda done: _itemsize(prog, done))
        start = (0, entry)
        best: dict = {start: FREE_MOVE}
        back: dict = {}
        heap = [(FREE_MOVE, 0, 0, entry)]
        counter = itertools.count(1)
        finals: dict[Layout, Cost] = {}
        while heap:
            here, _, done, layout = heapq.heappop(heap)
            if best[(done, layout)] < here:
                continue
            if done == full and layout not in finals and not self._padded(sizes_of(full), layout):
                finals[layout] = here
                if enough.met(finals):
                    break
            for action, ndone, nlayout, delta in self._moves(prog, shape, done, layout, sizes_of, itemsize_of):
                cost = _add(here, delta)
                state = (ndone, nlayout)
                if cost < best.get(state, (math.inf,)):
                    best[state] = cost
                    back[state] = ((done, layout), action)
                    heapq.heappush(heap, (cost, next(counter), ndone, nlayout))
        routes = {}
        for layout, cost in finals.items():
            actions, state = [], (full, layout)
            while state != start:
                state, action = back[state]
                actions.append(action)
            routes[layout] = Route(cost, tuple(reversed(actions)))
        return routes

    def _padded(self, sizes: tuple[int, ...], layout: Layout) -> frozenset[int]:
        """The axes whose split does not divide their size (held padded with zeros)."""
        return frozenset(a for a, (n, axes) in enumerate(zip(sizes, layout)) if n % self._splits(axes))

    def _moves(self, prog, shape, done, layout, sizes_of, itemsize_of):
        sizes, itemsize = sizes_of(done), itemsize_of(done)
        splits = [self._splits(axes) for axes in layout]
        blocks = [-(-n // p) for n, p in zip(sizes, splits)]  # a padded axis's block holds its zeros too
        padded = self._padded(sizes, layout)
        local = math.prod(blocks)
        varying = math.prod(splits)  # each device's data differ over all the split mesh axes
        for j, step in enumerate(prog.steps):
            bit = 1 << j
            if done & bit or prog.preds[j] & ~done:
                continue
            if step.terms:
                yield from self._branch(step, sizes, layout, done | bit)
                continue
            if step.leaf is not None and step.leaf.dense_axes is not None:
                if step.axes[0] not in padded:
                    yield from self._dense(step, sizes, layout, done | bit, local, itemsize, varying)
                continue
            roles = step.leaf.roles if step.leaf is not None else ()
            if any(r is Role.LOCAL and layout[a] or a in padded and r not in (Role.POINTWISE, Role.REDUCE)
                   for a, r in zip(step.axes, roles)):
                continue
            psum = tuple(n for a, r in zip(step.axes, roles) if r is Role.REDUCE for n in layout[a])
            nlayout = tuple(() if a in step.axes and roles[step.axes.index(a)] is Role.REDUCE else axes
                            for a, axes in enumerate(layout))
            grad, grads, held = self._pointwise_weight(step, layout, padded, varying)
            if psum:
                g = self._splits(psum)
                reduced = local / blocks[step.axes[0]]  # the block after its local sum
                nbytes = 2 * reduced * itemsize * (g - 1) / g
                yield (Local(step, layout, psum, nbytes), done | bit, nlayout,
                       _cost(nbytes + grad, 1 + grads, held))
            else:
                yield Local(step, layout), done | bit, nlayout, _cost(grad, grads, held)
        for src, axes in enumerate(layout):
            for k in range(1, len(axes) + 1):
                if src in padded and k < len(axes):
                    continue  # a padded axis gives up its whole split, and is cropped
                moved = axes[-k:]
                g = self._splits(moved)
                for dst in range(len(layout)):
                    if dst == src:
                        continue
                    pad = -sizes[dst] % (splits[dst] * g)
                    if pad and (layout[dst] or pad >= sizes[dst]):
                        continue  # pad only a whole axis, and less than doubling it
                    nlayout = tuple(
                        axes[:-k] if a == src else layout[a] + moved if a == dst else layout[a]
                        for a in range(len(layout))
                    )
                    nbytes = local / blocks[dst] * (blocks[dst] + pad) * itemsize * (g - 1) / g
                    crop = sizes[src] if src in padded else 0
                    yield AllToAll(moved, src, dst, nbytes, nlayout, pad, crop), done, nlayout, _cost(nbytes, 1)
        used = {n for axes in layout for n in axes}
        for name, size in self.mesh_shape.items():
            if name in used or size == 1:
                continue
            for dst in range(len(layout)):
                if sizes[dst] % (self._splits(layout[dst]) * size) == 0:
                    nlayout = tuple(layout[a] + (name,) if a == dst else layout[a] for a in range(len(layout)))
                    yield Split(name, dst, nlayout), done, nlayout, FREE_MOVE

    @staticmethod
    def _weight(leaf: Leaf, shards: int, replicas: int, gathered: int = 1) -> tuple[float, int, float]:
        """(gradient bytes each device sends, gradient collectives, weight bytes it
        holds) for `leaf`'s weight kept in `shards` pieces and used in `shards * gathered`
        (`gathered` > 1 where it runs along padded axes, along which it is kept whole),
        each piece by `replicas` devices with different data. parop plans for training:
        those replicas all-reduce the piece's gradient, and the pieces of a gathered
        weight's gradient are then gathered."""
        memory = math.prod(leaf.param_shape) * np.dtype(leaf.param_dtype).itemsize
        piece = memory / (shards * gathered)
        grad = 2 * piece * (replicas - 1) / replicas + piece * (gathered - 1)
        return grad, (replicas > 1) + (gathered > 1), memory / shards

    def _pointwise_weight(self, step: Step, layout: Layout, padded: frozenset[int],
                          varying: int) -> tuple[float, int, float]:
        """`_weight` for a leaf whose weight is split as the tensor axes it runs along."""
        leaf = step.leaf
        if leaf is None or not leaf.param_shape:
            return 0.0, 0, 0.0
        along = [step.axes[0] + a for a in leaf.param_axes if a is not None]
        shards = self._splits(tuple(n for a in along if a not in padded for n in layout[a]))
        gathered = self._splits(tuple(n for a in along if a in padded for n in layout[a]))
        return self._weight(leaf, shards, varying // (shards * gathered), gathered)

    def _dense(self, step, sizes, layout, ndone, local, itemsize, varying):
        """A dense `Matrix` step: with its weight replicated on a whole axis, or, where
        `shard_weights` allows, column-parallel (a free mesh axis splits the weight's
        rows and the output) or row-parallel (the input's split splits the weight's
        columns; partial products, then `psum` or `psum_scatter`)."""
        a, leaf = step.axes[0], step.leaf
        n, m = sizes[a], step.out_sizes[0]
        out_ax, in_ax = leaf.dense_axes
        split = layout[a]
        relayout = lambda axes: tuple(axes if i == a else layout[i] for i in range(len(layout)))

        def weight(out_axes=(), in_axes=()):
            parts = [()] * len(leaf.param_shape)
            parts[out_ax], parts[in_ax] = out_axes, in_axes
            return tuple(parts)

        # a weight (or weight shard) held by r devices with different data has its
        # gradient all-reduced over those r

        def cost(nbytes: float, count: int, shards: int, replicas: int) -> Cost:
            grad, grads, held = self._weight(leaf, shards, replicas)
            return _cost(nbytes + grad, count + grads, held)

        if not split:
            if self.shard_weights is not True:
                yield Local(step, layout), ndone, layout, cost(0.0, 0, 1, varying)
            if self.shard_weights:
                used = {name for axes in layout for name in axes}
                for name, size in self.mesh_shape.items():
                    if name not in used and size > 1 and m % size == 0:
                        yield (Local(step, layout, weight_split=weight(out_axes=(name,))), ndone,
                               relayout((name,)), cost(0.0, 0, size, varying))
            return
        if not self.shard_weights:
            return
        g = self._splits(split)
        partial = local * g / n * m * itemsize  # the block of partial sums on each device
        nbytes = 2 * partial * (g - 1) / g
        yield (Local(step, layout, split, nbytes, weight_split=weight(in_axes=split)), ndone,
               relayout(()), cost(nbytes, 1, g, varying // g))
        if m % g == 0:
            nbytes = partial * (g - 1) / g
            yield (Local(step, layout, split, nbytes, scatter=True, weight_split=weight(in_axes=split)),
                   ndone, layout, cost(nbytes, 1, g, varying // g))

    def _branch(self, step, sizes, layout, ndone):
        """The terms from `layout` to a common exit: `layout` itself or one of the
        terms' own cheapest exits, whichever costs least in total."""
        cheapest = [self.explore(t, sizes, layout, Enough(count=1)) for t in step.terms]
        if not all(cheapest):
            return  # some term cannot run from this layout
        candidates = {layout} | {next(iter(c)) for c in cheapest}
        routes = [self.explore(t, sizes, layout, Enough(layouts=frozenset(candidates))) for t in step.terms]
        for exit_ in set(routes[0]).intersection(*routes[1:]):
            parts = [r[exit_] for r in routes]
            cost = functools.reduce(_add, (p.cost for p in parts))
            yield Branch(step, tuple(p.actions for p in parts), exit_), ndone, exit_, cost


@dataclass(frozen=True)
class Enough:
    """When a search may stop: once all of `layouts` are reached, or else `count` exit
    layouts that `accept` takes (any layout where `accept` is None)."""

    count: int = 1
    layouts: frozenset | None = None
    accept: Callable[[Layout], bool] | None = None

    def met(self, finals: Mapping[Layout, Cost]) -> bool:
        if self.layouts is not None:
            return self.layouts <= finals.keys()
        return sum(self.accept is None or self.accept(layout) for layout in finals) >= self.count


def _memoise(f: Callable):
    cache: dict = {}

    def g(key):
        if key not in cache:
            cache[key] = f(key)
        return cache[key]

    return g


def _sizes(prog: Program, shape: tuple[int, ...], done: int) -> tuple[int, ...]:
    sizes = list(shape)
    for j, step in enumerate(prog.steps):
        if done >> j & 1:
            for a, n in zip(step.axes, step.out_sizes):
                sizes[a] = n
    return tuple(sizes)


def _itemsize(prog: Program, done: int) -> int:
    dtype = prog.dtype
    for j, step in enumerate(prog.steps):
        if done >> j & 1 and step.flow == BARRIER:
            dtype = step.out_dtype
    return np.dtype(dtype).itemsize


# -- the plan users see ----------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A distributed program: the actions from `in_layout` to `out_layout`, each with
    the mesh axes it moves and the bytes each device sends. `print(plan)` shows it."""

    operator: Operator
    mesh_shape: Mapping[str, int]
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_layout: Layout
    out_layout: Layout
    route: Route
    exits: Mapping[Layout, Cost]  # every output layout it could have ended in, and its cost

    @property
    def actions(self) -> tuple[Action, ...]:
        return self.route.actions

    @property
    def bytes(self) -> float:
        """Bytes each device sends in one application (forward)."""
        return sum(a.bytes for a in _walk(self.actions) if isinstance(a, (AllToAll, Local)))

    def collectives(self) -> dict[str, int]:
        """How many of each collective the program runs."""
        counts = {"all_to_all": 0, "psum": 0}
        for action in _walk(self.actions):
            if isinstance(action, AllToAll):
                counts["all_to_all"] += 1
            elif isinstance(action, Local) and action.psum:
                counts["psum"] += 1
        return counts

    def lines(self) -> list[str]:
        from ..display import short

        mesh = ", ".join(f"{k}: {v}" for k, v in self.mesh_shape.items())
        out = [
            f"plan for {short(self.operator)} on mesh ({mesh})",
            f"  in   {self.shape} {spec_of(self.in_layout)}",
        ]
        out += _action_lines(self.actions, "  ")
        out.append(f"  out  {self.out_shape} {spec_of(self.out_layout)}")
        counts = self.collectives()
        out.append(
            f"  total: {counts['all_to_all']} all_to_all, {counts['psum']} psum, "
            f"{_fmt_bytes(self.bytes)} sent per device"
        )
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(str(self)) + "</pre>"


def _walk(actions):
    for action in actions:
        yield action
        if isinstance(action, Branch):
            for term in action.terms:
                yield from _walk(term)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _action_lines(actions, indent: str) -> list[str]:
    from ..display import short

    lines = []
    for action in actions:
        if isinstance(action, AllToAll):
            padding = f", axis {action.dst} padded with {action.pad} zeros" if action.pad else ""
            cropping = f", axis {action.src} cropped to {action.crop}" if action.crop else ""
            lines.append(
                f"{indent}all_to_all {'+'.join(action.axes)}: axis {action.src} -> axis {action.dst}{padding}"
                f"{cropping}   {_fmt_bytes(action.bytes)}/device   -> {spec_of(action.layout)}"
            )
        elif isinstance(action, Split):
            lines.append(f"{indent}split axis {action.dst} over {action.axis} (local slice)   -> {spec_of(action.layout)}")
        elif isinstance(action, Local):
            step = action.step
            what = short(step.leaf) if step.leaf is not None else f"scale by {step.c:g}"
            where = f" on axis {step.axes[0]}" if len(step.axes) == 1 else f" on axes {step.axes}" if step.axes else ""
            if action.weight_split is not None:
                form = "row" if action.psum else "column"
                axes = "+".join(n for part in action.weight_split for n in part)
                where += f", {form}-parallel: weight split over {axes}"
            lines.append(f"{indent}{what}{where}")
            if action.psum:
                op = "psum_scatter" if action.scatter else "psum"
                lines.append(f"{indent}{op} {'+'.join(action.psum)}   {_fmt_bytes(action.bytes)}/device")
        else:
            lines.append(f"{indent}sum of {len(action.terms)} terms:")
            for k, term in enumerate(action.terms):
                lines.append(f"{indent}  term {k + 1}:")
                lines += _action_lines(term, indent + "    ")
            lines.append(f"{indent}  add   -> {spec_of(action.layout)}")
    return lines


def make_plan(op: Operator, shape, in_layout: Layout, mesh_shape, accept: Callable[[Layout], bool],
              where: str, exits: int = 1, shard_weights: bool | str = "auto") -> Plan:
    """The cheapest plan for `op` on a tensor of `shape` (domain + batch) laid out as
    `in_layout`, ending in a layout `accept` takes; a `ValueError` if there is none.
    `Plan.exits` lists (at least) the `exits` cheapest layouts it could have ended in."""
    planner = Planner(mesh_shape, shard_weights)
    prog = program(op, op.dtype)
    enough = Enough(count=exits, accept=accept)
    routes = planner.explore(prog, tuple(shape), in_layout, enough)
    fits = [(r.cost, layout != in_layout, layout) for layout, r in routes.items() if accept(layout)]
    if not fits:
        needs = sorted({f"axis {s.axes[0]}" for s in _all_steps(prog) if s.leaf is not None
                        and Role.LOCAL in s.leaf.roles})
        raise ValueError(
            f"{where}: no plan exists for input shape {tuple(shape)} split as "
            f"{spec_of(in_layout)} on mesh {dict(mesh_shape)}"
            + (f": {', '.join(needs)} must be whole for an operator, so its split must move to "
               "another axis whose size it divides" if needs else "")
            + " (and the wanted output layout must be reachable without gathering)"
        )
    _, _, out_layout = min(fits, key=lambda f: (f[0], f[1], str(f[2])))
    out_shape = tuple(op.range_shape) + tuple(shape[op.ndim:])
    exits = {layout: r.cost for layout, r in routes.items() if accept(layout)}
    return Plan(op, dict(mesh_shape), tuple(shape), out_shape, in_layout, out_layout, routes[out_layout], exits)


def _all_steps(prog: Program):
    for s in prog.steps:
        yield s
        for t in s.terms:
            yield from _all_steps(t)
