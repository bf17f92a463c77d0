"""Test set-up: 8 forced CPU host devices (before jax is imported), float64 enabled,
strict dtype promotion so that an accidental upcast fails loudly.

XLA:CPU compiles quickly here (`COMPILE_FLAGS`), in both passes: LLVM at optimisation
level 0, and fusions emitted by XLA's older emitters (not its MLIR fusion emitters);
each module's machine code generated in one piece, and XLA's own operations (products,
FFTs) run on one thread, where pytest-xdist's workers already share the cores (each
flag where this jaxlib has it). The same HLO programs (collectives, layouts, fusions;
only a lone slice, pad or reduction is not wrapped in a fusion of its own) and the same
IEEE operations (XLA:CPU uses no fast-math either way), compiled in about a quarter of
the time, which is most of what the suite's many small programs cost (the
benchmark smoke test's subprocess inherits the flags, and the multi-process tests'
workers are given them). Not always the same roundings: about half of
`jax.random.uniform`'s values differ in the last bit from a default build's (the random
bits are the same). The notebooks and the demo run in processes of their own and
compile as users do.

On a GPU (`python benchmarks/gpu.py` runs the serial tests there) float32 and complex64
products run at full precision (`jax_default_matmul_precision="highest"`): JAX's default
on NVIDIA GPUs multiplies float32 in TF32 (10-bit mantissas, errors of about 1e-3 of
the result), which the 32-bit tolerances here, set for float32 arithmetic, do not
allow. Elsewhere JAX's default stands (XLA:CPU multiplies float32 at full precision).

Compiled programs are shared between the tests of one run through JAX's persistent
compilation cache, in a fresh temporary directory (`PAROP_JAX_CACHE`, set once by the
pytest process that starts the run, so its xdist workers share it, and removed at its
end; `.ci/run` sets it for both of its passes): many tests compile the same small
programs, and the cache key is the whole program and its compile options."""

import importlib.util
import mmap
import os
import shutil
import tempfile
from pathlib import Path

LONG = os.environ.get("PAROP_LONG_TESTS") == "1"


def child_env(*dropped: str, **values: str) -> dict[str, str]:
    """This process's environment for a child process (a benchmark, the demo, a
    command), less the variables `dropped` and with `values` set: a child that sets its
    own device count or dtypes must not inherit this suite's.

    >>> child_env("XLA_FLAGS", JAX_PLATFORMS="cpu")["JAX_PLATFORMS"]
    'cpu'"""
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(values)
    return env


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA has the flag `flag`: its name is a string constant of one
    of jaxlib's libraries, as XLA registers it (not only a field of its options' message,
    which may outlive the flag). XLA ends the process on an unknown flag in `XLA_FLAGS`,
    and a later jaxlib may drop one that only picks an implementation."""
    name = b"\0" + flag.encode() + b"\0"
    for library in Path(importlib.util.find_spec("jaxlib").origin).parent.glob("*.so"):
        with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
            if text.find(name) >= 0:
                return True
    return False


# each where this jaxlib names it: LLVM at -O0; fusions by the older emitters; each module's code generated
# in one piece and XLA's own ops on one thread (three workers on two cores: threads of their own only compete)
COMPILE_FLAGS = " ".join(f"--{name}={value}" for name, value in [
    ("xla_backend_optimization_level", 0), ("xla_cpu_use_fusion_emitters", "false"),
    ("xla_cpu_parallel_codegen_split_count", 1), ("xla_cpu_multi_thread_eigen", "false"),
] if _xla_knows(name))

os.environ["XLA_FLAGS"] = " ".join(filter(None, [
    os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8", COMPILE_FLAGS,
]))

import jax  # noqa: E402

OWN_CACHE = "PAROP_JAX_CACHE" not in os.environ  # this process made the cache directory: it removes it
if OWN_CACHE:
    os.environ["PAROP_JAX_CACHE"] = tempfile.mkdtemp(prefix="parop-jax-cache-")
jax.config.update("jax_compilation_cache_dir", os.environ["PAROP_JAX_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
if jax.default_backend() == "gpu":
    jax.config.update("jax_default_matmul_precision", "highest")

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


def pytest_unconfigure(config):
    if OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["PAROP_JAX_CACHE"], ignore_errors=True)
