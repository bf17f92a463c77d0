"""`parop.nn.fit` and `evaluate` on a tiny model from one (distributed) parop operator:
any batch size, a partial last batch weighted by its samples, errors that name the
argument, no pile-up of distributed programs, and a training step compiled once."""

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from parop.nn import FNO, UnitGaussianNormalizer, as_complex, as_real, evaluate, fit, relative_l2

C, M = 8, 8  # channels, modes


class Tiny:
    """All `fit` and `evaluate` need: `apply(θ, a)`. A per-mode complex channel mixing,
    then a real channel matrix, on samples of shape (C, M) with the batch axis first (it
    is the operator's trailing batch axis); `partition` names (channel, mode, batch)."""

    def __init__(self, partition: tuple[int, int, int] | None = None, shard_weights=True):
        op = po.kron(po.Matrix(C, C, name="w"), po.Identity(M)) @ po.PerModeMatrix(C, C, (M,), name="s")
        self.op = op if partition is None else po.distribute(op, partition, shard_weights=shard_weights)

    def init(self, key: jax.Array) -> dict[str, jax.Array]:
        return po.init(self.op, key)

    def apply(self, θ, a: jax.Array) -> jax.Array:
        return jnp.moveaxis(jnp.real(self.op(θ) @ jnp.moveaxis(a, 0, -1)), -1, 0)


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets (a fixed linear map of them, reachable by the model), float32."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, C, M)).astype(np.float32)
    return a, (np.roll(a, 1, axis=1) + 0.5 * a).astype(np.float32)


def test_evaluate_weights_a_partial_last_batch_by_its_samples():
    model = Tiny((1, 2, 4))  # the batch axis split in 4: a batch of 10 could not be split
    θ = model.init(jax.random.key(0))
    a, u = data(30)
    want = float(relative_l2(Tiny().apply(θ, a), u))  # all 30 samples at once, serially
    for batch in (20, 8, 40):  # 20 + 10, 3 x 8 + 6, and a batch larger than the data
        np.testing.assert_allclose(evaluate(model, θ, a, u, batch=batch), want, rtol=1e-6, err_msg=f"batch {batch}")
    batch_means = np.mean([float(relative_l2(Tiny().apply(θ, a[i:i + 20]), u[i:i + 20])) for i in (0, 20)])
    assert abs(batch_means - want) > 1e-3 * want  # the unweighted mean of 20 and 10 would be wrong


def test_fit_takes_any_batch_size_up_to_the_data():
    a, u = data(30)
    model = Tiny()
    for batch in (7, 30):  # batches straddling epochs, and the whole data set
        with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
            θ, losses = fit(model, model.init(jax.random.key(0)), a, u, steps=6, batch=batch, lr=1e-2, progress=False)
        assert losses.shape == (6,) and np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def compilations(caplog, name: str) -> int:
    """How many programs named `name` JAX compiled while `caplog` listened under
    `jax.log_compiles()` ("Compiling jit(step) with ...", or "Compiling step ..." as older
    JAX wrote it)."""
    return sum(bool(re.match(rf"Compiling (jit\()?{name}\b", r.getMessage())) for r in caplog.records)


def test_fit_compiles_its_step_once_keeps_it_and_returns_the_weights_laid_out_as_given(caplog):
    # The optimiser's step count starts uncommitted on one device and comes back from the
    # step replicated over the mesh: fit places it so at once, or the second step compiles
    # again. The trained weights come back with the shardings they came in, spelled alike
    # (the same layout spelled with fewer trailing Nones compiles a jitted program again),
    # and training on with the same FNO and settings reuses the step.
    model = FNO((16, 16), width=2, modes=(4, 4), layers=1).distribute((1, 1, 2, 4))  # spectral0: P(None, None, 'd3', None)
    a = np.random.default_rng(0).standard_normal((8, 1, 16, 16)).astype(np.float32)
    θ0 = model.init(jax.random.key(0))
    with jax.numpy_dtype_promotion("standard"), jax.log_compiles(), caplog.at_level("WARNING"):
        θ, _ = fit(model, θ0, a, 2 * a, steps=3, batch=4, progress=False)
        assert compilations(caplog, "step") == 1
        assert {k: w.sharding for k, w in θ.items()} == {k: w.sharding for k, w in θ0.items()}
        # trained on with the same settings (an epoch loop), from the trained weights: nothing compiles
        caplog.clear()
        fit(model, θ, a, 2 * a, steps=3, batch=4, progress=False)
        assert compilations(caplog, "step") == 0
        # a user's model may change between calls: its step is made anew
        user, (au, uu) = Tiny(), data(8)
        θu = user.init(jax.random.key(0))
        for _ in range(2):
            fit(user, θu, au, uu, steps=2, batch=4, progress=False)
        assert compilations(caplog, "step") == 2


