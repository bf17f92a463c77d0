"""Case d of `benchmarks/run.py`: one jitted Adam training step of the FNO.

parop distributed (with the default cost model, and with collectives free to start,
`latency_bytes=0`) vs parop serial vs the same FNO in plain JAX (the yardstick,
`benchmarks/plain_fno.py`), all from the same parameters and batch; the Darcy protocol's
2-D model and a 3-D one (a small 2-D model in quick mode).
"""

from __future__ import annotations

import jax
import numpy as np
import optax

import parop as po
from parop.nn import FNO, as_real, relative_l2
from parop.nn.train import make_step

from . import plain_fno
from ._harness import Candidate, Group, Run


def groups(run: Run) -> list[Group]:
    configs = [  # (grid, width, modes, batch, partition)
        ((16, 16), 8, (8, 8), 4, (1, 1, 2, 4)),
    ] if run.quick else [
        ((32, 32), 32, (12, 12), 20, (1, 1, 2, 4)),
        ((24, 24, 24), 16, (8, 8, 8), 10, (1, 1, 2, 2, 2)),
    ]
    layers = 1 if run.quick else 4
    return [_group(*config, layers) for config in configs]


def _group(grid, width, modes, batch, partition, layers) -> Group:
    model = FNO(grid, width=width, modes=modes, layers=layers)
    dist = model.distribute(partition, batch=batch)
    by_bytes = model.distribute(partition, cost=po.CostModel(latency_bytes=0), batch=batch)  # collectives free to start
    θ = model.init(jax.random.key(0))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((batch, 1) + grid, dtype=np.float32)
    u = rng.standard_normal((batch, 1) + grid, dtype=np.float32)
    ad, ud = (jax.device_put(v, dist.in_sharding) for v in (a, u))
    optimizer = optax.adam(1e-3)

    def parop_step(m):
        θm = jax.device_put(θ, m.param_shardings()) if m.distributed else θ  # m.init(key), placed as it places them
        step = make_step(lambda θ, x, y: relative_l2(m.apply(θ, x), y), optimizer, θm)
        θr = as_real(θm)
        state = optimizer.init(θr)
        return lambda x, y: step(θr, state, x, y)[2]

    plain = plain_fno.params_from_parop(θ, layers)
    plain_loss = lambda p, x, y: relative_l2(plain_fno.apply(p, x[:, 0])[:, None], y)  # noqa: E731
    plain_step = make_step(plain_loss, optimizer)
    plain_state = optimizer.init(plain)

    serial, distributed, bytes_only = parop_step(model), parop_step(dist), parop_step(by_bytes)
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
