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
# # 01 · The operator algebra
#
# A parop operator is a linear map with shapes and dtypes. Operators compose like
# matrices (`po.kron`, `@`, `+`, `.H`, `.T`), are JAX values (a `jax.jit`ted function
# takes them as arguments), hold their weights outside themselves (a plain dict, so
# `jax.grad` and `optax` work directly), and can always be checked against a dense
# matrix. This notebook stays on one device; the next ones distribute the same
# operators.
#
# The first cell forces 8 CPU devices, as every notebook in this series does. The flag
# must be set before `jax` is imported.

# %%
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported

import jax
import jax.numpy as jnp
import numpy as np
import parop as po
rng = np.random.default_rng(0)
key = jax.random.key(0)
print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")

# %% [markdown]
# ## Leaves and the Kronecker product
#
# `po.DFT(n, dtype)` is the discrete Fourier transform along one axis. A complex DFT maps
# n values to n; a real one (`float32`) is `rfft` and maps n reals to n//2 + 1 complex
# values. `po.kron(A0, A1, A2)` acts on a row-major tensor of shape
# `A0.domain_shape + A1.domain_shape + A2.domain_shape`, factor *i* on axis *i*. Here is the
# seed example, a real 3-D DFT:

# %%
Fz = po.DFT(30, jnp.complex64)
Fy = po.DFT(20, jnp.complex64)
Fx = po.DFT(10, jnp.float32)          # real -> complex: 10 -> 10//2 + 1 = 6
F = po.kron(Fz, Fy, Fx)
print(repr(F))
print(f"domain {F.domain_shape} {F.dtype}  ->  range {F.range_shape} {F.range_dtype};  as a matrix {F.shape}")

# %% [markdown]
# `F @ x` applies it to a tensor of the domain's shape. It is NumPy's `rfftn`. Any
# trailing axes are batch axes, and a flat vector gives a flat result:

# %%
x = rng.standard_normal((30, 20, 10)).astype(np.float32)
y = F @ x
want = np.fft.rfftn(x)
print(y.shape, y.dtype, "  relative error vs np.fft.rfftn:", float(np.abs(y - want).max() / np.abs(want).max()))

xb = rng.standard_normal((30, 20, 10, 4)).astype(np.float32)
print("with a batch axis:", (F @ xb).shape, "  flat:", (F @ x.reshape(-1)).shape)

# %% [markdown]
# ## Composition, sums and the adjoint
#
# `A @ B` applies `B` first. For example, the low-mode filter of a Fourier neural operator is
# a `Restriction` after a `DFT`: it keeps the 6 lowest and the 6 highest frequencies of
# 32. `A.H` is the exact adjoint (the conjugate transpose); for a DFT it is *not* the
# inverse, which is `A.inverse()`. Sums and scalar multiples work as well.

# %%
L = po.Restriction(32, [slice(0, 6), slice(-6, None)]) @ po.DFT(32)
v = (rng.standard_normal(32) + 1j * rng.standard_normal(32)).astype(np.complex64)
np.testing.assert_allclose(L @ v, np.fft.fft(v)[np.r_[0:6, -6:0]], atol=1e-4)
print(f"L   = {L!r}: {L.domain_shape} -> {L.range_shape}")
print(f"L.H = {L.H!r}: {L.H.domain_shape} -> {L.H.range_shape};  L.H.H is L: {L.H.H is L}")

x_back = F.inverse() @ (F @ x)      # irfft on the last axis, ifft on the others
print("F.inverse() @ F @ x == x:", np.allclose(x_back, x, atol=1e-5))

T = po.DFT(8) + 2 * po.Identity(8)
print(f"T = {T!r}:", np.allclose(po.to_dense(T), np.fft.fft(np.eye(8), axis=0) + 2 * np.eye(8), atol=1e-5))

