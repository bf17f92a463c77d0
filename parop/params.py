"""Parameters: naming, `po.init`, and checking a parameter dict against an operator.

Parameters are a plain dict `{name: jax.Array}`, one entry per distinct parametric
leaf. A leaf's name is its `name=` or one generated when it was built (`Matrix_0`,
...). The same leaf object used twice is one entry (a shared weight); two leaves
built with the same name share one weight, so their shapes and dtypes must agree.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Mapping

import jax
import numpy as np

from . import _dtypes
from .operator import Operator
from .operators.base import Leaf


def parametric_leaves(op: Operator) -> dict[str, Leaf]:
    """`{name: leaf}` for the parametric leaves of `op` (what `op.parameters` gives)."""
    if isinstance(op, Leaf):
        leaf = op.leaf
        return {} if leaf.param_shape is None else {leaf.name: leaf}
    found: dict[str, Leaf] = {}
    for child in op.children():
        for name, leaf in child.parameters.items():
            other = found.setdefault(name, leaf)
            if other is not leaf and (other.param_shape, other.param_dtype) != (leaf.param_shape, leaf.param_dtype):
                raise ValueError(
                    f"two leaves named {name!r} share one weight but disagree: {other!r} has "
                    f"{other.param_shape} {other.param_dtype}, {leaf!r} has "
                    f"{leaf.param_shape} {leaf.param_dtype}"
                )
    return found


def name_key(key: jax.Array, name: str) -> jax.Array:
    """`key` folded with a 128-bit digest of `name` (SHA-256, four 32-bit words), so that
    a weight's value depends only on the key and its name, not on the rest of the
    operator or on how it is distributed, and two names never meet the same stream."""
    digest = hashlib.sha256(name.encode()).digest()
    for i in range(0, 16, 4):
        key = jax.random.fold_in(key, int.from_bytes(digest[i:i + 4], "little"))
    return key


@functools.singledispatch
def init(op: Operator, key: jax.Array) -> dict[str, jax.Array]:
    """The parameters of `op`: `{name: array}`, deterministic in `key`.

    Each weight is drawn from `name_key(key, name)` (the key folded with a SHA-256
    digest of the name), so its value depends only on `key` and its name. A `Matrix` is normal with variance `1/n`
    (it keeps the variance of its input), a `Diagonal` starts at ones, a
    `PerModeMatrix` is normal with variance `1/c_in`, a `Convolution` with variance
    `1/(c_in * prod(kernel))`; complex dtypes give complex weights.

    ```python
    >>> S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    >>> θ = po.init(S, jax.random.key(0))      # {"mix": Array (50, 50) float32}
    ```
    """
    if not isinstance(op, Operator):
        raise TypeError(f"po.init takes a parop operator, got {type(op).__name__}")
    return {name: jax.jit(leaf.init_param)(name_key(key, name)) for name, leaf in op.parameters.items()}


def check_params(op: Operator, θ: Mapping) -> None:
    """A `ValueError` naming the key and what was expected if `θ` lacks a parameter of
    `op`, or has one of the wrong shape or dtype; a `TypeError` if one is not an array
    (a nested list is not converted: its dtype would be a guess). Extra keys are allowed."""
    expected = op.parameters
    if not expected:
        return
    if not isinstance(θ, Mapping):
        raise TypeError(f"{op!r}: parameters must be a dict {{name: array}}, got {type(θ).__name__}")
    for name, leaf in expected.items():
        if name not in θ:
            raise ValueError(
                f"{op!r}: parameter {name!r} of {leaf!r} is missing (expected shape "
                f"{leaf.param_shape}, dtype {leaf.param_dtype}); θ has {sorted(θ)}"
            )
        value = θ[name]
        if not isinstance(value, (jax.Array, np.ndarray)):
            raise TypeError(
                f"{op!r}: parameter {name!r} of {leaf!r} must be a JAX or NumPy array of shape "
                f"{leaf.param_shape} and dtype {leaf.param_dtype}, got a {type(value).__name__}; "
                f"convert it with jnp.asarray(value, {leaf.param_dtype.name!r})"
            )
        shape, dtype = value.shape, value.dtype
        if shape != leaf.param_shape or _dtypes.canonical(dtype) != leaf.param_dtype:
            raise ValueError(
                f"{op!r}: parameter {name!r} of {leaf!r} must have shape {leaf.param_shape} "
                f"and dtype {leaf.param_dtype}, got shape {shape} and dtype {dtype}"
            )
