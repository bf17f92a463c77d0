"""Smoke test of `benchmarks/run.py --quick`: it runs to the end, every candidate's
result matches NumPy, and the compiled programs hold the collectives the plans say.

Timing ratios are not asserted: CI timing is noisy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"

# The fewest all_to_alls for each 3-D FFT plan (the README's table), by (kind, partition, out).
EXPECTED_ALL_TO_ALL = {
    ("c2c", "slab", "parop"): 2, ("c2c", "slab", "parop, out auto"): 1,
    ("c2c", "pencil", "parop"): 4, ("c2c", "pencil", "parop, out auto"): 2,
    ("r2c", "slab", "parop"): 2, ("r2c", "slab", "parop, out auto"): 1,
    ("r2c", "pencil", "parop"): 4, ("r2c", "pencil", "parop, out auto"): 2,
}


def _env():
    """This process's environment for `run.py`, which sets its own device count in
    `XLA_FLAGS` and keeps the rest (the suite's compile settings, see conftest)."""
    return child_env("JAX_PLATFORMS", "JAX_ENABLE_X64")


def quick_run(out: Path):
    """`run.py --quick` into `out`: (the process, the JSON results, the markdown)."""
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(out / "RESULTS.md"), "--json", str(out / "results.json")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240,
    )
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    markdown = (out / "RESULTS.md").read_text() if (out / "RESULTS.md").exists() else ""
    return proc, results, markdown


def check_quick_run_exits_cleanly_and_prints_the_tables(run):
    proc, results, markdown = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for heading in ("## Targets", "## Timings", "## f. Collectives", "## e. Planning + compile time",
                    "## h. Planning time", "## i. Per-device memory", ):
        assert heading in proc.stdout and heading in markdown
    assert "| target | measured" in proc.stdout
    assert "Machine: " in markdown and "jax " in markdown
    assert results is not None and results["quick"]


def check_every_candidate_matches_numpy(run):
    _, results, _ = run
    assert results["checks_failed"] == []
    cases = {g["case"] for g in results["groups"]}
    assert {"a", "b", "c", "d", "e", "g", "j"} <= cases
    for g in results["groups"]:
        for name, r in g["results"].items():
            if r["status"] == "skipped":  # jaxdecomp (not installed, or r2c) or an XLA abort, with the reason
                assert r["detail"], (g["problem"], name)
                continue
            assert r["status"] == "ok", (g["problem"], name, r)
            assert r["median_s"] is not None and r["median_s"] > 0
            if g["case"] in "abc":
                assert r["error"] is not None and r["error"] <= 1e-4, (g["problem"], name, r["error"])
        # parop and the hand-written yardstick always run
        assert g["results"][g["yardstick"]]["status"] == "ok"
        parop = [n for n in g["results"] if n.startswith("parop")]
        assert parop and all(g["results"][n]["status"] == "ok" for n in parop)


def check_hlo_collectives_match_the_plans(run):
    _, results, _ = run
    rows = results["hlo"]
    seen = set()
    for r in rows:
        kind, _, part = r["problem"].split()[:3]
        key = (kind, part, r["program"])
        if key in EXPECTED_ALL_TO_ALL:
            seen.add(key)
            assert r["all-to-all"] == r["plan_all_to_all"] == EXPECTED_ALL_TO_ALL[key], r
            assert r["all-gather"] == r["all-reduce"] == r["reduce-scatter"] == 0, r
            assert r["sent_bytes"] == pytest.approx(r["plan_bytes"]), r
        if r["program"].startswith("hand shard_map") and kind in ("c2c", "r2c"):
            twin = "parop" + r["program"][len("hand shard_map"):]
            assert r["all-to-all"] == EXPECTED_ALL_TO_ALL[(kind, part, twin)], r
        if r["program"].startswith("jit(") and kind in ("c2c", "r2c"):
            assert r["all-to-all"] == 0 and r["all-gather"] >= 1, r  # XLA gathers the array
    assert seen == set(EXPECTED_ALL_TO_ALL)
    mixing = [r for r in rows if r["problem"].startswith("mix")]
    apply = [r for r in mixing if r["problem"].endswith("apply") and r["program"] == "parop"]
    grad = [r for r in mixing if r["problem"].endswith("grad") and r["program"] == "parop"]
    assert apply and sum(apply[0][k] for k in ("all-to-all", "all-gather", "all-reduce")) == 0
    assert grad and grad[0]["all-reduce"] == 1 and grad[0]["all-to-all"] == grad[0]["all-gather"] == 0


