"""Case c of `benchmarks/run.py`: channel mixing with a batch axis.

`kron(Matrix(c, c), Identity(n), Identity(n))` on `(c, n, n, b)` split (1, 2, 4, 1):
apply, and the gradient of a sum of squares with respect to the weight, against a hand
`einsum` in the same `shard_map` (the yardstick) and `jit(einsum)` on the sharded arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import parop as po

from ._harness import Candidate, Group, Run


def groups(run: Run) -> list[Group]:
    c, n, b = (32, 32, 8) if run.quick else (64, 64, 8)
    partition = (1, 2, 4, 1)
    op = po.kron(po.Matrix(c, c, name="mix"), po.Identity(n), po.Identity(n))
    D = po.distribute(op, partition)
    θ = po.init(D, jax.random.key(0))
    x = np.random.default_rng(1).standard_normal((c, n, n, b), dtype=np.float32)
    xs = jax.device_put(x, D.in_sharding)
    mesh, x_spec = D.mesh, D.in_sharding.spec
    w_hand = jax.device_put(np.asarray(θ["mix"]), NamedSharding(mesh, P()))
    W64, x64 = np.asarray(θ["mix"], np.float64), x.astype(np.float64)
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
    program = jax.jit(lambda θ, x: D(θ) @ x).lower(θ, xs).compile()  # parop's program, called without `D(θ) @`

    apply = Group("c", problem + ": apply", [
        Candidate("parop", lambda: D(θ) @ xs),
        Candidate("parop program only", lambda: program(θ, xs),
                  note="jax.jit(lambda θ, x: D(θ) @ x).lower(θ, x).compile() called: parop's program without "
                       "`D(θ) @`"),
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
        run.hlo.add(problem + ": apply", "parop", program, plan=D.plan_for((b,)))
        run.hlo.add(problem + ": apply", "hand shard_map einsum", hand_apply.lower(w_hand, xs).compile())

    def after_grad(g):
        run.hlo.add(problem + ": grad", "parop", parop_grad.lower(θ, xs).compile())
        run.hlo.add(problem + ": grad", "hand shard_map einsum", hand_grad.lower(w_hand, xs).compile())

    apply.after, grad.after = after_apply, after_grad
    return [apply, grad]