def test_evaluating_an_fno_again_compiles_nothing_and_a_user_model_anew(caplog):
    # A training loop evaluates every few steps: for parop's FNO with its normaliser's
    # decode (or none) the program is kept. A user's model (here one whose weights' layout
    # changes between calls without changing θ) gets a program of its own at each call.
    model = FNO((16,), width=2, modes=(4,), layers=1)
    a = np.random.default_rng(0).standard_normal((6, 1, 16)).astype(np.float32)
    θ, norm = model.init(jax.random.key(0)), UnitGaussianNormalizer.fit(a)

    def compiles(call) -> int:
        caplog.clear()
        with jax.log_compiles(), caplog.at_level("WARNING"):
            call()
        return compilations(caplog, "error_sum")

    for decode in (None, norm.decode):
        first = evaluate(model, θ, a, a, batch=4, decode=decode)
        assert compiles(lambda: evaluate(model, θ, a, a, batch=4, decode=decode)) == 0
        assert evaluate(model, θ, a, a, batch=4, decode=decode) == first
    assert compiles(lambda: evaluate(model, θ, a, a, batch=3)) == 1  # another batch size: another program

    user = Tiny()
    θu, (au, uu) = user.init(jax.random.key(0)), data(8)
    before = evaluate(user, θu, au, uu, batch=4)
    user.op = po.kron(po.Matrix(C, C, name="w"), po.Identity(M)) @ po.PerModeMatrix(C, C, (M,), name="s").H
    after = evaluate(user, θu, au, uu, batch=4)
    np.testing.assert_allclose(after, float(relative_l2(user.apply(θu, au), uu)), rtol=1e-6)
    assert after != before


def test_a_normaliser_is_an_argument_of_the_programs_split_as_the_targets(caplog):
    # Closed over, a normaliser's arrays were constants of the program: the whole grid's
    # on every device, and another normaliser (fitted again) needed a program of its own.
    # Passed as an argument, split as the targets are, the program is the same for every
    # normaliser and each device holds its block.
    from parop.nn.train import _placed_operand

    dist = FNO((16, 16), width=2, modes=(4, 4), layers=1).distribute((1, 1, 2, 4))
    rng = np.random.default_rng(0)
    a, u = (rng.standard_normal((8, 1, 16, 16)).astype(np.float32) for _ in range(2))
    θ = dist.init(jax.random.key(0))
    place = lambda x: jax.device_put(x, dist.in_sharding)  # noqa: E731
    placed = _placed_operand(UnitGaussianNormalizer.fit(u), dist, θ)
    assert placed.mean.sharding.spec == placed.std.sharding.spec == jax.P(*dist.in_sharding.spec[1:])

    def compiles(call, name: str) -> int:
        caplog.clear()
        with jax.numpy_dtype_promotion("standard"), jax.log_compiles(), caplog.at_level("WARNING"):
            call()
        return compilations(caplog, name)

    for i, norm in enumerate((UnitGaussianNormalizer.fit(u), UnitGaussianNormalizer.fit(2 * u[:4] + 1))):
        want = float(relative_l2(norm.decode(dist.apply(θ, place(a))), place(u)))
        got = []
        assert compiles(lambda: got.append(evaluate(dist, θ, a, u, batch=4, decode=norm.decode, place=place)),
                        "error_sum") == (i == 0)
        np.testing.assert_allclose(got[0], want, rtol=1e-5)
        assert compiles(lambda: fit(dist, θ, a, u, steps=2, batch=4, decode=norm.decode, place=place,
                                    progress=False), "step") == (i == 0)


A, U = data(6)


