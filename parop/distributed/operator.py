"""`po.distribute` and the `DistributedOperator` it returns."""

from __future__ import annotations

import functools
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .._checks import batch_sizes, divisors
from ..algebra import kron
from ..operator import Operator, Params, _as_input_dtype, _as_tensor, describe_mesh
from ..operators import Identity, Role
from ..params import check_params
from .layout import (
    Layout, check_mesh, check_partition, context_mesh, default_mesh, layout_of, layout_on_mesh, left_out, sharding,
    spec_of, split_sizes,
)
from .lower import explicit, lower, placer, stored_spec
from .plan import CostModel, Goal, Plan, PlanningError, counts_goal, default_goal, make_plan
from .plan.program import program

OutPartition = None | Literal["auto"] | tuple | PartitionSpec
PROGRAMS_KEPT = 64  # programs (and plans) each distributed operator keeps, one per input shape


def _nearest_multiples(n: int, p: int) -> str:
    lower = n - n % p
    return f"{lower} or {lower + p}" if lower else f"{p}"


def check_splits(shape, layout: Layout, mesh: Mesh, where: str) -> None:
    """A `ValueError` naming the axis, its size, the split and the sizes that work where
    `layout` splits an axis of `shape` unevenly (parop rejects uneven sizes)."""
    check_split_counts(shape, split_sizes(layout, mesh.shape), where)


def check_split_counts(shape, counts, where: str, role: str = "input") -> None:
    """`check_splits` for the number of pieces each axis of `shape` (the `role` tensor,
    "input" or "output") is split in.

    >>> check_split_counts((8, 6), (2, 4), "here")
    Traceback (most recent call last):
    ValueError: here: input axis 1 of size 6 cannot be split in 4: use a size divisible by 4 (4 or 8), or split it in one of [1, 2, 3, 6]
    """
    for axis, (n, p) in enumerate(zip(shape, counts)):
        if n % p:
            sizes = f"use a size divisible by {p} ({_nearest_multiples(n, p)}), or " if role == "input" else ""
            raise ValueError(f"{where}: {role} axis {axis} of size {n} cannot be split in {p}: {sizes}split it in one "
                             f"of {divisors(n)}")


def place(value, sharding: NamedSharding) -> jax.Array:
    """`value`, the same on every process, as a global array with `sharding` (each
    process fills its own shards, so this works with several processes too)."""
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


@dataclass(frozen=True)
class Placement:
    """Where a distributed program takes its input or leaves its output
    (`Operator._placement`): the mesh, and the layout of the tensor's `ndim` axes and its
    trailing batch axes. `cost`, the program's machine model, plans a move from here.

    ```python
    >>> D = po.distribute(po.kron(po.DFT(8), po.DFT(8)), (2, 4), out_partition=(1, 8))
    >>> D._placement((), output=False).layout, D._placement((), output=True).layout
    ((('d0',), ('d1',)), ((), ('d0', 'd1')))
    ```
    """

    mesh: Mesh
    layout: Layout
    ndim: int
    cost: CostModel = field(compare=False)

    def onto(self, x: jax.Array, target: "Placement", moves: dict) -> jax.Array:
        """`x`, laid out here, moved to `target`'s layout by a planned repartition: the
        identity distributed from here to there (`all_to_all`s, its program kept in
        `moves`). Where no route of whole splits leads there (as from
        `P(None, ('a', 'b'))` to `P('a', 'b')` on a tensor of 4 x 8), `x` pinned to
        `target`'s sharding (`with_sharding_constraint`, or `reshard` on Explicit axes):
        XLA moves it. Where `target` leaves out a mesh axis this layout splits over (a
        gather, which no plan makes), `x` itself on Auto axes (the next program's input,
        or XLA's `+`, moves it), and `x` resharded on Explicit ones (JAX refuses the `+`
        of two layouts there). (Both are on one mesh: a combination of operators
        distributed on two is a `ValueError`.)"""
        if left_out(self.layout, target.layout):
            return jax.sharding.reshard(x, sharding(self.mesh, target.layout)) if explicit(self.mesh) else x
        shape, batch = x.shape[:self.ndim], x.shape[self.ndim:]
        key = (self, target, shape, x.dtype)
        if key not in moves:
            identity = kron(*(Identity(n, dtype=x.dtype) for n in shape))
            try:
                moves[key] = distribute(identity, spec_of(self.layout), mesh=self.mesh, cost=self.cost,
                                        out_partition=spec_of(target.layout), batch_shape=batch)
            except PlanningError:
                moves[key] = None
        move = moves[key]
        if move is None:  # told where to: left to choose, XLA may gather the whole array
            return placer(self.mesh)(x, sharding(self.mesh, target.layout))
        return move._call({}, x)


