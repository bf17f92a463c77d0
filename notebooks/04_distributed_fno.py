# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · A distributed Fourier neural operator
#
# A 2-D Fourier neural operator (Li et al. 2020) learns the map from the coefficient
# field `a` of a Darcy flow problem, −∇·(a ∇u) = 1 on the unit square, to its solution `u`.
# `parop.nn.FNO` builds every linear map of the network from parop operators (a `Matrix` on
# the channel axis for lifting, skip connections and projection; `Restriction @ DFT`, a
# `PerModeMatrix` and the way back for each spectral convolution), so the whole network
# distributes with `model.distribute(partition)`: here the 32 × 32 grid is split 2 × 4
# over 8 devices.
#
# `PAROP_NOTEBOOK_STEPS` sets the number of training steps: 1200 by default (the full
# run, about 30 epochs of the 800 training samples, whose outputs are saved with this
# notebook); the test suite runs it with 20, and with 100 samples instead of 1000
# (`PAROP_NOTEBOOK_SAMPLES`).

# %%
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # those 8 devices, also where JAX would pick a GPU

import jax
import jax.numpy as jnp
import numpy as np
import time

import warnings

import matplotlib.pyplot as plt

from parop.datasets import darcy_flow
from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit, relative_l2

STEPS = int(os.environ.get("PAROP_NOTEBOOK_STEPS", 1200))
SAMPLES = int(os.environ.get("PAROP_NOTEBOOK_SAMPLES", 1000))
plt.rcParams.update({"figure.dpi": 80, "font.size": 8})
warnings.filterwarnings("ignore", message="IProgress not found")  # no ipywidgets: tqdm draws a text bar
print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, {STEPS} training steps")

# %% [markdown]
# ## Data
#
# `darcy_flow` samples piecewise-constant coefficients (12 or 3, a thresholded Gaussian
# random field) and solves the equation with a finite-difference scheme, in code, in about
# a second: 1000 pairs on a 32 × 32 grid, 800 to train and 200 to test. Inputs and
# outputs are normalised pointwise as in the FNO paper; the loss and the error are
# measured on the decoded solution. The FNO's tensors are `(batch, channel, x, y)`, so
# both get a channel axis.

# %%
a, u = darcy_flow(SAMPLES, 32, seed=0)
train = SAMPLES * 4 // 5
a_train, u_train, a_test, u_test = a[:train], u[:train, None], a[train:], u[train:, None]
a_norm, u_norm = UnitGaussianNormalizer.fit(a_train), UnitGaussianNormalizer.fit(u_train)
x_train, x_test = a_norm.encode(a_train)[:, None], a_norm.encode(a_test)[:, None]
print("a:", a.shape, "values", np.unique(np.asarray(a)), "  u:", u.shape, f"max {float(u.max()):.4f}")
print("train", x_train.shape, u_train.shape, "  test", x_test.shape, u_test.shape)

# %% [markdown]
# ## The model, serial and distributed
#
# Width 32, 12 × 12 Fourier modes (as in the `neuraloperator` library: 12 frequencies on
# `x`, both ends of the spectrum, and 12//2 + 1 = 7 on `y`, the real-FFT axis), 4 layers.
# The model has no batch size: it builds its operators for each batch size it meets.
# `model.distribute((1, 1, 2, 4))` is the same network for inputs split as
# `(batch, channel, x, y)` = `(1, 1, 2, 4)`, its operators planned together, as one
# chain, for each batch size. It takes the same parameters (`dist.init` gives the same
# values as `model.init`, each placed where the distributed model keeps it) and computes
# the same function:

# %%
model = FNO((32, 32), width=32, modes=(12, 12), layers=4)
dist = model.distribute((1, 1, 2, 4))
θ = dist.init(jax.random.key(0))
print(f"{sum(w.size for w in θ.values()):,} parameters:", ", ".join(sorted(θ)))

θ_serial = model.init(jax.random.key(0))
print("the same initial parameters:", all(np.array_equal(θ[k], θ_serial[k]) for k in θ))

place = lambda batch: jax.device_put(batch, dist.in_sharding)   # split as the model wants its input
y_serial = jax.jit(model.apply)(θ_serial, x_train[:20])
y_dist = jax.jit(dist.apply)(θ, place(x_train[:20]))
print("distributed vs serial, max relative difference:", float(jnp.abs(y_dist - y_serial).max() / jnp.abs(y_serial).max()))

# %% [markdown]
# `dist.operators(20)` are the network's distributed operators for batches of 20:
# lifting, the four Fourier layers, the two projections. Each hands its output to the
# next in the layout the next one starts from, and only the lifting and the last
# projection move the input's `y` split:

