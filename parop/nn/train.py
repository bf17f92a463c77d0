"""Training an operator-learning model with optax: normalisers, the relative L2 loss,
a jitted training loop with a progress bar and checkpoints, and the test error."""

from __future__ import annotations

import math
import numbers
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Iterator, Mapping, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checkpoint as ckpt
from .._checks import int_at_least, is_int
from .fno import DistributedFNO, FNO

Params = dict[str, jax.Array]

IN_FLIGHT = 8
"""How many calls `evaluate` queues before it waits for the oldest. Queuing lets dispatch
overlap the computation (300 calls of a small distributed program on 8 CPU devices:
0.25 s queued 8 deep, 0.6-0.8 s awaiting each); the bound is needed because XLA:CPU's
collectives over forced host devices deadlock when about 200 distributed programs are
queued (the process aborts after 40 s)."""


@runtime_checkable
class Dataset(Protocol):
    """What `fit` and `evaluate` take in place of in-memory `a, u`: `len(ds)` samples and
    `ds.batch(indices, sharding) -> (a, u)`, the samples `indices` as arrays with
    `sharding` (a distributed model's `in_sharding`; `None` for a serial model).
    `parop.datasets.open_store` gives one that reads a zarr store."""

    def __len__(self) -> int: ...

    def batch(self, indices: np.ndarray, sharding) -> tuple[jax.Array, jax.Array]: ...


@dataclass(frozen=True, eq=False)  # its arrays cannot be compared: equal only to itself
class UnitGaussianNormalizer:
    """Pointwise mean and standard deviation over the samples (axis 0), as in Li et al.

    ```python
    >>> from parop.nn import UnitGaussianNormalizer
    >>> a_train = jnp.arange(24.0).reshape(4, 6)
    >>> norm = UnitGaussianNormalizer.fit(a_train)
    >>> a = norm.encode(a_train); a_back = norm.decode(a)
    >>> bool(jnp.allclose(a.mean(axis=0), 0, atol=1e-6)), bool(jnp.allclose(a_back, a_train, atol=1e-5))
    (True, True)
    ```
    """

    mean: jax.Array
    std: jax.Array
    eps: float = 1e-5

    @classmethod
    def fit(cls, x: jax.Array) -> "UnitGaussianNormalizer":
        _check_array("UnitGaussianNormalizer.fit", "x", x)
        if not x.shape or x.shape[0] == 0:
            raise ValueError(f"UnitGaussianNormalizer.fit: needs samples along axis 0, got shape {x.shape}")
        return cls(jnp.mean(x, axis=0), jnp.std(x, axis=0))

    def encode(self, x: jax.Array) -> jax.Array:
        return (x - self.mean) / (self.std + self.eps)

    def decode(self, x: jax.Array) -> jax.Array:
        return x * (self.std + self.eps) + self.mean


# A pytree, so that `fit` and `evaluate` pass a normaliser to their programs as an argument:
# closed over, its arrays would be constants of the program (the whole grid's, on every
# device), and each normaliser would need a program of its own.
jax.tree_util.register_dataclass(UnitGaussianNormalizer, data_fields=["mean", "std"], meta_fields=["eps"])


def relative_l2(pred: jax.Array, target: jax.Array) -> jax.Array:
    """The mean over samples (axis 0) of `||pred - target|| / ||target||` (for complex
    data, the norms of the moduli); `pred` and `target` of one shape (a `ValueError`
    otherwise: broadcasting `(b, 1, n)` against `(b, n)` would compare every sample with
    every other)."""
    return jnp.mean(_relative_errors(pred, target, "relative_l2"))


def _relative_errors(pred: jax.Array, target: jax.Array, where: str) -> jax.Array:
    """`||pred - target|| / ||target||` of each sample (axis 0), after a `ValueError`
    naming `where` if their shapes differ."""
    _check_array(where, "the prediction", pred)
    _check_array(where, "the target", target)
    if pred.shape != target.shape:
        raise ValueError(f"{where}: the prediction {tuple(pred.shape)} and the target {tuple(target.shape)} must "
                         "have the same shape")
    axes = tuple(range(1, pred.ndim))
    complex_data = jnp.iscomplexobj(pred) or jnp.iscomplexobj(target)
    square = (lambda v: jnp.abs(v) ** 2) if complex_data else (lambda v: v**2)
    return jnp.sqrt(jnp.sum(square(pred - target), axis=axes)) / jnp.sqrt(jnp.sum(square(target), axis=axes))


