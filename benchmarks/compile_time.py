"""Case e of `benchmarks/run.py`: planning + compile time, and the dispatch cost of a
small distributed operator.

The planning + compile time is measured in a fresh child process (`python -m
benchmarks.compile_time SPECS`, from the repository root): for each 3-D DFT plan,
`po.distribute` (planning), the first call (trace, lower, compile, run) and a second
call. The dispatch group times `D @ x` against calling its program compiled ahead,
`jax.jit(lambda x: D @ x).lower(x).compile()`, and profiles `D @ x`. The group's `extra` holds what the
report shows: `compile_rows`, `overhead_s` and `profile_lines`.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

import parop as po

from .fft import PARTITIONS, fft_operator, sharded_input
from ._harness import ROOT, Candidate, Group, Run, Target, fmt_time, worker_args

PROGRAM = "its program, compiled ahead"


def _compile_worker(specs: list[dict]) -> None:
    """In a fresh process: one JSON line per spec, with its planning, first-call and
    second-call seconds."""
    for spec in specs:
        kind, n, partition = spec["kind"], spec["n"], tuple(spec["partition"])
        _, xs = sharded_input(kind, n, partition)
        jax.block_until_ready(xs)
        t0 = time.perf_counter()
        D = po.distribute(fft_operator(kind, n), partition)
        t1 = time.perf_counter()
        jax.block_until_ready(D @ xs)
        t2 = time.perf_counter()
        jax.block_until_ready(D @ xs)
        t3 = time.perf_counter()
        print("COMPILE " + json.dumps({**spec, "plan_s": t1 - t0, "first_call_s": t2 - t1, "call_s": t3 - t2}),
              flush=True)


def measure_compile(n: int) -> list[dict]:
    """Three 3-D DFT plans of `n`³, planned, compiled and run in a fresh child process."""
    specs = [{"kind": "c2c", "n": n, "partition": list(PARTITIONS["pencil"]), "order": "first in a fresh process"},
             {"kind": "c2c", "n": n, "partition": list(PARTITIONS["slab"]), "order": "second"},
             {"kind": "r2c", "n": n, "partition": list(PARTITIONS["pencil"]), "order": "third"}]
    proc = subprocess.run(worker_args("compile_time", specs), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ.copy())
    rows = [json.loads(line[len("COMPILE "):]) for line in proc.stdout.splitlines() if line.startswith("COMPILE ")]
    if proc.returncode or len(rows) != len(specs):
        raise RuntimeError(f"compile-time worker failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    return rows


def groups(run: Run) -> list[Group]:
    """The dispatch group, carrying the planning + compile times (measured now) and
    their target."""
    n_compile = 32 if run.quick else 64
    rows = measure_compile(n_compile)
    for r in rows:
        print(f"  plan + first call {r['kind']} {r['n']}³ {tuple(r['partition'])} ({r['order']}): "
              f"{fmt_time(r['plan_s'] + r['first_call_s'])}", flush=True)
    n, partition = 8, (2, 2, 2)
    D = po.distribute(po.kron(po.DFT(n), po.DFT(n), po.DFT(n)), partition)
    x, xs = sharded_input("c2c", n, partition, seed=2)
    program = jax.jit(lambda x: D @ x).lower(xs).compile()
    g = Group("e", f"dispatch: c2c {n}³ {partition}", [
        Candidate("parop D @ x", lambda: D @ xs),
        Candidate(PROGRAM, lambda: program(xs), note="jax.jit(lambda x: D @ x).lower(x).compile(); yardstick"),
    ], lambda: np.fft.fftn(x), yardstick=PROGRAM, tol=1e-4)
    g.target(f"e dispatch {n}³ {partition}: parop / its program", "parop D @ x", PROGRAM, "<=", 1.2)
    worst = max(r["plan_s"] + r["first_call_s"] for r in rows)
    g.targets.append(Target(f"e plan + first call, 3-D DFT {n_compile}³ (worst of {len(rows)}, first in a fresh "
                            "process)", "<", 2.0, value=worst, unit="s"))
    g.extra["compile_rows"] = rows

    def after(g):
        a, b = g.results["parop D @ x"].median, g.results[PROGRAM].median
        g.extra["overhead_s"] = a - b if a is not None and b is not None else None
        g.extra["profile_lines"] = _profile_apply(D, xs, calls=200 if run.quick else 2000)

    g.after = after
    return [g]


def _profile_apply(D, xs, calls: int = 2000) -> list[str]:
    """Where the time of `D @ x` goes: cProfile over `calls` awaited calls, per call, for
    the Python functions it runs (the 12 of most `tottime`), as a markdown table."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        jax.block_until_ready(D @ xs)
    profiler.disable()
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in pstats.Stats(profiler).stats.items():
        rows.append((tt / calls, ct / calls, nc / calls, f"{Path(file).name}:{line}({fn})"))
    rows.sort(reverse=True)
    lines = ["| function | calls/call | tottime/call | cumtime/call |", "|---|---|---|---|"]
    for tt, ct, nc, where in rows[:12]:
        lines.append(f"| `{where}` | {nc:g} | {tt * 1e6:.1f} µs | {ct * 1e6:.1f} µs |")
    return lines


if __name__ == "__main__":
    _compile_worker(json.loads(sys.argv[1]))
