"""A plan is a value: `po.plan` gives equal plans for equal arguments, a plan goes to
JSON and back unchanged, weight placements pass between calls as values, `D.plan` does
not depend on what `D` was called with, planning happens outside `jit` traces, and each
kind of action maps itself under the search's symmetries."""

import dataclasses
import json
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import unsafe_am_i_under_a_jit
from jax.sharding import PartitionSpec as P

import parop as po
import parop.distributed.plan.search as search_module
from parop.distributed.plan.plan import JSON_FORMAT
from parop.distributed.plan import program
from parop.distributed.plan.actions import (ACTIONS, AllToAll, Branch, ColumnParallel, Gather, GatherColumnParallel,
                                            HaloExchange, Local, Permute, ReducePsum, RowParallel, RowParallelScatter,
                                            Split)
from parop.distributed.plan.plan import walk
from parop.distributed.plan.program import Step
from parop.nn import FNO
from reference import applied, random_array, random_params

F64, C128 = "float64", "complex128"


def network():
    """A sum (a `Branch`), a traced scalar (a `Slot`), a real DFT, a `Restriction`, a
    stencil's halo exchange and a weight: every kind of step a plan's JSON must hold."""
    spectral = po.kron(po.Restriction(5, [0, 1, 4], C128) @ po.DFT(8, F64), po.Matrix(4, 4, C128, name="w"))
    other = po.kron(po.Restriction(5, slice(0, 3), C128) @ po.DFT(8, F64), po.Identity(4, C128))
    local = po.kron(po.Identity(3, C128), po.Diagonal(4, C128, name="d"))
    stencil = po.kron(po.Stencil(np.array([1.0, -2.0, 1.0]), (8,), dtype=F64), po.Identity(4, F64))
    return (jnp.asarray(2.0) * local) @ (spectral + other) @ stencil


def test_a_cost_model_of_numpy_scalars_is_the_cost_model_of_their_values():
    """`CostModel(latency_bytes=np.float32(3.5))` (a figure computed with NumPy) planned a
    plan unequal to `CostModel(latency_bytes=3.5)`'s, whose JSON did not read back; `0`
    and `0.0` gave two plans; `training=np.True_` was refused."""
    op = po.kron(po.DFT(8), po.DFT(8))
    for given, value in ((np.float32(3.5), 3.5), (0, 0.0), (np.int64(1 << 20), float(1 << 20))):
        model = po.CostModel(latency_bytes=given, training=np.True_)
        assert model == po.CostModel(latency_bytes=value) and type(model.latency_bytes) is float
        assert type(model.training) is bool
        plan = po.plan(op, (2, 1), cost=model)
        assert plan == po.plan(op, (2, 1), cost=po.CostModel(latency_bytes=value))
        assert po.Plan.from_json(plan.to_json()) == plan


def test_equal_arguments_give_equal_plans_and_json_gives_them_back():
    op = network()
    plan = po.plan(op, (2, 2))
    again = po.plan(network(), (2, 2))
    assert plan == again and hash(plan) == hash(again) and plan is not again
    assert plan == po.distribute(op, (2, 2)).plan
    assert plan != po.plan(op, (2, 1)) and plan != po.plan(op, (2, 2), cost=po.CostModel(training=False))
    for p in (plan, plan.transpose(op.H), po.plan(op, (1, 2, 2), batch_shape=(4,))):
        text = p.to_json()
        back = po.Plan.from_json(text)
        assert back == p and back.to_json() == text and str(back) == str(p) and repr(back) == repr(p)
        assert back.cost == p.cost and back.out_layout == p.out_layout
    assert "row-parallel" in str(plan) and "Stencil" in str(plan) and "sum of 2 terms" in str(plan)
    for text in ('{"a": 1}', "not JSON", "[1, 2]"):
        with pytest.raises(ValueError, match=r"^Plan.from_json: not the JSON of a parop Plan"):
            po.Plan.from_json(text)
    data = json.loads(plan.to_json())
    for field, value, why in (("actions", 3, "not iterable"), ("actions", [{"dataclass": "Zzz", "fields": {}}],
                                                                    "unknown class 'Zzz'"),
                              ("dtype", {"dtype": "zzz"}, "data type 'zzz' not understood"),
                              ("extra", 1, "unexpected keyword argument 'extra'"),
                              ("operator", {"operator": "nomodule:X", "fields": {}},
                               "nomodule:X is in module 'nomodule', which is not imported"),
                              # reading a plan calls nothing it names: os.system would run a command
                              ("cost_model", {"enum": "os:getcwd", "value": None}, "os:getcwd is not a subclass of Enum"),
                              ("cost_model", {"operator": "os:getcwd", "fields": {}}, "os:getcwd is not a subclass of Operator")):
        with pytest.raises(ValueError, match=rf"^Plan.from_json: not the JSON of a parop Plan .*{why}"):
            po.Plan.from_json(json.dumps({**data, field: value}))
    with pytest.raises(TypeError, match=r"^Plan.from_json takes the text Plan.to_json wrote, got Plan$"):
        po.Plan.from_json(plan)
    older = plan.to_json().replace(f'"parop.Plan":{JSON_FORMAT}', '"parop.Plan":1')
    with pytest.raises(ValueError, match="written in format 1; this parop reads format 2 .*plan the operator again"):
        po.Plan.from_json(older)


