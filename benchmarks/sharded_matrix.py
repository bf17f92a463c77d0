"""Case g of `benchmarks/run.py`: a large `Matrix` with its input split 8 ways.

`kron(Matrix(m, n), Identity(b))` on `(n, b)` split (8, 1): the value and weight gradient
of a sum of squares with the weight replicated (the activations move) vs sharded
(row-parallel, `psum_scatter`), the bytes of each plan next to the times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import parop as po

from ._harness import Candidate, Group, Run


def groups(run: Run) -> list[Group]:
    m = n = 256 if run.quick else 1024
    b = 64
    op = po.kron(po.Matrix(m, n, name="w"), po.Identity(b))
    x = np.random.default_rng(4).standard_normal((n, b), dtype=np.float32)
    rows = []
    candidates = []
    for sharded in (False, True):
        D = po.distribute(op, (8, 1), shard_weights=sharded)
        θ = po.init(D, jax.random.key(0))
        xs = jax.device_put(x, D.in_sharding)
        grad = jax.jit(jax.value_and_grad(lambda θ, x, D=D: jnp.sum(jnp.square(D(θ) @ x))))
        name = "parop, sharded weight (row-parallel)" if sharded else "parop, replicated weight (activations move)"
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
