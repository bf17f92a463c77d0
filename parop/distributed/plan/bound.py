"""The search's lower bound: what the cheapest route from a state to the end costs at
least (admissible), so that A* over the states and moves of the exhaustive search finds
a plan just as cheap. Why each part is a lower bound: `parop.distributed.plan` and
docs/planner.md.

`LowerBound`, a base class of `Search`, holds it: its methods read the search's states,
contexts and memo tables, and run small searches of their own (a sum's term alone, a
chain's operator from every layout of the mesh axes in use)."""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, NamedTuple

import numpy as np

from ..layout import Layout, layouts
from .context import Context, bits
from .errors import PlanningError
from .goal import Goal
from .program import Program, prices_alike_backwards, transposed
from .symmetry import automorphisms, move, structure

if TYPE_CHECKING:
    from .search import Cost, Interned, Search

LEAVING_STATES = 256  # the most states `LowerBound.leaving` searches a term for
ALONE_STATES = 1_000  # the most states `LowerBound.entry_bound` searches an operator unlike the chain's others for
BOUNDARY_STATES = 1_000  # the most states each search of `LowerBound.boundary` runs
BACKWARD_STATES = 5_000  # the most states `LowerBound.backwards` searches the adjoint of a network's end for
PLACEMENTS = 4_096  # the most layouts `LowerBound.onward` tries
SHUTTLES = 512  # the most placements of the mesh axes in use `LowerBound.shuttling` solves over
RETURN_ASKS = 16  # the states that ask `LowerBound.shuttling_to` for one table before it is solved
BYTES_LATENCIES = 4  # `LowerBound.weighs_bytes`: the latencies per device the largest tensor must weigh


class Spread(NamedTuple):
    """What `Search.line` and its helpers read of a layout alone (`Search.placement`)."""

    layout: Layout
    splits: tuple[int, ...]  # each tensor axis's pieces
    split: tuple[int, ...]  # the tensor axes split now
    used: frozenset  # the mesh axes in use
    used_sizes: tuple[int, ...]  # their sizes but 1, largest first
    smallest: tuple[int, ...]  # per tensor axis: its least mesh axis size (0: none)
    adjacent: frozenset  # the pairs of mesh axes one right after the other on a tensor axis

    @staticmethod
    def of(layout: Layout, mesh: Mapping[str, int]) -> "Spread":
        used = frozenset(n for axes in layout for n in axes)
        return Spread(layout, tuple(math.prod(mesh[n] for n in axes) for axes in layout),
                      tuple(a for a, axes in enumerate(layout) if axes), used,
                      tuple(sorted((mesh[n] for n in used if mesh[n] > 1), reverse=True)),
                      tuple(min((mesh[n] for n in axes), default=0) for axes in layout),
                      frozenset(pair for axes in layout for pair in zip(axes, axes[1:])))


class Wish(NamedTuple):
    """What `Search.line` and its helpers read of a goal (None: none) alone (`Search.placement`)."""

    free: bool  # no layout is wanted
    prefixes: tuple | None  # the goal's
    wants: tuple  # (tensor axis, the mesh axes it must start with) where there are some
    wanted: dict  # mesh axis -> the tensor axis that must start with it
    wanters: dict  # mesh axis -> the tensor axes that must start with it
    least_wanted: dict  # tensor axis -> the least size of the mesh axes it must start with

    @staticmethod
    def of(goal: Goal | None, mesh: Mapping[str, int]) -> "Wish":
        if goal is None or goal.prefixes is None:
            return Wish(True, None, (), {}, {}, {})
        wants = tuple((b, want) for b, want in enumerate(goal.prefixes) if want)
        wanters: dict = {}
        for b, want in wants:
            for m in want:
                wanters[m] = wanters.get(m, ()) + (b,)
        return Wish(False, goal.prefixes, wants, {m: b for b, want in enumerate(goal.prefixes) for m in want},
                    wanters, {b: min(mesh[n] for n in want) for b, want in wants})


class Placement:
    """What `Search.line` and its helpers read of a layout and a goal (None: none),
    computed once per pair (`Search.placement`): the fields of its `Spread` and its
    `Wish`, and how the two meet. Sets of tensor axes are bit masks."""

    __slots__ = Spread._fields + Wish._fields + ("conflicts", "astray", "ready", "ready_whole", "sources")

    def __init__(self, spread: Spread, wish: Wish, goal: Goal | None):
        self.layout, self.splits, self.split, self.used, self.used_sizes, self.smallest, self.adjacent = spread
        self.free, self.prefixes, self.wants, self.wanted, self.wanters, self.least_wanted = wish
        layout = self.layout
        self.conflicts = 0  # the axes split over a mesh axis the goal does not want there
        self.sources = dict.fromkeys(self.wanted.values(), 0)  # per axis with wants: the axes holding one now
        held = whole = 0  # the axes that want a mesh axis in use on another axis; on any axis
        for a in self.split:
            if goal is not None and goal.conflicts(a, layout[a]):
                self.conflicts |= 1 << a
            for m in layout[a]:
                for b in self.wanters.get(m, ()):
                    self.sources[b] |= 1 << a
                    whole |= 1 << b
                    if a != b:
                        held |= 1 << b
        self.astray = 0  # the axes that do not start with the mesh axes the goal wants there
        wanting = 0
        for b, want in self.wants:
            wanting |= 1 << b
            if layout[b][:len(want)] != want:
                self.astray |= 1 << b
        # the axes a split of free mesh axes can give the mesh axes they lack (`ready`) or want (`ready_whole`)
        self.ready, self.ready_whole = wanting & ~held, wanting & ~whole