def check_jaxdecomp_is_checked_where_installed_and_skipped_with_its_reason_otherwise(run):
    _, results, markdown = run
    installed = subprocess.run([sys.executable, "-c", "import jaxdecomp"], cwd=ROOT, env=_env()).returncode == 0
    for g in results["groups"]:
        if g["case"] not in "ab":
            continue
        r = g["results"]["jaxdecomp pfft3d"]
        if installed and g["case"] == "a":
            assert r["status"] == "ok" and r["error"] <= 1e-4, (g["problem"], r)
        else:
            assert r["status"] == "skipped", (g["problem"], r)
            assert ("real-to-complex" if installed else "not importable") in r["detail"], r
    hlo = {(r["problem"], r["program"]): r for r in results["hlo"]}
    jaxdecomp = {problem: r for (problem, program), r in hlo.items() if program == "jaxdecomp pfft3d"}
    assert set(jaxdecomp) == ({g["problem"] for g in results["groups"] if g["case"] == "a"} if installed else set())
    for problem, r in jaxdecomp.items():  # the all_to_alls of parop's plan into its "auto" layout, no gather
        assert r["all-to-all"] == hlo[(problem, "parop, out auto")]["all-to-all"] and r["all-gather"] == 0, r
    assert ("jaxdecomp / parop, out auto" in markdown) == installed


def test_jaxdecomp_not_importable_is_a_reason_to_skip(monkeypatch):
    sys.path.insert(0, str(ROOT))
    from benchmarks.fft import jaxdecomp_fft, jaxdecomp_note

    monkeypatch.setitem(sys.modules, "jaxdecomp", None)  # `import jaxdecomp` raises ModuleNotFoundError
    assert jaxdecomp_fft("c2c", (2, 4, 1)) == (None, None, "jaxdecomp not importable (ModuleNotFoundError)")
    assert jaxdecomp_note().startswith("jaxdecomp not importable (ModuleNotFoundError): its candidates are skipped")


def check_planning_memory_and_halo_cases(run):
    """Case h plans each operator within its limit (generous here: the benchmark's run
    holds the 1 s target), case i's FNO step on 8 devices needs at most 0.15x the serial
    step's memory per device, case j's halo-exchange program holds collective-permutes
    only."""
    _, results, _ = run
    planning, memory = results["tables"]["h"], results["tables"]["i"]
    assert planning and all(r["states"] > 0 for r in planning)
    assert all(r["seconds"] < 10 * (r["limit"] or 2) for r in planning), planning
    eight = [r for r in memory if r["devices"] == 8]
    assert eight and all(r["ratio"] <= 0.15 for r in eight), memory
    halo = [r for r in results["hlo"] if r["problem"].startswith("conv") and r["program"] == "parop"]
    assert halo and halo[0]["collective-permute"] == 6 and halo[0]["all-to-all"] == halo[0]["all-gather"] == 0


def check_compile_time_was_measured(run):
    _, results, _ = run
    assert len(results["compile"]) == 3
    for r in results["compile"]:
        assert r["plan_s"] > 0 and r["first_call_s"] > 0


def test_an_xla_abort_is_reported_and_the_benchmark_goes_on():
    """XLA can abort the process on some sharded FFTs (fft_handler.cc): `run.py` probes
    `jit(fftn)` in a child process (`benchmarks/fft.py`), reports the abort and probes
    the rest afresh."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fft import XlaProbe

    specs = [
        {"id": "boom", "kind": "c2c", "n": 8, "partition": [8, 1, 1], "simulate_abort": True},
        {"id": "fine", "kind": "r2c", "n": 8, "partition": [2, 4, 1]},
    ]
    status = XlaProbe(specs).wait()
    assert status["boom"].startswith("aborted"), status
    assert status["fine"] == "ok", status


def test_the_quick_run(tmp_path):
    """One `run.py --quick` (about a minute), then each check above on what it wrote:
    one test, so that the suite's workers never run it twice."""
    run = quick_run(tmp_path)
    checks = (check_quick_run_exits_cleanly_and_prints_the_tables, check_every_candidate_matches_numpy,
              check_hlo_collectives_match_the_plans,
              check_jaxdecomp_is_checked_where_installed_and_skipped_with_its_reason_otherwise,
              check_planning_memory_and_halo_cases, check_compile_time_was_measured)
    for check in checks:
        check(run)


