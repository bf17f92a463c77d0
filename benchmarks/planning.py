"""Case h of `benchmarks/run.py`: how long the planner takes.

Each row plans one operator (or, for an FNO network, its whole chain) from scratch and
records the mesh, the states the search expanded and the CPU seconds of the process that
`po.distribute` (or `po.distribute_chain`) took (the planner is single-threaded Python:
on a quiet machine its wall time, and less disturbed by other load). Mesh shapes of 16
devices are planned on a `jax.sharding.AbstractMesh` (planning needs only the mesh's
shape). Targets: every
single operator under 1 s, the Darcy protocol's FNO network on (2, 1, 2, 2) under 2 s,
whole FNO chains (issue 20: 1-D to 4-D, with or without `local_kernel`, up to 512
devices, at the reference batch size and at another one with the weights pinned)
under 1 s.
"""

from __future__ import annotations

import time

from jax.sharding import AbstractMesh, PartitionSpec as P

import parop as po
from parop.nn import FNO, channel_mixing, spectral_convolution

from ._harness import Target

TITLE = "Planning time (each plan from scratch; 16-device meshes planned from their shape)"
COLUMNS = [("operator", "operator"), ("partition", "partition"), ("devices", "devices"),
           ("states", "states expanded"), ("seconds", "seconds")]  # (row key, column label)


def fno_layer(batch: int, width: int, grid: tuple[int, ...], modes: tuple[int, ...]):
    """One Fourier layer, spectral convolution + 1x1 skip, as the FNO builds it."""
    return (spectral_convolution(batch, width, grid, modes, "float32", "spectral")
            + channel_mixing(batch, width, width, grid, "float32", "skip"))


def _abstract(partition: tuple[int, ...]):
    """`(PartitionSpec, AbstractMesh)` with one mesh axis per split entry."""
    names = [f"d{i}" for i, p in enumerate(partition) if p > 1]
    mesh = AbstractMesh(tuple(p for p in partition if p > 1), tuple(names))
    return P(*(f"d{i}" if p > 1 else None for i, p in enumerate(partition))), mesh