def as_real(θ: Params) -> Params:
    """Complex weights as real arrays with a trailing (real, imaginary) axis, so that an
    optimiser treats both parts as independent reals (as PyTorch's Adam does) and
    JAX's conjugated complex gradients never reach it."""
    _check_params("as_real", θ)
    return {k: jnp.stack([v.real, v.imag], -1) if jnp.iscomplexobj(v) else v for k, v in θ.items()}


def as_complex(θ: Params, like: Params) -> Params:
    """The inverse of `as_real`."""
    _check_params("as_complex", θ)
    return {k: jax.lax.complex(v[..., 0], v[..., 1]) if jnp.iscomplexobj(like[k]) else v for k, v in θ.items()}


def make_step(loss: Callable[..., jax.Array], optimizer: optax.GradientTransformation, like: Params | None = None):
    """A jitted `step(θr, state, x, y, *more) -> (θr, state, loss)` of `loss(θ, x, y, *more)`
    (`more`: whatever else the loss reads, passed as arguments, not constants): with `like`
    (parameters with complex weights), `θr` is their real view (`as_real(like)`) and `loss`
    is given `as_complex(θr, like)`, as `fit` trains; without, `loss` is given `θr` as it is.

    ```python
    step = make_step(lambda θ, x, y: relative_l2(model.apply(θ, x), y), optax.adam(1e-3), θ)
    θr, state, value = step(as_real(θ), optax.adam(1e-3).init(as_real(θ)), a, u)
    ```
    """
    view = (lambda θr: θr) if like is None else (lambda θr: as_complex(θr, like))

    @jax.jit
    def step(θr, state, x, y, *more):
        value, grads = jax.value_and_grad(lambda θr: loss(view(θr), x, y, *more))(θr)
        updates, state = optimizer.update(grads, state, θr)
        return optax.apply_updates(θr, updates), state, value

    return step


