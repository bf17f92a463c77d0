"""Will it fit? A training step compiled, never run: per-device memory, planning and
compile time, and the collectives and bytes of one step, for a model whose arrays
could not exist on this machine.

`dry_run(model, batch)` lowers one training step (forward, backward, the optimiser
update, as `fit` runs it) on `jax.ShapeDtypeStruct`s placed where the model keeps its
parameters, optimiser state and data, compiles it, and reads the compiled program's
`memory_analysis()` and HLO. `python -m parop.nn.dryrun` does it for an FNO from the
command line, on as many forced CPU host devices as the partition needs (it sets
`XLA_FLAGS` and restarts itself: JAX reads them once, when it starts):

```
python -m parop.nn.dryrun --grid 512 512 256 32 --width 20 --modes 32 32 16 8 --layers 4 \\
    --partition 1 1 8 8 4 1 --batch 1 --remat
```
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from ..distributed.hlo import collectives
from ..distributed.operator import check_split_counts
from ..distributed.plan.cost import KINDS
from .._checks import positive_int
from .fno import FNO
from .train import as_real, make_step, relative_l2

CHILD = "PAROP_DRYRUN_CHILD"  # set in the restarted process: its XLA_FLAGS are in place

# the HLO's collective kinds under the plan's names
PLAN_KIND = {"all-to-all": "all_to_all", "all-reduce": "psum", "reduce-scatter": "psum_scatter",
             "all-gather": "all_gather", "collective-permute": "ppermute"}


def dry_run(model, batch: int, optimizer=None) -> dict:
    """Compiles one training step of `model` (an `FNO`, serial or distributed) on
    `batch` samples, allocating no array of the model's, and returns:

    - `devices`, `partition` (the split of each axis of `(batch, channel, *grid)`);
    - `memory_bytes`: per device, arguments + outputs + temporaries of the compiled step
      less what outputs alias (`memory` has each part); on a GPU the libraries'
      workspaces (cuFFT plans, cuBLAS) come on top, 80 - 100 MiB on an H200;
    - `plan_seconds` (0 where this batch size was planned before: a distributed FNO
      plans its reference batch size when it is distributed, and the command line
      counts that), `compile_seconds`;
    - `collectives`: per step, from the compiled HLO, by kind (`all_to_all`, `psum`,
      `psum_scatter`, `all_gather`, `ppermute`; a `psum` is one all-reduce operand:
      XLA combines independent all-reduces into one instruction); `planned`: the same
      from the plans (forward + backward), which hold every collective of the
      operators but not the global array's (the loss's sums, the biases' gradients:
      all-reduces); XLA drops those that only make the input's gradient, and
      with `remat` runs again the forward ones the backward pass needs;
    - `sent_bytes`: per device per step, forward and backward, from the plans;
      `hlo_sent_bytes`: what the compiled step's collectives send (its
      `all_to_all`s send exactly the plans' bytes);
    - `all_to_all_per_layer`: the planned `all_to_all`s of one Fourier layer, forward;
    - `flops`, `bytes_accessed`: per device per step, XLA's `cost_analysis()` of the
      compiled step (what `benchmarks/scaling.py` turns into compute time).

    The step is `parop.nn.train.make_step` with Adam (or `optimizer`) on the relative L2
    loss, as `fit` trains with no `decode`: a batch that a distributed model runs filled
    up to its reference batch size (`runs_at`) is measured so, from that batch size's
    plans. Trained with a `UnitGaussianNormalizer`'s `decode`, `fit`'s step also takes
    the normaliser's mean and standard deviation, each of shape `(out_channels, *grid)`
    and split as the targets are: per device, two arrays of one sample's target more.

    ```python
    >>> from parop.nn import FNO, dry_run
    >>> report = dry_run(FNO((64, 64, 64, 32), width=20, modes=(4, 4, 4, 8)), batch=1)  # dfno's block
    >>> round(report["memory_bytes"] / 1e9, 2)          # GB per device
    28.95
    ```
    """
    if not isinstance(model, FNO):
        raise TypeError(f"dry_run: model must be a parop.nn.FNO (serial or distributed), got {type(model).__name__}")
    if model.distributed and isinstance(model.mesh, jax.sharding.AbstractMesh):
        raise ValueError("dry_run: the model is distributed on a mesh shape (an AbstractMesh), and XLA compiles a "
                         "step only for devices: distribute it on a jax.sharding.Mesh (`python -m parop.nn.dryrun` "
                         "forces as many CPU devices as the partition needs)")
    batch = positive_int(batch, "batch", "dry_run")
    optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise TypeError("dry_run: optimizer must be an optax GradientTransformation (with init and update), such as "
                        f"optax.adam(1e-3), or None for that, got {type(optimizer).__name__} {optimizer!r}"[:300])
    start = time.perf_counter()
    ops = model.operators(model.runs_at(batch))  # plans a distributed model's chain for this batch size
    plan_seconds = time.perf_counter() - start
    θ, params, state, a, u = _abstract_step_inputs(model, batch, optimizer)
    step = make_step(lambda θ, a, u: relative_l2(model.apply(θ, a), u), optimizer, θ)
    start = time.perf_counter()
    with jax.numpy_dtype_promotion("standard"):
        compiled = step.lower(params, state, a, u).compile()
    compile_seconds = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    memory = {"arguments": analysis.argument_size_in_bytes, "outputs": analysis.output_size_in_bytes,
              "temporaries": analysis.temp_size_in_bytes, "aliased": analysis.alias_size_in_bytes}
    devices = model.mesh.size if model.distributed else 1
    hlo = collectives(compiled.as_text(), devices)
    planned, sent, per_layer = planned_traffic(model, ops)
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs or {}
    return {
        "devices": devices,
        "partition": partition_of(model),
        "batch": batch,
        "remat": model.remat,
        "memory_bytes": memory["arguments"] + memory["outputs"] + memory["temporaries"] - memory["aliased"],
        "memory": memory,
        "plan_seconds": plan_seconds,
        "compile_seconds": compile_seconds,
        "collectives": {PLAN_KIND[k]: n for k, n in hlo["operations"].items()},
        "planned": planned,
        "sent_bytes": sent,
        "hlo_sent_bytes": hlo["sent_bytes"],
        "hlo_all_to_all_bytes": hlo["sent_by_kind"]["all-to-all"],
        "all_to_all_per_layer": per_layer,
        "flops": float(costs.get("flops", 0.0)),
        "bytes_accessed": float(costs.get("bytes accessed", 0.0)),
    }


def _abstract_step_inputs(model, batch: int, optimizer):
    """`jax.ShapeDtypeStruct`s of the parameters, and of the step's real-view
    parameters, optimiser state, input and target, each placed where training keeps it
    (nothing allocated)."""
    shardings = model.param_shardings() if model.distributed else {}
    θ = jax.eval_shape(model.init, jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
    θr = jax.eval_shape(as_real, θ)

    def real_view(name: str, value) -> jax.ShapeDtypeStruct:
        where = shardings.get(name)
        if where is not None and value.ndim > len(θ[name].shape):  # a complex weight's (re, im) axis
            spec = tuple(where.spec) + (None,) * (θ[name].ndim - len(where.spec))
            where = NamedSharding(where.mesh, PartitionSpec(*spec, None))
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=where)

    params = {name: real_view(name, value) for name, value in θr.items()}
    replicated = NamedSharding(model.mesh, PartitionSpec()) if model.distributed else None

    def placed(path, leaf) -> jax.ShapeDtypeStruct:
        # an optimiser's per-parameter state (Adam's moments) lives with its parameter
        keys = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        owner = params.get(keys[-1]) if keys else None
        where = owner.sharding if owner is not None and owner.shape == leaf.shape else replicated
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where)

    state = jax.tree_util.tree_map_with_path(placed, jax.eval_shape(optimizer.init, params))
    ops = model.operators(model.runs_at(batch))
    grid = model.grid
    a = jax.ShapeDtypeStruct((batch, model.in_channels) + grid, model.dtype,
                             sharding=model.in_sharding if model.distributed else None)
    u = jax.ShapeDtypeStruct((batch, model.out_channels) + grid, model.dtype,
                             sharding=ops[-1].out_sharding if model.distributed else None)
    return θ, params, state, a, u


def partition_of(model) -> tuple[int, ...]:
    """The split of each axis of `(batch, channel, *grid)`: ones for a serial model."""
    if not model.distributed:
        return (1,) * (2 + len(model.grid))
    mesh = model.mesh.shape
    spec = tuple(model.in_sharding.spec) + (None,) * (2 + len(model.grid) - len(model.in_sharding.spec))
    names = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    return tuple(math.prod(mesh[n] for n in axes) for axes in names)


def planned_traffic(model, ops) -> tuple[dict[str, int], float, int]:
    """`(collectives by kind, bytes sent per device, all_to_alls of one Fourier layer)`
    of one training step, from the plans: every operator forward and backward, but for
    the backward collectives of the first operator's actions before its first weight:
    they only make the gradient of the input, which training does not ask for (XLA
    drops them)."""
    counts, sent = dict.fromkeys(KINDS, 0), 0.0
    if not model.distributed:
        return counts, sent, 0
    for k, op in enumerate(ops):
        fwd, bwd = op.plan.traffic()
        skip = len(_input_gradient_only(op.plan)) if k == 0 else 0
        for c in fwd + bwd[skip:]:
            counts[c.kind] += 1
            sent += c.bytes
    per_layer = ops[1].plan.collectives()["all_to_all"] if len(ops) > 3 else 0
    return counts, sent, per_layer


def _input_gradient_only(plan) -> list:
    """The backward collectives of `plan`'s actions before its first weighted step (the
    first in `plan.traffic()`'s backward list, the last the backward pass runs): all
    they make is the input's gradient."""
    dead = []
    for visit in plan.visits:
        step = getattr(visit.action, "step", None)
        if visit.terms or (step is not None and step.weighted):
            break
        dead += visit.action.collectives(visit.before)[1]
    return dead