def planning_rows(quick: bool) -> list[dict]:
    """`{operator, mesh, states, seconds, limit}` per planning case."""
    layer3 = ("3-D FNO layer: batch 2, width 8, 32³, modes 8³", fno_layer(2, 8, (32, 32, 32), (8, 8, 8)))
    layer4 = ("4-D FNO layer: batch 2, width 8, 16⁴, modes 6⁴", fno_layer(2, 8, (16,) * 4, (6,) * 4))
    cases = [(layer3, p) for p in [(1, 1, 8, 1, 1), (1, 1, 2, 4, 1), (1, 1, 2, 2, 2), (2, 1, 2, 2, 1),
                                   (2, 1, 2, 2, 2), (2, 2, 2, 2, 1), (1, 1, 4, 2, 2)]]
    cases += [(layer4, p) for p in [(1, 1, 2, 2, 2, 1), (2, 1, 2, 2, 1, 1), (1, 1, 2, 2, 2, 2), (2, 1, 2, 2, 2, 1)]]
    if quick:
        cases = cases[:3] + cases[7:9]
    rows = []
    for (label, op), partition in cases:
        spec, mesh = _abstract(partition)
        start = time.process_time()
        D = po.distribute(op, spec, mesh=mesh)
        seconds = time.process_time() - start
        rows.append({"operator": label, "partition": partition, "devices": mesh.size,
                     "states": D.plan.states_expanded, "seconds": seconds, "limit": 1.0})
    dfno = FNO((512, 512, 256, 32), width=20, modes=(32, 32, 16, 8), layers=4)  # dfno's chain
    lk4 = FNO((8, 8, 8, 8), width=4, modes=(4, 4, 4, 4), layers=2, local_kernel=3)
    networks = [("2-D FNO network (Darcy protocol): batch 20, 32², width 32, modes 12², 4 layers",
                 FNO((32, 32), width=32, modes=(12, 12), layers=4), 20, (2, 1, 2, 2), 2.0)]
    if not quick:
        networks.append(("3-D FNO network: batch 2, 32³, width 20, modes 8³, 4 layers",
                         FNO((32, 32, 32), width=20, modes=(8, 8, 8), layers=4), 2, (1, 1, 2, 2, 2), None))
        # whole chains (issue 20): the layers alike share their exits, so the time should not grow with them
        for layers in (2, 4, 8):
            networks.append((f"3-D FNO chain: batch 1, 16³, width 8, modes 4³, {layers} layers",
                             FNO((16, 16, 16), width=8, modes=(4, 4, 4), layers=layers), 1, (1, 1, 2, 2, 2), 1.0))
        networks.append(("3-D FNO chain: batch 2, 32³, width 8, modes 4³, 4 layers",
                         FNO((32, 32, 32), width=8, modes=(4, 4, 4), layers=4), 2, (2, 1, 2, 2, 1), 1.0))
        for layers in (1, 8):
            networks.append((f"4-D FNO chain: batch 1, 8⁴, width 4, modes 4⁴, {layers} layer{'s' * (layers > 1)}",
                             FNO((8, 8, 8, 8), width=4, modes=(4, 4, 4, 4), layers=layers), 1, (1, 1, 2, 2, 2, 1),
                             1.0))
        networks.append(("3-D FNO chain, local_kernel=3: batch 2, 8³, width 4, modes 4³, 1 layer",
                         FNO((8, 8, 8), width=4, modes=(4, 4, 4), layers=1, local_kernel=3), 2, (1, 1, 2, 2, 2), 1.0))
        networks.append(("4-D FNO chain, local_kernel=3: batch 1, 8⁴, width 4, modes 4⁴, 2 layers",
                         lk4, 1, (1, 1, 2, 2, 2, 1), 1.0))
        networks.append(("3-D FNO chain: batch 1, 64³, width 8, modes 8³, 4 layers",
                         FNO((64, 64, 64), width=8, modes=(8, 8, 8), layers=4), 1, (1, 1, 8, 8, 8), 1.0))
        for partition in [(1, 1, 4, 4, 4, 1), (1, 1, 8, 8, 4, 1), (1, 1, 8, 8, 8, 1)]:
            networks.append(("4-D FNO chain (dfno's): batch 1, 512²×256×32, width 20, modes (32, 32, 16, 8), 4 layers",
                             dfno, 1, partition, 1.0))
        # a single layer with three grid axes split: the look-ahead's search is stopped early (`Search.alone`)
        networks.append(("4-D FNO chain: batch 7, 16×8×16×8, width 20, modes (4, 2, 8, 2), 1 layer",
                         FNO((16, 8, 16, 8), width=20, modes=(4, 2, 8, 2), layers=1), 7, (1, 1, 8, 1, 2, 8), 1.0))
        networks.append(("1-D FNO chain: batch 2, 64, width 8, modes 16, 8 layers",
                         FNO((64,), width=8, modes=(16,), layers=8), 2, (2, 1, 4), 1.0))
        networks.append(("2-D FNO chain: batch 2, 32², width 8, modes 8², 8 layers",
                         FNO((32, 32), width=8, modes=(8, 8), layers=8), 2, (2, 1, 2, 2), 1.0))
    # another batch size than the reference (a partial last batch): planned with every weight pinned
    # where the reference batch's plan put it; only that plan is timed
    again = [] if quick else [
        ("3-D FNO chain at batch 4, weights pinned by batch 1: 16³, width 8, modes 4³, 4 layers",
         FNO((16, 16, 16), width=8, modes=(4, 4, 4), layers=4), (1, 4), (1, 1, 2, 2, 2), 1.0),
        ("2-D FNO chain at batch 4, weights pinned by batch 2: 32², width 8, modes 8², 8 layers",
         FNO((32, 32), width=8, modes=(8, 8), layers=8), (2, 4), (2, 1, 2, 2), 1.0),
        ("4-D FNO chain (dfno's) at batch 2, weights pinned by batch 1", dfno, (1, 2), (1, 1, 4, 4, 4, 1), 1.0),
        ("4-D FNO chain (dfno's) at batch 4, weights pinned by batch 1", dfno, (1, 4), (1, 1, 4, 4, 4, 1), 1.0),
        ("4-D FNO chain (dfno's) at batch 3, weights pinned by batch 1", dfno, (1, 3), (1, 1, 4, 4, 4, 1), 1.0),
        ("3-D FNO chain, local_kernel=3, at batch 4, weights pinned by batch 1: 8³, width 4, modes 4³, 1 layer",
         FNO((8, 8, 8), width=4, modes=(4, 4, 4), layers=1, local_kernel=3), (1, 4), (1, 1, 2, 2, 2), 1.0),
        ("3-D FNO chain, local_kernel=3, at batch 8, weights pinned by batch 1: 8³, width 4, modes 4³, 1 layer",
         FNO((8, 8, 8), width=4, modes=(4, 4, 4), layers=1, local_kernel=3), (1, 8), (1, 1, 2, 2, 2), 1.0),
        ("3-D FNO chain, local_kernel=3, at batch 4, weights pinned by batch 1: 16³, width 8, modes 4³, 8 layers",
         FNO((16, 16, 16), width=8, modes=(4, 4, 4), layers=8, local_kernel=3), (1, 4), (1, 1, 2, 2, 2), 1.0),
        ("4-D FNO chain, local_kernel=3, at batch 2, weights pinned by batch 1: 8⁴, width 4, modes 4⁴, 2 layers",
         lk4, (1, 2), (1, 1, 2, 2, 2, 1), 1.0)]
    for label, model, batch, partition, limit in networks + again:
        spec, mesh = _abstract(partition)
        reference, batch = batch if isinstance(batch, tuple) else (None, batch)
        dist = None if reference is None else model.distribute(spec, mesh=mesh, batch=reference)
        start = time.process_time()
        if dist is None:
            Ds = model.distribute(spec, mesh=mesh, batch=batch).operators(batch)  # batch: the reference, planned once
        else:
            Ds = dist.operators(batch)
        seconds = time.process_time() - start
        rows.append({"operator": label, "partition": partition, "devices": mesh.size,
                     "states": Ds[0].plan.states_expanded, "seconds": seconds, "limit": limit})
    return rows


def targets(rows: list[dict]) -> list[Target]:
    return [Target(f"h plan {r['operator']} on {r['partition']}", "<", r["limit"], value=r["seconds"], unit="s")
            for r in rows if r["limit"] is not None]
