"""`Plan`, the planner's answer as a value: the actions, their replay from the input
state (`replay`: the state before each action), the plan's costs and display, its
transpose, and its JSON form."""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from ... import _dtypes
from ...operator import Operator
from ...operators import Role
from ..layout import Layout, spec_of
from .actions import Action, AllToAll, Branch, Gather, Local, Split, State
from .cost import ALL_TO_ALL, KINDS, Collective, CostModel
from .program import BARRIER, Program, Slot, Step


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
        if isinstance(action, Local):
            state = replace(_after_step(action.step, state), layout=action.after(state))
        else:
            state = replace(state, layout=action.after(state))
    return tuple(visits), state


def _after_step(step: Step, state: State) -> State:
    sizes = list(state.sizes)
    for a, n in zip(step.axes, step.out_sizes):
        sizes[a] = n
    itemsize = step.out_dtype.itemsize if step.flow == BARRIER and step.in_dtype != step.out_dtype else state.itemsize
    return replace(state, sizes=tuple(sizes), itemsize=itemsize)


def walk(visits):
    for visit in visits:
        yield visit
        for term in visit.terms:
            yield from walk(term)


def start(shape: tuple[int, ...], layout: Layout, dtype, mesh: tuple[tuple[str, int], ...]) -> State:
    """The state a program starts from: its input."""
    return State(tuple(shape), layout, _dtypes.canonical(dtype).itemsize, tuple(mesh))


