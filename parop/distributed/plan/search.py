"""The search: the cheapest route of actions from the input layout to an output layout
in which every step of the program has run.

A search state is `(frames, context, done, layout)`: the program being run
(`context`, a program from a given tensor shape), the bit mask of its steps `done`,
the layout, and, inside a sum, a stack of `frames` (the sum's program, the term
running, the layout the terms start from and the one they must end in). A sum's terms
run one after the other from the same entry layout; the first term's exit fixes the
layout every other term must end in.

Three searches share the moves and the costs:

- `exhaustive=True`, the oracle: Dijkstra's algorithm over every state;
- the default, A* with three reductions, each exact (see `parop.distributed.plan`), its
  lower bound `LowerBound` (`bound.py`), a base class of `Search`;
- `permutes=True`, with `Permute` moves too: Dijkstra's algorithm (the lower bound
  counts no `Permute`) with the two reductions that stay exact with them (forced
  steps: a `Permute` costs the bytes of the block it deals, no less on a larger
  tensor; no back-to-back moves of the same mesh axes), on the whole program.

For a chain (a program with barriers), `Search.chain` runs a dynamic programming over
the layouts where one operator hands over to the next, each operator's exits found by
the A* search (`Exits`).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from typing import Callable, Iterator, Mapping

from ..layout import Layout
from .actions import (AllToAll, Enter, Exit, Local, NextTerm, Permute, Split, State, StepAction, fold, mapped_route,
                      runs_as_is)
from .bound import LowerBound
from .context import Context
from .cost import CostModel
from .errors import PlanningError
from .goal import Goal
from .program import Program, Step
from .symmetry import automorphisms, image, move, rename, structure

Cost = tuple[float, float, int, float]  # (time in bytes, bytes sent, collectives, weight bytes held)
ZERO: Cost = (0.0, 0.0, 0, 0.0)
INFINITE: Cost = (math.inf, math.inf, 0, math.inf)
MAX_STATES = 200_000


class Interned:
    """A value that stands for itself in the search's tables: equal values are one
    object, hashed by identity (the search hashes states millions of times)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Node:
    """What the search knows of `(context, done, layout)`, whatever the sum frames around
    it: the tensor there, the steps forced from there, the moves (computed once) and the
    lower bound per goal where no sum frame is open."""

    __slots__ = ("here", "settled", "moves", "sums", "bounds", "lines")

    def __init__(self, here: State):
        self.here = here
        self.settled: tuple[int, tuple] | None = None  # (done after the forced steps, their actions)
        # (edge, done after it and the steps it forces, next layout, cost, forced actions, the next node's
        # `bounds` and `lines` (not the node: no cycles to collect), the next state with no sum frame,
        # the mesh axes and source it moves (an AllToAll), whether it is a move to an unpadded layout)
        self.moves: list | None = None
        self.sums: tuple[int, ...] = ()  # ready sum steps
        self.bounds: dict = {}  # goal -> `bound` of the state with no sum frame
        self.lines: dict = {}  # goal or None -> `line` (on the whole program), or `parking` if more


class Exits:
    """The layouts one operator of a chain can end in (all its steps run, unpadded), from
    one entry, cheapest first: an `explore` of `prog`, run on only as far as asked, with
    the route to each (so that the chain's route needs no search of its own).

    `leaving` (for an operator that is one sum, see `Search.leaving`), called once when
    first needed: `(staying, moved, apart)`, lower bounds on the cost of the exit at the
    entry layout `entry` itself, on what an exit elsewhere costs beyond the route to the
    end state at `entry`, and on its cost by any route that does not pass through that
    state. So an exit not found yet costs at least `min(staying, apart)`, and once the
    exit at `entry` is found at cost `c`, every later one at least `min(c + moved, apart)`."""

    def __init__(self, prog: Program, ends: Iterator, entry: Interned | None = None,
                 leaving: Callable[[], tuple[float, float, float]] | None = None):
        self.prog, self.ends = prog, ends
        self.entry, self.leaving = entry, leaving
        self.leave: tuple[float, float, float] | None = None  # `leaving()`, once called
        self.found: list[tuple[Cost, Interned]] = []  # (cost, layout), cheapest first
        self.routes: list[tuple] = []  # the actions to each of `found`
        self.popped: list = []  # (cost, tie, layout, actions) popped but not known to be next
        self.open: list = []  # the search's heap: no end not popped yet costs less than its top,
        self.pending: Cost | None = None  # or than the end popped last while not searched on from yet
        self.over = False  # whether the search has popped every end
        self.tie = itertools.count()

    def get(self, k: int) -> tuple[Cost, Interned] | None:
        """The `k`-th cheapest exit `(cost, layout)`, or None if there are fewer."""
        while len(self.found) <= k and not (self.over and not self.popped):
            self.step()
        return self.found[k] if k < len(self.found) else None

    def least(self, k: int) -> Cost | None:
        """A lower bound on the cost of the `k`-th cheapest exit (its cost once found), or
        None if there are fewer."""
        if k < len(self.found):
            return self.found[k][0]
        if self.over and not self.popped:
            return None
        tops = [self.popped[0][0]] if self.popped else []
        tops += [self.pending] if self.pending is not None else []
        least = min(tops + [self.open[0][0]]) if self.open and not self.over else min(tops) if tops else ZERO
        if self.leaving is None:
            return least
        if self.leave is None:
            self.leave = self.leaving()
        staying, moved, apart = self.leave
        stay = next((cost[0] for cost, lay in self.found[:k] if lay is self.entry), None)
        floor = min(staying if stay is None else stay + moved, apart)
        # only the time is bounded: the later fields of a cost of exactly `floor` may be anything
        return (floor, 0.0, 0, 0.0) if floor > least[0] else least

    def step(self) -> None:
        """Takes the cheapest exit popped if no other can cost less, or searches one state on."""
        first = self.popped[0][0] if self.popped else None
        if first is not None and (self.pending is None or first <= self.pending) and (
                self.over or not self.open or first <= self.open[0][0]):
            cost, _, lay, route = heapq.heappop(self.popped)
            self.found.append((cost, lay))
            self.routes.append(route)
            return
        try:
            cost, state, back, self.open = next(self.ends)
            # an end popped is searched on from (`explore`'s `before`) only at the next step
            self.pending = cost if state is not None else None
            if state is not None:
                heapq.heappush(self.popped, (cost, next(self.tie), state[3], fold(_route(back, state))))
        except StopIteration:
            self.over, self.pending = True, None


