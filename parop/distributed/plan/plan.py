"""`Plan`, the planner's answer as a value: the actions, their replay from the input
state (`replay`: the state before each action), the plan's costs and display, its
transpose, and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache, cached_property

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from ... import _dtypes
from ...display import fmt_bytes
from ...operator import Operator
from ..layout import Layout, spec_of
from .actions import ACTIONS, Action, Branch, Local, State, StepAction
from .cost import KINDS, Collective, CostModel
from .program import Program, Slot, Step, ordered


@dataclass(frozen=True)
class Visit:
    """An action with the state it starts from, and, for a `Branch`, each term's visits."""

    action: Action
    before: State
    terms: tuple[tuple["Visit", ...], ...] = ()


def replay(actions: tuple[Action, ...], state: State) -> tuple[tuple[Visit, ...], State]:
    """Walk `actions` from `state`: each with the state it starts from, and the final state."""
    visits = []
    for action in actions:
        if isinstance(action, Branch):
            terms = [replay(term, state) for term in action.terms]
            visits.append(Visit(action, state, tuple(v for v, _ in terms)))
            state = replace(terms[0][1], sizes=_after_step(action.step, state).sizes)
            continue
        visits.append(Visit(action, state))
        if isinstance(action, StepAction):
            state = replace(_after_step(action.step, state), layout=action.after(state))
        else:
            state = replace(state, layout=action.after(state))
    return tuple(visits), state


def _after_step(step: Step, state: State) -> State:
    sizes = list(state.sizes)
    step.resize(sizes)
    return replace(state, sizes=tuple(sizes), itemsize=step.out_itemsize(state.itemsize))


def walk(visits):
    for visit in visits:
        yield visit
        for term in visit.terms:
            yield from walk(term)


# A run of more local steps than this keeps the search's order: the orders are searched
# over the sets of steps a prefix can run, up to 2**n of them.
SMALLEST_RUN_LIMIT = 12


def smallest_first(visits: tuple[Visit, ...]) -> tuple[Action, ...]:
    """The actions of `visits`, each run of consecutive `Local` steps (no collective
    between them, so no cost sees their order) in the order, of those the steps allow,
    that keeps the tensor smallest: the least sum of its bytes after each step, the
    search's order among equals. A restriction then runs right after the DFT it prunes,
    before the FFT of the next axis (which would otherwise transform every mode), and a
    zero-padding right before its inverse DFT; DFTs of a run that nothing shrinks stay
    next to each other (one FFT)."""
    out: list = []
    run: list[Visit] = []
    for visit in visits + (None,):
        if visit is not None and isinstance(visit.action, Local):
            run.append(visit)
            continue
        out += _smallest_order(run)
        run = []
        if visit is not None:
            action = visit.action
            if isinstance(action, Branch):
                action = replace(action, terms=tuple(map(smallest_first, visit.terms)))
            out.append(action)
    return tuple(out)


def _smallest_order(run: list[Visit]) -> list[Action]:
    """`smallest_first` of one run of local steps (`run[0].before` is where it starts):
    the cheapest path through the sets of steps a prefix of the run can hold, each set
    costing the tensor's bytes after it."""
    if not 1 < len(run) <= SMALLEST_RUN_LIMIT:
        return [visit.action for visit in run]
    steps = [visit.action.step for visit in run]
    preds = [sum(1 << i for i in range(j) if ordered(steps[i], steps[j])) for j in range(len(steps))]
    before = run[0].before

    @cache
    def bytes_after(done: int) -> int:
        sizes, itemsize = list(before.sizes), before.itemsize
        for j, step in enumerate(steps):
            if done >> j & 1:
                step.resize(sizes)
                itemsize = step.out_itemsize(itemsize)
        return math.prod(sizes) * itemsize

    best: dict[int, tuple[int, tuple[int, ...]]] = {0: (0, ())}
    for _ in steps:
        reached: dict[int, tuple[int, tuple[int, ...]]] = {}
        for done, (total, order) in best.items():
            for j in range(len(steps)):
                if not done >> j & 1 and not preds[j] & ~done:
                    after = done | 1 << j
                    candidate = (total + bytes_after(after), order + (j,))
                    if after not in reached or candidate < reached[after]:
                        reached[after] = candidate
        best = reached
    (_, order), = best.values()
    return [run[j].action for j in order]


