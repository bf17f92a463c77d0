"""A reference 2-D Fourier neural operator in plain JAX (no parop).

The baseline that parop's own FNO is compared with, for both accuracy and
speed. The architecture follows Li et al. 2020 and PyTorch's `neuraloperator`:

1. lifting: the input field `a` plus two coordinate channels `(x, y)` in
   `[0, 1]`, mapped pointwise (a 1x1 linear layer) to `width` channels;
2. `n_layers` Fourier layers, each `SpectralConv(h) + Linear(h)` (the second a
   pointwise skip path), followed by GELU except after the last layer. The
   spectral convolution takes `rfft2` over `(x, y)`, keeps the `modes_x` lowest
   frequencies of the full FFT axis (`[0 : ceil(m/2)]` and `[-floor(m/2) :]`)
   and the `modes_y` lowest of the real-FFT axis, mixes channels with one
   complex `(c_out, c_in)` matrix per kept mode, and returns with `irfft2`;
3. projection: pointwise linear to 128 channels, GELU, pointwise linear to 1.

Arrays are channels-first, `(batch, channel, x, y)`, parop's convention.
Parameters live in a plain dict (a pytree).

The training protocol (`python -m benchmarks.plain_fno` from the repository root) is the quality bar for
parop's FNO: `darcy_flow(1000, 32, seed=0)`, 800 train / 200 test samples,
point-wise unit-Gaussian normalisers for `a` and `u` fitted on the training
set, Adam with learning rate 1e-3 cosine-decayed to 0, batch 20, 1,200 steps,
per-sample relative L2 loss on the decoded prediction. It prints the relative
L2 test error and the median time of one jitted training step.

Measured on 2 CPU cores (float32): test error 0.0202 (seed 0) and 0.0186
(seed 1), against about 0.0225 for PyTorch's `neuraloperator`; a median step
of 79-104 ms; about 2 minutes for the whole run.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from parop.datasets import darcy_flow
from parop.nn.train import UnitGaussianNormalizer, relative_l2  # shared training code, no operators

Params = dict[str, Any]


# --------------------------------------------------------------------------- model


def init_params(
    key: jax.Array,
    *,
    in_channels: int = 1,
    out_channels: int = 1,
    width: int = 32,
    n_layers: int = 4,
    modes_x: int = 12,
    modes_y: int = 7,
    projection_width: int = 128,
    dtype=jnp.float32,
) -> Params:
    """Random FNO parameters, initialised as in `neuraloperator` / Li et al.

    Dense (pointwise) layers use PyTorch's `nn.Linear` / `nn.Conv2d` default:
    weights and biases uniform in `±1/sqrt(fan_in)`. The spectral weights follow
    the original FNO code: real and imaginary parts each uniform in
    `[0, 1/(c_in c_out))`.

    The complex spectral weights of shape `(c_out, c_in, modes_x, modes_y)` are
    stored as real arrays with a trailing axis of size 2 (real, imaginary): an
    optimiser then treats both parts as independent real numbers, as PyTorch's
    Adam does, and JAX's conjugated complex gradients never reach it.

    Example:
        ```python
        >>> params = init_params(jax.random.key(0), width=32, modes_x=12, modes_y=7)
        >>> params["layers"][0]["spectral"].shape
        (32, 32, 12, 7, 2)
        ```
    """
    keys = iter(jax.random.split(key, 3 + 2 * n_layers))
    lift_in = in_channels + 2  # the field plus the two coordinate channels

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
        spectral = scale * jax.random.uniform(next(keys), (width, width, modes_x, modes_y, 2), dtype)
        layers.append({"spectral": spectral, "skip": dense(next(keys), width, width)})

    return {
        "lift": dense(next(keys), lift_in, width),
        "layers": layers,
        "proj1": dense(next(keys), width, projection_width),
        "proj2": dense(next(keys), projection_width, out_channels),
    }


def _pointwise(layer: dict[str, jax.Array], h: jax.Array) -> jax.Array:
    """A 1x1 convolution: `(batch, c_in, x, y) -> (batch, c_out, x, y)`."""
    return jnp.einsum("oc,bcxy->boxy", layer["w"], h) + layer["b"][:, None, None]


def spectral_conv(weight: jax.Array, h: jax.Array) -> jax.Array:
    """The FNO spectral convolution of `h`, `(batch, c_in, nx, ny) -> (batch, c_out, nx, ny)`.

    `weight` is `(c_out, c_in, modes_x, modes_y, 2)`: real and imaginary parts.
    """
    c_out, _, modes_x, modes_y, _ = weight.shape
    batch, _, nx, ny = h.shape
    w = jax.lax.complex(weight[..., 0], weight[..., 1])
    n_pos, n_neg = (modes_x + 1) // 2, modes_x // 2

    spectrum = jnp.fft.rfft2(h, axes=(-2, -1))  # (batch, c_in, nx, ny // 2 + 1)
    low = jnp.concatenate(
        [spectrum[:, :, :n_pos, :modes_y], spectrum[:, :, nx - n_neg :, :modes_y]], axis=2
    )
    mixed = jnp.einsum("oixy,bixy->boxy", w, low)

    # Scatter the kept modes back into a zero spectrum of the full size.
    gap = jnp.zeros((batch, c_out, nx - modes_x, modes_y), mixed.dtype)
    out = jnp.concatenate([mixed[:, :, :n_pos], gap, mixed[:, :, n_pos:]], axis=2)
    out = jnp.pad(out, ((0, 0), (0, 0), (0, 0), (0, ny // 2 + 1 - modes_y)))
    return jnp.fft.irfft2(out, s=(nx, ny), axes=(-2, -1)).astype(h.dtype)


def apply(params: Params, a: jax.Array) -> jax.Array:
    """Run the FNO on input fields `a` of shape `(batch, x, y)`; returns `(batch, x, y)`.

    `a` is the (already normalised) input; the grid coordinates are appended
    here, as in Li et al.

    Example:
        ```python
        >>> params = init_params(jax.random.key(0))
        >>> apply(params, jnp.ones((5, 32, 32))).shape
        (5, 32, 32)
        ```
    """
    batch, nx, ny = a.shape
    gx = jnp.broadcast_to(jnp.linspace(0.0, 1.0, nx, dtype=a.dtype)[:, None], (nx, ny))
    gy = jnp.broadcast_to(jnp.linspace(0.0, 1.0, ny, dtype=a.dtype)[None, :], (nx, ny))
    grid = jnp.broadcast_to(jnp.stack([gx, gy]), (batch, 2, nx, ny))
    h = jnp.concatenate([a[:, None], grid], axis=1)

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
        """Predicted `u` for raw coefficient fields `a` of shape `(batch, x, y)`."""
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
    **model_kwargs: Any,
) -> TrainResult:
    """Train an FNO with the benchmark protocol; `model_kwargs` go to `init_params`.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args()

    t0 = time.perf_counter()
    a, u = darcy_flow(1000, 32, seed=0)
    u.block_until_ready()
    print(f"data: {time.perf_counter() - t0:.2f} s for 1000 samples at 32x32")

    t0 = time.perf_counter()
    result = train(
        a[:800], u[:800], a[800:], u[800:],
        steps=args.steps, seed=args.seed, log_every=args.log_every,
        width=32, n_layers=4, modes_x=12, modes_y=7,
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