def fit(model, θ: Params, a: jax.Array | Dataset, u: jax.Array | None = None, *, steps: int, batch: int,
        lr: float = 1e-3, seed: int = 0, decode: Callable | None = None, progress: bool = True,
        place: Callable | None = None, checkpoint: str | os.PathLike | None = None,
        every: int = 100, callback: Callable[[int, float], None] | None = None,
        prefetch: bool = True) -> tuple[Params, np.ndarray]:
    """Trains `model.apply` with Adam (`lr`, cosine decay to 0 over `steps`) on the
    relative L2 loss of `decode(model.apply(θ, a_batch))` against `u_batch`; returns the
    trained parameters (laid out as `θ` came in) and the loss at every step. The step
    compiles once; for parop's `FNO` with no `decode` or a `UnitGaussianNormalizer`'s it
    is kept for the next call with the same `lr` and `steps`, as `evaluate` keeps its
    program. `place` puts each batch where the model wants it (e.g. the distributed
    model's input sharding); `callback(step, loss)` runs after each step (its loss read,
    so the step has finished).

    The batches are consecutive slices of `batch` samples (at most `len(a)`: a larger
    batch is a `ValueError`) of a stream of random permutations of the samples drawn
    from `seed`: each sample once per epoch, a batch may straddle two epochs.

    `a` may be a `Dataset` (`parop.datasets.open_store`), with no `u`: the same batches
    in the same order, each read with `ds.batch(indices, model.in_sharding)` (each
    process reading its own blocks) and, with `prefetch`, read in a background thread
    while the step before it runs (one batch ahead).

    `checkpoint`: a directory (needs `pip install parop[train]`) where `fit` saves, after
    every `every` steps and after the last, the parameters (as `θ`), the optimiser state,
    the losses so far and the run's settings (`parop.checkpoint`, step = steps done, the
    two latest kept). If it already holds a checkpoint, `fit` resumes from the latest:
    the same data order (the seed, batch size and number of samples make it, the step
    says where in it), so a run restarted with the same arguments ends exactly as an
    uninterrupted one (same losses, same θ); one with other `steps`, `batch`, `lr`,
    `seed` or number of samples is a `ValueError`, and so is a directory whose latest
    step is not `fit`'s checkpoint of this model (other parameters, or a plain
    `checkpoint.save`) or does not restore (damaged: see `parop.checkpoint.restore`).

    ```python
    >>> from parop.datasets import darcy_flow
    >>> from parop.nn import FNO, fit
    >>> model = FNO((16, 16), width=4, modes=(4, 4), layers=1)
    >>> a, u = darcy_flow(8, 16)                      # (8, 16, 16) each
    >>> θ0 = model.init(jax.random.key(0))
    >>> θ, losses = fit(model, θ0, a[:, None], u[:, None], steps=4, batch=4, checkpoint="runs/fno", every=2,
    ...                 progress=False)
    >>> losses.shape
    (4,)
    >>> θ, again = fit(model, θ0, a[:, None], u[:, None], steps=4, batch=4, checkpoint="runs/fno", every=2,
    ...                progress=False)                # resumed from step 4: nothing left to run
    >>> bool(np.array_equal(again, losses))
    True
    ```
    """
    n = _check_data("fit", model, a, u, batch)
    _check_arguments("fit", θ, decode=decode, place=place, callback=callback)
    _check_counts("fit", steps=steps, every=every)
    if getattr(lr, "shape", None) == () and np.issubdtype(getattr(lr, "dtype", None), np.floating):
        lr = float(lr)  # a 0-d float array (jnp.float32(1e-3)), as a NumPy scalar is
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not 0 < lr < math.inf:
        raise ValueError(f"fit: lr must be a positive number, got lr={lr!r}")
    if not is_int(seed) or not 0 <= seed < 2**64:  # (a checkpoint keeps it as a 64-bit int)
        raise ValueError(f"fit: seed must be an int in [0, 2**64) (it draws the order of the samples), got "
                         f"seed={seed!r}")
    if batch > n:
        raise ValueError(f"fit: batch={batch} is larger than the data set ({n} samples): use batch <= {n}")
    decoding, normaliser = _decoder(decode)
    take = _take(model, a, u, place)
    θr = as_real(θ)
    state, normaliser = _on_mesh(_adam(lr, steps).init(θr), θr), _placed_operand(normaliser, model, θ)
    losses = np.empty(steps)
    run = {"steps": int(steps), "batch": int(batch), "lr": float(lr), "seed": int(seed), "samples": n}
    start = 0 if checkpoint is None else ckpt.latest_step(checkpoint) or 0
    if start:
        θr, state, losses[:start] = _resume(checkpoint, start, θ, state, run)
    dtypes = tuple((name, np.dtype(value.dtype)) for name, value in θ.items())
    step = _program(_training_step, model, decoding, float(lr), int(steps), dtypes)
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])
    bar = _progress(steps, start) if progress else None
    batches = _batches(take, (order[i * batch:(i + 1) * batch] for i in range(start, steps)),
                       prefetch and isinstance(a, Dataset))
    for i, (x, y) in zip(range(start, steps), batches):
        θr, state, value = step(θr, state, x, y, normaliser)
        losses[i] = float(value)  # also waits for the step, so collectives never pile up
        if bar is not None:
            bar(i, losses[i])
        if callback is not None:
            callback(i, losses[i])
        if checkpoint is not None and ((i + 1) % every == 0 or i + 1 == steps):
            ckpt.save(checkpoint, _training_state(as_complex(θr, θ), state, losses[:i + 1], run), step=i + 1, keep=2)
    return _placed_like(as_complex(θr, θ), θ), losses


def _adam(lr: float, steps: int) -> optax.GradientTransformation:
    """`fit`'s optimiser: Adam at `lr`, decayed to 0 over `steps` (a cosine)."""
    return optax.adam(optax.cosine_decay_schedule(lr, steps))


@lru_cache(maxsize=8)  # bounded: the steps of the latest (model, decoding, lr, steps, parameter dtypes)
def _training_step(model, decoding: Callable, lr: float, steps: int, dtypes: tuple) -> Callable:
    """`fit`'s jitted `step(θr, state, x, y, operand)` (`make_step`) of the relative L2 loss
    of `decoding(operand, model.apply)` (`_decoder`), with `_adam(lr, steps)`, on parameters
    of these `(name, dtype)`s."""
    like = {name: np.zeros((), dtype) for name, dtype in dtypes}  # `as_complex` reads their dtypes alone
    return make_step(lambda θ, x, y, operand: relative_l2(decoding(operand, model.apply(θ, x)), y),
                     _adam(lr, steps), like)


