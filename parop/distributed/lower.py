"""Lowering: a `Plan` becomes one `jax.shard_map` program inside one `jax.jit`.

This is the only place that calls `shard_map` and collectives. Each parameter enters
the program once per layout it is used in, with the `PartitionSpec` of the axes it
runs along (replicated where the operator needs it whole), so JAX places it once and
sums the gradient of a replicated weight over the devices.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ..operators import dft
from .layout import layout_of, spec_of, split_sizes
from .plan import Action, AllToAll, Branch, Local, Plan, Split, _walk


def weight_specs(plan: Plan) -> list[tuple[str, PartitionSpec]]:
    """`(name, spec)` for each parameter input of the program, in order: the layout of
    the axes each weight runs along where its leaf runs."""
    seen: list[tuple[str, PartitionSpec]] = []
    for action in _walk(plan.actions):
        if isinstance(action, Local) and action.step.leaf is not None and action.step.leaf.param_shape:
            key = (action.step.leaf.name, _spec(action, action.step.leaf))
            if key not in seen:
                seen.append(key)
    return seen


def _fuse_ffts(actions: tuple[Action, ...]) -> list:
    """`actions` with each run of consecutive local DFTs (see `dft.fusable`) as one
    list `[(leaf, axis), ...]`, which runs as a single multi-axis FFT."""
    out: list = []
    for action in actions:
        leaf = action.step.leaf if isinstance(action, Local) and not action.psum else None
        axis = action.step.axes[0] if leaf is not None else None
        if leaf is not None and out and isinstance(out[-1], list) and dft.fusable(out[-1], leaf, axis):
            out[-1].append((leaf, axis))
        elif leaf is not None and dft.fusable([], leaf, axis):
            out.append([(leaf, axis)])
        else:
            out.append(action)
    return out


def _run(actions: tuple[Action, ...], x: jax.Array, weights: dict, mesh: Mesh) -> jax.Array:
    for action in _fuse_ffts(actions):
        if isinstance(action, list):
            x = dft.apply_fused(action, x)
            continue
        if isinstance(action, AllToAll):
            name = action.axes if len(action.axes) > 1 else action.axes[0]
            x = _pad(x, action.dst, action.pad)
            x = lax.all_to_all(x, name, split_axis=action.dst, concat_axis=action.src, tiled=True)
            if action.crop:
                x = lax.slice_in_dim(x, 0, action.crop, axis=action.src)
        elif isinstance(action, Split):
            size = x.shape[action.dst] // mesh.shape[action.axis]
            start = lax.axis_index(action.axis) * size
            x = lax.dynamic_slice_in_dim(x, start, size, axis=action.dst)
        elif isinstance(action, Branch):
            terms = [_run(term, x, weights, mesh) for term in action.terms]
            x = terms[0]
            for t in terms[1:]:
                x = x + t
        else:
            step = action.step
            if step.leaf is None:
                x = step.c * x
                continue
            leaf = step.leaf
            w = weights.get((leaf.name, _spec(action, leaf))) if leaf.param_shape else None
            x = leaf._forward(w, x, step.axes[0])
            if action.scatter:
                x = lax.psum_scatter(x, action.psum, scatter_dimension=step.axes[0], tiled=True)
            elif action.psum:
                x = lax.psum(x, action.psum)
    return x


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


def _spec(action: Local, leaf) -> PartitionSpec:
    """The spec of `leaf`'s weight where `action` runs it: as the plan shards it (tensor
    parallelism), else each weight axis split as the tensor axis it runs along, and
    replicated where the leaf needs it whole."""
    if action.weight_split is not None:
        return spec_of(action.weight_split)
    first = action.step.axes[0]
    return spec_of(tuple(() if a is None else action.layout[first + a] for a in leaf.param_axes))


def _placer(mesh: Mesh) -> Callable:
    """How to pin an array to a sharding inside `jit` on this mesh."""
    if all(t == AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard
    return lax.with_sharding_constraint


def lower(plan: Plan, mesh: Mesh) -> tuple[Callable, list[tuple[str, PartitionSpec]]]:
    """The jitted program `f(x, *weights) -> y` for `plan`, and the `(name, spec)` of the
    weights it takes."""
    specs = weight_specs(plan)
    in_spec, out_spec = spec_of(plan.in_layout), spec_of(plan.out_layout)
    place = _placer(mesh)

    def body(x, *ws):
        return _run(plan.actions, x, dict(zip(specs, ws)), mesh)

    program = jax.shard_map(
        body, mesh=mesh, in_specs=(in_spec, *(s for _, s in specs)), out_specs=out_spec
    )

    @jax.jit
    def run(x, *ws):
        x = place(x, NamedSharding(mesh, in_spec))
        ws = [place(_padded_weight(w, s, mesh), NamedSharding(mesh, s)) for w, (_, s) in zip(ws, specs)]
        return program(x, *ws)

    return run, specs