@dataclass(frozen=True)
class Request:
    """What `distribute`'s arguments ask for, checked: the mesh, the input layout of the
    domain and the batch axes the partition names, the wanted output (`None`, `"auto"`,
    `("layout", layout)` or `("counts", counts)`), the machine model, how weights may
    be sharded, and the name errors give."""

    mesh: Mesh
    in_layout: Layout
    out: object
    cost: CostModel
    shard_weights: bool | str
    where: str

    def goal(self, in_layout: Layout, out_shape: tuple[int, ...]) -> Goal:
        """The goal of a plan from `in_layout` (with any unnamed batch axes) to a tensor of
        `out_shape`."""
        out, extra = self.out, len(out_shape) - len(self.in_layout)
        if out is None:
            return default_goal(in_layout, out_shape, self.mesh.shape)
        if out == "auto":
            return Goal.any()
        if out[0] == "counts":
            return counts_goal(out[1] + (1,) * extra, in_layout, self.mesh.shape)
        return Goal.layout(out[1] + ((),) * extra)

    def n_batch(self, op: Operator) -> int:
        """The number of trailing batch axes the partition names."""
        return len(self.in_layout) - op.ndim

    def batch_shape(self, op: Operator, given) -> tuple[int, ...]:
        """The batch shape to plan `op` for: `given` (checked), or, where that is None,
        none where the partition names no batch axis, else 1024 per device along each."""
        if given is not None:
            return batch_sizes(given, f"{self.where}: batch_shape")
        return tuple(p * 1024 for p in split_sizes(self.in_layout, self.mesh.shape)[op.ndim:])

    def plan(self, op: Operator, batch_shape: tuple[int, ...], weights: Weights = ()) -> Plan:
        """The plan for `op` on inputs with trailing `batch_shape`, with the weights named
        in `weights` placed as it says."""
        batch_shape = tuple(batch_shape)
        named = self.n_batch(op)
        if len(batch_shape) < named:
            raise ValueError(
                f"{self.where}: the partition names {named} batch axes, but the input of shape "
                f"{op.domain_shape + batch_shape} has {len(batch_shape)}"
            )
        shape = op.domain_shape + batch_shape
        in_layout = self.in_layout + ((),) * (len(batch_shape) - named)  # unnamed batch axes: replicated
        check_splits(shape, in_layout, self.mesh, self.where)
        goal = self.goal(in_layout, op.range_shape + batch_shape)
        return make_plan(op, shape, in_layout, self.mesh.shape, goal, self.cost, self.where,
                         self.shard_weights, dict(weights))

    def weights(self, parameters: Mapping[str, Operator], weights) -> Weights:
        """`weights` (`{name: PartitionSpec}`, as `Plan.weight_placements` gives, or None)
        as `(name, layout)` pairs for the planner, checked against the weights
        `parameters` (`{name: leaf}`) and the mesh."""
        if weights is None:
            return ()
        if not isinstance(weights, Mapping):
            raise TypeError(f"{self.where}: weights must be a dict {{name: PartitionSpec}} (a plan's "
                            f"weight_placements), got {type(weights).__name__}")
        out = []
        for name, spec in weights.items():
            if name not in parameters:
                raise ValueError(f"{self.where}: weights names {name!r}, not a weight of the operator "
                                 f"(its weights: {sorted(parameters)})")
            if not isinstance(spec, PartitionSpec):
                raise TypeError(f"{self.where}: weights[{name!r}] must be a PartitionSpec, got {spec!r}")
            ndim = len(parameters[name].param_shape)
            out.append((name, layout_of(spec, ndim, self.mesh, f"{self.where}: weights[{name!r}]", "a weight")))
        return tuple(sorted(out))


Weights = tuple[tuple[str, Layout], ...]  # (weight name, the mesh axes splitting each of its axes)


class Programs:
    """The one mutable part of a distributed operator, shared by `D`, `D.H` and every copy
    JAX makes of them (compared by identity: it is part of their static pytree data):
    for each input batch shape and direction, its plan and its lowered program (the
    `PROGRAMS_KEPT` most recently used), and the jitted call of each direction."""

    def __init__(self):
        self.kept: OrderedDict = OrderedDict()  # (batch shape, adjoint) -> [plan, program or None]
        self.calls: dict = {}  # adjoint -> the jitted call

    def entry(self, key, make_plan) -> list:
        """`[plan, program or None]` for `key`, planned (`make_plan()`) if not kept."""
        if key not in self.kept:
            self.kept[key] = [make_plan(), None]
            while len(self.kept) > PROGRAMS_KEPT:
                self.kept.popitem(last=False)
        self.kept.move_to_end(key)
        return self.kept[key]