def _add(a: Cost, b: Cost) -> Cost:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


# (parent context, its done mask with the sum's bit, sum step index, term, entry layout, exit layout or None)
Frame = tuple


class Tables:
    """What the searches of one plan (one mesh, cost model and `shard_weights`: a search
    and those it starts for its bounds and its symmetry) share, whatever their pins: the
    interned values, the programs' contexts, the tensor's states, and the moves from each
    state with their costs."""

    def __init__(self):
        self.interned: dict = {}
        self.contexts: dict = {}
        self.states: dict = {}  # (sizes, itemsize, layout) -> State
        self.moves: dict = {}  # (sizes, itemsize, layout, step or None, its pinned weight) -> moves
        self.placements: dict = {}  # (layout, goal) -> Placement; layout -> Spread; goal -> Wish
        self.prices: dict = {}  # (context, done, scope, tensor axes, ...) -> `Search.moves_price`
        self.operators: dict = {}  # (chain context, i) -> its operator i's program
        self.terms: dict = {}  # a sum's term's class (`Search.term_class`) -> its `term_bound` or `departing`
        self.shuttles: dict = {}  # (context, mesh axis sizes in use, unpadded end or target, pins) -> `Shuttles`
        self.asked: dict = {}  # a table's key -> the states that asked for it (`shuttling_to`)
        self.fits: dict = {}  # (context, mesh axis sizes in use, pins) -> where each step may run (`Shuttles.fits`)
        self.priced: dict = {}  # (tensor axes, mesh axes in use) -> {a move's price: `Shuttles.priced_moves`}