def weight_uses(visits: tuple[Visit, ...]) -> dict[str, list]:
    """`{name: each distinct split of the weight where a step uses it, in order}`."""
    placements: dict = {}
    for visit in walk(visits):
        if isinstance(visit.action, Local):
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
        for `jax.grad`, with the weight gradients' all-reduces)."""
        fwd, bwd = [], []
        for visit in walk(self.visits):
            f, b = visit.action.collectives(visit.before)
            fwd += f
            bwd += b
        return fwd, bwd

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
        """What the planner minimised: (time in bytes, bytes sent, collectives)."""
        return self.cost_model.price(*self.traffic())

    def transpose(self, operator: Operator) -> "Plan":
        """The plan of `operator` (the adjoint) that runs this plan's actions transposed,
        in reverse order: the same weight placement, from this plan's output layout
        back to its input layout."""
        from ...display import short

        states = [v.before for v in self.visits] + [self._replayed[1]]
        actions = _transpose(self.actions, states)
        return Plan(short(operator), self.mesh, self.out_shape, self.shape, self.out_layout, actions,
                    _dtypes.canonical(operator.dtype), self.cost_model, 0)

    # -- a value: equality and JSON ------------------------------------------------------
    @cached_property
    def _json(self) -> str:
        fields = {f.name: encode(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return json.dumps({"parop.Plan": 1, **fields}, sort_keys=True, separators=(",", ":"))

    def to_json(self) -> str:
        """The plan as JSON text: `po.Plan.from_json(text) == plan`."""
        return self._json

    @staticmethod
    def from_json(text: str) -> "Plan":
        """The plan `to_json` wrote. Leaves are rebuilt from their class (imported by its
        module and name: read only plans you trust) and their static fields."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("parop.Plan", None) != 1:
            raise ValueError("Plan.from_json: not the JSON of a parop Plan (Plan.to_json's text)")
        return Plan(**{name: decode(value) for name, value in data.items()})

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
        fwd, bwd = self.traffic()
        out.append(f"  forward:  {_summary(fwd)}")
        out.append(f"  backward: {_summary(bwd)}")
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


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _traffic(fwd, bwd, own: str | None = None) -> str:
    """The collectives of an action, forward and backward (those of its own kind, an
    `all_to_all`'s, by their bytes alone)."""
    def one(c):
        return fmt_bytes(c.bytes) if c.kind == own else f"{c.kind} {'+'.join(c.axes)} {fmt_bytes(c.bytes)}"

    parts = [f"{label} " + " + ".join(one(c) for c in cs) for label, cs in (("fwd", fwd), ("bwd", bwd)) if cs]
    return ("   " + ", ".join(parts)) if parts else ""


def _action_lines(visits, indent: str) -> list[str]:
    from ...display import scalar, short

    lines = []
    for visit in visits:
        action, before = visit.action, visit.before
        fwd, bwd = action.collectives(before)
        after = spec_of(action.after(before)) if not isinstance(action, Branch) else None
        if isinstance(action, AllToAll):
            padding = f", axis {action.dst} padded with {action.pad} zeros" if action.pad else ""
            cropping = f", axis {action.src} cropped to {action.crop}" if action.crop else ""
            lines.append(f"{indent}all_to_all {'+'.join(action.axes)}: axis {action.src} -> axis {action.dst}"
                         f"{padding}{cropping}{_traffic(fwd, bwd, ALL_TO_ALL)}   -> {after}")
        elif isinstance(action, Split):
            padding = f", padded with {action.pad} zeros" if action.pad else ""
            lines.append(f"{indent}split axis {action.dst} over {'+'.join(action.axes)} (local slice{padding})"
                         f"{_traffic(fwd, bwd)}   -> {after}")
        elif isinstance(action, Gather):
            lines.append(f"{indent}all_gather axis {action.src} over {'+'.join(action.axes)}"
                         f"{_traffic(fwd, bwd)}   -> {after}")
        elif isinstance(action, Local):
            step = action.step
            if step.leaf is not None:
                what = short(step.leaf)
            elif step.conj:
                what = "conjugate"
            else:
                c = step.scalar
                what = f"scale by {'conj(c)' if isinstance(c, Slot) and c.conj else scalar(c)}"
            where = f" on axis {step.axes[0]}" if len(step.axes) == 1 else f" on axes {step.axes}" if step.axes else ""
            if action.halo:
                where += ", halo exchange on axis " + ", ".join(
                    f"{a} over {'+'.join(before.layout[a])}" for a in action.halo)
            if action.weight_split is not None:
                form = "row" if action.psum else "column"
                axes = "+".join(n for part in action.weight_split for n in part)
                where += f", {form}-parallel: weight split over {axes}"
            moved = f"   -> {after}" if after != spec_of(before.layout) else ""
            lines.append(f"{indent}{what}{where}{_traffic(fwd, bwd)}{moved}")
        else:
            lines.append(f"{indent}sum of {len(action.terms)} terms:")
            for k, term in enumerate(visit.terms):
                lines.append(f"{indent}  term {k + 1}:")
                lines += _action_lines(term, indent + "    ")
    return lines


# -- transposition -------------------------------------------------------------------------

def _transpose_step(step: Step) -> Step:
    scalar = step.scalar
    if isinstance(scalar, Slot):
        scalar = scalar.conjugate()
    elif isinstance(scalar, complex):
        scalar = scalar.conjugate()
    return Step(step.axes, step.out_sizes, step.in_sizes, step.flow, step.out_dtype, step.in_dtype,
                leaf=None if step.leaf is None else step.leaf.H, scalar=scalar, conj=step.conj)


def _transpose(actions: tuple[Action, ...], states: list[State]) -> tuple[Action, ...]:
    """`actions` (with `states[i]` before action i and `states[-1]` after the last)
    transposed and reversed."""
    out: list[Action] = []
    for i in reversed(range(len(actions))):
        action, before, after = actions[i], states[i], states[i + 1]
        if isinstance(action, Branch):
            terms = []
            for term in action.terms:
                visits, end = replay(term, before)
                terms.append(_transpose(term, [v.before for v in visits] + [end]))
            out.append(Branch(_transpose_step(action.step), tuple(terms)))
        elif isinstance(action, AllToAll):
            pad = before.blocks[action.src] * before.splits[action.src] - before.sizes[action.src] if action.crop else 0
            crop = before.sizes[action.dst] if action.pad else 0
            out.append(AllToAll(action.axes, action.dst, action.src, pad, crop))
        elif isinstance(action, Split):
            out.append(Gather(action.axes, action.dst, before.sizes[action.dst] if action.pad else 0))
        elif isinstance(action, Gather):
            pad = before.blocks[action.src] * before.splits[action.src] - before.sizes[action.src] if action.crop else 0
            out.append(Split(action.axes, action.src, pad))
        else:
            step = _transpose_step(action.step)
            ws = action.weight_split
            if ws is None and action.psum:  # a Reduce's psum: broadcast, then split again
                a = next(b for b, r in zip(action.step.axes, action.step.roles) if r is Role.REDUCE)
                out.append(Local(step))
                out.append(Split(action.psum, a, -before.sizes[a] % before.group(action.psum)))
            elif ws is None:
                out.append(Local(step, halo=action.halo))
            elif action.gather:
                out.append(Local(step, psum=action.gather, scatter=True, weight_split=ws))
            elif action.scatter:
                out.append(Local(step, gather=action.psum, weight_split=ws))
            elif action.psum:
                out.append(Local(step, weight_split=ws))
            else:
                out_ax, _ = action.step.leaf.dense_axes
                out.append(Local(step, psum=ws[out_ax], weight_split=ws))
    return tuple(out)


# -- JSON ----------------------------------------------------------------------------------

_DATACLASSES = {cls.__name__: cls for cls in (Local, AllToAll, Split, Gather, Branch, Step, Program, Slot, CostModel)}


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _imported(path: str) -> type:
    module, _, name = path.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
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
        return _imported(data["enum"])(data["value"])
    if "ndarray" in data:
        return np.array(decode(data["ndarray"]), dtype=jnp.dtype(data["dtype"])).reshape(data["shape"])
    if "slice" in data:
        return slice(*data["slice"])
    if "operator" in data:
        cls = _imported(data["operator"])
        if not (isinstance(cls, type) and issubclass(cls, Operator)):
            raise ValueError(f"Plan.from_json: {data['operator']} is not a parop operator class")
        op = object.__new__(cls)
        for name, value in data["fields"].items():
            object.__setattr__(op, name, decode(value))
        return op
    if "dataclass" in data:
        cls = _DATACLASSES[data["dataclass"]]
        return cls(**{name: decode(value) for name, value in data["fields"].items()})
    raise ValueError(f"Plan.from_json: unknown entry {data!r}")
