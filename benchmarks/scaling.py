"""A scaling model from measured traffic: predicted training-step time and weak-scaling
efficiency of dfno's configuration (64x64x64x32 points per device, width 20, 4 Fourier
layers) from 1 to 512 devices, on a machine given by its parameters. A model, not a
measurement: nothing here runs on a GPU.

What is measured (by the dry runs of `benchmarks/will_it_fit.py`, from the compiled
training step, not from a formula): per device per step, the collectives by kind, the
bytes they send, and XLA's `cost_analysis()` of the step (floating-point operations
and bytes read and written). What is modelled:

- compute: memory-bound or compute-bound, whichever is slower: `max(flops / peak,
  bytes_accessed / hbm)`, per device. The counts are the one-device step's without
  remat (XLA's cost analysis counts a loop's body once, so the remat step's blocked
  projection is under-counted; remat's recomputation, about one more forward pass of
  each Fourier layer, is left out too), each scaled by how much the P-device step's own
  count exceeds the one-device step's of the same kind (with or without remat): the
  work that distribution adds (padding, the plan's moves), measured, not assumed away.
  The longer FFTs of larger grids (weak scaling), a log factor, are left out;
- communication: each collective costs a start-up `latency`, and the bytes a device
  sends cross its link at `link` bytes/s (NVLink inside a node, the network card
  beyond); no overlap with compute.

Weak-scaling efficiency at P devices is the one-device step time over the P-device
step time. `python benchmarks/scaling.py [--results benchmarks/will_it_fit.json]`
prints the table the README quotes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    name: str
    peak: float  # float32 flop/s per device
    hbm: float  # bytes/s a device streams from its memory
    node: int  # devices per node, joined by `nvlink`
    nvlink: float  # bytes/s a device sends inside its node
    link: float  # bytes/s a device sends to other nodes
    latency: float  # s per collective


H100 = Machine("H100 SXM, 8 per node, 400 Gb/s InfiniBand per GPU", peak=67e12, hbm=3.35e12, node=8,
               nvlink=450e9, link=50e9, latency=20e-6)
A100 = Machine("A100 40 GB, 4 per node, 200 Gb/s Slingshot per GPU (Perlmutter, where dfno ran)", peak=19.5e12,
               hbm=1.55e12, node=4, nvlink=300e9, link=25e9, latency=20e-6)


def step_time(report: dict, one_device: dict, m: Machine, same_kind: dict | None = None) -> dict:
    """Predicted compute, communication and step time (s) of one dry-run report: the
    compute of `one_device`'s report, each count scaled by `report`'s over that of
    `same_kind` (the one-device report of `report`'s kind; None: `one_device`)."""
    same_kind = one_device if same_kind is None else same_kind
    flops, moved = (one_device[k] * report[k] / same_kind[k] for k in ("flops", "bytes_accessed"))
    compute = max(flops / m.peak, moved / m.hbm)
    link = m.nvlink if report["devices"] <= m.node else m.link
    count = sum(report["collectives"].values())
    comm = count * m.latency + report["hlo_sent_bytes"] / link if report["devices"] > 1 else 0.0
    return {"compute": compute, "comm": comm, "step": compute + comm}


def table(results: dict, kind: str, m: Machine) -> list[str]:
    """Markdown rows: devices, partition, compute, communication, step, efficiency."""
    rows = ["| devices | partition | compute | communication | step | efficiency |", "|---|---|---|---|---|---|"]
    one = results["1 dfno"]
    base = step_time(one, one, m)["step"]
    for devices in (1, 8, 64, 256, 512):
        report = results.get(f"{devices} {kind}") or results.get(f"{devices} dfno remat")
        if report is None or "error" in report:
            continue
        t = step_time(report, one, m, results["1 dfno remat"] if "remat" in kind else one)
        eff = f"{base / t['step']:.0%}"
        rows.append(f"| {devices} | {tuple(report['partition'])} | {t['compute'] * 1e3:.0f} ms | "
                    f"{t['comm'] * 1e3:.1f} ms | {t['step'] * 1e3:.0f} ms | {eff} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "will_it_fit.json"))
    args = p.parse_args()
    results = json.loads(Path(args.results).read_text())
    for m in (H100, A100):
        print(f"\n{m.name}: {m.peak / 1e12:.1f} TFLOP/s float32, HBM {m.hbm / 1e12:.2f} TB/s, "
              f"{m.nvlink / 1e9:.0f} GB/s in a node of {m.node}, {m.link / 1e9:.0f} GB/s beyond, "
              f"{m.latency * 1e6:.0f} µs per collective")
        for kind in ("dfno remat", "choice remat"):
            print(f"\n{kind.replace('dfno', 'dfno partition').replace('choice', 'parop choice')}:")
            print("\n".join(table(results, kind, m)))


if __name__ == "__main__":
    main()