def test_fit_and_evaluate_take_numpy_parameters_and_a_0d_learning_rate():
    """Parameters as NumPy arrays (`jax.device_get(θ)`, or restored onto a NumPy `like`)
    train and evaluate as the same arrays on the device do (both read each leaf's
    sharding, which NumPy arrays lack), and a 0-d float array is a learning rate."""
    model = Tiny()
    θ = model.init(jax.random.key(0))
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        trained, losses = fit(model, θ, A, U, steps=3, batch=2, lr=0.5, progress=False)
        trained_np, losses_np = fit(model, jax.device_get(θ), A, U, steps=3, batch=2, lr=jnp.float32(0.5),
                                    progress=False)
    np.testing.assert_array_equal(losses_np, losses)
    for name in trained:
        np.testing.assert_array_equal(np.asarray(trained_np[name]), np.asarray(trained[name]))
    assert evaluate(model, jax.device_get(θ), A, U, batch=4) == evaluate(model, θ, A, U, batch=4)


@pytest.mark.parametrize("call, message", [
    (lambda m, θ: fit(m, θ, A, U, steps=0, batch=2), r"steps must be at least 1, got steps=0"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=0), r"batch must be at least 1, got batch=0"),
    (lambda m, θ: fit(m, θ, A[:0], U[:0], steps=3, batch=2), r"no data: a and u hold 0 samples"),
    (lambda m, θ: fit(m, θ, A, U[:5], steps=3, batch=2), r"len\(a\)=6, len\(u\)=5"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=7), r"batch=7 is larger than the data set \(6 samples\)"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, every=0), r"every must be at least 1, got every=0"),
    (lambda m, θ: evaluate(m, θ, A, U, batch=0), r"evaluate: batch must be at least 1, got batch=0"),
    (lambda m, θ: evaluate(m, θ, A[:0], U[:0], batch=2), r"evaluate: no data"),
    (lambda m, θ: evaluate(m, θ, A[:4], U, batch=2), r"evaluate: .*len\(a\)=4, len\(u\)=6"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, lr=0.0), r"fit: lr must be a positive number, got lr=0.0"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, lr=float("nan")), r"lr must be a positive number, got lr=nan"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, lr="1e-3"), r"lr must be a positive number, got lr='1e-3'"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, seed=None), r"fit: seed must be an int in \[0, 2\*\*64\) .*got "
                                                                r"seed=None"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, seed=-1), r"seed must be an int in \[0, 2\*\*64\) .*got seed=-1"),
    # (a checkpoint keeps the seed as a 64-bit int: a larger one failed at the first save, in NumPy's words)
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, seed=2**64), r"seed must be an int in .*got seed=18446744073709551616"),
    (lambda m, θ: fit(m, θ, np.array(1.0), np.array(1.0), steps=1, batch=1), r"fit: a must hold samples along its "
                                                                             r"axis 0, got a 0-d array"),
    (lambda m, θ: evaluate(m, θ, A, U[:, :, :1], batch=2), r"evaluate: the prediction \(2, 8, 8\) and the target "
                                                          r"\(2, 8, 1\) must have the same shape"),
])
def test_fit_and_evaluate_name_the_wrong_argument(call, message):
    model = Tiny()
    with pytest.raises(ValueError, match=message):
        call(model, model.init(jax.random.key(0)))


@pytest.mark.parametrize("call, message", [
    (lambda m, θ: fit(m, None, A, U, steps=3, batch=2), r"fit: θ must be a dict \{name: array\} .*got NoneType"),
    (lambda m, θ: evaluate(m, [θ], A, U, batch=2), r"evaluate: θ must be a dict \{name: array\} .*got list"),
    (lambda m, θ: fit(m, θ, A.tolist(), U, steps=3, batch=2), r"fit: a must be an array, .* or a data set, got list"),
    (lambda m, θ: evaluate(m, θ, A, (), batch=2), r"evaluate: u must be an array, samples first \(NumPy or JAX\), "
                                                  r"got tuple"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, decode=2.0), r"fit: decode must be a function \(or None\), "
                                                                 r"got float"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=2, callback="log"), r"fit: callback must be a function .*got str"),
])
def test_fit_and_evaluate_name_an_argument_of_the_wrong_type(call, message):
    # before anything runs (a callback that is not a function failed after the first step)
    model = Tiny()
    with pytest.raises(TypeError, match=message):
        call(model, model.init(jax.random.key(0)))


