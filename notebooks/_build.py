"""Writes the tutorial notebooks from the cells below, and (with `--execute`) runs them
and saves them with their outputs.

    python notebooks/_build.py                 # write the five notebooks, no outputs
    python notebooks/_build.py --execute       # write, run top to bottom, save with outputs
    python notebooks/_build.py --execute 04    # only the notebooks whose name contains "04"

Edit the cells here, not in the `.ipynb` files. The kernel is `python3` from the
interpreter running this script; the repository root is put on its `PYTHONPATH`, so
the notebooks run from a checkout without installing `parop`.
`PAROP_NOTEBOOK_STEPS` sets the FNO's training steps in notebooks 04 (default 1200) and
05 (default 300); the test suite runs them with 20.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from textwrap import dedent

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SETUP = '''
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # before jax is imported

import jax
import jax.numpy as jnp
import numpy as np
import parop as po
'''


def md(text: str):
    return new_markdown_cell(dedent(text).strip())


def code(*parts: str):
    return new_code_cell("\n".join(dedent(p).strip("\n") for p in parts).strip())


# -- 01 ----------------------------------------------------------------------------------

OPERATOR_ALGEBRA = [
    md("""
    # 01 · The operator algebra

    A parop operator is a linear map with shapes and dtypes. Operators compose like
    matrices (`po.kron`, `@`, `+`, `.H`, `.T`), are JAX values (a `jax.jit`ted function
    takes them as arguments), hold their weights outside themselves (a plain dict, so
    `jax.grad` and `optax` work directly), and can always be checked against a dense
    matrix. This notebook stays on one device; the next ones distribute the same
    operators.

    The first cell forces 8 CPU devices, as every notebook in this series does. The flag
    must be set before `jax` is imported.
    """),
    code(SETUP, '''
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    '''),
    md("""
    ## Leaves and the Kronecker product

    `po.DFT(n, dtype)` is the discrete Fourier transform along one axis. A complex DFT maps
    n values to n; a real one (`float32`) is `rfft` and maps n reals to n//2 + 1 complex
    values. `po.kron(A0, A1, A2)` acts on a row-major tensor of shape
    `A0.domain_shape + A1.domain_shape + A2.domain_shape`, factor *i* on axis *i*. Here is the
    seed example, a real 3-D DFT:
    """),
    code('''
    Fz = po.DFT(30, jnp.complex64)
    Fy = po.DFT(20, jnp.complex64)
    Fx = po.DFT(10, jnp.float32)          # real -> complex: 10 -> 10//2 + 1 = 6
    F = po.kron(Fz, Fy, Fx)
    print(repr(F))
    print(f"domain {F.domain_shape} {F.dtype}  ->  range {F.range_shape} {F.range_dtype};  as a matrix {F.shape}")
    '''),
    md("""
    `F @ x` applies it to a tensor of the domain's shape. It is NumPy's `rfftn`. Any
    trailing axes are batch axes, and a flat vector gives a flat result:
    """),
    code('''
    x = rng.standard_normal((30, 20, 10)).astype(np.float32)
    y = F @ x
    want = np.fft.rfftn(x)
    print(y.shape, y.dtype, "  relative error vs np.fft.rfftn:", float(np.abs(y - want).max() / np.abs(want).max()))

    xb = rng.standard_normal((30, 20, 10, 4)).astype(np.float32)
    print("with a batch axis:", (F @ xb).shape, "  flat:", (F @ x.reshape(-1)).shape)
    '''),
    md("""
    ## Composition, sums and the adjoint

    `A @ B` applies `B` first. For example, the low-mode filter of a Fourier neural operator is
    a `Restriction` after a `DFT`: it keeps the 6 lowest and the 6 highest frequencies of
    32. `A.H` is the exact adjoint (the conjugate transpose); for a DFT it is *not* the
    inverse, which is `A.inverse()`. Sums and scalar multiples work as well.
    """),
    code('''
    L = po.Restriction(32, [slice(0, 6), slice(-6, None)]) @ po.DFT(32)
    v = (rng.standard_normal(32) + 1j * rng.standard_normal(32)).astype(np.complex64)
    np.testing.assert_allclose(L @ v, np.fft.fft(v)[np.r_[0:6, -6:0]], atol=1e-4)
    print(f"L   = {L!r}: {L.domain_shape} -> {L.range_shape}")
    print(f"L.H = {L.H!r}: {L.H.domain_shape} -> {L.H.range_shape};  L.H.H is L: {L.H.H is L}")

    x_back = F.inverse() @ (F @ x)      # irfft on the last axis, ifft on the others
    print("F.inverse() @ F @ x == x:", np.allclose(x_back, x, atol=1e-5))

    T = po.DFT(8) + 2 * po.Identity(8)
    print(f"T = {T!r}:", np.allclose(po.to_dense(T), np.fft.fft(np.eye(8), axis=0) + 2 * np.eye(8), atol=1e-5))
    '''),
    md("""
    ## Operators are JAX values

    An operator is a pytree: its structure (sizes, dtypes, names) is static data and its
    only array leaves are traced scalars. So a jitted function takes operators as
    arguments, and two operators built the same way are equal (`==`) and share one trace.
    The list below grows only while JAX traces:
    """),
    code('''
    traces = []

    @jax.jit
    def apply(A, x):
        traces.append(repr(A))      # Python side effect: runs when JAX traces, not per call
        return A @ x

    L_again = po.Restriction(32, [slice(0, 6), slice(-6, None)]) @ po.DFT(32)
    np.testing.assert_allclose(apply(L, v), L @ v, rtol=1e-5, atol=1e-4)
    apply(L_again, v)                 # equal to L: the same trace
    print("L == L_again:", L == L_again, "  L is L_again:", L is L_again, "  traces:", traces)
    '''),
    md("""
    `c * A` with `c` a 0-d JAX array keeps `c` as a leaf of the pytree: a new value is no
    new trace, and `jax.grad` differentiates with respect to it. Below, two scalings of `L`
    add one trace between them, and the derivative of ‖(DFT + c·I) x‖² in `c` matches
    its formula, 2 Re⟨x, F x + c x⟩:
    """),
    code('''
    apply(jnp.float32(2.0) * L, v)
    apply(jnp.float32(3.0) * L, v)
    print("traces:", traces)

    def energy(c, x):
        return jnp.sum(jnp.abs((po.DFT(8) + c * po.Identity(8)) @ x) ** 2)

    x8 = (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64)
    c = jnp.float32(0.5)
    formula = 2 * np.real(np.vdot(x8, np.fft.fft(x8) + c * x8))
    print(f"d/dc: jax.grad {float(jax.jit(jax.grad(energy))(c, x8)):.4f},  formula {formula:.4f}")
    '''),
    md("""
    `A.T` is the transpose, `conj(A.H conj(y))`: for a complex-linear operator the matrix
    transpose (not conjugated), and what `jax.linear_transpose` of `x ↦ A @ x` computes.
    """),
    code('''
    w = (rng.standard_normal(12) + 1j * rng.standard_normal(12)).astype(np.complex64)
    (transposed,) = jax.linear_transpose(lambda x: L @ x, v)(w)
    print(f"L.T = {L.T!r}")
    print("to_dense(L.T) == to_dense(L).T:", np.allclose(po.to_dense(L.T), po.to_dense(L).T, atol=1e-5))
    print("L.T @ w == jax.linear_transpose:", np.allclose(L.T @ w, transposed, atol=1e-4))
    '''),
    md("""
    ## Parameters

    A parametric leaf (`Matrix`, `Diagonal`, `PerModeMatrix`) holds no array. `po.init(A, key)`
    returns a plain dict `{name: array}` and `A(θ) @ x` applies `A` with those weights, so a
    gradient with respect to θ is an ordinary `jax.grad`. The seed convolution mixes the 50
    channels at every point of a 30 × 10 grid:
    """),
    code('''
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
    '''),
    md("""
    ## Names and shared weights

    A weight's key is the leaf's `name=`, or a name generated when the leaf is built
    (`Matrix_0`, …). The same leaf used twice is **one** weight, and so are two leaves given
    the same name. Below, `A = kron(W, W)` applies one 4 × 4 matrix to both axes of a 4 × 4
    tensor (`W X Wᵀ`), and its gradient sums both uses, as `jax.grad` of the plain formula
    does. Two leaves that share a name but not a shape are an error.
    """),
    code('''
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
    '''),
    md("""
    ## The dense view

    `po.to_dense(A, θ)` is the `A.shape` matrix: column *j* is `A` applied to the *j*-th unit
    vector of the C-order flattened domain. It pins the conventions down against NumPy: a
    `DFT` is `np.fft.fft` of the identity, a real `DFT` is `np.fft.rfft`, and `po.kron` is
    `np.kron`, even across real and complex factors with a weight in the middle.
    """),
    code('''
    print("DFT(8)         == fft(eye(8)): ", np.allclose(po.to_dense(po.DFT(8)), np.fft.fft(np.eye(8), axis=0), atol=1e-5))
    print("DFT(8, float32) == rfft(eye(8)):", np.allclose(po.to_dense(po.DFT(8, jnp.float32)), np.fft.rfft(np.eye(8), axis=0), atol=1e-5))

    K = po.kron(po.DFT(4), po.Matrix(3, 5, name="m"), po.DFT(6, jnp.float32))
    θK = po.init(K, key)
    dense = po.to_dense(K, θK)
    reference = np.kron(np.kron(np.fft.fft(np.eye(4), axis=0), θK["m"]), np.fft.rfft(np.eye(6), axis=0))
    print(f"{K!r}: a {dense.shape} matrix;  == np.kron of the factors:", np.allclose(dense, reference, atol=1e-5))
    print("to_dense(K.H) == to_dense(K)ᴴ:", np.allclose(po.to_dense(K.H, θK), dense.conj().T, atol=1e-5))
    '''),
    md("""
    ## The dot test

    `po.testing.dot_test(A, θ)` draws random `x`, `y` and returns the relative mismatch
    between `<A x, y>` and `<x, A.H y>` (real parts where the domain or the range is real:
    a real DFT is only real-linear). A correct adjoint gives float32 rounding, about 1e-7.
    Every operator above passes:
    """),
    code('''
    for op, params in [(F, None), (L, None), (L.T, None), (T, None), (S, θ), (A, θA), (K, θK)]:
        print(f"{po.testing.dot_test(op, params):8.1e}   {op!r}")
    '''),
    md("""
    ## Looking at an operator

    `repr` is one line; `po.tree` shows the tree with every node's shapes and dtypes. Here is
    a spectral filter, `L.H @ Diagonal @ L` (a learnable weight per kept mode):
    """),
    code('''
    G = L.H @ po.Diagonal(12, jnp.complex64, name="filter") @ L
    print(repr(G))
    print(po.tree(G))
    '''),
    md("""
    In Jupyter, evaluating an operator shows the same tree as a table, with each leaf's
    parameters:
    """),
    code('''
    po.kron(po.Matrix(50, 50, name="mix"), G)
    '''),
]

# -- 02 ----------------------------------------------------------------------------------

DISTRIBUTED_FFT = [
    md("""
    # 02 · A distributed FFT

    `po.distribute(A, partition)` turns an operator into one `jax.shard_map` program over a
    device mesh. It is the **same linear map** as `A` on global arrays; only where the data
    lives changes. Axes that an operator needs whole (a `DFT`'s) are made local by
    `all_to_all` repartitions that a planner chooses so that the fewest bytes move; no
    step gathers a whole array onto one device.

    The 8 devices are forced CPU devices, so the collectives are real but the timings only
    show the shape of the costs.
    """),
    code(SETUP, '''
    import re
    import time

    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    '''),
    md("""
    ## The seed: a real 3-D DFT split in two

    The partition has one entry per input axis: `(2, 1, 1)` splits axis 0 (size 30) over 2
    devices. `D @ x` takes a global array (host data, or a `jax.Array` with any sharding)
    and returns a global array sharded as `D.out_sharding`. It is still `np.fft.rfftn`:
    """),
    code('''
    F = po.kron(po.DFT(30, jnp.complex64), po.DFT(20, jnp.complex64), po.DFT(10, jnp.float32))
    D = po.distribute(F, partition=(2, 1, 1))

    x = rng.standard_normal((30, 20, 10)).astype(np.float32)
    y = D @ x
    want = np.fft.rfftn(x)
    print(y.shape, y.dtype, "  relative error vs np.fft.rfftn:", float(np.abs(y - want).max() / np.abs(want).max()))
    print("in:", D.in_sharding.spec, "  out:", D.out_sharding.spec, "  y:", y.sharding.spec)
    np.testing.assert_allclose(D.H @ y, F.H @ y, rtol=1e-4, atol=1e-2)   # the adjoint is distributed too
    '''),
    md("""
    `D.plan` is the program. Read it top to bottom: every line runs on each device's block;
    an `all_to_all` names the mesh axis it moves, from which tensor axis to which, and the
    layout afterwards. Each collective shows the bytes one device sends forward (`fwd`) and
    in the backward pass of `jax.grad` (`bwd`: JAX runs the transposed program, and the
    transpose of an `all_to_all` is the reverse `all_to_all`); the last two lines add them
    up. Plans are costed for a training step, forward and backward (see the machine model
    below). Here the split moves to axis 1 *before* the real DFT (real data is smaller
    than its spectrum: 5.9 KiB against 7.0 KiB), and back at the end so that the output
    has the input's layout.
    """),
    code('''
    print(D.plan)
    '''),
    md("""
    ## A 64³ complex FFT on 8 devices

    Two classic decompositions: *slabs* `(8, 1, 1)` and *cubes* `(2, 2, 2)`. With
    `out_partition=None` the output comes back in the input's layout; with `"auto"` the
    planner may end in any layout, which saves the moves back (`D.out_sharding` says where
    the result lives). For each case we compile the program and count its collectives in
    the HLO: they are what the plan says, and there is never an all-gather.
    """),
    code('''
    def hlo_collectives(f, *args):
        """Collectives in the compiled HLO of the jitted function f (an async start/done pair counts once)."""
        text = f.lower(*args).compile().as_text()
        kinds = ("all-to-all", "all-gather", "all-reduce", "collective-permute")
        return {k: len(re.findall(rf"\\b{k}(?:-start)?\\(", text)) for k in kinds}

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
    '''),
    md("""
    The cube decomposition with `out_partition="auto"` needs only 3 `all_to_all`s, one per
    axis: each moves a split off the axis about to be transformed onto one already done,
    and the result stays in the layout it reached.
    """),
    code('''
    print(po.distribute(F3, (2, 2, 2), out_partition="auto").plan)
    '''),
    md("""
    ## The machine model

    The planner minimises a cost counted in bytes: for each collective, the bytes one
    device sends plus `latency_bytes`, a collective's start-up expressed in bytes
    (latency × bandwidth). The default `po.CostModel()` takes 1 MiB (a GPU interconnect)
    and costs a training step, forward and backward; `training=False` plans for inference
    (forward only). `po.calibrate()` times an `all_to_all` over the devices at hand with a
    small and a large payload and returns the model it measured (here with a smaller
    payload and fewer repeats than its defaults, to keep this quick); pass it as
    `po.distribute(..., cost=cost)`. The timings, hence the numbers, change from run to
    run.
    """),
    code('''
    cost = po.calibrate(large=1 << 22, repeats=10)
    m = cost.measured
    print(f"measured: start-up {1e6 * m['latency_s']:.0f} µs, {m['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s per device "
          f"(a local FFT: {m['fft_bytes_per_s'] / 1e9:.2f} GB/s)")
    print(f"latency_bytes = {cost.latency_bytes:,.0f}  (the default: {po.CostModel().latency_bytes:,.0f})")
    '''),
    md("""
    For a DFT there is little to choose: the cube plan moves the same bytes in the same
    collectives under each of these models (only the cost they put on it differs). The
    model decides where the planner has to trade one collective for another, as for
    weights (notebook 03).
    """),
    code('''
    models = {"default": po.CostModel(), "inference": po.CostModel(training=False), "calibrated": cost}
    for name, model in models.items():
        plan = po.distribute(F3, (2, 2, 2), out_partition="auto", cost=model).plan
        print(f"{name:10}  {plan.collectives()['all_to_all']} all_to_all, {plan.bytes / 2**10:.0f} KiB forward,  "
              f"cost {plan.cost[0] / 2**20:.2f} MiB")
    '''),
    md("""
    ## Timing against XLA's sharded FFT

    The reference is `jax.jit(jnp.fft.fftn)` on the *same* sharded input: XLA's SPMD
    partitioner then chooses the communication. Both run on the same 8 forced CPU devices
    (a handful of real cores), so take the ratio, not the milliseconds. Medians of 10 runs
    after a warm-up, each waited for with `block_until_ready`. XLA gathers each transformed
    axis (its HLO has all-gathers) where parop moves blocks with `all_to_all`.
    """),
    code('''
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
    '''),
]

# -- 03 ----------------------------------------------------------------------------------

WEIGHT_SHARING = [
    md("""
    # 03 · Weights, gradients and reductions across devices

    A distributed operator is the same linear map as the serial one, and that includes its
    gradients. This notebook shows the three cases where that needs care:

    1. a weight used on every device (a channel-mixing `Matrix` while the grid is split),
    2. a weight shared across a split *batch* axis,
    3. a `Reduce` over a split axis, which becomes an all-reduce, with a broadcast as its
       adjoint.

    JAX's convention makes all of them come out right: a replicated value is one logical
    tensor, so its gradient is the sum over the devices, the full gradient. A last section
    shows why the planner costs a training step, the backward pass included.
    """),
    code(SETUP, '''
    import re

    rng = np.random.default_rng(0)
    key = jax.random.key(0)


    def hlo_collectives(f, *args):
        """Collectives in the compiled HLO of the jitted function f (an async start/done pair counts once)."""
        text = f.lower(*args).compile().as_text()
        kinds = ("all-to-all", "all-gather", "all-reduce", "collective-permute")
        return {k: len(re.findall(rf"\\b{k}(?:-start)?\\(", text)) for k in kinds}


    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    '''),
    md("""
    ## A channel-mixing convolution on a split grid

    The seed convolution `kron(Matrix(50, 50), I(30), I(10))` mixes 50 channels at every
    point of a 30 × 10 grid. With partition `(1, 2, 2)` the grid is split over 4 devices and
    the channel axis, the only one the `Matrix` needs whole, is local already: the forward
    pass moves nothing. The backward pass has one collective, a `psum` of the weight's
    gradient (below). `po.init(D, key)` gives the same values as `po.init(S, key)`, with
    the weight replicated on the mesh.
    """),
    code('''
    S = po.kron(po.Matrix(50, 50, name="mix"), po.Identity(30), po.Identity(10))
    D = po.distribute(S, partition=(1, 2, 2))
    θ, θs = po.init(D, key), po.init(S, key)
    print("same values:", np.array_equal(θ["mix"], θs["mix"]), "  placed as", θ["mix"].sharding.spec)
    print(D.plan)
    '''),
    md("""
    Forward and gradient (with respect to the weight and the input) of `sum(S x)`, against the
    serial operator. In the backward pass each device computes the weight's gradient from its
    own part of the grid, and JAX sums these partial gradients over the 4 devices: the
    plan's backward `psum`, and the one all-reduce in the compiled gradient.
    """),
    code('''
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
    '''),
    md("""
    ## Weight sharing across a split batch axis

    `Matrix(20, 20)` applied to `x` of shape `(20, 100)`: axis 1 is a trailing batch axis of
    100 columns, split over 4 devices with partition `(1, 4)`. Each device applies the same
    weight to its 25 columns. Each device's gradient covers only its columns; the gradient
    of the distributed operator is their sum (the plan's backward `psum`), exactly the
    serial gradient over all 100.
    """),
    code('''
    M = po.Matrix(20, 20, name="w")
    D = po.distribute(M, partition=(1, 4))
    θ = po.init(D, key)
    x = rng.standard_normal((20, 100)).astype(np.float32)
    np.testing.assert_allclose(D(θ) @ x, M(θ) @ x, rtol=1e-5, atol=1e-5)
    print(D.plan)

    loss = lambda op: jax.jit(jax.grad(lambda θ, x: jnp.sum((op(θ) @ x) ** 2)))
    g_dist, g_serial = loss(D)(θ, x)["w"], loss(M)(θ, x)["w"]
    per_device = [loss(M)(θ, x[:, 25 * k:25 * (k + 1)])["w"] for k in range(4)]
    np.testing.assert_allclose(g_dist, g_serial, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sum(per_device), g_serial, rtol=1e-4, atol=1e-4)
    print("distributed gradient == serial gradient == sum of the 4 per-device gradients")
    print("one device's gradient alone is off by", float(np.abs(per_device[0] - g_serial).max() / np.abs(g_serial).max()), "(relative)")
    print("collectives in the compiled gradient:", hlo_collectives(loss(D), θ, x))
    '''),
    md("""
    ## `Reduce` over a split axis is an all-reduce

    `Reduce(8)` sums an axis (a 1 × 8 row of ones). With that axis split over 8 devices,
    each device sums its part and a `psum` adds the partial sums: the plan shows it, and the
    compiled HLO has exactly one all-reduce. The reduced axis, now of size 1, comes back
    replicated.
    """),
    code('''
    R = po.kron(po.Reduce(8), po.Identity(100))
    D = po.distribute(R, partition=(8, 1))
    print(D.plan)

    x = jax.device_put(rng.standard_normal((8, 100)).astype(np.float32), D.in_sharding)   # one row per device
    y = D @ x
    np.testing.assert_allclose(y, np.asarray(x).sum(0, keepdims=True), rtol=1e-5)
    run, _ = D.program(())
    print("y:", y.shape, y.sharding.spec, "  collectives in the HLO:", hlo_collectives(run, x))
    '''),
    md("""
    Its adjoint is a broadcast: the (replicated) sum goes back to every row, each device
    keeps its own (a local slice, no communication forward). `D.H` runs the transpose of
    `D`'s plan. Its backward pass (the gradient of a function of `D.H @ y` with respect to
    `y`) sums over the devices again: the `psum` the plan shows. The gradient of `sum(R x)`
    with respect to `x` is the broadcast applied to ones, so it is all ones, split like
    `x`. The dot test confirms the pair.
    """),
    code('''
    print(D.H.plan)
    back = D.H @ y
    np.testing.assert_allclose(back, np.broadcast_to(np.asarray(y), (8, 100)))
    print("D.H @ y:", back.shape, back.sharding.spec)

    gx = jax.grad(lambda x: jnp.sum(D @ x))(x)
    np.testing.assert_array_equal(gx, np.ones((8, 100)))
    print("grad of sum(D @ x):", gx.shape, gx.sharding.spec, "all ones")
    print(f"dot test: {po.testing.dot_test(D):.1e}")
    '''),
    md("""
    ## Training or inference: the machine model

    Where an operator has a weight, the planner often has a real choice, and the backward
    pass can decide it. `Matrix(512, 512)` on `(512, 64)` with its input axis split over 8
    devices: costed for a training step (the default `po.CostModel()`), the planner runs
    it *row-parallel*: each device keeps the 64 columns of the weight that meet its rows of
    the input, and a `psum_scatter` adds the partial products (its transpose, in the
    backward pass, is an `all_gather`). Costed for inference only, with no start-up cost
    per collective (`po.CostModel(latency_bytes=0, training=False)`), moving the
    activations is cheaper forward (two small `all_to_all`s, the weight replicated), but
    its backward pass would all-reduce the whole weight gradient:
    """),
    code('''
    M = po.Matrix(512, 512, name="w")
    for cost in [po.CostModel(), po.CostModel(latency_bytes=0, training=False)]:
        D = po.distribute(M, partition=(8, 1), cost=cost)
        print(D.plan_for((64,)))                  # the plan for 64 trailing columns
        print("the weight is kept as", D.param_shardings()["w"].spec)
        print()
    '''),
]

# -- 04 ----------------------------------------------------------------------------------

DISTRIBUTED_FNO = [
    md("""
    # 04 · A distributed Fourier neural operator

    A 2-D Fourier neural operator (Li et al. 2020) learns the map from the coefficient
    field `a` of a Darcy flow problem, −∇·(a ∇u) = 1 on the unit square, to its solution `u`.
    `parop.nn.FNO` builds every linear map of the network from parop operators (a `Matrix` on
    the channel axis for lifting, skip connections and projection; `Restriction @ DFT`, a
    `PerModeMatrix` and the way back for each spectral convolution), so the whole network
    distributes with `model.distribute(partition)`: here the 32 × 32 grid is split 2 × 4
    over 8 devices.

    `PAROP_NOTEBOOK_STEPS` sets the number of training steps: 1200 by default (the full
    run, about 30 epochs of the 800 training samples); the test suite runs this notebook
    with 20, and the outputs saved with it come from such a quick run.
    """),
    code(SETUP, '''
    import time

    import warnings

    import matplotlib.pyplot as plt

    from parop.datasets import darcy_flow
    from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit, relative_l2

    STEPS = int(os.environ.get("PAROP_NOTEBOOK_STEPS", 1200))
    plt.rcParams.update({"figure.dpi": 80, "font.size": 8})
    warnings.filterwarnings("ignore", message="IProgress not found")  # no ipywidgets: tqdm draws a text bar
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, {STEPS} training steps")
    '''),
    md("""
    ## Data

    `darcy_flow` samples piecewise-constant coefficients (12 or 3, a thresholded Gaussian
    random field) and solves the equation with a finite-difference scheme, in code, in about
    a second: 1000 pairs on a 32 × 32 grid, 800 to train and 200 to test. Inputs and
    outputs are normalised pointwise as in the FNO paper; the loss and the error are
    measured on the decoded solution. The FNO's tensors are `(batch, channel, x, y)`, so
    both get a channel axis.
    """),
    code('''
    a, u = darcy_flow(1000, 32, seed=0)
    a_train, u_train, a_test, u_test = a[:800], u[:800, None], a[800:], u[800:, None]
    a_norm, u_norm = UnitGaussianNormalizer.fit(a_train), UnitGaussianNormalizer.fit(u_train)
    x_train, x_test = a_norm.encode(a_train)[:, None], a_norm.encode(a_test)[:, None]
    print("a:", a.shape, "values", np.unique(np.asarray(a)), "  u:", u.shape, f"max {float(u.max()):.4f}")
    print("train", x_train.shape, u_train.shape, "  test", x_test.shape, u_test.shape)
    '''),
    md("""
    ## The model, serial and distributed

    Width 32, 12 × 12 Fourier modes (as in the `neuraloperator` library: 12 frequencies on
    `x`, both ends of the spectrum, and 12//2 + 1 = 7 on `y`, the real-FFT axis), 4 layers.
    The model has no batch size: it builds its operators for each batch size it meets.
    `model.distribute((1, 1, 2, 4))` is the same network for inputs split as
    `(batch, channel, x, y)` = `(1, 1, 2, 4)`, its operators planned together, as one
    chain, for each batch size. It takes the same parameters (`dist.init` gives the same
    values as `model.init`, each placed where the distributed model keeps it) and computes
    the same function:
    """),
    code('''
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
    '''),
    md("""
    `dist.operators(20)` are the network's distributed operators for batches of 20:
    lifting, the four Fourier layers, the two projections. Each hands its output to the
    next in the layout the next one starts from, and only the lifting and the last
    projection move the input's `y` split:
    """),
    code('''
    ops = dist.operators(20)
    names = ["lift"] + [f"layer {k}" for k in range(4)] + ["proj1", "proj2"]
    for name, D in zip(names, ops):
        fwd, bwd = D.plan.collectives(), D.plan.collectives(backward=True)
        count = lambda c: ", ".join(f"{n} {k}" for k, n in c.items() if n) or "none"
        print(f"{name:8} {str(D.in_sharding.spec):34} -> {str(D.out_sharding.spec):34} fwd: {count(fwd)};  bwd: {count(bwd)}")
    '''),
    md("""
    One Fourier layer's plan (all four are alike: the lifting has already moved the input's
    split to the layout they share, `x` split 8 ways). The spectral convolution and the skip
    connection are the two terms of a sum. The real FFT on `y` runs locally; after the
    restriction to 7 modes, one `all_to_all` moves the `x` split onto them (padded with a
    zero mode to 8, one per device), so the FFT on `x` runs locally and the
    `PerModeMatrix` mixes the channels of each device's modes; a second `all_to_all` puts
    the split back on `x` for the inverse real FFT. Two per layer forward, as in dfno.

    The backward pass runs both `all_to_all`s in reverse, a `psum` of the skip weight's
    gradient, and an `all_gather` of the spectral weight's gradient: that weight is kept
    whole on every device (its 7 modes on `y` do not split evenly in 8), each device
    computes the gradient of the modes it holds, and the pieces are gathered.
    """),
    code('''
    print(ops[1].plan)
    '''),
    md("""
    ## Training

    `parop.nn.fit` trains with Adam (learning rate 1e-3, cosine decay to 0) on the relative
    L2 loss of the decoded prediction, batches of 20 drawn without replacement; `place` puts
    each batch on the mesh. The parameters stay a plain dict (`optax` sees the complex
    spectral weights as pairs of reals). With `checkpoint="some/dir"`, `fit` would also save
    its state every `every` steps and resume from it.
    """),
    code('''
    start = time.perf_counter()
    θ, losses = fit(dist, θ, x_train, u_train, steps=STEPS, batch=20, lr=1e-3, decode=u_norm.decode, place=place)
    print(f"{STEPS} steps in {time.perf_counter() - start:.0f} s;  mean loss of the last 20 steps: {losses[-20:].mean():.4f}")
    '''),
    code('''
    fig, ax = plt.subplots(figsize=(5, 2.8))
    ax.semilogy(losses, lw=0.6, alpha=0.5, label="batch")
    window = max(1, min(50, len(losses) // 5))
    ax.semilogy(np.arange(window - 1, len(losses)), np.convolve(losses, np.ones(window) / window, "valid"), label=f"mean of {window}")
    ax.set(xlabel="step", ylabel="relative L2 loss", title="training loss")
    ax.legend()
    fig.tight_layout()
    plt.show()
    '''),
    md("""
    ## Test error and one prediction

    The relative L2 error `‖prediction − u‖ / ‖u‖`, averaged over the 200 test samples that the
    model never saw. The full 1,200-step run reached 0.0204. In the quick mode of 20 steps,
    whose outputs are saved with this notebook, the model has barely started to learn and
    the error is far larger.
    """),
    code('''
    error = evaluate(dist, θ, x_test, u_test, batch=20, decode=u_norm.decode, place=place)
    print(f"relative L2 test error: {error:.4f}")
    '''),
    code('''
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
    '''),
]

# -- 05 ----------------------------------------------------------------------------------

FNO_3D = [
    md("""
    # 05 · A 3-D Fourier neural operator

    The network of notebook 04 on a 3-D grid: Darcy flow in the unit cube,
    −∇·(a ∇u) = 1 with u = 0 on the boundary, sampled on 24³ grid points, and an FNO that
    maps the coefficient `a` to the solution `u`. The grid is split over 8 devices, in two
    along each axis. In 3-D the activations grow with the cube of the resolution, and the
    memory a training step needs is what model parallelism is for: this notebook measures
    it, per device, on 1 to 8 devices.

    `PAROP_NOTEBOOK_STEPS` sets the number of training steps: 300 by default (the full
    run); the test suite runs this notebook with 20, and the outputs saved with it come
    from such a quick run.
    """),
    code(SETUP, '''
    import time
    import warnings

    import matplotlib.pyplot as plt

    from parop.datasets import darcy_flow
    from parop.nn import FNO, UnitGaussianNormalizer, evaluate, fit, relative_l2

    STEPS = int(os.environ.get("PAROP_NOTEBOOK_STEPS", 300))
    plt.rcParams.update({"figure.dpi": 70, "font.size": 8})
    warnings.filterwarnings("ignore", message="IProgress not found")  # no ipywidgets: tqdm draws a text bar
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, {STEPS} training steps")
    '''),
    md("""
    ## Data

    `darcy_flow(n, 24, dim=3)` draws piecewise-constant coefficients (12 or 3, a
    thresholded Gaussian random field) and solves the 7-point finite-difference system with
    a conjugate-gradient method, in code: 500 samples, 400 to train and 100 to test,
    normalised as in notebook 04.
    """),
    code('''
    start = time.perf_counter()
    a, u = darcy_flow(500, 24, dim=3, seed=0)
    print(f"a: {a.shape}, u: {u.shape}, generated in {time.perf_counter() - start:.1f} s;  "
          f"a takes {np.unique(np.asarray(a))}, u at most {float(u.max()):.4f}")
    a_train, u_train, a_test, u_test = a[:400], u[:400, None], a[400:], u[400:, None]
    a_norm, u_norm = UnitGaussianNormalizer.fit(a_train), UnitGaussianNormalizer.fit(u_train)
    x_train, x_test = a_norm.encode(a_train)[:, None], a_norm.encode(a_test)[:, None]
    '''),
    md("""
    One sample, cut through the middle of the cube across each axis: the coefficient
    (yellow 12, purple 3) and the solution, which vanishes on the faces of the cube.
    """),
    code('''
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
    '''),
    md("""
    ## The model, distributed over 8 devices

    Width 16, 8 Fourier modes per axis (8 frequencies on `x` and `y`, both ends of the
    spectrum, and 8//2 + 1 = 5 on `z`, the real-FFT axis), 4 layers. The input
    `(batch, channel, x, y, z)` is split `(1, 1, 2, 2, 2)`. For batches of 4 the distributed
    model plans its seven operators as one chain; each hands over to the next in the layout
    the next one starts from:
    """),
    code('''
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
    '''),
    md("""
    The lifting moves all three splits onto `y` (8 ways, 3 planes per device), the layout
    the Fourier layers share. In a layer, the FFTs on `z` and `x` run locally and
    keep 5 and 8 modes; one `all_to_all` moves the split from `y` onto the 8 kept modes of
    `x`, one per device, so the FFT on `y` runs locally and the `PerModeMatrix` mixes the
    channels of each device's mode; a second `all_to_all` takes the split back to `y`.
    The spectral weight is split with its modes (the `spectral0` placement above), so each
    device holds and updates an eighth of it, and its gradient needs no collective:
    """),
    code('''
    print(ops[1].plan)
    '''),
    md("""
    ## Memory per device

    One training step (the loss and its gradient, `jax.jit(jax.value_and_grad(loss))`)
    compiled for the serial model on 1 device and for the model distributed over 2, 4 and
    8, at this notebook's size (24³, width 16, batch 4). It is compiled from shapes alone
    (`jax.ShapeDtypeStruct`s with the shardings the model wants), so nothing runs.
    `compiled.memory_analysis()` gives each device's arguments (the parameters and the
    batch), outputs (the loss and the gradients) and temporaries (the intermediate values,
    among them the activations kept for the backward pass). These are XLA:CPU's buffer
    assignments for the forced host devices; a GPU compiler would give other numbers.
    """),
    code('''
    loss = lambda m: lambda θ, a, u: relative_l2(m.apply(θ, a), u)

    def step_memory(m, batch):
        """Per-device bytes of one compiled training step of model m (arguments, outputs, temporaries)."""
        shapes = jax.eval_shape(m.init, jax.random.key(0))   # the weights' shapes, placed as m.init places them
        where = m.param_shardings() if m.distributed else {}
        θ_shape = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=where.get(k)) for k, v in shapes.items()}
        a_shape = jax.ShapeDtypeStruct((batch, 1) + m.grid, jnp.float32, sharding=m.in_sharding if m.distributed else None)
        compiled = jax.jit(jax.value_and_grad(loss(m))).lower(θ_shape, a_shape, a_shape).compile()
        memory = compiled.memory_analysis()
        return memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.temp_size_in_bytes

    MiB = 2**20
    print(f"{'P':>2} {'partition':16} {'arguments':>10} {'outputs':>8} {'temporaries':>12} {'total':>9}   total x P")
    for P, partition in [(1, None), (2, (1, 1, 2, 1, 1)), (4, (1, 1, 2, 2, 1)), (8, (1, 1, 2, 2, 2))]:
        m = model if partition is None else dist if P == 8 else model.distribute(partition)
        sizes = step_memory(m, BATCH)
        total = sum(sizes)
        if P == 1:
            serial = total
        print(f"{P:2} {str(partition or 'serial'):16} {sizes[0] / MiB:8.2f} MiB {sizes[1] / MiB:5.2f} MiB "
              f"{sizes[2] / MiB:9.1f} MiB {total / MiB:6.1f} MiB   {P * total / serial:.2f} x serial")
    '''),
    md("""
    Each device's share falls as 1/P: the model splits the activations, which dominate, and
    the spectral weights with them; only the small channel-mixing weights and biases are
    copied on every device. The totals over all devices stay at the serial model's.
    """),
    md("""
    ## Training

    As in notebook 04: Adam, learning rate 1e-3 with cosine decay, the relative L2 loss of
    the decoded prediction, here in batches of 4, each placed on the mesh by `place`.
    """),
    code('''
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
    '''),
    md("""
    ## Test error and one prediction

    The relative L2 error over the 100 test samples. In the quick mode (20 steps, the
    outputs saved with this notebook) the model has barely started to learn, and the
    prediction below shows it.
    """),
    code('''
    error = evaluate(dist, θ, x_test, u_test, batch=BATCH, decode=u_norm.decode, place=place)
    print(f"relative L2 test error after {STEPS} steps: {error:.4f}")
    '''),
    code('''
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
    '''),
]

NOTEBOOKS = {
    "01_operator_algebra": OPERATOR_ALGEBRA,
    "02_distributed_fft": DISTRIBUTED_FFT,
    "03_weight_sharing_and_reduce": WEIGHT_SHARING,
    "04_distributed_fno": DISTRIBUTED_FNO,
    "05_fno_3d": FNO_3D,
}


def build(name: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 1800) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", coalesce_streams=True,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)   # timestamps: noise in diffs
    return nb


def main(argv: list[str]) -> None:
    run = "--execute" in argv
    only = [a for a in argv if not a.startswith("--")]
    for name in NOTEBOOKS:
        if only and not any(o in name for o in only):
            continue
        nb = build(name)
        if run:
            start = time.perf_counter()
            execute(nb)
            print(f"{name}: executed in {time.perf_counter() - start:.0f} s", flush=True)
        path = HERE / f"{name}.ipynb"
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.0f} KiB)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
