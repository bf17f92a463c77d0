"""The partition chosen for the user: `FNO.distribute(devices=N, batch=B,
memory_limit=None)` searches the splits of the batch and grid axes over `N` devices for
the cheapest planned training step whose compiled memory fits.

The search ranks candidates by the planned cost of a one-layer copy of the network
(lifting, one Fourier layer, projection: every Fourier layer of an FNO is planned
alike, so the copy ranks the partitions as the whole network does, at a fraction of
the planning time), then plans the whole network for the cheapest and, given a
`memory_limit`, compiles its training step (`dry_run`) to check that it fits, going
down the ranking until one does.

Candidates: every split of `N` into counts that divide the batch and grid sizes (the
channel axis stays whole: the lifting needs it), one of each set that only a swap of
two interchangeable grid axes (same size and modes, the last, real-FFT axis apart)
tells apart, searched in tiers: first those that split the fewest axes and those that
split one axis more, then, only where none of those plans, those that split one more
axis again, and so on. Splitting more axes adds repartitions to every Fourier layer
(each split axis must leave its FFT's axis and come back), and planning them takes
longer; but a small grid on many devices may plan only where every axis takes a share
(an 8 × 8 grid at batch 2 on 8 devices: only (2, 1, 2, 2)).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from itertools import product

import jax

from .._checks import divisors, positive_int
from ..distributed.layout import context_mesh, fits_mesh


@dataclass(frozen=True)
class Candidate:
    """A partition of `(batch, channel, *grid)` and the planned cost of its one-layer
    copy (time in bytes, bytes sent per device per step), or why it has no plan."""

    partition: tuple[int, ...]
    cost: float | None
    sent: float | None
    error: str | None = None


def candidates(model, devices: int, batch: int, on_mesh: bool = True) -> list[tuple[int, ...]]:
    """The partitions of `(batch, channel, *grid)` over `devices` the search considers,
    fewest split axes first; under `jax.set_mesh` (unless not `on_mesh`), those whose
    counts its mesh's axes give (each count above 1 an axis of its own of that size, as
    `po.distribute` reads a tuple on a given mesh).

    >>> from parop.nn import FNO
    >>> candidates(FNO((8, 8), width=2, modes=(2, 2), layers=1), 4, 2)
    [(1, 1, 1, 4), (1, 1, 4, 1), (1, 1, 2, 2), (2, 1, 1, 2), (2, 1, 2, 1)]"""
    sizes = (batch,) + model.grid
    options = [[d for d in divisors(n) if devices % d == 0] for n in sizes]
    twins = _interchangeable(model)
    mesh = context_mesh() if on_mesh else None
    found = []
    for counts in product(*options):
        grid, partition = counts[1:], (counts[0], 1) + counts[1:]
        if math.prod(counts) != devices or (mesh is not None and not fits_mesh(partition, mesh)):
            continue
        if any(grid[i] < grid[j] for i, j in twins):  # one of each set of swaps
            continue
        found.append(partition)
    return sorted(found, key=lambda p: (_splits(p), p))


def _splits(partition: tuple[int, ...]) -> int:
    return sum(c > 1 for c in partition)


def tiers(model, devices: int, batch: int) -> list[list[tuple[int, ...]]]:
    """`candidates` in the tiers the search tries them: those that split the fewest axes
    and those that split one more, then one tier per further count of split axes.

    >>> from parop.nn import FNO
    >>> [len(tier) for tier in tiers(FNO((8, 8), width=2, modes=(2, 2), layers=1), 8, 2)]
    [6, 1]
    >>> tiers(FNO((8, 8), width=2, modes=(2, 2), layers=1), 8, 2)[1]
    [(2, 1, 2, 2)]"""
    found = candidates(model, devices, batch)
    if not found:
        return []
    fewest = _splits(found[0])
    tier = lambda p: max(_splits(p) - fewest - 1, 0)  # noqa: E731
    return [[p for p in found if tier(p) == t] for t in sorted({tier(p) for p in found})]


def _interchangeable(model) -> list[tuple[int, int]]:
    """Pairs `(i, j)`, `i < j`, of grid axes that a swap maps onto each other: the same
    size and modes, neither the last (real-FFT) axis."""
    g, m = model.grid, model.modes
    return [(i, j) for i in range(len(g) - 1) for j in range(i + 1, len(g) - 1) if (g[i], m[i]) == (g[j], m[j])]


def ranked(model, devices: int, batch: int, cost=None, tier: int = 0) -> list[Candidate]:
    """Every candidate of the `tier`-th of `tiers` (none past the last) with the planned
    cost of the one-layer copy of `model` on it, cheapest first; those with no plan
    last, with the planner's reason."""
    found = tiers(model, devices, batch)
    return _ranked(model, found[tier] if tier < len(found) else [], batch, cost)


