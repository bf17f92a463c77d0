"""A network planned as a whole: a chain of operators with pointwise functions between
them (biases, activations), each distributed so that the layouts where one hands over
to the next minimise the cost of the whole chain."""

from __future__ import annotations

from typing import Literal, Mapping, Sequence

from jax.sharding import Mesh, PartitionSpec

from ..display import short
from ..operator import Operator
from ..params import named
from .operator import DistributedOperator, OutPartition, Request, check_splits, request_of
from .plan import CostModel, Plan, StepAction, route
from .plan.program import chain


def distribute_chain(
    ops: Sequence[Operator],
    partition: tuple[int, ...] | PartitionSpec,
    *,
    out_partition: OutPartition = None,
    mesh: Mesh | None = None,
    shard_weights: bool | Literal["auto"] = "auto",
    cost: CostModel | None = None,
    batch_shape: tuple[int, ...] | None = None,
    weights: Mapping[str, PartitionSpec] | None = None,
) -> tuple[DistributedOperator, ...]:
    """The operators of a network, `ops[0]` first, each distributed, planned together:
    between two of them a pointwise function of the user's runs on the global array
    (a bias, an activation), and the layout where one hands over to the next is the
    one that minimises the whole chain's cost (each operator planned alone would
    return to its input layout, or stop where it alone is cheapest).

    `partition`, `out_partition` (of the last operator's output), `mesh`,
    `shard_weights`, `cost` and `batch_shape` (the trailing batch axes; by default none,
    or 1024 per device along each that the partition names) are those of
    `po.distribute`. `Ds[k].out_sharding` is
    `Ds[k + 1].in_sharding`. `weights` (`{name: PartitionSpec}`) fixes where the named
    weights live: a network planned again for another batch size keeps its weights in
    place with `weights=` the placements of the first
    (`{n: s for D in Ds for n, s in D.plan.weight_placements.items()}`). The operators
    are one model: their unnamed leaves are named together, in chain order (`Matrix_0`
    in the first, `Matrix_1` in the next, ...), so one θ serves them all.

    ```python
    >>> up = po.kron(po.Matrix(64, 8, name="up"), po.DFT(32), po.DFT(32))
    >>> down = po.kron(po.Matrix(8, 64, name="down"), po.DFT(32).inverse(), po.DFT(32).inverse())
    >>> D_up, D_down = po.distribute_chain([up, down], (1, 2, 4))
    >>> D_up.out_sharding == D_down.in_sharding
    True
    >>> θ = {**po.init(D_up, jax.random.key(0)), **po.init(D_down, jax.random.key(1))}
    >>> x = jnp.ones((8, 32, 32), jnp.complex64)
    >>> y = D_down(θ) @ jax.nn.gelu(D_up(θ) @ x)
    >>> y.shape, y.dtype
    ((8, 32, 32), dtype('complex64'))
    ```
    """
    try:
        ops = tuple(ops) if not isinstance(ops, Operator) else None
    except TypeError:
        ops = None
    if ops is None:
        raise TypeError("distribute_chain takes a sequence of operators, the first's output the second's input, "
                        "... (one operator: po.distribute)")
    names = " → ".join(repr(op) for op in ops)
    where = f"distribute_chain({names})"
    if not ops:
        raise ValueError("distribute_chain: needs at least one operator")
    for k, op in enumerate(ops):
        if not isinstance(op, Operator) or op.distributed:
            raise TypeError(f"{where}: operator {k} is {op!r}, not a serial parop operator")
    for k, (a, b) in enumerate(zip(ops, ops[1:])):
        if b.domain_shape != a.range_shape:
            raise ValueError(f"{where}: operator {k + 1} ({b!r}) takes shape {b.domain_shape}, but operator "
                             f"{k} ({a!r}) gives {a.range_shape}")
        if b.out_dtype(a.range_dtype) is None:
            raise TypeError(f"{where}: operator {k + 1} ({b!r}) does not take the {a.range_dtype} data "
                            f"operator {k} ({a!r}) gives")
    ops = named(*ops)
    request = request_of(ops[0], partition, out_partition, mesh, shard_weights, cost, where, then=ops[1:])
    pinned = request.weights({name: leaf for op in ops for name, leaf in op.parameters.items()}, weights)
    batch_shape = request.batch_shape(ops[0], batch_shape)
    shape = ops[0].domain_shape + batch_shape
    if len(shape) != len(request.in_layout):
        raise ValueError(f"{where}: the partition has {len(request.in_layout)} entries; the input "
                         f"{ops[0].domain_shape} with batch_shape {batch_shape} has {len(shape)} axes")
    mesh = request.mesh
    check_splits(shape, request.in_layout, mesh, where)
    prog = chain(ops, shape)
    goal = request.goal(request.in_layout, ops[-1].range_shape + batch_shape)
    actions, expanded = route(prog, request.in_layout, mesh.shape, goal, request.cost, where, request.shard_weights,
                              dict(pinned))
    pieces: list[list] = [[]]
    for action in actions:
        if isinstance(action, StepAction) and action.step.barrier:
            pieces.append([])
        else:
            pieces[-1].append(action)
    out, layout, dtype = [], request.in_layout, prog.dtype
    for k, (op, piece) in enumerate(zip(ops, pieces)):
        plan = Plan(short(op), tuple(mesh.shape.items()), op.domain_shape + batch_shape, op.range_shape + batch_shape,
                    layout, tuple(piece), dtype, request.cost, expanded if k == 0 else 0)
        link = Request(mesh, layout, ("layout", plan.out_layout), request.cost, request.shard_weights,
                       f"distribute_chain(… {op!r} …)")
        out.append(DistributedOperator(op, link, plan))
        layout, dtype = plan.out_layout, op.out_dtype(dtype)
    return tuple(out)

