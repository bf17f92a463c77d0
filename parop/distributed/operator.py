"""`po.distribute` and the `DistributedOperator` it returns."""

from __future__ import annotations

import math
from typing import Literal, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..operator import Operator, Params, _as_input_dtype, _as_tensor
from ..params import check_params, init
from .layout import (
    Layout, check_mesh, check_partition, default_mesh, layout_for_counts, layout_of, layout_on_mesh, sharding,
    split_sizes,
)
from .lower import lower, stored_spec
from .plan import Plan, make_plan

OutPartition = None | Literal["auto"] | tuple | PartitionSpec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_multiples(n: int, p: int) -> str:
    lower = n - n % p
    return f"{lower} or {lower + p}" if lower else f"{p}"


def check_splits(shape, layout: Layout, mesh: Mesh, where: str) -> None:
    """A `ValueError` naming the axis, its size, the split and the sizes that work where
    `layout` splits an axis of `shape` unevenly (parop rejects uneven sizes)."""
    for axis, (n, p) in enumerate(zip(shape, split_sizes(layout, mesh.shape))):
        if n % p:
            raise ValueError(
                f"{where}: input axis {axis} of size {n} cannot be split in {p}: use a size "
                f"divisible by {p} ({_nearest_multiples(n, p)}), or split it in one of {_divisors(n)}"
            )