def _decoder(decode: Callable | None) -> tuple[Callable, object]:
    """`(decoding, operand)` with `decoding(operand, x) == decode(x)`; the programs take
    `operand` as an argument. A `UnitGaussianNormalizer`'s `decode` is its class's function
    and the normaliser (its arrays arguments, not constants of the program, and one
    program for every normaliser); no `decode` is `_unchanged`; any other `decode`, a
    function of `x` alone, has no operand."""
    if decode is None:
        return _unchanged, None
    normaliser = getattr(decode, "__self__", None)
    if type(normaliser) is UnitGaussianNormalizer and decode.__func__ is UnitGaussianNormalizer.decode:
        return UnitGaussianNormalizer.decode, normaliser
    return (lambda _, x: decode(x)), None


def _placed_operand(operand, model, θ: Params):
    """`_decoder`'s operand placed once for every call: an uncommitted array of one target's
    shape `(out_channels, *grid)` (a pointwise normaliser's) split as the model's targets
    are (`in_sharding` less the samples' axis: each device holds its block, and decoding
    moves nothing), any other leaf replicated (`_on_mesh`)."""
    sharding = getattr(model, "in_sharding", None)
    if operand is None or not isinstance(sharding, jax.NamedSharding):
        return _on_mesh(operand, θ)
    target = (getattr(model, "out_channels", None), *getattr(model, "grid", ()))
    block = jax.NamedSharding(sharding.mesh, jax.P(*sharding.spec[1:]))
    return _on_mesh(jax.tree.map(
        lambda leaf: jax.device_put(leaf, block) if not getattr(leaf, "committed", False) and np.shape(leaf) == target
        else leaf, operand), θ)


def _on_mesh(tree, θ: Params):
    """`tree` with every leaf not committed to devices (Adam's step count, which optax makes
    on one device; a normaliser's arrays) replicated over the parameters' mesh, where the
    jitted step returns them: placed otherwise, a second call would compile the program
    again (jit's cache tells the placements apart) or copy them over again."""
    meshes = {leaf.sharding.mesh for leaf in jax.tree.leaves(θ)
              if isinstance(getattr(leaf, "sharding", None), jax.NamedSharding)}  # (NumPy leaves have none)
    if not meshes:  # a serial model: its programs take and return uncommitted arrays
        return tree
    replicated = jax.NamedSharding(meshes.pop(), jax.P())
    return jax.tree.map(lambda leaf: leaf if getattr(leaf, "committed", False) else jax.device_put(leaf, replicated),
                        tree)


def _placed_like(trained: Params, θ: Params) -> Params:
    """`trained` with each committed leaf of `θ`'s sharding, spelled as `θ` spells it: the
    view back from real to complex drops a spec's trailing `None`s, and a program jitted
    on `θ` would compile again for the same layout spelled otherwise."""
    return {k: jax.device_put(v, θ[k].sharding) if getattr(θ[k], "committed", False) else v
            for k, v in trained.items()}


def _check_data(where: str, model, a, u, batch: int) -> int:
    """The number of samples, after `ValueError`s for no data, unlike lengths, a batch
    size below 1 or a data set whose shapes the model does not take, and `TypeError`s
    for a missing `u` or one beside a data set."""
    _check_counts(where, batch=batch)
    if isinstance(a, Dataset):
        if u is not None:
            raise TypeError(f"{where}: a data set holds its own targets: call {where}(model, θ, ds, ...) without u")
        _check_shapes(where, model, a)
        if len(a) == 0:
            raise ValueError(f"{where}: no data: the data set holds 0 samples")
        return len(a)
    if u is None:
        raise TypeError(f"{where}: u (the targets) is missing: pass a and u, or a data set (parop.datasets.open_store)")
    _check_array(where, "a", a, ", samples first (NumPy or JAX), or a data set")
    _check_array(where, "u", u, ", samples first (NumPy or JAX)")
    for name, value in (("a", a), ("u", u)):
        if not np.shape(value):
            raise ValueError(f"{where}: {name} must hold samples along its axis 0, got a 0-d array")
    if len(a) != len(u):
        raise ValueError(f"{where}: a and u must hold as many samples (axis 0), got len(a)={len(a)}, len(u)={len(u)}")
    if len(a) == 0:
        raise ValueError(f"{where}: no data: a and u hold 0 samples")
    return len(a)


def _check_array(where: str, name: str, value, what: str = " (NumPy or JAX)") -> None:
    """A `TypeError` naming `where` and `name` unless `value` is an array (it has a shape:
    a nested list is not converted, its dtype would be a guess)."""
    if not hasattr(value, "shape"):
        raise TypeError(f"{where}: {name} must be an array{what}, got {type(value).__name__}")