# %% [markdown]
# ## Operators are JAX values
#
# An operator is a pytree: its structure (sizes, dtypes, names) is static data and its
# only array leaves are traced scalars. So a jitted function takes operators as
# arguments, and two operators built the same way are equal (`==`) and share one trace.
# The list below grows only while JAX traces:

# %%
traces = []

@jax.jit
def apply(A, x):
    traces.append(repr(A))      # Python side effect: runs when JAX traces, not per call
    return A @ x

L_again = po.Restriction(32, [slice(0, 6), slice(-6, None)]) @ po.DFT(32)
np.testing.assert_allclose(apply(L, v), L @ v, rtol=1e-5, atol=1e-4)
apply(L_again, v)                 # equal to L: the same trace
print("L == L_again:", L == L_again, "  L is L_again:", L is L_again, "  traces:", traces)

# %% [markdown]
# `c * A` with `c` a 0-d JAX array keeps `c` as a leaf of the pytree: a new value is no
# new trace, and `jax.grad` differentiates with respect to it. Below, two scalings of `L`
# add one trace between them, and the derivative of ‖(DFT + c·I) x‖² in `c` matches
# its formula, 2 Re⟨x, F x + c x⟩:

# %%
apply(jnp.float32(2.0) * L, v)
apply(jnp.float32(3.0) * L, v)
print("traces:", traces)

def energy(c, x):
    return jnp.sum(jnp.abs((po.DFT(8) + c * po.Identity(8)) @ x) ** 2)

x8 = (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64)
c = jnp.float32(0.5)
formula = 2 * np.real(np.vdot(x8, np.fft.fft(x8) + c * x8))
print(f"d/dc: jax.grad {float(jax.jit(jax.grad(energy))(c, x8)):.4f},  formula {formula:.4f}")

# %% [markdown]
# `A.T` is the transpose, `conj(A.H conj(y))`: for a complex-linear operator the matrix
# transpose (not conjugated), and what `jax.linear_transpose` of `x ↦ A @ x` computes.

# %%
w = (rng.standard_normal(12) + 1j * rng.standard_normal(12)).astype(np.complex64)
(transposed,) = jax.linear_transpose(lambda x: L @ x, v)(w)
print(f"L.T = {L.T!r}")
print("to_dense(L.T) == to_dense(L).T:", np.allclose(po.to_dense(L.T), po.to_dense(L).T, atol=1e-5))
print("L.T @ w == jax.linear_transpose:", np.allclose(L.T @ w, transposed, atol=1e-4))

# %% [markdown]
# ## Parameters
#
# A parametric leaf (`Matrix`, `Diagonal`, `PerModeMatrix`) holds no array. `po.init(A, key)`
# returns a plain dict `{name: array}` and `A(θ) @ x` applies `A` with those weights, so a
# gradient with respect to θ is an ordinary `jax.grad`. The seed convolution mixes the 50
# channels at every point of a 30 × 10 grid:

# %%
S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
θ = po.init(S, key)
print({name: (w.shape, str(w.dtype)) for name, w in θ.items()})

x = rng.standard_normal((50, 30, 10)).astype(np.float32)
y = S(θ) @ x                                       # the same as S.apply(θ, x)
np.testing.assert_allclose(y, np.einsum("ij,jkl->ikl", θ["mix"], x), rtol=1e-4, atol=1e-4)

g = jax.grad(lambda θ: jnp.sum(S(θ) @ x))(θ)
# d/dW_ij of sum(W x) is the sum of x[j] over the grid
np.testing.assert_allclose(g["mix"], np.broadcast_to(x.sum((1, 2)), (50, 50)), rtol=1e-4)
print("forward and gradient match NumPy")

# %% [markdown]
# ## Names and shared weights
#
# A weight's key is the leaf's `name=`, or, for an unnamed leaf, the name the operator it is
# used in gives it (`Matrix_0`, `Matrix_1`, … in order of appearance): the same whenever the
# same code builds the operator, in this process or a fresh one. The same leaf used twice is
# **one** weight, and so are two leaves given the same name; two unnamed leaves built
# separately are two. Below, `A = kron(W, W)` applies one 4 × 4 matrix to both axes of a 4 × 4
# tensor (`W X Wᵀ`), and its gradient sums both uses, as `jax.grad` of the plain formula
# does. Two leaves that share a name but not a shape are an error.

