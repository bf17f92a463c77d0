"""Sharded checkpoints of pytrees of JAX arrays (a model's θ, an optimiser's state) with
orbax-checkpoint (`pip install parop[train]`), restored onto any sharding: the same
partition, another partition or mesh, or a single device, and verified against a
checksum of every shard written at save.

```python
>>> import optax
>>> from parop import checkpoint
>>> op, key, opt = po.kron(po.Matrix(8, 8, name="w"), po.Identity(16)), jax.random.key(0), optax.adam(1e-3)
>>> D = po.distribute(op, (1, 8)); θ = po.init(D, key); state = opt.init(θ)
>>> checkpoint.save("run/ckpt", {"θ": θ, "opt": state}, step=100)
>>> E = po.distribute(op, (2, 4)); θ2 = po.init(E, key)           # another partition
>>> saved = checkpoint.restore("run/ckpt", {"θ": θ2, "opt": opt.init(θ2)})   # the latest step
>>> saved["θ"]["w"].sharding == θ2["w"].sharding, bool(np.array_equal(saved["θ"]["w"], θ["w"]))
(True, True)
```

A checkpoint is an orbax `CheckpointManager` directory, one standard pytree item per
step (`path/<step>/`); every process of a multi-process run calls `save` and `restore` with
the same arguments, and each writes, reads and checks only its own shards.

The checksums (in the step's orbax metadata, under `CHECKSUMS`) are two sums modulo 2³²
over each saved shard's 32-bit words (8- and 16-bit values count as one word each): `A =
Σ w` and `B = Σ w·(g + 1)`, `g` the word's place in the whole array. A sum over any
piece of a shard adds to the others: a restore onto another partition or other processes
sums what each process holds and adds the pieces up, without reading anything twice.
"""

from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import int_at_least

PyTree = Any
PathLike = str | os.PathLike

CHECKSUMS = "parop.checksums"
"""The key of the checksums in a step's orbax `custom_metadata`: for each array (its path
in the tree, '/'-joined), the shards' boundaries on each axis (`"cuts"`) and each shard's
sums (`"sums"`, `B << 32 | A`, the shards in C order)."""


def save(path: PathLike, tree: PyTree, *, step: int = 0, keep: int | None = None,
         allow_older: bool = False) -> None:
    """Writes `tree` (a pytree of `jax.Array`s, sharded or not, and NumPy arrays) as step
    `step` (an `int` >= 0) of the checkpoint directory `path`, with a checksum of each
    shard, and returns once it is on disk. `keep` (an `int` >= 1, or `None` for all):
    how many of the latest steps up to `step` to keep; older ones are deleted, a step
    above `step` never is. A step that is already there is a `ValueError`, and so is a
    step below the latest one saved unless `allow_older=True` (to branch off an earlier
    state on purpose).

    ```python
    >>> from parop import checkpoint
    >>> checkpoint.save("ckpt", {"θ": {"w": jnp.ones((4, 4))}}, step=100, keep=2)
    >>> checkpoint.latest_step("ckpt")
    100
    ```
    """
    step = _check_save_args(step, keep)
    _check_leaves(tree, "save", (jax.Array, np.ndarray), "jax.Array and NumPy array")
    ocp = _orbax()
    manager = _manager(path)
    try:
        latest = manager.latest_step()
        if latest is not None and step < latest and not allow_older:
            raise ValueError(f"save: step {step} of {os.fspath(path)!r} is below the latest step saved there "
                             f"({latest}): pass allow_older=True to save it anyway")
        checksums = _checksums(tree, "save")  # every process, before the first write
        manager.save(step, args=ocp.args.StandardSave(tree), custom_metadata={CHECKSUMS: checksums},
                     force=True)  # force: below the latest step too
        manager.wait_until_finished()
        if keep is not None:
            older = sorted(s for s in manager.all_steps() if s < step)
            for old in older[:max(0, len(older) - (keep - 1))]:
                manager.delete(old)
    finally:
        manager.close()  # waits for the write to finish


def _check_save_args(step, keep) -> int:
    """`step` as an `int`, after a `TypeError` for a `step` that is not an integer or a
    `keep` that is neither an integer nor `None` (a bool is neither), and a `ValueError`
    for a step below 0 or a `keep` below 1."""
    if keep is not None:
        int_at_least(keep, 1, "keep", "save", "an int or None")
    return int_at_least(step, 0, "step", "save")


