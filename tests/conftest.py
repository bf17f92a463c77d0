"""Test set-up: 8 forced CPU host devices (before jax is imported), float64 enabled,
strict dtype promotion so that an accidental upcast fails loudly.

XLA:CPU generates code with LLVM at optimisation level 0, in both passes: the same HLO
programs (fusions, layouts, collectives) and the same IEEE arithmetic (XLA:CPU uses no
fast-math either way), compiled in about 60% of the time, which is most of what the
suite's many small programs cost (the benchmark smoke test's subprocess inherits it).
The notebooks, the demo and the multi-process tests run in processes of their own and
compile as users do."""

import os

LONG = os.environ.get("PAROP_LONG_TESTS") == "1"

os.environ["XLA_FLAGS"] = " ".join(filter(None, [
    os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (long random searches and full-size runs, each also covered by
    a shorter test here) run only with PAROP_LONG_TESTS=1, which `.ci/run` sets for a
    second pass: the README's test command stays within five minutes on 2 cores."""
    if LONG:
        return
    skip = pytest.mark.skip(reason="long test: run with PAROP_LONG_TESTS=1 (.ci/run does)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
