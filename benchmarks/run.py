#!/usr/bin/env python
"""parop's benchmarks: runs the cases and writes benchmarks/RESULTS.md.

    python benchmarks/run.py [--quick] [--gpu] [--cases a c h] [--out PATH] [--json PATH]

Runs on 8 forced CPU host devices (`--xla_force_host_platform_device_count=8`, set
here before jax is imported) unless `--gpu`. Each problem (a `Group`,
`benchmarks/_harness.py`) compares candidates that compute the same thing; each
candidate's result is first checked against a NumPy reference, then all are warmed up
(jit compile excluded) and timed round-robin (interleaved, in a fresh random order each
round, every call awaited with `block_until_ready`); times are medians. The tables go
to stdout and to `benchmarks/RESULTS.md` (`--out`), with the machine they ran on.

Cases, one module each (`CASES` and `TABLES` below; add new ones there):

a, b. distributed 3-D FFTs, complex and real-to-complex (`fft.py`);
c. channel mixing with a batch axis, apply and gradient (`mixing.py`);
d. one FNO training step, parop vs plain JAX (`fno_step.py`);
e. planning + compile time, and the dispatch cost of `D @ x` (`compile_time.py`);
f. collectives and bytes per call, read from the compiled HLO of the programs of
   cases a-e and j (`_hlo.py`);
g. a large `Matrix`: weight replicated vs sharded (`sharded_matrix.py`);
h. planning time (`planning.py`);
i. per-device memory of a 3-D FNO training step (`memory.py`);
j. a 3-D convolution with halo exchanges (`halo.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_DEVICES = 8  # _harness.N_DEVICES, needed here before jax (and _harness) is imported
TIMING = {  # run_group's settings: seconds of timing per group, rounds at least and at most
    True: {"budget_s": 0.05, "min_rounds": 3, "max_rounds": 10},  # --quick: that timing works, not the numbers
    False: {"budget_s": 20.0, "min_rounds": 21, "max_rounds": 500},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short timing (about a minute): a smoke test")
    p.add_argument("--gpu", action="store_true", help="use the real accelerators, not 8 forced CPU devices")
    p.add_argument("--cases", nargs="+", metavar="LETTER", help="only these cases (default: all; f comes with "
                   "the cases whose programs it reads)")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"), help="where to write the markdown")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def force_cpu_devices() -> None:
    """8 CPU host devices for this process and its children; before jax is imported."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={N_DEVICES}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


if __name__ == "__main__":
    ARGS = parse_args()
    if not ARGS.gpu:
        force_cpu_devices()
    sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402

from benchmarks import compile_time, fft, fno_step, halo, memory, mixing, planning, sharded_matrix  # noqa: E402
from benchmarks._harness import Group, Run, fmt_time, run_group  # noqa: E402
from benchmarks._report import compile_rows, machine, report  # noqa: E402

# Timed cases: (letter, title, groups(run, probe status of jit(fftn))), in the report's order.
CASES = [
    ("a", "distributed 3-D complex FFT", lambda run, probe: fft.groups(run, "c2c", probe)),
    ("b", "distributed 3-D real-to-complex FFT", lambda run, probe: fft.groups(run, "r2c", probe)),
    ("c", "channel mixing, apply and gradient", lambda run, probe: mixing.groups(run)),
    ("d", "FNO training step", lambda run, probe: fno_step.groups(run)),
    ("e", "planning + compile time, and dispatch of a small distributed operator",
     lambda run, probe: compile_time.groups(run)),
    ("g", "a large Matrix: sharded vs replicated weight", lambda run, probe: sharded_matrix.groups(run)),
    ("j", "a 3-D convolution with halo exchanges", lambda run, probe: halo.groups(run)),
]
FFT_KINDS = {"a": "c2c", "b": "r2c"}

# Cases measured once, not timed against each other: (letter, title, rows(quick), the
# table's columns, targets(rows)).
TABLES = [
    ("h", planning.TITLE, planning.planning_rows, planning.COLUMNS, planning.targets),
    ("i", memory.TITLE, memory.memory_rows, memory.COLUMNS, memory.targets),
]


def main(args) -> int:
    start = time.perf_counter()
    if jax.device_count() < N_DEVICES:
        print(f"run.py needs {N_DEVICES} devices, found {jax.device_count()} ({jax.default_backend()})")
        return 2
    known = [c[0] for c in CASES + TABLES]
    letters = set(args.cases or known)
    if letters - set(known):
        print(f"run.py: no case {sorted(letters - set(known))}; the cases are {' '.join(known)}")
        return 2
    info = machine()
    print(f"parop benchmarks ({'quick' if args.quick else 'full'}): {info['cpu']}, {info['cores']} cores, "
          f"jax {info['jax']}, {info['devices']}", flush=True)
    run = Run(args.quick)
    notes: list[str] = []
    kinds = [kind for letter, kind in FFT_KINDS.items() if letter in letters]
    t = time.perf_counter()
    probe = fft.XlaProbe(fft.probe_specs(args.quick, kinds)).wait()
    if kinds:
        notes += fft.probe_notes(probe)
        print(f"  XLA-partitioner probe done ({time.perf_counter() - t:.1f} s)", flush=True)

    groups: list[Group] = []
    for letter, title, build in CASES:
        if letter not in letters:
            continue
        print(f"case {letter}: {title}", flush=True)
        for g in build(run, probe):
            t = time.perf_counter()
            run_group(g, **TIMING[args.quick], log=lambda s: print(s, flush=True))
            groups.append(g)
            notes += g.notes
            summary = ", ".join(f"{c.name} {fmt_time(g.results[c.name].median)}" for c in g.candidates
                                if g.results[c.name].median is not None)
            print(f"  {g.problem}: {summary} ({time.perf_counter() - t:.1f} s)", flush=True)

    targets = [t for g in groups for t in g.targets]
    tables = {}
    for letter, title, rows_of, columns, targets_of in TABLES:
        if letter not in letters:
            continue
        print(f"case {letter}: {title}", flush=True)
        rows = rows_of(args.quick)
        tables[letter] = (title, columns, rows)
        targets += targets_of(rows)

    info["load_end"] = os.getloadavg()
    elapsed = time.perf_counter() - start
    text = report(args.quick, args.gpu, info, groups, targets, elapsed, notes, tables, run.hlo.rows)
    print()
    print(text)
    Path(args.out).write_text(text)
    failed = [(g.problem, c.name, g.results[c.name].detail) for g in groups for c in g.candidates
              if g.results[c.name].status in ("check FAILED", "error")]
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": info, "quick": args.quick, "elapsed_s": elapsed,
            "groups": [{"case": g.case, "problem": g.problem, "yardstick": g.yardstick, "results": {
                c: {"status": r.status, "error": r.error, "median_s": r.median, "detail": r.detail}
                for c, r in g.results.items()}} for g in groups],
            "targets": [{"label": t.label, "value": t.measured(), "limit": t.limit, "op": t.op,
                         "passed": t.passed()} for t in targets],
            "hlo": run.hlo.rows, "compile": compile_rows(groups),
            "notes": notes, "checks_failed": failed, "tables": {k: rows for k, (_, _, rows) in tables.items()},
        }, indent=1, default=str))
    if failed:
        print(f"\nCORRECTNESS CHECKS FAILED: {failed}")
        return 1
    print(f"\nall correctness checks passed ({sum(len(g.results) for g in groups)} candidates); "
          f"written to {args.out} in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
