"""Cases a and b of `benchmarks/run.py`: distributed 3-D FFTs, complex (a) and
real-to-complex (b, `rfftn`).

parop (the same output layout as the input, and `out_partition="auto"`) against the same
algorithm written by hand with `shard_map` + `all_to_all` (the yardstick,
`benchmarks/_hand.py`), `jit(jnp.fft.fftn)` on the sharded input (XLA's partitioner;
probed first in a child process, `XlaProbe`, because XLA can abort the process in
fft_handler.cc), one device, and jaxDecomp's `jaxdecomp.fft.pfft3d` (the `bench` extra;
skipped, with the reason, where it is not installed; it has no real-to-complex FFT).

    python -m benchmarks.fft '[{"id": ..., "kind": "c2c", "n": 32, "partition": [8, 1, 1]}]'

is the probe's child process (run from the repository root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import parop as po

from . import _hand
from ._harness import N_DEVICES, ROOT, Candidate, Group, Run, worker_args

PARTITIONS = {"slab": (8, 1, 1), "pencil": (2, 4, 1)}
JAXDECOMP = "jaxdecomp pfft3d"


def sizes(quick: bool) -> tuple[int, ...]:
    return (32,) if quick else (64, 128)


def mesh_for(partition):
    """The mesh parop's default builds for `partition`: axis `d{i}` per split axis."""
    axes = [(f"d{i}", p) for i, p in enumerate(partition) if p > 1]
    return jax.make_mesh(tuple(p for _, p in axes), tuple(n for n, _ in axes),
                         axis_types=(AxisType.Auto,) * len(axes), devices=jax.devices()[:N_DEVICES])


def spec_for(partition) -> P:
    return P(*(f"d{i}" if p > 1 else None for i, p in enumerate(partition)))


def sharded_input(kind: str, n: int, partition, seed: int = 0) -> tuple[np.ndarray, jax.Array]:
    """`(x, x laid out as partition on parop's default mesh)`: complex64 for "c2c",
    float32 for "r2c"."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n, n), dtype=np.float32)
    if kind == "c2c":
        x = (x + 1j * rng.standard_normal((n, n, n), dtype=np.float32)).astype(np.complex64)
    return x, jax.device_put(x, NamedSharding(mesh_for(partition), spec_for(partition)))


def fft_operator(kind: str, n: int):
    last = po.DFT(n, dtype=jnp.float32 if kind == "r2c" else jnp.complex64)
    return po.kron(po.DFT(n), po.DFT(n), last)


def xla_fft(kind: str):
    return jax.jit(jnp.fft.fftn if kind == "c2c" else jnp.fft.rfftn)


# -- the XLA-partitioner probe (a child process: XLA may abort the process) -------------

def probe_specs(quick: bool, kinds) -> list[dict]:
    """The `jit(fftn)` runs cases `kinds` ("c2c", "r2c") will time, for `XlaProbe`."""
    return [{"id": probe_id(kind, n, name), "kind": kind, "n": n, "partition": list(partition)}
            for kind in kinds for n in sizes(quick) for name, partition in PARTITIONS.items()]


def probe_id(kind: str, n: int, partition_name: str) -> str:
    return f"{kind}-{n}-{partition_name}"


def _probe_worker(specs: list[dict]) -> None:
    for spec in specs:
        print(f"PROBE-START {spec['id']}", flush=True)
        if spec.get("simulate_abort"):  # for the test of this guard
            os.abort()
        _, xs = sharded_input(spec["kind"], spec["n"], tuple(spec["partition"]))
        jax.block_until_ready(xla_fft(spec["kind"])(xs))
        print(f"PROBE-OK {spec['id']}", flush=True)


class XlaProbe:
    """Runs `jit(fftn)` on each sharded input once in a child process (restarted after
    an abort), so that the benchmark only runs the ones that survive. The child inherits
    this process's environment (its devices)."""

    def __init__(self, specs: list[dict]):
        self.specs = specs
        self.status: dict[str, str] = {}
        self.proc = self._start(specs) if specs else None

    @staticmethod
    def _start(specs):
        return subprocess.Popen(worker_args("fft", specs), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=os.environ.copy())

    def wait(self) -> dict[str, str]:
        """`{spec id: "ok" or why not}` once every spec has run."""
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


def probe_notes(status: dict[str, str]) -> list[str]:
    """The report's notes on the probe: each `jit(fftn)` that did not survive, and
    whether jaxDecomp runs."""
    return [f"jit(fftn) on sharded input {pid}: {s}" for pid, s in status.items() if s != "ok"] + [jaxdecomp_note()]


# -- jaxDecomp ---------------------------------------------------------------------------

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


# -- the groups --------------------------------------------------------------------------

def _plan_all_to_alls(D) -> list[tuple[str, ...]]:
    """The mesh axes of each `all_to_all` of `D`'s plan, in order."""
    return [c.axes for c in D.plan.traffic()[0] if c.kind == "all_to_all"]