class DistributedOperator(Operator):
    """An operator run as one `shard_map` program over a device mesh: the same linear
    map as `op` on global arrays. Made by `po.distribute`.

    It takes what a serial operator takes: tensors `domain_shape + batch` (trailing batch
    axes the partition does not name are replicated) or flat `(N,)`/`(N, b)` input;
    `D.H` runs the transpose of `D`'s plans; `D2 @ D1`, `D1 + D2` and `c * D` combine
    operators distributed on one mesh (each runs its program, `D1.out_sharding` feeding
    `D2`, a planned repartition between layouts that differ: `Placement.onto`); `po.kron`
    of a distributed operator is a `TypeError`.

    `D.plan` is the plan for the batch shape given to `po.distribute` (`batch_shape=`);
    `D.plan_for(batch_shape)` plans another batch shape (once) with every weight where
    `D.plan` puts it, so `po.init(D)` places each weight once for all of them.

    ```python
    >>> D = po.distribute(po.kron(po.DFT(64), po.DFT(64), po.DFT(64)), partition=(2, 2, 2))
    >>> x = np.ones((64, 64, 64), np.complex64)     # any sharding, or host data
    >>> y = D @ x
    >>> print(D.plan)              # the all_to_all steps, local FFTs and bytes moved
    plan for DFT(64) ⊗ DFT(64) ⊗ DFT(64) on mesh (d0: 2, d1: 2, d2: 2), costed for training
      in   (64, 64, 64) P('d0', 'd1', 'd2')
      all_to_all d0: axis 0 -> axis 1   fwd 128.0 KiB, bwd 128.0 KiB   -> P(None, ('d1', 'd0'), 'd2')
      DFT(64) on axis 0
    ...
      out  (64, 64, 64) P('d0', 'd1', 'd2')
      forward:  6 all_to_all; 768.0 KiB sent per device
      backward: 6 all_to_all; 768.0 KiB sent per device
    ```

    `op` keeps its unnamed leaves: like any operator, `D` names them as the root it is
    used in (alone: as `op` does; inside `D2 @ D1`: as the composition does). Its plans
    are for `planned` (`op.named` when `D` was made) and its programs take the weights
    by those names, translated (`weight_names`).
    """

    distributed = True

    def __init__(self, op: Operator, request: Request, plan: Plan, programs: Programs | None = None,
                 adjoint: bool = False, planned: Operator | None = None):
        shown = op.H if adjoint else op
        for name in ("domain_shape", "range_shape", "dtype", "range_dtype"):
            object.__setattr__(self, name, getattr(shown, name))
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "forward_plan", plan)  # the plan of `op` for the batch shape given
        object.__setattr__(self, "programs", Programs() if programs is None else programs)
        object.__setattr__(self, "adjoint", adjoint)
        object.__setattr__(self, "planned", op.named if planned is None else planned)

    # -- the operator interface ----------------------------------------------------------
    def out_dtype(self, dtype):
        return (self.op.H if self.adjoint else self.op).out_dtype(dtype)

    def children(self):
        return (self.op,)

    def _tree_fields(self):
        return ("op",)

    def _key(self) -> tuple:
        return ("DistributedOperator", self.op._key(), id(self.programs), self.adjoint)

    @property
    def weight_names(self) -> dict[str, str]:
        """`{name in the plans: name in θ}`: the names `planned` gives the weights, and the
        names they have here (where `D` is used inside a larger operator, that operator
        names `op`'s unnamed leaves)."""

        def make():
            from ..params import occurrences

            here = occurrences(self.op.named)
            return {a.name: b.name for a, b in zip(occurrences(self.planned), here)}

        return self._cache("_weight_names", make)

    def _apply(self, θ, x, axis):
        if x.size == 0:  # as in `apply` (here inside `D2 @ D1`, `c * D`, `D.T`, ...): the empty result
            return (self.op.H if self.adjoint else self.op)._apply(θ, x, axis)
        return self._call({p: θ[n] for p, n in self.weight_names.items()}, x)

    def _meshes(self) -> frozenset:
        return frozenset((self.mesh,))

    def _init_shardings(self) -> dict[str, NamedSharding]:
        if isinstance(self.mesh, AbstractMesh):
            raise ValueError(f"po.init({self.request.where}): planned on an AbstractMesh (a mesh shape), which has "
                             "no devices to hold the weights: distribute it on a jax.sharding.Mesh of devices to "
                             "initialise it")
        return self.param_shardings()

    def _placement(self, batch_shape: tuple[int, ...], output: bool) -> Placement:
        plan = self.plan_for(batch_shape)
        layout, shape = (plan.out_layout, self.range_shape) if output else (plan.in_layout, self.domain_shape)
        return Placement(self.mesh, layout, len(shape), self.cost)

    def _adjoint(self) -> "DistributedOperator":
        return DistributedOperator(self.op, self.request, self.forward_plan, self.programs, not self.adjoint,
                                   self.planned)

    def inverse(self) -> "DistributedOperator":
        """The inverse of `op` distributed on this mesh, from the layout `D` leaves its
        output in to the one it takes its input in (its batch shape's plans), where `op`
        has an inverse (a `TypeError` naming it otherwise).

        ```python
        >>> D = po.distribute(po.kron(po.DFT(8), po.DFT(8)), (2, 4), out_partition=(1, 8))
        >>> E = D.inverse()
        >>> E.in_sharding == D.out_sharding and E.out_sharding == D.in_sharding
        True
        ```
        """
        if self.adjoint:
            return self.H.inverse().H  # (A^H)^-1 = (A^-1)^H
        plan = self.plan
        return distribute(self.op.inverse(), spec_of(plan.out_layout), mesh=self.mesh, cost=self.cost,
                          shard_weights=self.request.shard_weights, out_partition=spec_of(plan.in_layout),
                          batch_shape=self.batch_shape)

    def describe(self) -> str:
        from ..display import short

        text = f"distribute({short(self.op)}, {spec_of(self.request.in_layout)})"
        return text + ".H" if self.adjoint else text

    @property
    def mesh(self) -> Mesh:
        return self.request.mesh

    @property
    def cost(self) -> CostModel:
        return self.request.cost

    # -- layouts and plans ---------------------------------------------------------------
    @property
    def n_batch(self) -> int:
        """The number of trailing batch axes the partition names."""
        return self.request.n_batch(self.op)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The batch shape `D.plan` is planned for."""
        return self.forward_plan.shape[self.op.ndim:]

    @property
    def plan(self) -> Plan:
        """The plan for the batch shape given to `po.distribute` (`D.batch_shape`)."""
        return self.plan_for(self.batch_shape)

    def plan_for(self, batch_shape: tuple[int, ...] = ()) -> Plan:
        """The plan for inputs with these trailing batch axes (planned once, kept), with
        every weight where `D.plan` places it (where no plan can, the cheapest plan: its
        program then takes the weights where they are and moves them)."""
        return self._entry(batch_sizes(batch_shape, f"{self.request.where}: plan_for"))[0]

    def _entry(self, batch_shape: tuple[int, ...]) -> list:
        return self.programs.entry((batch_shape, self.adjoint), lambda: self._planned(batch_shape))

    def _planned(self, batch_shape: tuple[int, ...]) -> Plan:
        if self.adjoint:
            return self.H.plan_for(batch_shape).transpose(self.planned.H)
        if batch_shape == self.batch_shape:
            return self.forward_plan
        weights = tuple(sorted(self.forward_plan.weight_layouts.items()))
        try:
            return self.request.plan(self.planned, batch_shape, weights)
        except PlanningError:  # no plan keeps the weights in place for this batch: they move in the program
            return self.request.plan(self.planned, batch_shape)

    @property
    def in_sharding(self) -> NamedSharding:
        return sharding(self.mesh, self.plan.in_layout)

    @property
    def out_sharding(self) -> NamedSharding:
        """The output's sharding under `D.plan` (of `D.batch_shape`); another batch shape's
        output is laid out as its own plan ends (`D.plan_for(batch_shape).out_layout`),
        which may differ where `out_partition` leaves a choice."""
        return sharding(self.mesh, self.plan.out_layout)

    def param_shardings(self) -> dict[str, NamedSharding]:
        """Where `po.init(D, key)` puts each weight: split as the axes it runs along
        (where it is first used), replicated where its operator needs it whole
        (or where its split is uneven: see `stored_spec`)."""
        out: dict[str, NamedSharding] = {}
        for planned, spec in self.forward_plan.weight_placements.items():
            name = self.weight_names[planned]
            shape = self.parameters[name].param_shape
            out[name] = NamedSharding(self.mesh, stored_spec(spec, shape, self.mesh))
        for name in self.parameters:
            out.setdefault(name, NamedSharding(self.mesh, PartitionSpec()))
        return out

    def program(self, batch_shape: tuple[int, ...] = ()) -> tuple[Callable, list]:
        """`(run, weight specs)`: the jitted program `run(x, *weights, scalars=())` for inputs
        with these batch axes (lowered once, kept), `weights` in the order of the
        `(name, PartitionSpec)` list."""
        kept = self._entry(batch_sizes(batch_shape, f"{self.request.where}: program"))
        if kept[1] is None:
            self._check_runs_here()
            # a mesh shape runs as the context's (JAX's shard_map takes only that one, device kind and all)
            mesh = jax.sharding.get_abstract_mesh() if isinstance(self.mesh, AbstractMesh) else self.mesh
            kept[1] = lower(kept[0], mesh)
        return kept[1]

    # -- application ---------------------------------------------------------------------
    def apply(self, θ: Params | None, x) -> jax.Array:
        θ = {} if θ is None else θ
        if not isinstance(θ, Mapping):
            check_params(self, θ)  # raises the TypeError
        if not isinstance(x, jax.Array):
            x = jnp.asarray(x)
        if x.size == 0:  # nothing to plan or move: the empty result, as the serial operator gives
            return self.op.H.apply(θ, x) if self.adjoint else self.op.apply(θ, x)
        weights = {p: self._onto_mesh(θ[n], lambda: self.param_shardings()[n])
                   for p, n in self.weight_names.items() if n in θ}
        return self._call(weights, x)

    def _onto_mesh(self, value, sharding):
        """`value` itself where `jit` can take it with this mesh's arrays (uncommitted,
        already on the mesh, or a tracer); else moved to `sharding()` first (an array
        committed to other devices or another mesh). Planned on a mesh shape, the mesh is
        the context's, of devices (`_check_runs_here`)."""
        if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer) or not value.committed:
            return value
        mesh = self.mesh
        if isinstance(mesh, AbstractMesh):
            self._check_runs_here()
            mesh = jax.sharding.get_mesh()
        placed = value.sharding
        if isinstance(placed, NamedSharding) and placed.mesh == mesh:
            return value
        return jax.device_put(value, NamedSharding(mesh, sharding().spec))

    def _check_runs_here(self) -> None:
        """A `ValueError` where this operator cannot run: under a `jax.set_mesh` of another
        mesh (JAX runs a `shard_map` only on the context mesh), or, planned on a mesh shape,
        anywhere but under a `jax.set_mesh` of devices of that shape (where JAX lays it
        onto the context's devices: inside `jax.jit`, `po.distribute` finds only the
        shape)."""
        context = jax.sharding.get_abstract_mesh()
        if isinstance(self.mesh, AbstractMesh):
            try:
                devices = not jax.sharding.get_mesh().empty  # a jax.set_mesh of devices, not a mesh shape alone
            except ValueError:  # under jax.jit, where JAX gives only the shape
                devices = True
            shape = lambda m: (m.shape_tuple, m.axis_types)  # noqa: E731 (a user's shape has no device kind)
            if context.empty or shape(context) != shape(self.mesh) or not devices:
                raise ValueError(f"{self.request.where}: planned on an AbstractMesh (a mesh shape), which runs only "
                                 f"under a jax.set_mesh of devices of that shape and those axis types "
                                 f"({_shape_text(self.mesh)}" + ("" if context.empty else
                                                                 f"; the context's: {_shape_text(context)}") +
                                 "): distribute it on a jax.sharding.Mesh of devices to run it elsewhere")
        elif not context.empty and context != self.mesh.abstract_mesh:
            raise ValueError(
                f"{self.request.where}: distributed on the mesh {describe_mesh(self.mesh)}, applied under "
                f"jax.set_mesh of another, {describe_mesh(context)}: JAX runs a shard_map only on the context mesh. "
                "Distribute it under that jax.set_mesh (po.distribute given no mesh= takes the context's), or "
                "apply it outside")

    def _call(self, θ, x):
        """`A(θ) @ x` under `jax.jit`: the checks and the flat/tensor handling run when it
        traces, so a call costs what the jitted program's dispatch costs; `θ` is by the
        names of `planned`. The plan and
        program of `x`'s batch shape are made here, before the trace. One jitted function
        per direction (shared by every copy of `D`) closes over the operator's structure;
        the operator's traced scalars are its arguments."""
        self._check_runs_here()
        batch = self._batch_of(x)
        if batch is not None:
            self.program(batch)
        call = self.programs.calls.get(self.adjoint)
        if call is None:
            planned = DistributedOperator(self.planned, self.request, self.forward_plan, self.programs, self.adjoint)
            call = self.programs.calls[self.adjoint] = jax.jit(functools.partial(_call, planned))
        x = self._onto_mesh(x, lambda: self._input_sharding(x))
        scalars = self.op._cache("_scalars", lambda: tuple(jax.tree.leaves(self.op)))
        return call(θ, x, [self._onto_mesh(c, lambda: NamedSharding(self.mesh, PartitionSpec())) for c in scalars])

    def _batch_of(self, x) -> tuple[int, ...] | None:
        """The batch shape of input `x` (None where it fits neither the tensor nor the flat
        form: the traced checks then say why)."""
        if x.shape[:self.ndim] == self.domain_shape:
            return tuple(x.shape[self.ndim:])
        if x.ndim in (1, 2) and x.shape[0] == self.domain_size:
            return tuple(x.shape[1:])
        return None

    def _input_sharding(self, x) -> NamedSharding:
        """Where the program wants `x`: its plan's input layout (replicated for flat input)."""
        if x.shape[:self.ndim] == self.domain_shape:
            return sharding(self.mesh, self.plan_for(x.shape[self.ndim:]).in_layout)
        return NamedSharding(self.mesh, PartitionSpec())