def test_every_kind_of_action_goes_to_json_and_back():
    """A `Reduce` over a split axis, a halo stencil, a tensor-parallel `Matrix` in its
    row-parallel (`psum`, `psum_scatter`) and column-parallel forms, a `ppermute` that
    deals blocks anew and, in the adjoints, the `all_gather` before a column-parallel
    one: each plan equals itself read back
    from its JSON, shows the same and costs the same."""
    mixed = po.kron(po.Matrix(8, 8, F64, name="a"), po.Reduce(8, F64),
                    po.Stencil(np.array([1.0, -2.0, 1.0]), (8,), dtype=F64), po.Matrix(8, 8, F64, name="b"))
    halo = po.kron(po.Stencil(np.array([1.0, -2.0, 1.0]), (16,), dtype=F64), po.Identity(4, F64))
    scatter = po.Matrix(64, 64, F64, name="big")
    traded = po.DFT(4, "complex128")  # two mesh axes trade tensor axes: a ppermute deals the blocks anew
    plans = [po.plan(mixed, (2, 2, 2, 1), shard_weights=True), po.plan(halo, (4, 2)),
             po.plan(scatter, (8, 1), shard_weights=True, batch_shape=(16,)), po.plan(network(), (2, 2)),
             po.plan(traded, (4, 2), out_partition=(2, 4), batch_shape=(8,))]
    plans += [plan.transpose(op.H) for plan, op in zip(plans, (mixed, halo, scatter, network(), traded))]
    kinds = {type(visit.action) for plan in plans for visit in walk(plan.visits)}
    assert kinds == set(ACTIONS)
    for plan in plans:
        back = po.Plan.from_json(plan.to_json())
        assert back == plan
        assert [type(v.action) for v in walk(back.visits)] == [type(v.action) for v in walk(plan.visits)]
        assert str(back) == str(plan) and back.cost == plan.cost and back.traffic() == plan.traffic()


