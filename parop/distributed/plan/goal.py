"""What a plan's output layout must be (`out_partition`), as the search sees it: a
test of a final layout, and, for the search's lower bound, the tensor axes whose
current split cannot stay as it is."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..layout import Layout


@dataclass(frozen=True, eq=False)
class Goal:
    """Final layouts the plan may end in (compared by identity: the search keeps one
    object per goal).

    - `prefixes[a]`: the mesh axes axis `a` must start with (major first);
    - `exact`: axis `a` must carry exactly `prefixes[a]`;
    - `forbidden`: mesh axes no axis may carry at the end;
    - `counts[a]`: how many pieces axis `a` must be cut into (None: any).
    """

    prefixes: tuple[tuple[str, ...], ...] | None = None
    exact: bool = False
    forbidden: frozenset[str] = frozenset()
    counts: tuple[int, ...] | None = None
    mesh: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def any() -> "Goal":
        return ANY

    @staticmethod
    def layout(layout: Layout) -> "Goal":
        return Goal(prefixes=layout, exact=True)

    def accepts(self, layout: Layout) -> bool:
        if any(n in self.forbidden for axes in layout for n in axes):
            return False
        if self.prefixes is not None:
            for axes, want in zip(layout, self.prefixes):
                if axes[:len(want)] != want or (self.exact and len(axes) != len(want)):
                    return False
        if self.counts is not None:
            sizes = dict(self.mesh)
            return all(math.prod(sizes[n] for n in axes) == c for axes, c in zip(layout, self.counts))
        return True

    def conflicts(self, a: int, axes: tuple[str, ...]) -> bool:
        """Whether axis `a`, split over `axes`, must lose a mesh axis before the end
        (mesh axes only come and go at the minor end of an axis)."""
        if any(n in self.forbidden for n in axes):
            return True
        if self.prefixes is not None:
            want = self.prefixes[a]
            k = min(len(axes), len(want))
            if axes[:k] != want[:k] or (self.exact and len(axes) > len(want)):
                return True
        if self.counts is not None:
            sizes = dict(self.mesh)
            return self.counts[a] % math.prod(sizes[n] for n in axes) != 0
        return False


ANY = Goal()  # one object: goals compare by identity


def default_goal(in_layout: Layout, out_shape: tuple[int, ...], mesh_shape: Mapping[str, int]) -> Goal:
    """`out_partition=None`: each axis keeps its input split where its output size
    allows; a split an axis cannot keep goes where it costs least (or is summed away
    by a `Reduce`); mesh axes the input leaves replicated stay so."""
    prefixes = tuple(axes if axes and n % math.prod(mesh_shape[m] for m in axes) == 0 else ()
                     for axes, n in zip(in_layout, out_shape))
    used = {m for axes in in_layout for m in axes}
    return Goal(prefixes=prefixes, forbidden=frozenset(set(mesh_shape) - used))


def counts_goal(counts: tuple[int, ...], in_layout: Layout, mesh_shape: Mapping[str, int]) -> Goal:
    """`out_partition` as split counts: any arrangement of the input's mesh axes that cuts
    each axis in `counts[a]` pieces (the planner picks the cheapest)."""
    used = {m for axes in in_layout for m in axes}
    return Goal(forbidden=frozenset(set(mesh_shape) - used), counts=tuple(counts),
                mesh=tuple(mesh_shape.items()))