def _check_params(where: str, θ) -> None:
    """A `TypeError` naming `where` unless `θ` is a dict of parameters."""
    if not isinstance(θ, Mapping):
        raise TypeError(f"{where}: θ must be a dict {{name: array}} (model.init(key)), got {type(θ).__name__}")


def _check_arguments(where: str, θ, **functions) -> None:
    """`TypeError`s naming `where` and the argument for parameters that are not a dict
    and for functions (`decode`, `place`, `callback`) that are neither None nor callable."""
    _check_params(where, θ)
    for name, function in functions.items():
        if function is not None and not callable(function):
            raise TypeError(f"{where}: {name} must be a function (or None), got {type(function).__name__}")


def _check_counts(where: str, **counts) -> None:
    """A `TypeError` for a count that is not an int (a NumPy integer is one; a bool is
    not), and a `ValueError` for one below 1, each naming `where` and the argument."""
    for name, value in counts.items():
        int_at_least(value, 1, name, where)


def _check_shapes(where: str, model, ds) -> None:
    """A `ValueError` where a data set's samples are not what the model takes and gives:
    `(in_channels, *grid)` and `(out_channels, *grid)` (models without those attributes
    are not checked)."""
    grid = getattr(model, "grid", None)
    for role, array, channels in (("inputs", getattr(ds, "inputs", None), getattr(model, "in_channels", None)),
                                  ("targets", getattr(ds, "targets", None), getattr(model, "out_channels", None))):
        if grid is None or channels is None or array is None:
            continue
        want = (channels, *grid)
        if tuple(array.shape[1:]) != want:
            raise ValueError(f"{where}: the data set's {role} are {tuple(array.shape)} (samples, channels, *grid), but "
                             f"the model takes {role} of shape (samples,) + {want}: write a store of that shape, or "
                             f"build the model for the store's")


def _take(model, a, u, place: Callable | None) -> Callable[[np.ndarray], tuple]:
    """`take(indices) -> (x, y)`: the samples `indices` of `a, u` (in-memory arrays or a
    `Dataset`), placed by `place`; a data set reads them into the model's `in_sharding`."""
    place = place or (lambda x: x)
    if isinstance(a, Dataset):
        sharding = getattr(model, "in_sharding", None)
        return lambda idx: tuple(place(v) for v in a.batch(idx, sharding))
    return lambda idx: (place(a[idx]), place(u[idx]))


def _batches(take: Callable[[np.ndarray], tuple], indices: Iterable[np.ndarray], prefetch: bool) -> Iterator[tuple]:
    """`take(idx)` for each `idx` of `indices`, in order; with `prefetch`, each one is
    read in a background thread while the caller uses the one before (one batch ahead:
    at most two are held). The thread only reads and places data (no collectives), so
    the processes of a multi-process run cannot get their programs out of order."""
    if not prefetch:
        yield from map(take, indices)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="parop-prefetch") as pool:
        pending = None
        for idx in indices:
            following = pool.submit(take, idx)
            if pending is not None:
                yield pending.result()
            pending = following
        if pending is not None:
            yield pending.result()


def _training_state(θ: Params, opt_state, losses: np.ndarray, run: dict) -> dict:
    """What `fit` checkpoints."""
    return {"params": θ, "opt_state": opt_state, "losses": losses,
            "run": {name: np.asarray(value) for name, value in run.items()}}


def _resume(path, step: int, θ: Params, opt_state, run: dict):
    """The real-view parameters, optimiser state and losses saved at `step`, placed like
    `θ` and `opt_state`; a `ValueError` if they come from a run with other settings, or
    are not `fit`'s checkpoint of this model, or do not restore (`checkpoint.restore`'s
    error)."""
    try:
        saved = ckpt.restore(path, _training_state(θ, opt_state, np.empty(step), run), step=step)
    except ValueError as error:  # another model's checkpoint, or not one of `fit`'s, or a damaged one
        raise ValueError(f"fit: cannot resume from {os.fspath(path)!r}: {error}") from error
    other = {name: value.item() for name, value in saved["run"].items() if value.item() != run[name]}
    if other:
        raise ValueError(
            f"fit: {os.fspath(path)!r} holds a checkpoint of another run ("
            + ", ".join(f"{name}={value!r} there, {run[name]!r} here" for name, value in other.items())
            + "): resume with its settings, or checkpoint into another directory"
        )
    return as_real(saved["params"]), saved["opt_state"], saved["losses"]