def test_the_chain_scan_draws_chains_in_the_planning_targets_scope():
    """`planning_scan.py` draws FNO chains within the scope of the planning target (1-D to
    4-D, at most 8 layers, at most 3 mesh axes and 512 devices, a batch its split
    divides), plans one and reports it (no timing asserted)."""
    import math
    import random

    from benchmarks import planning_scan

    rng = random.Random(0)
    chains = [planning_scan.draw_chain(rng) for _ in range(300)]
    for c in chains:
        assert 1 <= len(c["grid"]) <= 4 and c["layers"] <= 8 and c["local_kernel"] in (None, 3)
        assert sum(p > 1 for p in c["partition"]) <= 3 and math.prod(c["partition"]) <= 512
        assert c["partition"][1] == 1 and c["batch"] % c["partition"][0] == 0
        assert c["reference"] is None or (c["reference"] != c["batch"] and c["reference"] % c["partition"][0] == 0)
    assert {len(c["grid"]) for c in chains} == {1, 2, 3, 4} and any(c["reference"] for c in chains)
    for c in (planning_scan.draw_chain(rng, hard=True) for _ in range(100)):
        assert len(c["grid"]) >= 3 and sum(p > 1 for p in c["partition"][2:]) == 3
    large = [planning_scan.draw_chain(rng, large=True) for _ in range(100)]
    for c in large:
        assert 12 <= c["batch"] <= 128 and c["batch"] % c["partition"][0] == 0
    assert any(c["batch"] % 2 for c in large) and any(c["reference"] for c in large)
    chain = dict(grid=(16,), modes=(4,), width=4, layers=2, local_kernel=3, partition=(1, 1, 2), batch=3, reference=1)
    row = planning_scan.plan_chain(chain)
    assert row["states"] > 0 and not row["gave_up"] and row["devices"] == 2
    text = planning_scan.report([row], seed=0)
    assert text.startswith("1 random FNO chains (seed 0)") and "| 1-D 16, width 4" in text


def test_the_scaling_model_takes_each_steps_own_counts_and_traffic():
    """`benchmarks/scaling.py` prices a P-device step from its own dry run: the
    one-device step's compute, each count (flops, bytes accessed) scaled by the P-device
    step's over the one-device step's of its kind, whichever of flops and bytes is
    slower, plus a start-up per collective and the bytes sent over NVLink inside a node
    and the network beyond; the one-device step has no communication."""
    from benchmarks.scaling import H100, step_time, table

    one = {"devices": 1, "partition": [1, 1, 1], "flops": 4e12, "bytes_accessed": 2e11, "collectives": {},
           "hlo_sent_bytes": 0}
    one_remat = {**one, "flops": 2e12, "bytes_accessed": 1e11}
    spread = {"devices": 64, "partition": [1, 1, 64], "flops": 2.5e12, "bytes_accessed": 1.5e11,
              "collectives": {"all-to-all": 8, "all-reduce": 2}, "hlo_sent_bytes": 1e9}
    t = step_time(spread, one, H100, one_remat)
    assert t["compute"] == pytest.approx(max(5e12 / H100.peak, 3e11 / H100.hbm))
    assert t["comm"] == pytest.approx(10 * H100.latency + 1e9 / H100.link)
    assert step_time(one, one, H100) == {"compute": max(4e12 / H100.peak, 2e11 / H100.hbm), "comm": 0.0,
                                         "step": max(4e12 / H100.peak, 2e11 / H100.hbm)}
    inside = step_time({**spread, "devices": H100.node}, one, H100, one_remat)
    assert inside["comm"] == pytest.approx(10 * H100.latency + 1e9 / H100.nvlink)
    rows = table({"1 dfno": one, "1 dfno remat": one_remat, "64 choice remat": spread}, "choice remat", H100)
    assert len(rows) == 4 and rows[3].startswith("| 64 | (1, 1, 64) |")
    assert rows[3].endswith(f"| {step_time(one, one, H100)['step'] / t['step']:.0%} |")


def test_the_combination_benchmark_compares_planned_moves_with_xlas():
    """`benchmarks/combine.py` at a small size: each candidate matches NumPy, parop's
    combinations move their data with `all_to_all`s only, its sum sends less than the
    two programs added by jnp's `+` (XLA's move gathers whole arrays), and the trade
    deals its blocks with one `collective-permute`."""
    from benchmarks.combine import markdown, measure

    rows = {(r["problem"].split()[0], r["candidate"].split(":")[0]): r for r in measure(16, rounds=1)}
    assert set(rows) == {(p, c) for p in ("sum", "product", "trade") for c in ("parop", "XLA")}
    for (problem, candidate), row in rows.items():
        assert row["error"] < 1e-5, row  # complex64 against float64
        if candidate == "parop":
            permutes = 1 if problem == "trade" else 0
            assert row["counts"]["all-gather"] == 0 and row["counts"]["collective-permute"] == permutes, row
    assert rows["sum", "XLA"]["counts"]["all-gather"] == 2
    assert rows["sum", "parop"]["sent_bytes"] < rows["sum", "XLA"]["sent_bytes"]
    assert "| sum 16x16 | parop: (D1 + D2) @ x |" in markdown(list(rows.values()))
