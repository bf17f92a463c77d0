"""The yardsticks: distributed 3-D FFTs written by hand with `jax.shard_map` and
`jax.lax.all_to_all`, no parop.

Each program is the same algorithm as parop's plan for that case (the same
`all_to_all`s between the same layouts), written as directly as JAX allows:
adjacent local FFTs are one `fftn`/`rfftn` call (one XLA FFT op over several axes,
one transpose pair at most), and each repartition is one tiled `all_to_all`.

A program is a list of steps on the local block:

- `("fft", axes)`: `jnp.fft.fftn` over `axes`;
- `("rfft", axes)`: `jnp.fft.rfftn` over `axes` (the last one is the real axis);
- `("a2a", mesh_axes, src, dst)`: move the split `mesh_axes` (the minor end of tensor
  axis `src`) onto tensor axis `dst`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

# (kind, partition name, out) -> (in spec, steps, out spec). Mesh axes d0, d1 as in
# parop's default mesh: slab (8, 1, 1) is d0: 8; pencil (2, 4, 1) is d0: 2, d1: 4.
PROGRAMS = {
    ("c2c", "slab", None): (P("d0", None, None), [
        ("fft", (1, 2)),
        ("a2a", "d0", 0, 1),
        ("fft", (0,)),
        ("a2a", "d0", 1, 0),
    ], P("d0", None, None)),
    ("c2c", "slab", "auto"): (P("d0", None, None), [
        ("fft", (1, 2)),
        ("a2a", "d0", 0, 1),
        ("fft", (0,)),
    ], P(None, "d0", None)),
    ("c2c", "pencil", None): (P("d0", "d1", None), [
        ("fft", (2,)),
        ("a2a", "d1", 1, 2),
        ("fft", (1,)),
        ("a2a", "d0", 0, 1),
        ("fft", (0,)),
        ("a2a", "d0", 1, 0),
        ("a2a", "d1", 2, 1),
    ], P("d0", "d1", None)),
    ("c2c", "pencil", "auto"): (P("d0", "d1", None), [
        ("fft", (2,)),
        ("a2a", "d0", 0, 2),
        ("fft", (0,)),
        ("a2a", "d1", 1, 0),
        ("fft", (1,)),
    ], P("d1", None, "d0")),
    ("r2c", "slab", None): (P("d0", None, None), [
        ("a2a", "d0", 0, 1),
        ("rfft", (0, 2)),
        ("a2a", "d0", 1, 0),
        ("fft", (1,)),
    ], P("d0", None, None)),
    ("r2c", "slab", "auto"): (P("d0", None, None), [
        ("rfft", (1, 2)),
        ("a2a", "d0", 0, 1),
        ("fft", (0,)),
    ], P(None, "d0", None)),
    ("r2c", "pencil", None): (P("d0", "d1", None), [
        ("a2a", "d1", 1, 0),
        ("rfft", (1, 2)),
        ("a2a", "d1", 0, 1),
        ("a2a", "d0", 0, 1),
        ("fft", (0,)),
        ("a2a", "d0", 1, 0),
    ], P("d0", "d1", None)),
    ("r2c", "pencil", "auto"): (P("d0", "d1", None), [
        ("a2a", "d0", 0, 1),
        ("rfft", (0, 2)),
        ("a2a", ("d1", "d0"), 1, 0),
        ("fft", (1,)),
    ], P(("d1", "d0"), None, None)),
}


def all_to_alls(steps) -> list[tuple[tuple[str, ...], int, int]]:
    """The `(mesh axes, src, dst)` of each `all_to_all`, to compare with a plan's."""
    return [((s[1],) if isinstance(s[1], str) else tuple(s[1]), s[2], s[3]) for s in steps if s[0] == "a2a"]


def program(steps, mesh, in_spec, out_spec):
    """The jitted `shard_map` program for `steps` on `mesh`: `f(x) -> y`, `x` laid out
    as `in_spec`, `y` as `out_spec`."""

    def body(x):
        for step in steps:
            if step[0] == "fft":
                x = jnp.fft.fftn(x, axes=step[1])
            elif step[0] == "rfft":
                x = jnp.fft.rfftn(x, axes=step[1])
            else:
                _, name, src, dst = step
                x = lax.all_to_all(x, name, split_axis=dst, concat_axis=src, tiled=True)
        return x

    f = jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec)
    return jax.jit(f, in_shardings=NamedSharding(mesh, in_spec), out_shardings=NamedSharding(mesh, out_spec))
