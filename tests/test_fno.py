"""The FNO built from parop operators on 1-D to 4-D grids: serial against a plain-JAX
FNO, distributed against serial (initial parameters, outputs, loss, every gradient, a
training run) for data-, model- and data x model-parallel partitions, its collectives
per Fourier layer, and its arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from parop.datasets import darcy_flow
from parop.nn import FNO, UnitGaussianNormalizer, fit, relative_l2


def inputs(model, batch, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, model.in_channels) + model.grid
    return (jnp.asarray(rng.standard_normal(shape), jnp.float32),
            jnp.asarray(rng.standard_normal((batch, model.out_channels) + model.grid), jnp.float32))


def test_serial_fno_matches_a_plain_jax_fno():
    plain = pytest.importorskip("benchmarks.plain_fno")
    for grid, modes, kept in [((16, 16), (8, 6), (8, 4)), ((8, 8, 8), (4, 4, 4), (4, 4, 3))]:
        model = FNO(grid, width=8, modes=modes, layers=2, projection=16)
        θ = model.init(jax.random.key(0))
        a, _ = inputs(model, 3)
        assert θ["spectral0"].shape[2:] == kept
        want = jax.jit(plain.apply)(plain.params_from_parop(θ, n_layers=2), a[:, 0])
        got = jax.jit(model.apply)(θ, a)[:, 0]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_any_batch_size():
    model = FNO((16, 16), width=8, modes=(8, 6), layers=2, projection=16)
    θ = model.init(jax.random.key(0))
    a, _ = inputs(model, 5)
    apply = jax.jit(model.apply)
    full = apply(θ, a)
    for b in (1, 2, 5):  # the same model, one sample or several
        np.testing.assert_allclose(np.asarray(apply(θ, a[:b])), np.asarray(full[:b]), rtol=1e-5, atol=1e-6)


GRIDS = [  # (grid, modes, partitions over (batch, channel, *grid), batch)
    ((16, 16), (8, 6), [(1, 1, 2, 4), (2, 1, 2, 2), (4, 1, 1, 2)], 4),
    ((8, 8, 8), (4, 4, 4), [(1, 1, 2, 2, 2), (2, 1, 2, 2, 1), (1, 1, 2, 4, 1)], 2),
    ((4, 4, 4, 4), (4, 4, 4, 4), [(1, 1, 2, 2, 2, 1), (2, 1, 2, 2, 1, 1)], 2),
]
# the 2-D and 3-D grids' first partitions in every run, the rest in the long pass
CASES = [pytest.param(grid, modes, partition, batch, marks=[pytest.mark.long] if k or len(grid) > 3 else [])
         for grid, modes, partitions, batch in GRIDS for k, partition in enumerate(partitions)]


@pytest.mark.parametrize("grid, modes, partition, batch", CASES)
def test_distributed_fno_equals_serial(grid, modes, partition, batch):
    model = FNO(grid, width=8, modes=modes, layers=2, projection=16)
    θ = model.init(jax.random.key(0))
    a, u = inputs(model, batch)
    loss = lambda m: jax.jit(jax.value_and_grad(lambda θ: relative_l2(m.apply(θ, a), u)))  # noqa: E731
    value, grads = loss(model)(θ)
    dist = model.distribute(partition)
    θd = dist.init(jax.random.key(0))
    for name in θ:  # the same initial parameters, placed where the model keeps them
        np.testing.assert_array_equal(np.asarray(θd[name]), np.asarray(θ[name]), err_msg=name)
        assert θd[name].sharding == dist.param_shardings()[name]
    np.testing.assert_allclose(np.asarray(jax.jit(dist.apply)(θd, a)), np.asarray(jax.jit(model.apply)(θ, a)),
                               rtol=1e-4, atol=1e-5)
    dvalue, dgrads = loss(dist)(θd)
    assert abs(float(dvalue) - float(value)) <= 1e-5 * abs(float(value))
    assert set(grads) == set(dgrads)
    for name in grads:
        g, d = np.asarray(grads[name]), np.asarray(dgrads[name])
        np.testing.assert_allclose(d, g, rtol=1e-3, atol=1e-4 * np.abs(g).max(), err_msg=(partition, name))


@pytest.mark.parametrize("local_kernel", [None, pytest.param(3, marks=pytest.mark.long)])
def test_a_network_of_one_layer_planned_again_is_the_serial_network(local_kernel, monkeypatch):
    """A one-layer network planned for one sample, then applied to four: the second plan
    (every weight pinned where the first put it) is searched whole, not operator by
    operator (`Search.whole`). In float64, its output, loss and every gradient (the
    plan's transpose) equal the serial model's."""
    from parop.distributed.plan.search import Search

    model = FNO((8, 8), width=4, modes=(4, 4), layers=1, projection=8, dtype=jnp.float64, local_kernel=local_kernel)
    θ = model.init(jax.random.key(0))
    a, u = (x.astype(jnp.float64) for x in inputs(model, 4))
    dist = model.distribute((1, 1, 2, 2), batch=1)
    θd = dist.init(jax.random.key(0))
    whole, searched = Search.whole, []

    def counted(self, root):
        searched.append(whole(self, root))
        return searched[-1]

    monkeypatch.setattr(Search, "whole", counted)
    loss = lambda m: jax.jit(jax.value_and_grad(lambda θ: relative_l2(m.apply(θ, a), u)))  # noqa: E731
    np.testing.assert_allclose(np.asarray(jax.jit(dist.apply)(θd, a)), np.asarray(jax.jit(model.apply)(θ, a)),
                               rtol=1e-10, atol=1e-12)
    assert any(searched)  # the batch-4 chain was searched whole
    (value, grads), (dvalue, dgrads) = loss(model)(θ), loss(dist)(θd)
    np.testing.assert_allclose(float(dvalue), float(value), rtol=1e-12)
    assert set(grads) == set(dgrads)
    for name in grads:
        g = np.asarray(grads[name])
        np.testing.assert_allclose(np.asarray(dgrads[name]), g, rtol=1e-9, atol=1e-11 * np.abs(g).max(), err_msg=name)


@pytest.mark.parametrize("partition, batches", [((1, 1, 2, 4), (1, 2, 4)), ((2, 1, 2, 2), (2, 4))])
def test_a_batch_the_reference_placements_cannot_plan_runs_filled_up_to_the_reference(partition, batches):
    """Planned at 8 samples on 8 devices, every weight whole: 1 - 4 samples have no plan
    that keeps them so (`operators` says why), and `apply` runs them at 8, each device's
    block of the batch axis filled up with zero samples whose outputs are dropped. In
    float64 the outputs, loss and gradients equal the serial model's; the compiled
    program's collectives are the reference's (the filling moves nothing, the batch axis
    split or not), and `dry_run` measures that program."""
    from parop.nn import dry_run
    from parop.nn.dryrun import PLAN_KIND

    model = FNO((16, 16), width=2, modes=(4, 4), layers=1, projection=4, dtype=jnp.float64)
    dist = model.distribute(partition, batch=8)
    assert not any(any(spec) for spec in dist.weights.values())
    θ = model.init(jax.random.key(0))
    θd = dist.init(jax.random.key(0))
    loss = lambda m, a, u: jax.jit(jax.value_and_grad(lambda θ: relative_l2(m.apply(θ, a), u)))  # noqa: E731

    def kinds(b):
        a = jax.ShapeDtypeStruct((b, 1, 16, 16), jnp.float64, sharding=dist.in_sharding)
        text = jax.jit(dist.apply).lower(θd, a).compile().as_text()
        return {kind: text.count(f" {kind}(") + text.count(f" {kind}-start(") for kind in PLAN_KIND}

    reference = kinds(8)
    assert reference["all-to-all"] > 0  # the plan moves the mesh axes onto the batch axis and back
    for b in batches:
        with pytest.raises(ValueError, match=f"a batch of {b} samples cannot be planned"):
            dist.operators(b)
        assert dist.runs_at(b) == 8
        a, u = (x.astype(jnp.float64) for x in inputs(model, b, seed=b))
        out = jax.jit(dist.apply)(θd, jax.device_put(a, dist.in_sharding))
        assert out.shape == (b, 1, 16, 16) and out.sharding.spec == dist.in_sharding.spec
        np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(model.apply)(θ, a)), rtol=1e-12, atol=1e-13)
        (value, grads), (dvalue, dgrads) = loss(model, a, u)(θ), loss(dist, a, u)(θd)
        np.testing.assert_allclose(float(dvalue), float(value), rtol=1e-12)
        for name in grads:
            g = np.asarray(grads[name])
            np.testing.assert_allclose(np.asarray(dgrads[name]), g, rtol=1e-9, atol=1e-11 * np.abs(g).max())
        assert kinds(b) == reference
    report, full = dry_run(dist, batches[0]), dry_run(dist, 8)
    assert report["planned"] == full["planned"] and report["collectives"] == full["collectives"]


def hlo_counts(D) -> dict[str, int]:
    run, specs = D.program(())
    x = jnp.zeros(D.domain_shape, D.dtype)
    ws = [jnp.zeros(D.parameters[name].param_shape, D.parameters[name].param_dtype) for name, _ in specs]
    text = run.lower(x, *ws).compile().as_text()
    return {k: text.count(f"{k}(") for k in ("all-to-all", "all-gather")}


@pytest.mark.parametrize("grid, modes, partition, batch, per_layer", [
    ((32, 32), (12, 12), (1, 1, 2, 4), 20, 2),  # the training protocol's sizes: dfno's 2 per layer
    ((16, 16, 16), (8, 8, 8), (1, 1, 2, 2, 2), 1, 2),  # three grid axes split, one sample
    ((16, 16, 16), (8, 8, 8), (2, 1, 2, 2, 1), 2, 2),  # data x model parallel
])
def test_all_to_alls_per_fourier_layer(grid, modes, partition, batch, per_layer):
    model = FNO(grid, width=8, modes=modes, layers=3, projection=16)
    ops = model.distribute(partition).operators(batch)
    counts = [hlo_counts(D) for D in ops]
    assert all(c["all-gather"] == 0 for c in counts), counts
    assert [c["all-to-all"] for c in counts[1:-2]] == [per_layer] * 3
    # the network is planned as a whole: consecutive operators hand over without a relayout
    for D, E in zip(ops, ops[1:]):
        assert D.out_sharding == E.in_sharding


@pytest.mark.parametrize("grid, modes, partition, local_kernel", [
    ((16, 16), (8, 6), (2, 1, 2, 2), None),  # data x model parallel
    pytest.param((8, 8, 8), (4, 4, 4), (2, 1, 2, 2, 1), None, marks=pytest.mark.long),
    pytest.param((4, 4, 4, 4), (4, 4, 4, 4), (1, 1, 2, 2, 2, 1), None, marks=pytest.mark.long),
    pytest.param((16, 16), (8, 6), (1, 1, 2, 4), 3, marks=pytest.mark.long),  # a local convolution: halos
])
def test_distributed_training_follows_serial_step_for_step(grid, modes, partition, local_kernel):
    model = FNO(grid, width=8, modes=modes, layers=2, projection=16, local_kernel=local_kernel)
    dist = model.distribute(partition)
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((8, 1) + grid), jnp.float32)
    u = jnp.asarray(np.sin(np.asarray(a)) + 0.1 * rng.standard_normal(a.shape), jnp.float32)
    run = lambda m: fit(m, m.init(jax.random.key(0)), a, u, steps=20, batch=4, progress=False)[1]  # noqa: E731
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32
        serial, distributed = run(model), run(dist)
    np.testing.assert_array_less(np.abs(distributed - serial) / serial, 1e-4)
    assert serial[-1] < serial[0]


def test_darcy_training_improves_and_matches():
    """On generated Darcy flow (normalised inputs), the distributed model trains as the
    serial one does."""
    model = FNO((16, 16), width=8, modes=(8, 6), layers=2, projection=16)
    a, u = darcy_flow(16, 16, seed=1)
    a = UnitGaussianNormalizer.fit(a).encode(a)[:, None]
    run = lambda m: fit(m, m.init(jax.random.key(0)), a, u[:, None], steps=20, batch=4, progress=False)[1]  # noqa: E731
    with jax.numpy_dtype_promotion("standard"):
        serial, distributed = run(model), run(model.distribute((1, 1, 2, 4)))
    np.testing.assert_array_less(np.abs(distributed - serial) / serial, 1e-4)
    assert serial[-1] < serial[0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(grid=(8,), modes=(10,)), r"modes\[0\] = 10 on real-FFT axis 0 of size 8 .* largest valid count there is 9"),
    (dict(grid=(8, 8), modes=(10, 4)), r"modes\[0\] = 10 on axis 0 of size 8 would keep frequencies twice; the largest valid count there is 8"),
    (dict(grid=(8, 8), modes=(20, 4)), r"modes\[0\] = 20 on axis 0 of size 8"),
    (dict(grid=(8, 8), modes=(4,)), "one count per grid axis"),
    (dict(grid=(8, 8, 8, 8, 8)), "1 to 4 positive ints"),
    (dict(grid=(8, 8), width=0), "width must be a positive int"),
    (dict(grid=(8, 8), local_kernel=2), "local_kernel must be an odd positive int"),
    (dict(grid=(8, 8), dtype=jnp.bfloat16), "dtype must be float32 or float64"),
    (dict(grid=(8, 8), dtype="mystery"), r"dtype must be float32 or float64 .*, got 'mystery'$"),
    (dict(grid=(8, 8), local_kernel=True), "local_kernel must be an odd positive int"),
    (dict(grid=np.ones((2, 2), int)), "grid must be 1 to 4 positive ints"),
    (dict(grid=(8, 8), modes=(4, np.float32(4))), r"modes\[1\] must be a positive int"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FNO(**kwargs)


def test_numpy_integers_count_as_ints():
    """Sizes read from NumPy (a config array, `np.prod`) are taken as the ints they hold;
    `dtype=None` is the default, float32."""
    model = FNO(np.array([8, 8]), width=np.int64(4), modes=(np.int64(4), 3), layers=np.int32(1),
                projection=np.int16(8), local_kernel=np.int64(3), dtype=None)
    plain = FNO((8, 8), width=4, modes=(4, 3), layers=1, projection=8, local_kernel=3)
    for field in ("grid", "width", "modes", "n_layers", "projection", "local_kernel", "dtype"):
        assert getattr(model, field) == getattr(plain, field), field
    assert all(type(n) is int for n in (*model.grid, *model.modes, model.width, model.n_layers, model.local_kernel))
    θ = plain.init(jax.random.key(0))
    x = jnp.ones((2, 1, 8, 8), jnp.float32)
    np.testing.assert_array_equal(model.apply(θ, x), plain.apply(θ, x))
    assert model.distribute((1, 1, 2, 1), batch=np.int64(2)).reference_batch == 2


def test_wrong_input_shape_and_unsplittable_batch():
    model = FNO((8, 8, 8), width=4, modes=(4, 4, 4), layers=1, projection=8)
    θ = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"input must have shape \(batch, 1, 8, 8, 8\), got \(2, 1, 8, 8\)"):
        model.apply(θ, jnp.zeros((2, 1, 8, 8)))
    dist = model.distribute((2, 1, 2, 2, 1))
    with pytest.raises(ValueError, match="a batch of 3 samples cannot be split in 2"):
        dist.apply(dist.init(jax.random.key(0)), jnp.zeros((3, 1, 8, 8, 8)))
    for bad in (0, -1, 2.5, "2", None):
        with pytest.raises(ValueError, match=rf"FNO.operators: batch must be a positive int, got {bad!r}"):
            dist.operators(bad)
    with pytest.raises(ValueError) as info:  # named in a line, not with the whole network's operators
        model.distribute((1, 1, 4, 2, 2))
    assert str(info.value) == "FNO.distribute: partition (1, 1, 4, 2, 2) needs 16 devices, but 8 are available"
    with pytest.raises(ValueError) as info:  # the lifting's input: 1 channel and 3 coordinates
        FNO((8, 8, 6), width=4, modes=(4, 4, 4), layers=1).distribute((1, 8, 1, 1, 1))
    assert str(info.value) == ("FNO.distribute: the channel axis enters the network as 1 input channel(s) and 3 "
                               "grid coordinates, 4 channels, which cannot be split in 8 (the partition's channel "
                               "entry): split it in one of [1, 2, 4]")
    with pytest.raises(ValueError, match=r"^FNO.distribute: input axis 4 of size 6 cannot be split in 4"):
        FNO((8, 8, 6), width=4, modes=(4, 4, 4), layers=1).distribute((1, 1, 1, 1, 4))
    # the same with a PartitionSpec (the channels' error named the whole network), and a spec with an entry
    # past the grid's (planned for a batch axis that FNO.apply never gives, then a failure at the first call)
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[:8])
    with pytest.raises(ValueError, match=r"^FNO.distribute: the channel axis enters the network as 1 input "
                                         r"channel\(s\) and 3 grid coordinates, 4 channels, which cannot be split in 8"):
        FNO((8, 8, 6), width=4, modes=(4, 4, 4), layers=1).distribute(P(None, ("a", "b")), mesh=mesh)
    with pytest.raises(ValueError, match=r"^FNO.distribute: the partition splits the axes of \(batch, channel, "
                                         r"\*grid\): at most 5 entries for grid \(8, 8, 6\), got P\(None, None, None, "
                                         r"None, None, 'a'\)$"):
        FNO((8, 8, 6), width=4, modes=(4, 4, 4), layers=1).distribute(P(None, None, None, None, None, "a"), mesh=mesh)


def test_input_dtypes():
    """The input is cast to the model's dtype, as a Flax layer casts it: NumPy's float64
    data into a float32 model, integers, lists. Complex input is a `TypeError` (the
    cast would drop its imaginary part), serial and distributed."""
    model = FNO((8, 8), width=4, modes=(4, 4), layers=1, projection=8)
    θ = model.init(jax.random.key(0))
    a = np.random.default_rng(0).standard_normal((2, 1, 8, 8))
    for m in (model, model.distribute((2, 1, 2, 1))):
        want = m.apply(θ, a.astype(np.float32))
        np.testing.assert_array_equal(m.apply(θ, a), want)
        assert m.apply(θ, a).dtype == jnp.float32
        np.testing.assert_array_equal(m.apply(θ, np.ones((2, 1, 8, 8), np.int32)),
                                      m.apply(θ, np.ones((2, 1, 8, 8), np.float32)))
        np.testing.assert_array_equal(m.apply(θ, a.tolist()), want)
        for bad in (a.astype(np.complex64), jnp.asarray(a, jnp.complex64)):
            with pytest.raises(TypeError, match=r"^FNO: input must be real \(the model is float32\), got complex64"):
                m.apply(θ, bad)


@pytest.mark.parametrize("remat", [False, True])
def test_a_missing_misshapen_or_mistyped_bias_is_named(remat):
    """A bias of another shape would broadcast, a complex one make the output complex
    (silent wrong answers), an int one fail inside `jax.grad`; a missing one was a
    KeyError. Serial and distributed, the remat projection included."""
    model = FNO((8, 8), width=4, modes=(4, 4), layers=1, projection=8, remat=remat)
    θ = model.init(jax.random.key(0))
    a = jnp.ones((2, 1, 8, 8), jnp.float32)
    for m in (model, model.distribute((2, 1, 2, 1))):
        for name, bad, got in (("skip0.bias", jnp.zeros(1, jnp.float32), r"shape \(1,\) and dtype float32"),
                               ("proj2.bias", None, "none"),
                               ("proj1.bias", jnp.zeros((8, 1), jnp.float32), r"shape \(8, 1\) and dtype float32"),
                               ("proj2.bias", jnp.ones(1, jnp.complex64), r"shape \(1,\) and dtype complex64"),
                               ("lift.bias", jnp.ones(4, jnp.int32), r"shape \(4,\) and dtype int32")):
            broken = {k: v for k, v in θ.items() if k != name} | ({} if bad is None else {name: bad})
            want = {"proj1.bias": r"\(8,\)", "skip0.bias": r"\(4,\)", "lift.bias": r"\(4,\)"}.get(name, r"\(1,\)")
            with pytest.raises(ValueError, match=rf"FNO: θ\['{name}'\] must be an array of shape {want} and dtype "
                                                 rf"float32, got {got}"):
                m.apply(broken, a)


def test_an_empty_batch_gives_the_empty_result():
    """No sample in, no sample out (of the output's shape and dtype), serial and
    distributed, as an operator does; and no plan made for it."""
    model = FNO((8, 8), width=4, modes=(4, 4), layers=1, projection=8, out_channels=2, dtype=jnp.float64)
    θ = model.init(jax.random.key(0))
    for m in (model, model.distribute((2, 1, 2, 1))):
        y = m.apply(θ, jnp.zeros((0, 1, 8, 8)))
        assert y.shape == (0, 2, 8, 8) and y.dtype == jnp.float64
        assert 0 not in m._batches
