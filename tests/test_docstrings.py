"""The planner's docstring examples run as doctests: its small helpers (the bound's
move counts, a route mapped by a symmetry, a context's spreads) show exact results, and
those must stay true. The public API's docstring examples are illustrations that assume
`import parop as po` and data in scope; the README's and docs' blocks run instead
(`test_docs.py`)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["parop.distributed.plan.bound", "parop.distributed.plan.actions", "parop.distributed.plan.context",
           "parop.distributed.plan.errors"]


@pytest.mark.parametrize("name", MODULES)
def test_the_planners_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted and not result.failed, result
