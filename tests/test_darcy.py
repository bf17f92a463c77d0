"""Tests of the generated Darcy flow data set, in 2-D and 3-D."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sparse
import scipy.sparse.linalg as sparse_linalg

from parop.datasets import darcy, darcy_blocks, darcy_flow

# (dim, resolution, samples) small enough to keep the tests fast.
SMALL = {2: (24, 4), 3: (10, 3)}


def _stencil_matrix(a: np.ndarray) -> sparse.csr_matrix:
    """The (2d+1)-point matrix of -div(a grad u) on the interior nodes, harmonic face means.

    Built node by node: each interior node exchanges the flux `k (u_node - u_nb)`
    with its 2d neighbours, `k` the harmonic mean of `a` at the two nodes; a
    neighbour on the boundary contributes to the diagonal only (u = 0 there).
    """
    s, dim = a.shape[0], a.ndim
    interior = list(itertools.product(range(1, s - 1), repeat=dim))
    number = {node: i for i, node in enumerate(interior)}
    rows, cols, vals = [], [], []
    for node in interior:
        for axis, step in itertools.product(range(dim), (-1, 1)):
            neighbour = node[:axis] + (node[axis] + step,) + node[axis + 1 :]
            k = 2 * a[node] * a[neighbour] / (a[node] + a[neighbour])
            rows.append(number[node]), cols.append(number[node]), vals.append(k)
            if neighbour in number:
                rows.append(number[node]), cols.append(number[neighbour]), vals.append(-k)
    n = len(interior)
    return sparse.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr() * (s - 1) ** 2


def _series_solution(s: int, dim: int, terms: int) -> np.ndarray:
    """The exact solution of -Δu = 1 on (0, 1)^d, u = 0 on the boundary, at the nodes.

    From the sine series of 1 = Π (4/π) Σ_{k odd} sin(π k x_i) / k:
    u = Σ_{k odd} (4/π)^d / (π² |k|²) Π sin(π k_i x_i) / k_i, with `terms` odd
    wavenumbers per axis.
    """
    k = np.arange(1, 2 * terms, 2)
    sines = np.sin(np.pi * np.outer(np.linspace(0.0, 1.0, s), k)) / k
    coefficients = (4 / np.pi) ** dim / np.pi**2 / sum(np.ix_(*[k**2] * dim))
    subscripts = {2: "ia,jb,ab->ij", 3: "ia,jb,kc,abc->ijk"}[dim]
    return np.einsum(subscripts, *[sines] * dim, coefficients, optimize=True)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("dim", [2, 3])
def test_matches_direct_solve(dim, x64):
    s, n = SMALL[dim]
    dtype = jnp.float64 if x64 else jnp.float32
    with jax.enable_x64(x64):
        a, u = darcy_flow(n, s, dim=dim, seed=3, dtype=dtype)
        assert u.dtype == dtype
    for a_i, u_i in zip(np.asarray(a, np.float64), np.asarray(u, np.float64)):
        matrix = _stencil_matrix(a_i)
        reference = sparse_linalg.spsolve(matrix.tocsc(), np.ones(matrix.shape[0]))
        interior = u_i[(slice(1, -1),) * dim].ravel()
        error = np.linalg.norm(interior - reference) / np.linalg.norm(reference)
        assert error < (1e-10 if x64 else 1e-5), error


@pytest.mark.parametrize("dim", [2, 3])
def test_constant_coefficient_converges_to_the_exact_solution_at_second_order(dim):
    # a ≡ 3: the harmonic face means are 3 and the scheme is the standard
    # (2d+1)-point Laplacian, whose error against -Δu = 1/3 must fall by about 4
    # when h halves (the corners of the domain slow it slightly).
    errors = []
    for s in (9, 17):
        with jax.enable_x64(True):
            u = np.asarray(darcy._solve(jnp.full((1,) + (s,) * dim, 3.0), 1e-12, 10_000))[0]
        exact = _series_solution(s, dim, terms=50) / 3
        errors.append(np.abs(u - exact).max() / exact.max())
    assert errors[1] < 0.01, errors
    assert 3.5 < errors[0] / errors[1] < 4.5, errors


@pytest.mark.parametrize("dim, s, n, u_max", [(2, 20, 16, 0.0737), (3, 12, 8, 0.0562)])
def test_values_boundary_and_shapes(dim, s, n, u_max):
    a, u = darcy_flow(n, s, dim=dim, seed=1)
    assert a.shape == u.shape == (n,) + (s,) * dim
    assert a.dtype == u.dtype == jnp.float32
    assert set(np.unique(np.asarray(a)).tolist()) == {3.0, 12.0}
    u = np.asarray(u)
    for axis, end in itertools.product(range(1, dim + 1), (0, -1)):
        assert np.all(np.take(u, end, axis=axis) == 0.0)
    assert np.all(u[(slice(None),) + (slice(1, -1),) * dim] > 0.0)
    # Sanity of the scale: max u lies between its values for a ≡ 12 and a ≡ 3,
    # `u_max / a` (u_max that of -Δu = 1 on the unit square or cube).
    peaks = u.max(axis=tuple(range(1, dim + 1)))
    assert np.all(peaks > 0.95 * u_max / 12) and np.all(peaks < u_max / 3)


@pytest.mark.parametrize("dim, s, n", [(2, 32, 64), (3, 16, 16)])
def test_fields_are_balanced(dim, s, n):
    a, _ = darcy_flow(n, s, dim=dim, seed=0)
    high_fraction = float(jnp.mean(a == 12.0))
    assert 0.35 < high_fraction < 0.65


@pytest.mark.parametrize("dim, s", [(2, 16), (3, 8)])
def test_seeds(dim, s):
    a1, u1 = darcy_flow(8, s, dim=dim, seed=7)
    a2, u2 = darcy_flow(8, s, dim=dim, seed=7)
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
    np.testing.assert_array_equal(np.asarray(u1), np.asarray(u2))
    a3, u3 = darcy_flow(8, s, dim=dim, seed=8)
    assert not np.array_equal(np.asarray(a1), np.asarray(a3))
    assert not np.array_equal(np.asarray(u1), np.asarray(u3))


@pytest.mark.parametrize("dim, s", [(2, 16), (3, 8)])
def test_chunked_solve_matches_single_call(monkeypatch, dim, s):
    a_whole, u_whole = darcy_flow(8, s, dim=dim, seed=2)
    # At most three samples per chunk: chunks of 3, 3 and 2 padded to 3.
    monkeypatch.setattr(darcy, "_NODES_PER_CHUNK", 3 * s**dim)
    a_chunked, u_chunked = darcy_flow(8, s, dim=dim, seed=2)
    np.testing.assert_array_equal(np.asarray(a_whole), np.asarray(a_chunked))
    scale = float(jnp.max(jnp.abs(u_whole)))
    tol = 1e-12 if u_whole.dtype == jnp.float64 else 1e-6
    np.testing.assert_allclose(np.asarray(u_chunked), np.asarray(u_whole), atol=tol * scale)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_samples": 0}, ValueError, "n_samples must be at least 1, got n_samples=0"),
        ({"resolution": 2}, ValueError, "resolution must be at least 3, got resolution=2"),
        ({"dim": 1}, ValueError, r"dim must be one of \(2, 3\), got 1"),
        ({"dim": 4}, ValueError, "dim must be one of"),
        ({"n_samples": 4.0}, TypeError, r"n_samples must be an int, got n_samples=4.0 \(float\)"),
        ({"resolution": 16.0}, TypeError, "resolution must be an int"),
        ({"dim": 2.0}, TypeError, "dim must be an int"),
        ({"dim": True}, TypeError, "dim must be an int"),
        ({"seed": None}, TypeError, r"seed must be an int, got seed=None"),  # NumPy would draw a fresh seed
        ({"seed": -1}, ValueError, "seed must be at least 0, got seed=-1"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match="^darcy_flow: " + match):
        darcy_flow(**{"n_samples": 4, "resolution": 8, **kwargs})
    with pytest.raises(error, match="^darcy_blocks: " + match):
        darcy_blocks(**{"n_samples": 4, "resolution": 8, **kwargs})


def test_numpy_integers_are_ints():
    a, u = darcy_flow(np.int64(3), np.int32(8), dim=np.int64(2), seed=np.uint8(1))
    b, v = darcy_flow(3, 8, seed=1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(u, v)
