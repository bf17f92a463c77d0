#!/usr/bin/env python
"""parop on one GPU, in one run: correctness, the FNO training step against plain JAX
and PyTorch's neuraloperator, the 3-D FFT against the memory roofline, and the dry run
against the memory a real step takes.

    python benchmarks/gpu.py [--quick] [--out DIR] [--budget SECONDS]

from the repository root, on a machine whose JAX sees a GPU (`--quick`: small sizes,
runs anywhere, also on the CPU: a smoke test). What it does, in this order:

1. the device, the versions, and the device's copy bandwidth (`copy_bandwidth`: the
   best of two jitted streaming programs, bytes read plus written per second);
2. the serial operator and FNO tests (`pytest`) on the GPU, those that need 8 devices
   deselected (a failure that only wants devices is listed apart), first, so that a
   short budget still checks the answers: in at most half of `--budget`;
3. 3-D FFTs, complex (c2c) and real-to-complex (r2c), complex64, 256³ and 512³:
   parop's `kron` of DFTs (serial, and distributed on a one-device mesh),
   `jnp.fft.fftn`/`rfftn`, and one `jnp.fft.fft` per axis (what parop's serial kron
   ran before it gave consecutive DFTs to XLA as one multi-axis FFT), each checked
   against SciPy in float64. The roofline is the time to read the input and write
   the output once at the measured copy bandwidth; `roofline / time` is the share of
   it reached;
4. the FNO training step (Adam, relative L2 loss, float32): the Darcy protocol's 2-D
   model (batch 20, 32², width 32, modes 12², 4 layers) and 3-D models that fill more
   of the GPU (64³ and 96³, width 20, modes 16³, batch 4): parop serial (also with
   `remat=True`), parop on a one-device mesh, the plain-JAX FNO (`benchmarks/plain_fno.py`, from parop's
   initial parameters) timed interleaved (`_harness.run_group`), every loss checked
   against the plain model's, and neuraloperator's FNO configured as the same network
   (`benchmarks/gpu_torch.py`, PyTorch, in a child process, after the JAX candidates);
   then the kernels of parop's and the plain step (`kernels`);
5. the dry run against the hardware: for the first two FNOs, with and without remat,
   in a fresh child process each, `parop.nn.dry_run`'s per-device memory against the
   allocator's peak (`memory_stats()["peak_bytes_in_use"]`) over one real training
   step.

`--skip` leaves sections out; `--render run.json ...` prints the tables of earlier runs.
Every section writes its results to `DIR/gpu.json` as it ends (and the tables to
`DIR/gpu.md` at the end), so that a run cut short keeps what it measured. JAX does not
preallocate the GPU's memory here (`XLA_PYTHON_CLIENT_PREALLOCATE=false`): the child
processes and PyTorch share the device.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import parop as po  # noqa: E402
from benchmarks import plain_fno  # noqa: E402
from benchmarks._harness import Candidate, Group, fmt_bytes, fmt_time, run_group, table, timing_rows  # noqa: E402
from benchmarks._report import machine  # noqa: E402
from parop.nn import FNO, as_real, dry_run, relative_l2  # noqa: E402
from parop.nn.train import make_step  # noqa: E402

TIMING = {True: {"budget_s": 0.05, "min_rounds": 3, "max_rounds": 5},
          False: {"budget_s": 3.0, "min_rounds": 11, "max_rounds": 200}}
# (grid, width, modes, batch): the Darcy protocol's model, then 3-D models nearer the GPU's size
FNO_CASES = {True: [((16, 16), 8, (4, 4), 4)],
             False: [((32, 32), 32, (12, 12), 20), ((64, 64, 64), 20, (16, 16, 16), 4),
                     ((96, 96, 96), 20, (16, 16, 16), 4)]}
FFT_SIZES = {True: (32,), False: (256, 512)}
LAYERS = {True: 1, False: 4}
# the serial tests that run on one device: the operators, algebra, convolutions, the FNOs
TESTS = ["tests/test_operators.py", "tests/test_algebra_api.py", "tests/test_convolution.py",
         "tests/test_external_leaf.py", "tests/test_plain_fno.py", "tests/test_fno.py"]
NEEDS_DEVICES = ("distribute or all_to_alls or planned_again or step_for_step or darcy_training "
                 "or unsplittable")
# what parop's device check raises: a test that names no such keyword but builds a mesh of
# several devices fails with it on one GPU; it is reported apart, not as a wrong answer
TOO_FEW_DEVICES = re.compile(r"needs \d+ devices, but \d+ are available")


def log(message: str) -> None:
    print(message, flush=True)


class Report:
    """The run's results, written to `DIR/gpu.json` after every section."""

    def __init__(self, out: Path, quick: bool):
        self.path = out / "gpu.json"
        self.data: dict = {"quick": quick, "machine": machine(), "sections": {}}
        self.data["machine"]["device_memory_bytes"] = _device_memory()
        self.save()

    def add(self, section: str, value) -> None:
        self.data["sections"][section] = value
        self.save()

    def attempt(self, section: str, run) -> None:
        """`run()` as section `section`; an exception is recorded (with its traceback)
        and the run goes on with the next section."""
        t0 = time.perf_counter()
        try:
            run()
        except Exception:  # noqa: BLE001 -- a broken section must not cost the others
            import traceback

            self.data.setdefault("errors", {})[section] = traceback.format_exc()[-3000:]
            log(f"{section} FAILED:\n{self.data['errors'][section]}")
        self.data.setdefault("section_seconds", {})[section] = time.perf_counter() - t0
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def _device_memory() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


