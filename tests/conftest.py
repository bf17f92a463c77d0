"""Test set-up: 8 forced CPU host devices (before jax is imported), float64 enabled,
strict dtype promotion so that an accidental upcast fails loudly."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