def start(shape: tuple[int, ...], layout: Layout, dtype, mesh: tuple[tuple[str, int], ...]) -> State:
    """The state a program starts from: its input."""
    return State(tuple(shape), layout, _dtypes.canonical(dtype).itemsize, tuple(mesh))


def weight_uses(visits: tuple[Visit, ...]) -> dict[str, list]:
    """`{name: each distinct split of the weight where a step uses it, in order}`."""
    placements: dict = {}
    for visit in walk(visits):
        if isinstance(visit.action, StepAction):
            spec = visit.action.weight_spec(visit.before)
            if spec is not None and spec not in placements.setdefault(visit.action.step.leaf.name, []):
                placements[visit.action.step.leaf.name].append(spec)
    return placements


@dataclass(frozen=True, eq=False)
class Plan:
    """A distributed program: the actions from `in_layout` to `out_layout`, each with the
    collectives it runs forward and backward. `print(plan)` shows it.

    A plan is a value: it holds no JAX array and no operator object, only what lowering
    needs (the steps as data: each leaf by its class and static configuration, layouts,
    the mesh shape, the collectives) and `operator`, how the planned operator shows.
    Plans are equal when their JSON texts are (equal inputs give equal plans), and
    `Plan.from_json(plan.to_json()) == plan`.

    ```python
    >>> plan = po.plan(po.kron(po.DFT(8), po.DFT(8)), (2, 1))
    >>> po.Plan.from_json(plan.to_json()) == plan
    True
    >>> plan.weight_placements                 # {weight name: PartitionSpec}
    {}
    ```
    """

    operator: str  # the planned operator, as it shows (`short(op)`)
    mesh: tuple[tuple[str, int], ...]
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_layout: Layout
    actions: tuple[Action, ...]
    dtype: np.dtype
    cost_model: CostModel
    states_expanded: int = 0

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh)

    @cached_property
    def _replayed(self) -> tuple[tuple[Visit, ...], State]:
        return replay(self.actions, start(self.shape, self.in_layout, self.dtype, self.mesh))

    @property
    def visits(self) -> tuple[Visit, ...]:
        return self._replayed[0]

    @property
    def out_layout(self) -> Layout:
        return self._replayed[1].layout

    def traffic(self) -> tuple[list[Collective], list[Collective]]:
        """Every collective of the program, forward and backward (the transpose JAX runs
        for `jax.grad`, with the weight gradients' collectives: one of each kind per weight
        and set of mesh axes, however many steps use it there, as the program sums their
        gradients first)."""
        return self._traffic()[:2]

    def _traffic(self) -> tuple[list[Collective], list[Collective], int]:
        """`traffic()`, and how many weight-gradient collectives it summed into one of an
        earlier step (a weight several steps use)."""
        fwd, bwd, summed, merged = [], [], set(), 0
        for visit in walk(self.visits):
            action, here = visit.action, visit.before
            if not isinstance(action, StepAction):
                f, b = action.collectives(here)
                fwd += f
                bwd += b
                continue
            fwd += action.forward(here)
            bwd += action.backward(here)
            for c in action.weight_gradient(here):
                key = (action.step.leaf.name, c.kind, frozenset(c.axes))
                if key in summed:
                    merged += 1
                else:
                    summed.add(key)
                    bwd.append(c)
        return fwd, bwd, merged

    @property
    def bytes(self) -> float:
        """Bytes each device sends in one application (forward)."""
        return sum(c.bytes for c in self.traffic()[0])

    @property
    def backward_bytes(self) -> float:
        """Bytes each device sends in the backward pass of `jax.grad`."""
        return sum(c.bytes for c in self.traffic()[1])

    def collectives(self, backward: bool = False) -> dict[str, int]:
        """How many of each collective the program runs forward (or backward)."""
        counts = dict.fromkeys(KINDS, 0)
        for c in self.traffic()[1 if backward else 0]:
            counts[c.kind] += 1
        return counts

    @property
    def weight_layouts(self) -> dict[str, Layout]:
        """`{name: the mesh axes splitting each of its axes}` where each weight is first used."""
        return {name: specs[0] for name, specs in weight_uses(self.visits).items()}

    @property
    def weight_placements(self) -> dict[str, PartitionSpec]:
        """`{name: PartitionSpec}`: where the program takes each weight (where it is first
        used). Pass it as `weights=` to `po.plan`, `po.distribute` or
        `po.distribute_chain` to plan other shapes with the weights in the same place."""
        return {name: spec_of(layout) for name, layout in self.weight_layouts.items()}

    @property
    def cost(self) -> tuple[float, float, int]:
        """What the program costs under its cost model: (time in bytes, bytes sent,
        collectives). The planner minimised it, but for a weight that several steps use,
        whose gradient's collectives it prices at each such step (the program runs them
        once per set of mesh axes, see `traffic`)."""
        return self.cost_model.price(*self.traffic())

    def transpose(self, operator: Operator) -> "Plan":
        """The plan of `operator` (the adjoint) that runs this plan's actions transposed,
        in reverse order: the same weight placement, from this plan's output layout
        back to its input layout."""
        from ...display import short

        states = [v.before for v in self.visits] + [self._replayed[1]]
        actions = transpose_actions(self.actions, states)
        return Plan(short(operator), self.mesh, self.out_shape, self.shape, self.out_layout, actions,
                    _dtypes.canonical(operator.dtype), self.cost_model, 0)

    # -- a value: equality and JSON ------------------------------------------------------
    @cached_property
    def _json(self) -> str:
        fields = {f.name: encode(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return json.dumps({"parop.Plan": JSON_FORMAT, **fields}, sort_keys=True, separators=(",", ":"))

    def to_json(self) -> str:
        """The plan as JSON text: `po.Plan.from_json(text) == plan`."""
        return self._json

    @staticmethod
    def from_json(text: str) -> "Plan":
        """The plan `to_json` wrote. Leaves are rebuilt from their class, found by its
        module and name among the modules already imported (reading a plan imports and
        runs nothing: import a leaf's module before reading a plan that holds it), and
        their static fields. Text that is not such a plan is a `ValueError`."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"Plan.from_json takes the text Plan.to_json wrote, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        form = data.pop("parop.Plan", None) if isinstance(data, dict) else None
        if not isinstance(form, int):
            raise ValueError("Plan.from_json: not the JSON of a parop Plan (Plan.to_json's text)")
        if form != JSON_FORMAT:
            raise ValueError(f"Plan.from_json: the plan was written in format {form}; this parop reads format "
                             f"{JSON_FORMAT} (its actions changed since): plan the operator again")
        try:
            plan = Plan(**{name: decode(value) for name, value in data.items()})
            plan.traffic()  # replays the actions: text whose actions do not run from its input is no plan
            return plan
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as error:
            raise ValueError(f"Plan.from_json: not the JSON of a parop Plan (Plan.to_json's text): {error}") from error

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Plan) and self._json == other._json)

    def __hash__(self) -> int:
        return hash(self._json)

    # -- display -------------------------------------------------------------------------
    def lines(self) -> list[str]:
        mesh = ", ".join(f"{k}: {v}" for k, v in self.mesh)
        purpose = "training" if self.cost_model.training else "inference"
        out = [f"plan for {self.operator} on mesh ({mesh}), costed for {purpose}",
               f"  in   {self.shape} {spec_of(self.in_layout)}"]
        out += _action_lines(self.visits, "  ")
        out.append(f"  out  {self.out_shape} {spec_of(self.out_layout)}")
        fwd, bwd, merged = self._traffic()
        out.append(f"  forward:  {_summary(fwd)}")
        out.append(f"  backward: {_summary(bwd)}"
                   + ("  (a weight several steps use: its gradient reduced once)" if merged else ""))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"Plan({self.operator}: {spec_of(self.in_layout)} -> {spec_of(self.out_layout)})"

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(str(self)) + "</pre>"


def _summary(collectives) -> str:
    if not collectives:
        return "no collectives"
    counts = {}
    for c in collectives:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items())
    return f"{kinds}; {fmt_bytes(sum(c.bytes for c in collectives))} sent per device"


def _action_lines(visits, indent: str) -> list[str]:
    """Each action's line (a sum's terms indented below it)."""
    lines = []
    for visit in visits:
        lines.append(indent + visit.action.describe(visit.before))
        for k, term in enumerate(visit.terms):
            lines.append(f"{indent}  term {k + 1}:")
            lines += _action_lines(term, indent + "    ")
    return lines


def transpose_actions(actions: tuple[Action, ...], states: list[State]) -> tuple[Action, ...]:
    """`actions` (with `states[i]` before action i and `states[-1]` after the last)
    transposed and reversed."""
    return tuple(a for i in reversed(range(len(actions))) for a in actions[i].transpose(states[i]))


def transpose_from(actions: tuple[Action, ...], state: State) -> tuple[Action, ...]:
    """`actions`, which start from `state`, transposed and reversed (a sum's term)."""
    visits, end = replay(actions, state)
    return transpose_actions(actions, [v.before for v in visits] + [end])


# -- JSON ----------------------------------------------------------------------------------

_DATACLASSES = {cls.__name__: cls for cls in (*ACTIONS, Step, Program, Slot, CostModel)}
# the format of `Plan.to_json`: one more whenever what it writes changes (2: one class per way of running
# a step, `Local`, `ReducePsum`, `HaloExchange`, the tensor-parallel kinds, where 1 had one with flags)
JSON_FORMAT = 2


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _imported(path: str, kind: type) -> type:
    """The subclass of `kind` at `path` (`module:qualname`), in a module already imported."""
    module, _, name = path.partition(":")
    found = sys.modules.get(module)
    if found is None:
        raise ValueError(f"{path} is in module {module!r}, which is not imported: import it before reading the plan")
    for part in name.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, kind)):
        raise ValueError(f"{path} is not a subclass of {kind.__name__}")
    return found


