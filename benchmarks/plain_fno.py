"""A reference Fourier neural operator on 1-D, 2-D and 3-D grids in plain JAX (no parop).

The baseline that parop's own FNO is compared with, for both accuracy and
speed. The architecture follows Li et al. 2020 and PyTorch's `neuraloperator`,
on a `d`-dimensional grid:

1. lifting: the input field `a` plus `d` coordinate channels in `[0, 1]`, mapped
   pointwise (a 1x1 linear layer) to `width` channels;
2. `n_layers` Fourier layers, each `SpectralConv(h) + Linear(h)` (the second a
   pointwise skip path), followed by GELU except after the last layer. The
   spectral convolution takes `rfftn` over the spatial axes, keeps the `m` lowest
   frequencies of each full-FFT axis (`[0 : ceil(m/2)]` and `[-floor(m/2) :]`,
   both ends of the spectrum) and the first `m` of the real-FFT (last) axis, mixes
   channels with one complex `(c_out, c_in)` matrix per kept mode, and returns
   with `irfftn`;
3. projection: pointwise linear to 128 channels, GELU, pointwise linear to 1.

`modes` counts the kept frequencies on every axis, real-FFT axis included, so the
spectral weights are `(c_out, c_in, *modes)`: `neuraloperator`'s `n_modes=(12, 12)`
(and parop's `FNO(modes=(12, 12))`) is `modes=(12, 7)` here, and `(8, 8, 8)` is
`(8, 8, 5)`. Arrays are channels-first, `(batch, channel, *grid)`, parop's
convention. Parameters live in a plain dict (a pytree). One code path serves every
dimension up to 3 (XLA's FFTs stop at 3-D).

The training protocols (`python -m benchmarks.plain_fno [--dim 3]` from the
repository root) use point-wise unit-Gaussian normalisers for `a` and `u` fitted
on the training set, Adam with learning rate 1e-3 cosine-decayed to 0, and the
per-sample relative L2 loss on the decoded prediction; they print the relative L2
test error and the median time of one jitted training step.

- 2-D, the quality bar for parop's FNO: `darcy_flow(1000, 32, seed=0)`, 800 train /
  200 test samples, width 32, 4 layers, modes `(12, 7)`, batch 20, 1,200 steps.
  Measured on 2 CPU cores (float32): test error 0.0202 (seed 0) and 0.0186
  (seed 1), against about 0.0225 for PyTorch's `neuraloperator`; a median step of
  79-104 ms; about 2 minutes for the whole run.
- 3-D: `darcy_flow(500, 24, dim=3, seed=0)`, 400 train / 100 test samples, width
  16, 4 layers, modes `(8, 8, 5)` (`neuraloperator`'s 8³), batch 10, 1,200 steps
  (30 epochs, as in 2-D). On 2 CPU cores (float32) a step takes about 0.5 s, most
  of it in the 128-channel projection with its exact GELU, so the run takes about
  11 minutes.

`--parop-init` starts the plain model from the initial parameters parop's `FNO`
draws for the same seed (`params_from_parop`): with the batches also the same, the
two runs then differ only in their code, not in the random draw.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from parop.datasets import darcy_flow
from parop.nn import UnitGaussianNormalizer, relative_l2  # shared training code, no operators

Params = dict[str, Any]


# --------------------------------------------------------------------------- model

# Einsum letters of the spatial axes, `x`, `y`, `z` in that order.
_SPATIAL = "xyz"


def init_params(
    key: jax.Array,
    *,
    in_channels: int = 1,
    out_channels: int = 1,
    width: int = 32,
    n_layers: int = 4,
    modes: Sequence[int] | None = None,
    modes_x: int = 12,
    modes_y: int = 7,
    projection_width: int = 128,
    dtype=jnp.float32,
) -> Params:
    """Random FNO parameters, initialised as in `neuraloperator` / Li et al.

    `modes` gives the kept frequencies per spatial axis (the last one the real-FFT
    axis), and with them the dimension of the grid the model runs on; without it
    the model is 2-D with `modes = (modes_x, modes_y)`.

    Dense (pointwise) layers use PyTorch's `nn.Linear` / `nn.Conv2d` default:
    weights and biases uniform in `±1/sqrt(fan_in)`. The spectral weights follow
    the original FNO code: real and imaginary parts each uniform in
    `[0, 1/(c_in c_out))`.

    The complex spectral weights of shape `(c_out, c_in, *modes)` are stored as
    real arrays with a trailing axis of size 2 (real, imaginary): an optimiser then
    treats both parts as independent real numbers, as PyTorch's Adam does, and
    JAX's conjugated complex gradients never reach it.

    Example:
        ```python
        >>> params = init_params(jax.random.key(0), width=32, modes_x=12, modes_y=7)
        >>> params["layers"][0]["spectral"].shape
        (32, 32, 12, 7, 2)
        >>> init_params(jax.random.key(0), width=16, modes=(8, 8, 5))["layers"][0]["spectral"].shape
        (16, 16, 8, 8, 5, 2)
        ```
    """
    modes = (modes_x, modes_y) if modes is None else tuple(modes)
    if not 1 <= len(modes) <= len(_SPATIAL) or min(modes) < 1:
        raise ValueError(f"modes must be 1 to {len(_SPATIAL)} positive counts, got {modes}")
    keys = iter(jax.random.split(key, 3 + 2 * n_layers))
    lift_in = in_channels + len(modes)  # the field plus one coordinate channel per axis

    def dense(k: jax.Array, c_in: int, c_out: int) -> dict[str, jax.Array]:
        k_w, k_b = jax.random.split(k)
        bound = 1.0 / math.sqrt(c_in)
        return {
            "w": jax.random.uniform(k_w, (c_out, c_in), dtype, -bound, bound),
            "b": jax.random.uniform(k_b, (c_out,), dtype, -bound, bound),
        }

    layers = []
    for _ in range(n_layers):
        scale = 1.0 / (width * width)
        spectral = scale * jax.random.uniform(next(keys), (width, width, *modes, 2), dtype)
        layers.append({"spectral": spectral, "skip": dense(next(keys), width, width)})

    return {
        "lift": dense(next(keys), lift_in, width),
        "layers": layers,
        "proj1": dense(next(keys), width, projection_width),
        "proj2": dense(next(keys), projection_width, out_channels),
    }


def params_from_parop(θ: dict[str, jax.Array], n_layers: int) -> Params:
    """The parameters of a parop `FNO` (`model.init(key)`) in this module's layout.

    Both models compute the same function with these parameters (a test checks it),
    so the protocol can start the plain model from parop's initial values: the two
    runs then differ only in their implementations, not in the random draw.

    Example:
        ```python
        >>> from parop.nn import FNO
        >>> θ = FNO((16, 16), width=8, modes=(8, 6), layers=2, projection=16).init(jax.random.key(0))
        >>> params_from_parop(θ, n_layers=2)["layers"][0]["spectral"].shape
        (8, 8, 8, 4, 2)
        ```
    """

    def dense(name: str) -> dict[str, jax.Array]:
        return {"w": θ[name], "b": θ[f"{name}.bias"]}

    def spectral(k: int) -> jax.Array:
        return jnp.stack([θ[f"spectral{k}"].real, θ[f"spectral{k}"].imag], -1)

    return {"lift": dense("lift"), "proj1": dense("proj1"), "proj2": dense("proj2"),
            "layers": [{"spectral": spectral(k), "skip": dense(f"skip{k}")} for k in range(n_layers)]}


def _pointwise(layer: dict[str, jax.Array], h: jax.Array) -> jax.Array:
    """A 1x1 convolution: `(batch, c_in, *grid) -> (batch, c_out, *grid)`."""
    s = _SPATIAL[: h.ndim - 2]
    return jnp.einsum(f"oc,bc{s}->bo{s}", layer["w"], h) + layer["b"].reshape((-1,) + (1,) * len(s))


def _along(x: jax.Array, axis: int, index: slice) -> jax.Array:
    """`x` indexed by `index` on `axis` only."""
    return x[(slice(None),) * axis + (index,)]


def spectral_conv(weight: jax.Array, h: jax.Array) -> jax.Array:
    """The FNO spectral convolution of `h`, `(batch, c_in, *grid) -> (batch, c_out, *grid)`.

    `weight` is `(c_out, c_in, *modes, 2)`: real and imaginary parts, one complex
    `(c_out, c_in)` matrix per kept mode.

    Example:
        ```python
        >>> w = init_params(jax.random.key(0), width=8, modes=(6, 6, 4))["layers"][0]["spectral"]
        >>> spectral_conv(w, jnp.ones((2, 8, 16, 16, 16))).shape
        (2, 8, 16, 16, 16)
        ```
    """
    modes, grid = weight.shape[2:-1], h.shape[2:]
    if len(modes) != len(grid):
        raise ValueError(f"weight has {len(modes)} mode axes but h has {len(grid)} spatial axes")
    if len(grid) > len(_SPATIAL):
        raise ValueError(f"grids of 1 to {len(_SPATIAL)} dimensions are supported, h has {len(grid)}")
    # The real-FFT axis holds n//2 + 1 frequencies; a full axis holds n.
    sizes = (*grid[:-1], grid[-1] // 2 + 1)
    if any(m > n for m, n in zip(modes, sizes)):
        raise ValueError(f"modes {modes} do not fit the spectrum {sizes} of grid {grid}")
    s = _SPATIAL[: len(grid)]
    axes = tuple(range(2, h.ndim))
    # A full-FFT axis keeps both ends of its spectrum: the first ceil(m/2)
    # frequencies, then a gap of n - m, then the last floor(m/2).
    full_axes = [(axis, (m + 1) // 2, n - m) for axis, m, n in zip(axes[:-1], modes, grid)]
    w = jax.lax.complex(weight[..., 0], weight[..., 1])

    spectrum = jnp.fft.rfftn(h, axes=axes)  # (batch, c_in, *grid[:-1], grid[-1] // 2 + 1)
    low = spectrum[..., : modes[-1]]
    for axis, n_pos, gap in full_axes:
        ends = [_along(low, axis, slice(None, n_pos)), _along(low, axis, slice(n_pos + gap, None))]
        low = jnp.concatenate(ends, axis=axis)
    out = jnp.einsum(f"oi{s},bi{s}->bo{s}", w, low)

    # Scatter the kept modes back into a zero spectrum of the full size.
    for axis, n_pos, gap in full_axes:
        zeros = jnp.zeros(out.shape[:axis] + (gap,) + out.shape[axis + 1 :], out.dtype)
        parts = [_along(out, axis, slice(None, n_pos)), zeros, _along(out, axis, slice(n_pos, None))]
        out = jnp.concatenate(parts, axis=axis)
    out = jnp.pad(out, [(0, 0)] * (h.ndim - 1) + [(0, sizes[-1] - modes[-1])])
    return jnp.fft.irfftn(out, s=grid, axes=axes).astype(h.dtype)


def apply(params: Params, a: jax.Array) -> jax.Array:
    """Run the FNO on input fields `a` of shape `(batch, *grid)`; returns `(batch, *grid)`.

    `a` is the (already normalised) input; the grid coordinates are appended
    here, as in Li et al.

    Example:
        ```python
        >>> params = init_params(jax.random.key(0))
        >>> apply(params, jnp.ones((5, 32, 32))).shape
        (5, 32, 32)
        >>> params = init_params(jax.random.key(0), width=16, modes=(8, 8, 5))
        >>> apply(params, jnp.ones((2, 24, 24, 24))).shape
        (2, 24, 24, 24)
        ```
    """
    batch, *grid = a.shape
    axes = [jnp.linspace(0.0, 1.0, n, dtype=a.dtype) for n in grid]
    coordinates = jnp.stack(jnp.meshgrid(*axes, indexing="ij"))
    h = jnp.concatenate([a[:, None], jnp.broadcast_to(coordinates, (batch, *coordinates.shape))], axis=1)

    h = _pointwise(params["lift"], h)
    n_layers = len(params["layers"])
    for i, layer in enumerate(params["layers"]):
        h = spectral_conv(layer["spectral"], h) + _pointwise(layer["skip"], h)
        if i < n_layers - 1:
            h = jax.nn.gelu(h, approximate=False)  # PyTorch's default, exact GELU

    h = jax.nn.gelu(_pointwise(params["proj1"], h), approximate=False)
    return _pointwise(params["proj2"], h)[:, 0]


# ------------------------------------------------------------------------ training


@dataclass
class TrainResult:
    """What `train` returns: the fitted model and the measurements."""

    params: Params
    a_normalizer: UnitGaussianNormalizer
    u_normalizer: UnitGaussianNormalizer
    test_error: float
    step_times: list[float]

    def predict(self, a: jax.Array) -> jax.Array:
        """Predicted `u` for raw coefficient fields `a` of shape `(batch, *grid)`."""
        return self.u_normalizer.decode(apply(self.params, self.a_normalizer.encode(a)))


def train(
    a_train: jax.Array,
    u_train: jax.Array,
    a_test: jax.Array,
    u_test: jax.Array,
    *,
    steps: int = 1200,
    batch_size: int = 20,
    learning_rate: float = 1e-3,
    seed: int = 0,
    log_every: int = 0,
    params: Params | None = None,
    **model_kwargs: Any,
) -> TrainResult:
    """Train an FNO with the benchmark protocol from `params`, by default
    `init_params(jax.random.key(seed), **model_kwargs)`.

    Batches are drawn without replacement from a fresh permutation of the
    training set each epoch. Every step is timed (with `block_until_ready`);
    `step_times[0]` includes compilation.

    Example:
        ```python
        >>> a, u = darcy_flow(1000, 32, seed=0)
        >>> result = train(a[:800], u[:800], a[800:], u[800:], steps=1200)
        >>> result.test_error  # doctest: +SKIP
        0.02...
        ```
    """
    a_norm = UnitGaussianNormalizer.fit(a_train)
    u_norm = UnitGaussianNormalizer.fit(u_train)
    x_train = a_norm.encode(a_train)

    if params is None:
        params = init_params(jax.random.key(seed), dtype=a_train.dtype, **model_kwargs)
    schedule = optax.cosine_decay_schedule(learning_rate, decay_steps=steps)
    optimizer = optax.adam(schedule)
    opt_state = optimizer.init(params)

    def loss_fn(p: Params, x: jax.Array, u: jax.Array) -> jax.Array:
        return relative_l2(u_norm.decode(apply(p, x)), u)

    @jax.jit
    def step(p: Params, state: optax.OptState, x: jax.Array, u: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, u)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    n_train = x_train.shape[0]
    rng = np.random.default_rng(seed)
    order = np.empty(0, dtype=np.int64)
    step_times = []
    for i in range(steps):
        if order.size < batch_size:
            order = rng.permutation(n_train)
        idx, order = order[:batch_size], order[batch_size:]
        xb, ub = x_train[idx], u_train[idx]
        xb.block_until_ready()
        ub.block_until_ready()
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, xb, ub)
        loss.block_until_ready()
        step_times.append(time.perf_counter() - t0)
        if log_every and (i + 1) % log_every == 0:
            print(f"step {i + 1:5d}  train loss {float(loss):.4f}")

    result = TrainResult(params, a_norm, u_norm, float("nan"), step_times)
    result.test_error = float(jax.jit(relative_l2)(jax.jit(result.predict)(a_test), u_test))
    return result


@dataclass(frozen=True)
class Protocol:
    """A training protocol on generated Darcy flow in `len(modes)` dimensions (see the module docstring)."""

    resolution: int
    n_train: int
    n_test: int
    width: int
    modes: tuple[int, ...]
    batch_size: int
    steps: int
    layers: int = 4

    @property
    def parop_modes(self) -> tuple[int, ...]:
        """`modes` as parop's `FNO` (and `neuraloperator`) count them: on the real-FFT
        axis the modes the kept frequencies come from, `m//2 + 1` kept of `m`."""
        return self.modes[:-1] + (2 * (self.modes[-1] - 1),)


PROTOCOLS = {
    2: Protocol(resolution=32, n_train=800, n_test=200, width=32, modes=(12, 7), batch_size=20, steps=1200),
    3: Protocol(resolution=24, n_train=400, n_test=100, width=16, modes=(8, 8, 5), batch_size=10, steps=1200),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, choices=sorted(PROTOCOLS), default=2)
    parser.add_argument("--steps", type=int, help="default: the protocol's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--parop-init", action="store_true",
                        help="start from parop's FNO initial parameters for the seed (the same model, the same draw)")
    args = parser.parse_args()
    protocol = PROTOCOLS[args.dim]
    n, s = protocol.n_train + protocol.n_test, protocol.resolution

    t0 = time.perf_counter()
    a, u = darcy_flow(n, s, dim=args.dim, seed=0)
    u.block_until_ready()
    print(f"data: {time.perf_counter() - t0:.2f} s for {n} samples at {'x'.join([str(s)] * args.dim)}")

    params = None
    if args.parop_init:
        from parop.nn import FNO  # only for its initial values; the model trained is this module's

        model = FNO((s,) * args.dim, width=protocol.width, modes=protocol.parop_modes, layers=protocol.layers)
        params = params_from_parop(model.init(jax.random.key(args.seed)), n_layers=protocol.layers)
    t0 = time.perf_counter()
    split = protocol.n_train
    result = train(
        a[:split], u[:split], a[split:], u[split:],
        steps=args.steps or protocol.steps, batch_size=protocol.batch_size, seed=args.seed,
        log_every=args.log_every, params=params, width=protocol.width, n_layers=protocol.layers, modes=protocol.modes,
    )  # fmt: skip
    total = time.perf_counter() - t0
    n_params = sum(x.size for x in jax.tree.leaves(result.params))
    print(f"parameters: {n_params}")
    print(f"relative L2 test error: {result.test_error:.4f}")
    print(
        f"median step time: {1e3 * float(np.median(result.step_times[10:])):.2f} ms"
        f" (first step with compilation {result.step_times[0]:.2f} s; training {total:.1f} s)"
    )


if __name__ == "__main__":
    main()
