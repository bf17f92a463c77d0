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
# # 03 · Weights, gradients and reductions across devices
#
# A distributed operator is the same linear map as the serial one, and that includes its
# gradients. This notebook shows the three cases where that needs care:
#
# 1. a weight used on every device (a channel-mixing `Matrix` while the grid is split),
# 2. a weight shared across a split *batch* axis,
# 3. a `Reduce` over a split axis, which becomes an all-reduce, with a broadcast as its
#    adjoint.
#
# JAX's convention makes all of them come out right: a replicated value is one logical
# tensor, so its gradient is the sum over the devices, the full gradient. A last section
# shows why the planner costs a training step, the backward pass included.

# %%
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # those 8 devices, also where JAX would pick a GPU

import jax
import jax.numpy as jnp
import numpy as np
import parop as po
import re

rng = np.random.default_rng(0)
key = jax.random.key(0)


def hlo_collectives(f, *args):
    """Collectives in the compiled HLO of the jitted function f (an async start/done pair counts once)."""
    text = f.lower(*args).compile().as_text()
    kinds = ("all-to-all", "all-gather", "all-reduce", "collective-permute")
    return {k: len(re.findall(rf"\b{k}(?:-start)?\(", text)) for k in kinds}


print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")

# %% [markdown]
# ## A channel-mixing convolution on a split grid
#
# The seed convolution `kron(Matrix(50, 50), I(30), I(10))` mixes 50 channels at every
# point of a 30 × 10 grid. With partition `(1, 2, 2)` the grid is split over 4 devices and
# the channel axis, the only one the `Matrix` needs whole, is local already: the forward
# pass moves nothing. The backward pass has one collective, a `psum` of the weight's
# gradient (below). `po.init(D, key)` gives the same values as `po.init(S, key)`, with
# the weight replicated on the mesh.

# %%
S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
D = po.distribute(S, partition=(1, 2, 2))
θ, θs = po.init(D, key), po.init(S, key)
print("same values:", np.array_equal(θ["mix"], θs["mix"]), "  placed as", θ["mix"].sharding.spec)
print(D.plan)

# %% [markdown]
# Forward and gradient (with respect to the weight and the input) of `sum(S x)`, against the
# serial operator. In the backward pass each device computes the weight's gradient from its
# own part of the grid, and JAX sums these partial gradients over the 4 devices: the
# plan's backward `psum`, and the one all-reduce in the compiled gradient.

# %%
x = rng.standard_normal((50, 30, 10)).astype(np.float32)
np.testing.assert_allclose(D(θ) @ x, S(θs) @ x, rtol=1e-5, atol=1e-5)