def encode(value):
    """`value` (a plan's field, an action, a step, a leaf, ...) as JSON data: tagged
    objects for what JSON has no type for."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, np.dtype):
        return {"dtype": value.name}
    if isinstance(value, Enum):
        return {"enum": _path(type(value)), "value": value.value}
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return {"ndarray": encode(array.ravel().tolist()), "dtype": array.dtype.name, "shape": list(array.shape)}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    if isinstance(value, jax.Array):
        raise TypeError("a plan holds no JAX arrays: a traced scalar enters it as a Slot")
    if isinstance(value, Operator):
        fields = {k: encode(v) for k, v in sorted(vars(value).items()) if not k.startswith("_")}
        return {"operator": _path(type(value)), "fields": fields}
    if dataclasses.is_dataclass(value) and _DATACLASSES.get(type(value).__name__) is type(value):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"dataclass": type(value).__name__, "fields": fields}
    raise TypeError(f"Plan.to_json: cannot write {type(value).__name__} {value!r}")


def decode(data):
    """The value `encode` wrote."""
    if isinstance(data, list):
        return tuple(decode(v) for v in data)
    if not isinstance(data, dict):
        return data
    if "complex" in data:
        return complex(*data["complex"])
    if "dict" in data:
        return {decode(k): decode(v) for k, v in data["dict"]}
    if "dtype" in data and len(data) == 1:
        return np.dtype(jnp.dtype(data["dtype"]))
    if "enum" in data:
        return _imported(data["enum"], Enum)(data["value"])
    if "ndarray" in data:
        return np.array(decode(data["ndarray"]), dtype=jnp.dtype(data["dtype"])).reshape(data["shape"])
    if "slice" in data:
        return slice(*data["slice"])
    if "operator" in data:
        cls = _imported(data["operator"], Operator)
        op = object.__new__(cls)
        for name, value in data["fields"].items():
            object.__setattr__(op, name, decode(value))
        return op
    if "dataclass" in data:
        cls = _DATACLASSES.get(data["dataclass"])
        if cls is None:
            raise ValueError(f"unknown class {data['dataclass']!r}")
        return cls(**{name: decode(value) for name, value in data["fields"].items()})
    raise ValueError(f"unknown entry {data!r}")
