"""Case i of `benchmarks/run.py`: per-device memory of one FNO training step.

What decides whether a model fits on a GPU: the bytes one device needs for one jitted
Adam step of a 3-D FNO (arguments: parameters, optimiser state and the batch; outputs;
temporaries), read from `compiled.memory_analysis()` of the step compiled for P = 1, 2,
4 and 8 devices and the partitions that make sense. Nothing runs: it is compiled only.
"""

from __future__ import annotations

import numpy as np

from parop.nn import FNO, dry_run

from ._harness import Target

TITLE = "Per-device memory of one compiled FNO training step (arguments + outputs + temporaries)"
COLUMNS = [("model", "model"), ("partition", "partition"), ("devices", "devices"), ("arguments", "arguments"),
           ("outputs", "outputs"), ("temporaries", "temporaries"), ("total", "total"),
           ("ratio", "/ serial")]  # (row key, column label)


def step_memory(model, batch: int) -> dict:
    """`{arguments, outputs, temporaries, total}` bytes per device of one training step of
    `model` (serial or distributed) on `batch` samples: `parop.nn.dry_run`'s figures."""
    memory = dry_run(model, batch)["memory"]
    out = {k: memory[k] for k in ("arguments", "outputs", "temporaries")}
    out["total"] = sum(out.values())
    return out


def memory_rows(quick: bool) -> list[dict]:
    """One row per partition of a 3-D FNO (64³, width 20, modes 16³, 4 layers, batch 1;
    in quick mode 32³, modes 8³, 2 layers, on 8 devices only), with the ratio of its
    total to the serial step's."""
    grid, modes, layers = ((32,) * 3, (8,) * 3, 2) if quick else ((64,) * 3, (16,) * 3, 4)
    model = FNO(grid, width=20, modes=modes, layers=layers)
    partitions = [None, (1, 1, 2, 2, 2)] if quick else [
        None, (1, 1, 2, 1, 1), (1, 1, 2, 2, 1), (1, 1, 2, 2, 2), (1, 1, 8, 1, 1), (1, 1, 4, 2, 1)]
    rows = []
    for partition in partitions:
        m = model if partition is None else model.distribute(partition, batch=1)
        devices = 1 if partition is None else int(np.prod(partition))
        rows.append({"partition": partition or "serial", "devices": devices, **step_memory(m, 1)})
    serial = rows[0]["total"]
    for row in rows:
        row["ratio"] = row["total"] / serial
    return [{"model": f"3-D FNO {'x'.join(map(str, grid))}, width 20, modes {modes}, {layers} layers, batch 1", **r}
            for r in rows]


def targets(rows: list[dict]) -> list[Target]:
    """On 8 devices, at most 0.15 of the serial step's memory per device."""
    return [Target(f"i {r['model']} on {r['partition']}: memory / serial", "<=", 0.15, value=r["ratio"])
            for r in rows if r["devices"] == 8]