def place(value, sharding: NamedSharding) -> jax.Array:
    """`value`, the same on every process, as a global array with `sharding` (each
    process fills its own shards, so this works with several processes too)."""
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class DistributedOperator(Operator):
    """An operator run as one `shard_map` program over a device mesh: the same linear
    map as `op` on global arrays. Made by `po.distribute`.

    ```python
    >>> D = po.distribute(po.kron(po.DFT(64), po.DFT(64), po.DFT(64)), partition=(2, 2, 2))
    >>> y = D @ x                  # x: (64, 64, 64) complex64, any sharding or host data
    >>> print(D.plan)              # the all_to_all steps, local FFTs and bytes moved
    ```
    """

    def __init__(self, op: Operator, mesh: Mesh, in_layout: Layout | None, out: str | Layout | None,
                 where: str, shard_weights: bool | str = "auto", adjoint_of: "DistributedOperator | None" = None):
        for name in ("domain_shape", "range_shape", "dtype", "range_dtype"):
            object.__setattr__(self, name, getattr(op, name))
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "_in", in_layout)
        object.__setattr__(self, "_out", out)
        object.__setattr__(self, "_where", where)
        object.__setattr__(self, "_adjoint_of", adjoint_of)
        object.__setattr__(self, "shard_weights", shard_weights)
        object.__setattr__(self, "_plans", {})
        object.__setattr__(self, "_programs", {})

    # -- the operator interface ----------------------------------------------------------
    def out_dtype(self, dtype):
        return self.op.out_dtype(dtype)

    def children(self):
        return (self.op,)

    def _apply(self, θ, x, axis):
        raise TypeError(
            f"{self!r} is distributed: combine operators before distributing them, "
            "po.distribute(A @ B, ...), not po.distribute(A, ...) @ B"
        )

    def _adjoint(self) -> "DistributedOperator":
        return DistributedOperator(self.op.H, self.mesh, None, None, f"{self._where}.H", self.shard_weights,
                                   adjoint_of=self)

    def _key(self) -> tuple:
        return ("DistributedOperator", id(self))

    def describe(self) -> str:
        from ..display import short

        return f"distribute({short(self.op)}, {self.in_sharding.spec})"

    # -- layouts and plans ---------------------------------------------------------------
    @property
    def n_batch(self) -> int:
        """The number of trailing batch axes the partition names."""
        source = self if self._adjoint_of is None else self._adjoint_of
        return len(source._in) - source.op.ndim

    def plan_for(self, batch_shape: tuple[int, ...] = ()) -> Plan:
        """The plan for inputs with these trailing batch axes (planned once, cached)."""
        batch_shape = tuple(batch_shape)
        if batch_shape not in self._plans:
            self._plans[batch_shape] = self._make_plan(batch_shape)
        return self._plans[batch_shape]

    def _make_plan(self, batch_shape) -> Plan:
        shape = self.domain_shape + batch_shape
        if len(batch_shape) != self.n_batch:
            raise ValueError(
                f"{self._where}: the partition names {self.n_batch} batch axes, but the input "
                f"of shape {shape} has {len(batch_shape)}"
            )
        if self._adjoint_of is not None:
            forward = self._adjoint_of.plan_for(batch_shape)
            in_layout, target = forward.out_layout, forward.in_layout
            accept = lambda layout: layout == target
        else:
            in_layout = self._in
            accept = self._acceptor(in_layout, shape)
        check_splits(shape, in_layout, self.mesh, self._where)
        return make_plan(self.op, shape, in_layout, self.mesh.shape, accept, self._where,
                         shard_weights=self.shard_weights)

    def _acceptor(self, in_layout: Layout, shape):
        out = self._out
        if out == "auto":
            return lambda layout: True
        if out is not None:
            return lambda layout: layout == out
        out_shape = self.range_shape + shape[self.op.ndim:]
        # an axis keeps its split where the output size allows; a split an axis cannot
        # keep goes where it costs least (after the kept split of another axis)
        kept = [axes if axes and n % math.prod(self.mesh.shape[m] for m in axes) == 0 else None
                for axes, n in zip(in_layout, out_shape)]
        reduced = {m for axes, n in zip(in_layout, out_shape) if n == 1 for m in axes}
        replicated = set(self.mesh.axis_names) - {m for axes in in_layout for m in axes}

        def accept(layout):
            used = {m for axes in layout for m in axes}
            return (all(k is None or axes[:len(k)] == k for k, axes in zip(kept, layout))
                    and not used & (reduced | replicated))

        return accept

    def _default_batch(self) -> tuple[int, ...]:
        """The batch shape whose plan `D.plan` and `po.init(D)` use: the only one without
        batch axes, else the last one planned (or, before any call, a large batch that
        every split divides: 1024 per device)."""
        if self.n_batch == 0:
            return ()
        if self._plans:
            return next(reversed(self._plans))
        source = self if self._adjoint_of is None else self._adjoint_of
        return tuple(p * 1024 for p in split_sizes(source._in, self.mesh.shape)[source.op.ndim:])

    @property
    def plan(self) -> Plan:
        """The plan (for the last batch shape used, where the partition has batch axes)."""
        return self.plan_for(self._default_batch())

    @property
    def in_sharding(self) -> NamedSharding:
        return sharding(self.mesh, self.plan.in_layout)

    @property
    def out_sharding(self) -> NamedSharding:
        return sharding(self.mesh, self.plan.out_layout)

    def param_shardings(self) -> dict[str, NamedSharding]:
        """Where `po.init(D, key)` puts each weight: split as the axes it runs along
        (where it is first used), replicated where its operator needs it whole
        (or where its split is uneven: see `stored_spec`)."""
        _, specs = self._program(self._default_batch())
        out: dict[str, NamedSharding] = {}
        for name, spec in specs:
            shape = self.parameters[name].param_shape
            out.setdefault(name, NamedSharding(self.mesh, stored_spec(spec, shape, self.mesh)))
        for name in self.parameters:
            out.setdefault(name, NamedSharding(self.mesh, PartitionSpec()))
        return out

    def _program(self, batch_shape):
        if batch_shape not in self._programs:
            self._programs[batch_shape] = lower(self.plan_for(batch_shape), self.mesh)
        return self._programs[batch_shape]

    # -- application ---------------------------------------------------------------------
    def apply(self, θ: Params | None, x) -> jax.Array:
        θ = {} if θ is None else θ
        if not isinstance(θ, Mapping):
            check_params(self, θ)  # raises the TypeError
        weights = {name: self._onto_mesh(θ[name], lambda: self.param_shardings()[name])
                   for name in self.parameters if name in θ}
        tensor = lambda: self.in_sharding if np.ndim(x) == self.op.ndim + self.n_batch \
            else NamedSharding(self.mesh, PartitionSpec())  # noqa: E731  (flat input)
        return self._call(weights, self._onto_mesh(x, tensor))

    def _onto_mesh(self, value, sharding):
        """`value` itself where `jit` can take it with this mesh's arrays (uncommitted,
        already on the mesh, or a tracer); else moved to `sharding()` first (an array
        committed to other devices or another mesh)."""
        if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer) or not value.committed:
            return value
        placed = value.sharding
        if isinstance(placed, NamedSharding) and placed.mesh == self.mesh:
            return value
        return jax.device_put(value, sharding())

    @property
    def _call(self):
        """`(θ, x) -> y` under `jax.jit`: the checks and the flat/tensor handling run
        when it traces, so a call costs what the jitted program's dispatch costs."""

        def call(θ, x):
            x, unflatten = _as_tensor(self, x)
            x = _as_input_dtype(self, x)
            check_params(self, θ)
            run, specs = self._program(tuple(x.shape[self.ndim:]))
            return unflatten(run(x, *(θ[name] for name, _ in specs)))

        return self._cache("_jitted_call", lambda: jax.jit(call))