# -- 1. copy bandwidth ----------------------------------------------------------------

def copy_bandwidth(quick: bool) -> dict[str, float]:
    """Bytes read plus written per second by two jitted streaming programs (best of 50
    calls each, after a second of warm-up so the clocks have risen): `2 * x` on 1 GiB of
    complex64 and `x + 1` on 2 GiB of float32 (1 MiB with `quick`). Their best is the
    roofline's rate."""
    n = (1 << 17) if quick else (1 << 27)
    programs = {"2 * x, complex64": (jax.jit(lambda x: 2 * x), jnp.ones(n, jnp.complex64)),
                "x + 1, float32": (jax.jit(lambda x: x + 1), jnp.ones(4 * n, jnp.float32))}
    rates = {}
    for name, (program, x) in programs.items():
        start = time.perf_counter()
        while time.perf_counter() - start < (0.05 if quick else 1.0):
            jax.block_until_ready(program(x))
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            jax.block_until_ready(program(x))
            times.append(time.perf_counter() - t0)
        rates[name] = 2 * x.nbytes / min(times)
    return rates


# -- 2. FFTs --------------------------------------------------------------------------

def fft_rows(quick: bool, bandwidth: float) -> list[dict]:
    """Each 3-D FFT's candidates timed (`fft_group`), with the roofline: reading the
    input and writing the output once at `bandwidth`."""
    rows = []
    for kind in ("c2c", "r2c"):
        for n in FFT_SIZES[quick]:
            g, nbytes = fft_group(kind, n)
            log(f"  fft {g.problem}")
            run_group(g, **TIMING[quick], log=log)
            roofline = nbytes / bandwidth
            for c in g.candidates:
                r = g.results[c.name]
                rows.append({"kind": kind, "n": n, "candidate": c.name, "median_s": r.median, "status": r.status,
                             "error": r.error, "roofline_s": roofline,
                             "of_roofline": roofline / r.median if r.median else None})
    return rows


