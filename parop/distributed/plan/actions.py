"""The actions of a plan. Each kind of action is one class that knows its layout
effect (`after`), its collectives forward and, for `jax.grad`, backward
(`collectives`), its transpose (`transpose`: the actions of the adjoint), its image
under a symmetry or in an operator alike (`mapped`) and how a plan shows it
(`describe`); its lowering is registered in `lower.py` (`run_action`).
The search asks the kinds for the moves from a state (`StepAction.candidates`,
`AllToAll.candidates`, `Split.candidates`, `Permute.candidates`).

A plan is a list of actions from the input layout to the output layout:

- a step of the program on each device's block (`StepAction`; each axis as the step
  needs it), in one of these ways:
  - `Local`: the step alone, no collective;
  - `ReducePsum`: a `Reduce` over a split axis: a local sum, then a `psum` (its
    transpose: a `Local` broadcast and a `Split`);
  - `HaloExchange`: a stencil on split axes, each block first getting its neighbours'
    planes (a `ppermute` each way, forward and backward);
  - `ColumnParallel`: a dense `Matrix` on its axis whole, free mesh axes splitting its
    weight's rows and so the output (backward, a `psum` of the input's gradient);
  - `RowParallel`: a dense `Matrix` on its axis split, its weight's columns split the
    same way, then a `psum` (the output replicated);
  - `RowParallelScatter`: the same, then a `psum_scatter` (the output split as the
    input; backward, an `all_gather`);
  - `GatherColumnParallel`: an `all_gather` of the split axis, then column-parallel
    (the transpose of `RowParallelScatter`);
- `AllToAll`: move the minor mesh axes of one tensor axis to another;
- `Split`: cut a replicated tensor axis over free mesh axes (a local slice);
- `Gather`: its transpose, an `all_gather`;
- `Permute`: deal the blocks to other devices (a `ppermute`), each tensor axis cut
  into as many pieces over the same mesh axes (searched only where the other moves
  reach no output layout wanted: `Search(permutes=True)`);
- `Branch`: a sum, each term's actions from the same layout to a common one (a
  search's route marks it with `Enter`, `NextTerm` and `Exit`; `fold` makes the
  `Branch`es).

`State` is what the planner knows of the tensor between two actions: global sizes,
layout, itemsize. Every method takes the state the action starts in, so the search and
the replay of a finished plan compute alike.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar, Iterator, Mapping, Union

import numpy as np

from ...operators import Role
from ..layout import Layout, pads, spec_of
from .cost import ALL_GATHER, ALL_TO_ALL, PPERMUTE, PSUM, PSUM_SCATTER, Collective, sent, traffic_text
from .program import Step
from .symmetry import rename


@dataclass(frozen=True)
class State:
    """The tensor between two actions: its global `sizes` (true sizes: an axis a split
    does not divide is held padded with zeros), `layout` and `itemsize`."""

    sizes: tuple[int, ...]
    layout: Layout
    itemsize: int
    mesh: tuple[tuple[str, int], ...]

    @cached_property
    def mesh_sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    def split(self, a: int) -> int:
        return self.splits[a]

    @cached_property
    def splits(self) -> tuple[int, ...]:
        """How many pieces each tensor axis is cut into."""
        sizes = self.mesh_sizes
        return tuple(math.prod(sizes[n] for n in axes) for axes in self.layout)

    @cached_property
    def blocks(self) -> tuple[int, ...]:
        """Each axis's block on a device (a padded axis's block holds its zeros)."""
        return tuple(-(-n // p) for n, p in zip(self.sizes, self.splits))

    @cached_property
    def local_bytes(self) -> float:
        return math.prod(self.blocks) * self.itemsize

    def padded(self, a: int) -> bool:
        return self.sizes[a] % self.splits[a] != 0

    @cached_property
    def any_padded(self) -> bool:
        return any(n % p for n, p in zip(self.sizes, self.splits))

    @property
    def varying(self) -> tuple[str, ...]:
        """The mesh axes over which the devices' data differ: those in the layout."""
        return tuple(n for axes in self.layout for n in axes)

    def group(self, axes) -> int:
        sizes = self.mesh_sizes
        return math.prod(sizes[n] for n in axes)


