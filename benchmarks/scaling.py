"""A scaling model for distributed FFTs and FNO layers: bytes per `all_to_all` against
local FFT work, with the machine as parameters. `python benchmarks/scaling.py` prints
the predictions the README quotes.

Model (per device, one application):
- a local pass over an axis (FFT, restriction) is memory-bound: it reads and writes the
  local block once, `2 * bytes_local / hbm`;
- an `all_to_all` over a group of `g` devices sends `(g-1)/g` of the local block:
  `(g - 1) * latency + (g-1)/g * bytes_local / link`.
The parallel efficiency is the ideal time (one device's work divided by P) over the
modelled time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    name: str
    hbm: float  # bytes/s a device streams from its memory
    link: float  # bytes/s a device sends to others (injection bandwidth)
    latency: float  # s per peer message


H100_CLUSTER = Machine("H100, 400 Gb/s InfiniBand per GPU", hbm=2.5e12, link=50e9, latency=5e-6)


def passes(bytes_local: float, n: int, m: Machine) -> float:
    return n * 2 * bytes_local / m.hbm


def all_to_all(bytes_local: float, g: int, m: Machine) -> float:
    return (g - 1) * m.latency + (g - 1) / g * bytes_local / m.link


def fft3d(n: int, p1: int, p2: int, m: Machine, itemsize: int = 8) -> dict:
    """A complex n³ FFT on a p1 x p2 pencil grid, ending in the planner's "auto" layout
    (2 all_to_alls: one within each group)."""
    p = p1 * p2
    local = n**3 * itemsize / p
    compute = passes(local, 3, m)
    comm = all_to_all(local, p1, m) + all_to_all(local, p2, m)
    ideal = passes(n**3 * itemsize, 3, m) / p
    return {"local MiB": local / 2**20, "compute µs": compute * 1e6, "comm µs": comm * 1e6,
            "efficiency": ideal / (compute + comm)}


def fno_layer(grid: tuple[int, ...], width: int, modes: tuple[int, ...], p: int, m: Machine,
              itemsize: int = 4) -> dict:
    """One spectral layer of a 3-D + time FNO split over `p` devices along its first
    spatial axis, as parop plans it: transform and restrict the local axes, move the
    (restricted, complex) data once so the split axis is whole, transform, restrict,
    mix, and back (2 all_to_alls of restricted data)."""
    points = math.prod(grid)
    local = width * points * itemsize / p
    # forward: real FFT + restriction over the local axes, shrinking as modes are kept
    shrink = math.prod(k / n for k, n in zip(modes[1:], grid[1:]))
    compute = 2 * (passes(local, len(grid) - 1, m) + passes(local * shrink * 2, 2, m))
    moved = local * shrink * 2  # complex, restricted on all but the split axis
    comm = 2 * all_to_all(moved, p, m)
    ideal = 2 * (passes(width * points * itemsize, len(grid) - 1, m)
                 + passes(width * points * itemsize * shrink * 2, 2, m)) / p
    return {"local MiB": local / 2**20, "moved MiB": moved / 2**20, "compute µs": compute * 1e6,
            "comm µs": comm * 1e6, "efficiency": ideal / (compute + comm)}


def main() -> None:
    m = H100_CLUSTER
    print(f"machine: {m.name}: HBM {m.hbm / 1e12:.1f} TB/s, link {m.link / 1e9:.0f} GB/s, "
          f"latency {m.latency * 1e6:.0f} µs per peer\n")
    print("3-D complex FFT, pencil decomposition, 2 all_to_alls")
    for n, p1, p2 in [(512, 16, 32), (1024, 16, 32), (2048, 16, 32), (512, 1, 8)]:
        r = fft3d(n, p1, p2, m)
        print(f"  {n}³ on {p1 * p2:>3} ({p1}x{p2}): " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()))
    print("\nFNO spectral layer (dfno size: 256³ x 64 time steps, width 20, modes 24³ x 8), split over x")
    for p in (32, 64, 128, 256):
        r = fno_layer((256, 256, 256, 64), 20, (24, 24, 24, 8), p, m)
        print(f"  on {p:>3}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()))


if __name__ == "__main__":
    main()
