"""Independent dense references: each operator's matrix built from NumPy (`np.fft`,
`np.eye`, `np.kron`) and, for weights, plain `jnp` (so the reference can be
differentiated), never from parop's own apply code. Plus random operator trees."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import parop as po

DTYPES = ["float32", "float64", "complex64", "complex128"]


def tol(dtype) -> float:
    return 1e-4 if np.finfo(dtype).bits <= 32 else 1e-11


def close(a, b) -> None:
    """`a` (parop's, in its operator's precision) equals the float64 reference `b`, to
    1e-10 of `b`'s largest entry for 64-bit data and 2e-5 for 32-bit."""
    a, b = np.asarray(a), np.asarray(b)
    tol = 1e-10 if np.finfo(a.dtype).bits == 64 else 2e-5
    scale = max(1.0, float(np.abs(b).max())) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


def close_to(got, want, rtol: float = 1e-12) -> None:
    """`got == want`: the same shape, each entry within `rtol` of `want`'s largest."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * max(1.0, float(np.abs(want).max(initial=0))))


def pairing(c, y) -> jax.Array:
    """Re⟨c, y⟩: a real scalar of a linear output, the loss whose gradients the tests compare.

    Written out rather than `jnp.real(jnp.vdot(c, y))`: in jax 0.10.2 the eager
    gradient of that on a complex array sharded on one mesh, after the same on another
    mesh, raises `IndivisibleError` (JAX reuses the first mesh; `jit(grad(...))` is not
    affected), so a test would pass or fail with the order the suite's workers run it in.
    """
    return jnp.real(jnp.sum(jnp.conj(c.astype(y.dtype)) * y))


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def random_params(op: po.Operator, seed: int = 0) -> dict[str, jax.Array]:
    """Random values for every parameter (more telling than `po.init`'s ones)."""
    rng = np.random.default_rng(seed)
    return {
        name: jnp.asarray(random_array(rng, leaf.param_shape, leaf.param_dtype))
        for name, leaf in sorted(op.parameters.items())
    }


def _fft_matrix(op) -> np.ndarray:
    """The matrix of a `DFT`/`InverseDFT` from `numpy.fft` applied to unit vectors;
    for `irfft` the complex `M` with `irfft(z) == Re(M z)`."""
    n, norm = op.n, op.norm
    if isinstance(op, po.DFT):
        eye = np.eye(n)
        return np.fft.rfft(eye, axis=0, norm=norm) if op.real else np.fft.fft(eye, axis=0, norm=norm)
    if not op.real:
        return np.fft.ifft(np.eye(n), axis=0, norm=norm)
    eye = np.eye(n // 2 + 1)
    return np.fft.irfft(eye, n, axis=0, norm=norm) - 1j * np.fft.irfft(1j * eye, n, axis=0, norm=norm)


@functools.partial(jax.jit, static_argnums=2)
def dense(op: po.Operator, θ=None, real_input: bool | None = None) -> jax.Array:
    """The dense matrix of `op` in complex128, as one compiled program per operator."""
    return _dense(op.named, θ, real_input).astype(jnp.complex128)


def _dense(op: po.Operator, θ=None, real_input: bool | None = None) -> jax.Array:
    """The dense matrix of `op` in complex128/float64 (`jnp`, so differentiable in θ).

    Where the data turns real part-way through a composition (`Re` taken by the
    adjoint or inverse of a real DFT), the reference takes the real part of the
    product so far; that is exact when the composition's input is real.
    """
    θ = θ or {}
    if real_input is None:
        real_input = not np.issubdtype(op.dtype, np.complexfloating)
    if isinstance(op, po.Adjoint):
        return dense(op.of, θ).conj().T
    if isinstance(op, po.Identity):
        return jnp.eye(op.n)
    if isinstance(op, (po.DFT, po.InverseDFT)):
        return jnp.asarray(_fft_matrix(op))
    if isinstance(op, po.Restriction):
        return jnp.asarray(np.eye(op.n)[op.indices])
    if isinstance(op, po.Reduce):
        return jnp.ones((1, op.n))
    if isinstance(op, po.Matrix):
        return θ[op.name].astype(jnp.complex128)
    if isinstance(op, po.Diagonal):
        return jnp.diag(θ[op.name].astype(jnp.complex128))
    if isinstance(op, po.PerModeMatrix):
        w = θ[op.name].astype(jnp.complex128)
        m = int(np.prod(op.modes))
        blocks = jnp.einsum("oim,mn->omin", w.reshape(op.c_out, op.c_in, m), jnp.eye(m, dtype=jnp.complex128))
        return blocks.reshape(op.c_out * m, op.c_in * m)
    if isinstance(op, (po.Convolution, po.Stencil)):
        return _correlation_matrix(op, θ)
    if isinstance(op, po.Kron):
        out = jnp.ones((1, 1), jnp.complex128)
        for f in op.factors:
            out = jnp.kron(out, dense(f, θ))
        return _real_if(out, op)
    if isinstance(op, po.Compose):
        out = jnp.eye(op.domain_size, dtype=jnp.complex128)
        dtype = op.dtype
        for o in reversed(op.ops):
            out = dense(o, θ) @ out
            dtype = o.out_dtype(dtype)  # the dtype the data really has here
            if real_input and not np.issubdtype(dtype, np.complexfloating):
                out = out.real.astype(jnp.complex128)
        return out
    if isinstance(op, po.Sum):
        return functools.reduce(jnp.add, [dense(t, θ) for t in op.terms])
    if isinstance(op, po.Scale):
        return op.c * dense(op.op, θ)
    raise TypeError(f"no reference for {type(op).__name__}")


def _shifts(n: int, k: int, boundary: str) -> np.ndarray:
    """`S[i, m, j] = 1` where tap `j` of output `i` reads input `m` on an axis of size `n`:
    `m = i + j - k // 2`, wrapped around (periodic) or dropped outside `[0, n)` (zero)."""
    S = np.zeros((n, n, k), np.complex128)
    for i in range(n):
        for j in range(k):
            m = i + j - k // 2
            if boundary == "periodic":
                S[i, m % n, j] = 1
            elif 0 <= m < n:
                S[i, m, j] = 1
    return S


def _correlation_matrix(op, θ) -> jax.Array:
    """The matrix of a `Convolution` (a `Stencil`: one channel, its fixed weights):
    `M[(o, i), (c, m)] = sum_j w[o, c, j] prod_a S_a[i_a, m_a, j_a]`."""
    w = θ[op.name] if isinstance(op, po.Convolution) else op.weights[None, None]
    w = jnp.asarray(w).astype(jnp.complex128)
    d = len(op.grid)
    taps, outs, ins = "ABCDEF"[:d], "GHIJKL"[:d], "MNOPQR"[:d]
    spec = ",".join(["yz" + taps] + [o + i + t for o, i, t in zip(outs, ins, taps)])
    shifts = [_shifts(n, k, op.boundary) for n, k in zip(op.grid, op.kernel)]
    M = jnp.einsum(f"{spec}->y{outs}z{ins}", w, *shifts)
    return M.reshape(op.range_size, op.domain_size)


def _real_if(m, op):
    if not np.issubdtype(op.dtype, np.complexfloating) and not np.issubdtype(op.range_dtype, np.complexfloating):
        return m.real.astype(jnp.complex128)
    return m


@jax.jit
def applied(A: po.Operator, θ, x) -> jax.Array:
    """`A(θ) @ x` as one compiled program: parop's serial operator, what a distributed
    one is compared with (eagerly, it would compile once per operation)."""
    return A(θ) @ x


@jax.jit
def serial_results(op: po.Operator, θ, x, c) -> dict:
    """The serial operator's forward on `x`, and on `c` its adjoint, JAX's transpose of it
    and the gradients of `Re<c, op(θ) x>` in θ and `x`, as one program: what a
    distributed operator is compared with."""
    (transpose,) = jax.linear_transpose(lambda v: op(θ) @ v, x)(c)
    return {"forward": op(θ) @ x, "adjoint": op.H(θ) @ c, "transpose": transpose,
            "grads": jax.grad(lambda θ, x: pairing(c, op(θ) @ x), argnums=(0, 1))(θ, x)}


@jax.jit
def apply_dense(op: po.Operator, θ, x) -> jax.Array:
    """`op` applied to a tensor `x` (domain_shape + batch) through its dense matrix."""
    batch = x.shape[op.ndim:]
    xf = jnp.asarray(x).reshape(op.domain_size, -1).astype(jnp.complex128)
    y = dense(op, θ) @ xf
    if not np.issubdtype(op.range_dtype, np.complexfloating):
        y = y.real
    return y.reshape(op.range_shape + batch)


# -- random operator trees ---------------------------------------------------------

def random_leaf(rng: np.random.Generator, n: int, dtype: str, names: list, sizes=(1, 2, 3, 4, 5)) -> po.Operator:
    """A random leaf on an axis of size `n`; a `Matrix` maps it to one of `sizes`."""
    kinds = ["identity", "matrix", "diagonal", "restriction", "reduce"]
    if np.issubdtype(dtype, np.complexfloating):
        kinds += ["dft", "dft", "idft"]
    kind = rng.choice(kinds)
    if kind == "identity":
        return po.Identity(n, dtype)
    if kind == "matrix":
        m = int(rng.choice(sizes))
        same = [leaf for leaf in names if leaf.n == n and leaf.dtype == np.dtype(dtype)]
        if same and rng.random() < 0.3:
            return same[int(rng.integers(len(same)))]  # the same leaf again: a shared weight
        leaf = po.Matrix(m, n, dtype)
        names.append(leaf)
        return leaf
    if kind == "diagonal":
        return po.Diagonal(n, dtype)
    if kind == "restriction":
        keep = sorted(set(rng.integers(-n, n, size=int(rng.integers(1, n + 1))).tolist()))
        return po.Restriction(n, keep, dtype)
    if kind == "reduce":
        return po.Reduce(n, dtype)
    norm = str(rng.choice(["backward", "ortho", "forward"]))
    dft = po.DFT(n, dtype, norm)
    return dft if kind == "dft" else dft.inverse()


def random_tree(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, depth: int, names=None,
                sizes=(1, 2, 3, 4, 5)) -> po.Operator:
    """A random operator with domain `shape`: kron of per-axis chains, then compositions
    with further krons, sums, scalars and adjoints, `depth` levels deep."""
    names = [] if names is None else names
    if depth == 0 or rng.random() < 0.25:
        return po.kron(*[random_leaf(rng, n, dtype, names, sizes) for n in shape])
    choice = rng.choice(["compose", "sum", "scale", "adjoint"])
    if choice == "compose":
        inner = random_tree(rng, shape, dtype, depth - 1, names, sizes)
        outer = random_tree(rng, inner.range_shape, dtype, depth - 1, names, sizes)
        return outer @ inner
    if choice == "sum":
        a = random_tree(rng, shape, dtype, depth - 1, names, sizes)
        b = po.kron(*[po.Identity(n, dtype) if n == m else po.Matrix(m, n, dtype)
                      for n, m in zip(shape, a.range_shape)])
        return a + b if rng.random() < 0.5 else a - 2.0 * b
    if choice == "scale":
        if not np.issubdtype(dtype, np.complexfloating) and rng.random() < 0.5:
            return complex_scaled(rng, shape, dtype, names, sizes)
        c = complex(rng.standard_normal(), rng.standard_normal()) if np.issubdtype(dtype, np.complexfloating) else float(rng.standard_normal())
        return c * random_tree(rng, shape, dtype, depth - 1, names, sizes)
    a = random_tree(rng, shape, dtype, depth - 1, names, sizes)
    return a.H @ a


def complex_scaled(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, names=None,
                   sizes=(1, 2, 3, 4, 5)) -> po.Operator:
    """A real-to-real operator made of complex scalars on real-domain operators (valid:
    their range is complex), and sums of them: `G.H @ Z` with `R` a real `DFT` on one
    axis (identities elsewhere), `t` a kron of real leaves, `G` either `R` or `c * R`,
    and `Z` one of `c * (R @ t)`, `(R + c * R) @ t` (the form of `F + 1j*F`) or
    `c1 * (R @ t) + c2 * (R @ t2)`. Their adjoints scale the input (`Scale(first=True)`)
    where the range is real.

    `t` holds real leaves only, so that `dense`'s reference stays exact: a real matrix
    commutes with the real part that a real DFT's adjoint takes."""
    names = [] if names is None else names
    t = po.kron(*[random_leaf(rng, n, dtype, names, sizes) for n in shape])
    axis = int(rng.integers(len(shape)))
    norm = str(rng.choice(["backward", "ortho", "forward"]))
    R = po.kron(*[po.DFT(n, dtype, norm) if i == axis else po.Identity(n, dtype)
                  for i, n in enumerate(t.range_shape)])

    def c() -> complex:
        return complex(rng.standard_normal(), rng.standard_normal())

    form = rng.choice(["scaled", "sum", "sum of scaled"])
    if form == "scaled":
        Z = c() * (R @ t)
    elif form == "sum":
        Z = (R + c() * R) @ t
    else:
        t2 = po.kron(*[po.Identity(n, dtype) if n == m else po.Matrix(m, n, dtype)
                       for n, m in zip(shape, t.range_shape)])
        Z = c() * (R @ t) + c() * (R @ t2)
    G = R if rng.random() < 0.5 else c() * R
    return G.H @ Z