def _check_leaves(tree: PyTree, where: str, kinds: tuple[type, ...], described: str) -> None:
    """A `TypeError` naming a leaf of `tree` that is not one of `kinds` (`described`: a
    Python number or a string, which orbax would save but not restore like an array) or
    that holds JAX random keys (which have no NumPy form), and a `ValueError` for a tree
    with no leaf or a leaf with no element (orbax saves neither)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not leaves:
        raise ValueError(f"{where}: the tree {tree!r} holds no array")
    for key, x in leaves:
        name = jax.tree_util.keystr(key)
        if not isinstance(x, kinds):
            raise TypeError(f"{where}: {name or 'the tree'} ({type(x).__name__}) is not an array: "
                            f"only {described} leaves are checkpointed "
                            "(jnp.asarray(x) makes a number an array)")
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(f"{where}: {name or 'the tree'} is an array of JAX random keys ({x.dtype}): checkpoint "
                            "its data, jax.random.key_data(k), and rebuild it with jax.random.wrap_key_data")
        if math.prod(x.shape) == 0:
            raise ValueError(f"{where}: {name or 'the tree'} has no element (shape {tuple(x.shape)}): orbax "
                             "does not save empty arrays")


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

    Values come back bit for bit, or not at all: a leaf whose dtype or shape differs from
    the one saved, keys of `like` other than those saved, a step whose files are missing
    or damaged, and a shard whose values do not match its checksum are each a
    `ValueError` naming the arrays (and the shard) and the step.

    ```python
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from parop import checkpoint
    >>> checkpoint.save("ckpt", {"w": jnp.arange(16.0).reshape(4, 4)}, step=1)
    >>> mesh = jax.make_mesh((2,), ("x",))
    >>> like = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=NamedSharding(mesh, P("x")))}
    >>> restored = checkpoint.restore("ckpt", like)     # only `like`'s shapes and shardings matter
    >>> restored["w"].sharding == like["w"].sharding, restored["w"].tolist()[3]
    (True, [12.0, 13.0, 14.0, 15.0])
    ```
    """
    _check_leaves(like, "restore", (jax.Array, np.ndarray, jax.ShapeDtypeStruct),
                  "jax.Array, NumPy array and jax.ShapeDtypeStruct")
    if step is not None:  # (a "1" or 1.0 is no step of the directory's listing, True one by accident)
        step = int_at_least(step, 0, "step", "restore")
    ocp = _orbax()
    manager = _manager(path, create=False)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"restore: no checkpoint in {os.fspath(path)!r}")
        if step not in manager.all_steps():
            raise FileNotFoundError(f"restore: no step {step} in {os.fspath(path)!r} (steps: {manager.all_steps()})")
        where = f"restore: step {step} of {os.fspath(path)!r}"
        stored, checksums = _stored(manager, step, where)
        _check_like(stored, like, where)
        target = jax.tree.map(lambda x: np.empty(x.shape, x.dtype) if _default_placed(x) else x, like)
        try:
            restored = manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as error:  # what orbax and tensorstore raise on damaged files
            raise ValueError(f"{where} cannot be read, a file is damaged or missing: {_first_line(error)}") from error
    finally:
        manager.close()
    _verify(restored, checksums, where)
    return jax.tree.map(lambda x, r: jnp.asarray(r) if _default_placed(x) else r, like, restored)


def _first_line(error: Exception) -> str:
    """The gist of an orbax or tensorstore error (whose later lines spell out whole
    tensorstore specs; the chained error keeps them)."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def _default_placed(x) -> bool:
    """A leaf of `like` that names no devices: JAX places it when it is used."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.sharding is None
    return isinstance(x, jax.Array) and not x.committed


def _stored(manager, step: int, where: str) -> tuple[PyTree, dict]:
    """The metadata tree of the arrays saved at `step` and their checksums; a
    `ValueError` if either is missing or unreadable (an incomplete or damaged step, or
    one not written by `save`)."""
    try:
        tree = manager.item_metadata(step)
        checksums = (manager.metadata(step).custom_metadata or {}).get(CHECKSUMS)
    except Exception as error:  # a damaged metadata file
        raise ValueError(f"{where}: its metadata cannot be read: {_first_line(error)}") from error
    if tree is None or tree.tree is None:
        raise ValueError(f"{where} is incomplete: the metadata of its arrays (default/_METADATA) is missing")
    if not isinstance(checksums, dict):
        raise ValueError(f"{where} has no checksums: its step metadata (_CHECKPOINT_METADATA) is missing or "
                         "damaged, or it was not written by parop.checkpoint.save")
    return tree.tree, checksums


