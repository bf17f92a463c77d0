"""The timing harness of `benchmarks/run.py`: what a case is given (`Run`), candidates,
groups, interleaved timing, correctness checks and the markdown tables.

A `Group` is one comparison (one problem): its `Candidate`s each compute the same
result, which is first checked against a NumPy reference; then every candidate is
warmed up (the jit compile is excluded) and timed round-robin, in a fresh random
order each round, each call awaited with `block_until_ready` (a loop of un-awaited
collective programs on forced CPU devices can deadlock). A sample is the mean of
`k` back-to-back awaited calls, the same `k` for every candidate of a group (it
makes a sample of the fastest one last about `min_sample_s`); the reported time is
the median of the samples. A candidate much slower than the group's typical one
(XLA's gathering FFT) joins only every m-th round, so that the others get more
rounds in the same time. Ratios are ratios of medians; the paired ratio (the median
over the rounds both took part in of the ratio within that round) is also kept, as
it is more robust when the machine's load drifts.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from parop import display

from ._hlo import HloLog

N_DEVICES = 8  # the forced CPU host devices (or accelerators, with --gpu) a run needs
ROOT = Path(__file__).resolve().parent.parent


def worker_args(module: str, payload) -> list[str]:
    """The command line of a child process running `benchmarks/<module>.py` on the JSON
    of `payload` (from the repository root `ROOT`, in this process's environment)."""
    return [sys.executable, "-m", f"benchmarks.{module}", json.dumps(payload)]


@dataclass(frozen=True)
class Run:
    """What every case is given: the mode (`quick`: small sizes, a smoke test) and the log
    its compiled programs' collectives go to (case f)."""

    quick: bool
    hlo: HloLog = field(default_factory=HloLog)


@dataclass
class Candidate:
    """One implementation of a group's problem. `call()` runs it once and returns its
    result (any pytree of arrays); `skip` (a reason) keeps it from running."""

    name: str
    call: Callable[[], Any] | None
    skip: str | None = None
    note: str = ""
    # maps (result, reference) to what is compared with the reference, e.g. to undo a
    # layout the candidate returns its result in (a transposed FFT)
    to_reference: Callable[[Any, Any], Any] | None = None


@dataclass
class Target:
    """A pass/fail line: `value = median[num] / median[den]` (or the given `value`),
    compared with `limit` by `op` ("<=", ">=", "<")."""

    label: str
    op: str
    limit: float
    num: str | None = None
    den: str | None = None
    value: float | None = None
    unit: str = "x"
    group: "Group | None" = None

    def measured(self) -> float | None:
        if self.value is not None:
            return self.value
        g = self.group
        a, b = g.results.get(self.num), g.results.get(self.den)
        if a is None or b is None or a.median is None or b.median is None or not (a.ok and b.ok):
            return None
        return a.median / b.median

    def paired(self) -> float | None:
        """The median over rounds of num/den within each round."""
        if self.value is not None or self.group is None:
            return None
        return paired_ratio(self.group.results.get(self.num), self.group.results.get(self.den))

    def passed(self) -> bool | None:
        v = self.measured()
        if v is None:
            return None
        return {"<=": v <= self.limit, ">=": v >= self.limit, "<": v < self.limit}[self.op]


def paired_ratio(a: "Result | None", b: "Result | None") -> float | None:
    """The median, over the rounds both `a` and `b` took part in, of a's time / b's."""
    if a is None or b is None or not (a.ok and b.ok):
        return None
    mine = dict(zip(a.rounds, a.samples))
    ratios = [mine[r] / t for r, t in zip(b.rounds, b.samples) if r in mine]
    return float(np.median(ratios)) if ratios else None


@dataclass
class Result:
    status: str = "ok"  # ok | check FAILED | skipped | error
    error: float | None = None  # max relative error against the reference
    samples: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)  # the round of each sample
    per_sample_calls: int = 1
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self) -> float | None:
        return float(np.median(self.samples)) if self.samples else None

    @property
    def best(self) -> float | None:
        return float(np.min(self.samples)) if self.samples else None


@dataclass
class Group:
    """One problem and its candidates. `reference()` returns the NumPy result (a
    pytree of arrays, like the candidates'); `yardstick` names the candidate the
    `ratio` column divides by."""

    case: str
    problem: str
    candidates: list[Candidate]
    reference: Callable[[], Any] | None
    yardstick: str
    tol: float = 1e-4
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    results: dict[str, Result] = field(default_factory=dict)
    after: Callable[["Group"], None] | None = None  # runs once the group is timed
    extra: dict = field(default_factory=dict)

    def target(self, label, num, den, op, limit):
        self.targets.append(Target(label, op, limit, num=num, den=den, group=self))


