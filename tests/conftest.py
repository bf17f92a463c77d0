"""Test set-up: 8 forced CPU host devices (before jax is imported), float64 enabled,
strict dtype promotion so that an accidental upcast fails loudly."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

import pytest  # noqa: E402

LONG = os.environ.get("PAROP_LONG_TESTS") == "1"


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