@pytest.mark.parametrize("call, message", [
    (lambda: UnitGaussianNormalizer.fit([[1.0, 2.0]]), r"UnitGaussianNormalizer.fit: x must be an array .*got list"),
    (lambda: relative_l2([1.0], np.ones(1)), r"relative_l2: the prediction must be an array .*got list"),
    (lambda: relative_l2(np.ones(1), 1.0), r"relative_l2: the target must be an array .*got float"),
    (lambda: as_real(None), r"as_real: θ must be a dict \{name: array\} .*got NoneType"),
    (lambda: as_complex([], {}), r"as_complex: θ must be a dict .*got list"),
])
def test_the_training_helpers_name_an_argument_of_the_wrong_type(call, message):
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda m, θ: fit(m, θ, A, U, steps=3.0, batch=2), r"fit: steps must be an int, got steps=3.0 \(float\)"),
    (lambda m, θ: fit(m, θ, A, U, steps=3, batch=True), r"fit: batch must be an int, got batch=True \(bool\)"),
    (lambda m, θ: evaluate(m, θ, A, U, batch="2"), r"evaluate: batch must be an int, got batch='2' \(str\)"),
])
def test_fit_and_evaluate_name_a_count_that_is_not_an_int(call, message):
    model = Tiny()
    with pytest.raises(TypeError, match=message):
        call(model, model.init(jax.random.key(0)))
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        θ, losses = fit(model, model.init(jax.random.key(0)), A, U, steps=np.int64(2), batch=np.int32(2),
                        progress=False)
    assert losses.shape == (2,)


def test_the_loss_refuses_shapes_that_would_broadcast():
    """`(b, c, n)` against `(b, n)` broadcasts to `(b, b, n)` when `c` is 1 (every
    sample against every other: a finite, wrong loss), and fails deep in JAX when not."""
    with pytest.raises(ValueError, match=r"relative_l2: the prediction \(6, 1, 8\) and the target \(6, 8\)"):
        relative_l2(A[:, :1], A[:, 0])
    with pytest.raises(ValueError, match=r"UnitGaussianNormalizer.fit: needs samples along axis 0, got shape \(0, 3\)"):
        UnitGaussianNormalizer.fit(jnp.ones((0, 3)))


def test_the_loss_is_the_relative_l2_error_of_each_sample():
    """Against NumPy's norms, real and complex (whose squares are |z|², not z²: the loss
    was complex and wrong, with no error), with its gradient for complex data."""
    rng = np.random.default_rng(3)
    for dtype in (np.float64, np.complex128):
        pred, target = (rng.standard_normal((4, 2, 5)) + (1j * rng.standard_normal((4, 2, 5)) if dtype == np.complex128
                                                          else 0) for _ in range(2))
        want = np.mean([np.linalg.norm(p - t) / np.linalg.norm(t) for p, t in zip(pred, target)])
        got = relative_l2(jnp.asarray(pred), jnp.asarray(target))
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)
    g = jax.grad(lambda p: relative_l2(p, jnp.asarray(target)))(jnp.asarray(pred))
    step = 1e-6 * rng.standard_normal(pred.shape)
    change = (relative_l2(jnp.asarray(pred + step), jnp.asarray(target))
              - relative_l2(jnp.asarray(pred - step), jnp.asarray(target)))
    np.testing.assert_allclose(change, 2 * np.sum((np.conj(g) * step).real), rtol=1e-6)


def test_evaluate_keeps_few_distributed_programs_in_flight():
    # Programs with collectives (the DFT's axis is split: all_to_alls), ~200 of them queued
    # without waiting, make XLA:CPU's rendezvous abort the process after 40 s (measured on
    # 2 cores); evaluate queues at most IN_FLIGHT.
    op = po.kron(po.Matrix(C, C, name="w"), po.DFT(M, jnp.complex64))

    class Spectral:
        D = po.distribute(op, (1, 8, 1))

        def apply(self, θ, a):
            return jnp.moveaxis(jnp.abs(self.D(θ) @ jnp.moveaxis(a, 0, -1)), -1, 0)

    θ = po.init(Spectral.D, jax.random.key(0))
    a, u = data(320)
    start = time.perf_counter()
    error = evaluate(Spectral(), θ, a, u, batch=1)
    assert np.isfinite(error) and time.perf_counter() - start < 30
