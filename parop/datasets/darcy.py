"""Darcy flow in 2-D and 3-D, generated in code (no download).

The problem of Li et al. 2020, *Fourier Neural Operator for Parametric Partial
Differential Equations*, in `d = 2` or `3` dimensions:

$$-\\nabla\\cdot\\big(a(x)\\,\\nabla u(x)\\big) = 1 \\quad\\text{on } (0,1)^d,
\\qquad u = 0 \\text{ on the boundary}.$$

The coefficient `a` is a thresholded Gaussian random field: `a = 12` where the
field is `>= 0` and `a = 3` elsewhere. The field has covariance
`(-Δ + τ²I)^(-α)` with `τ = 3` and `α = 1 + d/2`, sampled in the cosine
(Neumann) eigenbasis of the Laplacian: mode `k = (k1, ..., kd)` gets a standard
normal weight times `τ^(α - d/2) (π²|k|² + τ²)^(-α/2)`; the constant mode is
dropped so the field has zero mean. In 2-D this is Li et al.'s `α = 2`.

Why `α = 1 + d/2` (2.5 in 3-D) rather than Li et al.'s `α = 2`: the exponent
that sets what a sample looks like is `α - d/2`. The samples lie in the Sobolev
space `H^r` for every `r < α - d/2`, and the share of the field's variance
carried by wavenumbers above a cut-off `K` decays like `K^(d - 2α)`. Keeping
`α - d/2 = 1` gives the 3-D fields the smoothness of the 2-D data set and the
same `K^(-2)` tail, so the 12/3 interfaces look alike at every resolution. With
`α = 2` in 3-D the tail would decay only like `1/K`: the fields would be
rough, and their texture would change with the grid that samples them.

The equation is discretised with the conservative `(2d + 1)`-point
finite-difference scheme (5-point in 2-D, 7-point in 3-D) on a grid of `s^d`
nodes `x_i = i / (s - 1)` that includes the boundary, so there are `(s - 2)^d`
unknowns. The coefficient on the face between two neighbouring nodes is the
**harmonic** mean of the two node values (the exact effective conductivity of
two layers in series, the usual choice for a coefficient that jumps). The
symmetric positive-definite system is solved with a matrix-free, batched,
jitted conjugate-gradient method with a Jacobi preconditioner. The field
sampler, the stencil and the solver are each written once for any `d`.
"""

from __future__ import annotations

from functools import partial
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import int_at_least, is_int

__all__ = ["darcy_blocks", "darcy_flow"]

_TAU = 3.0
_A_HIGH = 12.0
_A_LOW = 3.0
_DIMS = (2, 3)

# Grid nodes solved per jitted call: bounds memory at large resolutions. The
# samples are split into chunks of equal size (the last one padded), so every
# call has the same shape (one compilation).
_NODES_PER_CHUNK = 1 << 22