grad_dist = jax.jit(jax.grad(lambda θ, x: jnp.sum(D(θ) @ x), argnums=(0, 1)))
grad_serial = jax.grad(lambda θ, x: jnp.sum(S(θ) @ x), argnums=(0, 1))
(gw, gx), (sw, sx) = grad_dist(θ, x), grad_serial(θs, x)
np.testing.assert_allclose(gw["mix"], sw["mix"], rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(gx, sx, rtol=1e-4, atol=1e-4)
print("forward, weight gradient and input gradient equal the serial ones")
print("the weight gradient is", gw["mix"].sharding.spec, "(replicated);  input gradient", gx.sharding.spec)
print("collectives in the compiled gradient:", hlo_collectives(grad_dist, θ, x))

# %% [markdown]
# ## Weight sharing across a split batch axis
#
# `Matrix(20, 20)` applied to `x` of shape `(20, 100)`: axis 1 is a trailing batch axis of
# 100 columns, split over 4 devices with partition `(1, 4)`. Each device applies the same
# weight to its 25 columns. Each device's gradient covers only its columns; the gradient
# of the distributed operator is their sum (the plan's backward `psum`), exactly the
# serial gradient over all 100.

# %%
M = po.Matrix(20, 20, name="w")
D = po.distribute(M, partition=(1, 4))
θ = po.init(D, key)
x = rng.standard_normal((20, 100)).astype(np.float32)
np.testing.assert_allclose(D(θ) @ x, M(θ) @ x, rtol=1e-5, atol=1e-5)
print(D.plan_for((100,)))  # `D.plan` is planned for 1024 columns a device, where no batch_shape is given

loss = lambda op: jax.jit(jax.grad(lambda θ, x: jnp.sum((op(θ) @ x) ** 2)))
g_dist, g_serial = loss(D)(θ, x)["w"], loss(M)(θ, x)["w"]
per_device = [loss(M)(θ, x[:, 25 * k:25 * (k + 1)])["w"] for k in range(4)]
np.testing.assert_allclose(g_dist, g_serial, rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(sum(per_device), g_serial, rtol=1e-4, atol=1e-4)
print("distributed gradient == serial gradient == sum of the 4 per-device gradients")
print("one device's gradient alone is off by", float(np.abs(per_device[0] - g_serial).max() / np.abs(g_serial).max()), "(relative)")
print("collectives in the compiled gradient:", hlo_collectives(loss(D), θ, x))

# %% [markdown]
# ## `Reduce` over a split axis is an all-reduce
#
# `Reduce(8)` sums an axis (a 1 × 8 row of ones). With that axis split over 8 devices,
# each device sums its part and a `psum` adds the partial sums: the plan shows it, and the
# compiled HLO has exactly one all-reduce. The reduced axis, now of size 1, comes back
# replicated.

# %%
R = po.kron(po.Reduce(8), po.Identity(100))
D = po.distribute(R, partition=(8, 1))
print(D.plan)

x = jax.device_put(rng.standard_normal((8, 100)).astype(np.float32), D.in_sharding)   # one row per device
y = D @ x
np.testing.assert_allclose(y, np.asarray(x).sum(0, keepdims=True), rtol=1e-5)
run, _ = D.program(())
print("y:", y.shape, y.sharding.spec, "  collectives in the HLO:", hlo_collectives(run, x))

# %% [markdown]
# Its adjoint is a broadcast: the (replicated) sum goes back to every row, each device
# keeps its own (a local slice, no communication forward). `D.H` runs the transpose of
# `D`'s plan. Its backward pass (the gradient of a function of `D.H @ y` with respect to
# `y`) sums over the devices again: the `psum` the plan shows. The gradient of `sum(R x)`
# with respect to `x` is the broadcast applied to ones, so it is all ones, split like
# `x`. The dot test confirms the pair.

# %%
print(D.H.plan)
back = D.H @ y
np.testing.assert_allclose(back, np.broadcast_to(np.asarray(y), (8, 100)))
print("D.H @ y:", back.shape, back.sharding.spec)

gx = jax.grad(lambda x: jnp.sum(D @ x))(x)
np.testing.assert_array_equal(gx, np.ones((8, 100)))
print("grad of sum(D @ x):", gx.shape, gx.sharding.spec, "all ones")
print(f"dot test: {po.testing.dot_test(D):.1e}")

# %% [markdown]
# ## Training or inference: the machine model
#
# Where an operator has a weight, the planner often has a real choice, and the backward
# pass can decide it. `Matrix(512, 512)` on `(512, 64)` with its input axis split over 8
# devices: costed for a training step (the default `po.CostModel()`), the planner runs
# it *row-parallel*: each device keeps the 64 columns of the weight that meet its rows of
# the input, and a `psum_scatter` adds the partial products (its transpose, in the
# backward pass, is an `all_gather`). Costed for inference only, with no start-up cost
# per collective (`po.CostModel(latency_bytes=0, training=False)`), moving the
# activations is cheaper forward (two small `all_to_all`s, the weight replicated), but
# its backward pass would all-reduce the whole weight gradient:

# %%
M = po.Matrix(512, 512, name="w")
for cost in [po.CostModel(), po.CostModel(latency_bytes=0, training=False)]:
    D = po.distribute(M, partition=(8, 1), cost=cost)
    print(D.plan_for((64,)))                  # the plan for 64 trailing columns
    print("the weight is kept as", D.param_shardings()["w"].spec)
    print()
