"""Will it fit? dfno's configuration (Grady et al. 2023: a 4-D FNO over (x, y, z, t),
64x64x64x32 points per device, width 20, 4 Fourier layers, 4 kept modes per dimension
per partition, 8 in t) at 1 to 512 devices, compiled, never run: per-device memory with
and without `remat`, the collectives and bytes of a training step, and the partition
parop chooses (`--devices N`). Each case runs `python -m parop.nn.dryrun --json` in a
fresh process with its own forced device count, one at a time.

`python benchmarks/will_it_fit.py [--out benchmarks/will_it_fit.json] [--only 256]`
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK, WIDTH, LAYERS = (64, 64, 64, 32), 20, 4
SPLITS = {1: (1, 1, 1), 8: (2, 2, 2), 64: (4, 4, 4), 256: (8, 8, 4), 512: (8, 8, 8)}


def dfno_case(devices: int) -> dict:
    """dfno's grid, modes and partition over `devices` (weak scaling at its block)."""
    splits = SPLITS[devices]
    grid = tuple(b * p for b, p in zip(BLOCK, splits + (1,)))
    modes = tuple(4 * p for p in splits) + (8,)
    return {"grid": grid, "modes": modes, "partition": (1, 1) + splits + (1,)}


def dry_run(case: dict, *, remat: bool, choose: bool = False) -> dict:
    """The dry run's JSON report of one case, from a fresh process."""
    devices = math.prod(case["partition"])
    args = ["--grid", *map(str, case["grid"]), "--width", str(WIDTH), "--modes", *map(str, case["modes"]),
            "--layers", str(LAYERS), "--batch", "1", "--json"]
    args += ["--devices", str(devices)] if choose or devices == 1 else ["--partition", *map(str, case["partition"])]
    args += ["--remat"] if remat else []
    proc = subprocess.run([sys.executable, "-m", "parop.nn.dryrun", *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout)


def block_bytes(width: int = WIDTH) -> int:
    """Bytes of one device's `width`-channel float32 activation at dfno's block."""
    return width * math.prod(BLOCK) * 4


def markdown(results: dict) -> str:
    """The README's tables from the saved reports."""
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    lines = ["| devices | grid | modes | partition | per device, remat=False | remat=True | all_to_alls per "
             "Fourier layer | sent per device per step | planning | compiling (remat=False / True) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for devices in sorted(SPLITS):
        plain, remat = results.get(f"{devices} dfno"), results.get(f"{devices} dfno remat")
        choice = results.get(f"{devices} choice remat")
        if not plain or not remat or "error" in plain or "error" in remat:
            continue
        lines.append(f"| {devices} | {'x'.join(map(str, plain['grid']))} | {tuple(plain['modes'])} | "
                     f"{tuple(plain['partition'])} | {gb(plain['memory_bytes'])} | {gb(remat['memory_bytes'])} | "
                     f"{plain['all_to_all_per_layer']} | {plain['sent_bytes'] / 2**20:.0f} MiB | "
                     f"{plain['plan_seconds']:.1f} s | {plain['compile_seconds']:.0f} / {remat['compile_seconds']:.0f} s |")
        if choice and "error" not in choice:
            lines.append(f"| {devices}, parop's choice | | | {tuple(choice['partition'])} | | "
                         f"{gb(choice['memory_bytes'])} | {choice['all_to_all_per_layer']} | "
                         f"{choice['sent_bytes'] / 2**20:.0f} MiB | {_chosen_in(choice)} | "
                         f"– / {choice['compile_seconds']:.0f} s |")
    return "\n".join(lines)


def _chosen_in(report: dict) -> str:
    return f"chosen in {report['choose_seconds']:.1f} s" if "choose_seconds" in report else "–"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "will_it_fit.json"))
    p.add_argument("--only", type=int, nargs="*", default=sorted(SPLITS))
    p.add_argument("--table", action="store_true", help="print the tables of the saved results, run nothing")
    args = p.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    if args.table:
        print(markdown(results))
        return
    for devices in args.only:
        case = dfno_case(devices)
        runs = [("dfno", False, False), ("dfno", True, False)] + ([("choice", True, True)] if devices > 1 else [])
        for name, remat, choose in runs:
            key = f"{devices} {name}{' remat' if remat else ''}"
            results[key] = {**dry_run(case, remat=remat, choose=choose), "grid": case["grid"], "modes": case["modes"]}
            out.write_text(json.dumps(results, indent=1))
            print(key, json.dumps(results[key]), flush=True)


if __name__ == "__main__":
    main()
