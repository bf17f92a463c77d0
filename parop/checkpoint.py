"""Sharded checkpoints of pytrees of JAX arrays (a model's θ, an optimiser's state) with
orbax-checkpoint (`pip install parop[train]`), restored onto any sharding: the same
partition, another partition or mesh, or a single device.

```python
>>> from parop import checkpoint
>>> D = po.distribute(op, (1, 8)); θ = po.init(D, key); state = opt.init(θ)
>>> checkpoint.save("run/ckpt", {"θ": θ, "opt": state}, step=100)
>>> E = po.distribute(op, (2, 4)); θ2 = po.init(E, key)           # another partition
>>> saved = checkpoint.restore("run/ckpt", {"θ": θ2, "opt": opt.init(θ2)})   # the latest step
>>> saved["θ"]["w"].sharding == θ2["w"].sharding                   # θ's values, θ2's shardings
True
```

A checkpoint is an orbax `CheckpointManager` directory, one standard pytree item per
step (`path/<step>/`); every process of a multi-process run calls `save` and `restore` with
the same arguments, and each writes and reads only its own shards.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
PathLike = str | os.PathLike


def save(path: PathLike, tree: PyTree, *, step: int = 0, keep: int | None = None) -> None:
    """Writes `tree` (a pytree of `jax.Array`s, sharded or not, and NumPy arrays) as step
    `step` of the checkpoint directory `path`, and returns once it is on disk. `keep`:
    how many of the latest steps to keep (older ones are deleted), `None` for all.
    A step that is already there is a `ValueError`.

    ```python
    >>> checkpoint.save("ckpt", {"θ": θ, "opt": state}, step=100, keep=2)
    ```
    """
    ocp = _orbax()
    manager = _manager(path, max_to_keep=keep)
    try:
        manager.save(step, args=ocp.args.StandardSave(tree), force=True)  # force: in any step order
    finally:
        manager.close()  # waits for the write to finish


def latest_step(path: PathLike) -> int | None:
    """The latest step saved in `path`, `None` if there is none (or no such directory)."""
    manager = _manager(path, create=False)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def restore(path: PathLike, like: PyTree, *, step: int | None = None) -> PyTree:
    """Step `step` (default: the latest) of the checkpoint `path`, as a pytree shaped like
    `like`, each leaf placed like the leaf of `like` in its place:

    - a committed `jax.Array` or a `jax.ShapeDtypeStruct` with `sharding=`: a global
      array with exactly that sharding (another partition, mesh or device than the one
      saved is fine; each process reads only its own shards);
    - an uncommitted `jax.Array` (what the serial `po.init` and `optimizer.init`'s step
      count are) or a `ShapeDtypeStruct` without a sharding: an uncommitted array on the
      default device, so that `jit` may still put it with the others;
    - a NumPy array: a NumPy array.

    Values come back bit for bit: a leaf whose dtype or shape differs from the one saved
    is a `ValueError` (orbax would cast it).

    ```python
    >>> θ2 = po.init(po.distribute(op, (2, 4)), key)     # only the shardings matter
    >>> restored = checkpoint.restore("ckpt", {"θ": θ2, "opt": opt.init(θ2)})
    ```
    """
    ocp = _orbax()
    manager = _manager(path, create=False)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"restore: no checkpoint in {os.fspath(path)!r}")
        _check_like(manager.item_metadata(step).tree, like, f"restore: step {step} of {os.fspath(path)!r}")
        target = jax.tree.map(lambda x: np.empty(x.shape, x.dtype) if _default_placed(x) else x, like)
        restored = manager.restore(step, args=ocp.args.StandardRestore(target))
    finally:
        manager.close()
    return jax.tree.map(lambda x, r: jnp.asarray(r) if _default_placed(x) else r, like, restored)


def _default_placed(x) -> bool:
    """A leaf of `like` that names no devices: JAX places it when it is used."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding is None
    return isinstance(x, jax.Array) and not x.committed


def _check_like(stored: PyTree, like: PyTree, where: str) -> None:
    """A `ValueError` naming the leaves whose dtype or shape `like` gets wrong (orbax
    checks the tree structure itself, but casts dtypes silently)."""
    ocp = _orbax()
    stored = ocp.tree.to_flat_dict(stored)
    describe = lambda x: f"{np.dtype(x.dtype)}{tuple(x.shape)}"  # noqa: E731
    wrong = [f"{'/'.join(key)}: {describe(stored[key])} saved, {describe(x)} asked for"
             for key, x in ocp.tree.to_flat_dict(ocp.tree.serialize_tree(like)).items()
             if key in stored and describe(stored[key]) != describe(x)]
    if wrong:
        raise ValueError(f"{where}: `like` does not match the arrays saved: " + "; ".join(wrong))


def _manager(path: PathLike, **options):
    """An orbax `CheckpointManager` of the directory `path`, its one item a standard
    pytree (named up front, so that a fresh manager can read the item's metadata). orbax
    wants absolute paths: a relative one is taken from the working directory (URLs such
    as `gs://...` pass as they are)."""
    ocp = _orbax()
    path = os.fspath(path)
    directory = path if "://" in path else os.path.abspath(path)
    return ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler(),
                                 options=ocp.CheckpointManagerOptions(**options))


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:
        raise ImportError("parop.checkpoint needs orbax-checkpoint: pip install 'parop[train]'") from error
    return ocp
