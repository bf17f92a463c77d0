"""Training an operator-learning model with optax: normalisers, the relative L2 loss,
and a jitted training loop with a progress bar."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = dict[str, jax.Array]


@dataclass(frozen=True)
class UnitGaussianNormalizer:
    """Pointwise mean and standard deviation over the samples (axis 0), as in Li et al.

    ```python
    >>> norm = UnitGaussianNormalizer.fit(a_train)
    >>> a = norm.encode(a_train); a_back = norm.decode(a)
    ```
    """

    mean: jax.Array
    std: jax.Array
    eps: float = 1e-5

    @classmethod
    def fit(cls, x: jax.Array) -> "UnitGaussianNormalizer":
        return cls(jnp.mean(x, axis=0), jnp.std(x, axis=0))

    def encode(self, x: jax.Array) -> jax.Array:
        return (x - self.mean) / (self.std + self.eps)

    def decode(self, x: jax.Array) -> jax.Array:
        return x * (self.std + self.eps) + self.mean


def relative_l2(pred: jax.Array, target: jax.Array) -> jax.Array:
    """The mean over samples (axis 0) of `||pred - target|| / ||target||`."""
    axes = tuple(range(1, pred.ndim))
    diff = jnp.sqrt(jnp.sum((pred - target) ** 2, axis=axes))
    return jnp.mean(diff / jnp.sqrt(jnp.sum(target**2, axis=axes)))


def as_real(θ: Params) -> Params:
    """Complex weights as real arrays with a trailing (real, imaginary) axis, so that an
    optimiser treats both parts as independent reals (as PyTorch's Adam does) and
    JAX's conjugated complex gradients never reach it."""
    return {k: jnp.stack([v.real, v.imag], -1) if jnp.iscomplexobj(v) else v for k, v in θ.items()}


def as_complex(θ: Params, like: Params) -> Params:
    """The inverse of `as_real`."""
    return {k: jax.lax.complex(v[..., 0], v[..., 1]) if jnp.iscomplexobj(like[k]) else v for k, v in θ.items()}


def make_step(loss: Callable[[Params, jax.Array, jax.Array], jax.Array], optimizer: optax.GradientTransformation,
              like: Params):
    """A jitted `step(θr, state, x, y) -> (θr, state, loss)` on real-view parameters."""

    @jax.jit
    def step(θr, state, x, y):
        value, grads = jax.value_and_grad(lambda θr: loss(as_complex(θr, like), x, y))(θr)
        updates, state = optimizer.update(grads, state, θr)
        return optax.apply_updates(θr, updates), state, value

    return step


def fit(model, θ: Params, a: jax.Array, u: jax.Array, *, steps: int, batch: int, lr: float = 1e-3,
        seed: int = 0, decode: Callable | None = None, progress: bool = True,
        place: Callable | None = None) -> tuple[Params, np.ndarray]:
    """Trains `model.apply` with Adam (`lr`, cosine decay to 0 over `steps`) on the
    relative L2 loss of `decode(model.apply(θ, a_batch))` against `u_batch`; returns the
    trained parameters and the loss at every step. `place` puts each batch where the
    model wants it (e.g. the distributed model's input sharding)."""
    decode = decode or (lambda x: x)
    place = place or (lambda x: x)
    optimizer = optax.adam(optax.cosine_decay_schedule(lr, steps))
    loss = lambda θ, x, y: relative_l2(decode(model.apply(θ, x)), y)
    θr = as_real(θ)
    state = optimizer.init(θr)
    step = make_step(loss, optimizer, θ)
    n = a.shape[0]
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])
    losses = np.empty(steps)
    bar = _progress(steps) if progress else None
    for i in range(steps):
        idx = order[i * batch:(i + 1) * batch]
        θr, state, value = step(θr, state, place(a[idx]), place(u[idx]))
        losses[i] = float(value)  # also waits for the step, so collectives never pile up
        if bar is not None:
            bar(i, losses[i])
    return as_complex(θr, θ), losses


def _progress(total: int):
    """A progress bar: tqdm's where installed, else a line every 10%."""
    try:
        import ipywidgets  # noqa: F401  (tqdm.auto needs it for a notebook widget)
        from tqdm.auto import tqdm
    except ImportError:
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
    if tqdm is None:
        start = time.perf_counter()

        def report(i, value):
            if (i + 1) % max(1, total // 10) == 0 or i + 1 == total:
                print(f"step {i + 1}/{total}  loss {value:.4f}  {time.perf_counter() - start:.0f} s", flush=True)

        return report
    bar = tqdm(total=total)

    def update(i, value):
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        if i + 1 == total:
            bar.close()

    return update


def evaluate(model, θ: Params, a: jax.Array, u: jax.Array, *, batch: int, decode: Callable | None = None,
             place: Callable | None = None) -> float:
    """The relative L2 error over `a`, `u`, in batches of the model's batch size."""
    decode = decode or (lambda x: x)
    place = place or (lambda x: x)
    predict = jax.jit(lambda θ, x: decode(model.apply(θ, x)))
    errors = [relative_l2(predict(θ, place(a[i:i + batch])), u[i:i + batch]) for i in range(0, a.shape[0], batch)]
    return float(np.mean([float(e) for e in errors]))
