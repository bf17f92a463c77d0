"""Writes Darcy flow samples to a zarr store (needs `pip install parop[data]`).

    python -m parop.datasets darcy PATH --samples N [--resolution S] [--dim D] [--seed K]
        [--dtype float32|float64] [--part I/COUNT]

Each of `COUNT` processes writes its part `I` of the samples (`write_darcy`'s `part`);
under `srun`, `--part` defaults to `$SLURM_PROCID/$SLURM_NTASKS`, so every task of
`srun python -m parop.datasets darcy ...` writes its share; elsewhere to `0/1`.
"""

from __future__ import annotations

import argparse
import os

from . import write_darcy


def _part(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    try:
        return int(index), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part must be INDEX/COUNT, e.g. 0/4, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m parop.datasets", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    darcy = commands.add_parser("darcy", help="Darcy flow samples, arrays a and u of (samples, 1, *grid)")
    darcy.add_argument("path", help="the zarr store (a directory)")
    darcy.add_argument("--samples", type=int, required=True)
    darcy.add_argument("--resolution", type=int, default=32)
    darcy.add_argument("--dim", type=int, default=2)
    darcy.add_argument("--seed", type=int, default=0)
    darcy.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    slurm = ("SLURM_PROCID", "SLURM_NTASKS")
    default = "/".join(os.environ[v] for v in slurm) if all(v in os.environ for v in slurm) else "0/1"
    darcy.add_argument("--part", type=_part, default=_part(default),
                       help="INDEX/COUNT: write the INDEX-th of COUNT parts "
                            "(default: $SLURM_PROCID/$SLURM_NTASKS or 0/1)")
    args = parser.parse_args(argv)
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)
    try:
        write_darcy(args.path, args.samples, args.resolution, dim=args.dim, seed=args.seed, dtype=args.dtype,
                    part=args.part)
    except (ValueError, TypeError) as error:  # bad sizes, a store holding another set: the message, no traceback
        parser.exit(2, f"python -m parop.datasets darcy: {error}\n")
    print(f"{args.path}: samples {args.samples * args.part[0] // args.part[1]} to "
          f"{args.samples * (args.part[0] + 1) // args.part[1]} of {args.samples} written", flush=True)


if __name__ == "__main__":
    main()