# -- the command line ------------------------------------------------------------------------

def _ints(values: list[str]) -> tuple[int, ...]:
    """Sizes given apart, by commas or as a shape: `["512", "512"]`, `["512,512"]` or
    `["512x512"]` -> `(512, 512)`."""
    return tuple(int(v) for value in values for v in value.replace("x", ",").split(",") if v)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m parop.nn.dryrun",
        description="Compile one FNO training step (forward, backward, Adam) on forced CPU devices, "
                    "allocating nothing: per-device memory, planning and compile time, collectives "
                    "and bytes per step.")
    p.add_argument("--grid", nargs="+", required=True, help="grid sizes, e.g. 512 512 256 32 (or 512,512,256,32 or 512x512x256x32)")
    p.add_argument("--width", type=int, default=20)
    p.add_argument("--modes", nargs="+", required=True, help="modes per grid axis, e.g. 32 32 16 8 (commas or x too)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--projection", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    split = p.add_mutually_exclusive_group()
    split.add_argument("--partition", nargs="+", help="split of (batch, channel, *grid), e.g. 1 1 8 8 4 1 (commas or x too)")
    split.add_argument("--devices", type=int, help="let parop choose the partition over this many devices")
    p.add_argument("--memory-limit", type=float, default=None,
                   help="with --devices: GB per device the chosen partition must fit")
    p.add_argument("--remat", action="store_true", help="FNO(..., remat=True)")
    p.add_argument("--json", action="store_true", help="print the result as JSON, nothing else")
    return p


def _device_count(args) -> int:
    if args.partition:
        return math.prod(_ints(args.partition))
    return args.devices or 1


def _check_sizes(args) -> None:
    """A `ValueError` for a size that is not an int, or a `--partition` whose counts its
    axes do not take, said before the command starts again on as many devices (it would
    first make them: 99999 of them for a count of 99999)."""
    try:
        grid, _ = _ints(args.grid), _ints(args.modes)
        partition = _ints(args.partition) if args.partition else None
    except ValueError as error:
        raise ValueError(f"sizes must be ints: {error}") from None
    if partition is not None:
        shape = (args.batch, 1 + len(grid), *grid)  # the lifting's input: 1 channel and the grid coordinates
        if len(partition) != len(shape):
            raise ValueError(f"--partition splits the axes of (batch, channel, *grid): {len(shape)} entries for grid "
                             f"{grid}, got {partition}")
        check_split_counts(shape, partition, "--partition")


def _restart_with_devices(n: int, argv: list[str]) -> None:
    """Run this command again in a fresh process with `n` forced CPU host devices (JAX
    reads `XLA_FLAGS` once, when it starts)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    env = {**os.environ, CHILD: "1", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])}
    os.execve(sys.executable, [sys.executable, "-m", "parop.nn.dryrun", *argv], env)


def table(report: dict) -> str:
    """The dry run's report as a readable table."""
    gb = lambda n: f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"  # noqa: E731
    mem = report["memory"]
    hlo = ", ".join(f"{n} {k}" for k, n in report["collectives"].items() if n) or "none"
    planned = ", ".join(f"{n} {k}" for k, n in report["planned"].items() if n) or "none"
    rows = [
        ("devices", str(report["devices"])),
        ("partition", str(tuple(report["partition"]))),
        ("batch", str(report["batch"])),
        ("remat", str(report["remat"])),
        ("memory per device", f"{gb(report['memory_bytes'])} (arguments {gb(mem['arguments'])}, outputs "
                              f"{gb(mem['outputs'])}, temporaries {gb(mem['temporaries'])})"),
        ("planning", f"{report['plan_seconds']:.1f} s"),
        *([("choosing the partition", f"{report['choose_seconds']:.1f} s")] if "choose_seconds" in report else []),
        ("compiling", f"{report['compile_seconds']:.1f} s"),
        ("collectives per step (HLO)", hlo),
        ("collectives per step (plans)", planned),
        ("all_to_alls per Fourier layer", str(report["all_to_all_per_layer"])),
        ("sent per device per step", f"{gb(report['sent_bytes'])} (HLO: {gb(report['hlo_sent_bytes'])})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _report(args) -> dict:
    """The dry run the command line asks for (the partition chosen first, given --devices)."""
    model = FNO(_ints(args.grid), width=args.width, modes=_ints(args.modes), layers=args.layers,
                projection=args.projection, remat=args.remat)
    if args.partition:
        start = time.perf_counter()
        model = model.distribute(_ints(args.partition), batch=args.batch)  # plans the chain for this batch
        planned_in = time.perf_counter() - start
        report = dry_run(model, args.batch)
        return {**report, "plan_seconds": report["plan_seconds"] + planned_in}
    if not args.devices or (args.devices == 1 and args.memory_limit is None):  # a limit is checked on one too
        return dry_run(model, args.batch)
    limit = None if args.memory_limit is None else args.memory_limit * 1e9
    start = time.perf_counter()
    model = model.distribute(devices=args.devices, batch=args.batch, memory_limit=limit)
    chosen_in = time.perf_counter() - start
    return {**dry_run(model, args.batch), "choose_seconds": chosen_in}  # the search's plans and dry runs included


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.devices is not None and args.devices < 1:
        parser().error(f"--devices must be a positive int, got {args.devices}")
    if args.memory_limit is not None and not args.devices:
        parser().error("--memory-limit needs --devices")
    if os.environ.get(CHILD) != "1":
        try:
            _check_sizes(args)
        except ValueError as error:
            parser().error(str(error))
        _restart_with_devices(_device_count(args), argv)
    try:
        report = _report(args)
    except (ValueError, TypeError) as error:  # bad sizes, no plan, nothing fits: the message, no traceback
        parser().exit(2, f"python -m parop.nn.dryrun: {error}\n")
    print(json.dumps(report) if args.json else table(report))


if __name__ == "__main__":
    main()
