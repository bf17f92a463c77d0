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
# # 02 · A distributed FFT
#
# `po.distribute(A, partition)` turns an operator into one `jax.shard_map` program over a
# device mesh. It is the **same linear map** as `A` on global arrays; only where the data
# lives changes. Axes that an operator needs whole (a `DFT`'s) are made local by
# `all_to_all` repartitions that a planner chooses so that the fewest bytes move; no
# step gathers a whole array onto one device.
#
# The 8 devices are forced CPU devices, so the collectives are real but the timings only
# show the shape of the costs.

# %%
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # those 8 devices, also where JAX would pick a GPU

import jax
import jax.numpy as jnp
import numpy as np
import parop as po
import re
import time

rng = np.random.default_rng(0)
print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")

# %% [markdown]
# ## The seed: a real 3-D DFT split in two
#
# The partition has one entry per input axis: `(2, 1, 1)` splits axis 0 (size 30) over 2
# devices. `D @ x` takes a global array (host data, or a `jax.Array` with any sharding)
# and returns a global array sharded as `D.out_sharding`. It is still `np.fft.rfftn`:

# %%
F = po.kron(po.DFT(30, jnp.complex64), po.DFT(20, jnp.complex64), po.DFT(10, jnp.float32))
D = po.distribute(F, partition=(2, 1, 1))

x = rng.standard_normal((30, 20, 10)).astype(np.float32)
y = D @ x
want = np.fft.rfftn(x)
print(y.shape, y.dtype, "  relative error vs np.fft.rfftn:", float(np.abs(y - want).max() / np.abs(want).max()))
print("in:", D.in_sharding.spec, "  out:", D.out_sharding.spec, "  y:", y.sharding.spec)
np.testing.assert_allclose(D.H @ y, F.H @ y, rtol=1e-4, atol=1e-2)   # the adjoint is distributed too

# %% [markdown]
# `D.plan` is the program. Read it top to bottom: every line runs on each device's block;
# an `all_to_all` names the mesh axis it moves, from which tensor axis to which, and the
# layout afterwards. Each collective shows the bytes one device sends forward (`fwd`) and
# in the backward pass of `jax.grad` (`bwd`: JAX runs the transposed program, and the
# transpose of an `all_to_all` is the reverse `all_to_all`); the last two lines add them
# up. Plans are costed for a training step, forward and backward (see the machine model
# below). Here the split moves to axis 1 *before* the real DFT (real data is smaller
# than its spectrum: 5.9 KiB against 7.0 KiB), and back at the end so that the output
# has the input's layout.

# %%
print(D.plan)


# %% [markdown]
# ## A 64³ complex FFT on 8 devices
#
# Two classic decompositions: *slabs* `(8, 1, 1)` and *cubes* `(2, 2, 2)`. With
# `out_partition=None` the output comes back in the input's layout; with `"auto"` the
# planner may end in any layout, which saves the moves back (`D.out_sharding` says where
# the result lives). For each case we compile the program and count its collectives in
# the HLO: they are what the plan says, and there is never an all-gather.

# %%
def hlo_collectives(f, *args):
    """Collectives in the compiled HLO of the jitted function f (an async start/done pair counts once)."""
    text = f.lower(*args).compile().as_text()
    kinds = ("all-to-all", "all-gather", "all-reduce", "collective-permute")
    return {k: len(re.findall(rf"\b{k}(?:-start)?\(", text)) for k in kinds}

n = 64
F3 = po.kron(po.DFT(n), po.DFT(n), po.DFT(n))
x = (rng.standard_normal((n, n, n)) + 1j * rng.standard_normal((n, n, n))).astype(np.complex64)
want = np.fft.fftn(x)