def test_every_kind_of_action_maps_itself_under_a_symmetry():
    """`mapped` runs the image of an action's step (here: in an operator alike but for
    its weights' names), renames every mesh axis the action names and moves every
    tensor axis it names; a kind that splits a weight cannot follow a move of tensor
    axes (None), nor can a sum holding one. Every kind in `ACTIONS` is here: a new kind
    must say how it maps."""

    def alike(w: str) -> po.Operator:
        stencil = po.Stencil(np.array([1.0, -2.0, 1.0]), (8,), dtype=F64)
        return (po.kron(po.Matrix(4, 4, F64, name=w), stencil, po.Reduce(4, F64))
                + po.kron(po.Matrix(4, 4, F64, name=w + "2"), po.Identity(8, F64), po.Reduce(4, F64)))

    ours, theirs = (tuple(program(alike(w), (4, 8, 4)).all_steps()) for w in ("w", "v"))
    steps = dict(zip(map(id, ours), theirs))
    total, reduce, matrix, stencil = ours[:4]  # the sum, then its first term's steps
    total2, reduce2, matrix2, stencil2 = theirs[:4]
    mesh, perm, still = {"a": "x", "b": "y", "c": "z"}, (1, 2, 0), (0, 1, 2)
    # (action, mapped by `mesh` and `perm`, mapped by `mesh` alone)
    cases = [
        (Local(reduce), Local(reduce2), Local(reduce2)),
        (ReducePsum(reduce, ("b", "a")), ReducePsum(reduce2, ("y", "x")), ReducePsum(reduce2, ("y", "x"))),
        (HaloExchange(stencil, (1, 2)), HaloExchange(stencil2, (2, 0)), HaloExchange(stencil2, (1, 2))),
        (ColumnParallel(matrix, (("a",), ())), None, ColumnParallel(matrix2, (("x",), ()))),
        (GatherColumnParallel(matrix, (("a",), ()), ("b", "c")), None,
         GatherColumnParallel(matrix2, (("x",), ()), ("y", "z"))),
        (RowParallel(matrix, ((), ("a", "b")), ("a", "b")), None, RowParallel(matrix2, ((), ("x", "y")), ("x", "y"))),
        (RowParallelScatter(matrix, ((), ("c",)), ("c",)), None, RowParallelScatter(matrix2, ((), ("z",)), ("z",))),
        (AllToAll(("b", "c"), 0, 2, 1, 3), AllToAll(("y", "z"), 1, 0, 1, 3), AllToAll(("y", "z"), 0, 2, 1, 3)),
        (Split(("c",), 1, 2), Split(("z",), 2, 2), Split(("z",), 1, 2)),
        (Gather(("a",), 2, 5), Gather(("x",), 0, 5), Gather(("x",), 2, 5)),
        (Permute((("a",), ("b", "c"), ())), Permute(((), ("x",), ("y", "z"))), Permute((("x",), ("y", "z"), ()))),
        (Branch(total, ((Split(("a",), 0),), (Local(reduce), AllToAll(("c",), 1, 2)))),
         Branch(total2, ((Split(("x",), 1),), (Local(reduce2), AllToAll(("z",), 2, 0)))),
         Branch(total2, ((Split(("x",), 0),), (Local(reduce2), AllToAll(("z",), 1, 2))))),
        (Branch(total, ((ColumnParallel(matrix, (("a",), ())),), (Local(reduce),))), None,
         Branch(total2, ((ColumnParallel(matrix2, (("x",), ())),), (Local(reduce2),)))),
    ]
    assert {type(action) for action, _, _ in cases} == set(ACTIONS)
    for action, moved, renamed in cases:
        assert action.mapped(steps, mesh, perm) == moved  # steps compare by identity: each is replaced
        mapped = action.mapped(steps, mesh, still)
        assert mapped == renamed
        assert not set(_strings(mapped)) & set(mesh), f"{type(action).__name__} keeps a mesh axis's old name"
        assert action.mapped({id(s): s for s in ours}, {n: n for n in mesh}, still) == action


