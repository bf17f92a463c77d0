"""The actions of a plan. Each kind of action is one class that knows its layout
effect (`after`), its collectives forward and, for `jax.grad`, backward
(`collectives`), its transpose (`transpose`: the actions of the adjoint) and how a
plan shows it (`describe`); its lowering is registered in `lower.py` (`run_action`).

A plan is a list of actions from the input layout to the output layout:

- `Local`: run a step on each device's block (its axes as it needs them), with a
  collective after it where the step sums over a split axis (`psum`, `psum_scatter`),
  or an `all_gather` before it (the transpose of a `psum_scatter`);
- `AllToAll`: move the minor mesh axes of one tensor axis to another;
- `Split`: cut a replicated tensor axis over free mesh axes (a local slice);
- `Gather`: its transpose, an `all_gather`;
- `Branch`: a sum, each term's actions from the same layout to a common one.

`State` is what the planner knows of the tensor between two actions: global sizes,
layout, itemsize. Every method takes the state the action starts in, so the search and
the replay of a finished plan compute alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Union

import numpy as np

from ...operators import Role
from ..layout import Layout, spec_of
from .cost import ALL_GATHER, ALL_TO_ALL, PPERMUTE, PSUM, PSUM_SCATTER, Collective, sent, traffic_text
from .program import Step


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
class Local:
    """Run `step` on each device's block. `psum`: mesh axes to sum over after it (a
    `Reduce` over a split axis, or a row-parallel `Matrix`), as a `psum_scatter` if
    `scatter`. `gather`: mesh axes to `all_gather` its (split) input axis over first.
    `weight_split`: the mesh axes splitting each weight axis of a sharded `Matrix`
    (None: the weight is split as the tensor axes it runs along). `halo`: the split
    tensor axes of a stencil whose neighbouring planes come from the neighbouring
    devices first (a halo exchange: a `ppermute` each way)."""

    step: Step
    psum: tuple[str, ...] = ()
    scatter: bool = False
    gather: tuple[str, ...] = ()
    weight_split: tuple[tuple[str, ...], ...] | None = None
    halo: tuple[int, ...] = ()

    def halo_width(self, a: int) -> int:
        """The planes a halo exchange brings from each neighbour along tensor axis `a`."""
        return self.step.leaf.halo_width(a - self.step.axes[0])

    def after(self, state: State) -> Layout:
        a = self.step.axes[0] if self.step.axes else None
        layout = list(state.layout)
        if self.weight_split is not None:
            out_ax, _ = self.step.leaf.dense_axes
            layout[a] = self.weight_split[out_ax] if not self.scatter else layout[a]
            if self.psum and not self.scatter:
                layout[a] = ()
        elif self.psum:
            for b, role in zip(self.step.axes, self.step.roles):
                if role is Role.REDUCE:
                    layout[b] = ()
        return tuple(layout)

    def weight_spec(self, state: State) -> tuple[tuple[str, ...], ...] | None:
        """The mesh axes splitting each weight axis where this step runs (None: no
        weight)."""
        leaf = self.step.leaf
        if leaf is None or leaf.param_shape is None:
            return None
        if self.weight_split is not None:
            return self.weight_split
        first = self.step.axes[0]
        return tuple(() if a is None else state.layout[first + a] for a in leaf.param_axes)

    def collectives(self, state: State) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
        fwd, bwd = [], []
        step = self.step
        if self.gather:
            g = state.group(self.gather)
            fwd.append(Collective(ALL_GATHER, self.gather, sent(ALL_GATHER, state.local_bytes, g)))
            bwd.append(Collective(PSUM_SCATTER, self.gather, sent(PSUM_SCATTER, state.local_bytes * g, g)))
        if self.psum:
            g = state.group(self.psum)
            a = step.axes[0] if self.weight_split is not None else next(
                b for b, r in zip(step.axes, step.roles) if r is Role.REDUCE)
            i = step.axes.index(a)
            # the block of partial sums: the local block with axis `a` at its output size
            partial = state.local_bytes / state.blocks[a] * step.out_sizes[i] * step.out_dtype.itemsize / step.in_dtype.itemsize
            if self.scatter:
                fwd.append(Collective(PSUM_SCATTER, self.psum, sent(PSUM_SCATTER, partial, g)))
                bwd.append(Collective(ALL_GATHER, self.psum, sent(ALL_GATHER, partial / g, g)))
            else:
                fwd.append(Collective(PSUM, self.psum, sent(PSUM, partial, g)))
        for a in self.halo:  # each way: the neighbour's planes forward, their gradient back
            planes = state.local_bytes / state.blocks[a] * self.halo_width(a)
            both = (Collective(PPERMUTE, state.layout[a], planes),) * 2
            fwd += both
            bwd += both
        if self.weight_split is not None and not self.psum and not self.gather and step.axes:
            # column-parallel: the replicated input's gradient is summed over the new split
            out_ax, _ = step.leaf.dense_axes
            axes = self.weight_split[out_ax]
            bwd.append(Collective(PSUM, axes, sent(PSUM, state.local_bytes, state.group(axes))))
        bwd += weight_gradient(self, state)
        return tuple(fwd), tuple(bwd)

    def transpose(self, before: State) -> tuple["Action", ...]:
        """The actions of the adjoint step (from this action's output back to `before`):
        a `Reduce`'s psum becomes a broadcast and a split; a row-parallel `Matrix` a
        column-parallel one, its `psum_scatter` an `all_gather`; and back."""
        step, ws = self.step.transposed(), self.weight_split
        if ws is None and self.psum:  # a Reduce's psum: broadcast, then split again
            a = next(b for b, r in zip(self.step.axes, self.step.roles) if r is Role.REDUCE)
            return Local(step), Split(self.psum, a, -before.sizes[a] % before.group(self.psum))
        if ws is None:
            return (Local(step, halo=self.halo),)
        if self.gather:
            return (Local(step, psum=self.gather, scatter=True, weight_split=ws),)
        if self.scatter:
            return (Local(step, gather=self.psum, weight_split=ws),)
        if self.psum:
            return (Local(step, weight_split=ws),)
        out_ax, _ = self.step.leaf.dense_axes
        return (Local(step, psum=ws[out_ax], weight_split=ws),)

    def describe(self, before: State) -> str:
        where = f" on axis {self.step.axes[0]}" if len(self.step.axes) == 1 else (
            f" on axes {self.step.axes}" if self.step.axes else "")
        if self.halo:
            where += ", halo exchange on axis " + ", ".join(f"{a} over {'+'.join(before.layout[a])}" for a in self.halo)
        if self.weight_split is not None:
            form = "row" if self.psum else "column"
            axes = "+".join(n for part in self.weight_split for n in part)
            where += f", {form}-parallel: weight split over {axes}"
        after = self.after(before)
        moved = f"   -> {spec_of(after)}" if after != before.layout else ""
        return f"{self.step.label()}{where}{traffic_text(*self.collectives(before))}{moved}"


def weight_gradient(action: Local, state: State) -> list[Collective]:
    """The collectives of the weight's gradient where `action` uses it: an all-reduce over
    the devices that hold the same piece of it but different data, and, for a weight
    along a padded axis (kept whole there: a sharding must divide the array), the
    gather of its gradient's pieces."""
    spec = action.weight_spec(state)
    if spec is None:
        return []
    leaf = action.step.leaf
    first = action.step.axes[0] if action.step.axes else 0
    padded = {first + a for a in leaf.param_axes if a is not None and state.padded(first + a)}
    along_padded = tuple(n for w, axes in enumerate(spec) for n in axes
                         if leaf.param_axes[w] is not None and first + leaf.param_axes[w] in padded)
    held = tuple(n for axes in spec for n in axes)
    memory = math.prod(leaf.param_shape) * np.dtype(leaf.param_dtype).itemsize
    piece = memory / state.group(held)
    replicas = tuple(n for n in state.varying if n not in held)
    out = []
    if state.group(replicas) > 1:
        out.append(Collective(PSUM, replicas, sent(PSUM, piece, state.group(replicas))))
    if along_padded:
        out.append(Collective(ALL_GATHER, along_padded, sent(ALL_GATHER, piece, state.group(along_padded))))
    return out


def weight_bytes_held(action: Local, state: State) -> float:
    """The bytes of the weight one device holds where `action` uses it."""
    spec = action.weight_spec(state)
    if spec is None:
        return 0.0
    leaf = action.step.leaf
    first = action.step.axes[0] if action.step.axes else 0
    kept = tuple(n for w, axes in enumerate(spec) for n in axes
                 if leaf.param_axes[w] is None or not state.padded(first + leaf.param_axes[w]))
    return math.prod(leaf.param_shape) * np.dtype(leaf.param_dtype).itemsize / state.group(kept)


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

    def after(self, state: State) -> Layout:
        k = len(self.axes)
        return tuple(axes[:-k] if a == self.src else axes + self.axes if a == self.dst else axes
                     for a, axes in enumerate(state.layout))

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

    def after(self, state: State) -> Layout:
        return tuple(axes + self.axes if a == self.dst else axes for a, axes in enumerate(state.layout))

    def collectives(self, state: State):
        blocks = state.blocks
        operand = state.local_bytes / blocks[self.dst] * (blocks[self.dst] + self.pad)
        return (), (Collective(PSUM, self.axes, sent(PSUM, operand, state.group(self.axes))),)

    def transpose(self, before: State) -> tuple["Action", ...]:
        return (Gather(self.axes, self.dst, before.sizes[self.dst] if self.pad else 0),)

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

    def describe(self, before: State) -> str:
        return (f"all_gather axis {self.src} over {'+'.join(self.axes)}"
                f"{traffic_text(*self.collectives(before))}   -> {spec_of(self.after(before))}")


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

    def describe(self, before: State) -> str:
        return f"sum of {len(self.terms)} terms:"


Action = Union[Local, AllToAll, Split, Gather, Branch]