def rel_error(got, want) -> float:
    """max |got - want| / max |want| over all leaves, in float64."""
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got_leaves) != len(want_leaves):
        return math.inf
    worst = 0.0
    for g, w in zip(got_leaves, want_leaves):
        g = np.asarray(g)
        w = np.asarray(w)
        if g.shape != w.shape:
            return math.inf
        g = g.astype(np.complex128 if np.iscomplexobj(g) else np.float64)
        scale = max(float(np.max(np.abs(w))), 1e-30)
        worst = max(worst, float(np.max(np.abs(g - w))) / scale)
    return worst


def _once(call) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - t0


def run_group(group: Group, *, budget_s: float, min_rounds: int, max_rounds: int,
              warmup: int = 2, min_sample_s: float = 2e-3, slow: float = 4.0, min_samples: int = 7,
              log=print) -> None:
    """Check, warm up and time `group`'s candidates (interleaved); fills `group.results`."""
    want = group.reference() if group.reference is not None else None
    live: list[Candidate] = []
    for c in group.candidates:
        r = group.results[c.name] = Result()
        if c.skip is not None or c.call is None:
            r.status, r.detail = "skipped", c.skip or "not available"
            continue
        try:
            got = jax.block_until_ready(c.call())  # compiles
        except Exception as e:  # noqa: BLE001 -- report, keep benchmarking the others
            r.status, r.detail = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"    {c.name}: {r.detail}")
            continue
        if want is not None:
            r.error = rel_error(c.to_reference(got, want) if c.to_reference else got, want)
            if not r.error <= group.tol:
                r.status = "check FAILED"
                r.detail = f"max rel. error {r.error:.2e} > {group.tol:.0e}"
        live.append(c)
    if not live:
        return
    # warm-up: the first awaited calls after compilation, and an estimate of a call's time
    estimate = {}
    for c in live:
        times = [_once(c.call) for _ in range(warmup)]
        estimate[c.name] = max(min(times), 1e-6)
    k_all = max(1, math.ceil(min_sample_s / min(estimate.values())))
    k = {c.name: k_all for c in live}
    # candidates over `slow` x the typical one take part in every m-th round only
    typical = float(np.median(list(estimate.values())))
    every = {c.name: max(1, int(estimate[c.name] / (slow * typical))) for c in live}
    per_round = sum(k[c.name] * estimate[c.name] / every[c.name] for c in live)
    rounds = int(min(max_rounds, max(min_rounds, budget_s // per_round)))
    every = {name: max(1, min(m, rounds // min_samples)) for name, m in every.items()}
    rng = np.random.default_rng(0)
    gc.collect()
    gc.disable()
    try:
        for i in range(rounds):
            order = [live[j] for j in rng.permutation(len(live)) if i % every[live[j].name] == 0]
            for c in order:
                n = k[c.name]
                call = c.call
                t0 = time.perf_counter()
                for _ in range(n):
                    jax.block_until_ready(call())
                result = group.results[c.name]
                result.samples.append((time.perf_counter() - t0) / n)
                result.rounds.append(i)
    finally:
        gc.enable()
    for c in live:
        group.results[c.name].per_sample_calls = k[c.name]
    if group.after is not None:
        group.after(group)


# -- tables ------------------------------------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None:
        return "–"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_bytes(n: float | None) -> str:
    """parop's `fmt_bytes` (`512 B`, `5.9 KiB`), and `–` for a size not measured."""
    return "–" if n is None else display.fmt_bytes(n)


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def timing_rows(groups: list[Group]) -> list[list[str]]:
    rows = []
    for g in groups:
        base = g.results.get(g.yardstick)
        base_t = base.median if base is not None and base.ok else None
        for c in g.candidates:
            r = g.results.get(c.name)
            if r is None:
                continue
            if r.status in ("skipped", "error"):
                rows.append([g.case, g.problem, c.name, r.status, "–", "–", "–", r.detail or c.note])
                continue
            ratio = f"{r.median / base_t:.2f}" if base_t and r.median is not None else "–"
            check = "ok" if r.ok else r.status
            err = f"{r.error:.1e}" if r.error is not None else "–"
            note = "; ".join(x for x in (c.note, r.detail) if x)
            rows.append([g.case, g.problem, c.name, fmt_time(r.median), fmt_time(r.best), ratio,
                         f"{check} ({err})",
                         (note + " " if note else "") + (f"n={len(r.samples)}×{r.per_sample_calls}" if r.samples else "")])
    return rows


def target_rows(targets: list[Target]) -> list[list[str]]:
    rows = []
    for t in targets:
        v = t.measured()
        passed = t.passed()
        shown = "–" if v is None else (f"{v:.2f} s" if t.unit == "s" else f"{v:.2f}x")
        limit = f"{t.op} {t.limit:g}" + (" s" if t.unit == "s" else "x")
        verdict = "n/a" if passed is None else "PASS" if passed else "**FAIL**"
        paired = t.paired()
        rows.append([t.label, shown, "–" if paired is None else f"{paired:.2f}x", limit, verdict])
    return rows
