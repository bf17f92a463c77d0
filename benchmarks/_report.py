"""The report `benchmarks/run.py` writes (`benchmarks/RESULTS.md`): the machine, the
targets, the timings and the tables of every case."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

from ._harness import N_DEVICES, Group, Target, fmt_bytes, fmt_time, paired_ratio, table, target_rows, timing_rows


def machine() -> dict:
    """The CPU, cores, versions and devices of this run, its date and the load at its start."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    import jaxlib

    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": usable, "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
            "backend": jax.default_backend(), "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": os.getloadavg()}


def _cell(value) -> str:
    """A table cell: bytes as MiB, seconds and ratios to three figures."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and value > 1 << 16:
        return fmt_bytes(value)
    return str(value)


def hlo_table(rows: list[dict]) -> str:
    header = ["problem", "program", "all-to-all (HLO / plan)", "all-gather", "all-reduce", "other",
              "HLO operand bytes", "HLO sent/device", "D.plan.bytes"]
    out = []
    for r in rows:
        plan_a2a = r.get("plan_all_to_all")
        other = r["reduce-scatter"] + r["collective-permute"]
        out.append([r["problem"], r["program"],
                    f"{r['all-to-all']}" + (f" / {plan_a2a}" if plan_a2a is not None else ""),
                    r["all-gather"], r["all-reduce"], other, fmt_bytes(r["operand_bytes"]),
                    fmt_bytes(r["sent_bytes"]), fmt_bytes(r.get("plan_bytes"))])
    return table(header, out)


def compile_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        total = r["plan_s"] + r["first_call_s"]
        out.append([f"{r['kind']} {r['n']}³ {tuple(r['partition'])}", r["order"], fmt_time(r["plan_s"]),
                    fmt_time(r["first_call_s"]), fmt_time(r["call_s"]), fmt_time(total)])
    return table(["plan", "when", "po.distribute (planning)", "first call (trace+compile+run)",
                  "second call", "plan + first call"], out)


def breakdown_table(groups: list[Group]) -> str:
    """Where parop's time goes against the yardstick: its program vs the hand-written
    one, and `D @ x` vs calling its program directly (paired ratios)."""
    rows = []
    for g in groups:
        r = g.results
        names = ("parop", "parop program only", g.yardstick)
        if not all(n in r and r[n].ok and r[n].median for n in names):
            continue
        whole, prog, hand = (r[n] for n in names)
        ratios = (paired_ratio(whole, hand), paired_ratio(prog, hand), paired_ratio(whole, prog))
        rows.append([g.case, g.problem, *("–" if v is None else f"{v:.2f}" for v in ratios)])
    return table(["case", "problem", "parop / yardstick", "parop's program / yardstick",
                  "`D @ x` / its program"], rows)


def compile_rows(groups: list[Group]) -> list[dict]:
    """Case e's planning + compile times (none if case e did not run)."""
    return [r for g in groups for r in g.extra.get("compile_rows", [])]


def report(quick: bool, gpu: bool, info: dict, groups: list[Group], targets: list[Target], elapsed: float,
           notes: list[str], tables: dict, hlo_rows: list[dict]) -> str:
    """The markdown of RESULTS.md; `tables`: `{letter: (title, columns, rows)}` of the
    cases measured once (h, i)."""
    mode = "--quick" if quick else "full"
    devices = "--gpu" if gpu else f"{N_DEVICES} forced CPU host devices"
    lines = [
        "# parop benchmarks",
        "",
        f"Written by `python benchmarks/run.py{' --quick' if quick else ''}{' --gpu' if gpu else ''}` "
        f"({mode} mode, {devices}) on {info['date']}, in {elapsed:.0f} s.",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"backend {info['backend']} ({info['devices']}); jax {info['jax']}, jaxlib {info['jaxlib']}, "
        f"numpy {info['numpy']}, Python {info['python']}. Load average at start "
        f"{info['load_start'][0]:.1f}, at end {info['load_end'][0]:.1f} (other work shares the machine: "
        "timings are noisy).",
        "",
        "Method: every candidate's result is checked against NumPy (float64) first (max |error| / max "
        "|reference|); then candidates are warmed up (jit compile excluded) and timed interleaved, "
        "round-robin in a fresh random order each round, each call awaited with `block_until_ready`; a sample is the mean "
        "of k back-to-back calls (`n=samples×k`, the same k for all candidates of a problem; a candidate over 4x "
        "slower than the typical one joins every m-th round only), the time shown is "
        "the median of the samples, `min` the fastest sample. `ratio` = median / the median of the group's "
        "yardstick (the hand-written `shard_map` program); the targets table also gives the paired ratio, "
        "the median over rounds of the ratio within one round, which drifting load disturbs less. All 8 devices share the "
        "machine's cores, so distributed candidates are not expected to beat `1 device` here; the "
        "comparisons that matter are against the hand-written program with the same collectives.",
        "",
        "## Targets",
        "",
        table(["target", "measured (ratio of medians)", "paired ratio", "limit", "verdict"], target_rows(targets)),
        "",
        f"## Timings (cases {', '.join(sorted({g.case for g in groups}))})",
        "",
        table(["case", "problem", "candidate", "median", "min", "ratio", "check (max rel. err)", "notes"],
              timing_rows(groups)),
        "",
        "Where parop's time goes (paired ratios): its jitted program against the hand-written one "
        "(the same collectives; the difference is in the local code), and `D @ x` against calling that "
        "program directly, compiled ahead (parop's host-side work per call):",
        "",
        breakdown_table(groups),
        "",
        "## f. Collectives per call, from the compiled HLO",
        "",
        "Counts of collective instructions in the optimized HLO of each program, the bytes of their operands "
        "on one device, and what one device sends (all-to-all `S(g-1)/g`, all-gather `S(g-1)`, all-reduce "
        "`2S(g-1)/g`, for operand bytes `S` and group size `g`), next to parop's own count and `D.plan.bytes`.",
        "",
        hlo_table(hlo_rows),
        "",
        "## e. Planning + compile time (3-D DFT plans, in a fresh process)",
        "",
        compile_table(compile_rows(groups)),
        "",
    ]
    for letter, (title, columns, rows) in tables.items():
        lines += [f"## {letter}. {title}", "", table([label for _, label in columns],
                                                       [[_cell(r[key]) for key, _ in columns] for r in rows]), ""]
    dispatch = [g for g in groups if g.case == "e" and g.extra.get("overhead_s") is not None]
    if dispatch:
        lines += [
            "## e. Dispatch overhead",
            "",
            f"`D @ x` costs {dispatch[0].extra['overhead_s'] * 1e6:.0f} µs per call more than calling its "
            f"program compiled ahead, `jax.jit(lambda x: D @ x).lower(x).compile()` ({dispatch[0].problem}). "
            "cProfile of `D @ x` (per call; `tottime` of `apply` includes the jitted program's C++ dispatch and "
            "the call itself):",
            "",
            *dispatch[0].extra["profile_lines"],
            "",
            "`D @ x` runs its checks when it traces, inside one `jax.jit` around the program, so a call "
            "costs that jitted function's dispatch.",
            "",
        ]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
