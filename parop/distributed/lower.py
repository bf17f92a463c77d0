"""Lowering: a `Plan` becomes one `jax.shard_map` program inside one `jax.jit`.

This is the only place that calls `shard_map` and collectives. Each parameter enters
the program once per layout it is used in, with the `PartitionSpec` of the axes it
runs along (replicated where the operator needs it whole), so JAX places it once and
sums the gradient of a replicated weight over the devices. Traced scalars (`c * A`
with `c` a JAX array) enter as replicated inputs, so a new value reuses the program.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ..algebra import conj, times
from ..operators import dft
from .layout import layout_of, spec_of, split_sizes
from .plan import Plan, Slot, Visit, walk
from .plan.actions import (AllToAll, Branch, ColumnParallel, Gather, GatherColumnParallel, HaloExchange, Local,
                           Permute, ReducePsum, RowParallel, RowParallelScatter, Split, StepAction)

WeightKey = tuple[str, PartitionSpec]


def weight_specs(plan: Plan) -> list[WeightKey]:
    """`(name, spec)` for each parameter input of the program, in order: the layout of
    the axes each weight runs along where its leaf runs."""
    seen: list[WeightKey] = []
    for visit in walk(plan.visits):
        key = _weight_key(visit)
        if key is not None and key not in seen:
            seen.append(key)
    return seen


def _weight_key(visit: Visit) -> WeightKey | None:
    action = visit.action
    if not isinstance(action, StepAction):
        return None
    spec = action.weight_spec(visit.before)
    return None if spec is None else (action.step.leaf.name, spec_of(spec))


def _leaf_axis(visit: Visit):
    """A local step's leaf and its first axis, for `dft.fused_runs` (None for no leaf)."""
    action = visit.action
    leaf = action.step.leaf if isinstance(action, Local) else None
    return None if leaf is None else (leaf, action.step.axes[0])


def _run(visits, x: jax.Array, weights: dict, scalars: tuple, mesh: Mesh) -> jax.Array:
    for visit in dft.fused_runs(visits, _leaf_axis):
        if isinstance(visit, list):
            x = dft.apply_fused(visit, x)
        else:
            x = run_action(visit.action, visit, x, weights, scalars, mesh)
    return x


@functools.singledispatch
def run_action(action, visit: Visit, x: jax.Array, weights: dict, scalars: tuple, mesh: Mesh) -> jax.Array:
    """Action `action` (from `visit.before`) on each device's block `x`: one registered
    function per kind of action."""
    raise TypeError(f"no lowering for the action {action!r}")


@run_action.register
def _(action: AllToAll, visit, x, weights, scalars, mesh):
    x = _pad(x, action.dst, action.pad)
    x = _all_to_all(x, _names(action.axes), action.dst, action.src)
    return lax.slice_in_dim(x, 0, action.crop, axis=action.src) if action.crop else x


@run_action.register
def _(action: Split, visit, x, weights, scalars, mesh):
    x = _pad(x, action.dst, action.pad)
    size = x.shape[action.dst] // visit.before.group(action.axes)
    return lax.dynamic_slice_in_dim(x, lax.axis_index(_names(action.axes)) * size, size, axis=action.dst)


@run_action.register
def _(action: Gather, visit, x, weights, scalars, mesh):
    # invariant: the gathered axis is whole on every device of `axes`, as the layout says
    # (shard_map then sees the output replicated there), and its transpose is the local
    # slice of the `Split` it undoes, not a `psum_scatter`
    x = lax.all_gather(x, _names(action.axes), axis=action.src, tiled=True, to="invarying")
    return lax.slice_in_dim(x, 0, action.crop, axis=action.src) if action.crop else x


@run_action.register
def _(action: Permute, visit, x, weights, scalars, mesh):
    before = visit.before
    axes = action.mesh_axes(before)
    sizes = before.mesh_sizes
    pairs = []
    for index in range(before.group(axes)):  # `ppermute`'s numbering: the mesh's order, the first axis major
        coords = dict(zip(axes, _digits(index, [sizes[n] for n in axes])))
        blocks = [_number([coords[n] for n in on], [sizes[n] for n in on]) for on in before.layout]
        target = {}
        for on, block in zip(action.layout, blocks):
            target.update(zip(on, _digits(block, [sizes[n] for n in on])))
        pairs.append((index, _number([target[n] for n in axes], [sizes[n] for n in axes])))
    return lax.ppermute(x, _names(axes), pairs)


def _digits(index: int, radices: list[int]) -> list[int]:
    """`index`'s digits in the mixed radix `radices` (the first most significant)."""
    out = []
    for r in reversed(radices):
        index, d = divmod(index, r)
        out.append(d)
    return out[::-1]


