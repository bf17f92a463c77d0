"""Will it fit? `parop.nn.dry_run` against the compiled training step it stands for
(memory, collectives), `FNO(remat=True)` against `remat=False` (the same gradients,
serial and distributed), the partition search (`FNO.distribute(devices=N, batch=B)`)
and the command line. The large cases and timings are in `benchmarks/will_it_fit.py`."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import child_env
from parop.distributed.hlo import collectives
from parop.distributed.plan import PlanningError
from parop.nn import FNO, dry_run, relative_l2
from parop.nn.dryrun import CHILD, PLAN_KIND, _input_gradient_only, main
from parop.nn.partition import candidates, ranked, tiers
from parop.nn.train import as_real, make_step

ROOT = Path(__file__).resolve().parent.parent


def data(model, batch, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((batch, model.in_channels) + model.grid), model.dtype),
            jnp.asarray(rng.standard_normal((batch, model.out_channels) + model.grid), model.dtype))


def test_dry_run_is_the_compiled_step():
    """On 4 devices: the dry run's memory is `memory_analysis()` of the training step
    compiled on real arrays, its collectives are that step's HLO's, and the step runs
    the plans' all_to_alls and sends their bytes, but for the lifting's backward
    all_to_all (it only makes the input's gradient: XLA drops it)."""
    model = FNO((16, 16), width=4, modes=(4, 4), layers=1, projection=8).distribute((1, 1, 2, 2))
    report = dry_run(model, 2)
    θ = model.init(jax.random.key(0))
    optimizer = optax.adam(1e-3)
    θr = as_real(θ)
    a, u = data(model, 2)
    a, u = jax.device_put(a, model.in_sharding), jax.device_put(u, model.operators(2)[-1].out_sharding)
    step = make_step(lambda θ, a, u: relative_l2(model.apply(θ, a), u), optimizer, θ)
    with jax.numpy_dtype_promotion("standard"):
        compiled = step.lower(θr, optimizer.init(θr), a, u).compile()
    m = compiled.memory_analysis()
    assert report["memory_bytes"] == (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                                      - m.alias_size_in_bytes) > 0
    hlo = collectives(compiled.as_text(), 4)
    assert report["collectives"] == {PLAN_KIND[k]: n for k, n in hlo["operations"].items()}
    plans = [op.plan for op in model.operators(2)]
    dead = _input_gradient_only(plans[0])
    assert [c.kind for c in dead] == ["all_to_all"]
    a2a = [c for p in plans for c in sum(p.traffic(), []) if c.kind == "all_to_all"]
    assert report["collectives"]["all_to_all"] == report["planned"]["all_to_all"] == len(a2a) - 1
    assert report["hlo_all_to_all_bytes"] == sum(c.bytes for c in a2a) - dead[0].bytes
    assert report["sent_bytes"] == sum(p.bytes + p.backward_bytes for p in plans) - dead[0].bytes
    assert report["devices"] == 4 and report["partition"] == (1, 1, 2, 2)
    assert report["all_to_all_per_layer"] == plans[1].collectives()["all_to_all"]
    # the step gathers only what the plans gather (a padded spectral weight's gradient), not the grid
    # coordinates: computed in the program, XLA made them split and gathered them, one per grid axis
    assert report["collectives"]["all_gather"] == report["planned"]["all_gather"] == 1


@pytest.mark.parametrize("partition", [None, (2, 1, 2, 2)])
def test_remat_gives_the_same_gradients(partition):
    """`remat=True` (checkpointed layers, projection in blocks): the loss and every
    gradient of `remat=False`, to float64 rounding, serial and distributed."""
    kwargs = dict(width=4, modes=(4, 4), layers=2, projection=8, dtype=jnp.float64)
    plain, remat = FNO((8, 8), **kwargs), FNO((8, 8), remat=True, **kwargs)
    assert remat.projection_blocks((8, 8))[1] > 1  # the projection does run in blocks
    if partition is not None:
        plain, remat = plain.distribute(partition), remat.distribute(partition)
    θ = plain.init(jax.random.key(0))
    a, u = data(plain, 2)
    results = [jax.jit(jax.value_and_grad(lambda θ: relative_l2(m.apply(θ, a), u)))(θ) for m in (plain, remat)]
    (v0, g0), (v1, g1) = results
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-13)
    for name in θ:
        np.testing.assert_allclose(np.asarray(g1[name]), np.asarray(g0[name]), rtol=1e-11,
                                   atol=1e-13 * float(jnp.max(jnp.abs(g0[name]))), err_msg=name)