def _shape_text(mesh) -> str:
    """A mesh's shape and axis types: `{'d0': 2, 'd1': 2}, Auto axes`."""
    return f"{dict(mesh.shape)}, {'/'.join(sorted({t.name for t in mesh.axis_types}))} axes"


def _call(D: DistributedOperator, θ, x, scalars):
    """`D(θ) @ x` with `scalars` in place of `D`'s own traced scalars."""
    x, unflatten = _as_tensor(D, x)
    x = _as_input_dtype(D, x)
    check_params(D, θ)
    run, specs = D.program(tuple(x.shape[D.ndim:]))
    return unflatten(run(x, *(θ[name] for name, _ in specs), scalars=tuple(scalars)))


def distribute(
    op: Operator,
    partition: tuple[int, ...] | PartitionSpec,
    *,
    out_partition: OutPartition = None,
    mesh: Mesh | None = None,
    shard_weights: bool | Literal["auto"] = "auto",
    cost: CostModel | None = None,
    batch_shape: tuple[int, ...] | None = None,
    weights: Mapping[str, PartitionSpec] | None = None,
) -> DistributedOperator:
    """`op` as one `shard_map` program over a device mesh: the same linear map. Planning
    (`po.plan`, here) plus lowering (at the first call of each batch shape).

    - `partition`: one positive int per input axis (domain axes, then any trailing batch
      axes): how many pieces each is split in, on a mesh over the first
      `prod(partition)` devices with one mesh axis `d{i}` per split axis. Or a
      `PartitionSpec` with `mesh=` (Auto or Explicit axes), used as given. Trailing
      batch axes it does not name are replicated.
    - `out_partition`: `None` (the input's layout wherever the output sizes allow; a
      split an axis cannot keep goes where it costs least; a `Reduce`d axis comes back
      replicated), a tuple of counts (any arrangement of the input's mesh axes with those
      splits, the cheapest: `(2, 2, 2)` to `(8, 1, 1)` regroups them), a
      `PartitionSpec`, or `"auto"` (the cheapest layout; `D.out_sharding` says which).
    - `shard_weights`: how a `Matrix` on a split axis (or with a free mesh axis) may
      run. `"auto"`: the planner picks between moving the activations and replicating
      the weight, and the tensor-parallel forms: row-parallel (the weight split by
      columns with the input's split, partial products, `psum` or `psum_scatter`) and
      column-parallel (the weight split by rows over a free mesh axis). `True`: every
      `Matrix` weight is sharded (a `ValueError` where no form fits). `False`: always
      replicated.
    - `cost`: the machine model (`po.CostModel`): what a collective's start-up is worth,
      and whether to plan for training (forward + backward, the default) or inference.
      It goes with `D`, `D.H` and every batch shape's plan of `D`.
    - `batch_shape`: the trailing batch axes `D.plan` is planned for (by default none, or
      1024 per device along each batch axis the partition names); other batch shapes are
      planned at their first call, with the weights where `D.plan` places them.
    - `weights`: `{name: PartitionSpec}` (a plan's `weight_placements`): where the named
      weights must be; the planner places the others.

    ```python
    >>> F = po.kron(po.DFT(30), po.DFT(20), po.DFT(10, dtype=jnp.float32))
    >>> D = po.distribute(F, partition=(2, 1, 1))
    >>> x = np.random.default_rng(0).standard_normal((30, 20, 10)).astype(np.float32)
    >>> y = D @ x
    >>> bool(np.allclose(y, np.fft.rfftn(x), atol=1e-4)), y.sharding.is_equivalent_to(D.out_sharding, 3)
    (True, True)
    ```
    """
    request = request_of(op, partition, out_partition, mesh, shard_weights, cost, f"distribute({op!r})")
    batch_shape = request.batch_shape(op, batch_shape)
    return DistributedOperator(op, request, request.plan(op.named, batch_shape, request.weights(op.parameters, weights)))


