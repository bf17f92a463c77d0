"""Whether the mesh axes in use can fit the tensor at every step: a count that proves at
once, before any search, that no plan exists for some programs whose search would run
out of states first (`no_room`).

Only a `psum` drops a mesh axis (a `Reduce` over a split axis; a row-parallel dense
`Matrix`, whose input axis is split); every other action keeps each one in use (a move
takes it to another tensor axis, a split adds one). A sum's terms end in one layout, so
a sum drops no more than its term that can drop the least. When a step runs, each mesh
axis in use sits on a tensor axis the step does not need whole, and the sizes of those on
one axis multiply to less than twice the axis's size (a split divides the axis, or pads
it to less than twice its size). So, counting in bits (log2 of the pieces), the mesh
axes still in use at a step, at least those of the input less what the steps that may run
before it can drop, must fit the room the other axes have there. Where they cannot, no
route runs that step.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Mapping, NamedTuple

from ...operators import Role
from ..layout import Layout
from .program import Program, Step

SLACK = 1e-9  # bits: the counts are sums of logarithms


class NoRoom(NamedTuple):
    """A step no route can run: the bits of splits still in use there at least, and the
    most its other tensor axes (`sizes`, each at the largest it can have then) can hold."""

    step: Step
    needed: float
    room: float
    sizes: tuple[int, ...]

    def __str__(self) -> str:
        what = repr(self.step.leaf) if self.step.leaf is not None else "a step"
        whole = [a for a, r in zip(self.step.axes, self.step.roles) if r is Role.LOCAL]
        needs = f" needs axis {whole[0]} whole, but" if len(whole) == 1 else ":"
        held = (f"the tensor's other axes there (sizes {self.sizes}) hold at most {2 ** self.room:g}" if self.sizes
                else "the tensor has no other axis to hold them")
        return (f"{what}{needs} the input's split leaves at least {2 ** self.needed:g} pieces that no step before it "
                f"can sum away, and {held}")


def no_room(prog: Program, in_layout: Layout, mesh_shape: Mapping[str, int],
            shard_weights: bool | str) -> NoRoom | None:
    """The first step of `prog` (run from `in_layout`) that no route can run for want of
    room for the mesh axes in use (module docstring), or None where the count finds none.
    None does not mean that a plan exists.

    ```python
    >>> from parop.distributed.plan import program
    >>> import parop as po
    >>> prog = program(po.kron(po.DFT(4), po.DFT(2)), (4, 2))  # each DFT needs its axis whole
    >>> no_room(prog, (("a", "b"), ()), {"a": 2, "b": 2}, "auto").room  # axis 1 holds 2 pieces: 1 bit
    1.0
    >>> no_room(prog, (("a",), ()), {"a": 2, "b": 2}, "auto") is None
    True
    ```
    """
    sizes = tuple(sorted(n for n in mesh_shape.values() if n > 1))
    used = sum(math.log2(mesh_shape[m]) for axes in in_layout for m in axes if mesh_shape[m] > 1)
    return _first_crowded(prog, used, sizes, bool(shard_weights))


def _first_crowded(prog: Program, used: float, sizes: tuple[int, ...], tensor_parallel: bool) -> NoRoom | None:
    """`no_room` for `prog` entered with at least `used` bits of splits in use."""
    drops = [_drop(step, sizes, tensor_parallel) for step in prog.steps]
    for j, step in enumerate(prog.steps):
        cannot_precede = prog.descendants[j] | 1 << j  # j and the steps that must follow it
        needed = used - sum(drop for k, drop in enumerate(drops) if not cannot_precede >> k & 1)
        if step.terms:
            crowded = (_first_crowded(term, needed, sizes, tensor_parallel) for term in step.terms)
            found = next(filter(None, crowded), None)
            if found is not None:
                return found
        elif not drops[j]:
            largest = _largest_sizes(prog, j)
            rooms = [0 if role is Role.LOCAL else 2 * n
                     for role, n in zip(_roles(step, len(largest)), largest)]
            room = sum(_bits(sizes, r) for r in rooms)
            if needed > room + SLACK:
                return NoRoom(step, needed, room, tuple(n for r, n in zip(rooms, largest) if r))
    return None


def _roles(step: Step, ndim: int) -> list[Role | None]:
    """Per tensor axis, the role `step` gives it (None: not one of its axes)."""
    roles: list[Role | None] = [None] * ndim
    for a, role in zip(step.axes, step.roles):
        roles[a] = role
    return roles


def _largest_sizes(prog: Program, j: int) -> list[int]:
    """Per tensor axis, the largest size it can have when step `j` runs (the size `j` takes
    on its own axes): after the last step on it that must run before `j`, or the input's
    where none must, or after any step on it that may run before `j`. The steps on one
    axis run in their serial order."""
    largest = list(prog.shape)
    for b in range(len(largest)):
        on_b = [i for i, step in enumerate(prog.steps) if b in step.axes]
        if j in on_b:
            largest[b] = prog.steps[j].in_sizes[prog.steps[j].axes.index(b)]
            continue
        before = [i for i in on_b if prog.ancestors[j] >> i & 1]
        sizes = [] if before else [prog.shape[b]]
        for i in on_b[on_b.index(before[-1]) if before else 0:]:
            if not prog.descendants[j] >> i & 1:
                step = prog.steps[i]
                sizes.append(step.out_sizes[step.axes.index(b)])
        largest[b] = max(sizes)
    return largest


def _drop(step: Step, sizes: tuple[int, ...], tensor_parallel: bool) -> float:
    """The most bits of splits `step` can drop: a `Reduce`'s split axes (padded or not), a
    row-parallel dense `Matrix`'s input axis (split evenly); a sum, its terms' least."""
    if step.terms:
        return min(sum(_drop(inner, sizes, tensor_parallel) for inner in term.steps) for term in step.terms)
    if step.dense:
        return _bits(sizes, step.in_sizes[0] + 1, divides=step.in_sizes[0]) if tensor_parallel else 0.0
    return sum(_bits(sizes, 2 * n) for role, n in zip(step.roles, step.in_sizes) if role is Role.REDUCE)


@functools.lru_cache(maxsize=1024)  # a pure function of small ints: a bounded memo
def _bits(sizes: tuple[int, ...], room: int, divides: int = 0) -> float:
    """The most bits mesh axes of `sizes` (one each) can put on an axis that holds fewer
    than `room` pieces (and, where `divides` is not 0, a number of pieces dividing it)."""
    return max((math.log2(math.prod(chosen)) for k in range(len(sizes) + 1)
                for chosen in itertools.combinations(sizes, k)
                if math.prod(chosen) < room and (not divides or divides % math.prod(chosen) == 0)), default=0.0)