def _number(digits: list[int], radices: list[int]) -> int:
    """The number of `digits` in the mixed radix `radices` (the first most significant)."""
    index = 0
    for d, r in zip(digits, radices):
        index = index * r + d
    return index


@run_action.register
def _(action: Branch, visit, x, weights, scalars, mesh):
    terms = [_run(term, x, weights, scalars, mesh) for term in visit.terms]
    return functools.reduce(lambda a, b: a + b, terms)


def _step(visit: Visit, x: jax.Array, weights: dict, scalars: tuple) -> jax.Array:
    """The step of `visit.action` on each device's block, alone."""
    step = visit.action.step
    if step.conj:
        return conj(x)
    if step.leaf is None:
        c = step.scalar
        if isinstance(c, Slot):
            c = conj(scalars[c.index]) if c.conj else scalars[c.index]
        return times(c, x)
    return step.leaf._forward(_weight(visit, weights), x, step.axes[0])


def _weight(visit: Visit, weights: dict) -> jax.Array | None:
    """The weight the step of `visit` takes (None: it has none), varying over the mesh
    axes the data varies over (the layout's) where it does not hold a piece of its own.
    It is marked so once per program for each such set of mesh axes (kept in `weights`,
    the program's own dict), and as a whole, so that JAX's transpose sums its gradient
    in one `psum` per set, however many steps use it there (a weight and its adjoint)
    and however many pieces of it a step uses (a stencil's taps, a complex kernel's real
    and imaginary parts), as the plan counts."""
    key = _weight_key(visit)
    if key is None:
        return None
    held = {n for axes in visit.action.weight_spec(visit.before) for n in axes}
    missing = tuple(n for n in visit.before.varying if n not in held)
    if not missing:
        return weights[key]
    marked = (key, frozenset(missing))
    if marked not in weights:
        weights[marked] = lax.pcast(weights[key], missing, to="varying")
    return weights[marked]


@run_action.register(Local)
@run_action.register(ColumnParallel)
def _(action, visit, x, weights, scalars, mesh):
    return _step(visit, x, weights, scalars)


@run_action.register(ReducePsum)
@run_action.register(RowParallel)
def _(action, visit, x, weights, scalars, mesh):
    return lax.psum(_step(visit, x, weights, scalars), _names(action.axes))


@run_action.register
def _(action: RowParallelScatter, visit, x, weights, scalars, mesh):
    x = _step(visit, x, weights, scalars)
    return lax.psum_scatter(x, _names(action.axes), scatter_dimension=action.axis, tiled=True)


@run_action.register
def _(action: GatherColumnParallel, visit, x, weights, scalars, mesh):
    return _step(visit, lax.all_gather(x, _names(action.axes), axis=action.axis, tiled=True), weights, scalars)


@run_action.register
def _(action: HaloExchange, visit, x, weights, scalars, mesh):
    return _stencil(visit, _weight(visit, weights), x)


def _all_to_all(x: jax.Array, names, split: int, concat: int) -> jax.Array:
    """`lax.all_to_all` between optimisation barriers, in the forward pass and (as the
    barrier's transpose is a barrier) in the backward pass: XLA:CPU's simplifier splits
    an all-to-all whose input is partly a broadcast (a `Restriction`'s zero padding in a
    pullback) into operands of different layouts and fails its own verifier."""
    x = lax.all_to_all(lax.optimization_barrier(x), names, split_axis=split, concat_axis=concat, tiled=True)
    return lax.optimization_barrier(x)


def _stencil(visit: Visit, w, x: jax.Array) -> jax.Array:
    """A stencil on a block whose split axes get their halos from the neighbouring
    devices (one after the other, so the corners come along) and whose whole axes are
    padded locally; then its valid part."""
    action, step = visit.action, visit.action.step
    leaf, axis = step.leaf.leaf, step.axes[0]
    spatial = axis + leaf.grid_offset
    whole = [a - spatial for a in range(spatial, spatial + len(leaf.halo)) if a not in action.axes]
    x = leaf.extend(x, axis, whole)
    for a in action.axes:
        x = _exchange(x, a, action.halo_width(a), visit.before.layout[a], visit.before.mesh,
                      leaf.boundary == "periodic")
    return leaf._valid(w, x, axis, adjoint=step.leaf is not leaf)


