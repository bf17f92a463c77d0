"""The plain-JAX FNO baseline (`benchmarks/plain_fno.py`) on 1-D, 2-D and 3-D grids,
against a float64 NumPy forward pass that picks the kept modes by index arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

plain = pytest.importorskip("benchmarks.plain_fno")

# (grid, modes): odd and even sizes and mode counts, a full axis kept whole (3-D,
# first axis) and the whole real-FFT half kept (2-D, 10 // 2 + 1 = 6).
CASES = [((12,), (5,)), ((8, 10), (5, 6)), ((3, 8, 7), (3, 4, 3))]


def _kept(grid: tuple[int, ...], modes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Indices of the kept frequencies: both ends of each full axis, the start of the last."""
    full = [np.r_[0 : (m + 1) // 2, n - m // 2 : n] for n, m in zip(grid[:-1], modes[:-1])]
    return np.ix_(*full, np.arange(modes[-1]))


def _spectral_conv(weight: np.ndarray, h: np.ndarray) -> np.ndarray:
    grid, modes = h.shape[2:], weight.shape[2:-1]
    axes = tuple(range(2, h.ndim))
    kept = (slice(None), slice(None)) + _kept(grid, modes)
    low = np.fft.rfftn(h, axes=axes)[kept]
    spectrum = np.zeros(h.shape[:2] + grid[:-1] + (grid[-1] // 2 + 1,), complex)
    spectrum[kept] = np.einsum("oi...,bi...->bo...", weight[..., 0] + 1j * weight[..., 1], low)
    return np.fft.irfftn(spectrum, s=grid, axes=axes)


def _apply(params: dict, a: np.ndarray) -> np.ndarray:
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    grid = a.shape[1:]
    gelu = lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2)))  # noqa: E731

    def dense(layer, h):
        return np.einsum("oc,bc...->bo...", layer["w"], h) + layer["b"][(slice(None),) + (None,) * len(grid)]

    coordinates = np.stack(np.meshgrid(*[np.linspace(0, 1, n) for n in grid], indexing="ij"))
    h = np.concatenate([a[:, None], np.broadcast_to(coordinates, (len(a),) + coordinates.shape)], axis=1)
    h = dense(p["lift"], h)
    for i, layer in enumerate(p["layers"]):
        h = _spectral_conv(layer["spectral"], h) + dense(layer["skip"], h)
        h = gelu(h) if i < len(p["layers"]) - 1 else h
    return dense(p["proj2"], gelu(dense(p["proj1"], h)))[:, 0]


@pytest.mark.parametrize("grid, modes", CASES, ids=["1d", "2d", "3d"])
def test_forward_matches_numpy(grid, modes):
    params = plain.init_params(jax.random.key(0), width=6, n_layers=2, modes=modes, projection_width=8)
    a = np.random.default_rng(0).standard_normal((2,) + grid).astype(np.float32)
    got = jax.jit(plain.apply)(params, jnp.asarray(a))
    assert got.shape == a.shape and got.dtype == jnp.float32
    want = _apply(params, a.astype(np.float64))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_two_d_spelling_of_the_modes():
    init = lambda **modes: plain.init_params(jax.random.key(0), width=4, n_layers=1, **modes)  # noqa: E731
    legacy, general = init(modes_x=6, modes_y=4), init(modes=(6, 4))
    assert legacy["layers"][0]["spectral"].shape == (4, 4, 6, 4, 2)
    for x, y in zip(jax.tree.leaves(legacy), jax.tree.leaves(general), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
    "modes, shape, match",
    [
        ((4, 4), (1, 2, 8, 8, 8), "2 mode axes but h has 3"),
        ((9, 4), (1, 2, 8, 8), "do not fit"),  # 9 > 8 on the full axis
        ((4, 6), (1, 2, 8, 8), "do not fit"),  # 6 > 8 // 2 + 1 on the real-FFT axis
    ],
)
def test_spectral_conv_rejects_mismatched_shapes(modes, shape, match):
    weight = jnp.zeros((2, 2, *modes, 2), jnp.float32)
    with pytest.raises(ValueError, match=match):
        plain.spectral_conv(weight, jnp.zeros(shape, jnp.float32))


@pytest.mark.parametrize("modes", [(), (4, 4, 4, 4), (4, 0)])
def test_init_rejects_bad_modes(modes):
    with pytest.raises(ValueError, match="modes"):
        plain.init_params(jax.random.key(0), modes=modes)
