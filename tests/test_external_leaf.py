"""A leaf defined outside parop: a type-II DCT along one axis (it needs its axis whole)
and a trainable gain (pointwise, with a weight split with its axis). With no change
inside `parop/`, each builds into operators, distributes, plans, lowers, shows in
`repr` and in plans, goes through a plan's JSON, equals the serial operator and
passes the dot test."""

import jax
import numpy as np
import scipy.fft

import parop as po
from parop._dtypes import Flow
from reference import random_array

F64 = np.dtype("float64")


class DCT(po.Leaf):
    """The orthonormal type-II DCT on an axis of size `n` (real data): its adjoint is
    its inverse, the type-III DCT."""

    roles = (po.Role.LOCAL,)  # every output needs the whole axis

    def __init__(self, n: int):
        self._freeze(n=n, domain_shape=(n,), range_shape=(n,), dtype=F64, range_dtype=F64, flow=Flow.REAL)

    def _forward(self, w, x, axis):
        return jax.scipy.fft.dct(x, type=2, axis=axis, norm="ortho")

    def _backward(self, w, x, axis):
        return jax.scipy.fft.idct(x, type=2, axis=axis, norm="ortho")

    def describe(self) -> str:
        return f"DCT({self.n})"


class Gain(po.Leaf):
    """`y[i] = g[i] x[i]` with a trainable `g`: pointwise, so its axis stays split and `g`
    is split with it (`param_axes`)."""

    roles = (po.Role.POINTWISE,)
    param_axes = (0,)

    def __init__(self, n: int, name: str):
        self._freeze(n=n, domain_shape=(n,), range_shape=(n,), dtype=F64, range_dtype=F64, flow=Flow.REAL,
                     name=name, param_shape=(n,), param_dtype=F64)

    def init_param(self, key):
        return 1 + jax.random.uniform(key, self.param_shape, self.param_dtype)

    def _forward(self, w, x, axis):
        return x * w.reshape(w.shape + (1,) * (x.ndim - axis - 1))

    _backward = _forward  # real: its own adjoint

    def describe(self) -> str:
        return f"Gain({self.n} {self.name!r})"


def test_a_leaf_defined_outside_parop_distributes():
    op = po.kron(DCT(8), Gain(4, "g"), DCT(6))
    assert repr(op) == "DCT(8) ⊗ Gain(4 'g') ⊗ DCT(6)"
    D = po.distribute(op, (2, 2, 1, 2), batch_shape=(4,))
    assert repr(D) == "distribute(DCT(8) ⊗ Gain(4 'g') ⊗ DCT(6), P('d0', 'd1', None, 'd3'))"
    text = str(D.plan)
    assert "DCT(8) on axis 0" in text and "Gain(4 'g') on axis 1" in text and "DCT(6) on axis 2" in text
    (spec,) = D.plan.weight_placements["g"]  # split with axis 1 where the gain runs
    assert "d1" in spec
    assert po.Plan.from_json(D.plan.to_json()) == D.plan
    θ = po.init(D, jax.random.key(0))
    assert θ["g"].sharding.spec == D.plan.weight_placements["g"]
    x = random_array(np.random.default_rng(0), (8, 4, 6, 4), np.float64)
    want = scipy.fft.dct(scipy.fft.dct(x, type=2, axis=0, norm="ortho"), type=2, axis=2, norm="ortho")
    want = want * np.asarray(θ["g"])[None, :, None, None]
    y = D(θ) @ x
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-12)
    assert y.sharding.is_equivalent_to(D.out_sharding, 4)
    assert po.testing.dot_test(D, θ, batch_shape=(4,)) < 1e-12  # D.H runs the transposed plan
