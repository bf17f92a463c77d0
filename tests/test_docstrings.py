"""Every docstring example in `parop` runs as a doctest, with `import parop as po`,
`jax`, `jax.numpy as jnp` and `numpy as np` in scope (as the examples assume), in a
temporary directory (some write a checkpoint or a store), with JAX's default settings
(64-bit types off, standard dtype promotion) as a reader who copies one gets them. The
Markdown fences around an example are not part of it. What an example shows must hold:
the planner's helpers their exact results, the operators their values and shapes, the
dry run dfno's memory."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop

MODULES = sorted(info.name for info in pkgutil.walk_packages(parop.__path__, "parop.")
                 if not info.name.endswith("__main__"))


class _FencedParser(doctest.DocTestParser):
    """Reads a docstring without its Markdown fence lines (a fence right after an
    example's output would otherwise read as part of that output)."""

    def parse(self, string, name="<string>"):
        lines = string.splitlines()
        return super().parse("\n".join("" if line.strip().startswith("```") else line for line in lines), name)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    scope = {"po": parop, "jax": jax, "jnp": jnp, "np": np}
    finder = doctest.DocTestFinder(parser=_FencedParser())
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    with jax.enable_x64(False), jax.numpy_dtype_promotion("standard"):
        for test in finder.find(module, name, extraglobs=scope):
            runner.run(test, out=report.append)
    assert not runner.failures, "".join(report)