def groups(run: Run, kind: str, probe: dict[str, str]) -> list[Group]:
    """Case a (`kind` "c2c") or b ("r2c"): one group per size and partition; `probe` is
    `XlaProbe.wait()`'s status of the `jit(fftn)` runs (`probe_specs`)."""
    case = "a" if kind == "c2c" else "b"
    name = "fftn" if kind == "c2c" else "rfftn"
    out = []
    for n in sizes(run.quick):
        for pname, partition in PARTITIONS.items():
            x, xs = sharded_input(kind, n, partition)
            out.append(_group(run, case, name, kind, n, pname, partition, x, xs, probe))
    return out


def _group(run, case, name, kind, n, pname, partition, x, xs, probe) -> Group:
    problem = f"{kind} {n}³ {pname} {partition}"
    op = fft_operator(kind, n)
    D = po.distribute(op, partition)
    Da = po.distribute(op, partition, out_partition="auto")
    program = jax.jit(lambda x: D @ x).lower(xs).compile()  # parop's program, called without `D @`
    mesh = mesh_for(partition)
    x1 = jax.device_put(x, jax.devices()[0])
    jd, jd_sharding, jd_skip = jaxdecomp_fft(kind, partition)
    xj = jax.device_put(x, jd_sharding) if jd is not None else None
    notes = []
    hands = {}
    for out, Dx in ((None, D), ("auto", Da)):
        in_spec, steps, out_spec = _hand.PROGRAMS[(kind, pname, out)]
        hands[out] = _hand.program(steps, mesh, in_spec, out_spec)
        hand_axes = [axes for axes, _, _ in _hand.all_to_alls(steps)]
        if not (hand_axes == _plan_all_to_alls(Dx) and Dx.out_sharding.spec == out_spec
                and Dx.in_sharding.spec == in_spec):
            notes.append(f"{problem} out={out}: parop's plan's all_to_alls over {_plan_all_to_alls(Dx)} -> "
                         f"{Dx.out_sharding.spec} differ from the hand program's {hand_axes} -> {out_spec}")
    status = probe.get(probe_id(kind, n, pname), "ok")
    xla = xla_fft(kind)
    cands = [
        Candidate("parop", lambda: D @ xs),
        Candidate("hand shard_map", lambda: hands[None](xs), note="yardstick"),
        Candidate("parop program only", lambda: program(xs),
                  note="jax.jit(lambda x: D @ x).lower(x).compile() called: parop's program without `D @`"),
        Candidate("parop, out auto", lambda: Da @ xs, note=f"out {Da.out_sharding.spec}"),
        Candidate("hand shard_map, out auto", lambda: hands["auto"](xs)),
        Candidate(f"jit({name}) sharded", (lambda: xla(xs)) if status == "ok" else None,
                  skip=None if status == "ok" else status, note="XLA partitioner"),
        Candidate("1 device", lambda: xla(x1), note=f"jnp.fft.{name}, unsharded"),
        Candidate(JAXDECOMP, (lambda: jd(xj)) if jd is not None else None, skip=jd_skip,
                  note="output axes (ky, kz, kx), put back in order for the check",
                  to_reference=from_jaxdecomp_layout),
    ]
    ref = (lambda: np.fft.fftn(x)) if kind == "c2c" else (lambda: np.fft.rfftn(x))
    g = Group(case, problem, cands, ref, yardstick="hand shard_map", tol=1e-4, notes=notes)
    g.target(f"{case} {problem}: parop / hand", "parop", "hand shard_map", "<=", 1.05)
    g.target(f"{case} {problem}, out auto: parop / hand", "parop, out auto", "hand shard_map, out auto", "<=", 1.05)
    g.target(f"{case} {problem}: jit({name}) / parop", f"jit({name}) sharded", "parop", ">=", 3.0)
    if jd is not None:
        g.target(f"{case} {problem}: jaxdecomp / parop, out auto", JAXDECOMP, "parop, out auto", ">=", 1.0)

    def after(g):
        run.hlo.add(problem, "parop", program, plan=D.plan)
        run.hlo.add(problem, "hand shard_map", hands[None].lower(xs).compile())
        run.hlo.add(problem, "parop, out auto", jax.jit(lambda x: Da @ x).lower(xs).compile(), plan=Da.plan)
        run.hlo.add(problem, "hand shard_map, out auto", hands["auto"].lower(xs).compile())
        if status == "ok":
            run.hlo.add(problem, f"jit({name}) sharded", xla.lower(xs).compile())
        if jd is not None:
            run.hlo.add(problem, JAXDECOMP, jd.lower(xj).compile())

    g.after = after
    return g


if __name__ == "__main__":
    _probe_worker(json.loads(sys.argv[1]))