def fft_group(kind: str, n: int) -> tuple[Group, int]:
    """The candidates of one 3-D FFT (`kind` "c2c" or "r2c", n³ complex64 or float32),
    checked against SciPy in float64; and the bytes of its input plus its output."""
    import scipy.fft

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n, n), dtype=np.float32)
    if kind == "c2c":
        x = (x + 1j * rng.standard_normal((n, n, n), dtype=np.float32)).astype(np.complex64)
    op = po.kron(po.DFT(n), po.DFT(n), po.DFT(n, dtype=jnp.float32 if kind == "r2c" else jnp.complex64))
    one_device = po.distribute(op, (1, 1, 1))
    xd = jax.device_put(x)
    whole = jax.jit(jnp.fft.fftn if kind == "c2c" else jnp.fft.rfftn)
    serial = jax.jit(lambda x: op @ x)

    @jax.jit
    def per_axis(x):
        x = jnp.fft.rfft(x, axis=2) if kind == "r2c" else jnp.fft.fft(x, axis=2)
        return jnp.fft.fft(jnp.fft.fft(x, axis=1), axis=0)

    def reference():
        wide = x.astype(np.complex128 if kind == "c2c" else np.float64)
        return (scipy.fft.fftn if kind == "c2c" else scipy.fft.rfftn)(wide, workers=os.cpu_count())

    name = "fftn" if kind == "c2c" else "rfftn"
    g = Group("fft", f"{kind} {n}³ complex64", [
        Candidate("parop kron of DFTs", lambda: serial(xd)),
        Candidate("parop, one-device mesh", lambda: one_device @ xd),
        Candidate(f"jnp.fft.{name}", lambda: whole(xd), note="yardstick"),
        Candidate("one jnp.fft.fft per axis", lambda: per_axis(xd),
                  note="parop's serial kron before its DFTs were fused"),
    ], reference, yardstick=f"jnp.fft.{name}", tol=1e-5)
    return g, x.nbytes + n * n * (n if kind == "c2c" else n // 2 + 1) * 8


# -- 3. FNO steps ---------------------------------------------------------------------

def fno_inputs(grid, batch):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((batch, 1) + tuple(grid), dtype=np.float32)
    u = rng.standard_normal((batch, 1) + tuple(grid), dtype=np.float32)
    return a, u


def fno_steps(case: dict, names: tuple[str, ...] | None = None) -> tuple[dict[str, tuple], float]:
    """`case`'s FNO training steps, each `(jitted step, its arguments)` (the step returns
    `(θ, state, loss)`): parop serial, with and without remat, parop on a one-device
    mesh, and the plain-JAX FNO from parop's initial parameters (only those `names`,
    where given); and the plain model's loss, in float64."""
    grid, batch, layers = tuple(case["grid"]), case["batch"], case["layers"]
    model = FNO(grid, width=case["width"], modes=tuple(case["modes"]), layers=layers)
    θ = model.init(jax.random.key(0))
    a, u = (jnp.asarray(v) for v in fno_inputs(grid, batch))
    optimizer = optax.adam(1e-3)

    def parop_step(m):
        θm = jax.device_put(θ, m.param_shardings()) if m.distributed else θ
        x, y = (jax.device_put(v, m.in_sharding) for v in (a, u)) if m.distributed else (a, u)
        θr = as_real(θm)
        return make_step(lambda θ, x, y: relative_l2(m.apply(θ, x), y), optimizer, θm), (θr, optimizer.init(θr), x, y)

    plain = plain_fno.params_from_parop(θ, layers)
    plain_loss = lambda p, x, y: relative_l2(plain_fno.apply(p, x[:, 0])[:, None], y)  # noqa: E731
    remat = FNO(grid, width=case["width"], modes=tuple(case["modes"]), layers=layers, remat=True)
    builders = {"parop serial": lambda: parop_step(model),
                "parop serial, remat=True": lambda: parop_step(remat),
                "parop, one-device mesh": lambda: parop_step(model.distribute((1,) * (2 + len(grid)), batch=batch)),
                "plain JAX FNO": lambda: (make_step(plain_loss, optimizer), (plain, optimizer.init(plain), a, u))}
    steps = {name: build() for name, build in builders.items() if names is None or name in names}
    return steps, float(plain_loss(plain, a, u))


def fno_group(case: dict) -> Group:
    """`case`'s training steps (`fno_steps`) timed against each other, each one's loss
    checked against the plain model's."""
    steps, want = fno_steps(case)
    problem = (f"batch {case['batch']}, {'x'.join(map(str, case['grid']))}, width {case['width']}, "
               f"modes {tuple(case['modes'])}, {case['layers']} layers")
    candidates = [Candidate(name, lambda step=step, args=args: step(*args)[2],
                            note="yardstick" if name == "plain JAX FNO" else "")
                  for name, (step, args) in steps.items()]
    return Group("fno", problem, candidates, lambda: np.float64(want), yardstick="plain JAX FNO", tol=1e-3)


def neuralop_times(cases: list[dict], quick: bool, timeout: float) -> list[dict]:
    """neuraloperator's step on each case, in one child process (PyTorch beside no JAX
    arrays): `{"same": the network parop's is (one GELU per layer), "shipped":
    neuraloperator's own forward (two)}`, each the child's dict or `{"error": ...}`."""
    code = ("import json, sys; from benchmarks.gpu_torch import neuralop_step_ms; out = []\n"
            "for c in json.loads(sys.argv[1]):\n"
            "    row = {}\n"
            "    for name, single in (('same', True), ('shipped', False)):\n"
            "        try: row[name] = neuralop_step_ms(tuple(c['grid']), c['width'], tuple(c['modes']), c['layers'], "
            "c['batch'], rounds=c['rounds'], device=c['device'], single_gelu=single)\n"
            "        except Exception as e: row[name] = {'error': f'{type(e).__name__}: {e}'[:300]}\n"
            "    out.append(row); print(json.dumps(row), flush=True)\n"
            "print('RESULT ' + json.dumps(out))")
    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    payload = [dict(c, rounds=3 if quick else 30, device=device) for c in cases]
    failed = lambda why: [{"same": {"error": why}, "shipped": {"error": why}}] * len(cases)  # noqa: E731
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(payload)], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return failed(f"timed out after {timeout:.0f} s")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return failed(f"child failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")