def test_a_distributed_step_computes_what_the_serial_step_computes():
    """Split over 8 devices where no axis needs padding, the FNO's training step computes
    per device an eighth of what the serial step computes (XLA's flop count, within 1 %):
    each restriction runs right after the FFT it prunes (`smallest_first`). The
    search's own order ran a 4-D model's `rDFT` and the next axis's `DFT` as one FFT
    before either restriction, 7 % more flops here (1.6x at dfno's block on 64
    devices)."""
    model = FNO((16, 16, 8, 16), width=8, modes=(4, 4, 4, 4), layers=2)
    serial, split = dry_run(model, 1), dry_run(model.distribute((1, 1, 2, 4, 1, 1)), 1)
    assert split["flops"] * 8 == pytest.approx(serial["flops"], rel=0.01), (split["flops"] * 8, serial["flops"])


def test_the_chosen_partition_plans_and_fits():
    """`distribute(devices=8, batch=2, memory_limit=...)`: the cheapest candidate that
    plans, with the limit met; the candidates split the batch and grid axes only, each
    count dividing its axis."""
    model = FNO((16, 16), width=4, modes=(8, 6), layers=1, projection=8)
    found = candidates(model, 8, 2)
    assert found and all(p[1] == 1 and np.prod(p) == 8 for p in found)
    assert all(n % c == 0 for p in found for n, c in zip((2, 1, 16, 16), p))
    order = ranked(model, 8, 2)
    planned = [c for c in order if c.cost is not None]
    assert planned and [c.cost for c in planned] == sorted(c.cost for c in planned)
    dist = model.distribute(devices=8, batch=2, memory_limit=1e9)
    assert dist.partition == planned[0].partition
    assert dry_run(dist, 2)["memory_bytes"] <= 1e9


def test_no_partition_fits_is_a_clear_error():
    model = FNO((16,), width=4, modes=(6,), layers=1, projection=8)
    with pytest.raises(ValueError, match=r"(?s)devices=2, batch=1.*no partition.*fits in 1e-09 GB.*\(1, 1, 2\).*"
                                         r"Use more devices, a smaller batch, or FNO\(\.\.\., remat=True\)"):
        model.distribute(devices=2, batch=1, memory_limit=1)
    for kwargs, match in [(dict(partition=(1, 1, 2), devices=2, batch=1), "not both"),
                          (dict(devices=2), "needs devices=N and batch=B"),
                          (dict(devices=64, batch=1), "64 devices asked for, 8 available"),
                          (dict(devices=2, batch=1, memory_limit=-1), "memory_limit must be a positive"),
                          (dict(devices=2, batch=1, memory_limit=float("nan")), "memory_limit must be a positive"),
                          (dict(), "give a partition")]:
        with pytest.raises(ValueError, match=match):
            model.distribute(**kwargs)
    with pytest.raises(ValueError, match="dry_run: batch must be a positive int, got 0"):
        dry_run(model, 0)
    with pytest.raises(TypeError, match="dry_run: model must be a parop.nn.FNO"):
        dry_run(object(), 1)


def test_a_network_with_no_plan_points_to_the_partition_search_and_that_to_fewer_devices():
    """Too fine a split for a small grid: no plan, whichever way its weights go. An
    explicit partition's error keeps the planner's reason first and names the partition
    search; the search's error, where nothing plans (not memory), advises fewer devices."""
    model = FNO((4, 4, 6), width=4, modes=(2, 1, 1), layers=1)
    with pytest.raises(PlanningError, match=r"(?s)^[^\n]*no plan exists.*\nparop can search the partitions of 8 "
                                            r"devices for one that plans: model\.distribute\(devices=8, batch=2\)$"
                       ) as error:
        model.distribute((2, 1, 2, 2, 1), batch=2)
    assert not error.value.gave_up
    with pytest.raises(ValueError, match=r"(?s)devices=8, batch=2.*no partition.*over 8 devices plans and fits; "
                                         r"tried:.*\(2, 1, 2, 2, 1\): no plan exists.*\nUse fewer devices") as error:
        model.distribute(devices=8, batch=2)
    assert "remat" not in str(error.value)
    assert model.distribute(devices=4, batch=2).partition == (2, 1, 1, 2, 1)


def test_where_no_partition_of_few_split_axes_plans_the_search_splits_more():
    """An 8 x 8 grid at batch 2 on 8 devices plans only split (2, 1, 2, 2): each of
    the six partitions that split one or two axes leaves no room for the mesh axes while
    an FFT needs its axis whole. The search tries them first (`tiers`), then the one
    that splits three axes, and chooses it, where it once said that no partition plans.
    Where some partition of a tier plans but none fits the memory limit, it stops there;
    where none plans in any tier (a 2 x 8 grid), the error names each partition tried."""
    model = FNO((8, 8), width=2, modes=(2, 2), layers=1, dtype="float64")
    first, more = tiers(model, 8, 2)
    assert (2, 1, 2, 2) in more and all(c.cost is None for c in ranked(model, 8, 2))
    assert [c.partition for c in ranked(model, 8, 2, tier=1)] == more and ranked(model, 8, 2, tier=2) == []
    assert model.distribute(devices=8, batch=2).partition == (2, 1, 2, 2)
    with pytest.raises(ValueError, match="1e-09 GB per device") as error:  # more splits hold no less data a device
        FNO((16, 16), width=2, modes=(4, 4), layers=1).distribute(devices=8, batch=2, memory_limit=1)
    assert "(2, 1, 2, 2)" not in str(error.value)
    small = FNO((2, 8), width=2, modes=(1, 2), layers=1)  # no partition plans, in either tier
    first, more = tiers(small, 8, 2)
    assert more == [(2, 1, 2, 2)]
    with pytest.raises(ValueError, match=r"(?s)tried:\n" + r".*\n".join(re.escape(f"  {p}: no plan exists")
                                                                      for p in first + more) + r".*Use fewer devices"):
        small.distribute(devices=8, batch=2)


