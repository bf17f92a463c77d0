"""How long whole FNO chains take to plan, drawn at random from the planning target's
scope rather than picked by hand: 1-D to 4-D grids, up to 8 layers, with or without
`local_kernel=3`, batch sizes 1 to 8 (where the batch axis is split in `p`, `p` or `2p`;
half of them planned again with the weights pinned where a reference batch's plan put
them, as `evaluate` does for a partial last batch), 1 to 3 mesh axes of 2, 4 or 8 devices over the batch and grid axes, up to 512 devices.

`python benchmarks/planning_scan.py [--count 40] [--seed 0] [--hard] [--large-batches]`
prints a summary (how many chains plan in under 1 s, the median, the slowest) and the
slowest chains, as markdown. `--hard` draws from the scope's hardest corner only: 3-D and
4-D grids with three grid axes split (most of the scope's chains are quick).
`--large-batches` draws batch sizes of 12 to 128 instead (a multiple of the batch axis's
split), where the batch axis can hold the mesh axes the grid axes hold.
A chain for which no plan exists (an axis too small for its split, say) is drawn again;
one the planner gives up on counts as a miss. Times are the planning process's CPU
seconds of the one plan timed (the pinned plan, where there is one).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.planning import _abstract  # noqa: E402
from parop.distributed.plan import PlanningError  # noqa: E402
from parop.nn import FNO  # noqa: E402

LIMIT = 1.0  # seconds: the target for every chain


LARGE_BATCHES = (12, 16, 24, 27, 32, 48, 50, 64, 96, 100, 128)


def draw_chain(rng: random.Random, hard: bool = False, large: bool = False) -> dict:
    """One FNO chain of the scope: `{grid, modes, width, layers, local_kernel, partition,
    batch, reference}` (`reference`: the batch whose plan pins the weights, or None);
    `hard`: a 3-D or 4-D grid with three of its axes split; `large`: a batch size of
    `LARGE_BATCHES`, rounded up to a multiple of the batch axis's split."""
    dims = rng.choice([3, 4] if hard else [1, 2, 3, 4])
    grid = tuple(rng.choice([32, 64, 256] if dims == 1 else [8, 16, 32]) for _ in range(dims))
    modes = tuple(max(2, n // rng.choice([2, 4])) for n in grid)
    partition = [1, 1] + [1] * dims  # (batch, channel, grid...)
    if hard:
        axes = rng.sample(range(2, 2 + dims), 3)
    else:
        axes = rng.sample([0] + list(range(2, 2 + dims)), rng.choice([1, 2, 3]) if dims > 1 else rng.choice([1, 2]))
    for a in axes:
        partition[a] = rng.choice([2, 4, 8])
    split = partition[0]
    if large:
        batch = -(-rng.choice(LARGE_BATCHES) // split) * split
    else:
        batch = split * rng.choice([1, 2]) if split > 1 else rng.randint(1, 8)
    reference = split if rng.random() < 0.5 and batch != split else None
    return dict(grid=grid, modes=modes, width=rng.choice([4, 8, 20]), layers=rng.choice([1, 2, 4, 8]),
                local_kernel=rng.choice([None, 3]), partition=tuple(partition), batch=batch, reference=reference)


def plan_chain(chain: dict) -> dict:
    """Plans `chain` and returns it with `states`, `seconds` and `gave_up`; a
    `PlanningError` where no plan exists."""
    model = FNO(chain["grid"], width=chain["width"], modes=chain["modes"], layers=chain["layers"],
                local_kernel=chain["local_kernel"])
    spec, mesh = _abstract(chain["partition"])
    start = time.process_time()
    try:
        if chain["reference"] is None:
            Ds = model.distribute(spec, mesh=mesh, batch=chain["batch"]).operators(chain["batch"])
        else:
            dist = model.distribute(spec, mesh=mesh, batch=chain["reference"])
            start = time.process_time()
            Ds = dist.operators(chain["batch"])
    except PlanningError as e:
        if not e.gave_up:
            raise
        return {**chain, "devices": mesh.size, "states": None, "seconds": time.process_time() - start,
                "gave_up": True}
    return {**chain, "devices": mesh.size, "states": Ds[0].plan.states_expanded,
            "seconds": time.process_time() - start, "gave_up": False}


def scan(count: int, seed: int = 0, hard: bool = False, log=None, large: bool = False) -> list[dict]:
    """`count` chains drawn with `seed` (those with no plan drawn again), each planned."""
    rng, rows = random.Random(seed), []
    while len(rows) < count:
        try:
            row = plan_chain(draw_chain(rng, hard, large))
        except PlanningError:
            continue
        rows.append(row)
        if log is not None:
            log(describe(row))
    return rows


def model_text(row: dict) -> str:
    """The chain's model: `3-D 16×8×8, width 4, modes (8, 4, 4), 2 layers[, local_kernel=3]`."""
    grid = "×".join(map(str, row["grid"]))
    return (f"{len(row['grid'])}-D {grid}, width {row['width']}, modes {row['modes']}, {row['layers']} layers"
            + (", local_kernel=3" if row["local_kernel"] else ""))


def describe(row: dict) -> str:
    """One line: the chain and how long its plan took."""
    pinned = f", pinned by batch {row['reference']}" if row["reference"] else ""
    took = "gave up" if row["gave_up"] else f"{row['states']} states"
    return (f"{model_text(row)}; {row['partition']} ({row['devices']} devices), batch {row['batch']}{pinned}: "
            f"{row['seconds']:.2f} s, {took}")


def report(rows: list[dict], seed: int, hard: bool = False, slowest: int = 10, large: bool = False) -> str:
    """The summary and the slowest chains, as markdown."""
    seconds = sorted(r["seconds"] for r in rows)
    under = sum(1 for r in rows if not r["gave_up"] and r["seconds"] < LIMIT)
    gave_up = sum(1 for r in rows if r["gave_up"])
    corner = (", 3-D and 4-D with three grid axes split" if hard else "") + (", batch sizes 12 - 128" if large else "")
    lines = [f"{len(rows)} random FNO chains (seed {seed}{corner}): {under} planned in under {LIMIT:g} s, "
             f"{gave_up} given up; median {statistics.median(seconds):.2f} s, slowest {seconds[-1]:.2f} s.", "",
             "| chain | partition | devices | batch | states | seconds |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:slowest]:
        batch = f"{r['batch']}" + (f" (pinned by {r['reference']})" if r["reference"] else "")
        states = "gave up" if r["gave_up"] else f"{r['states']:,}"
        lines.append(f"| {model_text(r)} | {r['partition']} | {r['devices']} | {batch} | {states} | {r['seconds']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hard", action="store_true", help="3-D and 4-D grids with three grid axes split")
    parser.add_argument("--large-batches", action="store_true", help="batch sizes of 12 to 128")
    args = parser.parse_args()
    rows = scan(args.count, args.seed, args.hard, log=lambda line: print(line, file=sys.stderr, flush=True),
                large=args.large_batches)
    print(report(rows, args.seed, args.hard, large=args.large_batches))


if __name__ == "__main__":
    main()
