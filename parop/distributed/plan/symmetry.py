"""The symmetries the search uses: mesh axes renamed (`rename`), tensor axes moved as
well (`move`), and the permutations of a program's tensor axes under which it is itself
(`automorphisms`). From layout `L` with its weights pinned at `P`, such a program costs
what it costs from the image of `L` with its weights pinned at the image of `P`, so the
search plans one layout of each class and maps the answer (see `Search.canonical`). And
`structure`: what the search sees of a program, equal for operators alike but for their
weights' names (a network's identical layers), which share their searches."""

from __future__ import annotations

import itertools
import math
from typing import Mapping

from ...operators import Role
from ..layout import Layout
from .program import Program, Step


def rename(layout: Layout, names: Mapping[str, str]) -> Layout:
    """`layout` with each mesh axis `m` renamed `names[m]`."""
    return tuple(tuple(names[m] for m in axes) for axes in layout)


def move(layout: Layout, names: Mapping[str, str], perm: tuple[int, ...]) -> Layout:
    """`layout` with each mesh axis `m` renamed `names[m]` and tensor axis `a` moved to `perm[a]`."""
    moved = [()] * len(layout)
    for axes, b in zip(layout, perm):
        if axes:
            moved[b] = tuple([names[m] for m in axes])
    return tuple(moved)


MAX_AUTOMORPHISMS = 720  # permutations of a program's tensor axes tried for its symmetries


def automorphisms(prog: Program) -> tuple[tuple[tuple[int, ...], tuple], ...]:
    """The permutations of `prog`'s tensor axes (`perm[a]`: where axis `a` goes) under which
    the program is itself as the search sees it, each weighted step its own image, with
    how each weight's axes move: `(perm, ((name, where each weight axis goes), ...))`, the
    identity first. Axes of equal size only, and at most `MAX_AUTOMORPHISMS` tried.

    From layout `L`, with its weights pinned at `P`, such a program costs what it costs
    from `perm(L)` with them pinned at `perm(P)`: every state maps onto one alike."""
    groups: dict = {}
    for a, n in enumerate(prog.shape):
        groups.setdefault(n, []).append(a)
    identity = tuple(range(len(prog.shape)))
    if math.prod(math.factorial(len(g)) for g in groups.values()) > MAX_AUTOMORPHISMS:
        return ()
    found = []
    for orders in itertools.product(*(itertools.permutations(g) for g in groups.values())):
        perm = list(identity)
        for g, order in zip(groups.values(), orders):
            for a, b in zip(g, order):
                perm[a] = b
        perm = tuple(perm)
        weights = _weight_moves(prog, perm)
        if weights is not None and (perm == identity or image(prog, perm) is not None):
            found.append((perm, weights))
    return tuple(sorted(found, key=lambda f: f[0] != identity))


def _view(step: Step, perm: tuple[int, ...]) -> tuple:
    """What the search sees of `step` (but its weight's name), with tensor axis `a` renamed
    `perm[a]`: per axis its sizes, role, halo and the sizes of the weight axes along it."""
    leaf = step.leaf
    first = step.axes[0] if step.axes else 0
    weighted = step.weighted
    along: dict = {}
    if weighted:
        for w, x in enumerate(leaf.param_axes):
            if x is not None:
                along.setdefault(first + x, []).append(leaf.param_shape[w])
    axes = tuple(sorted(
        (perm[a], step.in_sizes[t], step.out_sizes[t], step.roles[t].value if leaf is not None else None,
         leaf.halo_width(a - first) if leaf is not None and step.roles[t] is Role.HALO else 0,
         tuple(along.get(a, ()))) for t, a in enumerate(step.axes)))
    loose = tuple(n for n, x in zip(leaf.param_shape, leaf.param_axes) if x is None) if weighted else ()
    return (axes, step.flow, step.in_dtype, step.out_dtype, step.scalar, step.conj, step.barrier,
            leaf is not None, weighted and (leaf.name, leaf.param_dtype, loose), step.dense and leaf.dense_axes,
            len(step.terms))


def image(prog: Program, perm: tuple[int, ...]) -> dict[int, Step] | None:
    """`{id(step): its image}` over `prog`'s steps (a sum's terms' too) where `perm` maps
    `prog` onto itself as the search sees it, else None.

    >>> image(prog, tuple(range(len(prog.shape))))[id(prog.steps[0])] is prog.steps[0]  # doctest: +SKIP
    True"""
    found: dict = {}
    return found if _maps(prog, prog, perm, found) else None


def _maps(p: Program, q: Program, perm: tuple[int, ...], found: dict) -> bool:
    """Whether `perm` maps program `p` onto `q` as the search sees them: each step onto one
    alike, the order between them kept, a sum's terms onto the image's terms; each step's
    image goes in `found` (by its id)."""
    if len(p.steps) != len(q.steps) or any(q.shape[perm[a]] != n for a, n in enumerate(p.shape)):
        return False
    targets: dict = {}
    for k, step in enumerate(q.steps):
        targets.setdefault(_view(step, tuple(range(len(perm)))), []).append(k)
    onto = []
    for step in p.steps:
        alike = targets.get(_view(step, perm))
        if not alike:
            return False
        onto.append(alike.pop(0))
    for j, k in enumerate(onto):
        preds = sum(1 << onto[i] for i in range(len(p.steps)) if p.preds[j] >> i & 1)
        if preds != q.preds[k] or not all(_maps(t, u, perm, found) for t, u in zip(p.steps[j].terms, q.steps[k].terms)):
            return False
        found[id(p.steps[j])] = q.steps[k]
    return True


def _weight_moves(prog: Program, perm: tuple[int, ...]) -> tuple | None:
    """`((name, where each of its axes goes), ...)` of `prog`'s weights under `perm`: a weight
    axis along tensor axis `a` goes to the one along `perm[a]` (None where its step has none
    there, or more than one)."""
    found: dict = {}
    for step in prog.all_steps():
        if step.weighted and step.leaf.name not in found:
            leaf, first = step.leaf, step.axes[0] if step.axes else 0
            at = {first + x: w for w, x in enumerate(leaf.param_axes) if x is not None}
            goes = tuple(w if x is None else at.get(perm[first + x]) for w, x in enumerate(leaf.param_axes))
            if None in goes or len(set(goes)) != len(goes):
                return None
            found[step.leaf.name] = goes
    return tuple(found.items())


def structure(prog: Program, itemsize: int, pinned: Mapping) -> tuple:
    """What the search sees of a program: its steps, with each leaf's fields but its
    name (and for a weight, where `pinned` puts it). Two operators of a chain with the
    same structure (a network's identical layers) cost the same between the same
    layouts."""
    return _steps_structure(prog, pinned), itemsize


def _steps_structure(prog: Program, pinned: Mapping) -> tuple:
    """`structure` of `prog` and of its sums' terms, without its itemsize."""
    return prog.preds, prog.shape, tuple(
        (s.axes, s.in_sizes, s.out_sizes, s.flow, s.in_dtype, s.out_dtype, _leaf_structure(s.leaf, pinned), s.scalar,
         s.conj, s.barrier, tuple(_steps_structure(t, pinned) for t in s.terms)) for s in prog.steps)


def _leaf_structure(leaf, pinned: Mapping) -> tuple | None:
    """A step's leaf as `structure` sees it: its fields but its name, and its weight's pin."""
    if leaf is None:
        return None
    fields = tuple(f for f in leaf._key() if not (isinstance(f, tuple) and f[:1] == ("name",)))
    return fields, pinned.get(leaf.name) if leaf.param_shape is not None else None
