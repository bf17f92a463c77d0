"""Parameters: naming, `po.init`, and checking a parameter dict against an operator.

Parameters are a plain dict `{name: jax.Array}`, one entry per distinct parametric
leaf. Names are a function of the operator, never of what else the process built:

- a leaf built with `name=` has that name; two leaves with the same name are one
  weight (their shapes and dtypes must agree);
- an unnamed leaf is named by the operator it is used in (the *root*: the operator
  given to `po.init`, applied, or distributed): a walk over the root's leaves, in the
  order they appear, gives each distinct unnamed leaf object `Matrix_0`, `Matrix_1`,
  ... (a count per class, skipping names the root uses explicitly). The same object
  in two places is one weight (its adjoint `M.H` too); two unnamed leaves built
  separately are two. The adjoint of a composition walks its factors in the original
  order (`Compose.right_to_left`), so `A`, `A.H`, `A.T` and `A + A.H` name their
  leaves alike.

`Operator.named` is the root with every parametric leaf carrying its name; applying,
`.parameters` and distributing use it. Leaf objects survive `jax.jit` and `tree_util`
round trips (they are the pytree's static data), and a combinator's pytree data holds
its sharing pattern (`sharing`), so `A @ A` (one weight) and `A @ B` (two) never share
a trace.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Mapping

import jax
import numpy as np

from . import _dtypes
from .operator import Operator, check_operator, map_children
from .operators.base import Leaf


def occurrences(op: Operator) -> tuple[Leaf, ...]:
    """The parametric leaves of `op` (adjoints included), each time it appears, in the
    order names are given: children in order, a `Compose` built by `.H` from its last
    operator to its first (the order of the composition it is the adjoint of)."""

    def make():
        if isinstance(op, Leaf):
            return (op,) if op.param_shape is not None else ()
        return tuple(leaf for child in op.naming_order() for leaf in occurrences(child))

    return op._cache("_occurrences", make)


def unnamed_owners(op: Operator) -> list[Leaf]:
    """The distinct unnamed leaf objects that own a weight in `op`, in naming order."""
    owners = {id(leaf.leaf): leaf.leaf for leaf in occurrences(op) if leaf.name is None}
    return list(owners.values())


def sharing(op: Operator) -> tuple[int, ...]:
    """Which unnamed parametric leaves of `op` are one object: for each, in naming order,
    the position of the first one with the same owner. `A @ A` gives `(0, 0)`, `A @ B`
    `(0, 1)`: equal structure, different weights."""
    first: dict[int, int] = {}
    unnamed = (leaf.leaf for leaf in occurrences(op) if leaf.name is None)
    return tuple(first.setdefault(id(owner), k) for k, owner in enumerate(unnamed))


def named(*roots: Operator) -> tuple[Operator, ...]:
    """`roots` (one operator, or the operators of one model, named together) with every
    unnamed parametric leaf replaced by a copy carrying its generated name: the `k`-th
    distinct unnamed object of a class, in naming order, is `f"{class}_{k}"`, `k`
    counting past names used explicitly. Each root is returned itself where it has
    nothing to name."""
    explicit = {leaf.name for root in roots for leaf in occurrences(root) if leaf.name is not None}
    counts: Counter[str] = Counter()
    copies: dict[int, Leaf] = {}
    for root in roots:
        for owner in unnamed_owners(root):
            if id(owner) in copies:
                continue
            prefix = type(owner).__name__
            while (name := f"{prefix}_{counts[prefix]}") in explicit:
                counts[prefix] += 1
            counts[prefix] += 1
            copies[id(owner)] = _with_name(owner, name)
    return tuple(_renamed(root, copies) for root in roots)


def _renamed(op: Operator, copies: dict[int, Leaf]) -> Operator:
    """`op` with each unnamed leaf replaced by its named copy (`copies`: by the id of the
    unnamed object; a function of its own, not a closure calling itself: that would be a
    reference cycle per call, left to the garbage collector)."""
    if not any(leaf.name is None for leaf in occurrences(op)):
        return op
    if isinstance(op, Leaf):
        copy = copies[id(op.leaf)]
        return copy if op is op.leaf else copy.H
    return map_children(op, lambda child: _renamed(child, copies))


def _with_name(leaf: Leaf, name: str) -> Leaf:
    """A copy of the unnamed `leaf` named `name`."""
    copy = object.__new__(type(leaf))
    for key, value in vars(leaf).items():
        if not key.startswith("_"):
            object.__setattr__(copy, key, value)
    object.__setattr__(copy, "name", name)
    return copy


def parametric_leaves(op: Operator) -> dict[str, Leaf]:
    """`{name: leaf}` for the parametric leaves of `op` (what `op.parameters` gives):
    the leaves of `op.named`, each carrying its name."""
    found: dict[str, Leaf] = {}
    for leaf in (occurrence.leaf for occurrence in occurrences(op.named)):
        other = found.setdefault(leaf.name, leaf)
        if other is not leaf and (other.param_shape, other.param_dtype) != (leaf.param_shape, leaf.param_dtype):
            raise ValueError(
                f"two leaves named {leaf.name!r} share one weight but disagree: {other!r} has "
                f"{other.param_shape} {other.param_dtype}, {leaf!r} has "
                f"{leaf.param_shape} {leaf.param_dtype}"
            )
    return found


def check_key(key, where: str) -> jax.Array:
    """`key` if it is one JAX random key: a typed key of shape `()` (`jax.random.key(0)`)
    or a raw `uint32` key of shape `(2,)` (`jax.random.PRNGKey(0)`); a `TypeError` naming
    `where` otherwise (an int seed, a batch of keys, anything else).

    ```python
    >>> check_key(jax.random.key(0), "po.init(A)").shape
    ()
    >>> check_key(0, "po.init(A)")
    Traceback (most recent call last):
    TypeError: po.init(A): key must be one JAX random key, jax.random.key(0) (or jax.random.PRNGKey(0)), got int 0
    ```
    """
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    if (typed and shape == ()) or (not typed and dtype == np.uint32 and shape == (2,)):
        return key
    got = f"a key array of shape {shape}" if typed else (
        f"an array of shape {shape} and dtype {dtype}" if dtype is not None else f"{type(key).__name__} {key!r}"[:80])
    raise TypeError(f"{where}: key must be one JAX random key, jax.random.key(0) (or jax.random.PRNGKey(0)), "
                    f"got {got}")


def name_key(key: jax.Array, name: str) -> jax.Array:
    """`key` folded with a 128-bit digest of `name` (SHA-256, four 32-bit words), so that
    a weight's value depends only on the key and its name, not on the rest of the
    operator or on how it is distributed, and two names never meet the same stream."""
    digest = hashlib.sha256(name.encode()).digest()
    for i in range(0, 16, 4):
        key = jax.random.fold_in(key, int.from_bytes(digest[i:i + 4], "little"))
    return key


def name_keys(key: jax.Array, names) -> dict[str, jax.Array]:
    """`{name: name_key(key, name)}` for each of `names`: the keys an initialiser's jitted
    draw takes as arguments. Folded there, inside the program, the threefry folds would
    compile on XLA:CPU about as slowly as the draws (a program of 12 small draws: 0.64 s
    given its keys, 1.98 s folding them)."""
    return {name: name_key(key, name) for name in names}


def init(op: Operator, key: jax.Array) -> dict[str, jax.Array]:
    """The parameters of `op`: `{name: array}`, deterministic in `key`.

    Each weight is drawn from `name_key(key, name)` (the key folded with a SHA-256
    digest of the name), so its value depends only on `key` and its name. A `Matrix` is normal with variance `1/n`
    (it keeps the variance of its input), a `Diagonal` starts at ones, a
    `PerModeMatrix` is normal with variance `1/c_in`, a `Convolution` with variance
    `1/(c_in * prod(kernel))`; complex dtypes give complex weights. A distributed
    operator's weights (and those of what combines distributed operators) are each drawn
    where they live (the first program that takes them keeps them there): one jitted
    initialiser whose output shardings are the weights', so each device computes only
    its own shards. The initialisers are kept on the operator: drawn again (another
    key), nothing compiles.

    ```python
    >>> S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    >>> θ = po.init(S, jax.random.key(0))      # {"mix": Array (50, 50) float32}
    ```
    """
    check_operator(op, "po.init")
    check_key(key, f"po.init({op!r})")

    keys = name_keys(key, op.parameters)
    drawn: dict = {}
    for names, program in op._cache("_initializers", lambda: _initializers(op)):
        drawn.update(program({name: keys[name] for name in names}))
    return {name: drawn[name] for name in keys}


def _initializers(op: Operator) -> tuple:
    """`po.init`'s jitted programs for `op`, `(names, {name: key} -> {name: value})`: one
    for the weights a distributed operator places (each drawn into its sharding), one for
    the others, each taking its weights' keys (`name_keys`). One compilation each, where
    a program per weight cost one each (18 small weights: 3.9 s on XLA:CPU, 0.8 s so)."""
    leaves = op.parameters
    shardings = op.named._init_shardings() if op.distributed else {}
    placed = tuple(name for name in leaves if shardings.get(name) is not None)
    free = tuple(name for name in leaves if shardings.get(name) is None)

    def draw(keys: dict) -> dict:
        return {name: leaves[name].init_param(k) for name, k in keys.items()}

    return tuple((names, jax.jit(draw, out_shardings=where)) for names, where in (
        (placed, {name: shardings[name] for name in placed}), (free, None)) if names)


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