@dataclass(frozen=True)
class StepAction:
    """Run `step` on each device's block. Each subclass is one way to run it, with its
    own layout effect, collectives (`forward`, `backward`), transpose and lowering; this
    base holds what they share: where the step's weight is split, its gradient's
    collectives, how a plan shows the step, and the forms a step can take
    (`candidates`)."""

    step: Step

    def after(self, state: State) -> Layout:
        return state.layout

    def forward(self, state: State) -> tuple[Collective, ...]:
        """The collectives this way of running the step adds to it."""
        return ()

    def backward(self, state: State) -> tuple[Collective, ...]:
        """The collectives its transpose (which `jax.grad` runs) adds, but for the
        weight's gradient (`weight_gradient`)."""
        return ()

    def collectives(self, state: State) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
        return self.forward(state), self.backward(state) + self.weight_gradient(state)

    def transpose(self, before: State) -> tuple["Action", ...]:
        """The actions of the adjoint step, from this action's output back to `before`."""
        raise NotImplementedError

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "StepAction | None":
        """This action running `steps[id(self.step)]` instead (the step's image in an
        operator alike, or under a symmetry), each mesh axis `m` it names renamed
        `mesh[m]` and each tensor axis `a` moved to `perm[a]` (see `mapped_route`); None
        where it cannot be mapped. This base replaces the step (what the kind derives from
        it, such as the tensor axes it runs on, follows); a kind with fields naming mesh
        or tensor axes maps them as well."""
        return replace(self, step=steps[id(self.step)])

    def weight_spec(self, state: State) -> tuple[tuple[str, ...], ...] | None:
        """The mesh axes splitting each weight axis where this step runs (None: no
        weight): those of the tensor axes it runs along."""
        leaf = self.step.leaf
        if leaf is None or leaf.param_shape is None:
            return None
        first = self.step.axes[0]
        return tuple(() if a is None else state.layout[first + a] for a in leaf.param_axes)

    def weight_gradient(self, state: State) -> tuple[Collective, ...]:
        """The collectives of the weight's gradient: an all-reduce over the devices that
        hold the same piece of it but different data, and, for a weight along a padded
        axis (kept whole there: a sharding must divide the array), the gather of its
        gradient's pieces."""
        spec = self.weight_spec(state)
        if spec is None:
            return ()
        leaf = self.step.leaf
        first = self.step.axes[0] if self.step.axes else 0
        padded = {first + a for a in leaf.param_axes if a is not None and state.padded(first + a)}
        along_padded = tuple(n for w, axes in enumerate(spec) for n in axes
                             if leaf.param_axes[w] is not None and first + leaf.param_axes[w] in padded)
        held = tuple(n for axes in spec for n in axes)
        piece = self._weight_bytes() / state.group(held)
        replicas = tuple(n for n in state.varying if n not in held)
        out = ()
        if state.group(replicas) > 1:
            out += (Collective(PSUM, replicas, sent(PSUM, piece, state.group(replicas))),)
        if along_padded:
            out += (Collective(ALL_GATHER, along_padded, sent(ALL_GATHER, piece, state.group(along_padded))),)
        return out

    def weight_bytes_held(self, state: State) -> float:
        """The bytes of the weight one device holds where this step runs."""
        spec = self.weight_spec(state)
        if spec is None:
            return 0.0
        leaf = self.step.leaf
        first = self.step.axes[0] if self.step.axes else 0
        kept = tuple(n for w, axes in enumerate(spec) for n in axes
                     if leaf.param_axes[w] is None or not state.padded(first + leaf.param_axes[w]))
        return self._weight_bytes() / state.group(kept)

    def _weight_bytes(self) -> float:
        leaf = self.step.leaf
        return math.prod(leaf.param_shape) * np.dtype(leaf.param_dtype).itemsize

    def detail(self, before: State) -> str:
        """What a plan's line says of this way of running the step, after its axes."""
        return ""

    def describe(self, before: State) -> str:
        axes = self.step.axes
        where = f" on axis {axes[0]}" if len(axes) == 1 else f" on axes {axes}" if axes else ""
        after = self.after(before)
        moved = f"   -> {spec_of(after)}" if after != before.layout else ""
        return f"{self.step.label()}{where}{self.detail(before)}{traffic_text(*self.collectives(before))}{moved}"

    @staticmethod
    def candidates(step: Step, here: State, shard_weights: bool | str) -> Iterator["StepAction"]:
        """The ways `step` can run from `here`: a chain's barrier where the layout is not
        padded; a dense `Matrix` on its axis whole and unpadded (`Local` unless
        `shard_weights` is True, `ColumnParallel` over each free mesh axis dividing its
        rows if it is not False), or on its axis split (`RowParallel`, and
        `RowParallelScatter` where the split divides its rows, if `shard_weights` is
        not False); any other step where each axis it needs whole is whole and only its
        `POINTWISE` and `REDUCE` axes are padded: `Local`, `ReducePsum` (a split
        `REDUCE` axis), or `HaloExchange` (a split `HALO` axis whose blocks hold the
        halo)."""
        layout = here.layout
        if step.barrier:
            if not here.any_padded:
                yield Local(step)
            return
        if step.dense:
            a = step.axes[0]
            if here.padded(a):
                return
            m = step.out_sizes[0]
            out_ax, in_ax = step.leaf.dense_axes
            parts = [()] * len(step.leaf.param_shape)
            if not layout[a]:
                if shard_weights is not True:
                    yield Local(step)
                if shard_weights:
                    used = set(here.varying)
                    for name, size in here.mesh:
                        if name not in used and size > 1 and m % size == 0:
                            parts[out_ax] = (name,)
                            yield ColumnParallel(step, tuple(parts))
                return
            if not shard_weights:
                return
            parts[in_ax] = layout[a]
            yield RowParallel(step, tuple(parts), layout[a])
            if m % here.split(a) == 0:
                yield RowParallelScatter(step, tuple(parts), layout[a])
            return
        psum, halo = (), ()
        for a, role in zip(step.axes, step.roles):
            if role is Role.LOCAL and layout[a]:
                return
            if role not in (Role.POINTWISE, Role.REDUCE) and here.padded(a):
                return
            if role is Role.REDUCE:
                psum += layout[a]
            if role is Role.HALO and layout[a] and halo_width(step, a) > 0:  # a kernel 1 wide: no neighbours
                halo += (a,)
        if psum and halo:
            return  # no action sums and exchanges halos at once: one of the axes moves first
        if psum:
            yield ReducePsum(step, psum)
        elif halo:
            if all(halo_width(step, a) <= here.blocks[a] for a in halo):  # the neighbours hold the planes
                yield HaloExchange(step, halo)
        else:
            yield Local(step)