# %%
W = po.Matrix(4, 4, name="w")
A = po.kron(W, W)
B = po.kron(po.Matrix(4, 4, name="w"), po.Matrix(4, 4))      # a second "w" and an unnamed leaf
print("A's weights:", sorted(po.init(A, key)), "  B's weights:", sorted(po.init(B, key)))

θA = po.init(A, key)
X = rng.standard_normal((4, 4)).astype(np.float32)
np.testing.assert_allclose(A(θA) @ X, θA["w"] @ X @ θA["w"].T, rtol=1e-5, atol=1e-5)
g_op = jax.grad(lambda θ: jnp.sum((A(θ) @ X) ** 2))(θA)["w"]
g_formula = jax.grad(lambda w: jnp.sum((w @ X @ w.T) ** 2))(θA["w"])
np.testing.assert_allclose(g_op, g_formula, rtol=1e-4)
print("the shared weight's gradient is the sum over both uses")

try:
    po.init(po.kron(po.Matrix(4, 4, name="w"), po.Matrix(3, 3, name="w")), key)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## The dense view
#
# `po.to_dense(A, θ)` is the `A.shape` matrix: column *j* is `A` applied to the *j*-th unit
# vector of the C-order flattened domain. It pins the conventions down against NumPy: a
# `DFT` is `np.fft.fft` of the identity, a real `DFT` is `np.fft.rfft`, and `po.kron` is
# `np.kron`, even across real and complex factors with a weight in the middle.

# %%
print("DFT(8)         == fft(eye(8)): ", np.allclose(po.to_dense(po.DFT(8)), np.fft.fft(np.eye(8), axis=0), atol=1e-5))
print("DFT(8, float32) == rfft(eye(8)):", np.allclose(po.to_dense(po.DFT(8, jnp.float32)), np.fft.rfft(np.eye(8), axis=0), atol=1e-5))

K = po.kron(po.DFT(4), po.Matrix(3, 5, name="m"), po.DFT(6, jnp.float32))
θK = po.init(K, key)
dense = po.to_dense(K, θK)
reference = np.kron(np.kron(np.fft.fft(np.eye(4), axis=0), θK["m"]), np.fft.rfft(np.eye(6), axis=0))
print(f"{K!r}: a {dense.shape} matrix;  == np.kron of the factors:", np.allclose(dense, reference, atol=1e-5))
print("to_dense(K.H) == to_dense(K)ᴴ:", np.allclose(po.to_dense(K.H, θK), dense.conj().T, atol=1e-5))

# %% [markdown]
# ## The dot test
#
# `po.testing.dot_test(A, θ)` draws random `x`, `y` and returns the relative mismatch
# between `<A x, y>` and `<x, A.H y>` (real parts where the domain or the range is real:
# a real DFT is only real-linear). A correct adjoint gives float32 rounding, about 1e-7.
# Every operator above passes:

# %%
for op, params in [(F, None), (L, None), (L.T, None), (T, None), (S, θ), (A, θA), (K, θK)]:
    print(f"{po.testing.dot_test(op, params):8.1e}   {op!r}")

# %% [markdown]
# ## Looking at an operator
#
# `repr` is one line; `po.tree` shows the tree with every node's shapes and dtypes. Here is
# a spectral filter, `L.H @ Diagonal @ L` (a learnable weight per kept mode):

# %%
G = L.H @ po.Diagonal(12, jnp.complex64, name="filter") @ L
print(repr(G))
print(po.tree(G))

# %% [markdown]
# In Jupyter, evaluating an operator shows the same tree as a table, with each leaf's
# parameters:

# %%
po.kron(po.Matrix(50, 50, name="mix"), G)