def _ranked(model, partitions: list[tuple[int, ...]], batch: int, cost=None) -> list[Candidate]:
    """`ranked` for the candidates `partitions`."""
    from .fno import FNO

    copy = FNO(model.grid, width=model.width, modes=model.modes, layers=1, in_channels=model.in_channels,
               out_channels=model.out_channels, projection=model.projection, dtype=model.dtype,
               local_kernel=model.local_kernel)
    out = []
    for partition in partitions:
        try:
            ops = copy.distribute(partition, cost=cost, batch=batch).operators(batch)
        except ValueError as e:
            out.append(Candidate(partition, None, None, _reason(e)))
            continue
        plans = [op.plan for op in ops]
        out.append(Candidate(partition, sum(p.cost[0] for p in plans), sum(p.cost[1] for p in plans)))
    return sorted(out, key=lambda c: (c.cost is None, c.cost or 0.0, c.partition))


def choose(model, devices: int, batch: int, memory_limit: float | None = None, cost=None):
    """`model` distributed over `devices` on the cheapest candidate partition whose
    training step on `batch` samples plans and (given `memory_limit`, bytes per device)
    fits, from the first of `tiers` where one plans (splitting more axes does not make
    the activations on a device fewer); a `ValueError` saying what was tried where none
    does."""
    from .dryrun import dry_run

    where = f"FNO.distribute(devices={devices}, batch={batch}, memory_limit={memory_limit})"
    devices, batch = _check(where, devices, batch, memory_limit)
    tried, too_large = [], False
    ranking = (c for partitions in tiers(model, devices, batch) if not too_large
               for c in _ranked(model, partitions, batch, cost))
    for c in ranking:
        if c.cost is None:
            tried.append(f"{c.partition}: {c.error}")
            continue
        try:
            dist = model.distribute(c.partition, cost=cost, batch=batch)
        except ValueError as e:
            tried.append(f"{c.partition}: {_reason(e)}")
            continue
        if memory_limit is None:
            return dist
        need = dry_run(dist, batch)["memory_bytes"]
        if need <= memory_limit:
            return dist
        tried.append(f"{c.partition}: {need / 1e9:.3g} GB per device")
        too_large = True
    mesh = context_mesh()
    shown = "\n  ".join(tried) if tried else "(no split of the batch and grid axes over that many devices" + (
        ", each count above 1 a mesh axis of that size)" if mesh is not None else ")")
    fits = "" if memory_limit is None else f" in {memory_limit / 1e9:.3g} GB per device"
    advice = ("Use more devices, a smaller batch, or FNO(..., remat=True) to save memory" if too_large
              else "Use fewer devices: none of these splits plans" if tried
              else (f"Under jax.set_mesh of {dict(mesh.shape)}, each split takes a mesh axis of its size: ask for a "
                    f"product of those sizes (devices={mesh.size}, say)")
              if mesh is not None and candidates(model, devices, batch, on_mesh=False)
              else "Use a device count that is a product of divisors of the batch and grid sizes")
    raise ValueError(f"{where}: no partition of (batch, channel, *grid) = {(batch, model.in_channels) + model.grid} "
                     f"over {devices} devices plans and fits{fits}; tried:\n  {shown}\n{advice}")


def _reason(error: ValueError) -> str:
    """The planner's reason, without the operators it names (the whole network)."""
    text = str(error).splitlines()[0]
    return text[text.index("no plan exists"):] if "no plan exists" in text else text


def _check(where: str, devices, batch, memory_limit) -> tuple[int, int]:
    """`(devices, batch)` as ints, or a `ValueError` naming `where` and the argument."""
    devices, batch = positive_int(devices, "devices", where), positive_int(batch, "batch", where)
    mesh = context_mesh()  # a mesh shape (jax.sharding.use_abstract_mesh) is planned on, whatever the machine has
    available = mesh.size if isinstance(mesh, jax.sharding.AbstractMesh) else len(jax.devices())
    if devices > available:
        raise ValueError(f"{where}: {devices} devices asked for, {available} available")
    if memory_limit is not None and (isinstance(memory_limit, bool) or not isinstance(memory_limit, numbers.Real)
                                     or not memory_limit > 0):  # nan too
        raise ValueError(f"{where}: memory_limit must be a positive number of bytes (or None), got {memory_limit!r}")
    return devices, batch
