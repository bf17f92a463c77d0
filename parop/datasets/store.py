"""Data sets in a chunked zarr store, read shard by shard (needs `pip install parop[data]`).

A store is a zarr group with two arrays of shape `(samples, channels, *grid)`: the
inputs and the targets. `write_darcy` fills one with Darcy flow samples, a block at a
time (bounded memory), and can split the work over processes. `open_store` opens any
such group (written by parop or by the user's own code with zarr) as a data set whose
`batch(indices, sharding)` builds global `jax.Array`s with `jax.make_array_from_callback`:
each process reads, straight from the store, only the blocks its own devices hold.

zarr (the `data` extra) is imported with this module, which `parop.datasets` imports
only when one of its names is used: parop imports without zarr.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import zarr
from zarr.storage import LocalStore

from .._checks import is_int, is_positive_int
from .darcy import checked, darcy_blocks

__all__ = ["CountingStore", "StoreDataset", "open_store", "write_darcy"]

CHUNK_SPLIT = 4
"""`write_darcy`'s default chunks cut each of the first two grid axes in this many pieces
(one sample, all channels, the other grid axes whole): 16 chunks per sample, so that a
device's block of a sample split on those axes is a few chunks, and a process reads
only the chunks of its blocks. More, smaller chunks would fit more splits but cost
more: each chunk is a file, read with its own request."""


def write_darcy(path: str | os.PathLike, n_samples: int, resolution: int = 32, *, dim: int = 2, seed: int = 0,
                dtype=jnp.float32, chunks: Sequence[int] | None = None, part: tuple[int, int] = (0, 1)) -> None:
    """Writes the samples of `darcy_flow(n_samples, resolution, dim=dim, seed=seed,
    dtype=dtype)` to a zarr store at `path`: arrays `"a"` (the coefficients) and `"u"`
    (the solutions), each `(n_samples, 1, *grid)`, the samples written as they are
    made (a block of at most about 4M grid nodes in memory at a time).

    `part=(i, k)` writes only the `i`-th of `k` equal runs of samples: `k` processes
    (`srun`'s tasks) with `i = 0 .. k-1` fill the store together, each creating the
    arrays if no other has yet. The values do not depend on the split.

    `chunks` is the read unit and a file of the store, `(1, 1, *grid chunk)` by
    default: each of the first two grid axes cut in `CHUNK_SPLIT` pieces, the others
    whole; a process that holds part of a sample reads only its chunks.

    ```python
    >>> from parop.datasets import write_darcy
    >>> write_darcy("data/darcy.zarr", 16, 32)                     # one process: 16 samples of 32²
    >>> write_darcy("data/darcy3.zarr", 16, 12, dim=3, part=(2, 8))  # task 2 of 8: samples 4 and 5
    ```
    """
    index, count = _check_part(part)
    n_samples, resolution, dim, seed = checked("write_darcy", n_samples, resolution, dim, seed)
    grid = (resolution,) * dim
    shape = (n_samples, 1) + grid
    chunks = (1, 1) + tuple(-(-n // CHUNK_SPLIT) if i < 2 else n for i, n in enumerate(grid)) if chunks is None \
        else tuple(chunks)
    if len(chunks) != len(shape) or chunks[0] != 1 or not all(map(is_positive_int, chunks)):
        raise ValueError(f"write_darcy: chunks must be {len(shape)} positive ints starting with 1 (one sample), "
                         f"for arrays of shape {shape}, got {chunks}")
    chunks = tuple(int(c) for c in chunks)
    first, stop = n_samples * index // count, n_samples * (index + 1) // count
    blocks = darcy_blocks(n_samples, resolution, dim=dim, seed=seed, dtype=dtype, start=first,
                          stop=stop) if first < stop else ()  # a part of no samples (more parts than samples)
    try:
        group = zarr.open_group(os.fspath(path), mode="a")
    except zarr.errors.ContainsGroupError:  # another process made the group between zarr's check and its write
        group = zarr.open_group(os.fspath(path), mode="r+")
    except zarr.errors.ContainsArrayError as error:
        raise ValueError(f"write_darcy: {os.fspath(path)!r} holds a zarr array, not a group: write the data set "
                         "elsewhere") from error
    settings = {"n_samples": n_samples, "resolution": resolution, "dim": dim, "seed": seed}
    arrays = {name: _array(group, name, shape, np.dtype(dtype), chunks, settings) for name in ("a", "u")}
    for start, a, u in blocks:
        arrays["a"][start:start + len(a)] = np.asarray(a)[:, None]
        arrays["u"][start:start + len(u)] = np.asarray(u)[:, None]


def _check_part(part) -> tuple[int, int]:
    if not isinstance(part, tuple) or len(part) != 2 or not all(map(is_int, part)) or not 0 <= part[0] < part[1]:
        raise ValueError(f"write_darcy: part must be (index, count) with 0 <= index < count, got {part!r}")
    return int(part[0]), int(part[1])


def _array(group, name: str, shape: tuple, dtype: np.dtype, chunks: tuple, settings: dict):
    """The group's array `name`, created if absent (concurrently by several processes:
    zarr writes its metadata atomically); a `ValueError` if it holds other data."""
    if name not in group:
        try:
            group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, compressors=None,
                               attributes={"darcy_flow": settings})
        except zarr.errors.ContainsArrayError:
            pass  # another process made it first
    array = group[name]
    have = (array.shape, array.dtype, array.chunks, array.attrs.get("darcy_flow"))
    if have != (shape, dtype, chunks, settings):
        raise ValueError(
            f"write_darcy: {group.store_path}/{name} holds another data set (shape {array.shape}, dtype "
            f"{array.dtype}, chunks {array.chunks}, {array.attrs.get('darcy_flow')}), not shape {shape}, dtype "
            f"{dtype}, chunks {chunks}, {settings}: write to another path or delete it first")
    return array


def open_store(path: Any, inputs: str = "a", targets: str = "u") -> "StoreDataset":
    """The data set in the zarr group at `path` (a directory, or any zarr store, e.g.
    a `CountingStore`): its arrays `inputs` and `targets`, each `(samples, channels,
    *grid)`, read only when a batch asks for them.

    ```python
    >>> from parop.datasets import open_store, write_darcy
    >>> from parop.nn import FNO
    >>> write_darcy("data/darcy.zarr", 16, 32)
    >>> ds = open_store("data/darcy.zarr")
    >>> len(ds), ds.inputs.shape
    (16, (16, 1, 32, 32))
    >>> model = FNO((32, 32), width=4, modes=(4, 4), layers=1).distribute((2, 1, 2, 2))
    >>> a, u = ds.batch([3, 1, 4, 1], model.in_sharding)   # global arrays, read block by block
    >>> a.shape, a.sharding == model.in_sharding
    ((4, 1, 32, 32), True)
    ```

    Raises `FileNotFoundError` where `path` holds no zarr group, `ValueError` for a
    missing array or arrays whose samples or grids disagree, and warns where the chunks
    span several samples (a batch of random samples then reads their neighbours too).
    """
    if isinstance(path, (str, os.PathLike)) and not any(  # zarr format 3's metadata, or format 2's
            os.path.exists(os.path.join(os.fspath(path), name)) for name in ("zarr.json", ".zgroup")):
        raise FileNotFoundError(f"open_store: no zarr group at {os.fspath(path)!r} (no zarr.json or .zgroup there): "
                                "write one with parop.datasets.write_darcy or with zarr itself")
    try:
        group = zarr.open_group(path, mode="r")
    except zarr.errors.ContainsArrayError as error:
        where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
        raise FileNotFoundError(f"open_store: no zarr group at {where!r}: it holds a zarr array (open the group "
                                "that holds it and its targets)") from error
    present = sorted(group.array_keys())
    for role, name in (("inputs", inputs), ("targets", targets)):
        if name not in present:
            raise ValueError(f"open_store: the store at {path} has no array {name!r} ({role}=); its arrays: "
                             f"{present}")
    ds = StoreDataset(group[inputs], group[targets])
    a, u = ds.inputs.shape, ds.targets.shape
    if len(a) < 3 or len(u) < 3 or a[0] != u[0] or a[2:] != u[2:]:
        raise ValueError(f"open_store: {inputs!r} {a} and {targets!r} {u} must both be (samples, channels, *grid) "
                         "with the same samples and grid")
    for array in (ds.inputs, ds.targets):
        if array.chunks[0] > 1:
            warnings.warn(f"open_store: {array.name!r} is stored in chunks {array.chunks} of "
                          f"{array.chunks[0]} samples: a batch of random samples reads every sample of their "
                          f"chunks; rewrite the store with chunks of one sample, {(1,) + tuple(array.chunks[1:])}",
                          stacklevel=2)
    return ds


@dataclass(frozen=True, eq=False)
class StoreDataset:
    """Inputs and targets in a zarr store (made by `open_store`): `len(ds)` samples,
    `ds.batch(indices, sharding)` reads some of them. `fit` and `evaluate` take it in
    place of in-memory arrays."""

    inputs: Any  # zarr.Array, (samples, in channels, *grid)
    targets: Any  # zarr.Array, (samples, out channels, *grid)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, indices, sharding: jax.sharding.Sharding | None = None) -> tuple[jax.Array, jax.Array]:
        """The samples `indices` (a sequence of ints, repeats allowed) as `(a, u)`:
        global arrays with `sharding` (e.g. a distributed model's `in_sharding`), each
        process reading from the store only the part its own devices hold; with
        `sharding=None`, arrays on the default device.

        Warns where a chunk spans more of a sample than a process holds (it then reads
        whole chunks, more than its share), naming the chunks that would fit.
        """
        indices = np.asarray(indices)
        if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer) or not len(indices):
            raise ValueError(f"StoreDataset.batch: indices must be a non-empty 1-D sequence of ints, got "
                             f"{indices!r}")
        if indices.min() < 0 or indices.max() >= len(self):
            raise ValueError(f"StoreDataset.batch: indices must lie in [0, {len(self)}), got "
                             f"{indices.min()} .. {indices.max()}")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(f"StoreDataset.batch: sharding must be a jax.sharding.Sharding (a model's in_sharding) "
                            f"or None, got {sharding!r}")
        return _read(self.inputs, indices, sharding), _read(self.targets, indices, sharding)


def _read(array, indices: np.ndarray, sharding) -> jax.Array:
    """`array[indices]` with `sharding` (or on the default device), read block by block."""
    shape = (len(indices),) + array.shape[1:]
    if sharding is None:
        return jnp.asarray(_read_box(array, indices, tuple(slice(0, n) for n in shape)))
    try:
        sharding.shard_shape(shape)
    except ValueError as error:
        raise ValueError(f"StoreDataset.batch: a batch {shape} of {array.name!r} does not fit the sharding "
                         f"{sharding}: {error}") from error
    blocks = {_key(index, shape): index for index in sharding.addressable_devices_indices_map(shape).values()}
    # One read of the box around this process's blocks, where they fill it (the usual
    # case: a process's devices hold one contiguous region), else one read per block.
    box = tuple(slice(min(k[i][0] for k in blocks), max(k[i][1] for k in blocks)) for i in range(len(shape)))
    _warn_chunks(array, box, shape)
    if sum(math.prod(b - a for a, b in k) for k in blocks) == math.prod(s.stop - s.start for s in box):
        data = _read_box(array, indices, box)
        local = {k: data[tuple(slice(a - s.start, b - s.start) for (a, b), s in zip(k, box))] for k in blocks}
    else:
        local = {k: _read_box(array, indices, tuple(slice(a, b) for a, b in k)) for k in blocks}
    return jax.make_array_from_callback(shape, sharding, lambda index: local[_key(index, shape)])


def _key(index: tuple, shape: tuple) -> tuple:
    """A device's block `index` (a tuple of slices) as `((start, stop), ...)` per axis."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _read_box(array, indices: np.ndarray, box: tuple) -> np.ndarray:
    """`array[indices[box[0]], *box[1:]]`: each stored sample read once."""
    samples, where = np.unique(indices[box[0]], return_inverse=True)
    return array.oindex[(samples,) + box[1:]][where]


def _warn_chunks(array, box: tuple, shape: tuple) -> None:
    chunks = array.chunks
    if any(s.stop - s.start < n and c > s.stop - s.start for s, n, c in zip(box[1:], shape[1:], chunks[1:])):
        fit = (1,) + tuple(min(c, s.stop - s.start) for s, c in zip(box[1:], chunks[1:]))
        warnings.warn(f"StoreDataset.batch: {array.name!r} is stored in chunks {chunks}, but this process holds "
                      f"blocks {tuple(s.stop - s.start for s in box)} of the batch: it reads whole chunks, more "
                      f"than its share; rewrite the store with chunks of at most {fit} (write_darcy(..., "
                      f"chunks=...), or zarr's create_array(chunks=...))", stacklevel=3)


class CountingStore(LocalStore):
    """A read-only zarr `LocalStore` on `root` that counts the bytes its reads return
    (`bytes_read`), to check what a process reads.

    ```python
    >>> from parop.datasets import CountingStore, open_store, write_darcy
    >>> write_darcy("data/darcy.zarr", 16, 32)
    >>> store = CountingStore("data/darcy.zarr")
    >>> a, u = open_store(store).batch(range(8), None)     # None: one device's array
    >>> store.bytes_read >= a.nbytes + u.nbytes
    True
    ```
    """

    def __init__(self, root: str | os.PathLike):
        super().__init__(root, read_only=True)
        self._lock = threading.Lock()  # zarr reads in worker threads
        self._bytes = 0

    @property
    def bytes_read(self) -> int:
        return self._bytes

    async def get(self, key, prototype=None, byte_range=None):
        value = await super().get(key, prototype, byte_range)
        with self._lock:
            self._bytes += 0 if value is None else len(value)
        return value