def neuralop_rows(both: dict, plain_s: float | None) -> list[dict]:
    """The FNO table's rows of `neuralop_times`' two timings of one case."""
    rows = []
    for name, t in both.items():
        ms = t.get("median_ms")
        rows.append({
            "candidate": f"neuraloperator ({'one GELU per layer, as parop' if name == 'same' else 'as shipped: two'})",
            "median_s": None if ms is None else ms / 1e3,
            "ratio": None if ms is None or not plain_s else ms / 1e3 / plain_s, "check": "–",
            "note": t.get("error") or f"torch {t.get('torch')}, neuralop {t.get('neuralop')}, {t.get('params')} "
                    f"parameters (parop {t.get('parop_params')}), TF32 {t.get('tf32')}"})
    return rows


def kernels(case: dict) -> dict[str, dict[str, int]]:
    """The instructions of the compiled training step's entry computation by opcode
    (fusions, FFTs, library calls: each one kernel or more), for parop serial and the
    plain-JAX FNO: where one step launches more work than the other."""
    steps, _ = fno_steps(case, ("parop serial", "plain JAX FNO"))
    out = {}
    for name, (step, args) in steps.items():
        entry = step.lower(*args).compile().as_text().split("\nENTRY ", 1)[1].split("\n}", 1)[0]
        ops = [m.group(1) for line in entry.splitlines()[1:] if " = " in line
               for m in [re.search(r" ([a-z][\w-]*)\(", line.split(" = ", 1)[1])] if m]
        counts = {op: ops.count(op) for op in sorted(set(ops))
                  if op not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")}
        out[name] = dict(counts, total=sum(counts.values()))
    return out


# -- 4. dry run against measured memory (a child process per model) ---------------------

def memory_probe(spec: dict) -> dict:
    """In this (fresh) process: the dry run's memory of `spec`'s FNO step, then one real
    step and the allocator's peak."""
    model = FNO(tuple(spec["grid"]), width=spec["width"], modes=tuple(spec["modes"]), layers=spec["layers"],
                remat=spec["remat"])
    report = dry_run(model, spec["batch"])
    optimizer = optax.adam(1e-3)
    θ = model.init(jax.random.key(0))
    θr = as_real(θ)
    state = optimizer.init(θr)
    a, u = (jnp.asarray(v) for v in fno_inputs(spec["grid"], spec["batch"]))
    step = make_step(lambda θ, a, u: relative_l2(model.apply(θ, a), u), optimizer, θ)  # keeps θ (its `like`)
    compiled = step.lower(θr, state, a, u).compile()
    jax.block_until_ready((θr, state, a, u))
    device = jax.devices()[0]
    before = device.memory_stats() or {}
    out = jax.block_until_ready(compiled(θr, state, a, u))
    after = device.memory_stats() or {}
    del out
    analysis = compiled.memory_analysis()
    return {"predicted_bytes": report["memory_bytes"], "memory": report["memory"],
            "in_use_before": before.get("bytes_in_use"), "peak_bytes": after.get("peak_bytes_in_use"),
            "compiled_temp_bytes": analysis.temp_size_in_bytes, "backend": jax.default_backend()}


def memory_rows(cases: list[dict], timeout: float) -> list[dict]:
    rows = []
    for spec in cases:
        try:
            done = subprocess.run([sys.executable, str(Path(__file__)), "--memory-probe", json.dumps(spec)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            line = [s for s in done.stdout.splitlines() if s.startswith("PROBE ")]
            result = json.loads(line[-1][len("PROBE "):]) if line else {
                "error": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}
        except subprocess.TimeoutExpired:
            result = {"error": f"timed out after {timeout:.0f} s"}
        log(f"  memory {spec}: {result}")
        rows.append(dict(spec, **result))
    return rows


# -- 5. tests -------------------------------------------------------------------------

def run_tests(out: Path, timeout: float) -> dict:
    if timeout < 30:
        return {"skipped": f"only {timeout:.0f} s left"}
    junit = out / "pytest.xml"  # this run's alone: an earlier one's is removed first
    junit.unlink(missing_ok=True)
    args = [sys.executable, "-m", "pytest", "-q", "-n", "8", "-k", f"not ({NEEDS_DEVICES})",
            f"--junitxml={junit}", *TESTS]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        tail = (done.stdout + done.stderr)[-6000:]
        code = done.returncode
    except subprocess.TimeoutExpired as e:
        tail = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))[-6000:]
        code = "timeout"
    (out / "pytest.log").write_text(tail)
    summary = [s for s in tail.splitlines() if " passed" in s or " failed" in s or " error" in s]
    failed, too_few = (failures(junit) if junit.exists()
                       else ([s for s in tail.splitlines() if s.startswith(("FAILED", "ERROR"))], []))
    return {"exit": code, "seconds": time.perf_counter() - t0, "summary": summary[-1] if summary else tail[-300:],
            "failed": failed, "needs_devices": too_few}


def failures(junit: Path) -> tuple[list[str], list[str]]:
    """The failed tests of a JUnit report, as `FAILED module::test - message`, and apart
    from them those that failed only for want of devices (`TOO_FEW_DEVICES`)."""
    failed, too_few = [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        for problem in case.findall("failure") + case.findall("error"):
            message = (problem.get("message") or "").partition("\n")[0]
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            (too_few if TOO_FEW_DEVICES.search(message) else failed).append(f"FAILED {name} - {message}")
    return failed, too_few


# -- the report -----------------------------------------------------------------------

def markdown(data: dict) -> str:
    m = data["machine"]
    s = data["sections"]
    lines = [f"# parop on one GPU ({'quick' if data['quick'] else 'full'} run)", "",
             f"{m['devices']}, {fmt_bytes(m.get('device_memory_bytes'))} usable; jax {m['jax']}, "
             f"jaxlib {m['jaxlib']}, numpy {m['numpy']}, Python {m['python']}; {m['cpu']}, {m['cores']} cores; "
             f"{m['date']}.", ""]
    if "bandwidth" in s:
        lines += ["Copy bandwidth (bytes read + written per second; the best of 50 calls unless named): " + ", ".join(
            f"`{name}` {rate / 1e12:.2f} TB/s" for name, rate in s["bandwidth"].items()) + ".", ""]
    if "fft" in s:
        lines += ["## 3-D FFTs", "", table(
            ["FFT", "candidate", "median", "roofline", "of roofline", "check (max rel. error)"],
            [[f"{r['kind']} {r['n']}³", r["candidate"], fmt_time(r["median_s"]), fmt_time(r["roofline_s"]),
              "–" if r["of_roofline"] is None else f"{100 * r['of_roofline']:.0f} %",
              f"{r['status']} ({r['error']:.1e})" if r["error"] is not None else r["status"]]
             for r in s["fft"]]), ""]
    if "fno" in s:
        rows = []
        for case in s["fno"]:
            for r in case["rows"]:
                rows.append([case["problem"], r["candidate"], fmt_time(r["median_s"]),
                             "–" if r.get("ratio") is None else f"{r['ratio']:.2f}", r.get("check", ""),
                             r.get("note", "")])
        lines += ["## FNO training step (Adam, float32)", "",
                  table(["model", "candidate", "median step", "/ plain JAX", "check", "note"], rows), ""]
    if "kernels" in s:
        lines += ["## Kernels of the compiled FNO step (entry instructions by opcode)", ""]
        lines += [f"- {'x'.join(map(str, k['grid']))}, batch {k['batch']}: " + "; ".join(
            f"{name}: {k[name]}" for name in ("parop serial", "plain JAX FNO")) for k in s["kernels"]]
        lines += [""]
    if "memory" in s:
        rows = []
        for r in s["memory"]:
            model = f"batch {r['batch']}, {'x'.join(map(str, r['grid']))}, width {r['width']}"
            if r.get("peak_bytes") is None:
                rows.append([model, r["remat"], fmt_bytes(r.get("predicted_bytes")), "–", "–", "–", r.get("error", "")])
                continue
            m = r["memory"]
            step = r["peak_bytes"] - (r["in_use_before"] - m["arguments"])  # less what was not the step's
            outside = r["peak_bytes"] - r["in_use_before"] - m["temporaries"] - m["outputs"]
            rows.append([model, r["remat"], fmt_bytes(r["predicted_bytes"]), fmt_bytes(r["peak_bytes"]),
                         fmt_bytes(step), f"{step / r['predicted_bytes']:.3f}", fmt_bytes(outside)])
        lines += ["## Dry run against the real step's memory", "",
                  "The step's peak is the allocator's peak less what was in use before the step but is none "
                  "of its arguments (the complex parameters the step's closure keeps); beyond XLA's buffers "
                  "is the peak less what was in use before, the temporaries and the outputs.", "", table(
                      ["model", "remat", "dry run (per device)", "allocator peak", "the step's peak",
                       "step / dry run", "beyond XLA's buffers"], rows), ""]
    if "tests" in s:
        t = s["tests"]
        lines += ["## Tests on the GPU", "", f"`pytest -k 'not ({NEEDS_DEVICES})' {' '.join(TESTS)}`: "
                  f"{t.get('summary', t.get('skipped'))}", ""]
        lines += [f"- {f}" for f in t.get("failed", [])]
        if t.get("needs_devices"):
            lines += [f"{len(t['needs_devices'])} of the failures are tests of several devices (one GPU here):", ""]
            lines += [f"- {f}" for f in t["needs_devices"]]
    return "\n".join(lines) + "\n"


def render(paths: list[str]) -> str:
    """The markdown of earlier runs' `gpu.json` files, one after the other."""
    return "\n".join(markdown(json.loads(Path(p).read_text())) for p in paths)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short timing: a smoke test")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu-results"), help="folder for gpu.json, gpu.md")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run; the tests first, in half of it")
    p.add_argument("--skip", nargs="*", default=[], choices=["fft", "fno", "neuralop", "kernels", "memory", "tests"])
    p.add_argument("--render", nargs="+", metavar="JSON", help="print the tables of earlier runs' gpu.json, run nothing")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.render:
        print(render(args.render))
        return 0
    if args.memory_probe:
        print("PROBE " + json.dumps(memory_probe(json.loads(args.memory_probe))), flush=True)
        return 0
    start = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - start)  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, args.quick)
    report.data["machine"]["jax_default_matmul_precision"] = jax.config.jax_default_matmul_precision
    log(f"parop on {report.data['machine']['devices']} ({jax.default_backend()}), jax {jax.__version__}")
    rates = copy_bandwidth(args.quick)
    report.add("bandwidth", rates)
    bandwidth = max(rates.values())
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s ({rates})")
    layers = LAYERS[args.quick]
    cases = [{"grid": list(g), "width": w, "modes": list(m), "batch": b, "layers": layers}
             for g, w, m, b in FNO_CASES[args.quick]]

    def ffts():
        report.add("fft", fft_rows(args.quick, bandwidth))

    def fno_timings():
        fno = []
        for case in cases:
            if left() < 150:
                log(f"  fno {case}: skipped, {left():.0f} s left")
                continue
            g = fno_group(case)
            log(f"  fno {g.problem}")
            run_group(g, **TIMING[args.quick], log=log)
            plain = g.results[g.yardstick].median
            rows = [{"candidate": r[2], "median_s": g.results[r[2]].median, "check": r[6], "note": r[7],
                     "ratio": g.results[r[2]].median / plain if g.results[r[2]].median and plain else None}
                    for r in timing_rows([g])]
            fno.append({"problem": g.problem, "case": case, "rows": rows})
            report.add("fno", fno)
            del g
            jax.clear_caches()
        if "neuralop" in args.skip or not fno:
            return
        for f, both in zip(fno, neuralop_times([f["case"] for f in fno], args.quick, timeout=max(60.0, left() - 90))):
            f["neuralop"] = both
            f["rows"] += neuralop_rows(both, next(r["median_s"] for r in f["rows"] if r["candidate"] == "plain JAX FNO"))
        report.add("fno", fno)

    def memory():
        specs = [dict(case, remat=remat) for case in cases[:2] for remat in (False, True)]
        report.add("memory", memory_rows(specs, timeout=max(30.0, min(120.0, left() / 3))))

    sections = {"tests": lambda: report.add("tests", run_tests(out, left() / 2)), "fft": ffts, "fno": fno_timings,
                "kernels": lambda: report.add("kernels", [dict(case, **kernels(case)) for case in cases]),
                "memory": memory}
    for name, run in sections.items():
        if name not in args.skip:
            report.attempt(name, run)
            log(f"{name} done ({time.perf_counter() - start:.0f} s)")

    report.data["elapsed_s"] = time.perf_counter() - start
    report.save()
    text = markdown(report.data)
    (out / "gpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