def test_under_a_context_mesh_whose_axes_give_no_split_the_search_says_so():
    """Under `jax.set_mesh`, a partition's counts are its mesh's axes: where none of the
    splits of `devices` fits them, the error says that, not that the count divides no
    axis (4 devices split an 8 x 8 grid at batch 2 well enough without the mesh)."""
    model = FNO((8, 8), width=2, modes=(2, 2), layers=1)
    assert model.distribute(devices=4, batch=2).partition == (2, 1, 2, 1)
    with jax.set_mesh(jax.make_mesh((8,), ("x",))), pytest.raises(
            ValueError, match=r"(?s)over 4 devices plans and fits; tried:\n  \(no split .* each count above 1 a mesh "
                              r"axis of that size\)\nUnder jax.set_mesh of \{'x': 8\}, each split takes a mesh axis of "
                              r"its size: ask for a product of those sizes \(devices=8, say\)"):
        model.distribute(devices=4, batch=2)


@pytest.mark.parametrize("args, message", [
    (["--partition", "0", "1", "2", "1"], r"FNO.distribute: partition entry 0 must be a positive int, got 0"),
    (["--partition", "1", "1", "2"], r"FNO.distribute: the partition splits the axes of \(batch, channel, \*grid\): "
                                     r"4 entries for grid \(16, 16\), got \(1, 1, 2\)"),
    (["--devices", "0"], r"--devices must be a positive int, got 0"),
    (["--devices", "1", "--memory-limit", "0"], r"memory_limit must be a positive number of bytes"),
    (["--devices", "1", "--memory-limit", "1e-6"], r"\(1, 1, 1, 1\): [\d.e-]+ GB per device"),  # checked on 1 too
])
def test_the_command_line_names_bad_arguments(args, message, monkeypatch, capsys):
    """Each is the one line of a usage error (exit status 2), not a traceback, a silent
    serial run or the whole network's description."""
    monkeypatch.setenv(CHILD, "1")  # this process, its 8 devices: the errors come before any device count matters
    with pytest.raises(SystemExit) as exit_:
        main(["--grid", "16", "16", "--width", "4", "--modes", "4", "4", "--layers", "1", "--projection", "8",
              "--batch", "1", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(message, err) and "distribute_chain(" not in err, err


@pytest.mark.parametrize("args, message", [
    (["--partition", "1", "a", "1", "1"], r"sizes must be ints: invalid literal for int\(\) with base 10: 'a'"),
    (["--partition", "99999", "1", "1", "1"], r"--partition: input axis 0 of size 1 cannot be split in 99999"),
    (["--partition", "1", "1", "2"], r"--partition splits the axes of \(batch, channel, \*grid\): 4 entries"),
    (["--partition", "1,1,2"], r"--partition splits the axes of \(batch, channel, \*grid\): 4 entries for grid "
                               r"\(16, 16\), got \(1, 1, 2\)"),  # sizes by commas, or as a shape: the same sizes
    (["--partition", "1x1x2"], r"--partition splits the axes of \(batch, channel, \*grid\): 4 entries for grid "
                               r"\(16, 16\), got \(1, 1, 2\)"),
])
def test_the_command_line_checks_the_partition_before_it_starts_again_on_its_devices(args, message, monkeypatch,
                                                                                      capsys):
    """The command starts again in a process of as many forced devices as the partition
    asks for: a count that is not an int, or that no axis takes, is the one line of a
    usage error before that (it was a traceback, or minutes making 99999 devices)."""
    monkeypatch.delenv(CHILD, raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--grid", "16", "16", "--modes", "4", "4", "--layers", "1", "--batch", "1", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(message, err) and "Traceback" not in err, err


def test_the_command_line_prints_json():
    env = child_env("JAX_ENABLE_X64")
    proc = subprocess.run(
        [sys.executable, "-m", "parop.nn.dryrun", "--grid", "16", "16", "--width", "4", "--modes", "4", "4",
         "--layers", "1", "--projection", "8", "--partition", "1", "1", "2", "1", "--batch", "1", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["devices"] == 2 and report["partition"] == [1, 1, 2, 1] and report["memory_bytes"] > 0
    assert set(report["collectives"]) == set(PLAN_KIND.values())
