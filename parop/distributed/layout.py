"""Layouts: which mesh axes split which tensor axis, and the checks on partitions and
meshes that users give.

A *layout* is a tuple with one entry per tensor axis: the mesh axes that split it,
major first (`(("d0",), (), ("d2", "d1"))`); a mesh axis named nowhere holds the data
replicated. It reads as a `PartitionSpec` (`spec_of`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from .._checks import is_axes, positive_int

Layout = tuple[tuple[str, ...], ...]


def spec_of(layout: Layout) -> PartitionSpec:
    """The `PartitionSpec` of a layout."""
    return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in layout))


def layout_of(spec: PartitionSpec, ndim: int, mesh: Mesh, where: str, what: str = "an input") -> Layout:
    """The layout a `PartitionSpec` describes on `ndim` axes of `what`, checked against `mesh`."""
    entries = tuple(spec)
    if len(entries) > ndim:
        raise ValueError(f"{where}: {spec} has {len(entries)} entries for {what} of {ndim} axes")
    for i, e in enumerate(entries):
        if not (e is None or isinstance(e, str) or (isinstance(e, tuple) and all(isinstance(n, str) for n in e))):
            raise ValueError(
                f"{where}: entry {i} of {spec} is {e!r}; parop takes None, a mesh axis name, or a "
                "tuple of names per axis (not PartitionSpec.UNCONSTRAINED: the planner fixes every layout)"
            )
    layout = tuple(() if e is None else (e,) if isinstance(e, str) else e for e in entries)
    layout += ((),) * (ndim - len(layout))
    names = [n for axes in layout for n in axes]
    unknown = [n for n in names if n not in mesh.shape]
    if unknown:
        raise ValueError(f"{where}: {spec} names {unknown}, not axes of the mesh {dict(mesh.shape)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: {spec} uses a mesh axis twice")
    return layout


def layouts(sizes: tuple[int, ...], mesh: list[tuple[str, int]]) -> list[Layout]:
    """Every layout of a tensor of `sizes` that splits it evenly over exactly the mesh axes
    `mesh` (`(name, size)`), in every order."""
    return list(dict.fromkeys(_placed([() for _ in sizes], list(mesh), sizes, dict(mesh))))


def _placed(layout: list, rest: list, sizes: tuple[int, ...], mesh: dict[str, int]) -> Iterator[Layout]:
    """The layouts of `layouts` that extend `layout` (a list it changes and restores) with
    the mesh axes `rest`."""
    if not rest:
        yield tuple(layout)
        return
    for k, (name, size) in enumerate(rest):
        for a, n in enumerate(sizes):
            if n % (math.prod(mesh[m] for m in layout[a]) * size) == 0:
                layout[a] = layout[a] + (name,)
                yield from _placed(layout, rest[:k] + rest[k + 1:], sizes, mesh)
                layout[a] = layout[a][:-1]


def pads(n: int, split: int, axes: tuple) -> bool:
    """Whether an axis of size `n`, split over `axes` now, may take a split into `split`
    pieces by padding with zeros: only a whole axis, to less than twice its size (every
    device but the last holds data)."""
    return not axes and -n % split < n


def check_mesh(mesh: Mesh | AbstractMesh | None, where: str) -> None:
    """A `TypeError` if `mesh` is neither `None` nor a `jax.sharding.Mesh` (or an
    `AbstractMesh`: a mesh shape to plan on, without devices); a `ValueError` naming
    the axes if it has `Manual` axes, or mixes `Explicit` and `Auto` ones: parop's
    program pins its layouts with `with_sharding_constraint` (all-Auto meshes) or
    `reshard` (all-Explicit meshes), and runs as a `shard_map` over the mesh."""
    if mesh is None:
        return
    if not isinstance(mesh, (Mesh, AbstractMesh)):
        raise TypeError(f"{where}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__} {mesh!r}")
    kinds = {t: [n for n, u in zip(mesh.axis_names, mesh.axis_types) if u == t] for t in AxisType}
    if kinds[AxisType.Manual]:
        raise ValueError(
            f"{where}: mesh axes {kinds[AxisType.Manual]} are Manual (as inside a shard_map); parop's "
            "program is itself a shard_map over the mesh: give a mesh whose axes are all Auto or all Explicit"
        )
    if kinds[AxisType.Explicit] and kinds[AxisType.Auto]:
        raise ValueError(
            f"{where}: the mesh mixes Explicit axes {kinds[AxisType.Explicit]} and Auto axes "
            f"{kinds[AxisType.Auto]}; parop supports meshes whose axes are all Auto or all Explicit"
        )


def context_mesh() -> Mesh | AbstractMesh | None:
    """The mesh `jax.set_mesh` has set around this call, if any: `po.distribute` given no
    `mesh=` runs there (a `shard_map` runs only on the context mesh). Under `jax.jit` JAX
    gives only the context's abstract mesh, and under `jax.sharding.use_abstract_mesh`
    there is only a shape: that `AbstractMesh` is returned then (an operator planned on
    it runs under a `jax.set_mesh` of devices of its shape, `DistributedOperator.program`)."""
    try:
        mesh = jax.sharding.get_mesh()
    except ValueError:  # under jax.jit
        mesh = None
    if mesh is None or mesh.empty:  # under jax.jit, or jax.sharding.use_abstract_mesh: a mesh shape
        mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def left_out(source: Layout, target: Layout) -> set[str]:
    """The mesh axes `source` splits over and `target` does not: a move from one to the
    other gathers them (or a step sums them away).

    >>> sorted(left_out((("a",), ("b", "c")), (("c",), ())))
    ['a', 'b']"""
    return {n for axes in source for n in axes} - {n for axes in target for n in axes}


def split_sizes(layout: Layout, mesh_shape) -> tuple[int, ...]:
    """How many pieces each tensor axis is cut into."""
    return tuple(math.prod(mesh_shape[n] for n in axes) for axes in layout)


def check_partition(partition, where: str, what: str = "partition") -> tuple[int, ...]:
    """`partition` (a tuple, a list or a 1-D NumPy array of positive ints) as a tuple of
    ints, or a `ValueError` naming `what` and the entry.

    >>> check_partition(np.array([2, 1]), "distribute")
    (2, 1)"""
    if not is_axes(partition):
        raise ValueError(f"{where}: {what} must be a tuple of positive ints or a PartitionSpec, got {partition!r}")
    return tuple(positive_int(p, f"{what} entry {i}", where) for i, p in enumerate(partition))


def mesh_name(axis: int) -> str:
    """The name of the mesh axis that splits tensor axis `axis` in a default mesh."""
    return f"d{axis}"


def check_devices(partition: tuple[int, ...], where: str, devices: Sequence | None = None) -> int:
    """The devices `partition` splits over, or a `ValueError` naming `where` if there are
    fewer among `devices` (default: `jax.devices()`; there, where JAX's default backend is
    not the CPU and the CPU has enough, it says how to use the CPU's: a machine with one GPU
    and forced host devices)."""
    total, available = math.prod(partition), len(jax.devices() if devices is None else devices)
    if total > available:
        backend = jax.default_backend()
        cpus = _cpu_devices() if backend != "cpu" and devices is None else 0
        hint = (f" on {backend} (the CPU has {cpus}: set JAX_PLATFORMS=cpu, or pass a mesh= over jax.devices('cpu'))"
                if cpus >= total else "")
        raise ValueError(f"{where}: partition {partition} needs {total} devices, but {available} are available{hint}")
    return total


def _cpu_devices() -> int:
    """How many CPU devices JAX has (0 where its CPU backend is not started: JAX_PLATFORMS
    names others only)."""
    try:
        return len(jax.devices("cpu"))
    except RuntimeError:
        return 0


def default_mesh(partition: tuple[int, ...], where: str, regroup: tuple[int, ...] | None = None,
                 devices: Sequence | None = None) -> tuple[Mesh, Layout]:
    """A mesh over the first `prod(partition)` of `devices` (default: `jax.devices()`), one
    mesh axis (`d{i}`) per split tensor axis, and the input layout it gives. Where an
    output partition `regroup` cannot be made of those mesh axes (`(8, 1, 1)` to
    `(2, 2, 2)`), each is cut into its prime factors (`d0`, `d0_1`, `d0_2`: one tensor
    axis split over several mesh axes), which can be regrouped into any counts of the
    same product.

    >>> mesh, layout = default_mesh((2, 1, 4), "example", devices=jax.devices("cpu"))
    >>> dict(mesh.shape), layout
    ({'d0': 2, 'd2': 4}, (('d0',), (), ('d2',)))
    """
    total = check_devices(partition, where, devices)
    sizes = [[p] if p > 1 else [] for p in partition]
    if regroup is not None and not _groups(sum(sizes, []), [c for c in regroup if c > 1]):
        sizes = [_primes(p) for p in partition]
    names = [[mesh_name(i) + (f"_{k}" if k else "") for k in range(len(s))] for i, s in enumerate(sizes)]
    axes = [(n, p) for ns, ps in zip(names, sizes) for n, p in zip(ns, ps)] or [("d", 1)]
    mesh = jax.make_mesh(
        tuple(p for _, p in axes), tuple(n for n, _ in axes),
        axis_types=(AxisType.Auto,) * len(axes), devices=list(jax.devices() if devices is None else devices)[:total],
    )
    return mesh, tuple(tuple(ns) for ns in names)


def _primes(n: int) -> list[int]:
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out


def _groups(sizes: list[int], counts: list[int]) -> bool:
    """Whether `sizes` can be split into groups whose products are `counts`."""
    if not counts:
        return not sizes
    if not sizes:
        return False
    first, rest = sizes[0], sizes[1:]
    return any(counts[i] % first == 0 and _groups(rest, counts[:i] + ([counts[i] // first] if counts[i] > first else [])
                                                   + counts[i + 1:])
               for i in range(len(counts)))


def layout_on_mesh(counts: tuple[int, ...], mesh: Mesh, where: str) -> Layout:
    """The layout that splits axis i in `counts[i]` pieces over a user's mesh: each
    count > 1 takes the first unused mesh axis of that size."""
    layout, unfit = _counts_on(counts, mesh)
    if unfit is not None:
        raise ValueError(
            f"{where}: partition entry {unfit} = {counts[unfit]} matches no unused axis of the mesh "
            f"{dict(mesh.shape)}; give a PartitionSpec to combine mesh axes"
        )
    return layout


def fits_mesh(counts: tuple[int, ...], mesh: Mesh) -> bool:
    """Whether `layout_on_mesh` reads `counts` on `mesh`."""
    return _counts_on(counts, mesh)[1] is None


def _counts_on(counts: tuple[int, ...], mesh: Mesh) -> tuple[Layout, int | None]:
    """`layout_on_mesh`'s layout, as far as it goes, and the first entry that no unused
    mesh axis of its size takes (None if every one is taken)."""
    free = list(mesh.axis_names)
    layout = []
    for i, p in enumerate(counts):
        if p == 1:
            layout.append(())
            continue
        fits = [n for n in free if mesh.shape[n] == p]
        if not fits:
            return tuple(layout), i
        free.remove(fits[0])
        layout.append((fits[0],))
    return tuple(layout), None


def sharding(mesh: Mesh, layout: Layout) -> NamedSharding:
    return NamedSharding(mesh, spec_of(layout))