def runs_as_is(step: Step, here: State) -> bool:
    """Whether `step` runs on each device's block without any collective (a chain's
    barrier: where the layout is not padded, as one operator hands over to the next)."""
    if step.barrier and here.any_padded:
        return False
    for a, role in zip(step.axes, step.roles):
        if role is Role.LOCAL and here.layout[a]:
            return False
        if role in (Role.REDUCE, Role.HALO) and here.layout[a]:
            return False
        if role not in (Role.POINTWISE, Role.REDUCE) and here.padded(a):
            return False
    return True


def halo_width(step: Step, a: int) -> int:
    """The planes a halo exchange brings to `step` from each neighbour along tensor axis `a`."""
    return step.leaf.halo_width(a - step.axes[0])


def _partial_sums(step: Step, state: State, a: int) -> float:
    """The bytes of a step's block of partial sums along tensor axis `a`: the local
    block with that axis at its output size."""
    i = step.axes.index(a)
    return state.local_bytes / state.blocks[a] * step.out_sizes[i] * step.out_dtype.itemsize / step.in_dtype.itemsize


def _with(layout: Layout, a: int, axes: tuple[str, ...]) -> Layout:
    """`layout` with tensor axis `a` split over `axes`."""
    return tuple(axes if b == a else other for b, other in enumerate(layout))


