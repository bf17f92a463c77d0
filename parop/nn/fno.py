"""A Fourier neural operator (Li et al. 2020) on 1-D to 4-D grids, built from parop
operators.

Every linear map of the network is a parop operator on the tensor
`(batch, channel, *grid)`; between them stand only bias additions and GELUs. So the
same model runs serial or, through `FNO.distribute`, as one `shard_map` program per
operator over a device mesh, the whole network planned at once
(`po.distribute_chain`): the layouts where one operator hands over to the next are the
ones that minimise the cost of a training step.

The model has no batch size: its operators are built for each batch size it meets
(a leading `Identity(batch)` factor) and kept (the `BATCH_SIZES_KEPT` most recently
used, and a distributed model's reference batch size always), and a distributed model
plans each batch size once, every weight where the plan of its reference batch size puts
it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import cached_property, lru_cache
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .. import _dtypes
from ..algebra import kron
from ..distributed import CostModel, DistributedOperator, distribute, distribute_chain
from ..distributed.layout import check_devices, check_partition, context_mesh, layout_of, split_sizes
from ..distributed.operator import check_split_counts
from ..distributed.plan import PlanningError
from ..operator import Operator, explicit_sharding
from ..operators import DFT, Convolution, Identity, Matrix, PerModeMatrix, Restriction
from .._checks import divisors, is_axes, is_positive_int, positive_int
from ..params import check_key, name_keys

Params = dict[str, jax.Array]

BATCH_SIZES_KEPT = 8  # batch sizes whose operators (and plans) a model keeps, most recently used first


def largest_modes(grid: Sequence[int]) -> tuple[int, ...]:
    """The most modes each axis can keep with no frequency twice: all `n` of a full-FFT
    axis; on the real-FFT (last) axis, `m` with `m // 2 + 1 <= n // 2 + 1`."""
    *full, last = grid
    return tuple(full) + (2 * (last // 2) + 1,)


def check_modes(grid: tuple[int, ...], modes, where: str = "FNO") -> tuple[int, ...]:
    """`modes` (neuraloperator's convention, one count per axis) checked against `grid`:
    a `ValueError` naming the axis, its size and the largest valid count."""
    largest = largest_modes(grid)
    if modes is None:
        return tuple(min(12, m) for m in largest)
    modes = tuple(modes) if is_axes(modes) else modes
    if not isinstance(modes, tuple) or len(modes) != len(grid):
        raise ValueError(f"{where}: modes must give one count per grid axis ({len(grid)} for grid {grid}), got {modes!r}")
    modes = tuple(positive_int(m, f"modes[{i}]", where) for i, m in enumerate(modes))
    for i, (m, n, most) in enumerate(zip(modes, grid, largest)):
        if m > most:
            kind = "real-FFT axis" if i == len(grid) - 1 else "axis"
            raise ValueError(
                f"{where}: modes[{i}] = {m} on {kind} {i} of size {n} would keep frequencies twice; "
                f"the largest valid count there is {most} (modes at most {largest})"
            )
    return modes


def spectral_convolution(batch: int, width: int, grid: tuple[int, ...], modes: tuple[int, ...], dtype,
                         name: str) -> Operator:
    """The FNO's spectral convolution as one operator on `(batch, width, *grid)`:
    `rFFT -> keep the low modes -> PerModeMatrix -> put them back -> inverse rFFT`.

    `modes` as in `neuraloperator`: `m` frequencies on each full-FFT axis (both ends of
    the spectrum: `0 .. (m+1)//2 - 1` and the last `m//2`), and `m//2 + 1` on the
    real-FFT (last) axis (`0 .. m//2`).
    """
    cdtype = _dtypes.complex_of(dtype)
    downs, ups, kept = [], [], []
    for i, (n, m) in enumerate(zip(grid, modes)):
        if i < len(grid) - 1:
            F, R = DFT(n, cdtype), Restriction(n, [slice(0, (m + 1) // 2), slice(n - m // 2, n)])
        else:
            F, R = DFT(n, dtype), Restriction(n // 2 + 1, slice(0, m // 2 + 1))
        downs.append(R @ F)
        ups.append(F.inverse() @ R.H)
        kept.append(R.range_shape[0])
    weights = PerModeMatrix(width, width, tuple(kept), cdtype, name=name)
    down = kron(Identity(batch), Identity(width), *downs)
    up = kron(Identity(batch), Identity(width), *ups)
    return up @ kron(Identity(batch), weights) @ down


def channel_mixing(batch: int, c_out: int, c_in: int, grid: tuple[int, ...], dtype, name: str) -> Operator:
    """A 1x1 convolution (without bias): `Matrix(c_out, c_in)` on the channel axis."""
    return kron(Identity(batch), Matrix(c_out, c_in, dtype, name=name), *(Identity(n) for n in grid))


def local_convolution(batch: int, width: int, grid: tuple[int, ...], kernel: int, dtype, name: str) -> Operator:
    """A `kernel`^d periodic convolution (without bias) on `(batch, width, *grid)`: the
    local path beside the spectral one (distributed, a halo exchange)."""
    return kron(Identity(batch), Convolution(width, width, (kernel,) * len(grid), grid, "periodic", dtype, name=name))


class FNO:
    """A Fourier neural operator on a `len(grid)`-dimensional grid (1 to 4): lifting,
    `layers` Fourier layers (spectral convolution + 1x1 skip [+ local convolution] +
    GELU), and a two-layer pointwise projection, on inputs `(batch, in_channels, *grid)`
    of any batch size, with the grid coordinates appended as `len(grid)` more channels.

    ```python
    >>> from parop.nn import FNO
    >>> model = FNO((16, 16), width=4, modes=(4, 4), layers=1)
    >>> θ = model.init(jax.random.key(0))
    >>> a = jnp.ones((4, 1, 16, 16), jnp.float32)
    >>> u = model.apply(θ, a)                      # (b, 1, 16, 16) -> (b, 1, 16, 16), any b
    >>> dist = model.distribute((1, 1, 2, 4))      # the same network over 8 devices
    >>> u2 = dist.apply(dist.init(jax.random.key(0)), a)
    >>> u2.shape, bool(jnp.allclose(u2, u, atol=1e-6))
    ((4, 1, 16, 16), True)
    ```

    `local_kernel=k` adds a `k`^d periodic convolution to each Fourier layer, beside the
    spectral one (neuraloperator's local path; distributed, a halo exchange).

    `remat=True` trades compute for memory in training: each Fourier layer keeps only its
    input for the backward pass (`jax.checkpoint`) and recomputes the rest, and the
    pointwise projection runs over blocks of the grid, each recomputed in the backward
    pass, so that its `projection`-wide activations never exist whole. The same
    gradients, to float rounding; the forward collectives that the recomputation needs
    run again in the backward pass.
    """

    def __init__(self, grid: Sequence[int], *, width: int = 32, modes: Sequence[int] | None = None,
                 layers: int = 4, in_channels: int = 1, out_channels: int = 1, projection: int = 128,
                 dtype=jnp.float32, local_kernel: int | None = None, remat: bool = False):
        given = grid
        grid = tuple(grid) if is_axes(grid) else grid
        if not isinstance(grid, tuple) or not 1 <= len(grid) <= 4 or not all(map(is_positive_int, grid)):
            raise ValueError(f"FNO: grid must be 1 to 4 positive ints (a 1-D to 4-D grid), got {given!r}")
        grid = tuple(int(n) for n in grid)
        width, layers, in_channels, out_channels, projection = (
            positive_int(value, what, "FNO") for what, value in (
                ("width", width), ("layers", layers), ("in_channels", in_channels), ("out_channels", out_channels),
                ("projection", projection)))
        if local_kernel is not None:
            if not is_positive_int(local_kernel) or local_kernel % 2 == 0:
                raise ValueError(f"FNO: local_kernel must be an odd positive int (or None), got {local_kernel!r}")
            local_kernel = int(local_kernel)
        if not isinstance(remat, bool):
            raise ValueError(f"FNO: remat must be True or False, got {remat!r}")
        try:
            dtype = _dtypes.canonical(jnp.float32 if dtype is None else dtype)
        except TypeError:  # not a dtype at all
            dtype = repr(dtype)
        if dtype not in (jnp.float32, jnp.float64):
            raise ValueError(f"FNO: dtype must be float32 or float64 (its spectral weights are complex), got {dtype}")
        self.grid, self.width, self.modes = grid, width, check_modes(grid, modes)
        self.n_layers, self.in_channels, self.out_channels = layers, in_channels, out_channels
        self.projection, self.dtype, self.local_kernel = projection, dtype, local_kernel
        self.remat = remat
        self._batches: OrderedDict[int, dict[str, Any]] = OrderedDict()  # batch size -> what was built for it
        self._sample_batch = 1  # the batch axis's split (a distributed model's partition's batch entry)
        self._kept_always: int | None = None  # a batch size never dropped (a distributed model's reference)

    def _rebuild(self, cls, **extra):
        """The same network as an instance of `cls`."""
        return cls(self.grid, width=self.width, modes=self.modes, layers=self.n_layers,
                   in_channels=self.in_channels, out_channels=self.out_channels, projection=self.projection,
                   dtype=self.dtype, local_kernel=self.local_kernel, remat=self.remat, **extra)

    # -- the operators -------------------------------------------------------------------
    def operators(self, batch: int) -> list[Operator]:
        """The network's operators for inputs of `batch` samples: lifting, the Fourier
        layers, the two projections (built once per batch size)."""
        batch = positive_int(batch, "batch", "FNO.operators")
        return self._for_batch(batch, "operators", lambda: self._build(batch))

    def _for_batch(self, batch: int, what: str, make):
        """`what` for `batch` samples, made by `make()` the first time: the model's one
        cache, bounded to the `BATCH_SIZES_KEPT` batch sizes most recently used (an
        `evaluate` with a partial last batch adds one) and the one kept always."""
        entry = self._batches.get(batch)
        if entry is None:
            entry = self._batches[batch] = {}
            others = [b for b in self._batches if b != self._kept_always]  # least recently used first
            for b in others[:max(0, len(others) - BATCH_SIZES_KEPT)]:
                del self._batches[b]
        self._batches.move_to_end(batch)
        if what not in entry:
            entry[what] = make()
        return entry[what]

    def _build(self, b: int) -> list[Operator]:
        g, w, d = self.grid, self.width, self.dtype
        layers = []
        for k in range(self.n_layers):
            layer = spectral_convolution(b, w, g, self.modes, d, f"spectral{k}") + channel_mixing(b, w, w, g, d, f"skip{k}")
            if self.local_kernel is not None:
                layer = layer + local_convolution(b, w, g, self.local_kernel, d, f"local{k}")
            layers.append(layer)
        return [channel_mixing(b, w, self.in_channels + len(g), g, d, "lift"), *layers,
                channel_mixing(b, self.projection, w, g, d, "proj1"),
                channel_mixing(b, self.out_channels, self.projection, g, d, "proj2")]

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """`{name: leaf}` of every weight (biases apart): the same for every batch size."""
        found: dict[str, Any] = {}
        for op in FNO._build(self, 1):
            found.update(op.parameters)
        return found

    # -- parameters ------------------------------------------------------------------------
    def init(self, key: jax.Array) -> Params:
        """Parameters as in `neuraloperator`: 1x1 convolutions and biases uniform in
        `±1/sqrt(fan_in)` (local convolutions: fan-in `width·k^d`), spectral weights with
        real and imaginary parts uniform in `[0, 1/width²)`; deterministic in `key`, each
        weight drawn where the model keeps it (one jitted program, compiled once for all
        models of the same parameter shapes and placements)."""
        check_key(key, "FNO.init")
        if self.distributed and isinstance(self.mesh, AbstractMesh):  # as po.init of such an operator
            raise ValueError("FNO.init: the model is distributed on a mesh shape (an AbstractMesh), which has no "
                             "devices to hold the weights: distribute it on a jax.sharding.Mesh to initialise it")
        places = tuple(sorted(self.param_shardings().items(), key=lambda item: item[0]))
        draws = self._draws()
        return _initializer(draws, places)(name_keys(key, [name for name, *_ in draws]))

    def _draws(self) -> tuple[tuple, ...]:
        """`(name, shape, dtype, kind, bound)` of every parameter, biases included: what
        `init` draws, uniform in `[-bound, bound)`, or for the complex spectral weights
        with real and imaginary parts uniform in `[0, 1/bound)`."""
        draws = []
        for name, leaf in self.parameters.items():
            shape = leaf.param_shape
            if name.startswith("spectral"):
                draws.append((name, shape, _dtypes.real_of(leaf.param_dtype), "spectral", self.width**2))
                continue
            bound = 1 / math.sqrt(math.prod(shape[1:]))
            draws.append((name, shape, self.dtype, "uniform", bound))
            draws.append((f"{name}.bias", shape[:1], self.dtype, "uniform", bound))
        return tuple(draws)

    def param_shardings(self) -> dict[str, NamedSharding]:
        """Where each parameter lives: nowhere in particular for a serial model."""
        return {}

    # -- the network -------------------------------------------------------------------------
    def apply(self, θ: Params, a: jax.Array) -> jax.Array:
        """The FNO on `a` of shape `(batch, in_channels, *grid)`, any batch size (run at
        `runs_at(batch)` samples, the extra ones zeros whose outputs are dropped)."""
        shape = (self.in_channels,) + self.grid
        a = a if hasattr(a, "dtype") and hasattr(a, "ndim") else np.asarray(a)
        if jnp.issubdtype(a.dtype, jnp.complexfloating):
            raise TypeError(f"FNO: input must be real (the model is {self.dtype.name}), got {a.dtype}: pass the "
                            "real and imaginary parts as two input channels")
        if a.ndim != len(shape) + 1 or a.shape[1:] != shape:
            raise ValueError(f"FNO: input must have shape (batch, {', '.join(map(str, shape))}), got {a.shape}")
        if a.shape[0] == 0:  # no sample: the empty result, as an operator gives (there is no plan to make)
            return jnp.zeros((0, self.out_channels) + self.grid, self.dtype)
        samples, run = a.shape[0], self.runs_at(a.shape[0])
        if run > samples:
            a = _filled(a, run, self._sample_batch)
        out = self._network(θ, a)
        return out if run == samples else _unfilled(out, samples, self._sample_batch)

    def runs_at(self, batch: int) -> int:
        """The batch size `apply` runs `batch` samples at: `batch` itself (a distributed
        model: where a plan keeps the weights where its reference batch size put them)."""
        return positive_int(batch, "batch", "FNO.runs_at")

    def _network(self, θ: Params, a: jax.Array) -> jax.Array:
        """`apply` on `a` (checked), at the batch size its operators are planned for."""
        ops = self.operators(a.shape[0])
        with jax.ensure_compile_time_eval():  # constants in the program: XLA computed them split, then gathered them
            axes = [jnp.linspace(0, 1, n, dtype=self.dtype) for n in self.grid]
        coords = jnp.stack(jnp.meshgrid(*axes, indexing="ij"))
        coords = jnp.broadcast_to(coords, (a.shape[0],) + coords.shape)
        a = a.astype(self.dtype)
        placed = explicit_sharding(a)
        if placed is not None:
            # on Explicit mesh axes JAX concatenates only arrays laid out alike: the coordinates
            # as `a` is (under jax.set_mesh they are typed replicated), the channel axis whole
            whole = NamedSharding(placed.mesh, PartitionSpec(placed.spec[0], None, *placed.spec[2:]))
            a, coords = jax.sharding.reshard(a, whole), jax.sharding.reshard(coords, whole)
        h = jnp.concatenate([a, coords], axis=1)
        h = self._affine(ops[0], "lift", θ, h)
        for k, layer in enumerate(ops[1:-2]):
            h = self._fourier_layer(layer, k, θ, h)
        if self.remat:
            return self._blocked_projection(θ, h)
        h = jax.nn.gelu(self._affine(ops[-2], "proj1", θ, h), approximate=False)
        return self._affine(ops[-1], "proj2", θ, h)

    def _fourier_layer(self, layer: Operator, k: int, θ: Params, h: jax.Array) -> jax.Array:
        """Fourier layer `k` (its GELU too, but for the last layer's); with `remat`, only
        its input is kept for the backward pass."""
        names = [n for n in θ if n.split(".")[0] in (f"spectral{k}", f"skip{k}", f"local{k}")]

        def run(weights: Params, h: jax.Array) -> jax.Array:
            h = self._affine(layer, f"skip{k}", weights, h)
            return jax.nn.gelu(h, approximate=False) if k < self.n_layers - 1 else h

        weights = {n: θ[n] for n in names}
        return jax.checkpoint(run)(weights, h) if self.remat else run(weights, h)

    def _blocked_projection(self, θ: Params, h: jax.Array) -> jax.Array:
        """The projection (`proj2 ∘ GELU ∘ proj1`, biases included) over blocks of the
        grid (`projection_blocks`), each block recomputed in the backward pass."""
        return projection_in_blocks(self, θ, h)

    def projection_blocks(self, local_grid: tuple[int, ...]) -> tuple[int, int]:
        """`(axis, count)`: the grid axis (of a device's block `local_grid`) that the
        remat projection cuts, and into how many blocks: the largest axis, in the fewest
        blocks that keep a block's `projection`-wide activation at most a quarter of a
        `width`-wide activation of the whole block (all of the axis where no divisor
        does)."""
        axis = max(range(len(local_grid)), key=lambda i: local_grid[i])
        n = local_grid[axis]
        least = math.ceil(4 * self.projection / self.width)
        return axis, next((d for d in range(1, n + 1) if n % d == 0 and d >= least), n)

    def _affine(self, op: Operator, name: str, θ: Params, h: jax.Array) -> jax.Array:
        y = op(θ) @ h  # checks θ's weight `name`
        key, want = f"{name}.bias", op.parameters[name].param_shape[:1]
        bias = θ.get(key)
        # a bias of another shape would broadcast, a complex one make the output complex: silent wrong answers
        if getattr(bias, "shape", None) != want or getattr(bias, "dtype", None) != self.dtype:
            got = ("none" if bias is None else f"shape {bias.shape} and dtype {bias.dtype}" if hasattr(bias, "shape")
                   else type(bias).__name__)
            raise ValueError(f"FNO: θ[{key!r}] must be an array of shape {want} and dtype {self.dtype.name}, got "
                             f"{got}: make the parameters with model.init(key)")
        return y + bias.reshape(want + (1,) * len(self.grid))

    # -- distribution ------------------------------------------------------------------------
    def distribute(self, partition: tuple[int, ...] | PartitionSpec | None = None, *, devices: int | None = None,
                   batch: int | None = None, memory_limit: float | None = None, mesh: Mesh | None = None,
                   cost: CostModel | None = None) -> "DistributedFNO":
        """The same network over a device mesh, the input split as `partition` over
        `(batch, channel, *grid)`: data parallel (the batch split), model parallel (grid
        axes split) or both. For each batch size it meets, the whole network is planned
        at once (`po.distribute_chain`), once, with the weights where the plan of the
        reference batch size `batch` (by default one sample per device along the batch
        split; planned here) places them (`dist.weights`, passed to each plan as
        `weights=`): give the batch size you train with. The 1x1 convolutions keep their (small, `width²`) weights whole
        (`shard_weights=False`): the spectral weights, split with their modes, are the
        ones that matter, and no row-parallel `psum` can then trade the model's
        parallelism for fewer bytes moved, which also keeps the plan quick to find.
        `mesh` is `po.distribute`'s (by default, the mesh of a `jax.set_mesh` around the
        call, if any, else one parop makes).

        Or `devices=N, batch=B` (not both a partition and devices): parop chooses the
        partition (`dist.partition` says which), the cheapest planned training step on
        `B` samples over `N` devices whose compiled step needs at most `memory_limit`
        bytes per device (`parop.nn.dry_run`); a `ValueError` where none fits. `B` is
        then the reference batch size.

        ```python
        >>> model = FNO((16, 16), width=4, modes=(4, 4), layers=1)
        >>> dist = model.distribute(devices=8, batch=4)   # memory_limit=16e9: dry-runs it too
        >>> dist.partition
        (4, 1, 2, 1)
        ```"""
        if devices is not None or memory_limit is not None:
            if partition is not None or mesh is not None:
                raise ValueError("FNO.distribute: give a partition (and mesh), or devices=N and batch=B for parop "
                                 f"to choose one, not both (got partition={partition!r}, devices={devices!r})")
            if devices is None or batch is None:
                raise ValueError(f"FNO.distribute: choosing a partition needs devices=N and batch=B, got "
                                 f"devices={devices!r}, batch={batch!r}")
            from .partition import choose

            return choose(self, devices, batch, memory_limit, cost)
        if partition is None:
            raise ValueError("FNO.distribute: give a partition of (batch, channel, *grid), or devices=N and batch=B")
        mesh = context_mesh() if mesh is None else mesh  # as po.distribute: the jax.set_mesh around the call
        try:
            return self._rebuild(DistributedFNO, partition=partition, mesh=mesh, cost=cost, batch=batch)
        except PlanningError as error:  # the planner's reason stays the first line (`partition._reason`)
            devices = mesh.size if mesh is not None else math.prod(partition)
            raise PlanningError(f"{error}\nparop can search the partitions of {devices} devices for one that plans: "
                                f"model.distribute(devices={devices}, batch={'B' if batch is None else batch})",
                                gave_up=error.gave_up) from error

    @property
    def distributed(self) -> bool:
        return False


def projection_in_blocks(model: FNO, θ: Params, h: jax.Array) -> jax.Array:
    """`model`'s projection of `h` (`(batch, width, *grid)`, local to one device) block
    by block along one grid axis (`model.projection_blocks`): a `lax.map` whose body,
    checkpointed, is all that holds a block's wide activations, forward or backward."""
    b, grid = h.shape[0], h.shape[2:]
    axis, count = model.projection_blocks(grid)
    block_grid = grid[:axis] + (grid[axis] // count,) + grid[axis + 1:]
    d = model.dtype
    up = channel_mixing(b, model.projection, model.width, block_grid, d, "proj1")
    down = channel_mixing(b, model.out_channels, model.projection, block_grid, d, "proj2")
    weights = {n: θ[n] for n in ("proj1", "proj1.bias", "proj2", "proj2.bias") if n in θ}  # `_affine` names a missing one

    cut, size = 2 + axis, grid[axis] // count  # (batch, channel, *grid): the grid axis as an axis of h

    @jax.checkpoint  # keeps only the block's index: h is the loop's constant, never copied
    def block(i: jax.Array) -> jax.Array:
        block_h = jax.lax.dynamic_slice_in_dim(h, i * size, size, axis=cut)
        g = jax.nn.gelu(model._affine(up, "proj1", weights, block_h), approximate=False)
        return model._affine(down, "proj2", weights, g)

    out = jax.lax.map(block, jnp.arange(count))  # (count, batch, out_channels, *block_grid)
    return jnp.moveaxis(out, 0, cut).reshape((b, model.out_channels) + grid)


def _filled(a: jax.Array, batch: int, split: int) -> jax.Array:
    """`a` with zero samples after each of the `split` blocks of its batch axis (each
    device's block where the axis is split that many ways), `batch` samples in all."""
    blocks = a.reshape((split, a.shape[0] // split) + a.shape[1:])
    filled = jnp.pad(blocks, [(0, 0), (0, (batch - a.shape[0]) // split)] + [(0, 0)] * (a.ndim - 1))
    return filled.reshape((batch,) + a.shape[1:])


def _unfilled(out: jax.Array, batch: int, split: int) -> jax.Array:
    """The first `batch // split` samples of each of the `split` blocks of `out`'s batch
    axis (`_filled`'s inverse)."""
    blocks = out.reshape((split, out.shape[0] // split) + out.shape[1:])
    return blocks[:, :batch // split].reshape((batch,) + out.shape[1:])


@lru_cache(maxsize=16)  # bounded: one compiled initialiser per (shapes, placements) of recent models
def _initializer(draws: tuple[tuple, ...], places: tuple[tuple[str, NamedSharding], ...]):
    """The jitted `{name: key} -> {name: value}` of `FNO._draws`, each value placed as
    `places` says, from its key (`name_keys`).

    Each value is drawn at its shape with the axes its placement leaves whole merged
    (`_merged`) and reshaped: the same values (a `jax.random` draw is a function of each
    element's row-major index), and a draw of rank 5 (a 3-D layer's spectral weight)
    compiles on XLA:CPU in 0.1 s instead of 2.4 s."""
    where = dict(places)

    def draw(key: jax.Array, name: str, shape: tuple[int, ...], dtype, kind: str, bound) -> jax.Array:
        spec = tuple(where[name].spec) if name in where else ()
        if kind == "spectral":
            pair = (2,) + shape
            return jax.lax.complex(*(jax.random.uniform(key, _merged(pair, (None,) + spec), dtype).reshape(pair)
                                     / bound))
        return jax.random.uniform(key, _merged(shape, spec), dtype, -bound, bound).reshape(shape)

    def draw_all(keys: dict[str, jax.Array]) -> Params:
        return {name: draw(keys[name], name, *spec) for name, *spec in draws}

    return jax.jit(draw_all, out_shardings=where or None)


def _merged(shape: tuple[int, ...], spec: tuple) -> tuple[int, ...]:
    """`shape` with each run of adjacent axes that `spec` (a `PartitionSpec`'s entries,
    the missing ones None) leaves whole merged into one, the split axes kept apart: a
    reshape of it to `shape` moves no element between devices.

    >>> _merged((2, 4, 8, 3, 5), (None, None, "x"))
    (8, 8, 15)
    """
    merged: list[int] = []
    whole_before = False
    for n, entry in zip(shape, spec + (None,) * (len(shape) - len(spec))):
        whole = entry is None
        if whole and whole_before:
            merged[-1] *= n
        else:
            merged.append(n)
        whole_before = whole
    return tuple(merged)


def _gave_up(error: ValueError) -> bool:
    """Whether `error` is the planner giving up (a plan may exist), not a proof of none."""
    return isinstance(error, PlanningError) and error.gave_up


def _names(entry) -> tuple[str, ...]:
    """The mesh axis names of one `PartitionSpec` entry."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


class DistributedFNO(FNO):
    """An `FNO` whose operators run distributed (made by `FNO.distribute`)."""

    def __init__(self, grid, *, partition, mesh: Mesh | None = None, cost: CostModel | None = None,
                 batch: int | None = None, **kwargs):
        super().__init__(grid, **kwargs)
        counts = None  # the pieces each axis of (batch, channel, *grid) is cut in, where known here
        if isinstance(partition, PartitionSpec):
            if len(partition) > 2 + len(self.grid):  # po.distribute would take the rest for an operator's batch axes
                raise ValueError(f"FNO.distribute: the partition splits the axes of (batch, channel, *grid): at most "
                                 f"{2 + len(self.grid)} entries for grid {self.grid}, got {partition}")
            if mesh is not None:  # (without one, po.distribute says what is wrong)
                counts = split_sizes(layout_of(partition, 2 + len(self.grid), mesh, "FNO.distribute"), mesh.shape)
            split = counts[0] if counts else 1
        else:
            partition = check_partition(partition, "FNO.distribute")
            if len(partition) != 2 + len(self.grid):
                raise ValueError(f"FNO.distribute: the partition splits the axes of (batch, channel, *grid): "
                                 f"{2 + len(self.grid)} entries for grid {self.grid}, got {partition}")
            if mesh is None:
                check_devices(partition, "FNO.distribute")
            split, counts = partition[0], partition
        if batch is not None and (not is_positive_int(batch) or batch % split):
            raise ValueError(f"FNO.distribute: batch must be a positive multiple of {split} (the partition's batch "
                             f"entry), got {batch!r}")
        if counts is not None:  # the lifting's input: the grid coordinates are channels too
            channels, parts = self.in_channels + len(self.grid), counts[1]
            if channels % parts:
                raise ValueError(
                    f"FNO.distribute: the channel axis enters the network as {self.in_channels} input channel(s) "
                    f"and {len(self.grid)} grid coordinates, {channels} channels, which cannot be split in {parts} "
                    f"(the partition's channel entry): split it in one of {divisors(channels)}")
            check_split_counts((split, channels) + self.grid, counts, "FNO.distribute")
        self.partition = partition
        self._sample_batch = split
        self.reference_batch = split if batch is None else int(batch)
        # The reference batch, planned now: its weight placements (a value) are where every
        # other batch size's plan keeps them.
        reference = self._chain(self.reference_batch, partition, mesh, cost, None)
        self._kept_always = self.reference_batch
        self._for_batch(self.reference_batch, "operators", lambda: reference)
        self.weights = {name: spec for D in reference for name, spec in D.plan.weight_placements.items()}

    def _chain(self, b: int, partition, mesh, cost, weights) -> list[DistributedOperator]:
        """The network for `b` samples, planned as a whole with the weights named in
        `weights` placed as it says."""
        return list(distribute_chain(FNO._build(self, b), partition, mesh=mesh, shard_weights=False, cost=cost,
                                     weights=weights))

    @property
    def mesh(self) -> Mesh:
        return self.operators(self.reference_batch)[0].mesh

    @property
    def in_sharding(self) -> NamedSharding:
        """Where the model wants its input `a` (and the targets, for the loss)."""
        return self.operators(self.reference_batch)[0].in_sharding

    def _build(self, b: int) -> list[DistributedOperator]:
        split = self._sample_batch
        if b % split:
            raise ValueError(f"FNO.distribute: a batch of {b} samples cannot be split in {split} (the partition's "
                             f"batch entry): use a multiple of {split}")
        try:
            return self._replanned(b, self.weights)
        except ValueError as error:
            try:  # only where some placement would plan are the reference's placements to blame
                self._replanned(b, None)
            except ValueError as unpinned:
                none = ("could not be planned on this partition (the planner gave up)" if _gave_up(unpinned)
                        else "has no plan on this partition")
                raise ValueError(f"FNO.distribute: a batch of {b} samples {none}, wherever its weights go (the "
                                 f"reference batch size {self.reference_batch} has one): {unpinned}") from unpinned
            placed = {n: s for n, s in self.weights.items() if any(s)}  # the split ones
            why = "could not be planned (the planner gave up)" if _gave_up(error) else "cannot be planned"
            raise ValueError(
                f"FNO.distribute: a batch of {b} samples {why} with the weights where the plan of the reference "
                f"batch size {self.reference_batch} puts them ({placed or 'every weight whole on each device'}); "
                f"distribute with batch={b} (the reference batch size: every other batch size keeps its "
                f"placements)") from error

    def _replanned(self, b: int, weights) -> list[DistributedOperator]:
        """`_chain` for `b` samples on the reference batch size's input layout, mesh and cost."""
        first = self.operators(self.reference_batch)[0]
        return self._chain(b, first.in_sharding.spec, first.mesh, first.cost, weights)

    def runs_at(self, batch: int) -> int:
        """The batch size `apply` runs `batch` samples at: `batch` itself where a plan
        keeps the weights where the reference batch size's plan put them (`operators`);
        a smaller batch with no such plan runs at the reference batch size, filled up
        with zero samples whose outputs are dropped (each device's block of the batch
        axis keeps its own samples: nothing moves). So a model trained at 8 samples on 8
        devices, every weight whole, applies to one sample, which no plan with whole
        weights splits over 8 devices. Decided once per batch size.

        >>> dist = FNO((16, 16), width=4, modes=(4, 4), layers=1).distribute((1, 1, 2, 4), batch=8)
        >>> dist.runs_at(8), dist.runs_at(6), dist.runs_at(1)
        (8, 6, 8)
        """
        batch = super().runs_at(batch)
        return self._for_batch(batch, "runs_at", lambda: self._runs_at(batch))

    def _runs_at(self, batch: int) -> int:
        if batch >= self.reference_batch or batch % self._sample_batch:
            return batch  # (`operators` says why, where it has no plan)
        try:  # the pinned plan alone, kept as `operators`' where found (`_build` plans more, to say why not)
            self._for_batch(batch, "operators", lambda: self._replanned(batch, self.weights))
        except ValueError:  # no plan with the reference's placements: the reference's runs
            return self.reference_batch
        return batch

    def _blocked_projection(self, θ: Params, h: jax.Array) -> jax.Array:
        """The remat projection on each device's block, in the layout where the planned
        `proj1` takes it (its channels whole: a pointwise map, no collective but the
        weight gradients' all-reduces), then moved as the planned `proj2` moves its
        output (`projection_move`)."""
        ops = self.operators(h.shape[0])
        spec = ops[-2].in_sharding.spec
        varying = tuple(n for entry in spec for n in _names(entry))
        names = ("proj1", "proj1.bias", "proj2", "proj2.bias")

        def local(weights: Params, h: jax.Array) -> jax.Array:
            # varying once, outside the blocks: each weight's gradient is summed in one psum
            weights = {n: jax.lax.pcast(w, varying, to="varying") if varying else w for n, w in weights.items()}
            return projection_in_blocks(self, weights, h)

        out = jax.shard_map(local, mesh=self.mesh, in_specs=(PartitionSpec(), spec), out_specs=spec)(
            {n: θ[n] for n in names if n in θ}, h)  # `_affine` names a missing one
        move = self.projection_move(h.shape[0])
        return out if move is None else move @ out

    def projection_move(self, batch: int) -> DistributedOperator | None:
        """The repartition that the planned `proj2` ends with (from `proj1`'s input layout
        to the network's output layout), as a distributed `Identity`; `None` where there
        is none. The remat projection runs it after its blocks."""
        ops = self.operators(batch)
        start, end = ops[-2].in_sharding.spec, ops[-1].out_sharding.spec
        if ops[-2].plan.in_layout == ops[-1].plan.out_layout:
            return None
        return self._for_batch(batch, "projection_move", lambda: distribute(  # start, end: this batch size's plans
            kron(*(Identity(n) for n in ops[-1].range_shape)), start, mesh=self.mesh, out_partition=end,
            cost=ops[0].cost))

    def param_shardings(self) -> dict[str, NamedSharding]:
        """Where each parameter lives: where the plan of the reference batch size places
        it, for every batch size."""
        ops = self.operators(self.reference_batch)
        shardings: dict[str, NamedSharding] = {}
        for op in ops:
            shardings.update(op.param_shardings())
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return {**{f"{n}.bias": replicated for n in self.parameters if not n.startswith("spectral")}, **shardings}

    @property
    def distributed(self) -> bool:
        return True