def plan(
    op: Operator,
    partition: tuple[int, ...] | PartitionSpec,
    *,
    mesh: Mesh | None = None,
    out_partition: OutPartition = None,
    cost: CostModel | None = None,
    shard_weights: bool | Literal["auto"] = "auto",
    batch_shape: tuple[int, ...] | None = None,
    weights: Mapping[str, PartitionSpec] | None = None,
) -> Plan:
    """The plan `po.distribute` would run for `op` on inputs with trailing `batch_shape`
    (the arguments are `po.distribute`'s, with its defaults): a value, equal for equal
    arguments, that `po.distribute` lowers.

    ```python
    >>> p = po.plan(po.kron(po.DFT(8), po.DFT(8)), (2, 1))
    >>> p == po.distribute(po.kron(po.DFT(8), po.DFT(8)), (2, 1)).plan
    True
    ```
    """
    request = request_of(op, partition, out_partition, mesh, shard_weights, cost, f"plan({op!r})")
    return request.plan(op.named, request.batch_shape(op, batch_shape), request.weights(op.parameters, weights))


def request_of(op: Operator, partition, out_partition: OutPartition, mesh: Mesh | None, shard_weights,
               cost: CostModel | None, where: str, then: tuple[Operator, ...] = ()) -> Request:
    """The `Request` of `distribute`'s arguments for `op` (followed by the operators `then`,
    in a chain, before the output), each checked (`ValueError` or `TypeError` naming what
    is wrong)."""
    if not isinstance(op, Operator) or getattr(op, "distributed", False):
        raise TypeError(f"po.distribute takes a serial parop operator, got {op!r}")
    mesh = context_mesh() if mesh is None else mesh
    check_mesh(mesh, where)
    program(op, op.domain_shape)  # an operator the planner cannot read fails here
    cost = CostModel() if cost is None else cost
    if not isinstance(cost, CostModel):
        raise TypeError(f"{where}: cost must be a po.CostModel, got {type(cost).__name__}")
    if not (isinstance(shard_weights, (bool, np.bool_)) or _is_auto(shard_weights)):
        raise ValueError(f"{where}: shard_weights must be True, False or 'auto', got {shard_weights!r}")
    shard_weights = shard_weights if _is_auto(shard_weights) else bool(shard_weights)
    counts = None
    if isinstance(out_partition, str) and not _is_auto(out_partition):
        raise ValueError(f"{where}: out_partition must be None, 'auto', a tuple of positive ints or a PartitionSpec, "
                         f"got {out_partition!r}")
    if out_partition is not None and not _is_auto(out_partition) and not isinstance(out_partition, PartitionSpec):
        counts = check_partition(out_partition, where, "out_partition")
    if isinstance(partition, PartitionSpec):
        if mesh is None:
            raise ValueError(f"{where}: a PartitionSpec partition needs mesh= (or a jax.set_mesh around the call)")
        in_layout = layout_of(partition, max(len(partition), op.ndim), mesh, where)
    else:
        partition = check_partition(partition, where)
        if len(partition) < op.ndim:
            raise ValueError(
                f"{where}: partition {tuple(partition)} has {len(partition)} entries, but the operator's "
                f"input has {op.ndim} axes (domain {op.domain_shape}), plus any trailing batch axes"
            )
        if mesh is None:
            mesh, in_layout = default_mesh(partition, where, regroup=counts)
        else:
            in_layout = layout_on_mesh(partition, mesh, where)
    check_splits(op.domain_shape, in_layout, mesh, where)  # batch axes: at the first call
    if shard_weights is True:
        _check_shardable(op, mesh, where)
    out: object = "auto" if _is_auto(out_partition) else out_partition
    if isinstance(out_partition, PartitionSpec):
        out = ("layout", layout_of(out_partition, len(in_layout), mesh, f"{where}: out_partition", "an output"))
        lost = left_out(in_layout, out[1])
        summable = _summable((op,) + then, mesh, shard_weights)
        if math.prod(mesh.shape[n] for n in lost) > summable:
            raise ValueError(
                f"{where}: out_partition {out_partition} leaves out mesh axes {sorted(lost)} that the input "
                f"{spec_of(in_layout)} splits over: parop moves a split from one tensor axis to another (or "
                "sums it away in a Reduce); it never gathers a split onto every device"
                + (_summing_limit(summable) if summable > 1 else ""))
    elif counts is not None:
        out = ("counts", _check_counts(counts, in_layout, mesh, (op,) + then, shard_weights, where))
    if isinstance(out, tuple):  # an output split unevenly: JAX lays out only even splits
        wanted = counts if out[0] == "counts" else split_sizes(out[1], mesh.shape)
        check_split_counts((then or (op,))[-1].range_shape, wanted, f"{where}: out_partition", "output")
    return Request(mesh, in_layout, out, cost, shard_weights, where)


