"""parop under `jax.distributed`: 2 CPU processes of 4 devices each on 127.0.0.1, gloo
collectives, one mesh over all 8 global devices; orbax checkpoints in a directory both
see.

Each test launches `multiprocess_worker.py` twice (process 0 and 1) with an explicit
environment (4 forced host devices, not the 8 of this suite's conftest), waits for
both with a deadline, and fails fast: the moment one worker exits non-zero, or the
deadline passes, every worker's process group is killed and the failure is reported
with the workers' output. The last tests check that harness itself: a worker that
raises, one that exits early, one that hangs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import COMPILE_FLAGS

WORKER = Path(__file__).with_name("multiprocess_worker.py")
REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0  # seconds for a whole multi-process run


class WorkerError(RuntimeError):
    """A worker exited with a non-zero status (the others were killed)."""


class WorkerTimeout(WorkerError):
    """The workers did not all finish before the deadline (all were killed)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(devices: int = 4) -> dict[str, str]:
    """The workers' environment, set explicitly: nothing of this process's XLA/JAX
    settings (the conftest's 8 forced devices) leaks into it; compiled quickly, as in the
    suite's own processes (see conftest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_", "PYTHONPATH"))}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {COMPILE_FLAGS}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def _tail(log, limit: int = 4000) -> str:
    log.seek(0)
    text = log.read().decode(errors="replace")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("[Gloo]"))
    return text[-limit:]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a zombie the kernel keeps
        pass


def run_workers(scenario: str, nproc: int = 2, timeout: float = TIMEOUT,
                spawned: list | None = None) -> list[dict]:
    """Run `nproc` workers of `scenario`; their `RESULT` dicts, by process id. Raises
    `WorkerError`/`WorkerTimeout` (with every worker's output) and kills every worker's
    process group on the way out, whatever happens."""
    port = free_port()
    env = worker_env()
    procs: list[subprocess.Popen] = [] if spawned is None else spawned
    logs = []
    with tempfile.TemporaryDirectory() as cwd:
        try:
            for i in range(nproc):
                log = tempfile.TemporaryFile(dir=cwd)
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), scenario, str(i), str(nproc), str(port)],
                    env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))
            deadline = time.monotonic() + timeout
            while True:
                codes = [p.poll() for p in procs]
                failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    raise WorkerError(_report(f"{scenario}: worker(s) exited with a failure "
                                              + ", ".join(f"worker {i} exited with {c}" for i, c in failed),
                                              logs))
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    running = [i for i, c in enumerate(codes) if c is None]
                    raise WorkerTimeout(_report(f"{scenario}: timed out after {timeout:.0f} s, "
                                                f"workers {running} still running", logs))
                time.sleep(0.05)
            results = []
            for i, log in enumerate(logs):
                log.seek(0)
                lines = [line for line in log.read().decode(errors="replace").splitlines()
                         if line.startswith("RESULT ")]
                if len(lines) != 1:
                    raise WorkerError(_report(f"{scenario}: worker {i} exited 0 without one RESULT line", logs))
                results.append(json.loads(lines[0][len("RESULT "):]))
            return results
        finally:
            for p in procs:
                _kill_group(p)
            for log in logs:
                log.close()


def _report(head: str, logs) -> str:
    return head + "".join(f"\n--- worker {i} output ---\n{_tail(log)}" for i, log in enumerate(logs))


def _gone(proc: subprocess.Popen) -> bool:
    """The worker was reaped and nothing of its process group is left."""
    if proc.returncode is None:
        return False
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- parop across processes ------------------------------------------------------------------

def test_distributed_3d_fft_over_two_processes():
    results = run_workers("fft")
    assert [r["process"] for r in results] == [0, 1]
    for r in results:
        # each process checked its 4 addressable shards of every output it computed
        assert r["checked"] == {
            "(2, 2, 2)": 12, "(8, 1, 1)": 12, "(1, 2, 4)": 12, "host (2, 2, 2)": 4, "dot test": True,
            "sum of two layouts": 4, "product of two layouts": 4,
            "rfft (2, 2, 2)": 4, "rfft (8, 1, 1)": 4, "rfft (2, 4, 1)": 4,
        }


def test_gradient_step_with_shared_weight_over_two_processes():
    results = run_workers("grad")
    assert [r["process"] for r in results] == [0, 1]
    for r in results:
        assert set(r["checked"]) == {
            "matrix-identity (1, 1, 8)", "matrix-identity (1, 2, 4)", "matrix-identity (2, 1, 4)",
            "matrix-diagonal (1, 4, 2)", "matrix-diagonal (2, 2, 2)",
        }
        assert all(count >= 16 for count in r["checked"].values())
        for before, after in r["loss"].values():
            assert after < before
    assert results[0]["loss"] == results[1]["loss"]


def test_checkpoint_save_and_restore_over_two_processes():
    pytest.importorskip("orbax.checkpoint")
    results = run_workers("checkpoint")
    assert [r["process"] for r in results] == [0, 1]
    for r in results:
        # θ and Adam's moments (6 arrays) x 4 shards on each process, and the step count
        assert r["checked"] == {"same (1, 8)": 25, "other (2, 4)": 25, "serial": 7}
        assert re.fullmatch(r"restore: step 1 of '.*-damaged': w\[0:64, 48:56\] does not match its checksum: .*",
                            r["damaged"]), r["damaged"]


def test_training_from_a_zarr_store_over_two_processes():
    pytest.importorskip("zarr")
    results = run_workers("store", timeout=300)  # compiles 7 programs per process; slow on a loaded machine
    assert [r["process"] for r in results] == [0, 1]
    for r in results:
        assert r["checked"] == {"normaliser": 1, "trained": 9, "batch split": 8, "whole-sample chunks": 4}
    # each process read exactly its share (checked in the workers): half of each sample,
    # then half the samples of a batch
    assert results[0]["read"] == results[1]["read"]
    assert results[0]["losses"] == results[1]["losses"]


# -- the harness: failures are reported, nothing is left running, nothing hangs ---------------

def test_a_worker_that_raises_is_reported_and_every_worker_is_killed():
    spawned: list[subprocess.Popen] = []
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 exited with 1") as info:
        run_workers("fail", spawned=spawned)
    assert not isinstance(info.value, WorkerTimeout)
    assert "worker 1 fails on purpose" in str(info.value)
    # process 0 was stuck in a collective that process 1 never joins: killed, not waited for
    assert time.monotonic() - start < TIMEOUT / 2
    assert len(spawned) == 2 and all(_gone(p) for p in spawned)
    assert spawned[0].returncode != 0  # killed by the harness (or failed on its own)


def test_a_worker_that_exits_early_is_reported_and_every_worker_is_killed():
    spawned: list[subprocess.Popen] = []
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 exited with 7"):
        run_workers("exit", spawned=spawned)
    assert time.monotonic() - start < TIMEOUT / 2
    assert len(spawned) == 2 and all(_gone(p) for p in spawned)


def test_hanging_workers_time_out_and_are_killed():
    spawned: list[subprocess.Popen] = []
    start = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"timed out after 3 s, workers \[0, 1\] still running"):
        run_workers("hang", timeout=3, spawned=spawned)
    assert time.monotonic() - start < 30
    assert len(spawned) == 2 and all(_gone(p) for p in spawned)
    assert all(p.returncode == -signal.SIGKILL for p in spawned)


def test_workers_get_their_own_device_count():
    env = worker_env()
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=4 {COMPILE_FLAGS}"
    assert "8" not in env["XLA_FLAGS"]
    assert env["PYTHONPATH"] == str(REPO)
