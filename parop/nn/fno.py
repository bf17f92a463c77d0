"""A 2-D Fourier neural operator (Li et al. 2020) built from parop operators.

Every linear map of the network is a parop operator on the tensor
`(batch, channel, x, y)`; between them stand only bias additions and GELUs. So the
same model runs serial or, through `FNO.distribute`, as one `shard_map` program per
layer over a device mesh (the spatial axes split, the spectral weights split with
their modes).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import _dtypes
from ..algebra import kron
from ..distributed import DistributedOperator, distribute
from ..distributed.layout import Layout, layout_of, spec_of
from ..distributed.operator import place
from ..distributed.plan import make_plan
from ..operator import Operator
from ..operators import DFT, Identity, Matrix, PerModeMatrix, Restriction
from ..params import name_key

Params = dict[str, jax.Array]


def spectral_convolution(batch: int, width: int, grid: tuple[int, int], modes: tuple[int, int],
                         dtype, name: str) -> Operator:
    """The FNO's spectral convolution as one operator on `(batch, width, x, y)`:
    `rFFT -> keep the low modes -> PerModeMatrix -> put them back -> inverse rFFT`.

    `modes = (mx, my)` as in `neuraloperator`: `mx` frequencies on the full axis
    (`-mx//2 .. (mx+1)//2 - 1`, both ends of the spectrum) and `my//2 + 1` on the
    real-FFT axis (`0 .. my//2`).
    """
    (nx, ny), (mx, my) = grid, modes
    cdtype = _dtypes.complex_of(dtype)
    fx, fy = DFT(nx, cdtype), DFT(ny, dtype)
    rx = Restriction(nx, [slice(0, (mx + 1) // 2), slice(nx - mx // 2, nx)])
    ry = Restriction(ny // 2 + 1, slice(0, my // 2 + 1))
    weights = PerModeMatrix(width, width, (mx, my // 2 + 1), cdtype, name=name)
    down = kron(Identity(batch), Identity(width), rx @ fx, ry @ fy)
    up = kron(Identity(batch), Identity(width), fx.inverse() @ rx.H, fy.inverse() @ ry.H)
    return up @ kron(Identity(batch), weights) @ down


def channel_mixing(batch: int, c_out: int, c_in: int, grid: tuple[int, int], dtype, name: str) -> Operator:
    """A 1x1 convolution (without bias): `Matrix(c_out, c_in)` on the channel axis."""
    return kron(Identity(batch), Matrix(c_out, c_in, dtype, name=name), Identity(grid[0]), Identity(grid[1]))


class FNO:
    """A 2-D FNO: lifting, `layers` Fourier layers (spectral convolution + 1x1 skip +
    GELU), and a two-layer pointwise projection, on inputs `(batch, in_channels, x, y)`
    with the grid coordinates appended as two more channels.

    ```python
    >>> model = FNO(batch=20, grid=(32, 32), width=32, modes=(12, 12), layers=4)
    >>> θ = model.init(jax.random.key(0))
    >>> u = model.apply(θ, a)                      # a: (20, 1, 32, 32) -> (20, 1, 32, 32)
    >>> dist = model.distribute((1, 1, 2, 4))      # the same network over 8 devices
    >>> u2 = dist.apply(dist.init(jax.random.key(0)), a)
    ```
    """

    def __init__(self, batch: int, grid: Sequence[int], *, in_channels: int = 1, out_channels: int = 1,
                 width: int = 32, modes: Sequence[int] = (12, 12), layers: int = 4, projection: int = 128,
                 dtype=jnp.float32, operators: dict[str, Any] | None = None):
        self.batch, self.grid = batch, tuple(grid)
        self.width, self.modes, self.n_layers = width, tuple(modes), layers
        self.in_channels, self.out_channels, self.projection = in_channels, out_channels, projection
        self.dtype = _dtypes.canonical(dtype)
        self.ops = operators or self._build()

    def _build(self) -> dict[str, Any]:
        b, g, w, d = self.batch, self.grid, self.width, self.dtype
        return {
            "lift": channel_mixing(b, w, self.in_channels + 2, g, d, "lift"),
            "layers": [
                spectral_convolution(b, w, g, self.modes, d, f"spectral{k}") + channel_mixing(b, w, w, g, d, f"skip{k}")
                for k in range(self.n_layers)
            ],
            "proj1": channel_mixing(b, self.projection, w, g, d, "proj1"),
            "proj2": channel_mixing(b, self.out_channels, self.projection, g, d, "proj2"),
        }

    @property
    def operators(self) -> list[Operator]:
        return [self.ops["lift"], *self.ops["layers"], self.ops["proj1"], self.ops["proj2"]]

    # -- parameters ------------------------------------------------------------------------
    def init(self, key: jax.Array) -> Params:
        """Parameters as in `neuraloperator`: 1x1 convolutions and biases uniform in
        `±1/sqrt(fan_in)`, spectral weights with real and imaginary parts uniform in
        `[0, 1/width²)`; deterministic in `key`, and placed where a distributed model
        needs them."""
        θ: Params = {}
        for op in self.operators:
            shardings = op.param_shardings() if isinstance(op, DistributedOperator) else {}
            for name, leaf in op.parameters.items():
                k = name_key(key, name)
                if name.startswith("spectral"):
                    real = _dtypes.real_of(leaf.param_dtype)
                    re, im = jax.random.uniform(k, (2,) + leaf.param_shape, real) / self.width**2
                    value = jax.lax.complex(re, im)
                else:
                    bound = 1 / math.sqrt(leaf.param_shape[1])
                    value = jax.random.uniform(k, leaf.param_shape, leaf.param_dtype, -bound, bound)
                    bias = jax.random.uniform(name_key(key, f"{name}.bias"),
                                              leaf.param_shape[:1], leaf.param_dtype, -bound, bound)
                    θ[f"{name}.bias"] = _place(bias, shardings and NamedSharding(op.mesh, PartitionSpec()))
                θ[name] = _place(value, shardings.get(name))
        return θ

    # -- the network -------------------------------------------------------------------------
    def apply(self, θ: Params, a: jax.Array) -> jax.Array:
        """The FNO on `a` of shape `(batch, in_channels, x, y)`."""
        nx, ny = self.grid
        gx = jnp.broadcast_to(jnp.linspace(0, 1, nx, dtype=self.dtype)[:, None], (nx, ny))
        gy = jnp.broadcast_to(jnp.linspace(0, 1, ny, dtype=self.dtype)[None, :], (nx, ny))
        coords = jnp.broadcast_to(jnp.stack([gx, gy]), (a.shape[0], 2, nx, ny))
        h = jnp.concatenate([a.astype(self.dtype), coords], axis=1)
        h = self._affine("lift", θ, h)
        for k, layer in enumerate(self.ops["layers"]):
            h = layer(θ) @ h + _bias(θ[f"skip{k}.bias"])
            if k < self.n_layers - 1:
                h = jax.nn.gelu(h, approximate=False)
        h = jax.nn.gelu(self._affine("proj1", θ, h), approximate=False)
        return self._affine("proj2", θ, h)

    def _affine(self, name: str, θ: Params, h: jax.Array) -> jax.Array:
        return self.ops[name](θ) @ h + _bias(θ[f"{name}.bias"])

    # -- distribution ------------------------------------------------------------------------
    def distribute(self, partition: tuple[int, ...], mesh: Mesh | None = None) -> "FNO":
        """The same network with every operator distributed, the input split as
        `partition` over `(batch, channel, x, y)`.

        The Fourier layers are alike, so they share one *steady* layout S: the lifting
        goes from the input layout to S (so a repartition moves the few input channels,
        not the `width` lifted ones), every Fourier layer from S to S, and the projection
        back to the input layout. S is the layout, among the input's own and the first
        layer's 4 cheapest exits from it, that minimises the planner's cost of the whole
        network.
        """
        entry_lift = distribute(self.ops["lift"], partition, mesh=mesh)
        mesh, spec = entry_lift.mesh, entry_lift.in_sharding.spec
        first = self.ops["layers"][0]
        shape = first.domain_shape
        entry = layout_of(spec, len(shape), mesh, "FNO.distribute")
        exits = make_plan(first, shape, entry, mesh.shape, lambda layout: True, "FNO.distribute", exits=4).exits
        candidates = [entry, *sorted(set(exits) - {entry}, key=lambda layout: (exits[layout], str(layout)))[:4]]

        def network(layout: Layout) -> dict[str, Any] | None:
            """Every operator but the later Fourier layers, distributed with `layout` as
            the layers' steady layout (None where one of them cannot be planned)."""
            steady = spec_of(layout)
            try:
                return {"lift": distribute(self.ops["lift"], spec, mesh=mesh, out_partition=steady),
                        "first": distribute(first, steady, mesh=mesh, out_partition=steady),
                        "proj1": distribute(self.ops["proj1"], steady, mesh=mesh, out_partition=steady),
                        "proj2": distribute(self.ops["proj2"], steady, mesh=mesh, out_partition=spec)}
            except ValueError:
                return None

        def cost(ops: dict[str, Any]):
            """The planner's cost of the whole network: the first layer's counts for all."""
            costs = [D.plan.route.cost for D in ops.values()]
            costs += [ops["first"].plan.route.cost] * (self.n_layers - 1)
            return tuple(map(sum, zip(*costs)))

        scored = [(cost(ops), k, ops) for k, layout in enumerate(candidates) if (ops := network(layout))]
        if not scored:
            raise ValueError(f"FNO.distribute: no layout lets every Fourier layer run from it on partition {partition}")
        _, k, ops = min(scored, key=lambda s: s[:2])
        steady = spec_of(candidates[k])
        ops["layers"] = [ops.pop("first"), *(distribute(op, steady, mesh=mesh, out_partition=steady)
                                             for op in self.ops["layers"][1:])]
        return FNO(self.batch, self.grid, in_channels=self.in_channels, out_channels=self.out_channels,
                   width=self.width, modes=self.modes, layers=self.n_layers, projection=self.projection,
                   dtype=self.dtype, operators=ops)

    @property
    def distributed(self) -> bool:
        return isinstance(self.ops["lift"], DistributedOperator)


def _bias(b: jax.Array) -> jax.Array:
    return b[:, None, None]


def _place(value: jax.Array, sharding) -> jax.Array:
    """`value` placed with `sharding`; as it is for a serial model (`sharding` None)."""
    return place(value, sharding) if sharding else value
