"""`python -m parop`: a demo that checks itself. A serial real 3-D DFT (the README's
first example) against NumPy, then a distributed 3-D FFT on 8 devices: the plan, the
check against NumPy, and its time next to `jit(jnp.fft.fftn)` on the same sharded input.
The 8 devices are the default backend's where it has as many, else the CPU's (forced to
8 here): on a machine with one GPU the distributed part runs on the CPU."""

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # jax reads XLA_FLAGS when its backend starts (first use), not at import
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np

import parop as po
from parop.distributed.calibrate import median_time
from parop.distributed.layout import default_mesh


DEVICES = 8  # the distributed part's


def demo_devices() -> list:
    """The devices the distributed FFT runs on: the default backend's first `DEVICES` where
    it has as many, else the CPU's (`XLA_FLAGS` forces `DEVICES` of them, above)."""
    devices = jax.devices()
    return (devices if len(devices) >= DEVICES else jax.devices("cpu"))[:DEVICES]


def main() -> None:
    rng = np.random.default_rng(0)
    devices = demo_devices()
    print(f"parop on {len(devices)} {devices[0].platform} devices, jax {jax.__version__}\n")

    F = po.kron(po.DFT(30, jnp.complex64), po.DFT(20, jnp.complex64), po.DFT(10, jnp.float32))
    x = rng.standard_normal((30, 20, 10)).astype(np.float32)
    err = np.abs(np.asarray(F @ x) - np.fft.rfftn(x)).max() / np.abs(np.fft.rfftn(x)).max()
    print(f"serial   {F!r}: {x.shape} float32 -> {F.range_shape} complex64, "
          f"relative error vs np.fft.rfftn {err:.1e}, dot test {po.testing.dot_test(F):.1e}")
    assert err < 1e-5

    n = 64
    F3 = po.kron(po.DFT(n), po.DFT(n), po.DFT(n))
    x = (rng.standard_normal((n, n, n)) + 1j * rng.standard_normal((n, n, n))).astype(np.complex64)
    want = np.fft.fftn(x)
    for partition in [(8, 1, 1), (2, 2, 2)]:
        mesh, _ = default_mesh(partition, "python -m parop", devices=devices)  # po.distribute's, on these devices
        D = po.distribute(F3, partition, mesh=mesh)
        xs = jax.device_put(x, D.in_sharding)
        y = D @ xs
        err = np.abs(np.asarray(y) - want).max() / np.abs(want).max()
        assert err < 1e-5, err
        print(f"\ndistributed {n}³ FFT, partition {partition}: relative error vs np.fft.fftn {err:.1e}")
        print(D.plan)
        t_parop = median_time(lambda v: D @ v, xs)
        t_xla = median_time(jax.jit(jnp.fft.fftn), xs)
        print(f"time: parop {t_parop * 1e3:.1f} ms, jit(jnp.fft.fftn) on the same sharded input "
              f"{t_xla * 1e3:.1f} ms ({t_xla / t_parop:.1f}x)")
    print("\nall checks passed")


if __name__ == "__main__":
    main()
