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
# # 05 · A 3-D Fourier neural operator
#
# The network of notebook 04 on a 3-D grid: Darcy flow in the unit cube,
# −∇·(a ∇u) = 1 with u = 0 on the boundary, sampled on 24³ grid points, and an FNO that
# maps the coefficient `a` to the solution `u`. The grid is split over 8 devices, in two
# along each axis. In 3-D the activations grow with the cube of the resolution, and the
# memory a training step needs is what model parallelism is for: this notebook measures
# it, per device, on 1 to 8 devices.
#
# `PAROP_NOTEBOOK_STEPS` sets the number of training steps: 300 by default (the full
# run, whose outputs are saved with this notebook); the test suite runs it with 20, and
# with 100 samples instead of 500 (`PAROP_NOTEBOOK_SAMPLES`).

# %%
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # those 8 devices, also where JAX would pick a GPU

import jax
import numpy as np
import time
import warnings

import matplotlib.pyplot as plt

from parop.datasets import darcy_flow
from parop.nn import FNO, UnitGaussianNormalizer, dry_run, evaluate, fit, relative_l2

STEPS = int(os.environ.get("PAROP_NOTEBOOK_STEPS", 300))
SAMPLES = int(os.environ.get("PAROP_NOTEBOOK_SAMPLES", 500))
plt.rcParams.update({"figure.dpi": 70, "font.size": 8})
warnings.filterwarnings("ignore", message="IProgress not found")  # no ipywidgets: tqdm draws a text bar
print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, {STEPS} training steps")

# %% [markdown]
# ## Data
#
# `darcy_flow(n, 24, dim=3)` draws piecewise-constant coefficients (12 or 3, a
# thresholded Gaussian random field) and solves the 7-point finite-difference system with
# a conjugate-gradient method, in code: 500 samples, 400 to train and 100 to test,
# normalised as in notebook 04.

# %%
start = time.perf_counter()
a, u = darcy_flow(SAMPLES, 24, dim=3, seed=0)
print(f"a: {a.shape}, u: {u.shape}, generated in {time.perf_counter() - start:.1f} s;  "
      f"a takes {np.unique(np.asarray(a))}, u at most {float(u.max()):.4f}")
train = SAMPLES * 4 // 5
a_train, u_train, a_test, u_test = a[:train], u[:train, None], a[train:], u[train:, None]
a_norm, u_norm = UnitGaussianNormalizer.fit(a_train), UnitGaussianNormalizer.fit(u_train)
x_train, x_test = a_norm.encode(a_train)[:, None], a_norm.encode(a_test)[:, None]

# %% [markdown]
# One sample, cut through the middle of the cube across each axis: the coefficient
# (yellow 12, purple 3) and the solution, which vanishes on the faces of the cube.