def _flat(tree: PyTree, where: str, *, serialized: bool = False) -> dict[str, Any]:
    """The leaves of `tree` by their '/'-joined paths, as orbax names them (`serialized`:
    a tree of orbax's own, such as its metadata, that needs no serializing); a
    `ValueError` where two paths join to one name (`{"a/b": x, "a": {"b": y}}`): their
    checksums would be one entry, and one array would go unchecked."""
    ocp = _orbax()
    flat = ocp.tree.to_flat_dict(tree if serialized else ocp.tree.serialize_tree(tree))
    named: dict[str, Any] = {}
    for key, x in flat.items():
        name = "/".join(map(str, key))
        if name in named:
            raise ValueError(f"{where}: two arrays of the tree are both named {name!r} (a path's keys joined by "
                             "'/'): rename a key")
        named[name] = x
    return named


def _check_like(stored: PyTree, like: PyTree, where: str) -> None:
    """A `ValueError` naming the leaves that `like` lacks, adds, or gets the dtype or
    shape of wrong (orbax's own errors say less, and it casts dtypes silently)."""
    stored, asked = _flat(stored, where, serialized=True), _flat(like, where)
    describe = lambda x: f"{np.dtype(x.dtype)}{tuple(x.shape)}"  # noqa: E731
    wrong = [f"{key}: {describe(stored[key])} saved, {describe(x)} asked for"
             for key, x in asked.items() if key in stored and describe(stored[key]) != describe(x)]
    for label, keys in (("saved but not in `like`", stored.keys() - asked.keys()),
                        ("in `like` but not saved", asked.keys() - stored.keys())):
        if keys:
            wrong.append(f"{label}: {', '.join(sorted(keys))}")
    if wrong:
        raise ValueError(f"{where}: `like` does not match the arrays saved: " + "; ".join(wrong))


def _checksums(tree: PyTree, where: str) -> dict:
    """The `CHECKSUMS` entry of `tree`: each array's shard boundaries and shard sums."""
    leaves = {key: (x, _cuts(x)) for key, x in _flat(tree, where).items()}
    return {key: {"cuts": leaves[key][1], "sums": sums} for key, sums in _sums(leaves).items()}


def _verify(restored: PyTree, checksums: dict, where: str) -> None:
    """A `ValueError` naming the first array and shard of `restored` whose sums differ
    from those saved, or the arrays that have none."""
    leaves = _flat(restored, where)
    damaged = sorted(key for key, x in leaves.items() if not _fits(checksums.get(key), np.shape(x)))
    if damaged:
        raise ValueError(f"{where}: the checksums of {', '.join(damaged)} are missing or damaged "
                         "(in its step metadata, _CHECKPOINT_METADATA)")
    sums = _sums({key: (x, checksums[key]["cuts"]) for key, x in leaves.items()})
    for key, got in sums.items():
        cuts = checksums[key]["cuts"]
        for cell, (have, want) in enumerate(zip(got, checksums[key]["sums"])):
            if have != want:
                place = np.unravel_index(cell, [len(c) - 1 for c in cuts]) if cuts else ()
                shard = ", ".join(f"{c[i]}:{c[i + 1]}" for c, i in zip(cuts, place))
                raise ValueError(f"{where}: {key}[{shard}] does not match its checksum: "
                                 "the checkpoint's files are damaged")


def _fits(entry, shape: tuple[int, ...]) -> bool:
    """Whether `entry` is a `CHECKSUMS` entry of an array of shape `shape`."""
    try:
        cuts, sums = entry["cuts"], entry["sums"]
        return (len(cuts) == len(shape)
                and all(c[0] == 0 and c[-1] == n and sorted(c) == c for c, n in zip(cuts, shape))
                and all(isinstance(i, int) for i in [*sums, *(i for c in cuts for i in c)])
                and len(sums) == int(np.prod([len(c) - 1 for c in cuts])))
    except (KeyError, TypeError, IndexError):
        return False


def _cuts(x) -> list[list[int]]:
    """The boundaries of `x`'s shards on each axis (of the whole array if it is not a
    `jax.Array`); its shards are the cells of that grid."""
    shape = np.shape(x)
    starts = [{0, n} for n in shape]
    if isinstance(x, jax.Array):
        for index in x.sharding.devices_indices_map(shape).values():
            for axis, (piece, n) in enumerate(zip(index, shape)):
                starts[axis].add(piece.indices(n)[0])
    return [sorted(s) for s in starts]


