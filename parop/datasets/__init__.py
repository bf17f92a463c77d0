"""Data sets generated in code, for examples, tests and benchmarks."""

from .darcy import darcy_flow

__all__ = ["darcy_flow"]