def _progress(total: int, initial: int = 0):
    """A progress bar from step `initial`: tqdm's where installed, else a line every 10%."""
    try:
        import ipywidgets  # noqa: F401  (tqdm.auto needs it for a notebook widget)
        from tqdm.auto import tqdm
    except ImportError:
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
    if tqdm is None:
        start = time.perf_counter()

        def report(i, value):
            if (i + 1) % max(1, total // 10) == 0 or i + 1 == total:
                print(f"step {i + 1}/{total}  loss {value:.4f}  {time.perf_counter() - start:.0f} s", flush=True)

        return report
    bar = tqdm(total=total, initial=initial)

    def update(i, value):
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        if i + 1 == total:
            bar.close()

    return update


def _unchanged(operand, x: jax.Array) -> jax.Array:
    """The decoding where no `decode` is given (`_decoder`; one function, so that programs
    are kept: `_program`)."""
    return x


def _program(make, model, decoding: Callable, *settings) -> Callable:
    """`make(model, decoding, *settings)` (a jitted program; `make` an `lru_cache`), kept
    where a program traced for `model` and `decoding` stays right: parop's `FNO` itself
    (made once for its settings: it keeps its plans too; not a subclass, which may add
    state) with no `decode` or a `UnitGaussianNormalizer`'s (`_decoder`: the normaliser is
    an argument). A user's object may change between calls: made anew."""
    keeps = type(model) in (FNO, DistributedFNO) and decoding in (_unchanged, UnitGaussianNormalizer.decode)
    return (make if keeps else make.__wrapped__)(model, decoding, *settings)


@lru_cache(maxsize=8)  # bounded: the programs of the latest (model, decoding, batch)s
def _error_program(model, decoding: Callable, batch: int) -> Callable:
    """The jitted `error_sum(θ, x, y, count, operand)`: the sum of the relative errors of
    `decoding(operand, model.apply(θ, x))` (`_decoder`) against `y` over the first `count`
    of `batch` samples."""

    @jax.jit
    def error_sum(θ, x, y, count, operand):
        errors = _relative_errors(decoding(operand, model.apply(θ, x)), y, "evaluate")
        return jnp.sum(jnp.where(jnp.arange(batch) < count, errors, 0))

    return error_sum


def evaluate(model, θ: Params, a: jax.Array | Dataset, u: jax.Array | None = None, *, batch: int,
             decode: Callable | None = None, place: Callable | None = None, prefetch: bool = True) -> float:
    """The relative L2 error of `decode(model.apply(θ, a))` against `u`: the mean over all
    samples of `||pred - u|| / ||u||`, computed `batch` samples per call.

    Every call gets `batch` samples: where the data do not fill the last one, it is
    filled up with the first samples, whose errors are not counted. So the model
    compiles once, a model with a fixed batch size works, and `batch` may exceed the
    number of samples. For an `FNO` with no `decode` or a `UnitGaussianNormalizer`'s,
    the program is kept (the latest 8 of them): evaluating again, as a training loop
    does, compiles nothing. (Any other model or `decode` may change between calls, and
    a kept program would not see it: each call compiles its own.) At most `IN_FLIGHT`
    calls are queued at a time. `a` may be a `Dataset`, with no `u` (read as `fit` reads
    it, `prefetch` too).

    ```python
    >>> from parop.nn import FNO, evaluate
    >>> model = FNO((16,), width=4, modes=(4,), layers=1)
    >>> θ, a = model.init(jax.random.key(0)), jnp.ones((6, 1, 16))
    >>> evaluate(model, θ, a, model.apply(θ, a), batch=4) < 1e-6     # the model against itself
    True
    ```
    """
    n = _check_data("evaluate", model, a, u, batch)
    _check_arguments("evaluate", θ, decode=decode, place=place)
    decoding, normaliser = _decoder(decode)
    normaliser = _placed_operand(normaliser, model, θ)
    take = _take(model, a, u, place)
    error_sum = _program(_error_program, model, decoding, batch)
    total, queued = 0.0, deque()
    starts = range(0, n, batch)
    batches = _batches(take, (np.arange(start, start + batch) % n for start in starts),
                       prefetch and isinstance(a, Dataset))
    for start, (x, y) in zip(starts, batches):
        queued.append(error_sum(θ, x, y, min(batch, n - start), normaliser))
        if len(queued) == IN_FLIGHT:
            total += float(queued.popleft())  # waits for the oldest call
    return (total + sum(float(e) for e in queued)) / n
