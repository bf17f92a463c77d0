"""The documentation runs: every ```python block of README.md and docs/*.md.

The blocks of one file run in order, in one namespace that starts empty, in a fresh
temporary working directory (a checkpoint written to "runs/..." lands there), on the 8
forced CPU devices of this suite's conftest. They run with JAX's default settings
(64-bit types off, standard dtype promotion), as a reader who copies them gets them:
the conftest turns on float64 and strict promotion for the library's own tests.

Two markers, an HTML comment on the line before a fence, say more:

- `<!-- not run: REASON -->` before a ```python block: an illustration that cannot run
  here (it needs several hosts, or data the reader has). It is only compiled (a
  syntax check) and reported as skipped with REASON. There must be few of them.
- `<!-- output -->` before a ```text block: what the ```python block before it
  prints, exactly (trailing spaces aside). The test compares them.

The docstrings' `>>>` examples run as doctests in test_docstrings.py.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import jax
import pytest

import parop as po
import parop.nn

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
OUTPUT = re.compile(r"<!--\s*output\s*-->")
MAX_NOT_RUN = 3  # across all files


@dataclass(frozen=True)
class Block:
    path: Path
    info: str  # the fence's info string: "python", "text", "bash", ...
    line: int  # 1-based line of the block's first line of code
    source: str
    marker: str  # the HTML comment on the line before the fence ("" if none)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> str | None:
        found = NOT_RUN.fullmatch(self.marker)
        return found.group(1) if found else None


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(```+)(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, info = fence.groups()
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = before if before.startswith("<!--") else ""
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end]]
        found.append(Block(path, info.strip(), i + 2, "\n".join(body) + "\n", marker))
        i = end + 1
    return found


def runnable(block: Block) -> bool:
    return block.info == "python" and block.not_run is None


ALL = [b for path in FILES for b in blocks(path)]
SKIPPED = [b for b in ALL if b.info == "python" and b.not_run is not None]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    printed = None
    found = blocks(path)
    assert any(runnable(b) for b in found), f"{path.name} has no runnable python block"
    with jax.enable_x64(False), jax.numpy_dtype_promotion("standard"):
        for block in found:
            if block.info == "text" and OUTPUT.fullmatch(block.marker):
                assert printed is not None, f"{block.name}: an output block must follow a python block"
                assert _lines(printed) == _lines(block.source), (
                    f"{block.name}: the block above prints\n{printed}\nbut the page shows\n{block.source}")
                continue
            if not runnable(block):
                continue
            code = compile("\n" * (block.line - 1) + block.source, str(block.path), "exec")
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(code, namespace)
            finally:
                print(f"--- {block.name} printed:\n{out.getvalue()}")
            printed = out.getvalue()


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.name)
def test_blocks_not_run_compile(block):
    compile(block.source, block.name, "exec")
    pytest.skip(f"{block.name}: not run: {block.not_run}")


def test_few_blocks_are_not_run_and_each_says_why():
    assert len(SKIPPED) <= MAX_NOT_RUN, [b.name for b in SKIPPED]
    assert all(b.not_run.strip() for b in SKIPPED)
    misplaced = [b.name for b in ALL if b.info != "python" and b.marker and NOT_RUN.fullmatch(b.marker)]
    assert not misplaced, f"`not run` marks a block that is not python: {misplaced}"


def test_links_stay_inside_the_repository():
    """Every Markdown link points at a file of this repository; nothing cites a document
    outside it."""
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            assert "://" not in target and not target.startswith(("/", "mailto:")), (path.name, target)
            file = target.split("#")[0]
            if file:
                resolved = (path.parent / file).resolve()
                assert resolved.is_relative_to(ROOT) and resolved.exists(), (path.name, target)
        for outside in ("shared/", "DESIGN", "§"):
            assert outside not in text, (path.name, outside)


def test_every_public_name_is_in_the_reference():
    """Each name parop exports is described in docs/ (as `name` or `po.name`)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in FILES if p.parent.name == "docs")
    names = list(po.__all__) + list(parop.nn.__all__) + ["save", "restore", "latest_step", "dot_test",
                                                          "darcy_flow"]
    missing = [n for n in names if f"`{n}" not in text and f"`po.{n}" not in text and f".{n}`" not in text
               and f".{n}(" not in text]
    assert not missing, missing


def test_markers_are_well_formed():
    """A marker that looks like one of the two but does not parse would silently do nothing."""
    for path in FILES:
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.search(r"<!--\s*(not run|output)", line):
                assert NOT_RUN.fullmatch(line.strip()) or OUTPUT.fullmatch(line.strip()), (path.name, line)