class LowerBound:
    """The lower bound of `Search` (its base class: every method reads the search's
    memo tables, `Search._tables`). In the order below:

    - `bound`: a state's bound, which `Search.explore` keys its heap with; inside a
      sum, the later terms' own (`term_bound`, shared by symmetry, `term_class`);
    - `chain_line`, `later`, `tails`, `entry_bound`: a chain's operators after the one
      running, as the whole search of a chain sees them;
    - `rest`, `boundary`: the chain's dynamic programming's look-ahead;
    - `leaving`: where a network's layer can end (`Exits.least`);
    - `parking`, `regrouping`, `line` and their helpers: the collectives still to come
      on one line of data."""

    def exit_goal(self, lay: Interned | None) -> Goal | None:
        if lay is None:
            return None
        if lay not in self._exit_goals:
            self._exit_goals[lay] = Goal.layout(lay.value)
        return self._exit_goals[lay]

    def bound(self, state, goal: Goal, lines: dict | None = None, loose: bool = False, fork: bool = True,
              padded: bool = False, popped: set | frozenset = frozenset()) -> float:
        """A lower bound on the cost from `state` to the end (0 for the oracle). See
        `chain_line`; a sum's later terms add their own, from the sum's entry layout
        (`term_bound`; `loose`: their `line`s alone, no search); inside a term, the rest
        of the program around the sum adds its own from the exit layout once that is
        known. `lines`: the memo of the state's node (`Node.lines`), if at hand.

        In a sum's first term (the exit not known yet), `fork` adds the lesser of two
        cases, each a lower bound: the sum ends where it started (the term's moves back
        to its entry layout, `shuttling_to`, its arrivals there, `arriving`, or, where
        no weight is pinned, its whole `line` to that layout, which also counts the mesh
        axes that must leave a tensor axis the entry leaves whole; each later term's
        bound back to it, and the
        program on from there: its own `line`, which unpads a padded entry, or the
        chain's `chain_line` where that is more), or elsewhere (the term's `line`, each
        later term's cost of leaving the entry layout, `departing`, and the chain's later
        operators), each raised where no mesh axis can come or go by the moves the terms
        make to the exit (`regrouping`), and the program on from an exit that far
        (`tails`); the larger of this and the bound above is returned. Without `fork` (a
        state as it is pushed, before the search pops it), the two cases as they stand
        before the counts from `(done, lay)` raise them (a few additions of what the frame
        keeps; the 4-D 32 × 8 × 8 × 16 chain of the hard scan pinned at batch 6: its
        largest layer search pops 3.5 k states where it popped 4.8 k, 1.32 -> 1.19 s), but
        for `shuttling_to`, a lookup once its table is solved (the 32³ × 8 chain pinned at
        batch 8: 1.69 -> 1.58 s).

        In a sum's first term at the top of the program (`padded`: the search may end in a
        padded layout, which it may not then), the term's `line` and `parking` also count
        the moves that unpad its padded axes (`unpads`): the program ends unpadded, so each
        such move comes in the term or after the sum, where nothing else counts it; priced
        at the least bytes of the term or of the program after the sum. Not in the case
        that ends at a padded entry (the program on from there counts that move), nor
        where `regrouping` counts the moves after the sum (`tails`). An FNO layer that
        parks a mesh axis on a batch axis it does not divide (the 4-D 8-layer
        `local_kernel` chain at batch 7: 19.1 k states to 11.4 k).

        `popped`: the layouts of the ends the search has popped (`explore`). An end is
        popped at its least cost, and every move on from it is searched from there, so a
        route that ends there again finds nothing new. In a sum that ends the program, a
        later term bound for such an exit has nothing left to find (`math.inf`), and the
        first term's fork drops the case that the sum ends at its entry layout where that
        is such an end. A network's layer searched for its exits from a layout: once the
        exit in that layout is found, the routes of its spectral term back there stop
        counting, and the search goes on only where it can end elsewhere (the 4-D
        32 × 32 × 16 × 16 chain at batch 128 on (2, 1, 1, 2, 8, 1): 22.8 k states to
        8.9 k, the same plan cost). Where the exit at the sum's entry layout is popped, the
        sum must end elsewhere and at no popped exit, so each later term costs at least
        its least cost from the entry to an end in none of them (`departing`'s `popped`):
        the same chain, 8.9 k states to 4.7 k."""
        if self.exhaustive or self.permutes:
            return 0.0
        fr, ctx, done, lay = state
        if fr is None:
            return self.chain_line(ctx, done, lay, goal)
        found = self._frame_bounds.get((fr, goal, loose, padded))  # the goal: the program's end, in the bound past it
        if found is None:
            parent, after, j, k, entry, exit_ = fr.value[-1]
            top = len(fr.value) == 1
            ends = self.exit_goal(exit_)
            terms = [self.term(fr.value[-1], t) for t in range(k + 1, len(parent.steps[j].terms))]
            rest = sum(self.line(term, 0, entry, ends) if loose else self.term_bound(term, entry, ends)
                       for term in terms)
            if top and k > 0:  # the program goes on from the known exit
                rest += self.chain_line(parent, after, exit_, goal)
            # term 0's exit is where the program goes on: the chain's later operators (from the mesh axes
            # in use now, cached with the frame per layout; the sum may still psum)
            later = (parent, after & ~(1 << j), {}) if top and k == 0 else None
            last = top and after == parent.full  # the sum ends the program: its exit is the output
            fixed = k == 0 and bool(terms) and self.fixed(entry, [ctx] + terms)
            forked = None
            if k == 0 and not loose and terms and (not last or goal is Goal.any()):
                back = self.exit_goal(entry)
                leaving = [self.departing(term, entry) for term in terms]
                # where no mesh axis can come or go, the terms' moves to the exit (`regrouping`): the later
                # terms' least cost to an exit `d` moves from the entry, for d = 1, 2, ...
                moves = None
                if fixed:
                    prices = [self.move_price(term, 0, min(self.mesh_used)) for term in terms]
                    apart = [sum(max(least, d * price) for least, price in zip(leaving, prices))
                             for d in range(1, len(self.mesh_used) + 1)]
                    if later is not None:  # and the program on from an exit `d` moves away: at least the
                        # chain's later operators from the mesh axes in use (`later`), or `tails` where more
                        floor = self.later(parent, after & ~(1 << j), entry, goal)
                        tails = self.tails(parent, after, entry, goal)
                        apart = [others + max((floor, *tails[d - 1:d])) for d, others in enumerate(apart, 1)]
                    moves = (entry, tuple(apart))
                # ending where it started, the program goes on from the entry layout (a padded one unpads there):
                # this operator's rest, and the chain's on from there (`chain_line`) where that is more
                staying = sum(max(self.line(term, 0, entry, back), self.term_bound(term, entry, None)) for term in terms)
                from_entry = ((self.segment_line(parent, after, entry, goal), self.chain_line(parent, after, entry, goal))
                              if top else (0.0, 0.0))
                place = self.placement(entry, None)
                whole = not any(n % split for n, split in zip(ctx.sizes(0), place.splits))  # an unpadded entry
                forked = (back, staying, from_entry, sum(leaving), moves, whole, tuple(terms))
            # (not where `regrouping` counts the moves after the sum: `tails`)
            unpads = self.unpads(parent, after, j) if top and k == 0 and not padded and not fixed else None
            found = self._frame_bounds[fr, goal, loose, padded] = (rest, later, ends if k > 0 else None,
                                                                   last, forked, unpads)
        rest, later, ends, last, forked, unpads = found
        frame = fr.value[-1]
        closing = last and bool(popped)
        if closing and frame[5] in popped:
            return math.inf  # a later term bound for an end popped already (see `popped`)
        if later is not None:
            parent, before, known = later
            later = known.get(lay)
            if later is None:
                later = known[lay] = self.later(parent, before, lay, goal)
            rest += later
        ends = goal if last and ends is None else ends  # the first term of a sum that ends the program
        # in a sum's first term at the top, a padded axis loses its split in this term or after the sum, which
        # nothing else here counts (but the program on from a padded entry, and `tails`: not with them)
        memo = (ends, unpads)
        unpadded = None if lines is None else lines.get(memo)
        if unpadded is None:
            unpadded = self.term_line(ctx, done, lay, ends, unpads)
            if lines is not None:
                lines[memo] = unpadded
        if forked is not None:
            # the sum ends where it started, or every later term leaves that layout
            back, staying, (own, chained), leaving, moves, whole, terms = forked
            later = later or 0.0
            staying += max(own + later, chained)
            stay = unpadded
            if not whole and unpads is not None:  # the program on from the padded entry counts its unpadding
                if not fork:
                    return unpadded + rest
                stay = self.term_line(ctx, done, lay, ends, None)
            entry_popped = closing and frame[4] in popped  # the sum ending where it started: an end popped
            if entry_popped:  # so the sum's exit is no end popped: each later term ends elsewhere
                leaving = max(leaving, sum(self.departing(term, frame[4], popped) for term in terms))
            leaving += unpadded + later
            if fork and moves is not None:
                stay, leaving = self.regrouping(ctx, done, lay, unpadded, stay, leaving, *moves)
            if entry_popped:
                return max(unpadded + rest, leaving)
            if leaving > stay + staying:  # else nothing back to the entry can lower the lesser case
                stay = max(stay, self.shuttling_to(ctx, done, lay, back))
                if fork and leaving > stay + staying:
                    stay = max(stay, self.arriving(ctx, done, lay, back, stay))
                # the line back (a one-layer 4-D FNO: 5.9 k states to 3.4 k); where weights are pinned
                # it raises the bound at few states (12 % in dfno's chain at batch 4), and costs more time
                if fork and leaving > stay + staying and not self.pinned:
                    stay = max(stay, self.line(ctx, done, lay, back))
            return max(unpadded + rest, min(stay + staying, leaving))
        return unpadded + rest

    def term_line(self, ctx: Context, done: int, lay: Interned, ends: Goal | None, unpads: float | None) -> float:
        """`line`, `parking` or `shuttling` on a sum's term (and `shuttling_to` its known
        end, if any), whichever is more."""
        found = max(self.line(ctx, done, lay, ends, unpads=unpads), self.parking(ctx, done, lay, unpads),
                    self.shuttling(ctx, done, lay, unpads))
        if ends is not None and ends is not Goal.any():
            found = max(found, self.shuttling_to(ctx, done, lay, ends))
        return found

    def unpads(self, parent: Context, after: int, j: int) -> float | None:
        """For the first term of the sum `j` of `parent` (a program, or a chain), where the
        search ends unpadded: the least bytes of the tensor after the sum, where each step
        of its operator after it keeps every size and none can drop a mesh axis (no
        `psum`, no dense `Matrix`): a padded axis of the term then loses its split by moves,
        in the term or after the sum, before the operator ends (or its barrier runs)
        unpadded, see `bound`; None elsewhere (memoised)."""
        key = (parent, after, j)
        if key not in self._unpads:
            segment = next(seg for seg in parent.segments if seg >> j & 1)
            rest = segment & ~after
            keeps = (not (parent.psum_steps | parent.dense) & rest
                     and all(parent.steps[i].in_sizes == parent.steps[i].out_sizes for i in bits(rest)))
            self._unpads[key] = parent.least_bytes(after) if keeps else None
        return self._unpads[key]

    def term_bound(self, term: Context, entry: Interned, ends: Goal | None) -> float:
        """A lower bound on a sum's term from the sum's entry layout to its exit (`ends`;
        None: not known yet): `line`, or the least cost of the term alone, a search of its
        own (memoised, by `term_class`; it counts what `line` does not, such as halo
        exchanges). To any exit, that search is the one of the term's departures from
        the entry (`departures`): the first end it pops, wherever, is the least."""
        key = (term, entry, ends)
        found = self._term_bounds.get(key)
        if found is None:
            def search() -> float:
                if ends is None:
                    return max(self.line(term, 0, entry, None), self.departures(term, entry).least_end())
                least = 0.0
                try:
                    for cost, state, _, _ in self.term_search().explore(term, [entry.value], ends, padded=True):
                        if state is not None:
                            least = cost[0]
                            break
                except PlanningError:
                    pass
                return max(self.line(term, 0, entry, ends), least)

            found = self._term_bounds[key] = self.shared("bound", term, entry, ends, search)
        return found

    def term_search(self) -> "Search":
        """The search every term's bound runs (they share its tables)."""
        if self._term_search is None:
            self._term_search = self.sub(self.pinned)
        return self._term_search

    def shared(self, kind: str, term: Context, entry: Interned, ends: Goal | None,
               search: Callable[[], float]) -> float:
        """A bound of `kind` on `term` (`search()`), computed once per `term_class` for the
        searches of one plan."""
        key = self.term_class(kind, term, entry, ends)
        found = self.tables.terms.get(key)
        if found is None:
            found = self.tables.terms[key] = search()
        return found

    def term_class(self, kind: str, term: Context, entry: Interned, ends: Goal | None) -> tuple:
        """The key under which a bound of `kind` on `term` from the sum's `entry` layout to
        `ends` (an exact layout, or None: anywhere) is shared by the searches of one plan
        (`Tables.terms`): the term's structure (which weights are pinned, not their
        names), where its pins split its weights, and the pair of layouts, each up to the
        symmetries of `canonical` (mesh axes of equal size renamed, the term's own
        `automorphisms`). A term costs the same from layout `L` to `X`, its weights
        pinned at `P`, as from `g(L)` to `g(X)` pinned at `g(P)`; so the skip `Matrix` and
        local convolution of a layer are searched once per class of hand-over layouts,
        and alike layers share them (the 8³ `local_kernel` chain pinned at batch 8: 907
        such searches -> 163)."""
        found = self._term_shapes.get(id(term.prog))
        if found is None:
            prog, pins = term.prog, self.pins(term.prog)
            pinned = {name: True for name, _ in pins}
            found = self._term_shapes[id(prog)] = (prog, structure(prog, term.itemsize(0), pinned),
                                                   automorphisms(prog), pins)
        _, alike, autos, pins = found
        if ends is not None and not ends.exact:  # a goal that is not one layout: not mapped, so not shared
            return kind, alike, pins, entry.value, ends
        lay, symmetries, moved = self.classes(entry, pins, autos)
        exit_ = None if ends is None else min(move(ends.prefixes, names, perm) for names, perm, _ in symmetries)
        return kind, alike, tuple(spec for _, spec in moved), lay, exit_

    def chain_line(self, ctx: Context, done: int, lay: Interned, goal: Goal) -> float:
        """`segment_line` plus `later`, or, before a chain's last operator and where that is
        more, `line` on the rest of the chain: it sees the layout, and so the moves the
        later operators make to the goal from it (`later` bounds each from the best layout
        of the mesh axes in use)."""
        found = self.segment_line(ctx, done, lay, goal) + self.later(ctx, done, lay, goal)
        if ctx.segment(done) < len(ctx.segments) - 1:
            found = max(found, self.line(ctx, done, lay, goal))
        return found

    def segment_line(self, ctx: Context, done: int, lay: Interned, goal: Goal) -> float:
        """`line` for the operator of a chain that runs now (with the goal if it is the last)."""
        i = ctx.segment(done)
        return self.line(ctx, done, lay, goal if i == len(ctx.segments) - 1 else None, ctx.segments[i])

    def later(self, ctx: Context, done: int, lay: Interned, goal: Goal) -> float:
        """A lower bound on the chain's operators after the one that runs now: each costs
        at least what it costs from the best entry layout with the mesh axes used now
        (`entry_bound`), where no mesh axis can come or go before it (every mesh axis is
        in use, and no step before it can sum one away)."""
        i = ctx.segment(done)
        if i == len(ctx.segments) - 1:
            return 0.0
        key = (ctx, i, ctx.psum_steps & ~done, lay, goal)
        total = self._later.get(key)
        if total is None:
            total = 0.0
            used = frozenset(n for axes in lay.value for n in axes)
            if not any(size > 1 and name not in used for name, size in self.mesh):
                for j in range(i + 1, len(ctx.segments)):
                    if ctx.psum_steps & ctx.before(j) & ~done:
                        break
                    total += self.entry_bound(ctx, j, used, goal if j == len(ctx.segments) - 1 else Goal.any())
            self._later[key] = total
        return total

    def tails(self, ctx: Context, done: int, entry: Interned, goal: Goal) -> tuple[float, ...]:
        """Per `d` = 1, 2, ...: a lower bound on the program on from a sum's exit `d`
        moves (`regrouping`) from the sum's `entry` layout, where no mesh axis can come or
        go (`fixed`): the least `chain_line` from `(done, X)` over every layout `X` of the
        entry's mesh axes that far from it (memoised; () where the program's rest does not
        depend on the layout: no operator after this one, and no goal). A network's layer
        that ends elsewhere than it started: its projection pays the moves to the
        output's layout from there (the 8³ one-layer chain planned again at batch 8,
        searched whole: 10.2 k states to 4.4 k)."""
        key = (ctx, done, entry, goal)
        found = self._tails.get(key)
        if found is None:
            names = tuple(sorted(m for axes in entry.value for m in axes))  # a set: its order places nothing
            onward, pairs = self.onward(ctx, done, names, goal), self.adjacencies(entry)
            least = [math.inf] * len(names) if onward else []
            for adjacent, cost in onward:
                d = len(adjacent - pairs)
                if d and cost < least[d - 1]:
                    least[d - 1] = cost
            found = self._tails[key] = tuple(least)
        return found

    def onward(self, ctx: Context, done: int, names: tuple[str, ...], goal: Goal) -> tuple:
        """`(adjacencies, chain_line)` from `(done, X)` for every layout `X` that places the
        mesh axes `names` on the tensor's axes in any order, evenly or not (a superset of
        those the search reaches: the least over them is a lower bound); () where the
        program's rest does not depend on the layout, or where there are more than
        `PLACEMENTS` of them (memoised)."""
        key = (ctx, done, names, goal)
        found = self._onward.get(key)
        if found is None:
            rank, count = len(ctx.shape), math.prod(range(len(ctx.shape), len(ctx.shape) + len(names)))
            found = ()
            if (ctx.segment(done) < len(ctx.segments) - 1 or goal.prefixes is not None) and count <= PLACEMENTS:
                found = tuple((self.adjacencies(lay), self.chain_line(ctx, done, lay, goal))
                              for lay in map(self.intern, _placements(rank, names)))
            self._onward[key] = found
        return found

    def entry_bound(self, ctx: Context, j: int, used: frozenset, goal: Goal) -> float:
        """The least cost of the chain's operator `j` alone, from any unpadded layout that
        splits its input over exactly the mesh axes `used`, to a layout `goal` accepts
        (memoised, also by the operator's structure: a network's identical layers share
        it; a search of its own, with every such layout an entry).

        It runs in the search the chain's searches of the operator's exits run in (its pins
        renamed alike), sharing their memo of states. Where every weight of the operator
        is pinned (a network planned again at another batch size) it also searches the
        operator as they do (`after`, no move to an unpadded layout before its first step,
        for every operator but the first; `before`), so that they start with what it
        learned (`explore`'s adaptive bound): the hard scan's 4-D 32 × 8 × 8 × 16 chain
        pinned at batch 6, 4,605 states to 3,595. The least is the same as without that
        rule wherever the bound is used (every mesh axis in use, so no split comes first):
        a route that first moves to another even layout costs no less than its rest from
        there, another entry. Where a weight is free, not: the bounds it learned change
        which of equally cheap routes the exits' searches find first, and so where the
        plan puts the weight among equally cheap placements, which the other batch sizes
        are pinned to and pay for (the table's 4-D `local_kernel` chain planned again at
        batch 2 would cost 0.2 % more a layer).

        For an operator unlike every other of the chain (`alone`: a network's single
        layer), the search stops after `ALONE_STATES` states, at the least key still open
        (a lower bound, see `_least_end`): its bound serves only the operators before it
        (in a network, the lifting), and there a weaker one costs less than the whole
        search. The chain then searches the operator from the few layouts they hand over
        in, searches the whole one would have run as part of its own (a 4-D layer with
        three grid axes split: 64 k states to 10.7 k, the same plan). An operator that
        repeats keeps the whole search: each of its kind after the first needs it."""
        key = (ctx, j, used, goal)
        if key not in self._entry_bounds:
            before = ctx.before(j)
            prog = self.operator(ctx, j)
            alike = (structure(prog, ctx.itemsize(before), self.pinned), used, goal)
            if alike not in self._entry_bounds:
                states = ALONE_STATES if self.alone(ctx, j) else math.inf
                entries = layouts(ctx.sizes(before), [(n, s) for n, s in self.mesh if n in used])
                pins = self.pins(prog)
                if goal is Goal.any() and entries:
                    # layouts alike up to swapping mesh axes of equal size (and the pins with them) cost
                    # alike: one of each, with the pins where the swap takes them (the same swap for all)
                    autos = automorphisms(prog)
                    canon = [self.canonical(self.intern(e), pins, autos) for e in entries]
                    entries, pins = list(dict.fromkeys(c[0].value for c in canon)), canon[0][2]
                search = self.renamed(pins)  # (the search the chain's searches of the operator run in)
                root = search.context(prog, prog.shape, ctx.itemsize(before))
                rules = (j > 0, j < len(ctx.segments) - 1) if search.pins_every_weight(prog) else ()
                ends = search.explore(root, entries, goal, *rules)
                self._entry_bounds[alike] = _least_end(ends, states)
            self._entry_bounds[key] = self._entry_bounds[alike]
        return self._entry_bounds[key]

    def alone(self, ctx: Context, j: int) -> bool:
        """Whether the chain's operator `j` is unlike its every other operator, whatever
        their weights' pins (memoised per chain)."""
        found = self._alone.get(ctx)
        if found is None:
            kinds = [structure(self.operator(ctx, i), ctx.itemsize(ctx.before(i)), {})
                     for i in range(len(ctx.segments))]
            found = self._alone[ctx] = tuple(kinds.count(kind) == 1 for kind in kinds)
        return found[j]

    def rest(self, root: Context, i: int, lay: Interned, goal: Goal) -> float:
        """A lower bound on the chain's operators from operator `i` on, from `lay`: each
        costs at least its least cost from any layout over the mesh axes `lay` uses
        (`entry_bound`), where no mesh axis can come or go before it (every mesh axis
        is in use, and no operator before it can sum one away); or, where that is more,
        those before the third last operator so and the last three together (`boundary`:
        a network's last layer and its projection)."""
        key = (root, i, lay, goal)
        total = self._rests.get(key)
        if total is None:
            n = len(root.segments)
            used = frozenset(m for axes in lay.value for m in axes)
            total = before = 0.0  # before: the operators from i to j - 1, each alone
            if not any(size > 1 and name not in used for name, size in self.mesh):
                for j in range(i, n):
                    if j > i and root.psum_steps & root.segments[j - 1]:
                        break
                    if j == n - 3:
                        total = max(total, before + self.boundary(root, j, used, goal))
                    before += self.entry_bound(root, j, used, goal if j == n - 1 else Goal.any())
            total = self._rests[key] = max(total, before)
        return total

    def boundary(self, root: Context, j: int, used: frozenset, goal: Goal) -> float:
        """A lower bound on the chain's operators from `j` on, together, from any layout
        over the mesh axes `used`, where the goal wants a layout and operator `j` cannot
        sum a mesh axis away (0 elsewhere; memoised): their least cost, found backwards
        (`backwards`), or, where that search does not finish, the larger of what it
        reached and the lesser of

        - `j` ending in a layout `goal` accepts: its least cost from any layout to one,
          plus the least cost of the operators after it from one to the goal;
        - `j` ending elsewhere: its least cost from any layout (`entry_bound`), plus the
          least cost of the operators after it from any layout `goal` does not accept.

        Each is a search of its own from every such layout, stopped after
        `BOUNDARY_STATES` states at the least key still open (a lower bound, see
        `_least_end`). Whatever the route, its hand-over after `j` is one or the other
        (all of them unpadded, over the mesh axes `used`: none can come or go), and each
        part costs at least its least. It counts what the entry bounds alone cannot: the
        cheapest layer of a network ends far from the layout its output must have, and
        the projection after it, cheap from where the goal wants it, pays the moves back
        (or the layer pays them). A 3-D network of 8 layers: 32 k states to 14 k, the
        same plan.
        """
        if goal is Goal.any() or root.psum_steps & root.segments[j]:
            return 0.0
        key = (root, j, used, goal)
        found = self._boundaries.get(key)
        if found is None:
            n = len(root.segments)

            def operators(first: int, last: int) -> tuple[Program, list, int]:
                """Operators `first` to `last` as one program, the layouts over `used` of its
                input, and its itemsize."""
                sizes = root.sizes(root.before(first))
                return (root.prog.segment(first, sizes, last),
                        layouts(sizes, [(m, size) for m, size in self.mesh if m in used]),
                        root.itemsize(root.before(first)))

            def least(prog: Program, entries: list, itemsize: int, enough: float = math.inf) -> float:
                """The least cost of `prog` from any of `entries` to a layout `goal` accepts (a
                lower bound on it once that is `enough`)."""
                search = self.sub(self.pinned)
                return _least_end(search.explore(search.context(prog, prog.shape, itemsize), entries, goal),
                                  BOUNDARY_STATES, enough=enough)

            least_all, whole = self.backwards(root, j, used, goal)
            if whole is None:
                tail, entries, itemsize = operators(j + 1, n - 1)
                later = least(tail, [e for e in entries if goal.accepts(e)], itemsize)
                apart = least(tail, [e for e in entries if not goal.accepts(e)], itemsize)
                least_j = self.entry_bound(root, j, used, Goal.any())
                outside = least_j + apart
                # `j` costs at least `least_j` to wherever it ends; its search to the goal's layouts stops
                # once that case can no longer be the lesser
                inside = later + max(least_j, least(*operators(j, j), outside - later) if later < math.inf else math.inf)
                least_all = max(least_all, min(inside, outside))
            found = self._boundaries[key] = least_all
        return found

    def backwards(self, root: Context, j: int, used: frozenset, goal: Goal) -> tuple[float, Cost | None]:
        """`boundary` found backwards: `(least, cost)`, the least time of the adjoint of the
        chain's operators from `j` on (`transposed`), from the layouts `goal` accepts to
        any over the mesh axes `used`, and its whole least cost where the search got to
        its first end (else None, and `least` the least key still open after
        `BACKWARD_STATES` states: a lower bound). `(0, None)` where the costs are not alike
        both ways: not trained, or a mesh axis free.

        Trained, with every mesh axis in use, the cheapest route of a program from `X` to
        `Y` costs what the cheapest route of its adjoint costs from `Y` to `X`, wherever
        `prices_alike_backwards` holds: each action's transpose is an action on the same
        tensor in the same layout, with its forward and backward collectives swapped. So
        the least over every pair (a network's last layer from any layout, its projection
        on to the output's layout) is one search from the output's few layouts, with the
        operators' least costs from any layout (`entry_bound`, alike both ways) as its
        look-ahead, where the two parts of `boundary` search from every layout on each
        side of the hand-over and still miss what the pair costs together. The 32³ × 8
        chain pinned at batch 8: 25.9 M from the parts, 30.0 M here (489 states); the
        small 2-D network of the random probe: 17.8 M and 21.0 M (4.9 k states). The
        search is kept, to be searched on for the least cost from one layout
        (`last_from`)."""
        if not self.cost.training or any(size > 1 and name not in used for name, size in self.mesh):
            return 0.0, None
        n = len(root.segments)
        prog = root.prog.segment(j, root.sizes(root.before(j)), n - 1)
        if not prices_alike_backwards(prog, self.shard_weights):
            return 0.0, None
        back = transposed(prog)
        starts = [lay for lay in layouts(back.shape, [(m, size) for m, size in self.mesh if m in used])
                  if goal.accepts(lay)]
        search = self.sub(self.pinned)
        ctx = search.context(back, back.shape, root.itemsize(root.full))
        for k in range(1, n - j):  # the adjoint's operator k is operator n - 1 - k
            search.knows_entry_bound(ctx, k, used, self.entry_bound(root, n - 1 - k, used, Goal.any()))
        ends = self._backward_ends[(root, j, used, goal)] = AdjointEnds(
            search.explore(ctx, starts, Goal.any(), before=True))
        while ends.first is None and ends.step():
            pass
        if ends.failed:
            return 0.0, None
        return (ends.least, None) if ends.first is None else (ends.first[0], ends.first)

    def last_from(self, root: Context, j: int, lay: Interned, goal: Goal, need: float = -math.inf) -> Cost | None:
        """A lower bound on the chain's operators from `j` on, from `lay` itself, in the
        cost's order (its time, its bytes where the time is the same, ...), where
        `backwards` found their least cost from any layout (else None): their whole least
        cost from `lay` where its search has reached `lay` (stepped on until it does, or
        until what it has left open costs `need` or more), else the larger of that least
        cost from any layout and the least time left open (with no bytes: added to a cost
        so far, a bound on the whole cost).

        The adjoint's search pops its ends, the layouts the operators start in, in the
        order of their least cost (each end searched on from too: a route may pass one and
        move on), so one search serves every layout a network's last layer starts in,
        where the layer's exits are searched from each: the seed-0 scan's 16 × 8 × 32 × 32
        chain of 4 layers, 6,942 states to 3,519."""
        used = frozenset(m for axes in lay.value for m in axes)
        self.boundary(root, j, used, goal)  # (memoised) runs `backwards`
        ends = self._backward_ends.get((root, j, used, goal))
        if ends is None or ends.first is None:
            return None
        while lay.value not in ends.found and ends.least < need and ends.step():
            pass
        found = ends.found.get(lay.value)
        return found if found is not None else max(ends.first, (ends.least, 0.0, 0, 0.0))

    def knows_entry_bound(self, ctx: Context, j: int, used: frozenset, least: float) -> None:
        """Sets `entry_bound(ctx, j, used, Goal.any())` to `least` (found otherwise)."""
        self._entry_bounds[(ctx, j, used, Goal.any())] = least

    def leaving(self, ctx: Context, lay: Interned, after: bool = False) -> tuple[float, float, float]:
        """`(staying, moved, apart)` for an operator that is one sum and nothing else (a
        network's layer) from `lay` (see `Exits`): `staying`, a lower bound on its cost
        to the exit `lay` itself; to another exit, `moved`, the least price of a move from
        the end state in `lay`, and `apart`, a lower bound on the routes that do not pass
        through that state.

        Why each is a lower bound. A route that moves before the sum pays at least the
        least price of a move from `lay` (`apart` is at most that): where the operator
        follows another in a chain (`after`, see `Search.explore`), of a move to a padded
        layout, since the earlier operator makes every other (no cap where there is none;
        in the 16 × 32 × 32 × 8 chain at batch 32, `apart` rises from 6.3 M to 10.9 -
        19.1 M where the lifting's exits start a layer). Otherwise the sum runs every term
        from `lay` to the sum's exit layout. To the exit `lay` each term then costs at
        least its `line` back to `lay` (`staying`). To another exit, a route either
        passes through the end state in `lay` and moves on from it (`moved`), or the sum
        exits elsewhere: each term then costs at least its least cost from `lay`
        to an end other than `lay` (moves after its steps included, padded ends
        allowed), and `apart` adds these up: for the term with the fewest steps (a
        weight's term: mostly moves of the whole tensor) a search of its own, stopped
        after `LEAVING_STATES` states at the least key still open (no end not popped
        costs less), `line` for the others; or, where more, by what the exit keeps of
        `lay` (`keeping`)."""
        terms = [self.context(t, ctx.sizes(0), ctx.itemsize(0), True) for t in ctx.steps[0].terms]
        searched = min(terms, key=lambda t: len(t.steps))
        least = [self.departing(t, lay) if t is searched else self.line(t, 0, lay, None) for t in terms]
        apart = max(sum(least), self.keeping(lay, terms, least))
        staying = sum(self.line(t, 0, lay, self.exit_goal(lay)) for t in terms)
        return staying, self.least_move(ctx, ctx.full, lay), min(apart, self.least_move(ctx, 0, lay, padded=after))

    def keeping(self, lay: Interned, terms: list, least: list[float]) -> float:
        """A lower bound on a sum's `terms` (contexts), each run from `lay` to one exit
        `X` other than `lay`, each at least its `least`: the least over what `X` can keep
        of `lay`.

        `X` keeps some of `lay`'s pairs (`adjacencies`: each mesh axis with what comes
        right before it), a set `S`, and starts each tensor axis with the mesh axes
        those pairs chain there (`kept_goal`), so each term costs at least its `line`
        to that goal. Where no mesh axis can come or go (`keeps_mesh_axes`), `X` differs
        from `lay` in the pairs of the mesh axes outside `S`, and every move makes at
        most one new pair, moving its mesh axis (see `regrouping`): each term then makes
        a move per such mesh axis, one that moves that axis, at least an `all_to_all`
        of its tensor at its least bytes over that axis's devices. (Elsewhere `X` may
        also keep every pair and gain a mesh axis.) In the 16 × 32 × 32 × 8 chain at
        batch 32, a layer from the input's layout (each grid axis split) ends elsewhere
        at no less than 25.2 M, where the terms' least said 19.1 M: the spectral term
        must bring back the splits `X` keeps after its inverse DFTs, and the skip
        `Matrix` must move the ones `X` does not keep, at the whole tensor's bytes."""
        pairs = tuple(self.adjacencies(lay))
        if not pairs:
            return 0.0
        closed = self.keeps_mesh_axes(lay, terms)
        best = math.inf
        for count in range(len(pairs) + (0 if closed else 1)):
            for kept in itertools.combinations(pairs, count):
                goal = self.kept_goal(lay, frozenset(kept))
                moved = [self.mesh_sizes[m] for _, m in set(pairs) - set(kept)] if closed else []
                best = min(best, sum(max(low, self.line(t, 0, lay, goal),
                                         sum(self.all_to_all_price(t.least_bytes(0), size) for size in moved))
                                     for t, low in zip(terms, least)))
        return best

    def kept_goal(self, lay: Interned, kept: frozenset) -> Goal:
        """The goal of the layouts that have the pairs `kept` of `lay` (`adjacencies`):
        each tensor axis starts with the mesh axes those pairs chain on it (memoised)."""
        key = (lay, kept)
        found = self._kept_goals.get(key)
        if found is None:
            prefixes = []
            for a, axes in enumerate(lay.value):
                chained, before = [], a
                for m in axes:
                    if (before, m) not in kept:
                        break
                    chained.append(m)
                    before = m
                prefixes.append(tuple(chained))
            found = self._kept_goals[key] = Goal(prefixes=tuple(prefixes))
        return found

    def departing(self, term: Context, lay: Interned, popped: set | frozenset = frozenset()) -> float:
        """A lower bound on a sum's term from the sum's entry layout `lay` to an end in
        another layout (moves after its steps included, padded ends allowed): its `line`,
        or a search of its own (`Departures`), stopped after `LEAVING_STATES` states at the
        least key still open (no end not popped costs less) (memoised, by `term_class`).
        With `popped` (`bound`'s), to an end in none of those layouts either: the same
        search, stepped on as far as needed."""
        key = (term, lay)
        found = self._departing.get(key)
        if found is None:
            found = self._departing[key] = self.shared(
                "departing", term, lay, None,
                lambda: max(self.departures(term, lay).beyond(), self.line(term, 0, lay, None)))
        return max(found, self.departures(term, lay).beyond(popped)) if popped else found

    def departures(self, term: Context, lay: Interned) -> Departures:
        """The search of a sum's term from the sum's entry layout `lay` to every end (moves
        after its steps included, padded ends allowed), stepped on as asked (kept per
        layout by this search)."""
        found = self._departures.get((term, lay))
        if found is None:
            ends = self.term_search().explore(term, [lay.value], Goal.any(), before=True, padded=True)
            found = self._departures[(term, lay)] = Departures(ends, lay)
        return found

    def least_move(self, ctx: Context, done: int, lay: Interned, padded: bool = False) -> float:
        """The least price of a move (an `AllToAll` or a `Split`) from `(done, lay)`
        (`padded`: of a move to a padded layout; `math.inf` where there is none)."""
        here = self.node(ctx, done, lay).here
        return min((price[0] for _, _, price, _, frees in self.step_moves((here.sizes, here.itemsize, lay), None, here)
                    if not (padded and frees)), default=math.inf)

    def parking(self, ctx: Context, done: int, lay: Interned, unpads: float | None = None) -> float:
        """A lower bound on the collectives still to come on one line of data (a term of
        a sum), from where its mesh axes must be parked (memoised; 0 unless no step can
        sum a split away or gather one, and none is a sum; `math.inf` where the mesh axes
        in use fit on no tensor axes when a pending step runs: then no route ends, and the
        search stops once only such states are left).

        Every mesh axis in use now stays in use (only a `psum` or a dense `Matrix`'s
        gather could drop one), and a move (an `all_to_all`) takes mesh axes from one
        tensor axis (its source) to one other (its target). When a pending step `j` runs,
        each mesh axis in use sits on some tensor axis, its *holder* there: not one that
        `j` needs whole, and each holding a split into fewer than twice its size then
        (`Context.rooms`). Whatever the holders, the route makes (`_fewest_moves`):

        - *before `j`*: a move with source `a` for each tensor axis `a` that loses a mesh
          axis (it holds one now, and `j` finds it elsewhere, or a step before `j` needs
          `a` whole), and a move with target `b` for each tensor axis `b` that gains one
          (`j` finds there a mesh axis that is elsewhere now, or one at all where a step
          before `j` needs `b` whole). One move has one source and one target, so at
          least as many moves as such sources, and as such targets;
        - *after `j`*: a move with source `b` for each holder `b` that a later step needs
          whole.

        A move has one source and one other target: a tensor axis that is the only source
        and the only target takes two. And mesh axes that no one tensor axis can take
        together are parted (`Context.spread_before`, `spread_after`): those on a tensor
        axis `a` that a step before `j` needs whole sit, when it runs, on `n` other axes,
        each the target of the last move that brought one of them there: `n` moves before
        `j`, and one more if `a` holds a mesh axis again at `j`; those on a holder that a
        later step needs whole, `n` moves after `j` the same way. (A 4-D layer whose
        mesh axes of 2 and 8 share its largest grid axis: they leave it for its DFT by two
        moves, and the one of 8 comes back for the spectral weight; the hard scan's
        slowest chain 55 k states to 30 k.)

        The moves before `j` and after it are different moves; each is priced at its
        least (`line`'s price of a departure). The bound is the largest over the pending
        steps of

        - where the mesh axes are crowded (`Context.crowded`), or at a step with a
          pointwise weight: the fewest over every way to place the mesh axes in use (a
          few tensor axes, a few mesh axes: a small search). A 4-D FNO layer whose three
          split grid axes must make room for its mode-sized axes: two moves more than the
          axes forced alone counted, each way (a 4-D chain of 4 layers: 145 k states to
          26 k). At an FNO layer's spectral mixing every grid axis has gone through its
          DFT and waits for its inverse one: a mesh axis moved off a grid axis for the
          DFT must park on another grid axis, and move again, unless the batch axis has
          room (a 4-D layer on mesh axes of 2, 4 and 2: three moves, where the departures
          counted two; the hard scan 384 k states to 302 k, the seed-0 scan 97 k to 52 k).
          When training, a pointwise weight's gradient is all-reduced where a mesh axis in
          use sits off the tensor axes it runs along, and gathered where one of those is
          split unevenly (`StepAction.weight_gradient`): a collective that is no move. So
          such a step counts the lesser of the fewest moves plus one latency, and the
          fewest moves over the placements that split its weight evenly (`_fewest_moves`,
          `exact`). A 4-D layer whose mesh axis of 8 no mode axis can take: its weight
          costs a collective whatever the route (the hard scan's slowest chain, 24.9 k
          states to 10.0 k);
        - at a step whose pointwise weight is pinned (a network planned again at another
          batch size), crowded or not: the count for the placement its pin gives the
          mesh axes it names (those in use; the others not counted). An FNO layer must
          take its mesh axes to its spectral weight's, and give them up again for the
          inverse DFTs (the 4-D `local_kernel` chain pinned at batch 2: 6.9 k states to
          4.4 k).

        `unpads` (see `bound`): a tensor axis that no mesh axis in use splits evenly at the
        term's end is also one that a step after each `j` needs whole (the program ends
        unpadded), and the moves are priced at the least of `unpads` too (they may come
        after the sum). A batch axis of 7 that holds a mesh axis of 8 at the spectral
        weight gives it up again."""
        if not self.parks(ctx):
            return 0.0
        key = (ctx, done, lay, unpads)
        found = self._parking.get(key)
        if found is not None:
            return found
        pending = ~done
        # (size, tensor axis, name) of each mesh axis in use, the largest first (the most constrained)
        named = sorted(((self.mesh_sizes[m], a, m) for a, axes in enumerate(lay.value) for m in axes
                        if self.mesh_sizes[m] > 1), reverse=True)
        placed = tuple((size, a) for size, a, _ in named)
        # the count sees where each mesh axis is, not their order on a tensor axis, nor their names but
        # for the pins': layouts alike so share it (a third to a half of the counts of the large-batch
        # chains)
        alike = (ctx, done, tuple(named) if self.pinned_splits(ctx) else placed, unpads)
        found = self._parking.get(alike)
        if found is not None:
            self._parking[key] = found
            return found
        sizes = tuple(size for size, _, _ in named)
        on = [tuple(sorted(self.mesh_sizes[m] for m in axes if self.mesh_sizes[m] > 1)) for axes in lay.value]
        ending = 0 if unpads is None else self.uneven_end(ctx, sizes)

        def around(j: int) -> tuple:  # the tensor axes a pending step before `j` needs whole, and after; spreads
            before = ctx.axes(ctx.ancestors[j] & pending)[0]
            spread = tuple((a, n) for a in bits(before) if on[a]
                           for n in [ctx.spread_before(done, j, a, on[a])] if n > 1)
            return before, ctx.axes(ctx.descendants[j] & pending)[0] | ending, spread, ctx.spread_after(done, j, sizes)

        found = 0.0
        if placed:
            # with `unpads`, an axis whole only for the end may give up its mesh axes after the sum
            price = self.move_price(ctx, done, placed[-1][0], unpads)
            latency = self.cost.latency_bytes if self.cost.training else 0.0
            weighted = {j: rooms for j, _, rooms in ctx.pointwise}
            for j in weighted.keys() | set(ctx.crowded(sizes)):
                if pending >> j & 1:
                    fewest = _fewest_moves(placed, ctx.rooms(done, j), *around(j))
                    if fewest == math.inf:  # the mesh axes in use fit nowhere while `j` runs: no route ends
                        self._parking[key] = self._parking[alike] = math.inf
                        return math.inf
                    here = fewest * price
                    if j in weighted and latency:  # its weight's gradient collective, where it is not even
                        here = min(here + latency, _fewest_moves(placed, weighted[j], *around(j), exact=True) * price)
                    found = max(found, here)
            pins = [(j, splits) for j, splits in self.pinned_splits(ctx) if pending >> j & 1]
            where = {m: (a, i) for i, (_, a, m) in enumerate(named)} if pins else {}
            for j, splits in pins:
                holders = tuple((where[m][0], b, where[m][1]) for b, names, _, _ in splits for m in names if m in where)
                found = max(found, _moves(placed, holders, *around(j)) * price)
        self._parking[key] = self._parking[alike] = found
        return found

    def uneven_end(self, ctx: Context, sizes: tuple[int, ...]) -> int:
        """The tensor axes (a bit mask) that no mesh axis of `sizes` splits evenly at the
        end of `ctx`: whole there, where it must end unpadded (memoised)."""
        key = (ctx, frozenset(sizes))
        found = self._uneven_ends.get(key)
        if found is None:
            found = self._uneven_ends[key] = sum(1 << b for b, n in enumerate(ctx.sizes(ctx.full))
                                                 if all(n % size for size in key[1]))
        return found

    def parks(self, ctx: Context) -> bool:
        """Whether `parking` and `shuttling` may find anything in `ctx`: no step can sum a
        split away or gather one, none is a sum, and one is crowded even with every mesh axis
        in use, or weighted (memoised)."""
        found = self._parks.get(ctx)
        if found is None:
            found = self._parks[ctx] = (not (ctx.psum_steps | ctx.dense | ctx.sums)
                                        and bool(ctx.crowded(self.mesh_used) or ctx.pointwise))
        return found

    def shuttling(self, ctx: Context, done: int, lay: Interned, unpads: float | None = None) -> float:
        """A lower bound on the moves still to come in a sum's term, from `(done, lay)`: the
        fewest of a relaxed problem (`Shuttles`: the mesh axes in use move between tensor
        axes, steps run where they fit, a weight's step where its pin puts them), each at
        its least price (memoised; 0 where `parking` finds nothing, none being crowded nor
        weighted, or where the placements are too many). With `unpads` (see `bound`) the
        term ends unpadded, and a move may come after the sum. A 3-D FNO layer whose three
        grid axes each hold a mesh axis: each must be whole for its DFT and again for its
        inverse, with the channel and batch axes too small to hold them all while the
        spectral weight runs. Planned again with its spectral weight pinned, the mesh axes
        must also be where the pin says while it runs: the 4-D 32 × 8 × 8 × 16 chain of the
        hard scan pinned at batch 6, 19.9 k states to 16.2 k."""
        if not self.parks(ctx):
            return 0.0
        key = (ctx, done, lay, unpads)
        found = self._shuttled.get(key)
        if found is None:
            sizes, index = self.placed(lay)
            found = 0.0
            if sizes and len(ctx.shape) ** len(sizes) <= SHUTTLES:
                pins = self.pin_places(ctx, lay)
                shuttles, ends = self.tables.shuttles, (ctx, sizes, unpads is not None, pins)
                table = shuttles.get(ends)
                if table is None:
                    table = shuttles[ends] = Shuttles(ctx, sizes, unpads is not None, pins=pins,
                                                      fits=self.tables.fits.setdefault((ctx, sizes, pins), {}))
                moves = table.fewest(done)[index]
                if moves:
                    found = moves * self.move_price(ctx, done, min(sizes), unpads)
            self._shuttled[key] = found
        return found

    def shuttling_to(self, ctx: Context, done: int, lay: Interned, ends: Goal) -> float:
        """A lower bound on the moves of a sum's term from `(done, lay)` to where `ends`
        wants the mesh axes in use (the sum's entry layout, in `bound`'s case of a sum that
        ends where it started; the term's exit, where it is known): the cheapest route of
        `shuttling`'s relaxed problem (`Shuttles`) that ends with each mesh axis `ends`
        names on the tensor axis it names it on, each move priced at what an `all_to_all`
        of the tensor as it is then costs at least (its bytes when that many steps have
        run, over mesh axes of the least size in use). A real move is such an
        `all_to_all`, of a tensor no smaller (padded or not), so the relaxed image of a real
        route costs no more. Priced one by one, the departures and arrivals of `line` each
        come when the tensor is smallest; here they come in an order the steps allow. An
        FNO layer that must give its input's split back for the skip term, with the grid
        axes' inverse DFTs growing the tensor between the moves: dfno's chain at batch 4,
        8.9 k states to 4.1 k.

        0 (memoised) where `shuttling` finds nothing, where `ends` names no mesh axis in
        use or cannot hold one (forbids it, or wants exact layouts that do not name it:
        `line` counts those), where the placements are too many, where a move costs about
        a latency whenever it runs and no weight is pinned (`weighs_bytes`: the counts of
        `regrouping` and `returning` price those; with a pin, the relaxed problem sees
        where the pin puts the mesh axes), and until `RETURN_ASKS` states have asked for
        its table: a table costs about what 25 states do, and a search from many entries
        (a chain's `entry_bound`) asks a few states of each."""
        key = (ctx, done, lay, ends)
        found = self._shuttled_to.get(key)
        if found is None:
            names = self.in_use(lay)
            table_key = self._targets.get((ctx, names, ends))
            if table_key is None:  # the table's key, or () where none applies
                table_key = self._targets[(ctx, names, ends)] = self.target(ctx, lay, ends)
            found = 0.0
            if table_key:
                tables = self.tables
                table = tables.shuttles.get(table_key)
                if table is None:
                    asked = tables.asked[table_key] = tables.asked.get(table_key, 0) + 1
                    if asked < RETURN_ASKS:
                        return 0.0  # not memoised: a state asked again once the table is solved gets it
                    _, sizes, target, pins = table_key
                    least = min(sizes)
                    table = tables.shuttles[table_key] = Shuttles(
                        ctx, sizes, price=lambda d: self.all_to_all_price(ctx.nbytes(d), least), target=target,
                        pins=pins, fits=tables.fits.setdefault((ctx, sizes, pins), {}),
                        priced=tables.priced.setdefault((len(ctx.shape), len(sizes)), {}))
                found = table.fewest(done)[self.placed(lay)[1]]
            self._shuttled_to[key] = found
        return found

    def target(self, ctx: Context, lay: Interned, ends: Goal) -> tuple:
        """`shuttling_to`'s table key for the mesh axes in use in `lay` and `ends`:
        `(ctx, their sizes, the tensor axis `ends` names each on or -1, pins)`, or ()
        where none applies (see there)."""
        names = self.in_use(lay)
        if not (names and ends.prefixes is not None and ends.counts is None and self.parks(ctx)
                and (self.weighs_bytes(ctx) or self.pinned_splits(ctx)) and len(ctx.shape) ** len(names) <= SHUTTLES):
            return ()
        where = {m: a for a, axes in enumerate(ends.prefixes) for m in axes}
        if any(m in ends.forbidden or (ends.exact and m not in where) for m in names) or not where.keys() & set(names):
            return ()
        return ctx, self.placed(lay)[0], tuple(where.get(m, -1) for m in names), self.pin_places(ctx, lay)

    def weighs_bytes(self, ctx: Context) -> bool:
        """Whether a move in `ctx` can weigh several latencies: the larger of its tensor at
        its start and at its end has `BYTES_LATENCIES` times `latency_bytes` or more per
        device (memoised)."""
        found = self._weighs.get(ctx)
        if found is None:
            found = self._weighs[ctx] = (max(ctx.nbytes(0), ctx.nbytes(ctx.full)) / self.devices
                                         >= BYTES_LATENCIES * self.cost.latency_bytes)
        return found

    def placed(self, lay: Interned) -> tuple[tuple[int, ...], int]:
        """The sizes of the mesh axes in use in `lay` (by name, `in_use`), and the index of
        its placement among `Shuttles.placements` (memoised)."""
        found = self._placed.get(lay)
        if found is None:
            names, on = self.in_use(lay), {m: a for a, axes in enumerate(lay.value) for m in axes}
            index = 0
            for m in names:
                index = index * len(lay.value) + on[m]
            found = self._placed[lay] = (tuple(self.mesh_sizes[m] for m in names), index)
        return found

    def in_use(self, lay: Interned) -> tuple[str, ...]:
        """The mesh axes of more than one device in use in `lay`, by name (memoised)."""
        found = self._in_use.get(lay)
        if found is None:
            found = self._in_use[lay] = tuple(sorted(m for axes in lay.value for m in axes if self.mesh_sizes[m] > 1))
        return found

    def pin_places(self, ctx: Context, lay: Interned) -> tuple:
        """Where `Shuttles` may place the mesh axes in use in `lay` (by name, as `placed`
        orders them) when a pointwise step of `ctx` with a pinned weight runs:
        `(step, tensor axes, where)`, `tensor axes` the mask of those its weight runs along,
        `where[i]` the one of them its pin puts mesh axis `i` on, or -1 where the pin names
        it on none (it sits elsewhere then); `where` None where the pin cannot hold (a mesh
        axis pinned on two axes, or on a weight axis along no tensor axis). The step runs
        with each of those tensor axes split exactly as the pin says (`Search.forms`);
        mesh axes the pin names that are not in use are left out (a split brings them,
        which the relaxed problem does not count; memoised)."""
        names = self.in_use(lay)
        key = (ctx, names)
        found = self._pin_places.get(key)
        if found is None:
            found = []
            for j, step, pin in self.pinned_steps(ctx):
                first = step.axes[0] if step.axes else 0
                along, where, holds = 0, [-1] * len(names), True
                for x, pinned in zip(step.leaf.param_axes, pin):
                    if x is None:
                        holds = holds and not pinned
                        continue
                    along |= 1 << (first + x)
                    for m in pinned:
                        if m in names:
                            i = names.index(m)
                            holds = holds and where[i] in (-1, first + x)
                            where[i] = first + x
                found.append((j, along, tuple(where) if holds else None))
            found = self._pin_places[key] = tuple(found)
        return found

    def fixed(self, entry: Interned, terms: list) -> bool:
        """Whether `regrouping` counts the moves of a sum's `terms` (contexts) run from
        `entry`: no mesh axis can come or go (`keeps_mesh_axes`), and every weight of
        the terms is pinned (a network planned again at another batch size): a bound,
        however exact, changes which of equally cheap routes the search finds first, and
        where a weight is free, the placement the plan picks among equally cheap ones is
        what the other batch sizes are pinned to, and what they cost."""
        return self.keeps_mesh_axes(entry, terms) and all(self.pins_every_weight(term.prog) for term in terms)

    def keeps_mesh_axes(self, entry: Interned, terms: list) -> bool:
        """Whether no mesh axis can come or go in a sum's `terms` (contexts) run from
        `entry`: every mesh axis of more than one device splits `entry` (so none is free
        for a split or a column-parallel `Matrix`), `entry` names no other, and no term
        holds a step that can sum a split away (a `Reduce`, a row-parallel `Matrix`) or a
        sum. Then every move in the terms is an `all_to_all` (see `regrouping`)."""
        names = [m for axes in entry.value for m in axes]
        return (bool(self.mesh_used)  # on one device nothing moves: nothing to count
                and sorted(self.mesh_sizes[m] for m in names) == sorted(self.mesh_used)
                and not any(term.psum_steps | term.sums for term in terms))

    def pins_every_weight(self, prog: Program) -> bool:
        """Whether every weight of `prog` is pinned (a network planned again at another
        batch size): no later plan is then pinned to which of equally cheap routes the
        search finds first."""
        return all(step.leaf.name in self.pinned for step in prog.all_steps() if step.weighted)

    def adjacencies(self, lay: Interned) -> frozenset:
        """Each mesh axis of `lay` with what comes right before it: the mesh axis before
        it on its tensor axis, or that tensor axis where it is first (memoised)."""
        found = self._adjacencies.get(lay)
        if found is None:
            found = self._adjacencies[lay] = frozenset(
                (axes[i - 1] if i else a, m) for a, axes in enumerate(lay.value) for i, m in enumerate(axes))
        return found

    def all_to_all_price(self, nbytes: float, pieces: int) -> float:
        """The price of an `all_to_all` of a tensor of `nbytes` (over all devices) that moves
        mesh axes of `pieces` devices: its latency and the bytes each device sends, forward
        and backward when training."""
        ways = 2 if self.cost.training else 1
        return ways * (self.cost.latency_bytes + nbytes * (pieces - 1) / pieces / self.devices)

    def move_price(self, ctx: Context, done: int, smallest: int, unpads: float | None = None) -> float:
        """The least price of an `all_to_all` from `(done, ...)` on, over mesh axes of least
        size `smallest`: of the smallest tensor a later state can hold (or `unpads` bytes
        where less: one that may come after the sum, see `bound`)."""
        return self.all_to_all_price(self.least_moved(ctx, done, unpads), smallest)

    @staticmethod
    def least_moved(ctx: Context, done: int, unpads: float | None) -> float:
        """The fewest bytes a move from `(done, ...)` on can take: the smallest tensor a later
        state can hold, or `unpads` where less (a move that may come after the sum, see
        `bound`)."""
        return ctx.least_bytes(done) if unpads is None else min(ctx.least_bytes(done), unpads)

    def most_move_price(self, ctx: Context, done: int) -> float:
        """The most a collective from `(done, ...)` on costs that the bounds count as one
        move: its latency and the most bytes the tensor can have then, over the devices,
        forward and backward when training."""
        ways = 2 if self.cost.training else 1
        return ways * (self.cost.latency_bytes + ctx.most_bytes(done) / self.devices)

    def regrouping(self, ctx: Context, done: int, lay: Interned, here: float, stay: float, leaving: float,
                   entry: Interned, apart: tuple) -> tuple[float, float]:
        """`(stay, leaving)` of `bound`'s fork in a sum's first term, raised by counting
        the moves each term makes to the sum's exit, where no mesh axis can come or go
        (`fixed`): `stay`, the first term's cost back to the sum's `entry` layout;
        `leaving`, the cost of every term to an exit elsewhere (the first from `lay`;
        `apart[d - 1]`, the later terms' from `entry` to an exit `d` moves away: each
        the more of its `departing` and `d` times its `move_price` over the mesh's
        smallest axis; with the program on from such an exit where it goes on,
        `tails`).

        Why. Every mesh axis stays in use, so every move is an `all_to_all`, which takes
        the minor end of one tensor axis and appends it to another: of the pairs
        (a mesh axis, what comes right before it, `adjacencies`), it makes at most one
        new one (the first mesh axis it moves, after the last of its target or first
        there); a step's own action leaves the layout as it is (but a `psum`'s or a
        column-parallel `Matrix`'s, which need a split to sum away or a free mesh axis).
        A route from layout `P` to `Q` thus makes at least
        `d(P, Q) = |adjacencies(Q) - adjacencies(P)|` moves. Each layout has one pair per
        mesh axis, and all have the same mesh axes, so `d` is symmetric, and it obeys the
        triangle inequality (a pair of `Q` missing from `P` is missing from `R` or is
        one of `R`'s missing from `P`); a layout is its pairs, so `d(P, Q) > 0` for
        `P != Q`. For the first term, `waypoints` gives `(made, kept, unknown)`: it makes
        at least `made` moves, and then one for each pair of its exit `X` not in `kept`
        less `unknown`. To the exit `entry`, that is `made + |entry - kept| - unknown`
        at least; to an exit `X` elsewhere, with `d = d(entry, X) >= 1`, at least
        `made + |entry - kept| - unknown - d` (a pair of `entry` missing from `kept` is
        one of `X`'s missing from `kept`, or one of the `d` of `entry` missing from
        `X`), and each later term makes `d`. Each move costs at least its term's
        `move_price`, and each term at least its other bound (`here` for the first,
        `departing` for the others): the least over `d` of their sum is a lower bound.
        `stay` is also at least the first term's moves back to `entry` (`returning`)."""
        pairs, price = self.adjacencies(entry), self.move_price(ctx, done, min(self.mesh_used))
        # a move per mesh axis at most: only where that could raise `stay`
        if len(self.mesh_used) * self.most_move_price(ctx, done) > stay:
            stay = max(stay, self.returning(ctx, done, lay, entry))
        for made, kept, unknown in self.waypoints(ctx, done, lay):
            missing = max(0, len(pairs - kept) - unknown)
            stay = max(stay, (made + missing) * price)
            leaving = max(leaving, min(max(here, (made + max(0, missing - d)) * price) + others
                                       for d, others in enumerate(apart, 1)))
        return stay, leaving

    def returning(self, ctx: Context, done: int, lay: Interned, entry: Interned) -> float:
        """A lower bound on the moves of a sum's first term from `(done, lay)` back to the
        sum's `entry` layout, where no mesh axis can come or go (`fixed`): each tensor axis
        that must get every mesh axis `entry` puts on it (it holds none now, or a pending
        step needs it whole) gets them by moves of their own, at least its `blocks` price.
        Two such axes' moves differ (a move has one target), so the prices add up; and the
        last move of all comes after the last pending step that needs any of them whole:
        the least over which axis gets it (memoised)."""
        layout, needed = lay.value, ctx.axes(~done)[0]
        axes = tuple(b for b, want in enumerate(entry.value) if want and (not layout[b] or needed >> b & 1))
        key = (ctx, done, axes, entry)
        total = self._returning.get(key)
        if total is None:
            every = ctx.after_needs(done, axes)
            alone = {b: self.blocks(ctx, done, b, entry.value[b], ctx.after_needs(done, (b,))) for b in axes}
            total = self._returning[key] = min(
                (sum(alone.values()) - alone[b] + self.blocks(ctx, done, b, entry.value[b], every) for b in axes),
                default=0.0)
        return total

    def blocks(self, ctx: Context, done: int, b: int, want: tuple[str, ...], last: int) -> float:
        """A lower bound on the moves that bring tensor axis `b` its mesh axes `want`, all
        of them from elsewhere (it holds none of them for good now), where no mesh axis is
        free or can be freed, so that only `all_to_all`s bring them, the last of them after
        the steps in `last` (memoised).

        Each move appends a block (the minor end of its source) to `b`, after the last
        pending step that needs `b` whole; so `want` is cut into runs of consecutive mesh
        axes, each brought by a move of its own that moves at least the run (its price
        grows with the pieces moved), the minor run last. At that move, the source axis
        holds the run: it is larger than half the run's pieces (`Context.holding_bytes`,
        the least bytes the tensor can have then, over every other axis as the source).
        The least over the cuts of the runs' prices is the bound: where no axis can hold
        every mesh axis together while `b` is whole or small (an FNO layer's spectral term
        planned again with its weight pinned), the moves back to an entry layout are two
        or more, each of a tensor that has grown back, not one."""
        key = (ctx, done, b, want, last)
        found = self.tables.prices.get(key)
        if found is None:
            ndim, must = len(ctx.shape), ctx.after_needs(done, (b,))

            @functools.cache  # a run is in several cuts
            def run_price(run: tuple[str, ...], after: int) -> float:
                pieces = math.prod(self.mesh_sizes[m] for m in run)
                least = min((ctx.holding_bytes(done, after, c, pieces) for c in range(ndim) if c != b),
                            default=math.inf)
                return self.all_to_all_price(least, pieces)

            found = math.inf
            for cuts in range(1 << max(0, len(want) - 1)):  # bit i: a run ends after want[i]
                ends = [i + 1 for i in range(len(want) - 1) if cuts >> i & 1] + [len(want)]
                found = min(found, sum(run_price(want[i:k], last if k == len(want) else must)
                                       for i, k in zip([0] + ends, ends)))
            self.tables.prices[key] = found
        return found

    def waypoints(self, ctx: Context, done: int, lay: Interned) -> tuple:
        """`(made, kept, unknown)` for each way `regrouping` counts the first term's moves
        from `(done, lay)` to its exit `X`: at least `made` moves, then one for each pair
        of `X` (`adjacencies`) not in `kept`, less `unknown` (memoised).

        - *From `lay`*: a pair of `lay` whose mesh axis is first on a tensor axis that a
          pending step needs whole is gone when that step runs, so each pair of `X` not
          among `lay`'s others (`kept`) is made by a move: `(0, kept, 0)`.
        - *Through a pinned step* `j` pending (a pointwise weight pinned, `pinned_splits`):
          when it runs, each tensor axis its weight runs along holds exactly the mesh
          axes its pin says, so the layout then has the pairs `known` of those pins.
          Each one not among `lay`'s pairs that survive the steps before `j` is made by a
          move before `j` (`made`); after `j`, each pair of `X` not among those of
          `known` that survive the steps after `j`, nor among the layout's other
          (`unknown` many) pairs then, is made by a move."""
        key = (ctx, done, lay)
        found = self._waypoints.get(key)
        if found is not None:
            return found
        pending = ~done & ctx.full

        def kept(pairs, steps: int) -> frozenset:  # the pairs no step in `steps` takes apart
            return frozenset(p for p in pairs if not (isinstance(p[0], int) and ctx.needs[p[0]] & steps))

        pairs = self.adjacencies(lay)
        found = [(0, kept(pairs, pending), 0)]
        for j, splits in self.pinned_splits(ctx):
            if pending >> j & 1:
                known = frozenset(p for a, names, _, _ in splits for p in zip((a,) + names, names))
                found.append((len(known - kept(pairs, ctx.ancestors[j] & pending)),
                              kept(known, ctx.descendants[j] & pending), len(self.mesh_used) - len(known)))
        found = self._waypoints[key] = tuple(found)
        return found

    def line(self, ctx: Context, done: int, lay: Interned, goal: Goal | None, scope: int = -1,
             unpads: float | None = None) -> float:
        """A lower bound on the collectives still to come on one line of data (a program,
        or a term of a sum), from layout `lay` with `done` steps done.

        *Departures*: a tensor axis that is split and that a pending step needs whole,
        that is padded (but in a sum's term, `Context.term`: the terms may end in a padded
        exit, unpadded after the sum; unless `unpads`, the least bytes of the tensor after
        the sum, where the program ends unpadded, see `bound`), or that holds a mesh axis
        the goal does not want there, needs a collective with that axis as its source (no collective has two
        sources); it comes before the first step that needs the axis whole. *Arrivals*: a tensor axis
        that must end with mesh axes it does not safely hold (it lacks them, or it must
        become whole or unpadded first, losing them; a departure for the goal alone takes
        only the mesh axes after those it wants there) needs a collective with that axis
        as its target (none has two targets), after the last step that needs it whole,
        or a free mesh axis split onto it. One collective may be a departure and an
        arrival only where it can carry a mesh axis from its source to its goal on the
        target, one arrival per departure, and where it can come both before the first
        step that needs its source whole and after the last step that needs its target
        whole: the arrivals of a maximum such matching are not counted. Each is priced at
        its least: latency plus the bytes of the smallest tensor it can move then (the
        k-th departure in time comes while at most k-1 needy axes have gone, the k-th
        last arrival after all but k-1 have come back), forward and backward when
        training (an `all_to_all`), or one latency where a `psum` can take the split away
        or a split put it back.

        *A dense `Matrix`*, trained while the devices' data differ (and no `Reduce` can
        sum that away first), costs a collective whatever its form: its weight
        gradient's all-reduce, a row-parallel `psum` or `psum_scatter`, or a
        column-parallel input gradient's all-reduce; one latency, unless that `psum` is
        the departure of its axis counted above. *A pointwise weight* (split with the
        axes it runs along) has its gradient all-reduced unless every split mesh axis sits
        on those axes when it runs, and gathered where one of them is split unevenly: a
        mesh axis parked elsewhere, where no departure moves it, costs that all-reduce or
        a move of its own, and mesh axes that no placement on those axes splits evenly
        cost one or the other (`uneven`); one latency more.

        *A stencil* (a pending step with `HALO` axes that read neighbours, `ctx.halos`):
        each such axis split now is, when the stencil runs, either still split, which
        costs a halo exchange there (its `ppermute`s, never counted above: two each way
        per axis, at least the latency and the planes of a split at least the mesh's
        least), or whole: it has then lost every mesh axis, a departure that takes them
        all (counted as above, with the arrivals that this makes necessary); the bound
        takes the least over the choices of the axes that go whole. And where none stays
        split, if no pending step can sum a mesh axis away and the tensor axes the
        stencil leaves free cannot hold the mesh axes in use (`Context.holds`), one
        halo axis holds one of them there: one exchange more. Whatever the route, one
        choice is the route's, so the least of them is a lower bound; with several
        stencils, the largest of their bounds is.

        `scope` (a mask of steps) limits it to the operator of a chain that runs now."""
        key = (ctx, done, lay, goal, scope, unpads)
        cached = self._lines.get(key)
        if cached is not None:
            return cached
        place = self.placement(lay, goal)
        layout, sizes, splits = place.layout, ctx.sizes(done), place.splits
        pending = ~done & scope
        needed = ctx.axes(pending)[0]
        whole = 0  # the departures that take every mesh axis away (a bit mask of tensor axes, as below)
        for a in place.split:
            if (sizes[a] % splits[a] and (unpads is not None or not ctx.term)) or needed >> a & 1:
                whole |= 1 << a
        departures = whole | place.conflicts
        counted = {}  # split HALO axes that lose every mesh axis too -> `collectives` with them

        def collectives(gone: int) -> float:
            found = counted.get(gone)
            if found is None:
                found = counted[gone] = self.collectives(ctx, done, place, scope, departures | gone, whole | gone,
                                                         unpads)
            return found

        total = collectives(0)
        if ctx.halos:
            ways = 2 if self.cost.training else 1
            least = ctx.least_bytes(done) / self.devices
            used = place.used_sizes
            fewest = min(self.mesh_sizes.values())
            kept = not ctx.psum_steps & pending  # no mesh axis in use can go before a stencil

            def exchange(width: int, n: int, split: int) -> float:  # split: a least split of its axis then
                fits = width <= -(-n // split)
                return 2 * ways * (self.cost.latency_bytes + least * split / n * width) if fits else math.inf

            for k, (j, halos, free) in enumerate(ctx.halos):
                if not pending >> j & 1:
                    continue
                split = {a: exchange(width, n, fewest) for a, width, n in halos if layout[a] and not whole >> a & 1}
                crowded = used and kept and free is not None and not ctx.holds(done, k, used, scope)
                anew = min(exchange(width, n, used[-1]) for _, width, n in halos) if crowded else 0.0
                here = math.inf
                for r in range(len(split) + 1):
                    for gone in itertools.combinations(split, r):
                        exchanged = sum(cost for a, cost in split.items() if a not in gone) if r < len(split) else anew
                        if exchanged < here:
                            here = min(here, exchanged + collectives(sum(1 << a for a in gone)))
                total = max(total, here)
        self._lines[key] = total
        return total

    def placement(self, lay: Interned, goal: Goal | None) -> Placement:
        """What `line` reads of `lay` and `goal` (memoised, shared by the searches of one plan)."""
        tables = self.tables
        found = tables.placements.get((lay, goal))
        if found is None:
            spread = tables.placements.get(lay)
            if spread is None:
                spread = tables.placements[lay] = Spread.of(lay.value, self.mesh_sizes)
            wish = tables.placements.get(goal)
            if wish is None:
                wish = tables.placements[goal] = Wish.of(goal, self.mesh_sizes)
            found = tables.placements[(lay, goal)] = Placement(spread, wish, goal)
        return found

    def arriving(self, ctx: Context, done: int, lay: Interned, goal: Goal, floor: float = 0.0) -> float:
        """A lower bound on the cost from `(done, lay)` to the layout `goal` wants, by its
        arrivals alone (see `line`): a tensor axis that must end with mesh axes it does
        not safely hold needs a collective with it as target (or a split). 0 where it
        cannot exceed `floor` (each arrival costs at most a collective's latency and the
        most bytes the tensor can have then, over the devices, forward and backward; so
        no more than each axis the goal wants a mesh axis on, which is checked first)."""
        place, most = self.placement(lay, goal), self.most_move_price(ctx, done)
        if len(place.wants) * most <= floor:
            return 0.0
        layout, sizes, splits, pending = place.layout, ctx.sizes(done), place.splits, ~done
        needed = ctx.axes(pending)[0]
        arrivals, whole = [], 0
        for b, _ in place.wants:
            if layout[b] and ((sizes[b] % splits[b] and not ctx.term) or needed >> b & 1):
                whole |= 1 << b
                arrivals.append(b)
            elif place.astray >> b & 1:
                arrivals.append(b)
        if len(arrivals) * most <= floor:
            return 0.0
        return self.arrivals_price(ctx, done, place, -1, arrivals, whole, frozenset(), bool(ctx.psum_steps & pending),
                                   False)

    def arrivals_price(self, ctx: Context, done: int, place: Placement, scope: int, arrivals: list, whole: int,
                       freed: frozenset, psums: bool, summing: bool) -> float:
        """`line`'s price of the `arrivals` (tensor axes that need a collective with them as
        target, or a split; `whole`, a bit mask: those that lose every mesh axis first):
        one latency for a split of mesh axes free now or `freed` by a pending `psum`; for
        the others, the least bytes each can move then, forward and backward when
        training, or, if a `psum` is pending (`psums`), each summed away and split back
        (that `psum` counted already where `summing`)."""
        latency = self.cost.latency_bytes
        split = latency if self.cost.training else 0.0
        total, moved, smallest = 0.0, 0, math.inf
        for b in arrivals:
            if _splits_in(place, b, whole, freed):
                total += split
            else:
                moved |= 1 << b
                smallest = min(smallest, place.least_wanted[b])
        if moved:
            costs, splits = self.moves_price(ctx, done, scope, moved, smallest, True)
            if psums:  # or summed away by a psum, then split back: one psum may free them all,
                # and it may be the dense Matrix's collective or a departure's psum counted already
                total += min(costs, (0.0 if summing else latency) + splits)
            else:
                total += costs
        return total

    def collectives(self, ctx: Context, done: int, place: Placement, scope: int, departures: int,
                    whole: int, unpads: float | None = None) -> float:
        """`line`'s count of the collectives but the halo exchanges, given the tensor
        axes that depart (`departures`, a bit mask; `whole`: those that lose every mesh
        axis)."""
        pending = ~done & scope
        needed, summable = ctx.axes(pending)
        summed = departures & summable
        freed = frozenset(n for a in bits(summed) for n in place.layout[a])
        arrivals = []
        if place.wants:
            astray = whole | place.astray
            arrivals = [b for b, _ in place.wants if astray >> b & 1]
            if arrivals and departures:
                # a departure may carry one of its mesh axes to the arrival axis wanting it, if it can
                # come before the first step needing its source whole and after the last needing b
                carries = {}
                for b in arrivals:
                    sources = departures & place.sources[b] & ~(1 << b)
                    if sources:
                        carries[b] = [a for a in bits(sources) if ctx.meets(done, a, b)]
                if carries:
                    # matched dearest first (a split, or the least move of b's own), the arrivals left over
                    # are the cheapest such set (see `pins_share`)
                    def price(b: int) -> float:
                        if _splits_in(place, b, whole, freed):
                            return 0.0
                        return self.moves_price(ctx, done, scope, 1 << b, place.least_wanted[b], True)[0]

                    carried = _matching({b: carries[b] for b in sorted(carries, key=lambda b: -price(b))})
                    arrivals = [b for b in arrivals if b not in carried]
        total = 0.0
        dense = False  # whether a dense Matrix's collective (which may be a psum) is counted
        shared = 0  # the collectives counted for a dense Matrix or a pointwise weight (see `pins_share`)
        latency = self.cost.latency_bytes
        if self.cost.training and place.split and not ctx.reduces & pending:
            if ctx.dense & pending and not departures & summable:
                total += latency
                dense = True
                shared += 1
            if ctx.pointwise and (self.parked(ctx, pending, place, departures) or self.uneven(ctx, pending, place)):
                total += latency
                shared += 1
        if departures or arrivals:
            total += latency * summed.bit_count()  # summed away
            moving = departures & ~summable
            if moving:
                smallest = min([place.smallest[a] for a in bits(moving)])
                total += self.moves_price(ctx, done, scope, moving, smallest, False, unpads)[0]
            if arrivals:
                total += self.arrivals_price(ctx, done, place, scope, arrivals, whole, freed, bool(summable),
                                             dense or bool(summed))
        if place.free:
            total += self.pins_share(ctx, done, place, pending, departures, shared)
        return total

    def moves_price(self, ctx: Context, done: int, scope: int, axes: int, smallest: int,
                    arriving: bool, unpads: float | None = None) -> tuple[float, float]:
        """`line`'s least prices of the `all_to_all`s of mesh axes of least size `smallest`,
        one departing from (or, `arriving`, one arriving on) each tensor axis in `axes` (a
        mask), forward and backward when training: each moves at least the bytes the
        tensor has then (`Context.departure_bytes`, `arrival_bytes`; for an axis no pending
        step needs whole, `least_bytes`, or `unpads` where less: it may move after a sum's
        term, see `line`). `(their sum, the sum of each's or a split's price, whichever is
        less)`, memoised: many states share them."""
        key = (ctx, done, scope, axes, smallest, arriving, unpads)
        found = self.tables.prices.get(key)
        if found is None:
            ways = 2 if self.cost.training else 1
            latency = self.cost.latency_bytes
            split = latency if self.cost.training else 0.0
            carried = (smallest - 1) / smallest / self.devices
            needy = bits(axes & ctx.axes(~done & scope)[0])
            sizes = (ctx.arrival_bytes if arriving else ctx.departure_bytes)(done, needy, scope) if needy else []
            sizes = sizes + [self.least_moved(ctx, done, unpads)] * (axes.bit_count() - len(needy))
            costs = [ways * (latency + size * carried) for size in sizes]
            found = self.tables.prices[key] = (sum(costs), sum(min(c, split) for c in costs))
        return found

    def parked(self, ctx: Context, pending: int, place: Placement, departures: int) -> bool:
        """`line`'s pointwise weight: whether a pending pointwise step's weight (split with
        the axes it runs along) sees a mesh axis parked on another tensor axis, one that no
        departure moves, and that no arrival can bring onto an axis the weight runs along
        before the step (a mesh axis the goal wants there, if no step needing that axis
        whole must follow the weight's: that move is an arrival's, counted apart)."""
        parked = [a for a in place.split if not departures >> a & 1]
        if not parked:
            return False
        layout, wanted, needs = place.layout, place.wanted, ctx.needs
        for j, along, _ in ctx.pointwise:
            if pending >> j & 1:
                after = pending & ctx.descendants[j]
                for a in parked:
                    if a not in along and not any(wanted.get(m) in along and not needs[wanted[m]] & after
                                                  for m in layout[a]):
                        return True
        return False

    def uneven(self, ctx: Context, pending: int, place: Placement) -> bool:
        """`line`'s pointwise weight, wherever the mesh axes go: whether a pending pointwise
        step's weight finds, whatever the route, a mesh axis in use off the tensor axes it
        runs along (its gradient all-reduced over it) or one of those axes split unevenly
        (its gradient gathered, see `StepAction.weight_gradient`): the mesh axes in use now
        (which stay in use: no pending step can sum one away) cannot be split evenly over
        the sizes those axes have when it runs (an FNO layer's spectral weight on modes
        too few for a mesh axis of 8)."""
        if (ctx.psum_steps | ctx.dense | ctx.reduces) & pending:
            return False
        used = place.used_sizes
        return any(pending >> j & 1 and not _even(rooms, used) for j, _, rooms in ctx.pointwise)

    def pins_share(self, ctx: Context, done: int, place: Placement, pending: int, departures: int,
                   shared: int) -> float:
        """`line`'s share for pinned weights (where no goal wants a layout). A pending
        pointwise step whose weight is pinned runs with each tensor axis its weight runs
        along split exactly as the pin says. So:

        - *after it*: such an axis split there, that a later step needs whole (and no
          `psum` can take its split away), needs a collective with it as its source
          after that step: not a departure counted before the step (one that must come
          before the first step needing its axis whole, when that step precedes the
          pinned one);
        - *before it*: the pin's order of mesh axes on such an axis must be there when
          the step runs: its first mesh axis first on the axis, each other one right
          after the one before it. Each of these adjacencies missing now needs an action
          before the step that makes it: an `all_to_all` moves only the minor end of one
          axis and appends it to another, a split appends a free mesh axis (so does a
          column-parallel `Matrix` to its whole axis), and no other action puts a mesh
          axis anywhere, so each action makes at most one new adjacency (the first mesh
          axis it moves after the last one of its target, or first there), and each
          missing one needs an action of its own, that moves its mesh axis: an
          `all_to_all`, or, for a mesh axis free now (or that a pending `psum` may
          free), a split (its gradient's all-reduce when training). One that puts a mesh
          axis first on the axis has the axis as its target, so is no departure from it.
          A pair of mesh axes is one adjacency wherever it sits: an `all_to_all` keeps
          the pairs within what it moves, so one action may make the pair that two pins
          on different axes want (two 4-D weights pinned `("a", "b")` on axes 1 and 2:
          split `a` and `b` onto axis 1, then move both to axis 2), and it is counted
          once; the first mesh axis of each axis is an adjacency of that axis.
          A dense `Matrix` on that axis may put mesh axes there itself: then nothing is
          counted for the axis. A departure counted, or a collective after another
          pinned step, may be one of these actions (a matching of them is not counted:
          the one that leaves the cheapest set over, found by matching the dearest first).

        Each is priced at its least, as a departure; less one latency for each
        collective of a dense `Matrix` or a pointwise weight counted (`shared`: either
        may be one of these)."""
        found = self.pinned_splits(ctx)
        layout = place.layout
        after = {}  # tensor axis -> (its pinned step, its least mesh axis size)
        before = {}  # tensor axis -> (its pinned step, the adjacencies missing: (tensor axis, mesh axis) for
        for j, splits in found:  # the first, (mesh axis, the mesh axis right after it) for the others)
            if not pending >> j & 1:
                continue
            for a, names, smallest, touched in splits:
                if a not in before and not touched & pending and layout[a] != names:
                    missing = ((a, names[0]),) if layout[a][:1] != names[:1] else ()
                    missing += tuple(pair for pair in zip(names, names[1:]) if pair not in place.adjacent)
                    if missing:
                        before[a] = (j, missing)
                if a in after or not ctx.needs[a] & pending & ctx.descendants[j] or ctx.psums[a] & pending:
                    continue
                if departures >> a & 1:
                    needs = ctx.needs[a] & pending
                    first = (needs & -needs).bit_length() - 1
                    if not needs or not (ctx.whole(first) and ctx.ancestors[j] >> first & 1):
                        continue  # the departure counted may be this one
                after[a] = (j, smallest)
        if not after and not before:
            return 0.0
        latency = self.cost.latency_bytes
        extra = sum(self.move_price(ctx, done, n) for _, n in after.values())
        carriers: dict = {}  # each missing adjacency -> the collectives counted that may make it
        for b, (j, missing) in before.items():
            for pair in missing:
                first = isinstance(pair[0], int)
                carriers.setdefault(pair, set()).update(
                    [(a, True) for a in bits(departures) if a != b or not first]
                    + [(a, False) for a, (k, _) in after.items() if (a != b or not first) and k != j])
        psums = bool(ctx.psum_steps & pending)
        split = latency if self.cost.training else 0.0
        prices = {}  # each missing adjacency's price where no carrier makes it: that of a move of its mesh axis
        for pair in carriers:
            y = pair[1]
            if y not in place.used:
                prices[pair] = split
            else:
                cost = self.move_price(ctx, done, self.mesh_sizes[y])
                prices[pair] = min(cost, split) if psums else cost
        # matched dearest first, the adjacencies left over are the cheapest such set: the sets of one
        # side of a bipartite graph that a matching covers are a matroid, where greed by weight is optimal
        carried = _matching({key: sorted(carriers[key]) for key in sorted(carriers, key=lambda key: -prices[key])})
        extra += sum(price for key, price in prices.items() if key not in carried)
        return max(0.0, extra - shared * latency)

    def pinned_splits(self, ctx: Context) -> tuple:
        """`(step, ((tensor axis, the mesh axes its pin splits it over, their least size,
        the dense steps on that axis), ...))` of `ctx`'s pointwise steps with a pinned
        weight, for the tensor axes the pin splits (memoised)."""
        known = self._pinned_splits.get(ctx)
        if known is not None:
            return known
        found = []
        for j, step, pin in self.pinned_steps(ctx):
            first = step.axes[0] if step.axes else 0
            pins = [(first + x, names) for x, names in zip(step.leaf.param_axes, pin) if x is not None and names]
            splits = tuple((a, names, min(self.mesh_sizes[n] for n in names), ctx.dense_on[a]) for a, names in pins)
            if splits:
                found.append((j, splits))
        found = self._pinned_splits[ctx] = tuple(found)
        return found

    def pinned_steps(self, ctx: Context) -> Iterator[tuple]:
        """`(index, step, its weight's pin)` of each pointwise step of `ctx` whose weight is
        pinned (`pinned_splits`, `pin_places`)."""
        for j, step in enumerate(ctx.steps):
            if not step.terms and step.weighted and not step.dense and step.leaf.name in self.pinned:
                yield j, step, self.pinned[step.leaf.name]


def _moves(placed: tuple[tuple[int, int], ...], holders: tuple[tuple[int, int, int], ...], whole_before: int,
           whole_after: int, spread_before: tuple[tuple[int, int], ...] = (), spread_after: tuple = ()) -> int:
    """The moves around a step (see `Search.parking`) where the mesh axes now on tensor
    axes `placed` (`(size, tensor axis)` each) have, when it runs, the holders that
    `holders` gives some of them (`(tensor axis now, holder, index in placed)` each); the
    tensor axes a step before it needs whole (`whole_before`) and one after it
    (`whole_after`) are bit masks. `spread_before`: `(a, n)` for each axis of
    `whole_before` whose mesh axes must sit on `n` other axes when it is whole
    (`Context.spread_before`); `spread_after`: `Context.spread_after`, or () not to count
    that.

    A mesh axis on axis 0 goes to axis 2, and one on axis 3, which an earlier step needs
    whole, goes elsewhere: axes 0 and 3 are sources before the step; axis 2, which a later
    step needs whole, loses its mesh axis after it:

    >>> _moves(((2, 0), (2, 3)), ((0, 2, 0),), 0b1000, 0b100)
    3
    """
    sources = targets = held = 0
    loads = [0] * len(spread_after)  # per holder: the mesh axes it holds (a bit mask over `placed`)
    for _, a in placed:
        if whole_before >> a & 1:
            sources |= 1 << a
    for a, b, i in holders:
        held |= 1 << b
        if spread_after:
            loads[b] |= 1 << i
        if b != a:
            sources |= 1 << a
            targets |= 1 << b
        elif whole_before >> b & 1:
            targets |= 1 << b
    # a move has one source and one other target: an axis that must both lose and gain takes two
    before = 2 if sources == targets and sources.bit_count() == 1 else max(sources.bit_count(), targets.bit_count())
    # `n` moves take the mesh axes of `a` to their `n` tensor axes (one to each) before `a` is whole,
    # and one more brings `a` what it holds here
    for a, n in spread_before:
        before = max(before, n + (targets >> a & 1))
    leaving = held & whole_after
    after = leaving.bit_count()
    if spread_after:
        for b in bits(leaving):
            if spread_after[b]:  # () for an axis whole after only for the end (`parking`'s `unpads`)
                after = max(after, spread_after[b][loads[b]])
    return before + after


@functools.lru_cache(maxsize=1 << 14)  # a pure function of small tuples: a bounded memo
def _fewest_moves(placed: tuple[tuple[int, int], ...], rooms: tuple[float, ...], whole_before: int,
                  whole_after: int, spread_before: tuple[tuple[int, int], ...] = (), spread_after: tuple = (),
                  exact: bool = False) -> float:
    """The fewest moves around a step (see `Search.parking`) over every way to place the
    mesh axes `placed` (`(size, tensor axis now)` each) on tensor axes with `rooms` (each
    takes mesh axes whose sizes multiply to less than its room; `exact`: to a divisor of
    it, 0 taking none) when it runs; the tensor axes a step before it needs whole
    (`whole_before`) and one after it (`whole_after`) are bit masks; `spread_before` and
    `spread_after` as for `_moves`. Where they cannot be placed: `math.inf` (no route
    runs the step).

    Both mesh axes on axis 2, which a step before needs whole and one after too: they
    leave it, the one of 4 comes back (axis 1 has room for the other only), and it
    leaves again after:

    >>> _fewest_moves(((4, 2), (2, 2)), (0, 4, 8), 0b100, 0b100)
    3

    The same where axes 1 and 2 are 6 and 8 long: the one of 4 may wait on axis 1, padded
    (one move), but split evenly it must come back (three); none of 4 splits 2 evenly:

    >>> placed = ((4, 2), (2, 2))
    >>> _fewest_moves(placed, (0, 12, 16), 0b100, 0b100), _fewest_moves(placed, (0, 6, 8), 0b100, 0b100, exact=True)
    (1, 3)
    >>> _fewest_moves(((4, 2),), (0, 2, 2), 0, 0, exact=True)
    inf

    Two mesh axes of 4 where no tensor axis has room for one (an axis of 2 holds fewer
    than 4 pieces): no route runs the step.

    >>> _fewest_moves(((4, 1), (4, 2)), (0, 4, 4), 0, 0)
    inf
    """
    orders = {a: (a, *(b for b in range(len(rooms)) if b != a)) for _, a in placed}
    best = _fewest_placed((), math.inf, placed, rooms, [1] * len(rooms), orders,
                          (whole_before, whole_after, spread_before, spread_after), exact)
    return best


def _fewest_placed(holders: tuple[tuple[int, int, int], ...], best: float, placed: tuple, rooms: tuple,
                   load: list[int], orders: dict, around: tuple, exact: bool) -> float:
    """`_fewest_moves` over the placements that extend `holders` (`load`: the product of
    the sizes placed on each tensor axis so far; `orders`: the tensor axes to try for a
    mesh axis on each; `around`: `_moves`'s other arguments), or `best` where none has
    fewer moves (a function of its own, not a closure calling itself: that would be a
    reference cycle per call, left to the garbage collector)."""
    # each placement only adds moves: the count so far bounds every completion
    moves = _moves(placed, holders, *around)
    if moves >= best or len(holders) == len(placed):
        return min(moves, best)
    size, a = placed[len(holders)]
    for b in orders[a]:  # staying first: a cheap placement early prunes the rest
        fits = rooms[b] and rooms[b] % (load[b] * size) == 0 if exact else load[b] * size < rooms[b]
        if fits:
            load[b] *= size
            best = _fewest_placed(holders + ((a, b, len(holders)),), best, placed, rooms, load, orders, around, exact)
            load[b] //= size
    return best


@functools.lru_cache(maxsize=1 << 12)  # a pure function of small tuples: a bounded memo
def _even(rooms: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether mesh axes of `sizes` can each sit on one of tensor axes of sizes `rooms` (0:
    an axis that takes none), each such axis divided evenly by the mesh axes on it.

    >>> _even((4, 2, 4, 5), (4, 2)), _even((4, 2, 4, 5), (8, 4, 2))
    (True, False)
    """
    if not sizes:
        return True
    first, rest = sizes[0], sizes[1:]
    return any(n and n % first == 0 and _even(tuple(sorted(rooms[:i] + (n // first,) + rooms[i + 1:])), rest)
               for i, n in enumerate(rooms) if i == 0 or n != rooms[i - 1])


def _matching(edges: dict) -> dict:
    """A maximum matching of a small bipartite graph (`edges[b]`: the `a`s `b` may pair
    with), as `{b: a}` (augmenting paths)."""
    pair: dict = {}
    owner: dict = {}  # a -> the b paired with it
    for b, some in edges.items():
        if some:
            _augment(b, edges, pair, owner, set())
    return pair


def _augment(b, edges: dict, pair: dict, owner: dict, seen: set) -> bool:
    """Whether an augmenting path from `b` pairs it (`_matching`; a function of its own, not
    a closure calling itself: that would be a reference cycle per call, left to the
    garbage collector)."""
    for a in edges[b]:
        if a not in seen:
            seen.add(a)
            if a not in owner or _augment(owner[a], edges, pair, owner, seen):
                pair[b], owner[a] = a, b
                return True
    return False


def _splits_in(place: Placement, b: int, whole: int, freed: frozenset) -> bool:
    """Whether arrival axis `b` (`whole`: a bit mask of the axes that lose every mesh
    axis first) can get the mesh axes it lacks by a split: they are free now, or `freed`
    by a pending `psum`."""
    ready = place.ready_whole if whole >> b & 1 else place.ready
    return bool(ready >> b & 1) or bool(freed) and all(
        m not in place.used or m in freed for m in place.prefixes[b] if whole >> b & 1 or m not in place.layout[b])


class AdjointEnds:
    """`backwards`' search of an adjoint, stepped on as asked (`LowerBound.last_from`):
    the ends it has popped (`found`: layout -> least cost; `first`, the cheapest, or None),
    and `least`, a lower bound on the time of every end not popped yet. It stops after
    `BACKWARD_STATES` states in all, or where the search fails (`failed`)."""

    def __init__(self, ends: Iterator):
        self.ends = ends
        self.found: dict = {}
        self.first: tuple | None = None
        self.least = 0.0
        self.states = 0
        self.over = self.failed = False

    def step(self) -> bool:
        """Searches one state on (or takes the end popped next); False where it cannot."""
        if self.over or self.states >= BACKWARD_STATES:
            return False
        try:
            cost, state, _, heap = next(self.ends)
        except StopIteration:
            self.over, self.least = True, math.inf
            return False
        except PlanningError:
            self.over = self.failed = True
            return False
        if state is not None:
            self.found.setdefault(state[3].value, cost)
            self.first = self.first or cost
            self.least = cost[0]
        else:
            self.states += 1
            self.least = heap[0][0][0] if heap else math.inf
        return True


class Departures:
    """A sum's later term's search from the sum's entry layout to its ends
    (`LowerBound.departures`), stepped on as asked: the time of the first end it pops,
    wherever (`least_end`: the term's least cost from the entry), the ends it pops
    elsewhere, in that order, and, once it has stopped after `LEAVING_STATES` states (as
    `_least_end` does), the least key it left open. The first end it pops outside a set
    of layouts is the cheapest outside it (A* with an admissible bound, for that set as
    its goal)."""

    def __init__(self, ends: Iterator, entry):
        self.ends, self.entry = ends, entry
        self.first: float | None = None  # the time of the first end popped, in any layout
        self.found: list = []  # (time, layout) of each end popped elsewhere than `entry` before it stopped, in order
        self.count = 0  # the items of `ends` taken
        self.least: float | None = None  # where the search has stopped: a lower bound on every end not popped
        self.over = False  # no item left: the search ended, or gave up

    def least_end(self) -> float:
        """The time of the cheapest end (searched on past `LEAVING_STATES` where needed),
        0 where there is none or the search gives up."""
        while self.first is None and not self.over:
            self.take()
        return 0.0 if self.first is None else self.first

    def beyond(self, popped=frozenset()) -> float:
        """The least time of an end in none of the layouts `popped`, or a lower bound on it
        where the search has stopped."""
        seen = 0
        while True:
            for time, lay in self.found[seen:]:
                if lay not in popped:
                    return time
            seen = len(self.found)
            if self.least is not None:
                return self.least
            self.take()

    def take(self) -> None:
        """Takes the search's next item."""
        try:
            cost, state, _, heap = next(self.ends)
        except StopIteration:
            self.over, self.least = True, math.inf if self.least is None else self.least
            return
        except PlanningError:
            self.over, self.least = True, 0.0 if self.least is None else self.least
            return
        count, self.count = self.count, self.count + 1
        if state is not None:
            self.first = cost[0] if self.first is None else self.first
            if state[3] is not self.entry and self.least is None:
                self.found.append((cost[0], state[3]))
        if count == LEAVING_STATES and self.least is None:
            # an end just popped is searched on from later: it bounds what it leads to
            least = heap[0][0][0] if heap else math.inf
            self.least = least if state is None else min(least, cost[0])


def _least_end(ends: Iterator, states: float = math.inf, enough: float = math.inf) -> float:
    """The time of the cheapest end in `ends` (an `explore`), or, once it has expanded
    `states` states or the least key still open is `enough` or more, that key: a lower
    bound on it (A* with an admissible bound keeps a state of a cheapest route open at a
    key no more than that route's cost); `math.inf` where there is none, 0 where the
    search gives up."""
    try:
        for count, (cost, state, _, heap) in enumerate(ends):
            if state is not None:
                return cost[0]
            if count == states or enough < math.inf:
                least = heap[0][0][0] if heap else math.inf
                if count == states or least >= enough:
                    return least
    except PlanningError:
        return 0.0
    return math.inf


def _placements(rank: int, names: tuple[str, ...]) -> Iterator[Layout]:
    """Every layout of a tensor of `rank` axes that places each mesh axis of `names` on
    one of them, in any order on each (`rank * (rank + 1) * ...` of them).

    >>> len(list(_placements(2, ("x", "y"))))
    6
    """
    if not names:
        yield ((),) * rank
        return
    last = names[-1]
    for lay in _placements(rank, names[:-1]):
        for a, axes in enumerate(lay):
            for i in range(len(axes) + 1):
                yield lay[:a] + (axes[:i] + (last,) + axes[i:],) + lay[a + 1:]


class Shuttles:
    """The fewest moves of a relaxed problem, from each state of one line of data (a
    sum's term) to its end (see `LowerBound.shuttling`): a state is the steps done and
    the tensor axis that holds each mesh axis in use (`placements`: every assignment,
    the order of mesh axes on an axis forgotten); a move takes any of the mesh axes on
    one tensor axis to one other; a step runs where no mesh axis sits on an axis it
    needs whole and every axis holds fewer pieces than its room then
    (`Context.rooms`), and a step with a pinned weight only where its pin puts the mesh
    axes (`pins`, see `LowerBound.pin_places`); the end, every step done, and (`unpadded`)
    every axis split evenly, or (`target`) each mesh axis on the tensor axis it names
    (-1: anywhere). Every real route maps to a relaxed
    one with as many moves, each where as many steps have run (an `all_to_all` moves mesh
    axes from one tensor axis to one other; nothing else moves one in use where no step
    can sum one away), so its fewest moves are a lower bound; with `price` (the least a
    move costs once the steps of a mask have run), its cheapest moves are
    (`LowerBound.shuttling_to`). Solved backwards over the masks of steps done,
    memoised (numpy over the placements).

    A 3-D FNO layer's spectral term, its three grid axes split over mesh axes of 8, 4
    and 2: each grid axis must be whole for its DFT and again for its inverse, and the
    channel axis of 4 holds the mesh axis of 8 at no time, nor any while the spectral
    weight runs: eight moves at least (the cheapest route makes ten), where one departure
    per axis counts three.
    """

    def __init__(self, ctx: Context, sizes: tuple[int, ...], unpadded: bool = False,
                 price: Callable[[int], float] | None = None, target: tuple[int, ...] | None = None,
                 pins: tuple = (), fits: dict | None = None, priced: dict | None = None):
        self.ctx, self.unpadded, self.price, self.target = ctx, unpadded, price, target
        # (steps done, step) -> where that step may run: shared by the tables of one context, mesh axis sizes
        # and pins (`Tables.fits`)
        self.fits = {} if fits is None else fits
        # a move's price -> `distance` times it: shared by the tables of one plan on as many tensor and mesh
        # axes (`Tables.priced`; a few prices per plan, one per tensor size the moves see)
        self.priced = {} if priced is None else priced
        ndim = len(ctx.shape)
        self.placements = np.array(list(itertools.product(range(ndim), repeat=len(sizes))), dtype=np.int64)
        # the pieces each tensor axis is split into, per placement
        self.loads = np.ones((len(self.placements), ndim), dtype=np.int64)
        for i, size in enumerate(sizes):
            self.loads[np.arange(len(self.placements)), self.placements[:, i]] *= size
        # where a step with a pinned weight may run (`LowerBound.pin_places`)
        self.pinned: dict[int, np.ndarray] = {}
        for j, along, where in pins:
            allowed = np.full(len(self.placements), where is not None)
            for i, a in enumerate(where or ()):
                on = self.placements[:, i]
                allowed &= (on == a) if a >= 0 else (along >> on & 1) == 0
            self.pinned[j] = allowed
        self.distance = self.apart(ndim, len(sizes))
        self.solved: dict[int, np.ndarray] = {}
        self.memo: dict[int, list[float]] = {}

    @staticmethod
    @functools.lru_cache(maxsize=16)  # a pure function of two small integers: a bounded memo
    def apart(ndim: int, count: int) -> np.ndarray:
        """The fewest relaxed moves between any two placements of `count` mesh axes on
        `ndim` tensor axes (`placements`' order): breadth first over the moves, by
        products of boolean matrices (each mesh axis moves at most once: `count` rounds).
        Moving mesh axes 0, 1 (on axis 0) and 2 (on axis 1) to axes 1, 2 and 2 takes two
        moves, not one per pair of axes: 0 and 1 to axis 1, then 1 and 2 on to axis 2.

        >>> d = Shuttles.apart(3, 3)
        >>> int(d[0 * 9 + 0 * 3 + 1, 1 * 9 + 2 * 3 + 2])
        2
        """
        placements = list(itertools.product(range(ndim), repeat=count))
        index = {p: i for i, p in enumerate(placements)}
        step = np.zeros((len(placements), len(placements)), dtype=bool)
        for i, p in enumerate(placements):
            for a in set(p):
                on = [m for m in range(count) if p[m] == a]
                for r in range(1, len(on) + 1):
                    for moved in itertools.combinations(on, r):
                        for b in range(ndim):
                            if b != a:
                                q = list(p)
                                for m in moved:
                                    q[m] = b
                                step[i, index[tuple(q)]] = True
        distance = np.where(np.eye(len(placements), dtype=bool), 0, count + 1)
        reached = np.eye(len(placements), dtype=bool)
        for d in range(1, count + 1):
            reached = reached | (reached.astype(np.int32) @ step.astype(np.int32) > 0)
            distance = np.where(reached & (distance > d), d, distance)
        return distance

    def fewest(self, done: int) -> list[float]:
        """The fewest relaxed moves (the cheapest, with `price`) to the end from `done`, per
        placement (`math.inf`: none)."""
        found = self.memo.get(done)
        if found is None:
            found = self.memo[done] = self.solve(done).tolist()
        return found

    def priced_moves(self, price: float) -> np.ndarray:
        """`distance` times a move's `price` (memoised)."""
        found = self.priced.get(price)
        if found is None:
            found = self.priced[price] = self.distance * price
        return found

    def solve(self, done: int) -> np.ndarray:
        """`fewest` as an array (memoised)."""
        found = self.solved.get(done)
        if found is None:
            ctx = self.ctx
            if done == ctx.full and self.target is not None:
                there = np.ones(len(self.placements), dtype=bool)
                for i, a in enumerate(self.target):
                    if a >= 0:
                        there &= self.placements[:, i] == a
                ready = np.where(there, 0.0, math.inf)
            elif done == ctx.full:
                end = np.zeros(len(self.placements))
                if self.unpadded:
                    sizes = np.array(ctx.sizes(done))
                    end[(sizes[None, :] % self.loads).any(axis=1)] = math.inf
                ready = end
            else:
                ready = np.full(len(self.placements), math.inf)
                for j in range(len(ctx.steps)):
                    if not done >> j & 1 and not ctx.preds[j] & ~done:
                        fits = self.fits.get((done, j))
                        if fits is None:
                            rooms = np.array(ctx.rooms(done, j))
                            fits = ((self.loads == 1) | (self.loads < rooms[None, :])).all(axis=1)
                            if j in self.pinned:
                                fits &= self.pinned[j]
                            self.fits[(done, j)] = fits
                        ready = np.minimum(ready, np.where(fits, self.solve(done | 1 << j), math.inf))
            moves = self.distance if self.price is None else self.priced_moves(self.price(done))
            found = self.solved[done] = (moves + ready[None, :]).min(axis=1)
        return found