def _is_auto(value) -> bool:
    """Whether `value` is the string "auto" (and not an array, which `==` compares
    elementwise)."""
    return isinstance(value, str) and value == "auto"


def _steps(op: Operator):
    """Every step of `op`'s program, a sum's terms' too."""
    return program(op, op.domain_shape).all_steps()


def _check_shardable(op: Operator, mesh: Mesh, where: str) -> None:
    """With every weight sharded, each `Matrix` needs a mesh axis whose size divides its
    rows (column-parallel) or its columns (row-parallel): a `ValueError` otherwise."""
    sizes = sorted({n for n in mesh.shape.values() if n > 1})
    for step in _steps(op):
        if step.dense and not any(step.out_sizes[0] % n == 0 or step.in_sizes[0] % n == 0 for n in sizes):
            over = f"over mesh axes of sizes {sizes}" if sizes else "as no mesh axis has more than one device"
            raise ValueError(
                f"{where}: no plan exists with shard_weights=True: {step.leaf!r} can be split neither by its "
                f"{step.out_sizes[0]} rows nor by its {step.in_sizes[0]} columns {over}: use "
                "shard_weights='auto' (it may keep that weight whole) or other sizes")


def _summable(ops: tuple[Operator, ...], mesh: Mesh, shard_weights) -> int:
    """An upper bound on the devices' worth of split that `ops`, one after the other, can
    sum away (a mesh axis leaves the layout only in a `psum`): a `Reduce` any; a
    row-parallel `Matrix` (where `shard_weights` allows one) the largest product of
    mesh axis sizes dividing its columns; steps one after the other the product of
    theirs; a sum the least of its terms', as each term must sum away what the sum drops."""
    counts = {math.prod(c) for k in range(len(mesh.shape) + 1)
              for c in itertools.combinations(mesh.shape.values(), k)}
    devices = math.prod(mesh.shape.values())
    return min(math.prod(_summable_in(program(op, op.domain_shape), counts, devices, shard_weights) for op in ops),
               devices)


