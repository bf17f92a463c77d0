"""Measuring the machine model: what a collective's start-up is worth on these devices."""

from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._checks import positive_int
from .plan import CostModel


def median_time(f, x, repeats: int = 10) -> float:
    """The median wall time of `f(x)` over `repeats` awaited calls, after one to warm up."""
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(x))  # awaited: un-awaited collectives can pile up on XLA:CPU
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def calibrate(devices: Sequence[jax.Device] | None = None, *, small: int = 1 << 12, large: int = 1 << 24,
              repeats: int = 20, training: bool = True) -> CostModel:
    """A `CostModel` measured on `devices` (default: all of them): one `all_to_all` over
    them timed with a `small` and a `large` payload per device (bytes) gives its start-up
    `t0` and its time per byte sent; `latency_bytes = t0 · bandwidth`. A local FFT of
    the large payload is timed too, for comparison (`measured["fft_bytes_per_s"]`: how
    fast the devices transform data they hold, against `measured["bandwidth_bytes_per_s"]`
    at which they exchange it).

    ```python
    >>> cost = po.calibrate(large=1 << 16, repeats=3)    # quick; the defaults take a few seconds
    >>> sorted(cost.measured)
    ['bandwidth_bytes_per_s', 'devices', 'fft_bytes_per_s', 'latency_s', 'platform']
    >>> F = po.kron(po.DFT(16), po.DFT(16), po.DFT(16))
    >>> D = po.distribute(F, (2, 2, 2), cost=cost)
    ```
    """
    small, large, repeats = (positive_int(value, name, "calibrate")
                             for name, value in (("small", small), ("large", large), ("repeats", repeats)))
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if n < 2:
        raise ValueError(f"calibrate: needs at least 2 devices to time a collective, got {n}")
    mesh = Mesh(np.array(devices), ("calibrate",))
    spec = PartitionSpec("calibrate")
    exchange = jax.jit(jax.shard_map(lambda x: jax.lax.all_to_all(x, "calibrate", 1, 0, tiled=True),
                                     mesh=mesh, in_specs=spec, out_specs=spec))
    sizes = [max(n, payload // 8 // n * n) for payload in (small, large)]  # complex64 elements per device, divisible by n
    if sizes[0] >= sizes[1]:
        raise ValueError(
            f"calibrate: the payloads must differ, small < large: small={small} and large={large} bytes give "
            f"{sizes[0]} and {sizes[1]} complex64 elements per device (rounded down to a multiple of the {n} devices, at least {n}); use a "
            f"large of at least {(sizes[0] + n) * 8} bytes")
    timings = {}
    with jax.set_mesh(mesh):  # its own meshes, whatever mesh a jax.set_mesh around the call set
        for columns in sizes:
            x = jax.device_put(jnp.ones((n, columns), jnp.complex64), NamedSharding(mesh, spec))
            sent = columns * 8 * (n - 1) / n
            timings[sent] = median_time(exchange, x, repeats)
    (small_sent, t_small), (large_sent, t_large) = sorted(timings.items())
    per_byte = max((t_large - t_small) / (large_sent - small_sent), 1e-15)
    start_up = max(t_small - per_byte * small_sent, 0.0)
    with jax.set_mesh(Mesh(np.array(devices[:1]), ("calibrate",))):  # one device's FFT
        local = jax.device_put(jnp.ones((large // 8,), jnp.complex64), devices[0])
        fft_time = median_time(jax.jit(jnp.fft.fft), local, repeats)
    measured = {
        "devices": n, "platform": devices[0].platform, "latency_s": start_up,
        "bandwidth_bytes_per_s": 1 / per_byte, "fft_bytes_per_s": large / fft_time,
    }
    return CostModel(latency_bytes=float(start_up / per_byte), training=training, measured=measured)
