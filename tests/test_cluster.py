"""docs/cluster.md runs: its SLURM script and training script, as written there, on one
machine: `srun` is played by a stand-in that starts 2 tasks (4 forced CPU devices
each, gloo collectives) with SLURM's variables, so `jax.distributed.initialize()` finds
them as it would on a cluster, and the sizes are the script's variables set small."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from test_multiprocess import REPO, worker_env

DOC = REPO / "docs" / "cluster.md"
TASKS = 2
TIMEOUT = 300.0

SRUN = f'''#!{sys.executable}
"""srun's stand-in: {TASKS} tasks of the command with SLURM's variables on 127.0.0.1;
the first failure ends the others."""
import os, socket, subprocess, sys, time
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
procs = [subprocess.Popen(sys.argv[1:], env=dict(
    os.environ, SLURM_JOB_ID="1", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="{TASKS}",
    SLURM_PROCID=str(i), SLURM_LOCALID=str(i), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{{port}}",
    XLA_FLAGS="{worker_env(devices=4)["XLA_FLAGS"]}"))
    for i in range({TASKS})]
while any(p.poll() is None for p in procs):
    failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
    if failed:
        for p in procs:
            p.kill()
        sys.exit(failed[0])
    time.sleep(0.05)
sys.exit(max(p.returncode for p in procs))
'''


def doc_block(first_line: str) -> str:
    """The fenced block of docs/cluster.md whose code starts with `first_line`."""
    for code in re.findall(r"```\w*\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S):
        if code.startswith(first_line):
            return code
    raise AssertionError(f"docs/cluster.md has no block starting with {first_line!r}")


@pytest.mark.long  # test_multiprocess.py trains from a store over 2 processes in the default pass
def test_the_slurm_recipe_runs_as_written(tmp_path):
    script = doc_block("#!/bin/bash")
    (tmp_path / "train.sbatch").write_text(script)
    (tmp_path / "train_fno.py").write_text(doc_block("# train_fno.py"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    shared = tmp_path / "shared"
    # the script itself (the dry run) sees all 8 devices of the job; each srun task its 4
    env = {**worker_env(devices=4 * TASKS), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo", "SLURM_NNODES": str(TASKS), "SHARED": str(shared),
           "GRID": "8", "WIDTH": "4", "MODES": "4", "LAYERS": "1", "SAMPLES": "8", "TEST": "4", "BATCH": "4",
           "STEPS": "2", "EVERY": "1"}
    proc = subprocess.Popen(["bash", "train.sbatch"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the recipe did not finish in {TIMEOUT:.0f} s:\n{out.decode(errors='replace')[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert re.search(r"^devices 8, last loss \d+\.\d{4}, test error \d+\.\d{4}$", text, flags=re.M), text[-4000:]
    assert "train.zarr: samples 4 to 8 of 8 written" in text  # each task its part
    assert sorted(p.name for p in (shared / "runs" / "fno").iterdir() if p.name.isdigit()) == ["1", "2"]