def _summable_in(prog, counts: set[int], devices: int, shard_weights) -> int:
    """`_summable` of one program (a function of its own, not a closure calling itself:
    that would be a reference cycle per call, left to the garbage collector)."""
    total = 1
    for step in prog.steps:
        if step.terms:
            total *= min(_summable_in(term, counts, devices, shard_weights) for term in step.terms)
        elif any(r is Role.REDUCE for r in step.roles):
            total *= devices
        elif step.dense and shard_weights:
            total *= max(q for q in counts if step.in_sizes[0] % q == 0)
    return min(total, devices)


def _summing_limit(summable: int) -> str:
    if summable == 1:
        return " (this operator has no Reduce or row-parallel Matrix to sum a split away)"
    return (f" (this operator sums away splits over at most {summable} devices: a Reduce sums the mesh axes "
            "splitting its axis, a row-parallel Matrix those splitting its columns, and each term of a sum must "
            "sum away what the sum drops)")


def _arrangeable(counts: tuple[int, ...], sizes: list[int]) -> bool:
    """Whether disjoint groups of the mesh axes of `sizes` have the products `counts`."""
    if not counts:
        return True
    for k in range(len(sizes) + 1):
        for group in itertools.combinations(range(len(sizes)), k):
            if math.prod(sizes[i] for i in group) == counts[0]:
                rest = [n for i, n in enumerate(sizes) if i not in group]
                if _arrangeable(counts[1:], rest):
                    return True
    return False