@dataclass(frozen=True)
class Local(StepAction):
    """The step alone on each block, no collective (each axis it needs whole is whole)."""

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (Local(self.step.transposed()),)


@dataclass(frozen=True)
class ReducePsum(StepAction):
    """A `Reduce` over split tensor axes: a local sum, then a `psum` over `axes` (the
    mesh axes that split them). Its transpose broadcasts, then splits again."""

    axes: tuple[str, ...]

    @property
    def reduced(self) -> tuple[int, ...]:
        """The tensor axes it sums over."""
        return tuple(b for b, r in zip(self.step.axes, self.step.roles) if r is Role.REDUCE)

    def after(self, state: State) -> Layout:
        return tuple(() if a in self.reduced else axes for a, axes in enumerate(state.layout))

    def forward(self, state: State) -> tuple[Collective, ...]:
        partial = _partial_sums(self.step, state, self.reduced[0])
        return (Collective(PSUM, self.axes, sent(PSUM, partial, state.group(self.axes))),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        a = self.reduced[0]
        return Local(self.step.transposed()), Split(self.axes, a, -before.sizes[a] % before.group(self.axes))

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "ReducePsum":
        return replace(super().mapped(steps, mesh, perm), axes=_named(self.axes, mesh))


@dataclass(frozen=True)
class HaloExchange(StepAction):
    """A stencil on split tensor axes `axes`: first each block gets the neighbouring
    planes from the neighbouring devices (a halo exchange: a `ppermute` each way)."""

    axes: tuple[int, ...]

    def halo_width(self, a: int) -> int:
        """The planes the exchange brings from each neighbour along tensor axis `a`."""
        return halo_width(self.step, a)

    def forward(self, state: State) -> tuple[Collective, ...]:
        out = ()
        for a in self.axes:
            planes = state.local_bytes / state.blocks[a] * self.halo_width(a)
            out += (Collective(PPERMUTE, state.layout[a], planes),) * 2
        return out

    backward = forward  # the neighbours' planes forward, their gradients back

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (HaloExchange(self.step.transposed(), self.axes),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "HaloExchange":
        return replace(super().mapped(steps, mesh, perm), axes=tuple(perm[a] for a in self.axes))

    def detail(self, before: State) -> str:
        return ", halo exchange on axis " + ", ".join(f"{a} over {'+'.join(before.layout[a])}" for a in self.axes)


@dataclass(frozen=True)
class TensorParallel(StepAction):
    """A dense `Matrix` with its weight split: `weight_split`, the mesh axes splitting
    each weight axis."""

    weight_split: tuple[tuple[str, ...], ...]
    form: ClassVar[str]

    @property
    def axis(self) -> int:
        """The tensor axis the `Matrix` runs on."""
        return self.step.axes[0]

    @property
    def rows(self) -> tuple[str, ...]:
        """The mesh axes splitting the weight's rows (its output axis)."""
        return self.weight_split[self.step.leaf.dense_axes[0]]

    def weight_spec(self, state: State) -> tuple[tuple[str, ...], ...]:
        return self.weight_split

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str],
               perm: tuple[int, ...]) -> "TensorParallel | None":
        """None where `perm` moves a tensor axis: `weight_split` is indexed by the weight's
        own axes, which such a move permutes as the weight's step orders them (the
        program's `automorphisms` know how, not the action)."""
        if perm != tuple(range(len(perm))):
            return None
        return replace(super().mapped(steps, mesh, perm), weight_split=rename(self.weight_split, mesh))

    def detail(self, before: State) -> str:
        return f", {self.form}-parallel: weight split over {'+'.join(n for part in self.weight_split for n in part)}"