def _strings(value) -> Iterator[str]:
    """The strings in an action's fields (a sum's terms' actions' too), but its step's."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from _strings(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, Step):
        for field in dataclasses.fields(value):
            yield from _strings(getattr(value, field.name))


def test_a_plan_read_from_json_lowers_to_the_same_program():
    """The JSON holds what lowering needs: the program of a plan read back gives `op`'s
    answer."""
    from parop.distributed.lower import lower

    op = po.kron(po.DFT(8, C128), po.Matrix(4, 4, C128, name="w")) + po.kron(po.DFT(8, C128), po.Identity(4, C128))
    D = po.distribute(op, (2, 2))
    θ = random_params(op, 1)
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 4), np.complex128))
    run, specs = lower(po.Plan.from_json(D.plan.to_json()), D.mesh)
    assert specs == D.program(())[1]
    np.testing.assert_allclose(np.asarray(run(x, *(θ[n] for n, _ in specs))), np.asarray(applied(op, θ, x)),
                               rtol=1e-12, atol=1e-12)


def test_weight_placements_are_values_passed_between_calls():
    """`weights=` pins weights where another plan put them; the dict given is not changed;
    names that are not weights, and specs that are not `PartitionSpec`s, are refused."""
    op = po.kron(po.Matrix(8, 8, F64, name="m"), po.Identity(4, F64))
    free = po.plan(op, (1, 2, 2), batch_shape=(8,))
    assert free.weight_placements == {"m": P(None, None)}
    want = {"m": P(None, "d1")}
    given = dict(want)
    pinned = po.plan(op, (1, 2, 2), batch_shape=(8,), weights=given, shard_weights=True)
    assert given == want and pinned.weight_placements == want
    D = po.distribute(op, (1, 2, 2), batch_shape=(8,), weights=pinned.weight_placements, shard_weights=True)
    assert D.plan == pinned and D.plan_for((16,)).weight_placements == want
    with pytest.raises(ValueError, match=r"weights names 'q', not a weight of the operator \(its weights: \['m'\]\)"):
        po.plan(op, (1, 2, 2), batch_shape=(8,), weights={"q": P()})
    with pytest.raises(TypeError, match=r"weights\['m'\] must be a PartitionSpec"):
        po.distribute(op, (1, 2, 2), weights={"m": ("d1",)})
    with pytest.raises(TypeError, match="weights must be a dict"):
        po.distribute_chain([op], (1, 2, 2), batch_shape=(8,), weights=[("m", P())])


def test_a_chain_planned_again_keeps_its_weights_where_they_are():
    up = po.kron(po.Matrix(8, 4, F64, name="up"), po.Identity(16, F64))
    down = po.kron(po.Matrix(4, 8, F64, name="down"), po.Identity(16, F64))
    first = po.distribute_chain([up, down], (2, 2, 2), batch_shape=(8,))
    placed = {name: spec for D in first for name, spec in D.plan.weight_placements.items()}
    again = po.distribute_chain([up, down], (2, 2, 2), batch_shape=(4,), weights=placed)
    assert {name: spec for D in again for name, spec in D.plan.weight_placements.items()} == placed
    assert [D.plan for D in po.distribute_chain([up, down], (2, 2, 2), batch_shape=(8,))] == [D.plan for D in first]


def test_the_plan_of_a_distributed_operator_does_not_depend_on_its_calls():
    """`D.plan` is the plan of the batch shape given (or the default, 1024 per device),
    before and after calls with other batch shapes, and equals `po.plan`'s; the weights
    stay where `D.plan` puts them for every batch shape."""
    op = po.kron(po.Matrix(4, 4, F64, name="w"), po.DFT(8, C128).H @ po.DFT(8, C128))
    D = po.distribute(op, (1, 2, 2))
    before = D.plan
    assert before.shape == (4, 8, 2048) and before == po.plan(op, (1, 2, 2), batch_shape=(2048,))
    θ = random_params(op)
    x = jnp.asarray(random_array(np.random.default_rng(0), (4, 8, 6), np.complex128))
    D(θ) @ x
    assert D.plan == before and D.plan_for((6,)).shape == (4, 8, 6)
    assert D.plan_for((6,)).weight_placements == before.weight_placements
    assert po.distribute(op, (1, 2, 2), batch_shape=(6,)).plan.shape == (4, 8, 6)



def test_plan_and_distribute_chain_default_to_distributes_batch_shape():
    """`po.plan` and `po.distribute_chain` take `po.distribute`'s default batch shape
    (none, or 1024 per device along each batch axis the partition names): equal
    arguments give equal plans. (Both defaulted to no batch axis, so a partition naming
    one was a `ValueError`.)"""
    op = po.kron(po.Matrix(4, 4, F64, name="w"), po.Identity(8, F64))
    after = po.kron(po.Identity(4, F64), po.Matrix(8, 8, F64, name="v"))
    for partition in [(1, 2, 4), (2, 2), (1, 2, 2, 2)]:
        shape = op.domain_shape + tuple(1024 * p for p in partition[2:])
        D = po.distribute(op, partition)
        assert D.plan.shape == shape and po.plan(op, partition) == D.plan
        chain = po.distribute_chain([op, after], partition)
        assert [C.plan.shape for C in chain] == [shape, shape]
        again = po.distribute_chain([op, after], partition, batch_shape=shape[2:])
        assert [C.plan for C in chain] == [C.plan for C in again]


def test_no_planning_inside_a_jit_trace(monkeypatch):
    """Planning happens when `D` is made (`batch_shape=`), or before `D`'s own jitted call
    for a new batch shape; never while JAX traces."""
    traced = []
    run = search_module.Search.run

    def watched(self, *args, **kwargs):
        traced.append(unsafe_am_i_under_a_jit())
        return run(self, *args, **kwargs)

    monkeypatch.setattr(search_module.Search, "run", watched)
    op = po.kron(po.DFT(8, C128), po.DFT(8, C128))
    D = po.distribute(op, (2, 1, 2), batch_shape=(4,))
    assert traced == [False]
    x = jnp.asarray(random_array(np.random.default_rng(0), (8, 8, 4), np.complex128))
    jax.jit(lambda x: D @ x)(x)
    D.H @ (D @ x)
    assert traced == [False]  # the plan made at distribute time serves both directions
    D @ x[..., :2]
    assert traced == [False, False]


def test_the_fno_plans_every_batch_size_with_its_reference_placements():
    model = FNO((8, 8), width=4, modes=(4, 4), layers=1, projection=4, dtype=jnp.float64)
    dist = model.distribute((2, 1, 2, 2))
    assert dist.weights == {name: spec for D in dist.operators(2) for name, spec in D.plan.weight_placements.items()}
    assert dist.weights["spectral0"] != P()
    four = {name: spec for D in dist.operators(4) for name, spec in D.plan.weight_placements.items()}
    assert four == dist.weights


def test_a_model_keeps_its_operators_for_a_bounded_number_of_batch_sizes(monkeypatch):
    """The model's one cache keeps the most recently used batch sizes (a new one is
    planned again if dropped: the same plans) and always the reference batch size."""
    import parop.nn.fno as fno_module

    monkeypatch.setattr(fno_module, "BATCH_SIZES_KEPT", 2)
    model = FNO((8,), width=2, modes=(4,), layers=1, projection=2, dtype=jnp.float64)
    for b in (1, 2, 3, 4):
        model.operators(b)
    assert list(model._batches) == [3, 4]
    dist = model.distribute((2, 1, 2), batch=2)
    first = [D.plan for D in dist.operators(4)]
    for b in (6, 8, 10):
        dist.operators(b)
    assert sorted(dist._batches) == [2, 8, 10]
    assert [D.plan for D in dist.operators(4)] == first


def test_a_batch_size_with_no_plan_at_all_says_so():
    """Planned at 4 samples, the mesh axis of 4 waits on the batch axis while the grid
    axis is transformed; one sample has no axis to hold it, wherever the weights go. The
    error says that, not that the reference's placements are to blame (a probe of random
    networks found the old message, whose advice, `batch=1`, fails too)."""
    model = FNO((8,), width=2, modes=(2,), layers=1, projection=4)
    dist = model.distribute((1, 1, 4), batch=4)
    with pytest.raises(ValueError, match=r"a batch of 1 samples has no plan on this partition, wherever its weights "
                                         r"go \(the reference batch size 4 has one\): .*no plan exists"):
        dist.operators(1)
    with pytest.raises(ValueError, match="no plan exists"):
        model.distribute((1, 1, 4), batch=1)


def test_a_batch_size_the_reference_placements_cannot_hold_says_where_they_are_in_words():
    """Planned at 8 samples, every weight whole on each device. At 3 samples no plan keeps
    them so: when a spectral weight runs, every axis but the batch axis is one the weight
    runs along, so all three mesh axes of 2 must split the batch axis, and 3 samples hold
    fewer than 6 pieces. The planner finds that at once (it gave up after 200,000 states
    before its relaxed problem knew where a pinned weight puts the mesh axes), and the
    error says where the weights are in words rather than as an empty dict."""
    model = FNO((8, 4, 6), width=2, modes=(1, 1, 2), layers=2, projection=8, local_kernel=3)
    dist = model.distribute((1, 1, 2, 2, 2), batch=8)
    assert not any(any(spec) for spec in dist.weights.values())
    with pytest.raises(ValueError, match=r"a batch of 3 samples cannot be planned with the weights where the plan of "
                                         r"the reference batch size 8 puts them \(every weight whole on each "
                                         r"device\); distribute with batch=3"):
        dist.operators(3)


def test_a_batch_size_the_planner_gives_up_on_with_the_reference_placements_says_so(monkeypatch):
    """Planned at 4 samples; at 6 samples the search with those placements runs past its
    budget (here 1,000 states; without one, its plan takes 4,015), while one that may
    place the weights plans in 303. The error says the planner gave up, and where the
    weights are."""
    monkeypatch.setattr(search_module.Search.__init__, "__defaults__", ("auto", False, 1000, None))
    model = FNO((8, 8, 8), width=2, modes=(1, 1, 4), layers=2, projection=8)
    dist = model.distribute((2, 1, 2, 1, 2), batch=4)
    placed = {name: spec for name, spec in dist.weights.items() if any(spec)}
    assert placed
    with pytest.raises(ValueError, match=r"a batch of 6 samples could not be planned \(the planner gave up\) with the "
                                         r"weights where the plan of the reference batch size 4 puts them \(\{'"
                                         r".*; distribute with batch=6"):
        dist.operators(6)


def test_a_batch_size_the_reference_placements_cannot_serve_is_a_clear_error():
    """Planned at 2 samples, the spectral weights take the mesh axis the batch cannot hold
    at 1 sample: no plan keeps them there, and the error says so and what to do."""
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    model = FNO((4, 4, 2), width=2, modes=(2, 2, 1), layers=2, projection=2)
    dist = model.distribute(P(None, None, "a", "b", None), mesh=mesh, batch=2)
    with pytest.raises(ValueError, match=r"a batch of 1 samples cannot be planned with the weights where the plan "
                                         r"of the reference batch size 2 puts them \(\{'spectral0': .*batch=1"):
        dist.operators(1)
    assert model.distribute(P(None, None, "a", "b", None), mesh=mesh, batch=1).operators(1)
