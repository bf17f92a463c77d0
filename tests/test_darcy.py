"""Tests of the generated Darcy flow data set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sparse
import scipy.sparse.linalg as sparse_linalg

from parop.datasets import darcy, darcy_flow


def _five_point_matrix(a: np.ndarray) -> sparse.csr_matrix:
    """The 5-point matrix of -div(a grad u) on the interior nodes, harmonic face means."""
    s = a.shape[0]
    m = s - 2
    h2 = (1.0 / (s - 1)) ** 2
    kx = 2 * a[1:, :] * a[:-1, :] / (a[1:, :] + a[:-1, :])  # face (i, j)-(i+1, j)
    ky = 2 * a[:, 1:] * a[:, :-1] / (a[:, 1:] + a[:, :-1])  # face (i, j)-(i, j+1)
    index = np.arange(m * m).reshape(m, m)
    i, j = np.meshgrid(np.arange(1, s - 1), np.arange(1, s - 1), indexing="ij")
    diagonal = kx[i - 1, j] + kx[i, j] + ky[i, j - 1] + ky[i, j]
    rows, cols, vals = [index.ravel()], [index.ravel()], [diagonal.ravel()]
    # Couplings between interior neighbours along x and along y (symmetric).
    for src, dst, k in [
        (index[:-1, :], index[1:, :], kx[1:-1, 1:-1]),
        (index[:, :-1], index[:, 1:], ky[1:-1, 1:-1]),
    ]:
        rows += [src.ravel(), dst.ravel()]
        cols += [dst.ravel(), src.ravel()]
        vals += [-k.ravel(), -k.ravel()]
    matrix = sparse.coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(m * m, m * m)
    )
    return (matrix / h2).tocsr()


def _assert_matches_direct_solve(a: jax.Array, u: jax.Array, rtol: float) -> None:
    for a_i, u_i in zip(np.asarray(a, np.float64), np.asarray(u, np.float64)):
        matrix = _five_point_matrix(a_i)
        reference = sparse_linalg.spsolve(matrix.tocsc(), np.ones(matrix.shape[0]))
        interior = u_i[1:-1, 1:-1].ravel()
        error = np.linalg.norm(interior - reference) / np.linalg.norm(reference)
        assert error < rtol, error


def test_matches_direct_solve_in_current_precision():
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    a, u = darcy_flow(4, 24, seed=3, dtype=dtype)
    assert u.dtype == dtype
    _assert_matches_direct_solve(a, u, 1e-10 if u.dtype == jnp.float64 else 1e-5)


def test_matches_direct_solve_in_float64():
    with jax.enable_x64(True):
        a, u = darcy_flow(4, 24, seed=3, dtype=jnp.float64)
        assert u.dtype == jnp.float64
    _assert_matches_direct_solve(a, u, 1e-10)


def test_values_boundary_and_shapes():
    a, u = darcy_flow(16, 20, seed=1)
    assert a.shape == u.shape == (16, 20, 20)
    assert a.dtype == u.dtype == jnp.float32
    assert set(np.unique(np.asarray(a)).tolist()) == {3.0, 12.0}
    u = np.asarray(u)
    for edge in (u[:, 0, :], u[:, -1, :], u[:, :, 0], u[:, :, -1]):
        assert np.all(edge == 0.0)
    assert np.all(u[:, 1:-1, 1:-1] > 0.0)
    # Sanity of the scale: max u is between that of a = 12 and a = 3 everywhere
    # (about 0.0737 / a for the unit square).
    assert np.all(u.max(axis=(1, 2)) > 0.07 / 12) and np.all(u.max(axis=(1, 2)) < 0.08 / 3)


def test_fields_are_balanced():
    a, _ = darcy_flow(64, 32, seed=0)
    high_fraction = float(jnp.mean(a == 12.0))
    assert 0.35 < high_fraction < 0.65


def test_deterministic_for_a_seed():
    a1, u1 = darcy_flow(8, 16, seed=7)
    a2, u2 = darcy_flow(8, 16, seed=7)
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
    np.testing.assert_array_equal(np.asarray(u1), np.asarray(u2))


def test_different_seeds_differ():
    a1, u1 = darcy_flow(8, 16, seed=0)
    a2, u2 = darcy_flow(8, 16, seed=1)
    assert not np.array_equal(np.asarray(a1), np.asarray(a2))
    assert not np.array_equal(np.asarray(u1), np.asarray(u2))


def test_chunked_solve_matches_single_call(monkeypatch):
    a_whole, u_whole = darcy_flow(7, 16, seed=2)
    # Three samples per chunk: two full chunks and one padded one.
    monkeypatch.setattr(darcy, "_NODES_PER_CHUNK", 3 * 16 * 16)
    a_chunked, u_chunked = darcy_flow(7, 16, seed=2)
    np.testing.assert_array_equal(np.asarray(a_whole), np.asarray(a_chunked))
    scale = float(jnp.max(jnp.abs(u_whole)))
    tol = 1e-12 if u_whole.dtype == jnp.float64 else 1e-6
    np.testing.assert_allclose(np.asarray(u_chunked), np.asarray(u_whole), atol=tol * scale)


@pytest.mark.parametrize("n_samples, resolution", [(0, 32), (4, 2)])
def test_rejects_bad_arguments(n_samples, resolution):
    with pytest.raises(ValueError):
        darcy_flow(n_samples, resolution)
