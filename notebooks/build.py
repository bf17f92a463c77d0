"""Writes each tutorial notebook `NN_name.ipynb` from its source `NN_name.py`, run top
to bottom and saved with its outputs.

    python notebooks/build.py          # all five
    python notebooks/build.py 04 05    # only the notebooks whose name contains "04" or "05"

The sources are jupytext percent-format scripts (`# %%` code cells, `# %% [markdown]`
text cells): edit them, never the `.ipynb`. The kernel runs this interpreter, with the
repository root on its `PYTHONPATH`, so the notebooks run from a checkout without
installing `parop`. Leave `PAROP_NOTEBOOK_STEPS` and `PAROP_NOTEBOOK_SAMPLES` unset:
the committed notebooks show a full run (1200 FNO training steps in 04, 300 in 05),
not the test suite's quick mode.
This is `jupytext --to ipynb --execute` without nbconvert, with each cell's streams
merged (a progress bar is one output), cell ids numbered, not random, and no
timestamps in the cells' metadata (a rebuild's diff shows what changed).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = sorted(HERE.glob("[0-9][0-9]_*.py"))


def execute(source: Path, timeout: int = 3600) -> nbformat.NotebookNode:
    """The notebook of `source`, executed in a fresh `python3` kernel run from `notebooks/`."""
    nb = jupytext.read(source)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", coalesce_streams=True, record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return nb


def main(only: list[str]) -> None:
    for name in ("PAROP_NOTEBOOK_STEPS", "PAROP_NOTEBOOK_SAMPLES"):
        if name in os.environ:
            sys.exit(f"unset {name}: the committed notebooks show the full run")
    for source in SOURCES:
        if only and not any(o in source.stem for o in only):
            continue
        start = time.perf_counter()
        nb = execute(source)
        path = source.with_suffix(".ipynb")
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.0f} KiB), executed in "
              f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