@dataclass(frozen=True)
class ColumnParallel(TensorParallel):
    """On its axis whole: free mesh axes split the weight's rows, and so the output
    axis. Backward, the replicated input's gradient is summed over them."""

    form = "column"

    def after(self, state: State) -> Layout:
        return _with(state.layout, self.axis, self.rows)

    def backward(self, state: State) -> tuple[Collective, ...]:
        return (Collective(PSUM, self.rows, sent(PSUM, state.local_bytes, state.group(self.rows))),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (RowParallel(self.step.transposed(), self.weight_split, self.rows),)


@dataclass(frozen=True)
class GatherColumnParallel(ColumnParallel):
    """The transpose of `RowParallelScatter`: an `all_gather` of its split axis over
    `axes` first, then column-parallel with its rows split over them. Backward, a
    `psum_scatter`."""

    axes: tuple[str, ...]

    def forward(self, state: State) -> tuple[Collective, ...]:
        g = state.group(self.axes)
        return (Collective(ALL_GATHER, self.axes, sent(ALL_GATHER, state.local_bytes, g)),)

    def backward(self, state: State) -> tuple[Collective, ...]:
        g = state.group(self.axes)
        return (Collective(PSUM_SCATTER, self.axes, sent(PSUM_SCATTER, state.local_bytes * g, g)),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (RowParallelScatter(self.step.transposed(), self.weight_split, self.axes),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str],
               perm: tuple[int, ...]) -> "GatherColumnParallel | None":
        action = super().mapped(steps, mesh, perm)
        return None if action is None else replace(action, axes=_named(self.axes, mesh))


@dataclass(frozen=True)
class RowParallel(TensorParallel):
    """On its axis split over `axes`: the weight's columns split the same way, local
    partial products, then a `psum` over `axes` (the output replicated)."""

    axes: tuple[str, ...]
    form = "row"

    def after(self, state: State) -> Layout:
        return _with(state.layout, self.axis, ())

    def forward(self, state: State) -> tuple[Collective, ...]:
        partial = _partial_sums(self.step, state, self.axis)
        return (Collective(PSUM, self.axes, sent(PSUM, partial, state.group(self.axes))),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (ColumnParallel(self.step.transposed(), self.weight_split),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "RowParallel | None":
        action = super().mapped(steps, mesh, perm)
        return None if action is None else replace(action, axes=_named(self.axes, mesh))


@dataclass(frozen=True)
class RowParallelScatter(RowParallel):
    """Row-parallel with a `psum_scatter` over `axes` instead: the output split as the
    input. Backward, an `all_gather`."""

    def after(self, state: State) -> Layout:
        return state.layout

    def forward(self, state: State) -> tuple[Collective, ...]:
        partial = _partial_sums(self.step, state, self.axis)
        return (Collective(PSUM_SCATTER, self.axes, sent(PSUM_SCATTER, partial, state.group(self.axes))),)

    def backward(self, state: State) -> tuple[Collective, ...]:
        g = state.group(self.axes)
        return (Collective(ALL_GATHER, self.axes, sent(ALL_GATHER, _partial_sums(self.step, state, self.axis) / g, g)),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (GatherColumnParallel(self.step.transposed(), self.weight_split, self.axes),)


@dataclass(frozen=True)
class AllToAll:
    """Move mesh axes `axes` (the minor end of tensor axis `src`) onto axis `dst`:
    first append `pad` zeros to `dst` (a whole axis its new split does not divide),
    after it crop `src` back to `crop` (if not 0: it was padded)."""

    axes: tuple[str, ...]
    src: int
    dst: int
    pad: int = 0
    crop: int = 0

    @staticmethod
    def candidates(here: State) -> Iterator["AllToAll"]:
        """Every move from `here`: the minor mesh axes of a split axis (all of them for a
        padded one, which is cropped) onto any other axis they divide, or may pad
        (`layout.pads`)."""
        layout = here.layout
        for src, axes in enumerate(layout):
            padded = here.padded(src) if axes else False
            for k in range(1, len(axes) + 1):
                if padded and k < len(axes):
                    continue  # a padded axis gives up its whole split, and is cropped
                moved = axes[-k:]
                g = here.group(moved)
                for dst, n in enumerate(here.sizes):
                    if dst == src:
                        continue
                    pad = -n % (here.splits[dst] * g)
                    if pad and not pads(n, here.splits[dst] * g, layout[dst]):
                        continue
                    yield AllToAll(moved, src, dst, pad, here.sizes[src] if padded and k == len(axes) else 0)

    def after(self, state: State) -> Layout:
        layout = list(state.layout)
        layout[self.src] = layout[self.src][:-len(self.axes)]
        layout[self.dst] += self.axes
        return tuple(layout)

    def collectives(self, state: State):
        g = state.group(self.axes)
        blocks = state.blocks
        operand = state.local_bytes / blocks[self.dst] * (blocks[self.dst] + self.pad)
        c = Collective(ALL_TO_ALL, self.axes, sent(ALL_TO_ALL, operand, g))
        return (c,), (c,)

    def transpose(self, before: State) -> tuple["Action", ...]:
        """The move back: padding becomes cropping and the other way round."""
        pad = before.blocks[self.src] * before.splits[self.src] - before.sizes[self.src] if self.crop else 0
        return (AllToAll(self.axes, self.dst, self.src, pad, before.sizes[self.dst] if self.pad else 0),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "AllToAll":
        """(`pad` and `crop` stay: `perm` moves axes only onto axes of their size.)"""
        return replace(self, axes=_named(self.axes, mesh), src=perm[self.src], dst=perm[self.dst])

    def describe(self, before: State) -> str:
        padding = f", axis {self.dst} padded with {self.pad} zeros" if self.pad else ""
        cropping = f", axis {self.src} cropped to {self.crop}" if self.crop else ""
        return (f"all_to_all {'+'.join(self.axes)}: axis {self.src} -> axis {self.dst}{padding}{cropping}"
                f"{traffic_text(*self.collectives(before), ALL_TO_ALL)}   -> {spec_of(self.after(before))}")


@dataclass(frozen=True)
class Split:
    """Cut the replicated tensor axis `dst` over the free mesh axes `axes` (a local
    slice; `pad` zeros appended first where they do not divide it). Backward, the
    gradient of the replicated input is summed over `axes`."""

    axes: tuple[str, ...]
    dst: int
    pad: int = 0

    @staticmethod
    def candidates(here: State) -> Iterator["Split"]:
        """Every split from `here`: each free mesh axis onto any tensor axis it divides, or
        may pad (`layout.pads`)."""
        used = set(here.varying)
        for name, size in here.mesh:
            if name in used or size == 1:
                continue
            for dst, n in enumerate(here.sizes):
                pad = -n % (here.splits[dst] * size)
                if pad and not pads(n, here.splits[dst] * size, here.layout[dst]):
                    continue
                yield Split((name,), dst, pad)

    def after(self, state: State) -> Layout:
        return tuple(axes + self.axes if a == self.dst else axes for a, axes in enumerate(state.layout))

    def collectives(self, state: State):
        blocks = state.blocks
        operand = state.local_bytes / blocks[self.dst] * (blocks[self.dst] + self.pad)
        return (), (Collective(PSUM, self.axes, sent(PSUM, operand, state.group(self.axes))),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (Gather(self.axes, self.dst, before.sizes[self.dst] if self.pad else 0),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "Split":
        return replace(self, axes=_named(self.axes, mesh), dst=perm[self.dst])

    def describe(self, before: State) -> str:
        padding = f", padded with {self.pad} zeros" if self.pad else ""
        return (f"split axis {self.dst} over {'+'.join(self.axes)} (local slice{padding})"
                f"{traffic_text(*self.collectives(before))}   -> {spec_of(self.after(before))}")


@dataclass(frozen=True)
class Gather:
    """The transpose of a `Split`: `all_gather` tensor axis `src` over `axes` (its minor
    mesh axes), then crop it to `crop` (if not 0). The gathered value is the same on
    every device of `axes`, so backward each takes its own slice: no collective."""

    axes: tuple[str, ...]
    src: int
    crop: int = 0

    def after(self, state: State) -> Layout:
        k = len(self.axes)
        return tuple(axes[:-k] if a == self.src else axes for a, axes in enumerate(state.layout))

    def collectives(self, state: State):
        return (Collective(ALL_GATHER, self.axes, sent(ALL_GATHER, state.local_bytes, state.group(self.axes))),), ()

    def transpose(self, before: State) -> tuple["Action", ...]:
        pad = before.blocks[self.src] * before.splits[self.src] - before.sizes[self.src] if self.crop else 0
        return (Split(self.axes, self.src, pad),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "Gather":
        return replace(self, axes=_named(self.axes, mesh), src=perm[self.src])

    def describe(self, before: State) -> str:
        return (f"all_gather axis {self.src} over {'+'.join(self.axes)}"
                f"{traffic_text(*self.collectives(before))}   -> {spec_of(self.after(before))}")


@dataclass(frozen=True)
class Permute:
    """Deal each device's block to the device that holds it in `layout`: a layout of the
    same mesh axes that cuts each tensor axis into as many pieces, in another order or on
    other tensor axes (one `ppermute` over those mesh axes, the whole block sent; its
    transpose deals them back). Moves that take only the minor end of an axis cannot
    make such a trade where no tensor axis can hold the mesh axes on the way: a tensor
    of (4, 8) on mesh axes (d0: 4, d1: 2) from `P('d0', 'd1')` to `P('d1', 'd0')`
    after a step that needs axis 0 whole.

    >>> here = State((4, 8, 2), ((), ("b", "a"), ()), 8, (("a", 2), ("b", 4)))
    >>> [p.layout for p in Permute.candidates(here)]
    [((), ('a', 'b'), ())]
    >>> [p.layout for p in Permute.candidates(State((4, 4), (("a",), ("b",)), 8, (("a", 2), ("b", 2))))]
    [(('b',), ('a',))]"""

    layout: Layout

    @staticmethod
    def candidates(here: State) -> Iterator["Permute"]:
        """Every other layout of `here`'s mesh axes that cuts each tensor axis into as many
        pieces (where the tensor is padded, only an order within its axes: the padding
        stays where it is)."""
        sizes = here.mesh_sizes

        def deals(a: int, left: tuple[str, ...]) -> Iterator[Layout]:
            if a == len(here.layout):
                if not left:
                    yield ()
                return
            if here.padded(a):
                options = itertools.permutations(here.layout[a])
            else:
                options = (axes for k in range(len(left) + 1) for axes in itertools.permutations(left, k)
                           if math.prod(sizes[n] for n in axes) == here.splits[a])
            for axes in options:
                rest = tuple(n for n in left if n not in axes)
                for tail in deals(a + 1, rest):
                    yield (axes,) + tail

        for layout in deals(0, here.varying):
            if layout != here.layout:
                yield Permute(layout)

    def after(self, state: State) -> Layout:
        return self.layout

    def collectives(self, state: State):
        c = Collective(PPERMUTE, self.mesh_axes(state), state.local_bytes)
        return (c,), (c,)

    @staticmethod
    def mesh_axes(state: State) -> tuple[str, ...]:
        """The mesh axes the `ppermute` runs over: those splitting the tensor, in the mesh's order."""
        used = set(state.varying)
        return tuple(n for n, _ in state.mesh if n in used)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (Permute(before.layout),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "Permute":
        layout = [()] * len(self.layout)
        for a, axes in enumerate(self.layout):
            layout[perm[a]] = _named(axes, mesh)
        return Permute(tuple(layout))

    def describe(self, before: State) -> str:
        return (f"ppermute {'+'.join(self.mesh_axes(before))}: blocks dealt anew"
                f"{traffic_text(*self.collectives(before), PPERMUTE)}   -> {spec_of(self.layout)}")


@dataclass(frozen=True)
class Branch:
    """A sum: each term's actions from the same layout, ending in one layout."""

    step: Step
    terms: tuple[tuple["Action", ...], ...]

    def collectives(self, state: State):
        return (), ()

    def transpose(self, before: State) -> tuple["Action", ...]:
        """Each term transposed, from the sum's output layout back to `before`'s."""
        from .plan import transpose_from  # the replay of a term lives with the plan

        return (Branch(self.step.transposed(), tuple(transpose_from(term, before) for term in self.terms)),)

    def mapped(self, steps: Mapping[int, Step], mesh: Mapping[str, str], perm: tuple[int, ...]) -> "Branch | None":
        terms = tuple(mapped_route(term, steps, mesh, perm) for term in self.terms)
        return None if None in terms else Branch(steps[id(self.step)], terms)

    def describe(self, before: State) -> str:
        return f"sum of {len(self.terms)} terms:"


@dataclass(frozen=True)
class Enter:
    """Marker in a search's route: the sum `step` starts (its first term follows)."""

    step: Step


@dataclass(frozen=True)
class NextTerm:
    """Marker in a search's route: the next term of the sum starts, from the sum's entry layout."""


@dataclass(frozen=True)
class Exit:
    """Marker in a search's route: the sum ends."""


def fold(items: list) -> tuple["Action", ...]:
    """A route's actions and sum markers as actions with `Branch`es."""
    out: list = []
    stack: list = []
    for item in items:
        if isinstance(item, Enter):
            stack.append((out, item.step, []))
            out = []
        elif isinstance(item, NextTerm):
            stack[-1][2].append(tuple(out))
            out = []
        elif isinstance(item, Exit):
            outer, step, terms = stack.pop()
            outer.append(Branch(step, tuple(terms) + (tuple(out),)))
            out = outer
        else:
            out.append(item)
    return tuple(out)


def mapped_route(actions: tuple["Action", ...], steps: Mapping[int, Step], mesh: Mapping[str, str],
                 perm: tuple[int, ...]) -> tuple["Action", ...] | None:
    """`actions` (folded: no sum markers) with each step `s` they run replaced by
    `steps[id(s)]` (an operator's route taken by another operator alike but for its
    weights' names, or its image under a symmetry), each mesh axis `m` they name
    renamed `mesh[m]` and each tensor axis `a` moved to `perm[a]`: each action's
    `mapped`. None where one of them cannot be mapped.

    >>> mapped_route((Split(("a",), 0), Gather(("a",), 0)), {}, {"a": "b"}, (1, 0))
    (Split(axes=('b',), dst=1, pad=0), Gather(axes=('b',), src=1, crop=0))"""
    out = tuple(action.mapped(steps, mesh, perm) for action in actions)
    return None if None in out else out


def _named(axes: tuple[str, ...], mesh: Mapping[str, str]) -> tuple[str, ...]:
    """Mesh axes `axes`, each `m` renamed `mesh[m]`."""
    return tuple(mesh[m] for m in axes)


Action = Union[StepAction, AllToAll, Split, Gather, Permute, Branch]
ACTIONS = (Local, ReducePsum, HaloExchange, ColumnParallel, GatherColumnParallel, RowParallel, RowParallelScatter,
           AllToAll, Split, Gather, Permute, Branch)  # every kind of action, as a plan's JSON names them
