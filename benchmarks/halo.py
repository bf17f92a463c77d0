"""Case j of `benchmarks/run.py`: a 3-D convolution with halo exchanges.

`po.Convolution(16, 16, (3, 3, 3), grid, boundary="zero")` on `(16, *grid)` split
(1, 2, 2, 2) over 8 forced CPU devices: parop's program (a halo exchange of one plane
each way on every split axis, then the local convolution) against the same algorithm
written by hand with `jax.shard_map` + `ppermute` (the yardstick) and against
`jit(lax.conv_general_dilated)` on the sharded input (XLA's partitioner decides).
Every candidate is checked against a float64 NumPy reference (correlation by FFT).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import parop as po

from ._harness import Candidate, Group

DIMENSIONS = ("NCDHW", "OIDHW", "NCDHW")


def _reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Zero-boundary, same-size cross-correlation in float64, through FFTs."""
    c, *grid = x.shape
    k = w.shape[2:]
    padded = [n + m - 1 for n, m in zip(grid, k)]
    axes = (1, 2, 3)
    X = np.fft.rfftn(x.astype(np.float64), padded, axes=axes)
    W = np.fft.rfftn(w[:, :, ::-1, ::-1, ::-1].astype(np.float64), padded, axes=(2, 3, 4))
    full = np.fft.irfftn(np.einsum("oi...,i...->o...", W, X), padded, axes=axes)
    h = [m // 2 for m in k]
    return full[(slice(None),) + tuple(slice(hh, hh + n) for hh, n in zip(h, grid))]


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    """VALID correlation of `x` `(c, *grid)` (extended by the halos) with `w`."""
    return lax.conv_general_dilated(x[None], w, (1, 1, 1), "VALID", dimension_numbers=DIMENSIONS,
                                    precision=lax.Precision.HIGHEST)[0]


def _exchanged(x: jax.Array, axis: int, name: str, devices: int) -> jax.Array:
    """`x` with one plane from each neighbour along `axis` (zeros past the ends)."""
    ring = [(i, i + 1) for i in range(devices - 1)]
    left = lax.ppermute(lax.slice_in_dim(x, x.shape[axis] - 1, x.shape[axis], axis=axis), name, ring)
    right = lax.ppermute(lax.slice_in_dim(x, 0, 1, axis=axis), name, [(j, i) for i, j in ring])
    return jnp.concatenate([left, x, right], axis=axis)


def halo_groups(quick: bool, hlo_row) -> list[Group]:
    n, c = (32, 16) if quick else (64, 16)
    op = po.Convolution(c, c, (3, 3, 3), (n, n, n), boundary="zero", name="w")
    partition = (1, 2, 2, 2)
    D = po.distribute(op, partition)
    mesh = D.mesh
    spec = P(None, "d1", "d2", "d3")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((c, n, n, n), dtype=np.float32)
    w = (rng.standard_normal((c, c, 3, 3, 3)) / np.sqrt(27 * c)).astype(np.float32)
    θ = {"w": jnp.asarray(w)}
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    ws = jax.device_put(w, NamedSharding(mesh, P()))

    def by_hand(x, w):
        for axis, name in zip((1, 2, 3), ("d1", "d2", "d3")):
            x = _exchanged(x, axis, name, 2)
        return _conv(x, w)

    hand = jax.jit(jax.shard_map(by_hand, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    xla = jax.jit(lambda x, w: lax.conv_general_dilated(x[None], w, (1, 1, 1), "SAME", dimension_numbers=DIMENSIONS,
                                                         precision=lax.Precision.HIGHEST)[0])
    problem = f"conv 3³, {c}->{c} channels, {n}³ grid, zero boundary, split {partition}"
    g = Group("j", problem, [
        Candidate("parop", lambda: D(θ) @ xs, note="halo exchange, then the local convolution"),
        Candidate("hand shard_map + ppermute", lambda: hand(xs, ws), note="yardstick"),
        Candidate("jit(conv_general_dilated) sharded", lambda: xla(xs, ws), note="XLA partitioner"),
    ], lambda: _reference(x, w), yardstick="hand shard_map + ppermute", tol=1e-4)
    g.target(f"j {problem}: parop / hand", "parop", "hand shard_map + ppermute", "<=", 1.05)
    g.notes.append(f"{problem}: parop's plan: " + "; ".join(line.strip() for line in D.plan.lines()[2:-3]))

    def after(g):
        run, _ = D.program(())
        hlo_row(problem, "parop", run, (xs, ws), plan=D.plan)
        hlo_row(problem, "hand shard_map + ppermute", hand, (xs, ws))
        hlo_row(problem, "jit(conv_general_dilated) sharded", xla, (xs, ws))

    g.after = after
    return [g]
