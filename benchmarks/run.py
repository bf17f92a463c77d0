#!/usr/bin/env python
"""parop's benchmarks: one entry point for all cases.

    python benchmarks/run.py [--quick] [--gpu] [--out PATH] [--json PATH]

Runs on 8 forced CPU host devices (`--xla_force_host_platform_device_count=8`, set
here before jax is imported) unless `--gpu`. Each problem (a `Group`) compares
candidates that compute the same thing; each candidate's result is first checked
against a NumPy reference, then all are warmed up (jit compile excluded) and timed
round-robin (interleaved, in a fresh random order each round, every call awaited with
`block_until_ready`); times are medians. The tables go to stdout and to
`benchmarks/RESULTS.md` (`--out`), with the machine they ran on.

Cases (the `CASES` list at the bottom; append new ones there):

a. distributed 3-D complex FFT: parop (same output layout as input, and
   `out_partition="auto"`) vs the same algorithm written by hand with `shard_map` +
   `all_to_all` (the yardstick) vs `jit(jnp.fft.fftn)` on the sharded input (XLA's
   partitioner; probed first in a subprocess because XLA can abort the process in
   fft_handler.cc) vs one device vs jaxDecomp's `jaxdecomp.fft.pfft3d` (the `bench`
   extra; skipped, with the reason, where it is not installed);
b. the same for the real-to-complex 3-D FFT (`rfftn`; jaxDecomp has none);
c. channel mixing `kron(Matrix(c, c), Identity(n), Identity(n))` with a batch axis:
   apply, and the gradient of a sum of squares with respect to the weight, vs a hand
   `einsum` in the same `shard_map` (and `jit(einsum)` on the sharded arrays);
d. one FNO training step (Adam): parop distributed vs parop serial vs the same FNO in
   plain JAX (`benchmarks/plain_fno.py`), from the same parameters;
e. planning + compile + first call of a 3-D DFT plan (in a fresh process), and the
   per-call dispatch cost of a small distributed operator vs its raw jitted program;
f. collectives and bytes per call read from the compiled HLO of each parop program,
   next to `D.plan.bytes`;
g. a large `Matrix` with its input split: apply + gradient with the weight replicated
   vs sharded (row-parallel), bytes and time side by side;
h. planning time: FNO layers in 3-D and 4-D on meshes of 8 and 16 devices (planned from
   their shape), and whole FNO networks (`benchmarks/planning.py`);
i. per-device memory of one compiled training step of a 3-D FNO at P = 1, 2, 4, 8
   (`benchmarks/memory.py`);
j. a 3-D convolution with halo exchanges: parop vs the same written by hand vs
   `jit(conv_general_dilated)` on the sharded input (`benchmarks/halo.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
N_DEVICES = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short timing (about a minute): a smoke test")
    p.add_argument("--gpu", action="store_true", help="use the real accelerators, not 8 forced CPU devices")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"), help="where to write the markdown")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--probe-xla", default=None, help=argparse.SUPPRESS)  # internal: XLA FFT probe worker
    p.add_argument("--measure-compile", default=None, help=argparse.SUPPRESS)  # internal: case e worker
    return p.parse_args(argv)


def _force_cpu_devices() -> None:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={N_DEVICES}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


if __name__ == "__main__":
    ARGS = parse_args()
    if not ARGS.gpu:
        _force_cpu_devices()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import parop as po  # noqa: E402
from benchmarks import _hand, _hlo  # noqa: E402
from benchmarks.halo import halo_groups  # noqa: E402
from benchmarks.memory import memory_rows  # noqa: E402
from benchmarks.planning import planning_rows  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    Candidate, Group, Target, fmt_bytes, paired_ratio, fmt_time, run_group, table, target_rows, timing_rows,
)

PARTITIONS = {"slab": (8, 1, 1), "pencil": (2, 4, 1)}


@dataclass(frozen=True)
class Config:
    quick: bool
    gpu: bool
    fft_sizes: tuple[int, ...]
    mix: tuple[int, int, int]  # channels, grid size, batch
    compile_n: int
    budget_s: float  # timing time per group
    min_rounds: int
    max_rounds: int

    @staticmethod
    def make(quick: bool, gpu: bool) -> "Config":
        if quick:
            return Config(quick, gpu, (32,), (32, 32, 8), 32, budget_s=0.5, min_rounds=5, max_rounds=50)
        return Config(quick, gpu, (64, 128), (64, 64, 8), 64, budget_s=20.0, min_rounds=21, max_rounds=500)


def mesh_for(partition):
    """The mesh parop's default builds for `partition`: axis `d{i}` per split axis."""
    axes = [(f"d{i}", p) for i, p in enumerate(partition) if p > 1]
    return jax.make_mesh(tuple(p for _, p in axes), tuple(n for n, _ in axes),
                         axis_types=(AxisType.Auto,) * len(axes), devices=jax.devices()[:N_DEVICES])


def spec_for(partition) -> P:
    return P(*(f"d{i}" if p > 1 else None for i, p in enumerate(partition)))


def fft_input(kind: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n, n), dtype=np.float32)
    if kind == "c2c":
        x = (x + 1j * rng.standard_normal((n, n, n), dtype=np.float32)).astype(np.complex64)
    return x


def fft_operator(kind: str, n: int):
    last = po.DFT(n, dtype=jnp.float32 if kind == "r2c" else jnp.complex64)
    return po.kron(po.DFT(n), po.DFT(n), last)