# %%
mid = 12
cuts = {"x": np.s_[mid, :, :], "y": np.s_[:, mid, :], "z": np.s_[:, :, mid]}
fig, axes = plt.subplots(2, 3, figsize=(7, 4.4))
for column, (axis, cut) in enumerate(cuts.items()):
    for row, (name, field, vmin, vmax) in enumerate([("a", a[0], 3, 12), ("u", u[0], 0, float(u[0].max()))]):
        image = axes[row, column].imshow(np.asarray(field[cut]).T, origin="lower", vmin=vmin, vmax=vmax)
        axes[row, column].set_title(f"{name} at {axis} = 0.5")
        axes[row, column].set_axis_off()
        fig.colorbar(image, ax=axes[row, column], shrink=0.8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The model, distributed over 8 devices
#
# Width 16, 8 Fourier modes per axis (8 frequencies on `x` and `y`, both ends of the
# spectrum, and 8//2 + 1 = 5 on `z`, the real-FFT axis), 4 layers. The input
# `(batch, channel, x, y, z)` is split `(1, 1, 2, 2, 2)`. For batches of 4 the distributed
# model plans its seven operators as one chain; each hands over to the next in the layout
# the next one starts from:

# %%
BATCH = 4
model = FNO((24, 24, 24), width=16, modes=(8, 8, 8), layers=4)
dist = model.distribute((1, 1, 2, 2, 2))
θ = dist.init(jax.random.key(0))
print(f"{sum(w.size for w in θ.values()):,} parameters; spectral weights {θ['spectral0'].shape} "
      f"{θ['spectral0'].dtype}, kept as {θ['spectral0'].sharding.spec}")

ops = dist.operators(BATCH)
names = ["lift"] + [f"layer {k}" for k in range(4)] + ["proj1", "proj2"]
for name, D in zip(names, ops):
    print(f"{name:8} {str(D.in_sharding.spec):45} -> {D.out_sharding.spec}")

# %% [markdown]
# The lifting moves all three splits onto `y` (8 ways, 3 planes per device), the layout
# the Fourier layers share. In a layer, the FFTs on `z` and `x` run locally and
# keep 5 and 8 modes; one `all_to_all` moves the split from `y` onto the 8 kept modes of
# `x`, one per device, so the FFT on `y` runs locally and the `PerModeMatrix` mixes the
# channels of each device's mode; a second `all_to_all` takes the split back to `y`.
# The spectral weight is split with its modes (the `spectral0` placement above), so each
# device holds and updates an eighth of it, and its gradient needs no collective:

# %%
print(ops[1].plan)

# %% [markdown]
# ## Memory per device
#
# `dry_run(model, batch)` compiles one training step (forward, backward and Adam's
# update, as `fit` trains) for the serial model on 1 device and for the model
# distributed over 2, 4 and 8, at this notebook's size (24³, width 16, batch 4). It
# compiles from shapes alone (`jax.ShapeDtypeStruct`s with the shardings the model
# wants), so nothing runs and nothing of the model's is allocated. Its `memory` is
# `compiled.memory_analysis()` per device: the arguments (the parameters, Adam's state
# and the batch), the outputs (the new parameters and state, the loss) and the
# temporaries (the intermediate values, among them the activations kept for the
# backward pass). These are XLA:CPU's buffer assignments for the forced host devices; a
# GPU compiler would give other numbers. It also counts the step's collectives in the
# compiled program and the bytes each device sends.

# %%
MiB = 2**20
print(f"{'P':>2} {'partition':16} {'arguments':>10} {'outputs':>8} {'temporaries':>12} {'total':>9}   total x P"
      f"   all_to_alls  psums  sent")
for P, partition in [(1, None), (2, (1, 1, 2, 1, 1)), (4, (1, 1, 2, 2, 1)), (8, (1, 1, 2, 2, 2))]:
    m = model if partition is None else dist if P == 8 else model.distribute(partition)
    report = dry_run(m, BATCH)
    memory, total = report["memory"], report["memory_bytes"]
    if P == 1:
        serial = total
    print(f"{P:2} {str(partition or 'serial'):16} {memory['arguments'] / MiB:8.2f} MiB {memory['outputs'] / MiB:5.2f} MiB "
          f"{memory['temporaries'] / MiB:9.1f} MiB {total / MiB:6.1f} MiB   {P * total / serial:.2f} x serial"
          f"   {report['collectives']['all_to_all']:11} {report['collectives']['psum']:6}  "
          f"{report['sent_bytes'] / MiB:.2f} MiB")

# %% [markdown]
# Each device's share falls as 1/P: the model splits the activations, which dominate, and
# the spectral weights with them; only the small channel-mixing weights and biases are
# copied on every device. The totals over all devices stay at the serial model's. The
# price is communication: `all_to_all`s (two per Fourier layer forward, as many
# backward, and those of the lifting and the projection) and all-reduces (`psum`: the
# gradients of the weights every device holds whole, and the loss), 1 - 2 MiB sent per
# device per step here. `python -m parop.nn.dryrun` runs the same dry run
# at sizes no machine here could hold (the README's "Will it fit?").

# %% [markdown]
# ## Training
#
# As in notebook 04: Adam, learning rate 1e-3 with cosine decay, the relative L2 loss of
# the decoded prediction, here in batches of 4, each placed on the mesh by `place`.

# %%
place = lambda batch: jax.device_put(batch, dist.in_sharding)
start = time.perf_counter()
θ, losses = fit(dist, θ, x_train, u_train, steps=STEPS, batch=BATCH, lr=1e-3, decode=u_norm.decode, place=place)
print(f"{STEPS} steps in {time.perf_counter() - start:.0f} s (compilation included);  "
      f"mean loss of the last 10: {losses[-10:].mean():.4f}")

fig, ax = plt.subplots(figsize=(4.5, 2.5))
ax.plot(losses, lw=0.8)
ax.set(xlabel="step", ylabel="relative L2 loss", title="training loss (one batch per step)", ylim=(0, None))
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Test error and one prediction
#
# The relative L2 error over the 100 test samples: about 0.08 after the 300 steps of the
# run saved with this notebook (the README's 3-D protocol trains the same model for 1,200
# steps, to about 0.04).
# In the test suite's quick mode (20 steps) the model has barely started to learn and
# the error is about 0.3.

# %%
error = evaluate(dist, θ, x_test, u_test, batch=BATCH, decode=u_norm.decode, place=place)
print(f"relative L2 test error after {STEPS} steps: {error:.4f}")

# %%
prediction = np.asarray(u_norm.decode(jax.jit(dist.apply)(θ, place(x_test[:BATCH]))))[0, 0]
truth = np.asarray(u_test[0, 0])
scale = float(np.abs(prediction - truth).max())
fig, axes = plt.subplots(2, 3, figsize=(7, 4.4))
for row, (axis, cut) in enumerate([("x", cuts["x"]), ("z", cuts["z"])]):
    panels = [("solution u", truth, "viridis", 0, truth.max()), ("prediction", prediction, "viridis", 0, truth.max()),
              ("error", prediction - truth, "RdBu_r", -scale, scale)]
    for ax, (title, field, cmap, vmin, vmax) in zip(axes[row], panels):
        image = ax.imshow(field[cut].T, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax)
        ax.set_title(f"{title}, {axis} = 0.5")
        ax.set_axis_off()
        fig.colorbar(image, ax=ax, shrink=0.8)
sample_error = float(relative_l2(prediction[None], truth[None]))
fig.suptitle(f"test sample 0: relative L2 error {sample_error:.3f}")
fig.tight_layout()
plt.show()
