"""A network planned as a whole: a chain of operators with pointwise functions between
them (biases, activations), each distributed so that the layouts where one hands over
to the next minimise the cost of the whole chain."""

from __future__ import annotations

from typing import Literal, Sequence

from jax.sharding import Mesh, PartitionSpec

from ..operator import Operator
from ..params import named
from .operator import DistributedOperator, OutPartition, Setup, check_splits, placement
from .plan import CostModel, Local, Plan, route
from .plan.program import chain


def distribute_chain(
    ops: Sequence[Operator],
    partition: tuple[int, ...] | PartitionSpec,
    *,
    out_partition: OutPartition = None,
    mesh: Mesh | None = None,
    shard_weights: bool | Literal["auto"] = "auto",
    cost: CostModel | None = None,
    batch_shape: tuple[int, ...] = (),
    pinned: dict | None = None,
) -> tuple[DistributedOperator, ...]:
    """The operators of a network, `ops[0]` first, each distributed, planned together:
    between two of them a pointwise function of the user's runs on the global array
    (a bias, an activation), and the layout where one hands over to the next is the
    one that minimises the whole chain's cost (each operator planned alone would
    return to its input layout, or stop where it alone is cheapest).

    `partition`, `out_partition` (of the last operator's output), `mesh`,
    `shard_weights` and `cost` are those of `po.distribute`; `batch_shape` gives the
    trailing batch axes the partition names, if any. `Ds[k].out_sharding` is
    `Ds[k + 1].in_sharding`. `pinned` (a dict, updated) fixes where weights live: a
    network planned again for another batch size keeps its weights in place. The
    operators are one model: their unnamed leaves are named together, in chain order
    (`Matrix_0` in the first, `Matrix_1` in the next, ...), so one θ serves them all.

    ```python
    >>> up = po.kron(po.Matrix(64, 8, name="up"), po.DFT(32), po.DFT(32))
    >>> down = po.kron(po.Matrix(8, 64, name="down"), po.DFT(32).inverse(), po.DFT(32).inverse())
    >>> D_up, D_down = po.distribute_chain([up, down], (1, 2, 4))
    >>> y = D_down(θ) @ jax.nn.gelu(D_up(θ) @ x)
    ```
    """
    ops = tuple(ops)
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
    setup = placement(ops[0], partition, out_partition, mesh, shard_weights, cost, where, then=ops[1:])
    batch_shape = tuple(batch_shape)
    shape = ops[0].domain_shape + batch_shape
    if len(shape) != len(setup.in_layout):
        raise ValueError(f"{where}: the partition has {len(setup.in_layout)} entries; the input "
                         f"{ops[0].domain_shape} with batch_shape {batch_shape} has {len(shape)} axes")
    mesh = setup.mesh
    check_splits(shape, setup.in_layout, mesh, where)
    prog = chain(ops, shape)
    goal = setup.goal(setup.in_layout, ops[-1].range_shape + batch_shape)
    pinned = {} if pinned is None else pinned
    actions, expanded = route(prog, setup.in_layout, mesh.shape, goal, setup.cost, where, setup.shard_weights, pinned)
    pieces: list[list] = [[]]
    for action in actions:
        if isinstance(action, Local) and action.step.barrier:
            pieces.append([])
        else:
            pieces[-1].append(action)
    out, layout, dtype = [], setup.in_layout, prog.dtype
    for k, (op, piece) in enumerate(zip(ops, pieces)):
        plan = Plan(op, dict(mesh.shape), op.domain_shape + batch_shape, op.range_shape + batch_shape,
                    layout, tuple(piece), dtype, setup.cost, expanded if k == 0 else 0)
        link = Setup(op, mesh, layout, ("layout", plan.out_layout), setup.cost, setup.shard_weights,
                     f"distribute_chain(… {op!r} …)", pinned=pinned)
        link.keep((batch_shape, False), plan)
        out.append(DistributedOperator(op, link))
        layout, dtype = plan.out_layout, op.out_dtype(dtype)
    return tuple(out)