def xla_fft(kind: str):
    return jax.jit(jnp.fft.fftn if kind == "c2c" else jnp.fft.rfftn)


# -- the XLA-partitioner probe (a subprocess: XLA may abort the process) -----------------

def _probe_worker(spec_json: str) -> None:
    for spec in json.loads(spec_json):
        kind, n, partition = spec["kind"], spec["n"], tuple(spec["partition"])
        print(f"PROBE-START {spec['id']}", flush=True)
        if spec.get("simulate_abort"):  # for the test of this guard
            os.abort()
        xs = jax.device_put(fft_input(kind, n), NamedSharding(mesh_for(partition), spec_for(partition)))
        jax.block_until_ready(xla_fft(kind)(xs))
        print(f"PROBE-OK {spec['id']}", flush=True)


class XlaProbe:
    """Runs `jit(fftn)` on each sharded input once in a child process (restarted after
    an abort), so that the main process only runs the ones that survive."""

    def __init__(self, specs: list[dict], gpu: bool = False):
        self.specs = specs
        self.gpu = gpu
        self.status: dict[str, str] = {}
        self.proc = self._start(specs) if specs else None

    def _start(self, specs):
        return subprocess.Popen(
            [sys.executable, __file__, "--probe-xla", json.dumps(specs)] + (["--gpu"] if self.gpu else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
        )

    def wait(self) -> dict[str, str]:
        remaining = list(self.specs)
        proc = self.proc
        while proc is not None:
            try:
                out, err = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            started = [line.split()[1] for line in out.splitlines() if line.startswith("PROBE-START")]
            ok = {line.split()[1] for line in out.splitlines() if line.startswith("PROBE-OK")}
            for i in ok:
                self.status[i] = "ok"
            failed = [i for i in started if i not in ok]
            if proc.returncode == 0 or not failed:
                for spec in remaining:
                    self.status.setdefault(spec["id"], "ok" if proc.returncode == 0 else
                                           f"probe failed (rc {proc.returncode})")
                break
            why = [line for line in err.splitlines() if "fft" in line.lower() or line.startswith(("F", "E"))]
            what = "aborted" if proc.returncode < 0 else "failed"  # killed by a signal (XLA's LOG(FATAL))
            self.status[failed[0]] = f"{what}: " + (why[-1].strip()[:160] if why else f"rc {proc.returncode}")
            remaining = [s for s in remaining if s["id"] not in self.status]
            proc = self._start(remaining) if remaining else None
        self.proc = None
        return self.status


# -- cases a and b: distributed 3-D FFTs -------------------------------------------------

HLO_ROWS: list[dict] = []
JAXDECOMP = "jaxdecomp pfft3d"


def _import_jaxdecomp():
    """`(the jaxdecomp module, None)`, or `(None, why not)`: it is an optional extra."""
    try:
        import jaxdecomp
    except Exception as e:  # noqa: BLE001
        return None, f"jaxdecomp not importable ({type(e).__name__})"
    return jaxdecomp, None


def jaxdecomp_fft(kind: str, partition) -> tuple:
    """jaxDecomp's distributed FFT for this case: `(f, sharding, None)`, `f` the jitted
    `jaxdecomp.fft.pfft3d` (its pure-JAX backend) and `sharding` the input layout it
    takes, or `(None, None, why)` where jaxDecomp cannot run the case.

    `pfft3d` reads its decomposition from a 2-D mesh `(p0, p1)` splitting the first two
    axes, the array sharded `P(mesh axis 0, mesh axis 1, None)` (a 1-D mesh fails in its
    partitioner): `(8, 1)` is its XY slab, `(2, 4)` its pencils. It returns the spectrum
    transposed, axes `(ky, kz, kx)`."""
    jaxdecomp, why = _import_jaxdecomp()
    if jaxdecomp is None:
        return None, None, why
    if kind != "c2c":
        return None, None, (f"jaxdecomp {jaxdecomp.__version__} has no real-to-complex FFT (`pfft3d` is "
                            "complex-to-complex; `jaxdecomp.fft.prfft3d` raises 'Not implemented')")
    if partition[2] != 1:
        return None, None, "jaxdecomp splits the first two axes only"
    mesh = jax.make_mesh(partition[:2], ("d0", "d1"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:N_DEVICES])
    return jax.jit(jaxdecomp.fft.pfft3d), NamedSharding(mesh, P("d0", "d1", None)), None


def from_jaxdecomp_layout(got, want):
    """`pfft3d`'s `(ky, kz, kx)` result with its axes back in `(kx, ky, kz)` order."""
    return np.transpose(np.asarray(got), (2, 0, 1))


def jaxdecomp_note() -> str:
    jaxdecomp, why = _import_jaxdecomp()
    if jaxdecomp is None:
        return f"{why}: its candidates are skipped (`pip install -e '.[bench]'` installs it)"
    return (f"jaxdecomp {jaxdecomp.__version__}: `jax.jit(jaxdecomp.fft.pfft3d)` (pure-JAX backend, default "
            "config) on a 2-D mesh `(p0, p1)` = the partition's first two splits, input `P('d0', 'd1', None)`. "
            "It returns the spectrum transposed, axes (ky, kz, kx), split `(None, 'd0', None)` for the slab and "
            "`('d0', 'd1', None)` for the pencils, after one all_to_all per split mesh axis, as `parop, out auto` "
            "(whose output is also laid out otherwise than its input), which its target compares it with; `parop` "
            "with the input's layout does twice the all_to_alls. Where it is faster: it moves each axis it "
            "transforms to the end (its local FFTs all run on the last axis; XLA fuses those transposes into the "
            "all_to_alls' unpacking), so it leaves its output in the last FFT's layout, and on the pencils packs "
            "its second all_to_all with plain slices; parop keeps the axes in (kx, ky, kz) order, so after its "
            "last FFT it transposes the local block back, and on the pencils it packs its second all_to_all with "
            "a transposing copy (after an FFT along axis 0). Real-to-complex (case b): "
            f"{jaxdecomp_fft('r2c', PARTITIONS['pencil'])[2]}.")


def _plan_all_to_alls(D) -> list:
    return [(tuple(a.axes), a.src, a.dst) for a in D.plan.actions if type(a).__name__ == "AllToAll"]


def _hlo_row(problem, program, fn, args, n_devices=N_DEVICES, plan=None):
    text = fn.lower(*args).compile().as_text()
    info = _hlo.collectives(text, n_devices)
    row = {"problem": problem, "program": program, **info["counts"],
           "operand_bytes": info["operand_bytes"], "sent_bytes": info["sent_bytes"]}
    if plan is not None:
        row["plan_all_to_all"] = plan.collectives()["all_to_all"]
        row["plan_psum"] = plan.collectives()["psum"]
        row["plan_bytes"] = plan.bytes
    HLO_ROWS.append(row)
    return row


def fft_groups(cfg: Config, kind: str, probe: XlaProbe) -> list[Group]:
    case = "a" if kind == "c2c" else "b"
    name = "fftn" if kind == "c2c" else "rfftn"
    groups = []
    for n in cfg.fft_sizes:
        x = fft_input(kind, n)
        x1 = jax.device_put(x, jax.devices()[0])
        single = xla_fft(kind)
        for pname, partition in PARTITIONS.items():
            problem = f"{kind} {n}³ {pname} {partition}"
            op = fft_operator(kind, n)
            D = po.distribute(op, partition)
            Da = po.distribute(op, partition, out_partition="auto")
            mesh = mesh_for(partition)
            xs = jax.device_put(x, NamedSharding(mesh, spec_for(partition)))
            jd, jd_sharding, jd_skip = jaxdecomp_fft(kind, partition)
            xj = jax.device_put(x, jd_sharding) if jd is not None else None
            notes = []
            hands = {}
            for out, Dx in ((None, D), ("auto", Da)):
                in_spec, steps, out_spec = _hand.PROGRAMS[(kind, pname, out)]
                hands[out] = _hand.program(steps, mesh, in_spec, out_spec)
                same = (_hand.all_to_alls(steps) == _plan_all_to_alls(Dx)
                        and Dx.out_sharding.spec == out_spec and Dx.in_sharding.spec == in_spec)
                if not same:
                    notes.append(f"{problem} out={out}: parop's plan {_plan_all_to_alls(Dx)} -> "
                                 f"{Dx.out_sharding.spec} differs from the hand program "
                                 f"{_hand.all_to_alls(steps)} -> {out_spec}")
            probe_id = f"{kind}-{n}-{pname}"
            status = probe.status.get(probe_id, "ok")
            xla = xla_fft(kind)
            cands = [
                Candidate("parop", lambda D=D, xs=xs: D @ xs),
                Candidate("hand shard_map", lambda f=hands[None], xs=xs: f(xs), note="yardstick"),
                Candidate("parop program only", lambda f=D.program(())[0], xs=xs: f(xs),
                          note="D.program(())[0] called directly: parop's program without `D @`"),
                Candidate("parop, out auto", lambda D=Da, xs=xs: D @ xs,
                          note=f"out {Da.out_sharding.spec}"),
                Candidate("hand shard_map, out auto", lambda f=hands["auto"], xs=xs: f(xs)),
                Candidate(f"jit({name}) sharded", (lambda f=xla, xs=xs: f(xs)) if status == "ok" else None,
                          skip=None if status == "ok" else status, note="XLA partitioner"),
                Candidate("1 device", lambda f=single, x1=x1: f(x1), note=f"jnp.fft.{name}, unsharded"),
                Candidate(JAXDECOMP, (lambda f=jd, xj=xj: f(xj)) if jd is not None else None, skip=jd_skip,
                          note="output axes (ky, kz, kx), put back in order for the check",
                          to_reference=from_jaxdecomp_layout),
            ]
            ref = (lambda x=x: np.fft.fftn(x)) if kind == "c2c" else (lambda x=x: np.fft.rfftn(x))
            g = Group(case, problem, cands, ref, yardstick="hand shard_map", tol=1e-4, notes=notes)
            g.target(f"{case} {problem}: parop / hand", "parop", "hand shard_map", "<=", 1.05)
            g.target(f"{case} {problem}, out auto: parop / hand", "parop, out auto", "hand shard_map, out auto",
                     "<=", 1.05)
            g.target(f"{case} {problem}: jit({name}) / parop", f"jit({name}) sharded", "parop", ">=", 3.0)
            if jd is not None:
                g.target(f"{case} {problem}: jaxdecomp / parop, out auto", JAXDECOMP, "parop, out auto", ">=", 1.0)

            def after(g, D=D, Da=Da, xs=xs, hands=hands, xla=xla, status=status, problem=problem, jd=jd, xj=xj):
                run, _ = D.program(())
                runa, _ = Da.program(())
                _hlo_row(problem, "parop", run, (xs,), plan=D.plan)
                _hlo_row(problem, "hand shard_map", hands[None], (xs,))
                _hlo_row(problem, "parop, out auto", runa, (xs,), plan=Da.plan)
                _hlo_row(problem, "hand shard_map, out auto", hands["auto"], (xs,))
                if status == "ok":
                    _hlo_row(problem, f"jit({name}) sharded", xla, (xs,))
                if jd is not None:
                    _hlo_row(problem, JAXDECOMP, jd, (xj,))

            g.after = after
            g.extra["probe_id"] = probe_id
            groups.append(g)
    return groups


def fft_probe_specs(cfg: Config) -> list[dict]:
    return [{"id": f"{kind}-{n}-{pname}", "kind": kind, "n": n, "partition": list(partition)}
            for kind in ("c2c", "r2c") for n in cfg.fft_sizes for pname, partition in PARTITIONS.items()]


# -- case c: channel mixing ------------------------------------------------------------

def mixing_groups(cfg: Config) -> list[Group]:
    c, n, b = cfg.mix
    partition = (1, 2, 4, 1)
    op = po.kron(po.Matrix(c, c, name="mix"), po.Identity(n), po.Identity(n))
    D = po.distribute(op, partition)
    θ = po.init(D, jax.random.key(0))
    x = np.random.default_rng(1).standard_normal((c, n, n, b), dtype=np.float32)
    xs = jax.device_put(x, D.in_sharding)
    mesh = D.mesh
    x_spec = spec_for(partition)
    w = θ["mix"]
    w_hand = jax.device_put(np.asarray(w), NamedSharding(mesh, P()))
    W64, x64 = np.asarray(w, np.float64), x.astype(np.float64)
    problem = f"mix {c}x{c} on ({c}, {n}, {n}, {b}) {partition}"

    def hand_mix(w, x):
        return jax.shard_map(lambda w, x: jnp.einsum("oc,cxyb->oxyb", w, x), mesh=mesh,
                             in_specs=(P(), x_spec), out_specs=x_spec)(w, x)

    def plain_mix(w, x):
        return jnp.einsum("oc,cxyb->oxyb", w, x)

    hand_apply, plain_apply = jax.jit(hand_mix), jax.jit(plain_mix)
    loss = lambda f: (lambda w, x: jnp.sum(jnp.square(f(w, x))))  # noqa: E731
    hand_grad = jax.jit(jax.grad(loss(hand_mix)))
    plain_grad = jax.jit(jax.grad(loss(plain_mix)))
    parop_grad = jax.jit(jax.grad(lambda θ, x: jnp.sum(jnp.square(D(θ) @ x))))
    y64 = np.einsum("oc,cxyb->oxyb", W64, x64)

    run_b = D.program((b,))[0]
    apply = Group("c", problem + ": apply", [
        Candidate("parop", lambda: D(θ) @ xs),
        Candidate("parop program only", lambda: run_b(xs, w),
                  note="D.program((b,))[0] called directly: parop's program without `D(θ) @`"),
        Candidate("hand shard_map einsum", lambda: hand_apply(w_hand, xs), note="yardstick"),
        Candidate("jit(einsum) sharded", lambda: plain_apply(w_hand, xs), note="XLA partitioner"),
    ], lambda: y64, yardstick="hand shard_map einsum", tol=1e-4)
    apply.target(f"c {problem}: apply, parop / hand", "parop", "hand shard_map einsum", "<=", 1.1)
    grad = Group("c", problem + ": grad wrt weight", [
        Candidate("parop", lambda: parop_grad(θ, xs)["mix"]),
        Candidate("hand shard_map einsum", lambda: hand_grad(w_hand, xs), note="yardstick"),
        Candidate("jit(einsum) sharded", lambda: plain_grad(w_hand, xs), note="XLA partitioner"),
    ], lambda: 2 * np.einsum("oxyb,cxyb->oc", y64, x64), yardstick="hand shard_map einsum", tol=1e-4)
    grad.target(f"c {problem}: grad, parop / hand", "parop", "hand shard_map einsum", "<=", 1.1)

    def after_apply(g):
        _hlo_row(problem + ": apply", "parop", D.program((b,))[0], (xs, w), plan=D.plan_for((b,)))
        _hlo_row(problem + ": apply", "hand shard_map einsum", hand_apply, (w_hand, xs))

    def after_grad(g):
        _hlo_row(problem + ": grad", "parop", parop_grad, (θ, xs))
        _hlo_row(problem + ": grad", "hand shard_map einsum", hand_grad, (w_hand, xs))

    apply.after, grad.after = after_apply, after_grad
    return [apply, grad]


# -- case e: planning + compile, and dispatch ----------------------------------------------

COMPILE_ROWS: list[dict] = []


def _compile_worker(spec_json: str) -> None:
    """In a fresh process: for each config, `po.distribute` (planning), the first call
    (trace, lower, compile, run) and a steady call; one JSON line per config."""
    for spec in json.loads(spec_json):
        kind, n, partition = spec["kind"], spec["n"], tuple(spec["partition"])
        xs = jax.device_put(fft_input(kind, n), NamedSharding(mesh_for(partition), spec_for(partition)))
        jax.block_until_ready(xs)
        t0 = time.perf_counter()
        D = po.distribute(fft_operator(kind, n), partition)
        t1 = time.perf_counter()
        jax.block_until_ready(D @ xs)
        t2 = time.perf_counter()
        jax.block_until_ready(D @ xs)
        t3 = time.perf_counter()
        print("COMPILE " + json.dumps({**spec, "plan_s": t1 - t0, "first_call_s": t2 - t1, "call_s": t3 - t2}),
              flush=True)


def measure_compile(cfg: Config) -> list[dict]:
    n = cfg.compile_n
    specs = [{"kind": "c2c", "n": n, "partition": list(PARTITIONS["pencil"]), "order": "first in a fresh process"},
             {"kind": "c2c", "n": n, "partition": list(PARTITIONS["slab"]), "order": "second"},
             {"kind": "r2c", "n": n, "partition": list(PARTITIONS["pencil"]), "order": "third"}]
    proc = subprocess.run([sys.executable, __file__, "--measure-compile", json.dumps(specs)]
                          + (["--gpu"] if cfg.gpu else []),
                          capture_output=True, text=True, timeout=300, env=os.environ.copy())
    rows = [json.loads(line[len("COMPILE "):]) for line in proc.stdout.splitlines() if line.startswith("COMPILE ")]
    if proc.returncode or len(rows) != len(specs):
        raise RuntimeError(f"compile-time worker failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    COMPILE_ROWS.extend(rows)
    return rows


PROFILE_LINES: list[str] = []
def dispatch_groups(cfg: Config) -> list[Group]:
    n = 8
    partition = (2, 2, 2)
    D = po.distribute(po.kron(po.DFT(n), po.DFT(n), po.DFT(n)), partition)
    x = fft_input("c2c", n, seed=2)
    xs = jax.device_put(x, D.in_sharding)
    run, _ = D.program(())
    g = Group("e", f"dispatch: c2c {n}³ {partition}", [
        Candidate("parop D @ x", lambda: D @ xs),
        Candidate("raw D.program(())[0](x)", lambda: run(xs), note="yardstick"),
    ], lambda: np.fft.fftn(x), yardstick="raw D.program(())[0](x)", tol=1e-4)
    g.target(f"e dispatch {n}³ {partition}: parop / raw program", "parop D @ x", "raw D.program(())[0](x)",
             "<=", 1.2)

    def after(g):
        a, b = g.results["parop D @ x"].median, g.results["raw D.program(())[0](x)"].median
        g.extra["overhead_s"] = a - b if a is not None and b is not None else None
        PROFILE_LINES[:] = _profile_apply(D, xs, run)

    g.after = after
    return [g]


def compile_and_dispatch_groups(cfg: Config) -> list[Group]:
    """Case e: the planning + compile time (measured now, in a fresh process), then the
    dispatch group (timed by the caller); the compile target rides on that group."""
    rows = measure_compile(cfg)
    worst = max(r["plan_s"] + r["first_call_s"] for r in rows)
    for r in rows:
        print(f"  plan + first call {r['kind']} {r['n']}³ {tuple(r['partition'])} ({r['order']}): "
              f"{fmt_time(r['plan_s'] + r['first_call_s'])}", flush=True)
    groups = dispatch_groups(cfg)
    groups[0].targets.append(Target(
        f"e plan + first call, 3-D DFT {cfg.compile_n}³ (worst of {len(rows)}, first in a fresh process)",
        "<", 2.0, value=worst, unit="s"))
    return groups


def _profile_apply(D, xs, run, calls: int = 2000) -> list[str]:
    """Where the time of `D @ x` goes beyond the program itself: cProfile over `calls`
    awaited calls, per call, for the Python functions parop runs (tottime)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        jax.block_until_ready(D @ xs)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append((tt / calls, ct / calls, nc / calls, f"{Path(file).name}:{line}({fn})"))
    rows.sort(reverse=True)
    lines = ["| function | calls/call | tottime/call | cumtime/call |", "|---|---|---|---|"]
    for tt, ct, nc, where in rows[:12]:
        lines.append(f"| `{where}` | {nc:g} | {tt * 1e6:.1f} µs | {ct * 1e6:.1f} µs |")
    return lines



# -- case d: an FNO training step ------------------------------------------------------

def fno_groups(cfg: Config) -> list[Group]:
    """One jitted Adam step of the FNO: parop distributed vs parop serial vs the same FNO
    in plain JAX (`benchmarks/plain_fno.py`), all from the same parameters and batch; in
    2-D (the Darcy protocol's model) and in 3-D."""
    configs = [  # (grid, width, modes, batch, partition); the quick run: a small 2-D model only
        ((16, 16), 8, (8, 8), 4, (1, 1, 2, 4)),
    ] if cfg.quick else [
        ((32, 32), 32, (12, 12), 20, (1, 1, 2, 4)),
        ((24, 24, 24), 16, (8, 8, 8), 10, (1, 1, 2, 2, 2)),
    ]
    layers = 1 if cfg.quick else 4
    return [_fno_group(*config, layers) for config in configs]


def _fno_group(grid, width, modes, batch, partition, layers) -> Group:
    import optax

    from benchmarks import plain_fno
    from parop.nn import FNO, relative_l2
    from parop.nn.train import as_real, make_step

    model = FNO(grid, width=width, modes=modes, layers=layers)
    dist = model.distribute(partition)
    by_bytes = model.distribute(partition, cost=po.CostModel(latency_bytes=0))  # collectives free to start
    θ = model.init(jax.random.key(0))
    θd = dist.init(jax.random.key(0))
    θb = by_bytes.init(jax.random.key(0))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((batch, 1) + grid, dtype=np.float32)
    u = rng.standard_normal((batch, 1) + grid, dtype=np.float32)
    ad, ud = (jax.device_put(v, dist.in_sharding) for v in (a, u))
    optimizer = optax.adam(1e-3)

    def parop_step(m, θ):
        loss = lambda θ, x, y: relative_l2(m.apply(θ, x), y)  # noqa: E731
        step = make_step(loss, optimizer, θ)
        θr = as_real(θ)
        state = optimizer.init(θr)
        return lambda x, y: step(θr, state, x, y)[2]

    plain = plain_fno.params_from_parop(θ, layers)
    plain_loss = lambda p, x, y: relative_l2(plain_fno.apply(p, x[:, 0])[:, None], y)  # noqa: E731
    plain_state = optimizer.init(plain)

    @jax.jit
    def plain_step(p, state, x, y):
        value, grads = jax.value_and_grad(plain_loss)(p, x, y)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    serial, distributed, bytes_only = parop_step(model, θ), parop_step(dist, θd), parop_step(by_bytes, θb)
    want = float(plain_loss(plain, a, u))
    problem = f"FNO step: batch {batch}, {'x'.join(map(str, grid))}, width {width}, modes {modes}, {layers} layers"
    g = Group("d", problem, [
        Candidate(f"parop distributed {partition}", lambda: distributed(ad, ud)),
        Candidate(f"parop distributed {partition}, latency_bytes=0", lambda: bytes_only(ad, ud)),
        Candidate("parop serial", lambda: serial(a, u)),
        Candidate("plain JAX FNO", lambda: plain_step(plain, plain_state, a, u)[2], note="yardstick"),
    ], lambda: np.float64(want), yardstick="plain JAX FNO", tol=1e-4)
    g.target(f"d {problem}: parop serial / plain JAX", "parop serial", "plain JAX FNO", "<=", 1.0)
    return g


# -- case g: a large Matrix, sharded vs replicated weight ----------------------------------

def sharded_matrix_groups(cfg: Config) -> list[Group]:
    """`kron(Matrix(m, n), Identity(b))` with its input axis split 8 ways: apply + weight
    gradient with the weight replicated (the activations move) vs sharded (row-parallel,
    `psum_scatter`); bytes from the plans next to the times."""
    m = n = 256 if cfg.quick else 1024
    b = 64
    op = po.kron(po.Matrix(m, n, name="w"), po.Identity(b))
    x = np.random.default_rng(4).standard_normal((n, b), dtype=np.float32)
    rows = []
    candidates = []
    for mode in (False, True):
        D = po.distribute(op, (8, 1), shard_weights=mode)
        θ = po.init(D, jax.random.key(0))
        xs = jax.device_put(x, D.in_sharding)
        grad = jax.jit(jax.value_and_grad(lambda θ, x, D=D: jnp.sum(jnp.square(D(θ) @ x))))
        name = "parop, sharded weight (row-parallel)" if mode else "parop, replicated weight (activations move)"
        candidates.append(Candidate(name, lambda grad=grad, θ=θ, xs=xs: grad(θ, xs)[0]))
        w_bytes = θ["w"].addressable_shards[0].data.nbytes
        rows.append(f"{name}: plan sends {D.plan.bytes / 1024:.0f} KiB/device forward, "
                    f"{D.plan.collectives()}, weight {w_bytes / 2**20:.2f} MiB/device")
    w = np.asarray(po.init(op, jax.random.key(0))["w"], np.float64)
    g = Group("g", f"Matrix {m}x{n} on ({n}, {b}) split (8, 1): value of sum((W x)²) + grad", candidates,
              lambda: np.float64(np.sum(np.square(w @ x.astype(np.float64)))),
              yardstick="parop, replicated weight (activations move)", tol=1e-4)
    g.notes.extend(rows)
    return [g]

# -- the cases -------------------------------------------------------------------------
#
# Each entry: (letter, title, builder). A builder takes (Config, context) and returns a
# list of `Group`s; the groups are checked, timed and tabulated in order. Append new
# cases here.

CASES = [
    ("a", "distributed 3-D complex FFT", lambda cfg, ctx: fft_groups(cfg, "c2c", ctx["probe"])),
    ("b", "distributed 3-D real-to-complex FFT", lambda cfg, ctx: fft_groups(cfg, "r2c", ctx["probe"])),
    ("c", "channel mixing, apply and gradient", lambda cfg, ctx: mixing_groups(cfg)),
    ("d", "FNO training step", lambda cfg, ctx: fno_groups(cfg)),
    ("e", "planning + compile time, and dispatch of a small distributed operator",
     lambda cfg, ctx: compile_and_dispatch_groups(cfg)),
    ("g", "a large Matrix: sharded vs replicated weight", lambda cfg, ctx: sharded_matrix_groups(cfg)),
    ("j", "a 3-D convolution with halo exchanges", lambda cfg, ctx: halo_groups(cfg.quick, _hlo_row)),
]

# Cases measured once, not timed against each other: (letter, title, rows(quick), the
# table's columns, targets(rows)).
TABLES = [
    ("h", "Planning time (each plan from scratch; 16-device meshes planned from their shape)", planning_rows,
     [("operator", "operator"), ("partition", "partition"), ("devices", "devices"), ("states", "states expanded"),
      ("seconds", "seconds")],
     lambda rows: [Target(f"h plan {r['operator']} on {r['partition']}", "<", r["limit"], value=r["seconds"], unit="s")
                   for r in rows if r["limit"] is not None]),
    ("i", "Per-device memory of one compiled FNO training step (arguments + outputs + temporaries)", memory_rows,
     [("model", "model"), ("partition", "partition"), ("devices", "devices"), ("arguments", "arguments"),
      ("outputs", "outputs"), ("temporaries", "temporaries"), ("total", "total"), ("ratio", "/ serial")],
     lambda rows: [Target(f"i {r['model']} on {r['partition']}: memory / serial", "<=", 0.15, value=r["ratio"])
                   for r in rows if r["devices"] == 8]),
]


# -- report ----------------------------------------------------------------------------

def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    import jaxlib

    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": usable, "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
            "backend": jax.default_backend(), "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": os.getloadavg()}


def _cell(value) -> str:
    """A table cell: bytes as MiB, seconds and ratios to three figures."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and value > 1 << 16:
        return fmt_bytes(value)
    return str(value)


def hlo_table() -> str:
    header = ["problem", "program", "all-to-all (HLO / plan)", "all-gather", "all-reduce", "other",
              "HLO operand bytes", "HLO sent/device", "D.plan.bytes"]
    rows = []
    for r in HLO_ROWS:
        plan_a2a = r.get("plan_all_to_all")
        other = r["reduce-scatter"] + r["collective-permute"]
        rows.append([r["problem"], r["program"],
                     f"{r['all-to-all']}" + (f" / {plan_a2a}" if plan_a2a is not None else ""),
                     r["all-gather"], r["all-reduce"], other, fmt_bytes(r["operand_bytes"]),
                     fmt_bytes(r["sent_bytes"]), fmt_bytes(r.get("plan_bytes"))])
    return table(header, rows)


def compile_table() -> str:
    rows = []
    for r in COMPILE_ROWS:
        total = r["plan_s"] + r["first_call_s"]
        rows.append([f"{r['kind']} {r['n']}³ {tuple(r['partition'])}", r["order"], fmt_time(r["plan_s"]),
                     fmt_time(r["first_call_s"]), fmt_time(r["call_s"]), fmt_time(total)])
    return table(["plan", "when", "po.distribute (planning)", "first call (trace+compile+run)",
                  "second call", "plan + first call"], rows)


def breakdown_table(groups: list[Group]) -> str:
    """Where parop's time goes against the yardstick: its program vs the hand-written
    one, and `D @ x` vs calling its program directly (paired ratios)."""
    rows = []
    for g in groups:
        r = g.results
        names = ("parop", "parop program only", g.yardstick)
        if not all(n in r and r[n].ok and r[n].median for n in names):
            continue
        whole, prog, hand = (r[n] for n in names)
        ratios = (paired_ratio(whole, hand), paired_ratio(prog, hand), paired_ratio(whole, prog))
        rows.append([g.case, g.problem, *("–" if v is None else f"{v:.2f}" for v in ratios)])
    return table(["case", "problem", "parop / yardstick", "parop's program / yardstick",
                  "`D @ x` / its program"], rows)


def report(cfg: Config, info: dict, groups: list[Group], targets: list[Target], elapsed: float,
           notes: list[str], tables: dict) -> str:
    mode = "--quick" if cfg.quick else "full"
    devices = "--gpu" if cfg.gpu else f"{N_DEVICES} forced CPU host devices"
    lines = [
        "# parop benchmarks",
        "",
        f"Written by `python benchmarks/run.py{' --quick' if cfg.quick else ''}{' --gpu' if cfg.gpu else ''}` "
        f"({mode} mode, {devices}) on {info['date']}, in {elapsed:.0f} s.",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"backend {info['backend']} ({info['devices']}); jax {info['jax']}, jaxlib {info['jaxlib']}, "
        f"numpy {info['numpy']}, Python {info['python']}. Load average at start "
        f"{info['load_start'][0]:.1f}, at end {info['load_end'][0]:.1f} (other work shares the machine: "
        "timings are noisy).",
        "",
        "Method: every candidate's result is checked against NumPy (float64) first (max |error| / max "
        "|reference|); then candidates are warmed up (jit compile excluded) and timed interleaved, "
        "round-robin in a fresh random order each round, each call awaited with `block_until_ready`; a sample is the mean "
        "of k back-to-back calls (`n=samples×k`, the same k for all candidates of a problem; a candidate over 4x "
        "slower than the typical one joins every m-th round only), the time shown is "
        "the median of the samples, `min` the fastest sample. `ratio` = median / the median of the group's "
        "yardstick (the hand-written `shard_map` program); the targets table also gives the paired ratio, "
        "the median over rounds of the ratio within one round, which drifting load disturbs less. All 8 devices share the "
        "machine's cores, so distributed candidates are not expected to beat `1 device` here; the "
        "comparisons that matter are against the hand-written program with the same collectives.",
        "",
        "## Targets",
        "",
        table(["target", "measured (ratio of medians)", "paired ratio", "limit", "verdict"], target_rows(targets)),
        "",
        f"## Timings (cases {', '.join(sorted({g.case for g in groups}))})",
        "",
        table(["case", "problem", "candidate", "median", "min", "ratio", "check (max rel. err)", "notes"],
              timing_rows(groups)),
        "",
        "Where parop's time goes (paired ratios): its jitted program against the hand-written one "
        "(the same collectives; the difference is in the local code), and `D @ x` against calling that "
        "program directly (parop's host-side work per call):",
        "",
        breakdown_table(groups),
        "",
        "## f. Collectives per call, from the compiled HLO",
        "",
        "Counts of collective instructions in the optimized HLO of each program, the bytes of their operands "
        "on one device, and what one device sends (all-to-all `S(g-1)/g`, all-gather `S(g-1)`, all-reduce "
        "`2S(g-1)/g`, for operand bytes `S` and group size `g`), next to parop's own count and `D.plan.bytes`.",
        "",
        hlo_table(),
        "",
        "## e. Planning + compile time (3-D DFT plans, in a fresh process)",
        "",
        compile_table(),
        "",
    ]
    for letter, (title, columns, rows) in tables.items():
        lines += [f"## {letter}. {title}", "", table([label for _, label in columns],
                                                       [[_cell(r[key]) for key, _ in columns] for r in rows]), ""]
    dispatch = [g for g in groups if g.case == "e" and "overhead_s" in g.extra]
    if dispatch and dispatch[0].extra["overhead_s"] is not None:
        lines += [
            "## e. Dispatch overhead",
            "",
            f"`D @ x` costs {dispatch[0].extra['overhead_s'] * 1e6:.0f} µs per call more than calling the jitted "
            f"program `D.program(())[0]` directly ({dispatch[0].problem}). cProfile of `D @ x` "
            "(per call; `tottime` of `apply` includes the jitted program's C++ dispatch and the call itself):",
            "",
            *PROFILE_LINES,
            "",
            "`D @ x` runs its checks when it traces, inside one `jax.jit` around the program, so a call "
            "costs that jitted function's dispatch.",
            "",
        ]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def main(args) -> int:
    start = time.perf_counter()
    cfg = Config.make(args.quick, args.gpu)
    if jax.device_count() < N_DEVICES:
        print(f"run.py needs {N_DEVICES} devices, found {jax.device_count()} ({jax.default_backend()})")
        return 2
    info = machine()
    print(f"parop benchmarks ({'quick' if cfg.quick else 'full'}): {info['cpu']}, {info['cores']} cores, "
          f"jax {info['jax']}, {info['devices']}", flush=True)
    probe = XlaProbe(fft_probe_specs(cfg), gpu=cfg.gpu)
    ctx = {"probe": probe}
    notes: list[str] = []
    t = time.perf_counter()
    probe.wait()
    for pid, status in probe.status.items():
        if status != "ok":
            notes.append(f"jit(fftn) on sharded input {pid}: {status}")
    print(f"  XLA-partitioner probe done ({time.perf_counter() - t:.1f} s)", flush=True)
    notes.append(jaxdecomp_note())

    groups: list[Group] = []
    for letter, title, build in CASES:
        print(f"case {letter}: {title}", flush=True)
        for g in build(cfg, ctx):
            t = time.perf_counter()
            run_group(g, budget_s=cfg.budget_s, min_rounds=cfg.min_rounds, max_rounds=cfg.max_rounds,
                      log=lambda s: print(s, flush=True))
            groups.append(g)
            notes += g.notes
            summary = ", ".join(f"{c.name} {fmt_time(g.results[c.name].median)}" for c in g.candidates
                                if g.results[c.name].median is not None)
            print(f"  {g.problem}: {summary} ({time.perf_counter() - t:.1f} s)", flush=True)

    targets = [t for g in groups for t in g.targets]
    tables = {}
    for letter, title, rows_of, columns, targets_of in TABLES:
        print(f"case {letter}: {title}", flush=True)
        rows = rows_of(cfg.quick)
        tables[letter] = (title, columns, rows)
        targets += targets_of(rows)

    info["load_end"] = os.getloadavg()
    elapsed = time.perf_counter() - start
    text = report(cfg, info, groups, targets, elapsed, notes, tables)
    print()
    print(text)
    Path(args.out).write_text(text)
    failed = [(g.problem, c.name, g.results[c.name].detail) for g in groups for c in g.candidates
              if g.results[c.name].status in ("check FAILED", "error")]
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": info, "quick": cfg.quick, "elapsed_s": elapsed,
            "groups": [{"case": g.case, "problem": g.problem, "yardstick": g.yardstick, "results": {
                c: {"status": r.status, "error": r.error, "median_s": r.median, "detail": r.detail}
                for c, r in g.results.items()}} for g in groups],
            "targets": [{"label": t.label, "value": t.measured(), "limit": t.limit, "op": t.op,
                         "passed": t.passed()} for t in targets],
            "hlo": HLO_ROWS, "compile": COMPILE_ROWS, "notes": notes, "checks_failed": failed,
            "tables": {k: rows for k, (_, _, rows) in tables.items()},
        }, indent=1, default=str))
    if failed:
        print(f"\nCORRECTNESS CHECKS FAILED: {failed}")
        return 1
    print(f"\nall correctness checks passed ({sum(len(g.results) for g in groups)} candidates); "
          f"written to {args.out} in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    if ARGS.probe_xla is not None:
        _probe_worker(ARGS.probe_xla)
    elif ARGS.measure_compile is not None:
        _compile_worker(ARGS.measure_compile)
    else:
        sys.exit(main(ARGS))
