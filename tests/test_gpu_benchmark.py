"""`benchmarks/gpu.py --quick` runs to the end on the CPU (the GPU run's code, at small
sizes), every candidate matching its reference; and the parameter count its PyTorch
peer is checked with (`benchmarks/gpu_torch.py`, which needs torch and neuraloperator,
absent here) is parop's own."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks.gpu_torch import parop_param_count
from conftest import child_env
from parop.nn import FNO

ROOT = Path(__file__).resolve().parent.parent


def quick_gpu_run(out: Path, skip: list[str]) -> dict:
    """`gpu.py --quick` on the CPU, the sections `skip` left out: its `gpu.json`."""
    env = child_env("JAX_ENABLE_X64", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick", "--skip", *skip,
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    assert "errors" not in report, report.get("errors")
    assert set(report["sections"]) == {"bandwidth", "fft", "fno", "kernels", "memory", "tests"} - set(skip)
    return report["sections"]


def test_quick_gpu_benchmark_times_the_ffts_and_fno_steps(tmp_path):
    sections = quick_gpu_run(tmp_path, ["neuralop", "kernels", "memory", "tests"])
    assert {row["status"] for row in sections["fft"]} == {"ok"}
    assert {row["candidate"] for row in sections["fft"]} >= {"parop kron of DFTs", "jnp.fft.fftn"}
    (fno,) = sections["fno"]
    assert [row["check"].split()[0] for row in fno["rows"]] == ["ok"] * 4
    assert "## 3-D FFTs" in (tmp_path / "gpu.md").read_text()


@pytest.mark.long
def test_quick_gpu_benchmark_counts_kernels_and_dry_runs(tmp_path):
    sections = quick_gpu_run(tmp_path, ["fft", "fno", "neuralop", "tests"])
    (kernels,) = sections["kernels"]
    assert kernels["parop serial"]["fft"] > 0 and kernels["plain JAX FNO"]["fft"] > 0
    assert [row["remat"] for row in sections["memory"]] == [False, True]
    assert all(row["predicted_bytes"] > 0 for row in sections["memory"])


@pytest.mark.parametrize("grid, width, modes, layers", [
    ((16,), 6, (5,), 2), ((12, 10), 4, (5, 3), 1), ((8, 8, 8), 3, (4, 3, 4), 2), ((8, 6, 4, 4), 2, (2, 2, 2, 3), 1),
])
def test_the_peer_parameter_count_is_parops(grid, width, modes, layers):
    θ = FNO(grid, width=width, modes=modes, layers=layers).init(jax.random.key(0))
    count = sum(v.size * (2 if np.iscomplexobj(v) else 1) for v in θ.values())
    assert parop_param_count(grid, width, modes, layers) == count


def test_failures_for_want_of_devices_are_listed_apart(tmp_path):
    """On one GPU a test of several devices fails with parop's device check: the report
    lists it apart from the failures that are wrong answers."""
    from benchmarks.gpu import failures

    (tmp_path / "r.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_fno" name="test_a"><failure message="ValueError: FNO.distribute: '
        'partition (2, 1, 2, 1) needs 4 devices, but 1 are available&#10;more">trace</failure></testcase>'
        '<testcase classname="tests.test_operators" name="test_b[x]"><failure message="AssertionError: '
        'not close">trace</failure></testcase>'
        '<testcase classname="tests.test_operators" name="test_c"/>'
        '</testsuite></testsuites>')
    failed, too_few = failures(tmp_path / "r.xml")
    assert failed == ["FAILED tests/test_operators.py::test_b[x] - AssertionError: not close"]
    assert too_few == ["FAILED tests/test_fno.py::test_a - ValueError: FNO.distribute: partition (2, 1, 2, 1) "
                       "needs 4 devices, but 1 are available"]