class Search(LowerBound):
    """Routes through programs on one mesh, for one cost model (its lower bound: `LowerBound`)."""

    def __init__(self, mesh_shape, cost: CostModel, shard_weights: bool | str = "auto",
                 exhaustive: bool = False, max_states: int = MAX_STATES, pinned: Mapping | None = None,
                 *, permutes: bool = False, tables: Tables | None = None):
        self.pinned = dict(pinned or {})  # weight name -> the mesh axes splitting each of its axes
        self.mesh = tuple(mesh_shape.items())
        self.mesh_sizes = dict(mesh_shape)
        self.devices = math.prod(self.mesh_sizes.values())
        self.mesh_used = tuple(sorted((size for size in self.mesh_sizes.values() if size > 1), reverse=True))
        self.cost, self.shard_weights = cost, shard_weights
        self.exhaustive, self.max_states = exhaustive, max_states
        self.permutes = permutes  # with `Permute` moves: no lower bound (it knows none), so Dijkstra's search
        self._expanded = 0
        self.split_counts = {math.prod(c) for k in range(1, len(self.mesh) + 1)
                             for c in itertools.combinations(self.mesh_sizes.values(), k)}
        self._tables(Tables() if tables is None else tables)

    def _tables(self, tables: Tables) -> None:
        """Starts every memo table afresh, sharing `tables`."""
        self.tables = tables
        self._interned = tables.interned
        self._nodes: dict = {}
        self._lines: dict = {}
        self._parking: dict = {}
        self._shuttled: dict = {}
        self._shuttled_to: dict = {}
        self._targets: dict = {}
        self._in_use: dict = {}
        self._weighs: dict = {}
        self._unpads: dict = {}
        self._uneven_ends: dict = {}
        self._placed: dict = {}
        self._parks: dict = {}  # context -> whether `parking` may find anything in it
        self._adjacencies: dict = {}
        self._waypoints: dict = {}
        self._returning: dict = {}
        self._frame_bounds: dict = {}
        self._term_bounds: dict = {}
        self._departing: dict = {}
        self._departures: dict = {}  # (term, entry) -> `Departures`
        self._term_search: Search | None = None  # one for every term's bound: they share its tables
        self._entry_bounds: dict = {}
        self._alone: dict = {}
        self._later: dict = {}
        self._onward: dict = {}
        self._tails: dict = {}
        self._exit_goals: dict = {}
        self._kept_goals: dict = {}  # (layout, the pairs kept) -> `kept_goal`
        self._exits: dict = {}
        self._rests: dict = {}
        self._boundaries: dict = {}
        self._backward_ends: dict = {}  # (root, j, used, goal) -> `backwards`'s search (`AdjointEnds`)
        self._classes: dict = {}
        self._term_shapes: dict = {}
        self._pinning: dict = {}
        self._pins: dict = {}
        self._pinned_splits: dict = {}
        self._pin_places: dict = {}
        self._renamed: dict = {}  # renamed pins -> the search with them: the symmetry's searches
        self._learned: dict = {}  # (context, goal, after, before, padded) -> {state: a lower bound on its time left}
        self._subs: list = []  # every search `sub` started: their states count as this one's

    def release(self) -> None:
        """Drops the tables (a finished search needs none of them), its own and those of the
        searches it started (`sub`: they hold the shared ones too), so that their millions
        of objects are freed at once, not traversed by the garbage collector first (0.23 s
        of dfno's chain at batch 4 once the bound's tables outlived the search); the states
        expanded are kept."""
        self._expanded = self.expanded
        for found in (*self._exits.values(), *self._backward_ends.values(), *self._departures.values()):
            found.ends.close()  # its search's frame refers back to the search
        subs = self._subs
        self._tables(Tables())
        for sub in subs:
            sub.release()

    @property
    def expanded(self) -> int:
        """The states this search expanded, with those of the searches it started (`sub`:
        for its bounds and its symmetries)."""
        return self._expanded + sum(s.expanded for s in self._subs)

    # -- tables ------------------------------------------------------------------------------
    def intern(self, value) -> Interned:
        found = self._interned.get(value)
        if found is None:
            found = self._interned[value] = Interned(value)
        return found

    def context(self, prog: Program, shape, itemsize: int, term: bool = False) -> Context:
        """`prog` run on a tensor of `shape` and `itemsize` (`term`: as a sum's term)."""
        contexts = self.tables.contexts
        key = (id(prog), shape, itemsize, term)
        if key not in contexts:
            contexts[key] = Context(prog, shape, itemsize, bool(self.shard_weights), frozenset(self.split_counts), term)
        return contexts[key]

    def operator(self, ctx: Context, i: int) -> Program:
        """The chain `ctx`'s `i`-th operator as a program of its own (one object per operator:
        the searches of its states share their memos)."""
        key = (ctx, i)
        found = self.tables.operators.get(key)
        if found is None:
            found = self.tables.operators[key] = ctx.prog.segment(i, ctx.sizes(ctx.before(i)))
        return found

    def node(self, ctx: Context, done: int, lay: Interned) -> Node:
        key = (ctx, done, lay)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes[key] = Node(self.state(ctx.sizes(done), ctx.itemsize(done), lay))
        return node

    def state(self, sizes: tuple[int, ...], itemsize: int, lay: Interned) -> State:
        """The tensor of `sizes` and `itemsize` laid out as `lay` (one object per such tensor)."""
        states = self.tables.states
        found = states.get((sizes, itemsize, lay))
        if found is None:
            found = states[(sizes, itemsize, lay)] = State(sizes, lay.value, itemsize, self.mesh)
        return found

    def sub(self, pinned: Mapping) -> "Search":
        """A search of its own on the same mesh and cost model, sharing this one's tables,
        with the weights in `pinned` pinned."""
        search = Search(self.mesh_sizes, self.cost, self.shard_weights, self.exhaustive, self.max_states, pinned,
                        permutes=self.permutes, tables=self.tables)
        self._subs.append(search)
        return search

    def term(self, frame: Frame, k: int) -> Context:
        parent, after, j, _, _, _ = frame
        before = after & ~(1 << j)
        return self.context(parent.steps[j].terms[k], parent.sizes(before), parent.itemsize(before), True)

    def price(self, action, here: State) -> Cost:
        held = action.weight_bytes_held(here) if isinstance(action, StepAction) else 0.0
        return self.cost.price(*action.collectives(here)) + (held,)

    # -- the search ----------------------------------------------------------------------
    def run(self, prog: Program, entry: Layout, goal: Goal, itemsize: int | None = None):
        """`(cost, actions)` of the cheapest route from `entry` (or from the cheapest of a
        list of entry layouts), or a `PlanningError`."""
        collecting = gc.isenabled()
        gc.disable()  # the search allocates millions of small tuples and frees none of them
        try:
            entries = entry if isinstance(entry, list) else [entry]
            root = self.context(prog, prog.shape, prog.dtype.itemsize if itemsize is None else itemsize)
            return self._run(root, entries, goal)
        finally:
            self.release()
            if collecting:
                gc.enable()

    def _run(self, root: Context, entries: list, goal: Goal, after: bool = False):
        if not self.exhaustive and not self.permutes and len(root.segments) > 1 and not self.whole(root):
            return self.chain(root, entries[0], goal)
        for cost, state, back, _ in self.explore(root, entries, goal, after):
            if state is not None:
                return cost, fold(_route(back, state))
        raise PlanningError("no plan exists")

    def explore(self, root: Context, entries: list, goal: Goal, after: bool = False,
                before: bool = False, padded: bool = False) -> Iterator[tuple[Cost, tuple, dict, list]]:
        """`(cost, state, back, heap)` of each end state (every step done, in an unpadded
        layout `goal` accepts) as the search pops it, at its least cost (not expanded
        further), and `(None, None, back, heap)` after each state expanded; `back` gives
        the routes and `heap` what is still open: no end state not yet popped costs less
        than `heap[0][0]`.

        `padded`: an end state may be padded (a sum's term alone). For an operator of a
        chain: `before` (one follows it), an end state is expanded too, its moves giving
        more ends, at the next step (until then `heap[0][0]` bounds no end reached
        through it; its own cost does); `after` (it follows one), no move to an unpadded
        layout comes before its first step if none ran at once from the entry. Such a
        move is the earlier operator's: with nothing run in between, it costs the same
        there, and the barrier runs where it ends.

        A state's bound is the larger of `bound` and what the searches of the same program
        to the same ends before it learned (adaptive A*): a search that pops its first end
        at time `C` has reached each state `s` by a route of time `g(s)`, so every route
        from `s` to an end takes at least `C - g(s)` (from its entry through `s`, it costs
        at least `C`). A chain's searches of one operator from several entries use it.

        Once an end is popped, the bound of a state inside a sum that ends the program
        stops counting the routes that end there again (`bound`'s `popped`): the end was
        popped at its least cost and is searched on from itself."""
        best, back, heap = {}, {}, []
        popped: set = set()  # the layouts of the ends popped (`bound`'s `popped`)
        tie = itertools.count()
        # what the searches of this program to these ends learned (the docstring's last paragraph; Dijkstra's
        # searches use no bound)
        learns = not (self.exhaustive or self.permutes)
        learned = self._learned.setdefault((root, goal, after, before, padded), {}) if learns else {}
        recorded = not learns
        for entry in entries:
            start, forced = self.settle((None, root, 0, self.intern(entry)))
            if start not in best:
                best[start] = ZERO
                back[start] = (None, forced)
                heap.append(((max(self.bound(start, goal, padded=padded), learned.get(start, 0.0)),) + ZERO[1:],
                             next(tie), ZERO, start, False))
        heapq.heapify(heap)
        accepted: dict = {}

        least = best.get
        push, pop = heapq.heappush, heapq.heappop
        frame_bounds, bound_of = self._frame_bounds, self.bound

        def reach(state, edge, nxt, taken, total, bounds, lines, floor):
            """`nxt` by `edge` from `state` (`taken`: the actions forced after it), at `total`,
            if that is less than known (the callers in the loop below check first);
            `bounds` or `lines`: its node's memos (`Node`), if at hand. Its key's time is at
            least `floor`, the time of `state`'s key (pathmax: `state`'s bound less the
            edge's cost is a lower bound on the cost from `nxt` too, since the cheapest
            route from `state` costs no more than the edge and the cheapest route from
            `nxt`; the bounds are admissible but not consistent). Inside a sum whose
            later terms' own searches have not run yet, it is pushed with their `line`s
            alone, and in a sum's first term with only the frame's part of the bound on
            where the sum ends (`bound`'s `fork`); such a state (`loose`) is pushed again
            with the whole bound when popped, if that is more."""
            best[nxt] = total
            back[nxt] = ((state, edge), taken)
            loose = False
            if bounds is None:
                fr = nxt[0]
                loose = fr is not None and (fr, goal, False, padded) not in frame_bounds
                bound = bound_of(nxt, goal, lines, loose, fork=False, padded=padded, popped=popped)
                loose = loose or (fr is not None and fr.value[-1][3] == 0)
            else:
                bound = bounds.get(goal)
                if bound is None:
                    bound = bounds[goal] = bound_of(nxt, goal)
            bound = max(bound, learned.get(nxt, 0.0))
            push(heap, ((max(total[0] + bound, floor), total[1], total[2], total[3]), next(tie), total, nxt, loose))

        while heap:
            key, _, cost, state, loose = pop(heap)
            if key[0] == math.inf:
                return  # every state still open has an infinite bound: none reaches an end
            if best[state] < cost:
                continue
            if loose:  # its whole bound now: pushed back if that is more
                exact = (cost[0] + bound_of(state, goal, padded=padded, popped=popped), cost[1], cost[2], cost[3])
                if exact > key:
                    push(heap, (exact, next(tie), cost, state, False))
                    continue
            fr, ctx, done, lay = state
            if fr is None and done == ctx.full:
                if lay not in accepted:
                    accepted[lay] = goal.accepts(lay.value) and (padded or not self.node(ctx, done, lay).here.any_padded)
                if accepted[lay]:
                    popped.add(lay)
                    if not recorded:  # what this search learned (see above)
                        recorded, first = True, cost[0]
                        for reached, way in best.items():
                            if first - way[0] > learned.get(reached, 0.0):
                                learned[reached] = first - way[0]
                    yield cost, state, back, heap
                    if not before:
                        continue
            self._expanded += 1
            if self._expanded > self.max_states:
                raise PlanningError(f"the planner gave up after {self.max_states} states", gave_up=True)
            node = self.node(ctx, done, lay)
            if node.moves is None:
                self.fill(ctx, done, lay, node)
            if node.sums or fr is not None:
                for edge, nxt in self.openings(state, node):
                    nxt, taken = self.settle(nxt)
                    if cost < least(nxt, INFINITE):
                        reach(state, edge, nxt, taken, cost, None, None, key[0])
            held = after and fr is None and done == 0
            arrived, forced = back[state]
            last = None if self.exhaustive or arrived is None or forced else arrived[1][-1]
            # the search drops a move that moves the mesh axes the last move moved, when no step ran since
            undo = (last.axes, last.dst) if isinstance(last, (AllToAll, Split)) else None
            frame = fr.value[-1] if fr is not None else None
            hands = frame is not None and frame[3] > 0  # a later term: it hands over where the first ended
            c0, c1, c2, c3 = cost
            for edge, ndone, nlay, delta, taken, nbounds, nlines, top, moved, frees in node.moves:
                if undo is not None and moved == undo:
                    continue  # the same mesh axes again at once: one move from before does it
                if held and frees:
                    continue  # the earlier operator's move (to a padded layout, no barrier could run between)
                if fr is None:
                    nxt, lines = top, None
                elif hands and ndone == ctx.full and nlay is frame[5]:
                    nxt, more = self.settle((fr, ctx, ndone, nlay))
                    taken, nbounds, lines = taken + more, None, None
                else:
                    nxt, nbounds, lines = (fr, ctx, ndone, nlay), None, nlines
                known = least(nxt, INFINITE)
                time = c0 + delta[0]
                if time > known[0]:
                    continue  # no cheaper than known (most moves stop here, their cost's time is enough)
                total = (time, c1 + delta[1], c2 + delta[2], c3 + delta[3])
                if total < known:
                    reach(state, edge, nxt, taken, total, nbounds, lines, key[0])
            yield None, None, back, heap

    # -- chains ------------------------------------------------------------------------------
    def whole(self, root: Context) -> bool:
        """Whether a chain is searched whole, by `explore` (its operators one after the
        other, their hand-overs states like any other), not by `chain`'s dynamic
        programming: where no two of its operators are alike, so that none shares another's
        exits, and every weight is pinned (a network planned again at another batch
        size). The whole search's bound sees past each hand-over: the moves the rest of
        the chain makes to the goal from wherever a layer ends (`chain_line`, `tails`);
        the dynamic programming's look-ahead prices the operators after a hand-over from
        the best layout of its mesh axes. A network of one layer: the 8³ `local_kernel`
        chain pinned at batch 8, 18.6 k states to 4.4 k, the same cost. Where a weight is
        free, the plan picks among equally cheap ones the placement that other batch
        sizes are pinned to, so those keep the dynamic programming's choice."""
        return (all(self.alone(root, i) for i in range(len(root.segments)))
                and self.pins_every_weight(root.prog))

    def chain(self, root: Context, entry: Layout, goal: Goal):
        """The cheapest route through a chain (a program with barriers), by dynamic
        programming over the layouts where one operator hands over to the next.

        A chain's cost is the sum of its operators' costs, each from the layout it
        starts in to the one it hands over in (a barrier costs nothing and runs in an
        unpadded layout; a move between two operators is the earlier one's, see
        `explore`). So the search runs over `(operator, hand-over layout)`: A* whose
        moves are an operator's exits from a layout (`Exits`: every layout it can end
        in, cheapest first, found as needed), with the later operators' least costs
        (`rest`) as its bound. Operators alike but for their weights' names (a network's
        identical layers) share their exits, and so do layouts alike up to swapping mesh
        axes of equal size where that changes no cost. The route through each operator
        is then the one its exits' search found to the layout chosen (`chain_route`).

        The look-ahead bounds only a route's time: where it raises an item's time above
        its operator's open routes', the bytes, collectives and weight bytes of those
        routes bound nothing (a route of more time may reach the raised time with fewer),
        only the cost so far does (the `sure` key), and at the last three operators the
        cost so far plus their whole least cost, where `backwards` found it (`last_from`:
        a bound on every field in the cost's order, from the item's own layout as far as
        that search has reached it). Where the third last operator repeats (a network's
        last layer), an item there is pushed back with that bound's time, its search
        stepped on while the item is the cheapest: one search backwards from the output
        serves every layout the layer starts in, where the layer's exits are searched from
        each (not for a network's single layer: the layouts the lifting hands over in are
        dear to reach backwards, up to 3.3 times the states). The search orders its items
        by the raised time with the open route's later fields until it pops an end (that order
        decides among plans of equal cost), then searches on, by the sure key, whatever
        could still end cheaper, and keeps that end unless one costs strictly less: the
        whole cost order (time, bytes, collectives, weight bytes held) is the exhaustive
        search's."""
        n = len(root.segments)
        before = [root.before(i) for i in range(n)]
        progs = [self.operator(root, i) for i in range(n)]
        contexts = [self.context(p, p.shape, root.itemsize(before[i])) for i, p in enumerate(progs)]
        summing = [bool(root.psum_steps & root.segments[i]) for i in range(n)]
        pins = [self.pins(p) for p in progs]
        autos = [automorphisms(p) for p in progs[:-1]]  # the last operator's goal breaks its symmetries
        kinds: dict = {}  # (operator, its renamed pins) -> its structure with them
        firsts: dict = {}  # (structure, renamed pins) -> the first operator of that kind: its program is searched
        searched: dict = {}  # (operator, layout) -> `exits`

        def exits(i: int, lay: Interned) -> tuple[Exits, tuple | None]:
            """Operator i's exits from `lay`, and the symmetry that gives them (`(names, perm)` for
            `_move`; None: none).

            An operator between two others costs the same between two layouts, with its weights
            pinned, as between the same layouts with mesh axes of equal size swapped, or its tensor
            axes permuted by one of its `automorphisms`, and its weights pinned where that takes
            them: its exits are searched once per class."""
            mine = searched.get((i, lay))
            if mine is None:
                ends = goal if i == n - 1 else Goal.any()
                renamed, names, moved = self.canonical(lay, pins[i], autos[i]) if i < n - 1 else (lay, None, pins[i])
                search = self.renamed(moved)
                if (i, moved) not in kinds:  # interned: the key is hashed by identity
                    kinds[(i, moved)] = self.intern(structure(progs[i], root.itemsize(before[i]), search.pinned))
                key = (kinds[(i, moved)], renamed, ends, i > 0, i < n - 1)
                found = self._exits.get(key)
                if found is None:
                    # every search of a kind runs on one program: each learns from the others
                    c = firsts.setdefault((kinds[(i, moved)], moved), i)
                    one_sum = i < n - 1 and len(contexts[c].steps) == 1 and contexts[c].steps[0].terms
                    leaving = (lambda: search.leaving(contexts[c], renamed, i > 0)) if one_sum else None
                    found = self._exits[key] = Exits(progs[c], search.explore(contexts[c], [renamed.value], ends,
                                                                               *key[3:]), renamed, leaving)
                mine = searched[(i, lay)] = (found, names)
            return mine

        start = self.intern(entry)
        stepping = n >= 3 and not self.alone(root, n - 3)  # see `last_from`

        def last_from(i: int, lay: Interned, cost: Cost, step: bool = False) -> Cost | None:
            """The operators from `i` on, from `lay` (`LowerBound.last_from`), where they are
            the last three; `step`: their search is stepped on while an item at `cost` is the
            cheapest, where the third last operator repeats (a network's last layer)."""
            if i != n - 3:
                return None
            need = (heap[0][0][0] if heap else math.inf) - cost[0] if step and stepping else -math.inf
            return self.last_from(root, i, lay, goal, need)

        def sure_of(i: int, lay: Interned, cost: Cost, sure: Cost) -> Cost:
            """`sure`, or where more, `cost` plus the whole least cost of the operators from
            `i` on, as far as known (`last_from`)."""
            last = last_from(i, lay, cost)
            return sure if last is None else max(sure, _add(cost, last))

        best, back = {(0, start): ZERO}, {}
        tie = itertools.count()
        first = (self.rest(root, 0, start, goal),) + ZERO[1:]
        heap = [(first, next(tie), ZERO, 0, start, None, first)]
        end = None  # (cost, layout) of the cheapest end popped; from then on the heap is keyed by `sure`
        while heap:
            key, _, cost, i, lay, k, sure = heapq.heappop(heap)
            if key[0] == math.inf or (end is not None and key >= end[0]):
                break  # no route through the rest of the chain from anywhere still open (cheaper than `end`)
            if best[(i, lay)] < cost:
                continue
            if k is None:  # operator i starts from `lay`
                last = last_from(i, lay, cost, step=True)
                if last is not None and cost[0] + last[0] > key[0]:  # pushed back, its time raised
                    sure = max(sure, _add(cost, last))
                    heapq.heappush(heap, (((cost[0] + last[0],) + key[1:]) if end is None else sure, next(tie), cost,
                                          i, lay, None, sure))
                    continue
                if i == n:
                    if end is None:  # see `sure` below: the items whose time ties the end's are searched on
                        heap = [(item[-1],) + item[1:] for item in heap]
                        heapq.heapify(heap)
                    if end is None or cost < end[0]:
                        end = (cost, lay)
                    continue
                k = 0
            elif k < len(exits(i, lay)[0].found):  # the k-th exit of operator i from `lay`
                found, names = exits(i, lay)
                step, out = found.found[k]
                out = self.intern(out.value if names is None else move(out.value, *names))
                total = _add(cost, step)
                if total < best.get((i + 1, out), INFINITE):
                    best[(i + 1, out)] = total
                    back[(i + 1, out)] = lay
                    reach = (total[0] + self.rest(root, i + 1, out, goal),) + total[1:]
                    sure = sure_of(i + 1, out, total, reach)
                    heapq.heappush(heap, (reach if end is None else sure, next(tie), total, i + 1, out, None, sure))
                if i == n - 1:  # the last operator: its first exit is the one
                    continue
                k += 1
            # every exit from the k-th on costs at least `least`, and hands over with the mesh axes used
            # now unless the operator can sum one away; and no route from `lay` costs less than `rest`
            ahead = (0.0 if summing[i] else self.rest(root, i + 1, lay, goal), self.rest(root, i, lay, goal))
            last = last_from(i, lay, cost, step=True)
            if last is not None:
                ahead = (ahead[0], max(ahead[1], last[0]))
            found = exits(i, lay)[0]
            while True:
                least = found.least(k)
                if least is None:
                    break
                total = _add(cost, least)
                time, floor = total[0] + ahead[0], cost[0] + ahead[1]
                # `least`'s later fields are those of the operator's open route of least time, which bound
                # the routes of that time only: where the look-ahead raises the time to `floor`, a route of
                # more time may reach it with fewer bytes, and only the cost so far bounds them (`sure`)
                sure = (time,) + total[1:] if time >= floor else (floor,) + cost[1:]
                if last is not None:  # (`sure_of`, with the `last_from` found above: the same within the loop)
                    sure = max(sure, _add(cost, last))
                key = (max(time, floor),) + total[1:] if end is None else sure
                if end is not None and key >= end[0]:
                    break  # no route on from here ends cheaper than the end found
                if k < len(found.found) or (heap and heap[0][0] < key):
                    heapq.heappush(heap, (key, next(tie), cost, i, lay, k, sure))
                    break
                found.step()  # still the cheapest item: search on
        if end is None:
            raise PlanningError("no plan exists")
        return self.chain_route(root, progs, (n, end[1]), back, goal, searched)

    def chain_route(self, root: Context, progs: list, end: tuple, back: dict, goal: Goal, searched: dict):
        """`(cost, actions)` through the chain's operators, each from the layout it starts
        in to the one the dynamic programming chose for it, with the barriers between.
        Each takes the route its exits' search found (`searched`: (operator, layout) ->
        its exits and their symmetry), mapped back where that search ran from a symmetric
        image of the layout (`known`); only where that cannot be mapped is it searched
        again between the two layouts, operators alike but for their weights' names then
        taking one search's route, each with its own steps."""
        n, lay = end
        layouts = [lay]
        for i in range(n, 0, -1):
            layouts.append(back[(i, layouts[-1])])
        layouts.reverse()
        cost, actions = ZERO, ()
        routes: dict = {}  # (structure, layouts, ...) -> (operator, cost, route): operators alike share one
        for i, prog in enumerate(progs):
            itemsize = root.itemsize(root.before(i))
            key = (structure(prog, itemsize, self.pinned), layouts[i], layouts[i + 1] if i < n - 1 else goal, i > 0)
            found, names = searched[(i, layouts[i])]
            known = self.known(found, names, layouts[i + 1], prog)
            if known is not None:
                step, route = known
            elif key in routes:
                first, step, route = routes[key]
                route = mapped_route(route, dict(zip(map(id, first.all_steps()), prog.all_steps())),
                                     *self.identity(len(layouts[i].value)))
            else:
                ends = goal if i == n - 1 else Goal.layout(layouts[i + 1].value)
                step, route = self._run(self.context(prog, prog.shape, itemsize),
                                        [layouts[i].value], ends, i > 0)  # as its exits were found
                routes[key] = (prog, step, route)
            barrier = () if i == n - 1 else (Local(root.steps[root.segments[i].bit_length() - 1]),)
            cost, actions = _add(cost, step), actions + route + barrier
        return cost, actions

    def known(self, found: Exits, names: tuple | None, out: Interned, prog: Program) -> tuple[Cost, tuple] | None:
        """`(cost, actions)` of `prog`'s route to `out` as its exits' search `found` found it,
        mapped by the symmetry `names` (`(names, perm)`: from that search's layouts to
        `prog`'s; None: the identity), or None where the route names a weight's split,
        which the tensor axes' move would not take along."""
        steps, (mesh, perm) = {}, self.identity(len(out.value))
        if names is not None:
            mesh, perm = names
            steps = image(found.prog, perm)
            out = self.intern(move(out.value, {b: a for a, b in mesh.items()},
                                   tuple(sorted(range(len(perm)), key=perm.__getitem__))))
        k = next(k for k, (_, lay) in enumerate(found.found) if lay is out)
        own = dict(zip(map(id, found.prog.all_steps()), prog.all_steps()))
        route = mapped_route(found.routes[k], {id(s): own[id(steps.get(id(s), s))] for s in found.prog.all_steps()},
                             mesh, perm)
        return None if route is None else (found.found[k][0], route)

    def identity(self, rank: int) -> tuple[dict[str, str], tuple[int, ...]]:
        """The symmetry that moves nothing, as `mapped_route` takes it: each mesh axis
        named as it is, each of `rank` tensor axes where it is."""
        return {name: name for name, _ in self.mesh}, tuple(range(rank))

    def pins(self, prog: Program) -> tuple:
        """`(name, layout)` of `prog`'s pinned weights, in order (memoised)."""
        found = self._pins.get(id(prog))
        if found is None:
            names = dict.fromkeys(s.leaf.name for s in prog.all_steps() if s.weighted and s.leaf.name in self.pinned)
            found = self._pins[id(prog)] = (prog, tuple((name, self.pinned[name]) for name in names))
        return found[1]

    def renamed(self, pins: tuple) -> "Search":
        """This search with the weights in `pins` (`(name, layout)`) pinned there instead
        (itself if that changes nothing; memoised)."""
        if all(self.pinned.get(name) == lay for name, lay in pins):
            return self
        found = self._renamed.get(pins)
        if found is None:
            found = self._renamed[pins] = self.sub({**self.pinned, **dict(pins)})
        return found

    def canonical(self, lay: Interned, pins: tuple = (), autos: tuple = ()) -> tuple[Interned, tuple, tuple]:
        """`(g(lay), g⁻¹, g(pins))` for the symmetry `g` that gives the least `(g(pins), g(lay))`:
        one representative per class of (layout, pins) alike up to a symmetry (the first
        such `g` of `classes`). The symmetries: renamings of mesh axes of equal size, each
        with each of `autos` (the program's `automorphisms`; none: the identity alone),
        pins renamed and moved along (`pins`: `(name, layout)` of pinned weights). `g⁻¹` is
        `(names, perm)` for `_move`."""
        least, symmetries, moved = self.classes(lay, pins, autos)
        return self.intern(least), symmetries[0][2], moved

    def classes(self, lay: Interned, pins: tuple, autos: tuple) -> tuple[Layout, tuple, tuple]:
        """`(g(lay), every such g as (names, perm, g⁻¹), g(pins))` for the symmetries `g` of
        `canonical` that give the least image of `(pins, lay)`, in `pinning`'s order
        (memoised): the stabiliser, which maps a second layout to its least image in the
        pair's class (`term_class`)."""
        key = (lay, pins, autos)
        found = self._classes.get(key)
        if found is None:
            moved, symmetries = self.pinning(pins, autos, len(lay.value))
            images = [(move(lay.value, names, perm), (names, perm, back)) for names, perm, back in symmetries]
            least = min(value for value, _ in images)
            found = self._classes[key] = (least, tuple(g for value, g in images if value == least), moved)
        return found

    def pinning(self, pins: tuple, autos: tuple, rank: int) -> tuple[tuple, list]:
        """`(g(pins), [(names, perm, g⁻¹), ...])`: the least image of `pins` under the
        symmetries of `canonical` (on tensors of `rank` axes) and the symmetries `g` that
        give it, in `canonical`'s order (memoised)."""
        key = (pins, autos, rank)
        found = self._pinning.get(key)
        if found is None:
            groups = {}
            for name, size in self.mesh:
                groups.setdefault(size, []).append(name)
            least, symmetries = None, []
            for orders in itertools.product(*(itertools.permutations(g) for g in groups.values())):
                names = {a: b for g, order in zip(groups.values(), orders) for a, b in zip(g, order)}
                for perm, weights in autos or ((tuple(range(rank)), ()),):
                    goes = dict(weights)
                    moved = tuple((w, move(spec, names, goes[w]) if w in goes else rename(spec, names))
                                  for w, spec in pins)
                    if least is None or moved < least:
                        least, symmetries = moved, []
                    if moved == least:
                        back = tuple(sorted(range(len(perm)), key=perm.__getitem__))
                        symmetries.append((names, perm, ({b: a for a, b in names.items()}, back)))
            found = self._pinning[key] = (least, symmetries)
        return found

    # -- moves -------------------------------------------------------------------------------
    def settle(self, state) -> tuple[tuple, tuple]:
        """`state` after the forced moves, and the actions they took: the forced steps
        (`forced`), and a sum's later term that is back in the layout its terms must
        end in hands over. The exhaustive search forces nothing."""
        if self.exhaustive:
            return state, ()
        taken = ()
        while True:
            fr, ctx, done, lay = state
            done, steps, _ = self.forced(ctx, done, lay)
            taken += steps
            state = (fr, ctx, done, lay)
            if fr is not None and done == ctx.full and fr.value[-1][3] > 0 and lay is fr.value[-1][5]:
                marker, state = self.hand_over(state)
                taken += (marker,)
                continue
            return state, taken

    def forced(self, ctx: Context, done: int, lay: Interned) -> tuple[int, tuple, Node]:
        """The steps that run at once from `(done, layout)`, the new done mask and its node:
        a step without a weight or another form, needing no collective, not growing the
        tensor and not changing which splits may pad its axes (`Context.forceable`:
        running it later is never cheaper)."""
        node = self.node(ctx, done, lay)
        if node.settled is None:
            start, taken, here, progress = done, [], node.here, bool(ctx.forceable & ~done)
            while progress:
                progress = False
                for j in ctx.ready(done):
                    if ctx.forceable >> j & 1 and runs_as_is(ctx.steps[j], here):
                        taken.append(Local(ctx.steps[j]))
                        done |= 1 << j
                        here = self.state(ctx.sizes(done), ctx.itemsize(done), lay)
                        progress = True
                        break
            node.settled = (done, tuple(taken))
            if done != start:
                self.node(ctx, done, lay).settled = (done, ())
        done, taken = node.settled
        return done, taken, node if not taken else self.node(ctx, done, lay)

    def hand_over(self, state):
        """A sum's term has run to its exit: the next term starts from the entry layout, or
        the last one hands the sum back to the program around it."""
        fr, ctx, done, lay = state
        frames = fr.value
        parent, after, j, k, entry, exit_ = frames[-1]
        exit_ = lay if exit_ is None else exit_
        if k + 1 < len(parent.steps[j].terms):
            frame = (parent, after, j, k + 1, entry, exit_)
            return NextTerm(), (self.intern(frames[:-1] + (frame,)), self.term(frame, k + 1), 0, entry)
        outer = self.intern(frames[:-1]) if len(frames) > 1 else None
        return Exit(), (outer, parent, after, lay)

    def openings(self, state, node: Node) -> Iterator[tuple[tuple, tuple]]:
        """`(edge, next state)` of the moves from `state` that depend on its sum frames (each
        costs nothing): a ready sum's first term starts, or a term that has run hands over."""
        fr, ctx, done, lay = state
        frames = fr.value if fr is not None else ()
        for j in node.sums:
            frame = (ctx, done | 1 << j, j, 0, lay, None)
            yield (Enter(ctx.steps[j]),), (self.intern(frames + (frame,)), self.term(frame, 0), 0, lay)
        if frames and done == ctx.full and (frames[-1][3] == 0 or lay is frames[-1][5]):
            marker, nxt = self.hand_over(state)
            yield (marker,), nxt

    def fill(self, ctx: Context, done: int, lay: Interned, node: Node) -> None:
        """The moves from `node` (that of `(ctx, done, lay)`) that do not depend on the sum
        frames around it, each with the steps it forces (`Node.moves`)."""
        here, moves, sums = node.here, [], []
        place = (here.sizes, here.itemsize, lay)
        found = []
        for j in ctx.ready(done):
            step = ctx.steps[j]
            if step.terms:
                sums.append(j)
                continue
            found.extend((done | 1 << j,) + move for move in self.step_moves(place, step, here))
        found.extend((done,) + move for move in self.step_moves(place, None, here))
        for ndone, action, nlay, cost, moved, frees in found:
            if self.exhaustive:
                sdone, taken, nnode = ndone, (), self.node(ctx, ndone, nlay)
            else:
                sdone, taken, nnode = self.forced(ctx, ndone, nlay)
            moves.append(((action,), sdone, nlay, cost, taken, nnode.bounds, nnode.lines, (None, ctx, sdone, nlay),
                          moved, frees))
        node.moves, node.sums = moves, tuple(sums)

    def step_moves(self, place: tuple, step: Step | None, here: State) -> list:
        """`(action, next layout, cost, moved, frees)` of each way `step` can run from `here`
        (`place`: its sizes, itemsize and layout), or for None each `AllToAll`, `Split` and,
        in a search with them, `Permute` (`moved`: the mesh axes and source axis of an
        `AllToAll`; `frees`: whether it moves to an unpadded layout); shared by the
        searches of one plan."""
        pin = self.pinned.get(step.leaf.name) if step is not None and step.weighted else None
        key = place + (step, pin)
        found = self.tables.moves.get(key)
        if found is None:
            found = self.tables.moves[key] = []
            if step is not None:
                for action in self.forms(step, here):
                    found.append((action, self.intern(action.after(here)), self.price(action, here), None, False))
            movers = (AllToAll, Split) + ((Permute,) if self.permutes else ())
            for action in (() if step is not None else itertools.chain(*(m.candidates(here) for m in movers))):
                nlay = self.intern(action.after(here))
                moved = (action.axes, action.src) if isinstance(action, AllToAll) else None
                frees = not self.state(here.sizes, here.itemsize, nlay).any_padded
                found.append((action, nlay, self.price(action, here), moved, frees))
        return found

    def forms(self, step, here: State) -> Iterator[StepAction]:
        """The ways `step` can run from `here` (with its weight where it is pinned)."""
        pinned = self.pinned.get(step.leaf.name) if step.weighted else None
        for action in StepAction.candidates(step, here, self.shard_weights):
            if pinned is None or action.weight_spec(here) == pinned:
                yield action

def _route(back: dict, state) -> list:
    """The edges (and the forced actions after each) from the start to `state`, in order."""
    items = []
    while True:
        previous, forced = back[state]
        items.extend(reversed(forced))
        if previous is None:
            break
        state, edge = previous
        items.extend(reversed(edge))
    return items[::-1]
