"""`Context`: what the search knows of a program run from a given tensor shape — the
sizes and itemsize after any set of done steps, which steps need which axes whole, and
the byte counts its lower bounds need (memoised per context)."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Iterator

from ...operators import Role
from ..layout import pads
from .actions import halo_width
from .program import Program, Step


class Context:
    """A program run on a tensor of `shape` and `itemsize`: its sizes and itemsize
    after any set of done steps, and what the lower bound needs (memoised)."""

    def __init__(self, prog: Program, shape: tuple[int, ...], itemsize: int, tensor_parallel: bool,
                 split_counts: frozenset = frozenset(), term: bool = False):
        self.prog, self.shape, self.itemsize0 = prog, shape, itemsize
        # a sum's term: it may end padded (in the sum's exit layout, which the program around it unpads)
        self.term = term
        self.steps, self.preds, self.full = prog.steps, prog.preds, prog.full
        ndim = len(shape)
        self.needs = [0] * ndim  # per axis: the steps that need it whole
        self.psums = [0] * ndim  # per axis: the steps that can sum its split away
        self.dense = 0  # the dense Matrix steps (or sums holding one)
        self.dense_on = [0] * ndim  # per axis: the dense Matrix steps on it (or sums holding one)
        self.reduces = 0  # the Reduce steps (or sums holding one)
        # (step, the tensor axes its weight is split along, `rooms` below) of pointwise weights
        self.pointwise = []
        for j, step in enumerate(self.steps):
            for inner, a, role in _axis_roles(step):
                if role is Role.LOCAL:
                    self.needs[a] |= 1 << j
                # a row-parallel Matrix needs its input axis split evenly
                row = inner.dense and tensor_parallel and any(inner.in_sizes[0] % q == 0 for q in split_counts)
                if role is Role.REDUCE or (role is Role.LOCAL and row):
                    self.psums[a] |= 1 << j
                if role is Role.REDUCE:
                    self.reduces |= 1 << j
                if inner.dense:
                    self.dense |= 1 << j
                    self.dense_on[a] |= 1 << j
            for inner in _line_steps(step):
                if inner.weighted and not inner.dense:
                    along = frozenset(inner.axes[0] + a for a in inner.leaf.param_axes if a is not None)
                    # per tensor axis, its size when the step runs if the weight may be split along it
                    # (the step does not need it whole), else 0
                    rooms = [0] * ndim
                    for a in inner.leaf.param_axes:
                        if a is not None and inner.roles[a] is not Role.LOCAL:
                            rooms[inner.axes[0] + a] = inner.in_sizes[a]
                    if (j, along, tuple(rooms)) not in self.pointwise:
                        self.pointwise.append((j, along, tuple(rooms)))
        # per stencil (a step, or one on a sum's line, with HALO axes that have neighbours): (its step,
        # ((tensor axis, halo width, the axis's size there), ...), the axes that may hold mesh axes with no
        # halo exchange there, None within a sum)
        self.halos = []
        self.resizes = [0] * ndim  # per axis: the steps that change its size
        for j, step in enumerate(self.steps):
            for a, n, m in zip(step.axes, step.in_sizes, step.out_sizes):
                if n != m:
                    self.resizes[a] |= 1 << j
            for inner in _line_steps(step):
                widths = ((a, halo_width(inner, a), n)
                          for a, role, n in zip(inner.axes, inner.roles, inner.in_sizes) if role is Role.HALO)
                halos = tuple(halo for halo in widths if halo[1] > 0)
                if halos:
                    busy = {a for a, role in zip(inner.axes, inner.roles) if role is Role.LOCAL}
                    busy |= {a for a, _, _ in halos}
                    free = None if step.terms else tuple(b for b in range(ndim) if b not in busy)
                    self.halos.append((j, halos, free))
        self.shrinks = [_shrink(step) for step in self.steps]
        self.growths = [_growth(step) for step in self.steps]
        self.factors = [step.bytes_factor for step in self.steps]
        # the steps the search may run as soon as they are ready and need no collective (`Search.forced`):
        # no sum, no weight, not growing the tensor, and every split that may pad one of its axes before
        # it may do so after it too, and every split onto it once split that divides it before divides
        # it after (so running it early never rules out a move: 2 x 2 divides 4, not 3)
        onto_split = {q for q in split_counts if any(q % p == 0 and 1 < p < q and q // p in split_counts
                                                     for p in split_counts)}
        self.forceable = sum(1 << j for j, step in enumerate(self.steps)
                             if not step.terms and not step.weighted and self.factors[j] <= 1
                             and all(pads(n, q, ()) == pads(m, q, ()) for n, m in zip(step.in_sizes, step.out_sizes)
                                     for q in split_counts)
                             and all((n % q == 0) == (m % q == 0)
                                     for n, m in zip(step.in_sizes, step.out_sizes) for q in onto_split))
        self.ancestors, self.descendants = prog.ancestors, prog.descendants  # per step, bit masks of steps
        # a chain's operators: the steps up to each barrier (the last one: up to the end)
        self.segments, mask = [], 0
        for j, step in enumerate(self.steps):
            mask |= 1 << j
            if step.barrier:
                self.segments.append(mask)
                mask = 0
        self.segments.append(mask)
        self._segment: dict[int, int] = {}
        self.sums = sum(1 << j for j, step in enumerate(self.steps) if step.terms)
        self.psum_steps = 0  # the steps that can sum a split away (main line)
        for a in range(ndim):
            self.psum_steps |= self.psums[a]
        self._sizes: dict[int, tuple[int, ...]] = {}
        self._itemsize: dict[int, int] = {}
        self._ready: dict[int, tuple[int, ...]] = {}
        self._bytes: dict = {}
        self._least: dict[int, float] = {}
        self._most: dict[int, float] = {}
        self._axes: dict[int, tuple[int, int]] = {}

    def axes(self, pending: int) -> tuple[int, int]:
        """`(needed, summable)`, bit masks of the tensor axes that a step in `pending` (a
        mask of steps) needs whole, and that one can sum a split of away (memoised)."""
        found = self._axes.get(pending)
        if found is None:
            found = self._axes[pending] = (sum(1 << a for a, steps in enumerate(self.needs) if steps & pending),
                                           sum(1 << a for a, steps in enumerate(self.psums) if steps & pending))
        return found

    def sizes(self, done: int) -> tuple[int, ...]:
        found = self._sizes.get(done)
        if found is None:
            sizes = list(self.shape)
            for j, step in enumerate(self.steps):
                if done >> j & 1:
                    step.resize(sizes)
            found = self._sizes[done] = tuple(sizes)
        return found

    def itemsize(self, done: int) -> int:
        found = self._itemsize.get(done)
        if found is None:
            found = self.itemsize0
            for j, step in enumerate(self.steps):
                if done >> j & 1:
                    found = step.out_itemsize(found)
            self._itemsize[done] = found
        return found

    def nbytes(self, done: int) -> int:
        """The global bytes of the tensor once the steps of `done` have run (unpadded)."""
        return math.prod(self.sizes(done)) * self.itemsize(done)

    def least_bytes(self, done: int) -> float:
        """A lower bound on the global bytes of the tensor in any later state: every
        pending step with its least factor."""
        found = self._least.get(done)
        if found is None:
            factor = math.prod(f for j, f in enumerate(self.shrinks) if not done >> j & 1)
            found = self._least[done] = self.nbytes(done) * factor
        return found

    def most_bytes(self, done: int) -> float:
        """An upper bound on the global bytes of the tensor in any later state: every
        pending step with its greatest factor."""
        found = self._most.get(done)
        if found is None:
            factor = math.prod(f for j, f in enumerate(self.growths) if not done >> j & 1)
            found = self._most[done] = self.nbytes(done) * factor
        return found

    def departure_bytes(self, done: int, axes: tuple[int, ...], scope: int = -1) -> list[float]:
        """Lower bounds on the global bytes the tensor has at the first, second, ...
        departure (in time) from `axes`, each of which must come before the first pending
        step that needs its axis whole: the k-th comes when at most k-1 of them have gone,
        so a step that needs any of the others (or follows one that does) cannot have run.
        Only the steps in `scope` (a mask: a chain's operator that runs now) count."""
        key = ("departures", done, axes, scope)
        if key not in self._bytes:
            firsts = {}  # per axis: the steps its departure must precede
            skip = done | ~scope
            for a in axes:
                needs = self.needs[a] & ~skip
                first = (needs & -needs).bit_length() - 1
                if not self.steps[first].terms:
                    firsts[a] = self.descendants[first] | 1 << first
            pending = [j for j in range(len(self.steps)) if not skip >> j & 1]
            # per pending step: the axes whose departure must precede it
            blocks = [(j, frozenset(a for a, cut in firsts.items() if cut >> j & 1)) for j in pending]
            now = self.nbytes(done)
            sizes = []
            for k in range(len(axes)):
                least = math.inf
                for gone in itertools.combinations(axes, k):
                    gone = set(gone)
                    least = min(least, math.prod(self.shrinks[j] for j, b in blocks if b <= gone))
                sizes.append(now * least)
            self._bytes[key] = sizes
        return self._bytes[key]

    def arrival_bytes(self, done: int, axes: tuple[int, ...], scope: int = -1) -> list[float]:
        """Lower bounds on the global bytes the tensor has at the last, second last, ...
        arrival (in time) on `axes`, each of which comes after the last pending step that
        needs its axis whole: at the k-th from last, at least all but k-1 of them have
        arrived, so their last needs and everything before them have run. Only the steps in
        `scope` (a mask: a chain's operator that runs now) count."""
        key = ("arrivals", done, axes, scope)
        if key not in self._bytes:
            musts = {a: self.after_needs(done, (a,), scope) for a in axes}
            skip = done | ~scope
            pending = [j for j in range(len(self.steps)) if not skip >> j & 1]
            now = self.nbytes(done)
            sizes = []
            for k in range(len(axes)):
                least = math.inf
                for arrived in itertools.combinations(axes, len(axes) - k):
                    must = 0
                    for a in arrived:
                        must |= musts[a]
                    least = min(least, math.prod(self.factors[j] if must >> j & 1 else self.shrinks[j]
                                                 for j in pending))
                sizes.append(now * least)
            self._bytes[key] = sizes
        return self._bytes[key]

    def after_needs(self, done: int, axes: tuple[int, ...], scope: int = -1) -> int:
        """The pending steps that run before a state after the last pending step that
        needs each of `axes` whole: those steps and every step before them (a sum's
        terms may run around the state: not the sum). Only the steps in `scope` count."""
        must, skip = 0, done | ~scope
        for b in axes:
            needs = self.needs[b] & ~skip
            last = needs.bit_length() - 1
            must |= (self.ancestors[last] | self.whole(last)) & ~skip if needs else 0
        return must

    def holding_bytes(self, done: int, must: int, c: int, pieces: int) -> float:
        """A lower bound on the global bytes of the tensor in a later state where the
        steps in `must` have run (with every step before them), and axis `c` holds a
        split into `pieces` (memoised).

        Axis `c` holds it only where its size exceeds `pieces / 2` (an axis of size `n`
        holds fewer than `2n` pieces). The steps on `c` run in their order (they share the
        axis), so the state has run some prefix of them, one after which `c` is that
        large, with their ancestors, and none of the others nor what follows them: each
        step run there counts its factor, each one that cannot have run counts 1, and
        each other one its least factor. The least over the prefixes is the bound
        (infinite where `c` is never that large)."""
        key = ("holding", done, must, c, pieces)
        found = self._bytes.get(key)
        if found is None:
            on = [j for j, step in enumerate(self.steps) if not done >> j & 1 and c in step.axes]
            pending = [j for j in range(len(self.steps)) if not done >> j & 1]
            now = self.nbytes(done)
            size, found = self.sizes(done)[c], math.inf
            for r in range(len(on) + 1):
                if r:
                    step = self.steps[on[r - 1]]
                    size = step.out_sizes[step.axes.index(c)]
                run = must
                for j in on[:r]:
                    run |= self.ancestors[j] | 1 << j
                idle = 0  # the steps on `c` after the prefix, and what follows them
                for j in on[r:]:
                    idle |= self.descendants[j] | 1 << j
                if 2 * size <= pieces or run & idle:
                    continue
                found = min(found, now * math.prod(self.factors[j] if run >> j & 1 else 1.0 if idle >> j & 1
                                                    else self.shrinks[j] for j in pending))
            self._bytes[key] = found
        return found

    def holds(self, done: int, k: int, used: tuple[int, ...], scope: int = -1) -> bool:
        """Whether the tensor axes that stencil `k` (of `halos`) leaves free may hold mesh
        axes of sizes `used` when it runs (an axis of size `n` holds a split in fewer than
        `2n` pieces: a split dividing it, or one that pads it to less than twice its
        size); an axis a pending step may resize before it may hold any. Only the steps
        in `scope` count."""
        j, _, free = self.halos[k]
        sizes = self.sizes(done)
        room = []
        for b in free:
            if self.resizes[b] & ~done & scope & ~self.descendants[j] & ~(1 << j):
                return True
            room.append(2 * sizes[b])
        key = ("holds", used, tuple(room))
        if key not in self._bytes:
            self._bytes[key] = _fits(used, room)
        return self._bytes[key]

    def rooms(self, done: int, j: int) -> tuple[float, ...]:
        """Per tensor axis, in fewer than how many pieces it can be split when step `j`
        runs (after `done`): none for an axis `j` needs whole; twice its size for the
        others (a split dividing it, or one that pads it to less than twice its size),
        its size as `j` takes it, or its largest by then: now, or after a pending step
        before `j` that resizes it. Memoised."""
        key = ("rooms", done, j)
        found = self._bytes.get(key)
        if found is None:
            step, sizes, pending = self.steps[j], self.sizes(done), ~done
            room: list[float] = []
            for b, n in enumerate(sizes):
                if self.needs[b] >> j & 1:
                    room.append(0)
                elif b in step.axes:
                    room.append(2 * step.in_sizes[step.axes.index(b)])
                else:  # its largest size by then: now, or after a pending step before `j` that resizes it
                    before = self.resizes[b] & pending & ~self.descendants[j] & ~(1 << j)
                    room.append(2 * max([n] + [self.steps[i].out_sizes[self.steps[i].axes.index(b)]
                                                for i in bits(before)]))
            found = self._bytes[key] = tuple(room)
        return found

    def spread_before(self, done: int, j: int, a: int, sizes: tuple[int, ...]) -> int:
        """The fewest other tensor axes that mesh axes of `sizes`, on axis `a` now, must sit
        on when a pending step before `j` needs `a` whole (`hosts`; 0 where none does).
        Memoised."""
        key = ("before", done, j, a, sizes)
        found = self._bytes.get(key)
        if found is None:
            steps = self.needs[a] & self.ancestors[j] & ~done
            found = self._bytes[key] = max((hosts(sizes, self.rooms(done, k), a) for k in bits(steps)), default=0)
        return found

    def spread_after(self, done: int, j: int, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """Per tensor axis `b`, per set of mesh axes (a bit mask over `sizes`) that `b` holds
        when step `j` runs: the fewest other tensor axes they must sit on when a pending
        step after `j` needs `b` whole (`hosts`; 0 where none does); () where every such set
        fits on one (so counts nothing a departure does not). Memoised."""
        key = ("after", done, j, sizes)
        found = self._bytes.get(key)
        if found is None:
            found = []
            for b in range(len(self.shape)):
                rooms = [self.rooms(done, k) for k in bits(self.needs[b] & self.descendants[j] & ~done)]
                found.append(tuple(max((hosts(tuple(n for i, n in enumerate(sizes) if mask >> i & 1), room, b)
                                        for room in rooms), default=0)
                                   for mask in range(1 << len(sizes))) if rooms else ())
            found = self._bytes[key] = tuple(found) if any(n > 1 for spread in found for n in spread) else ()
        return found

    def crowded(self, used: tuple[int, ...]) -> tuple[int, ...]:
        """The steps where mesh axes of sizes `used` crowd the tensor axes: where one
        tensor axis would have to hold one of them even with every axis at its largest
        size in the program (memoised)."""
        key = ("crowded", used)
        if key not in self._bytes:
            largest = list(self.shape)
            for step in self.steps:
                for a, n, m in zip(step.axes, step.in_sizes, step.out_sizes):
                    largest[a] = max(largest[a], n, m)
            found = []
            for j, step in enumerate(self.steps):
                room = [(b, 2 * (step.in_sizes[step.axes.index(b)] if b in step.axes else n))
                        for b, n in enumerate(largest) if not self.needs[b] >> j & 1]
                if any(not _fits(used, [r for c, r in room if c != b]) for b, _ in room):
                    found.append(j)
            self._bytes[key] = tuple(found)
        return self._bytes[key]

    def meets(self, done: int, a: int, b: int) -> bool:
        """Whether one collective can come both before the first pending step that needs
        axis `a` whole and after the last one that needs axis `b` whole."""
        first, last = self.needs[a] & ~done, self.needs[b] & ~done
        if not first or not last:
            return True
        first = (first & -first).bit_length() - 1
        last = last.bit_length() - 1
        if self.steps[first].terms or self.steps[last].terms:
            return True  # the collective may fall within a sum's terms
        return not (first == last or self.ancestors[last] >> first & 1)

    def whole(self, j: int) -> int:
        """Step `j`'s bit, or none for a sum (a move can happen within its terms)."""
        return 0 if self.steps[j].terms else 1 << j

    def segment(self, done: int) -> int:
        """The index of the chain's operator that runs now (its first with a pending step)."""
        if len(self.segments) == 1:
            return 0
        found = self._segment.get(done)
        if found is None:
            found = self._segment[done] = next(i for i, seg in enumerate(self.segments)
                                               if seg & ~done or i == len(self.segments) - 1)
        return found

    def before(self, i: int) -> int:
        """The steps of the chain's operators before operator `i`."""
        return sum(self.segments[:i])

    def ready(self, done: int) -> tuple[int, ...]:
        found = self._ready.get(done)
        if found is None:
            found = self._ready[done] = tuple(j for j in range(len(self.steps))
                                              if not done >> j & 1 and not self.preds[j] & ~done)
        return found


def _line_steps(step) -> Iterator[Step]:
    """The step, or for a sum the steps of its first term (each so): the data the program
    goes on with pass through them (the other terms are lines of their own, from the
    sum's entry layout to the first term's exit)."""
    if step.terms:
        for inner in step.terms[0].steps:
            yield from _line_steps(inner)
    else:
        yield step


def _axis_roles(step) -> Iterator[tuple[Step, int, Role]]:
    """`(step, axis, role)` of the axes of the steps on a step's line (`_line_steps`)."""
    for inner in _line_steps(step):
        for a, role in zip(inner.axes, inner.roles):
            yield inner, a, role


@functools.lru_cache(maxsize=1 << 14)  # a pure function of small tuples: a bounded memo
def hosts(sizes: tuple[int, ...], rooms: tuple[float, ...], away: int) -> int:
    """The fewest tensor axes other than `away` that mesh axes of `sizes` can sit on, each
    axis taking some whose sizes multiply to less than its room (`Context.rooms`; all of
    them where no way fits: then no route does it). Mesh axes of 8 and 2 where no axis has
    room for 16:

    >>> hosts((2, 8), (14, 16, 16, 16, 0, 16), 4)
    2
    """
    best = len(sizes)
    for places in itertools.product(range(len(rooms)), repeat=len(sizes)):
        loads: dict[int, int] = {}
        for size, b in zip(sizes, places):
            loads[b] = loads.get(b, 1) * size
        if away not in loads and len(loads) < best and all(n < rooms[b] for b, n in loads.items()):
            best = len(loads)
    return best


@functools.lru_cache(maxsize=1 << 12)  # a pure function of a mask: a bounded memo
def bits(mask: int) -> tuple[int, ...]:
    """The set bits of `mask` (a set of steps or of tensor axes), least first."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def _fits(sizes: tuple[int, ...], room: list[int]) -> bool:
    """Whether mesh axes of `sizes` can be shared out among tensor axes that can each be
    split in fewer than `room[b]` pieces."""
    if not sizes:
        return True
    for b, free in enumerate(room):
        if sizes[0] < free:
            room[b] = -(-free // sizes[0])  # p * q < 2n  <=>  q < ceil(2n / p)
            found = _fits(sizes[1:], room)
            room[b] = free
            if found:
                return True
    return False


def _growth(step) -> float:
    """The greatest factor a step (for a sum: any of its terms, at any point within it)
    multiplies the tensor's bytes by."""
    if step.terms:
        return max(math.prod(_growth(s) for s in term.steps) for term in step.terms)
    return max(1.0, step.bytes_factor)


def _shrink(step) -> float:
    """The least factor a step (for a sum: its first term, at any point within it)
    multiplies the tensor's bytes by."""
    if step.terms:
        return math.prod(_shrink(s) for s in step.terms[0].steps)
    return min(1.0, step.bytes_factor)
