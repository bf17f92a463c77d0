"""The tutorial notebooks run top to bottom from their sources (`notebooks/NN_name.py`,
jupytext percent format) in a quick mode (20 FNO training steps on 100 samples), and each committed
`NN_name.ipynb` is its source's cells with the outputs of a full run (what
`python notebooks/build.py` writes), small enough to keep in git.

Each notebook runs in a fresh kernel of *this* interpreter: the test writes a kernelspec
for `sys.executable` into a temporary directory (nothing outside the `dev` extra, no
kernelspec installed by hand), with the repository root on the kernel's `PYTHONPATH`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
SOURCES = sorted(NOTEBOOK_DIR.glob("[0-9]*.py"))
KERNEL = "parop-notebooks"
CELL_TIMEOUT = 300  # seconds per cell
QUICK_STEPS, QUICK_SAMPLES = "20", "100"


@pytest.fixture(scope="module")
def kernel_manager(tmp_path_factory):
    """A factory of kernel managers for a kernelspec running `sys.executable`."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    prefix = tmp_path_factory.mktemp("jupyter")
    env = {
        "PAROP_NOTEBOOK_STEPS": QUICK_STEPS,
        "PAROP_NOTEBOOK_SAMPLES": QUICK_SAMPLES,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    install(kernel_name=KERNEL, prefix=str(prefix), env=env)
    specs = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    assert specs.get_kernel_spec(KERNEL).argv[0] == sys.executable
    return lambda: KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_there_are_five_notebooks_each_with_its_source():
    names = [
        "01_operator_algebra", "02_distributed_fft", "03_weight_sharing_and_reduce", "04_distributed_fno",
        "05_fno_3d",
    ]
    assert [p.stem for p in SOURCES] == names
    assert [p.stem for p in sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb"))] == names


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs(source, kernel_manager):
    from nbclient import NotebookClient

    nb = jupytext.read(source)
    client = NotebookClient(
        nb, km=kernel_manager(), kernel_name=KERNEL, timeout=CELL_TIMEOUT, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError (naming the cell) when a cell fails
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_its_source_run_in_full(source):
    path = source.with_suffix(".ipynb")
    committed = nbformat.read(path, as_version=4)
    rebuild = f"run `python notebooks/build.py {source.stem[:2]}`"
    got = [(c.cell_type, c.source) for c in committed.cells]
    assert got == [(c.cell_type, c.source) for c in jupytext.read(source).cells], (
        f"{path.name} differs from its source {source.name}: {rebuild}")
    code = [c for c in committed.cells if c.cell_type == "code"]
    unrun = [i for i, c in enumerate(code) if not c.get("execution_count")]
    assert not unrun, f"{path.name} is saved without outputs (code cells {unrun}): {rebuild}"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not run in order"
    text = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert f" {QUICK_STEPS} training steps" not in text, f"{path.name} shows the tests' quick mode: {rebuild}"
    assert path.stat().st_size < 300_000, f"{path.name} is {path.stat().st_size} bytes"
