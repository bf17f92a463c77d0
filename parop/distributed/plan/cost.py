"""The machine model the planner minimises: what a collective costs.

A plan's cost is an estimate of its time, counted in bytes: for each collective, the
bytes one device sends plus `latency_bytes`, what the collective's start-up is worth
in transferred bytes (latency x bandwidth). `training=True` (the default) costs each
action forward *and* backward (the transpose JAX runs for `jax.grad`), plus the
all-reduce of every weight gradient that devices holding the same weight compute on
different data; `training=False` costs the forward pass only (inference).

Bytes sent per device, for a local operand of `S` bytes over a group of `g` devices:

| collective | sends |
|---|---|
| `all_to_all` | `S (g-1)/g` |
| `psum` (all-reduce) | `2 S (g-1)/g` |
| `psum_scatter` (reduce-scatter) | `S (g-1)/g` |
| `all_gather` (of a local piece `S`) | `S (g-1)` |
| `ppermute` (a halo exchange one way, or blocks dealt anew) | `S` |
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from ...display import fmt_bytes

ALL_TO_ALL, PSUM, PSUM_SCATTER, ALL_GATHER, PPERMUTE = "all_to_all", "psum", "psum_scatter", "all_gather", "ppermute"
KINDS = (ALL_TO_ALL, PSUM, PSUM_SCATTER, ALL_GATHER, PPERMUTE)


def sent(kind: str, operand: float, group: int) -> float:
    """Bytes one device sends in a collective `kind` on a local operand of `operand`
    bytes over `group` devices."""
    if kind == ALL_TO_ALL or kind == PSUM_SCATTER:
        return operand * (group - 1) / group
    if kind == PSUM:
        return 2 * operand * (group - 1) / group
    if kind == ALL_GATHER:
        return operand * (group - 1)
    return operand


@dataclass(frozen=True)
class Collective:
    """One collective of a plan: its kind, the mesh axes it runs over, and the bytes one
    device sends."""

    kind: str
    axes: tuple[str, ...]
    bytes: float


def traffic_text(fwd, bwd, own: str | None = None) -> str:
    """The collectives of an action, forward and backward, as a plan shows them (those
    of its own kind, an `all_to_all`'s, by their bytes alone)."""
    def one(c):
        return fmt_bytes(c.bytes) if c.kind == own else f"{c.kind} {'+'.join(c.axes)} {fmt_bytes(c.bytes)}"

    parts = [f"{label} " + " + ".join(one(c) for c in cs) for label, cs in (("fwd", fwd), ("bwd", bwd)) if cs]
    return ("   " + ", ".join(parts)) if parts else ""


@dataclass(frozen=True)
class CostModel:
    """The machine model of `po.distribute(..., cost=...)`.

    - `latency_bytes`: a collective's start-up, in bytes of transfer (latency times
      bandwidth). The default, 1 MiB, models GPU interconnects (~20 µs at ~50 GB/s);
      on forced CPU host devices collectives are nearly free to start and `0` fits
      better. `parop.distributed.calibrate()` measures it on the current devices.
    - `training`: cost forward + backward (what a training step runs); `False` plans
      for inference (forward only).

    ```python
    >>> F = po.kron(po.DFT(16), po.DFT(16), po.DFT(16))
    >>> D = po.distribute(F, (2, 2, 2), cost=po.CostModel(latency_bytes=0, training=False))
    >>> D.plan.cost            # (time in bytes, bytes sent per device, collectives)
    (12288.0, 12288.0, 6)
    ```
    """

    latency_bytes: float = float(1 << 20)
    training: bool = True
    measured: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if (not isinstance(self.latency_bytes, numbers.Real) or isinstance(self.latency_bytes, bool)
                or not math.isfinite(self.latency_bytes) or self.latency_bytes < 0):
            raise ValueError(f"CostModel: latency_bytes must be a finite number >= 0, got {self.latency_bytes!r}")
        if not isinstance(self.training, (bool, np.bool_)):
            raise ValueError(f"CostModel: training must be True or False, got {self.training!r}")
        # Python values, whatever NumPy scalars were given: equal models give equal plans and JSON
        object.__setattr__(self, "latency_bytes", float(self.latency_bytes))
        object.__setattr__(self, "training", bool(self.training))

    def price(self, forward, backward) -> tuple[float, float, int]:
        """`(time in bytes, bytes sent, collectives)` of a program or an action running
        the collectives `forward` (and, when training, `backward`)."""
        paid = (*forward, *backward) if self.training else tuple(forward)
        nbytes = sum(c.bytes for c in paid)
        return (nbytes + self.latency_bytes * len(paid), nbytes, len(paid))
