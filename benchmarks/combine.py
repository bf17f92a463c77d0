"""Data moved between layouts on one mesh: two operators distributed apart, laid out
differently, then combined (parop's combination: a planned repartition between the
programs), and an output whose mesh axes trade tensor axes (parop's plan deals blocks
anew with a `ppermute`), each against the same programs with the move left to XLA,
side by side in one run.

    python -m benchmarks.combine [--quick]

`D1 = po.distribute(DFT(n) ⊗ Matrix(n, n), P("a", "b"))` and
`D2 = po.distribute(Matrix(n, n) ⊗ DFT(n), P(None, ("a", "b")))` on a (2, 4) mesh of 8
forced CPU devices, complex64, inputs `n x n`:

- **sum**: `(D1 + D2) @ x` (parop moves `x` to D2's layout and D2's output to D1's) against
  `D1 @ x + D2 @ x` (jnp's `+` of the two outputs: XLA picks where to add them);
- **product**: `(D2 @ D1) @ x` (parop moves D1's output to D2's layout) against
  `D2 @ (D1 @ x)` (XLA moves it as D2's program takes its input);
- **trade**: `DFT(4)` on axis 0 of a `4 x n²/4` tensor (a batch of small DFTs) from
  `P("b", "a")` to `P("a", "b")`: axis 0 holds one mesh axis at a time and the DFT needs
  it whole, so parop's plan is an `all_to_all`, the DFTs, a `ppermute` and an
  `all_to_all`, against the plan that ends where it starts, then XLA's move to
  `P("a", "b")` (`with_sharding_constraint`).

Each candidate is jitted; its result is checked against NumPy in float64, its
collectives and the bytes each device sends are read from the compiled HLO, and the
candidates are timed in alternating rounds (each call awaited), the median shown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import parop as po  # noqa: E402
from benchmarks._harness import fmt_bytes, fmt_time, rel_error, table  # noqa: E402
from parop.distributed.hlo import collectives  # noqa: E402


def problems(n: int) -> list[tuple[str, list[tuple[str, object]], np.ndarray, tuple]]:
    """`(problem, [(candidate, jitted f(θ, x))], reference, (θ, x))` for the sum, the
    product and the trade."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    op1 = po.kron(po.DFT(n), po.Matrix(n, n, "complex64", name="w"))
    op2 = po.kron(po.Matrix(n, n, "complex64", name="v"), po.DFT(n))
    D1 = po.distribute(op1, P("a", "b"), mesh=mesh)
    D2 = po.distribute(op2, P(None, ("a", "b")), mesh=mesh)
    rng = np.random.default_rng(0)
    draw = lambda *shape: (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    θ = {"w": jnp.asarray(draw(n, n)), "v": jnp.asarray(draw(n, n))}
    x = draw(n, n)
    F = np.fft.fft(np.eye(n))
    W, V, x64 = (np.asarray(a, np.complex128) for a in (θ["w"], θ["v"], x))
    y1 = F @ x64 @ W.T  # (DFT ⊗ W) x
    traded = po.distribute(po.DFT(4), P("b", "a"), mesh=mesh, out_partition=P("a", "b"), batch_shape=(n * n // 4,))
    staying = po.distribute(po.DFT(4), P("b", "a"), mesh=mesh, batch_shape=(n * n // 4,))
    out = NamedSharding(mesh, P("a", "b"))
    batch = draw(4, n * n // 4)
    return [
        (f"sum {n}x{n}",
         [("parop: (D1 + D2) @ x", jax.jit(lambda θ, x: (D1 + D2)(θ) @ x)),
          ("XLA: D1 @ x + D2 @ x", jax.jit(lambda θ, x: D1(θ) @ x + D2(θ) @ x))],
         y1 + V @ x64 @ F.T, (θ, jnp.asarray(x))),
        (f"product {n}x{n}",
         [("parop: (D2 @ D1) @ x", jax.jit(lambda θ, x: (D2 @ D1)(θ) @ x)),
          ("XLA: D2 @ (D1 @ x)", jax.jit(lambda θ, x: D2(θ) @ (D1(θ) @ x)))],
         V @ y1 @ F.T, (θ, jnp.asarray(x))),
        (f"trade 4x{n * n // 4}",
         [("parop: D @ x", jax.jit(lambda θ, x: traded @ x)),
          ("XLA: D0 @ x, then moved", jax.jit(lambda θ, x: jax.lax.with_sharding_constraint(staying @ x, out)))],
         np.fft.fft(np.asarray(batch, np.complex128), axis=0), (θ, jnp.asarray(batch))),
    ]


def measure(n: int, rounds: int) -> list[dict]:
    """A row per candidate: `problem`, `candidate`, `counts` (the HLO's collectives by
    kind), `sent_bytes` (per device per call), `median` (seconds), `ratio` (to parop's)
    and `error` (against NumPy)."""
    rows = []
    for problem, candidates, want, args in problems(n):
        found = [dict(problem=problem, candidate=name, error=rel_error(f(*args), want),
                      **collectives(f.lower(*args).compile().as_text()), times=[]) for name, f in candidates]
        for _ in range(rounds):  # alternating, each call awaited
            for row, (_, f) in zip(found, candidates):
                start = time.perf_counter()
                jax.block_until_ready(f(*args))
                row["times"].append(time.perf_counter() - start)
        for row in found:
            row["median"] = statistics.median(row.pop("times"))
            row["ratio"] = row["median"] / found[0]["median"]
        rows += found
    return rows


def markdown(rows: list[dict]) -> str:
    return table(["problem", "candidate", "collectives (HLO)", "sent per device", "median", "ratio", "error"],
                 [[r["problem"], r["candidate"], ", ".join(f"{k} {v}" for k, v in r["counts"].items() if v),
                   fmt_bytes(r["sent_bytes"]), fmt_time(r["median"]), f"{r['ratio']:.2f}", f"{r['error']:.1e}"]
                  for r in rows])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small size and few rounds: a smoke test")
    args = parser.parse_args(argv)
    n, rounds = (16, 5) if args.quick else (512, 41)
    print(markdown(measure(n, rounds)))


if __name__ == "__main__":
    main()