def _exchange(x: jax.Array, axis: int, width: int, axes: tuple[str, ...], mesh: tuple[tuple[str, int], ...],
              periodic: bool) -> jax.Array:
    """`x` with `width` planes of each neighbour along `axis` (split over `axes`) on
    either side: the ring's wrap-around if `periodic`, zeros at the ends otherwise."""
    n = x.shape[axis]
    devices = math.prod(dict(mesh)[name] for name in axes)
    ring = [(i, (i + 1) % devices) for i in range(devices) if periodic or i + 1 < devices]
    ring = [(_ppermute_index(i, axes, mesh), _ppermute_index(j, axes, mesh)) for i, j in ring]
    back = [(j, i) for i, j in ring]
    left = lax.ppermute(lax.slice_in_dim(x, n - width, n, axis=axis), _names(axes), ring)
    right = lax.ppermute(lax.slice_in_dim(x, 0, width, axis=axis), _names(axes), back)
    return jnp.concatenate([left, x, right], axis=axis)


def _ppermute_index(block: int, axes: tuple[str, ...], mesh: tuple[tuple[str, int], ...]) -> int:
    """The index `lax.ppermute` gives the device holding `block` of an axis split over
    `axes` (the first of them major, as in a layout and in `lax.axis_index(axes)`):
    `ppermute` numbers a group of mesh axes in the mesh's order, whatever their order
    in `axes`."""
    sizes = dict(mesh)
    digits = dict(zip(axes, _digits(block, [sizes[n] for n in axes])))
    order = [n for n, _ in mesh if n in digits]
    return _number([digits[n] for n in order], [sizes[n] for n in order])


def _names(axes: tuple[str, ...]):
    return axes if len(axes) > 1 else axes[0]


def _pad(x: jax.Array, axis: int, count: int) -> jax.Array:
    """`x` with `count` zeros appended along `axis`."""
    if not count:
        return x
    return jnp.pad(x, [(0, count if a == axis else 0) for a in range(x.ndim)])


def _weight_layout(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh):
    """The layout `spec` gives a weight of `shape`, and how many pieces each axis is cut into."""
    layout = layout_of(spec, len(shape), mesh, "a weight")
    return layout, split_sizes(layout, mesh.shape)


def stored_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Where a weight that the program takes as `spec` is kept: the same, but whole
    along axes that `spec` splits unevenly (a sharding must divide the array; the
    program pads such a weight with zeros and slices it locally)."""
    layout, splits = _weight_layout(spec, shape, mesh)
    return spec_of(tuple(axes if n % p == 0 else () for axes, n, p in zip(layout, shape, splits)))


def _padded_weight(w: jax.Array, spec: PartitionSpec, mesh: Mesh) -> jax.Array:
    """`w` padded with zeros to a multiple of its split along every axis of `spec`."""
    _, splits = _weight_layout(spec, w.shape, mesh)
    for axis, p in enumerate(splits):
        w = _pad(w, axis, -w.shape[axis] % p)
    return w


def explicit(mesh: Mesh) -> bool:
    """Whether the mesh's axes are Explicit (parop's meshes are all Auto or all Explicit)."""
    return all(t == AxisType.Explicit for t in mesh.axis_types)


def placer(mesh: Mesh) -> Callable:
    """How to pin an array to a sharding inside `jit` on this mesh."""
    return jax.sharding.reshard if explicit(mesh) else lax.with_sharding_constraint


def lower(plan: Plan, mesh: Mesh) -> tuple[Callable, list[WeightKey]]:
    """The jitted program `f(x, *weights, scalars=()) -> y` for `plan` (`weights` in the
    order of the returned `(name, spec)` list, `scalars` the operator's traced scalars)."""
    specs = weight_specs(plan)
    in_spec, out_spec = spec_of(plan.in_layout), spec_of(plan.out_layout)
    visits = plan.visits
    place = placer(mesh)

    def body(x, ws, scalars):
        return _run(visits, x, dict(zip(specs, ws)), scalars, mesh)

    def stored(w, spec):
        """`w` where it is kept (`stored_spec`): pinned here, so that backward its gradient
        leaves the program there too. Split unevenly, a weight is kept whole along that
        axis and its gradient's pieces are gathered once, here; left free, XLA gathered
        the optimiser's update of it instead, an all-gather per array it updates (Adam:
        three)."""
        kept = stored_spec(spec, w.shape, mesh)
        return w if kept == spec else place(w, NamedSharding(mesh, kept))

    def run(x, *ws, scalars=()):
        program = jax.shard_map(
            body, mesh=mesh, out_specs=out_spec,
            in_specs=(in_spec, [s for _, s in specs], [PartitionSpec()] * len(scalars)),
        )
        x = place(x, NamedSharding(mesh, in_spec))
        ws = [place(_padded_weight(stored(w, s), s, mesh), NamedSharding(mesh, s)) for w, (_, s) in zip(ws, specs)]
        return program(x, ws, list(scalars))

    return jax.jit(run), specs
