"""The jitted Adam step the FNO cases (d, i) compile and time, on parop's public names."""

from __future__ import annotations

from typing import Callable

import jax
import optax

from parop.nn import as_complex


def adam_step(loss: Callable, optimizer: optax.GradientTransformation, like: dict | None = None):
    """A jitted `step(θ, state, x, y) -> (θ, state, loss)`. With `like` (parameters with
    complex weights), `θ` is their real view (`parop.nn.as_real(like)`), as `parop.nn.fit`
    trains: `loss` is given `as_complex(θ, like)`.

    ```python
    step = adam_step(lambda θ, x, y: relative_l2(model.apply(θ, x), y), optax.adam(1e-3), θ)
    θr, state, value = step(as_real(θ), optax.adam(1e-3).init(as_real(θ)), a, u)
    ```
    """
    view = (lambda θ: θ) if like is None else (lambda θ: as_complex(θ, like))

    @jax.jit
    def step(θ, state, x, y):
        value, grads = jax.value_and_grad(lambda θ: loss(view(θ), x, y))(θ)
        updates, state = optimizer.update(grads, state, θ)
        return optax.apply_updates(θ, updates), state, value

    return step