def _check_counts(counts: tuple[int, ...], in_layout: Layout, mesh: Mesh, ops: tuple[Operator, ...], shard_weights,
                  where: str):
    """`counts` if an arrangement of the input's mesh axes cuts the axes so, and `ops` can
    sum away the rest (a `ValueError` naming what is wrong otherwise)."""
    if len(counts) != len(in_layout):
        raise ValueError(f"{where}: out_partition has {len(counts)} entries, the output has {len(in_layout)} axes")
    sizes = [mesh.shape[n] for axes in in_layout for n in axes]
    wanted, given = math.prod(counts), math.prod(sizes)
    why = (f"{where}: no plan exists for out_partition {counts}: it splits over {wanted} devices, the input over "
           f"{given} (mesh axes of sizes {sizes})")
    if wanted > given or not _arrangeable(counts, sizes):
        raise ValueError(f"{why}: no arrangement of the input's mesh axes cuts the output axes so (parop moves "
                         "splits between axes, it never gathers a split axis onto every device)")
    summable = _summable(ops, mesh, shard_weights)
    if given > wanted * summable:
        raise ValueError(f"{why}: it replicates mesh axes that the input splits, over {given // wanted} devices, "
                         "which only summing can drop (parop never gathers a split onto every device)"
                         + _summing_limit(summable))
    return counts