@init.register
def _(op: DistributedOperator, key: jax.Array) -> dict[str, jax.Array]:
    shardings = op.param_shardings()
    return {name: place(value, shardings[name]) for name, value in init(op.op, key).items()}


def distribute(
    op: Operator,
    partition: tuple[int, ...] | PartitionSpec,
    *,
    out_partition: OutPartition = None,
    mesh: Mesh | None = None,
    shard_weights: bool | Literal["auto"] = "auto",
) -> DistributedOperator:
    """`op` as one `shard_map` program over a device mesh: the same linear map.

    - `partition`: one positive int per input axis (domain axes, then any trailing batch
      axes): how many pieces each is split in, on a mesh over the first
      `prod(partition)` devices with one mesh axis `d{i}` per split axis. Or a
      `PartitionSpec` with `mesh=` (Auto or Explicit axes), used as given.
    - `out_partition`: `None` (the input's layout wherever the output sizes allow; a
      `Reduce`d axis comes back replicated), a tuple or `PartitionSpec`, or `"auto"`
      (the cheapest layout; `D.out_sharding` says which).
    - `shard_weights`: how a `Matrix` on a split axis (or with a free mesh axis) may
      run. `"auto"`: the planner picks, by bytes moved, between moving the activations
      and replicating the weight, and the tensor-parallel forms: row-parallel (the
      weight split by columns with the input's split, partial products, `psum` or
      `psum_scatter`) and column-parallel (the weight split by rows over a free mesh
      axis, the output split the same way, no traffic). `True`: every `Matrix` weight
      is sharded (a `ValueError` where no form fits). `False`: always replicated.

    The planner makes axes an operator needs whole local by `all_to_all` moves, keeps
    `Identity`/`Diagonal` axes split, and turns a `Reduce` over a split axis into a
    `psum`; `print(D.plan)` shows the program.

    ```python
    >>> F = po.kron(po.DFT(30), po.DFT(20), po.DFT(10, dtype=jnp.float32))
    >>> D = po.distribute(F, partition=(2, 1, 1))
    >>> y = D @ x                 # == np.fft.rfftn(x), sharded as D.out_sharding
    ```
    """
    if not isinstance(op, Operator) or isinstance(op, DistributedOperator):
        raise TypeError(f"po.distribute takes a serial parop operator, got {op!r}")
    where = f"distribute({op!r})"
    check_mesh(mesh, where)
    if isinstance(partition, PartitionSpec):
        if mesh is None:
            raise ValueError(f"{where}: a PartitionSpec partition needs mesh=")
        in_layout = layout_of(partition, max(len(partition), op.ndim), mesh, where)
    else:
        partition = check_partition(partition, where)
        if len(partition) < op.ndim:
            _wrong_length(where, op, partition)
        if mesh is None:
            mesh, in_layout = default_mesh(partition, where)
        else:
            in_layout = layout_on_mesh(partition, mesh, where)
    check_splits(op.domain_shape, in_layout, mesh, where)  # batch axes: at the first call
    out: str | Layout | None
    if out_partition is None or out_partition == "auto":
        out = out_partition
    elif isinstance(out_partition, PartitionSpec):
        out = layout_of(out_partition, len(in_layout), mesh, where)
    else:
        counts = check_partition(out_partition, where)
        if len(counts) != len(in_layout):
            raise ValueError(
                f"{where}: out_partition has {len(counts)} entries, the output has {len(in_layout)} axes"
            )
        out = layout_for_counts(counts, in_layout, mesh, where)
    if shard_weights not in (True, False, "auto"):
        raise ValueError(f"{where}: shard_weights must be True, False or 'auto', got {shard_weights!r}")
    D = DistributedOperator(op, mesh, in_layout, out, where, shard_weights)
    if D.n_batch == 0:
        D.plan_for(())  # plan now, so that bad input fails here and not at the first call
    return D


def _wrong_length(where, op, partition):
    raise ValueError(
        f"{where}: partition {tuple(partition)} has {len(partition)} entries, but the operator's "
        f"input has {op.ndim} axes (domain {op.domain_shape}), plus any trailing batch axes"
    )