def _sums(leaves: dict[str, tuple[Any, list[list[int]]]]) -> dict[str, list[int]]:
    """Each array's sums per cell of its `cuts`, `B << 32 | A`: the sums over what this
    process holds (the blocks summed in threads: NumPy's sums release the GIL), added up
    over the processes for arrays they share."""
    blocks = {key: list(_blocks(x, cuts)) for key, (x, cuts) in leaves.items()}
    todo = [(block, start, [c[-1] for c in leaves[key][1]]) for key in blocks for _, block, start in blocks[key]]
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        done = iter(pool.map(lambda args: _block_sums(*args), todo))
    partial = {}
    for key, (_, cuts) in leaves.items():
        partial[key] = np.zeros((int(np.prod([len(c) - 1 for c in cuts])), 2), np.uint32)
        for cell, _, _ in blocks[key]:
            partial[key][cell] += next(done)
    shared = [key for key, (x, _) in leaves.items() if isinstance(x, jax.Array) and not x.is_fully_addressable]
    if shared:
        from jax.experimental import multihost_utils

        counts = [len(partial[key]) for key in shared]
        every = multihost_utils.process_allgather(np.concatenate([partial[key] for key in shared]))
        total = np.sum(every, axis=0, dtype=np.uint32)  # wraps: modulo 2**32
        partial.update(zip(shared, np.split(total, np.cumsum(counts)[:-1])))
    return {key: [int(b) << 32 | int(a) for a, b in s] for key, s in partial.items()}


def _blocks(x, cuts: list[list[int]]):
    """`(cell, words, start)` for each piece of a cell of `cuts` that this process holds
    (of the shards it holds the first replica of, or of the whole NumPy array): the
    cell's index in C order, the piece's words and where the piece starts."""
    counts = [len(c) - 1 for c in cuts]
    if isinstance(x, jax.Array):
        pieces = [(s.data, [i.indices(n)[:2] for i, n in zip(s.index, x.shape)])
                  for s in x.addressable_shards if s.replica_id == 0]
    else:
        pieces = [(x, [(0, n) for n in np.shape(x)])]
    for data, box in pieces:
        words = _words(np.asarray(data))
        cells = [[(i, max(lo, a), min(hi, b)) for i, (a, b) in enumerate(zip(c[:-1], c[1:])) if max(lo, a) < min(hi, b)]
                 for c, (lo, hi) in zip(cuts, box)]
        for cell in itertools.product(*cells):
            index = 0
            for (i, _, _), n in zip(cell, counts):
                index = index * n + i
            piece = tuple(slice(a - lo, b - lo) for (_, a, b), (lo, _) in zip(cell, box))
            yield index, words[piece], [a for _, a, _ in cell]


def _words(data: np.ndarray) -> np.ndarray:
    """`data`'s bytes as unsigned words, shape `(*data.shape, k)`: 32-bit words (`k` per
    value), or one 8- or 16-bit word per value."""
    bits = {1: np.uint8, 2: np.uint16}.get(data.dtype.itemsize, np.uint32)
    return np.ascontiguousarray(data).reshape(*data.shape, 1).view(bits)


def _block_sums(block: np.ndarray, start: list[int], shape: list[int]) -> np.ndarray:
    """`(A, B)` of `block`, words `(*shape, k)` of the array from `start` on: `A = Σ w`,
    `B = Σ w·(g + 1)`, `g` a word's C-order place in the whole array, both modulo 2**32."""
    k = block.shape[-1]
    strides = [k * int(np.prod(shape[axis + 1:])) for axis in range(len(shape))] + [1]
    a, b = _moments(block, strides)
    b += a * (1 + sum(s * o for s, o in zip(strides, start)))
    return np.array([a % 2**32, b % 2**32], np.uint32)


def _moments(block: np.ndarray, strides: list[int]) -> tuple[int, int]:
    """`Σ w` and `Σ w·Σ_d l_d·strides[d]` over `block` (`l` a word's place in it), both
    modulo 2**32. The second is a sum over the axes, so two passes over `block` make it:
    the sums over all axes but the first, and over the first (a smaller array to recurse on)."""
    first = block.sum(axis=tuple(range(1, block.ndim)), dtype=np.uint32)
    b = strides[0] * int((first * np.arange(first.size, dtype=np.uint32)).sum(dtype=np.uint32))
    if block.ndim > 1:
        b += _moments(block.sum(axis=0, dtype=np.uint32), strides[1:])[1]
    return int(first.sum(dtype=np.uint32)), b


def _manager(path: PathLike, **options):
    """An orbax `CheckpointManager` of the directory `path`, its one item a standard
    pytree (named up front, so that a fresh manager can read the item's metadata). orbax
    wants absolute paths: a relative one is taken from the working directory (URLs such
    as `gs://...` pass as they are)."""
    ocp = _orbax()
    path = os.fspath(path)
    directory = path if "://" in path else os.path.abspath(path)
    if os.path.exists(directory) and not os.path.isdir(directory):  # (orbax's threads would wait 5 min to exit)
        raise NotADirectoryError(f"{path!r} is a file, not a checkpoint directory")
    return ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler(),
                                 options=ocp.CheckpointManagerOptions(**options))


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:
        raise ImportError("parop.checkpoint needs orbax-checkpoint: pip install 'parop[train]'") from error
    return ocp
