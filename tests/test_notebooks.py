"""The tutorial notebooks run top to bottom, in a quick mode (20 FNO training steps),
and the committed notebooks are the ones `notebooks/_build.py` writes (and stay small).

Each notebook runs in a fresh kernel of *this* interpreter: the test writes a kernelspec
for `sys.executable` into a temporary directory (nothing outside the `dev` extra, no
kernelspec installed by hand), with the repository root on the kernel's `PYTHONPATH`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
KERNEL = "parop-notebooks"
CELL_TIMEOUT = 300  # seconds per cell
QUICK_STEPS = "20"


@pytest.fixture(scope="module")
def kernel_manager(tmp_path_factory):
    """A factory of kernel managers for a kernelspec running `sys.executable`."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    prefix = tmp_path_factory.mktemp("jupyter")
    env = {
        "PAROP_NOTEBOOK_STEPS": QUICK_STEPS,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    install(kernel_name=KERNEL, prefix=str(prefix), env=env)
    specs = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    assert specs.get_kernel_spec(KERNEL).argv[0] == sys.executable
    return lambda: KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_there_are_five_notebooks():
    assert [p.stem for p in NOTEBOOKS] == [
        "01_operator_algebra", "02_distributed_fft", "03_weight_sharing_and_reduce", "04_distributed_fno",
        "05_fno_3d",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_manager):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, km=kernel_manager(), kernel_name=KERNEL, timeout=CELL_TIMEOUT, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError (naming the cell) when a cell fails
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_committed_notebooks_match_the_build_script():
    spec = importlib.util.spec_from_file_location("_build", NOTEBOOK_DIR / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for name in build.NOTEBOOKS:
        committed = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        want = build.build(name)
        got = [(c.cell_type, c.source) for c in committed.cells]
        assert got == [(c.cell_type, c.source) for c in want.cells], (
            f"{name}.ipynb differs from notebooks/_build.py: run `python notebooks/_build.py --execute {name[:2]}`"
        )
        unrun = [i for i, c in enumerate(committed.cells) if c.cell_type == "code" and not c.get("execution_count")]
        assert not unrun, f"{name}.ipynb is saved without outputs (code cells {unrun}): run it with --execute"
        size = (NOTEBOOK_DIR / f"{name}.ipynb").stat().st_size
        assert size < 300_000, f"{name}.ipynb is {size} bytes"