# %%
ops = dist.operators(20)
names = ["lift"] + [f"layer {k}" for k in range(4)] + ["proj1", "proj2"]
for name, D in zip(names, ops):
    fwd, bwd = D.plan.collectives(), D.plan.collectives(backward=True)
    count = lambda c: ", ".join(f"{n} {k}" for k, n in c.items() if n) or "none"
    print(f"{name:8} {str(D.in_sharding.spec):34} -> {str(D.out_sharding.spec):34} fwd: {count(fwd)};  bwd: {count(bwd)}")

# %% [markdown]
# One Fourier layer's plan (all four are alike: the lifting has already moved the input's
# split to the layout they share, `x` split 8 ways). The spectral convolution and the skip
# connection are the two terms of a sum. The real FFT on `y` runs locally; after the
# restriction to 7 modes, one `all_to_all` moves the `x` split onto them (padded with a
# zero mode to 8, one per device), so the FFT on `x` runs locally and the
# `PerModeMatrix` mixes the channels of each device's modes; a second `all_to_all` puts
# the split back on `x` for the inverse real FFT. Two per layer forward, as in dfno.
#
# The backward pass runs both `all_to_all`s in reverse, a `psum` of the skip weight's
# gradient, and an `all_gather` of the spectral weight's gradient: that weight is kept
# whole on every device (its 7 modes on `y` do not split evenly in 8), each device
# computes the gradient of the modes it holds, and the pieces are gathered.

# %%
print(ops[1].plan)

# %% [markdown]
# ## Training
#
# `parop.nn.fit` trains with Adam (learning rate 1e-3, cosine decay to 0) on the relative
# L2 loss of the decoded prediction, batches of 20 drawn without replacement; `place` puts
# each batch on the mesh. The parameters stay a plain dict (`optax` sees the complex
# spectral weights as pairs of reals). With `checkpoint="some/dir"`, `fit` would also save
# its state every `every` steps and resume from it.

# %%
start = time.perf_counter()
θ, losses = fit(dist, θ, x_train, u_train, steps=STEPS, batch=20, lr=1e-3, decode=u_norm.decode, place=place)
print(f"{STEPS} steps in {time.perf_counter() - start:.0f} s;  mean loss of the last 20 steps: {losses[-20:].mean():.4f}")

# %%
fig, ax = plt.subplots(figsize=(5, 2.8))
ax.semilogy(losses, lw=0.6, alpha=0.5, label="batch")
window = max(1, min(50, len(losses) // 5))
ax.semilogy(np.arange(window - 1, len(losses)), np.convolve(losses, np.ones(window) / window, "valid"), label=f"mean of {window}")
ax.set(xlabel="step", ylabel="relative L2 loss", title="training loss")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Test error and one prediction
#
# The relative L2 error `‖prediction − u‖ / ‖u‖`, averaged over the 200 test samples that the
# model never saw: about 0.02 after the 1,200 steps of the run saved with this notebook.
# In the test suite's quick mode (`PAROP_NOTEBOOK_STEPS=20`) the model has barely started
# to learn and the error is about 0.24.

# %%
error = evaluate(dist, θ, x_test, u_test, batch=20, decode=u_norm.decode, place=place)
print(f"relative L2 test error: {error:.4f}")

# %%
prediction = u_norm.decode(jax.jit(dist.apply)(θ, place(x_test[:20])))
i = 0
panels = {
    "coefficient a": a_test[i],
    "solution u": u_test[i, 0],
    "prediction": prediction[i, 0],
    "error": prediction[i, 0] - u_test[i, 0],
}
scale = float(jnp.abs(panels["error"]).max())
limits = {"solution u": (0, float(u_test[i].max())), "prediction": (0, float(u_test[i].max())), "error": (-scale, scale)}
fig, axes = plt.subplots(1, 4, figsize=(10, 2.5))
for ax, (title, field) in zip(axes, panels.items()):
    vmin, vmax = limits.get(title, (None, None))
    image = ax.imshow(np.asarray(field), cmap="RdBu_r" if title == "error" else "viridis", origin="lower", vmin=vmin, vmax=vmax)
    ax.set_title(title)
    ax.set_axis_off()
    fig.colorbar(image, ax=ax, shrink=0.8)
sample_error = float(relative_l2(prediction[i:i + 1], u_test[i:i + 1]))
fig.suptitle(f"test sample {i}: relative L2 error {sample_error:.3f}")
fig.tight_layout()
plt.show()