def darcy_flow(
    n_samples: int,
    resolution: int = 32,
    *,
    dim: int = 2,
    seed: int = 0,
    dtype=jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """Sample coefficient fields `a` and solve the Darcy equation for `u`.

    Args:
        n_samples: number of `(a, u)` pairs.
        resolution: `s`, the number of grid nodes per side, boundary included
            (the grid spacing is `1 / (s - 1)`). At least 3.
        dim: the dimension of the domain, 2 (the unit square) or 3 (the unit
            cube).
        seed: seed of the random fields; the same seed always gives the same
            fields (bit-identical for a given JAX precision setting).
        dtype: dtype of the returned arrays. The solve itself runs in float64
            when `jax_enable_x64` is on and in float32 otherwise; either way it
            stops at a relative residual of `1e-6` in float32 and `1e-12` in
            float64.

    Returns:
        `(a, u)`, each of shape `(n_samples,) + (resolution,) * dim`: `a` takes
        only the values 3 and 12, and `u` is zero on the boundary nodes.

    Raises:
        TypeError: `n_samples`, `resolution`, `dim` or `seed` is not an integer.
        ValueError: `n_samples < 1`, `resolution < 3`, `dim` not 2 or 3, or
            `seed < 0`.

    The coefficient fields are drawn with NumPy's `default_rng(seed)` in
    float64, so `a` does not depend on the x64 setting; `u` does only through
    the precision of the solve.

    Cost on 2 CPU cores in float32, compilation included: 1,000 samples at
    32 x 32 take about 0.9 s, of which about 0.55 s is the one-off compilation
    (0.35 s on later calls; 0.7 s with x64 on); CG needs about 100 iterations.
    In 3-D, 500 samples take about 3.5 s at 24³ and 7 s at 32³ (90 and 120 CG
    iterations; the fields themselves 0.4 s and 1.6 s), and about three times
    as long with x64 on.

    Example:
        ```python
        >>> from parop.datasets import darcy_flow
        >>> a, u = darcy_flow(100, 32, seed=0)
        >>> a.shape, u.shape
        ((100, 32, 32), (100, 32, 32))
        >>> a3, u3 = darcy_flow(4, 12, dim=3, seed=0)
        >>> u3.shape
        (4, 12, 12, 12)
        ```
    """
    n_samples, resolution, dim, seed = checked("darcy_flow", n_samples, resolution, dim, seed)
    blocks = _blocks(n_samples, resolution, dim, seed, dtype, 0, n_samples)
    a_pieces, u_pieces = zip(*((a, u) for _, a, u in blocks))
    return jnp.concatenate(a_pieces), jnp.concatenate(u_pieces)


def darcy_blocks(n_samples: int, resolution: int = 32, *, dim: int = 2, seed: int = 0, dtype=jnp.float32,
                 start: int = 0, stop: int | None = None) -> Iterator[tuple[int, jax.Array, jax.Array]]:
    """The samples `start` to `stop` of `darcy_flow(n_samples, resolution, dim=dim,
    seed=seed, dtype=dtype)`, made a block at a time: yields `(first, a, u)`, the
    block's first sample and its fields. At most about 4M grid nodes are solved at
    once, so memory stays bounded however many samples there are; the fields of the
    samples before `start` are drawn (the random stream is sequential) and dropped.

    ```python
    >>> [(first, a.shape) for first, a, u in darcy_blocks(10, 16, start=4, stop=10)]
    [(4, (6, 16, 16))]
    ```
    """
    n_samples, resolution, dim, seed = checked("darcy_blocks", n_samples, resolution, dim, seed)
    stop = n_samples if stop is None else stop
    if not (is_int(start) and is_int(stop) and 0 <= start < stop <= n_samples):
        raise ValueError(f"darcy_blocks: need 0 <= start < stop <= n_samples={n_samples}, got start={start}, "
                         f"stop={stop}")

    return _blocks(n_samples, resolution, dim, seed, dtype, int(start), int(stop))


def _blocks(n_samples: int, resolution: int, dim: int, seed: int, dtype, start: int,
            stop: int) -> Iterator[tuple[int, jax.Array, jax.Array]]:
    """`darcy_blocks` after its checks (a generator runs nothing until its first item)."""
    x64 = bool(jax.config.jax_enable_x64)
    solve_dtype = jnp.float64 if x64 else jnp.float32
    tol = 1e-12 if x64 else 1e-6
    # CG needs at most n_unknowns steps in exact arithmetic; rounding can
    # stretch that, so leave headroom. The loop stops as soon as every sample
    # in the chunk has converged, so the cap is rarely reached.
    max_iter = 4 * (resolution - 2) ** dim + 100

    max_chunk = max(1, _NODES_PER_CHUNK // resolution**dim)
    n_chunks = -(-(stop - start) // max_chunk)
    chunk = -(-(stop - start) // n_chunks)

    # One generator for all chunks: its stream, hence `a`, does not depend on
    # the chunking. Each sample's solve is independent of the others in its chunk.
    rng = np.random.default_rng(seed)
    for skip in range(0, start, max_chunk):
        rng.standard_normal((min(max_chunk, start - skip),) + (resolution,) * dim)
    for first in range(start, stop, chunk):
        n_real = min(chunk, stop - first)
        a_np = _coefficient_fields(rng, n_real, resolution, dim)
        # Pad with copies of a valid field, dropped below.
        padded = np.concatenate([a_np, np.repeat(a_np[:1], chunk - n_real, axis=0)])
        u_chunk = _solve(jnp.asarray(padded, solve_dtype), tol, max_iter)
        yield first, jnp.asarray(a_np, dtype), u_chunk[:n_real].astype(dtype)


def checked(where: str, n_samples, resolution, dim, seed) -> tuple[int, int, int, int]:
    """A data set's `(n_samples, resolution, dim, seed)` as Python ints (NumPy integers
    taken too), or a `TypeError` or `ValueError` naming `where`, the argument and its
    value.

    >>> checked("darcy_flow", np.int64(4), 32, 2, 0)
    (4, 32, 2, 0)"""
    n_samples = int_at_least(n_samples, 1, "n_samples", where)
    resolution = int_at_least(resolution, 3, "resolution", where)
    dim, seed = int_at_least(dim, 0, "dim", where), int_at_least(seed, 0, "seed", where)
    if dim not in _DIMS:
        raise ValueError(f"{where}: dim must be one of {_DIMS}, got {dim}")
    return n_samples, resolution, dim, seed


def _coefficient_fields(rng: np.random.Generator, n: int, s: int, dim: int) -> np.ndarray:
    """`n` thresholded GRF samples drawn from `rng`: `(n,) + (s,) * dim` float64 3s and 12s."""
    alpha = 1.0 + dim / 2
    k = np.arange(s)
    k_squared = sum(np.ix_(*[k**2] * dim))  # |k|² on the (s,) * dim grid of modes
    sqrt_eig = _TAU ** (alpha - dim / 2) * (np.pi**2 * k_squared + _TAU**2) ** (-alpha / 2)
    sqrt_eig[(0,) * dim] = 0.0

    field = sqrt_eig * rng.standard_normal((n,) + (s,) * dim)
    # Cosine eigenfunctions evaluated at the nodes, basis[i, k] = cos(pi k x_i),
    # summed over the modes one axis at a time (the basis is separable).
    basis = np.cos(np.pi * np.outer(np.linspace(0.0, 1.0, s), k))
    for axis in range(1, dim + 1):
        field = np.moveaxis(np.tensordot(basis, field, axes=(1, axis)), 0, axis)
    return np.where(field >= 0.0, _A_HIGH, _A_LOW)


def _along(x: jax.Array, axis: int, index: slice) -> jax.Array:
    """`x` indexed by `index` on `axis` only."""
    return x[(slice(None),) * axis + (index,)]


def _face_coefficients(a: jax.Array) -> list[jax.Array]:
    """Harmonic means of `a` on the faces between neighbouring nodes, one array per spatial axis.

    `a` is `(batch,) + (s,) * d`. The array for axis `j` holds the faces between
    nodes `i` and `i + 1` along `j`, at the interior nodes of the other spatial
    axes (the only faces the interior equations use): it is `s - 1` long on
    axis `j` and `s - 2` on the others.
    """
    faces = []
    for axis in range(1, a.ndim):
        inner = a[(slice(None),) + tuple(slice(None) if j == axis else slice(1, -1) for j in range(1, a.ndim))]
        lo, hi = _along(inner, axis, slice(None, -1)), _along(inner, axis, slice(1, None))
        faces.append(2.0 * hi * lo / (hi + lo))
    return faces


def _apply_operator(faces: list[jax.Array], v: jax.Array) -> jax.Array:
    """`h² A v` for interior values `v` of shape `(batch,) + (s - 2,) * d`; zero boundary."""
    divergence = []
    for axis, k in enumerate(faces, start=1):
        widths = [(1, 1) if j == axis else (0, 0) for j in range(v.ndim)]
        flux = k * jnp.diff(jnp.pad(v, widths), axis=axis)  # s - 1 long on `axis`
        divergence.append(jnp.diff(flux, axis=axis))
    return -sum(divergence)


@partial(jax.jit, static_argnames=("tol", "max_iter"))
def _solve(a: jax.Array, tol: float, max_iter: int) -> jax.Array:
    """Jacobi-preconditioned CG for a batch of coefficient fields; returns `u` on all nodes.

    `a` is `(batch,) + (s,) * d` for any `d >= 1`.
    """
    n, s = a.shape[:2]
    dim = a.ndim - 1
    spatial = tuple(range(1, a.ndim))
    h2 = (1.0 / (s - 1)) ** 2
    faces = _face_coefficients(a)
    inv_diag = 1.0 / sum(
        _along(k, axis, part)
        for axis, k in zip(spatial, faces)
        for part in (slice(None, -1), slice(1, None))
    )
    # Scaled by h² so the matrix entries are O(a): keeps float32 well inside range.
    b = jnp.full((n,) + (s - 2,) * dim, h2, a.dtype)

    def dot(p: jax.Array, q: jax.Array) -> jax.Array:
        return jnp.sum(p * q, axis=spatial)

    def per_sample(c: jax.Array) -> jax.Array:
        return c.reshape((n,) + (1,) * dim)

    b_norm2 = dot(b, b)
    tol2 = (tol**2) * b_norm2

    x = jnp.zeros_like(b)
    r = b
    z = inv_diag * r
    p = z
    rz = dot(r, z)
    r_norm2 = b_norm2

    def cond(state):
        k, _, _, _, _, r_norm2 = state
        return (k < max_iter) & jnp.any(r_norm2 > tol2)

    def body(state):
        k, x, r, p, rz, r_norm2 = state
        ap = _apply_operator(faces, p)
        # Converged samples are frozen (alpha = 0) while the rest of the batch
        # iterates: the loop runs until the slowest sample has converged.
        active = r_norm2 > tol2
        alpha = per_sample(jnp.where(active, rz / dot(p, ap), 0.0))
        x = x + alpha * p
        r = r - alpha * ap
        z = inv_diag * r
        rz_new = dot(r, z)
        beta = per_sample(jnp.where(active, rz_new / rz, 0.0))
        p = jnp.where(per_sample(active), z + beta * p, p)
        return k + 1, x, r, p, jnp.where(active, rz_new, rz), dot(r, r)

    state = (jnp.asarray(0), x, r, p, rz, r_norm2)
    _, x, _, _, _, _ = jax.lax.while_loop(cond, body, state)
    return jnp.pad(x, [(0, 0)] + [(1, 1)] * dim)