print(f"{'partition':10} {'out':5} {'plan':>5} {'HLO all-to-all':>15} {'all-gather':>11}   {'output layout':34} rel. error")
for partition in [(8, 1, 1), (2, 2, 2)]:
    for out in [None, "auto"]:
        D = po.distribute(F3, partition, out_partition=out)
        run, _ = D.program(())              # the jitted shard_map program (no weights here)
        counts = hlo_collectives(run, x)
        assert counts["all-to-all"] == D.plan.collectives()["all_to_all"] and counts["all-gather"] == 0
        y = D @ x
        err = float(np.abs(np.asarray(y) - want).max() / np.abs(want).max())
        print(f"{str(partition):10} {str(out):5} {D.plan.collectives()['all_to_all']:5} "
              f"{counts['all-to-all']:15} {counts['all-gather']:11}   {str(D.out_sharding.spec):34} {err:.1e}")

# %% [markdown]
# The cube decomposition with `out_partition="auto"` needs only 3 `all_to_all`s, one per
# axis: each moves a split off the axis about to be transformed onto one already done,
# and the result stays in the layout it reached.

# %%
print(po.distribute(F3, (2, 2, 2), out_partition="auto").plan)

# %% [markdown]
# ## The machine model
#
# The planner minimises a cost counted in bytes: for each collective, the bytes one
# device sends plus `latency_bytes`, a collective's start-up expressed in bytes
# (latency × bandwidth). The default `po.CostModel()` takes 1 MiB (a GPU interconnect)
# and costs a training step, forward and backward; `training=False` plans for inference
# (forward only). `po.calibrate()` times an `all_to_all` over the devices at hand with a
# small and a large payload and returns the model it measured (here with a smaller
# payload and fewer repeats than its defaults, to keep this quick); pass it as
# `po.distribute(..., cost=cost)`. The timings, hence the numbers, change from run to
# run.

# %%
cost = po.calibrate(large=1 << 22, repeats=10)
m = cost.measured
print(f"measured: start-up {1e6 * m['latency_s']:.0f} µs, {m['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s per device "
      f"(a local FFT: {m['fft_bytes_per_s'] / 1e9:.2f} GB/s)")
print(f"latency_bytes = {cost.latency_bytes:,.0f}  (the default: {po.CostModel().latency_bytes:,.0f})")

# %% [markdown]
# For a DFT there is little to choose: the cube plan moves the same bytes in the same
# collectives under each of these models (only the cost they put on it differs). The
# model decides where the planner has to trade one collective for another, as for
# weights (notebook 03).

# %%
models = {"default": po.CostModel(), "inference": po.CostModel(training=False), "calibrated": cost}
for name, model in models.items():
    plan = po.distribute(F3, (2, 2, 2), out_partition="auto", cost=model).plan
    print(f"{name:10}  {plan.collectives()['all_to_all']} all_to_all, {plan.bytes / 2**10:.0f} KiB forward,  "
          f"cost {plan.cost[0] / 2**20:.2f} MiB")


# %% [markdown]
# ## Timing against XLA's sharded FFT
#
# The reference is `jax.jit(jnp.fft.fftn)` on the *same* sharded input: XLA's SPMD
# partitioner then chooses the communication. Both run on the same 8 forced CPU devices
# (a handful of real cores), so take the ratio, not the milliseconds. Medians of 10 runs
# after a warm-up, each waited for with `block_until_ready`. XLA gathers each transformed
# axis (its HLO has all-gathers) where parop moves blocks with `all_to_all`.

# %%
def median_ms(f, x, repeats=10):
    f(x).block_until_ready()                 # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))

xla_fftn = jax.jit(jnp.fft.fftn)
for partition in [(8, 1, 1), (2, 2, 2)]:
    D = po.distribute(F3, partition)
    xs = jax.device_put(x, D.in_sharding)
    np.testing.assert_allclose(np.asarray(xla_fftn(xs)), np.asarray(D @ xs), rtol=1e-3, atol=1e-2)
    t_parop, t_xla = median_ms(lambda v: D @ v, xs), median_ms(xla_fftn, xs)
    print(f"{n}³ {partition}:  parop {t_parop:6.1f} ms   jit(jnp.fft.fftn) {t_xla:6.1f} ms   "
          f"({t_xla / t_parop:.1f}x)   XLA's collectives: {hlo_collectives(xla_fftn, xs)}")
