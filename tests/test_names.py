"""Parameter names are a function of the operator, never of the process's history.

1. The same operator built twice (whatever was built in between) is equal, with the
   same names and the same `po.init` values; a leaf alone is `Matrix_0`.
2. Sharing: one leaf object in two places (or its adjoint) is one weight, an explicit
   shared name is one, two unnamed leaves built apart are two; explicit names are
   skipped by the generated ones; a count per class.
3. `jax.jit` and `tree_util` round trips keep the leaf objects and the sharing, and
   `jit` never reuses the trace of `A @ A` (one weight) for `A @ B` (two).
4. `A.H`, `A.T`, `A + A.H`, `A.H @ A` take θ from `po.init(A)`: the adjoint of a
   composition names its leaves as the composition does.
5. A distributed operator names its leaves as its operator; separately distributed
   unnamed leaves are two weights in `D2 @ D1`; a chain names its operators together.
6. A checkpoint saved in one process restores into the model rebuilt by the same code
   in another.

References: NumPy products of θ's arrays.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import parop as po
from reference import close, random_array, random_params

RNG = np.random.default_rng


def model() -> po.Operator:
    """Two unnamed matrices and a named diagonal on (4, 3) tensors."""
    return (po.kron(po.Matrix(4, 4, "float64"), po.Identity(3))
            @ po.kron(po.Matrix(4, 4, "float64"), po.Diagonal(3, "float64", name="d")))


def weights(*shapes, dtype="float64", seed=0) -> list[np.ndarray]:
    rng = RNG(seed)
    return [random_array(rng, shape, dtype) for shape in shapes]


# -- 1. the same operator twice ---------------------------------------------------------------

def test_the_same_operator_built_twice_is_equal_with_the_same_names_and_values():
    a = model()
    po.Matrix(2, 2) @ po.Matrix(2, 2), po.Diagonal(5)  # other leaves built in between change nothing
    b = model()
    assert a == b and hash(a) == hash(b)
    assert list(a.parameters) == list(b.parameters) == ["Matrix_0", "Matrix_1", "d"]
    θa, θb = po.init(a, jax.random.key(3)), po.init(b, jax.random.key(3))
    assert list(θa) == list(θb)
    for name in θa:
        np.testing.assert_array_equal(θa[name], θb[name])
    assert po.Matrix(3, 3) == po.Matrix(3, 3) and po.Matrix(3, 3).name is None
    assert list(po.Matrix(3, 3).parameters) == ["Matrix_0"]
    assert repr(a.named) == "(Matrix(4×4 'Matrix_0') ⊗ I(3)) @ (Matrix(4×4 'Matrix_1') ⊗ Diagonal(3 'd'))"
    assert repr(a) == "(Matrix(4×4) ⊗ I(3)) @ (Matrix(4×4) ⊗ Diagonal(3 'd'))" and "'Matrix_1'" in po.tree(a)


# -- 2. sharing ---------------------------------------------------------------------------------

def test_one_object_or_one_explicit_name_is_one_weight_two_unnamed_leaves_are_two():
    W = po.Matrix(4, 4, "complex128")
    assert list((W @ W).parameters) == list(po.kron(W, W).parameters) == ["Matrix_0"]
    assert list((W @ W.H).parameters) == ["Matrix_0"]  # a leaf and its adjoint: one weight
    assert list((po.Matrix(4, 4, name="w") @ po.Matrix(4, 4, name="w")).parameters) == ["w"]
    assert list((po.Matrix(4, 4) @ po.Matrix(4, 4)).parameters) == ["Matrix_0", "Matrix_1"]
    assert list((po.Matrix(4, 4, name="Matrix_0") @ po.Matrix(4, 4)).parameters) == ["Matrix_0", "Matrix_1"]
    assert list((po.Diagonal(4) @ po.Matrix(4, 4) @ po.Diagonal(4)).parameters) == [
        "Diagonal_0", "Matrix_0", "Diagonal_1"]  # a count per class
    (w,) = weights((4, 4), dtype="complex128")
    close(po.to_dense(W @ W.H, {"Matrix_0": jnp.asarray(w)}), w @ w.conj().T)


# -- 3. round trips and traces ----------------------------------------------------------------

def test_tree_round_trips_keep_the_leaf_objects_and_the_sharing():
    A, B = po.Matrix(4, 4, "float64"), po.Matrix(4, 4, "float64")
    for op, count in ((A @ A, 1), (A @ B, 2), (po.kron(A, B.H) + po.kron(B, A.H), 2), (A.T @ A.H, 1)):
        leaves, treedef = jax.tree.flatten(op)
        back = jax.tree.unflatten(treedef, leaves)
        assert back == op and len(back.parameters) == count
    back = jax.tree.unflatten(jax.tree.structure(A @ B), [])
    assert back.ops[0] is A and back.ops[1] is B
    assert A @ A != A @ B and jax.tree.structure(A @ A) != jax.tree.structure(A @ B)


def test_jit_does_not_reuse_the_trace_of_A_at_A_for_A_at_B():
    """Equal-looking trees with other sharing: their own traces, right results; an
    equal tree (built again) reuses the trace."""
    A, B = po.Matrix(4, 4, "float64"), po.Matrix(4, 4, "float64")
    w0, w1, x = weights((4, 4), (4, 4), (4, 2))
    θ = {"Matrix_0": jnp.asarray(w0), "Matrix_1": jnp.asarray(w1)}
    traces = []

    @jax.jit
    def apply(bound, x):
        traces.append(bound)
        return bound @ x

    close(apply((A @ A)(θ), x), w0 @ w0 @ x)
    close(apply((A @ B)(θ), x), w0 @ w1 @ x)
    close(apply((po.Matrix(4, 4, "float64") @ po.Matrix(4, 4, "float64"))(θ), x), w0 @ w1 @ x)
    assert len(traces) == 2


# -- 4. adjoints and transposes -----------------------------------------------------------------

def test_the_adjoint_and_transpose_take_the_parameters_of_the_operator():
    """Square factors, so that swapped names would pass the shape checks: only the
    values tell."""
    A = po.Matrix(3, 3, "complex128") @ po.kron(po.Matrix(3, 3, "complex128"))
    θ = random_params(A, 1)
    M = np.asarray(θ["Matrix_0"]) @ np.asarray(θ["Matrix_1"])
    MH = M.conj().T
    for op, want in ((A.H, MH), (A.T, M.T), (A + A.H, M + MH), (A.H @ A, MH @ M), (A @ A.H, M @ MH),
                     (A.H.T, M.conj()), ((A + A.H).H, M + MH), (2.0 * A.H - A, 2 * MH - M)):
        assert op.parameters.keys() == A.parameters.keys(), op
        close(po.to_dense(op, θ), want)
    assert A.H.H is A and A.T.T is A


# -- 5. distributed operators -------------------------------------------------------------------

def test_distributed_operators_name_their_leaves_as_their_operators():
    def layer():
        return po.kron(po.Matrix(4, 4, "float64"), po.Identity(8))

    op = layer() @ layer()
    D = po.distribute(op, (1, 2))
    key = jax.random.key(0)
    θ, θD = po.init(op, key), po.init(D, key)
    assert list(θD) == list(θ) == ["Matrix_0", "Matrix_1"]
    for name in θ:
        np.testing.assert_array_equal(θD[name], θ[name])
    w0, w1 = (np.asarray(θ[name]) for name in ("Matrix_0", "Matrix_1"))
    (x,) = weights((4, 8))
    close(D(θ) @ x, w0 @ w1 @ x)
    D1, D2 = po.distribute(layer(), (1, 2)), po.distribute(layer(), (1, 2))
    assert list(D1.parameters) == list(D2.parameters) == ["Matrix_0"]
    both = D2 @ D1  # separately built: two weights
    assert list(both.parameters) == ["Matrix_0", "Matrix_1"] and D1 @ D1 != both
    close(both(θ) @ x, w0 @ w1 @ x)
    close((D2 + D1)(θ) @ x, (w0 + w1) @ x)
    first, second = po.distribute_chain([layer(), layer()], (1, 2))  # one model: named together
    assert (list(first.parameters), list(second.parameters)) == (["Matrix_0"], ["Matrix_1"])
    close(second(θ) @ (first(θ) @ x), w1 @ w0 @ x)


# -- 6. checkpoints across processes ------------------------------------------------------------

MODEL = ("po.kron(po.Matrix(4, 3), po.Identity(2)) @ po.kron(po.Matrix(3, 4), po.Diagonal(2))"
         " @ po.kron(po.Matrix(4, 4), po.Identity(2))")

RESTORE = textwrap.dedent(f'''
    import sys
    import jax, numpy as np, parop as po
    from parop import checkpoint

    op = {MODEL}
    θ = checkpoint.restore(sys.argv[1], po.init(op, jax.random.key(1)))
    fresh = po.init(op, jax.random.key(0))
    assert sorted(θ) == sorted(fresh), (sorted(θ), sorted(fresh))
    for name in θ:
        np.testing.assert_array_equal(θ[name], fresh[name])
    print(sorted(θ))
''')


def test_a_checkpoint_restores_into_the_model_rebuilt_in_a_fresh_process(tmp_path):
    """Saved here (after every other test of this process built its leaves), restored
    into the model the same code builds in a fresh process: the same names, and the
    values `po.init` draws there for the same key."""
    pytest.importorskip("orbax.checkpoint")
    from parop import checkpoint

    checkpoint.save(tmp_path / "ckpt", po.init(eval(MODEL), jax.random.key(0)))
    run = subprocess.run([sys.executable, "-c", RESTORE, str(tmp_path / "ckpt")], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "['Diagonal_0', 'Matrix_0', 'Matrix_1', 'Matrix_2']"
