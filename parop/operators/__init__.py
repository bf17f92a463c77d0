"""The leaf operators, one per module."""

from .base import Adjoint, Leaf, Role
from .dft import DFT, InverseDFT
from .diagonal import Diagonal
from .identity import Identity
from .matrix import Matrix
from .permode import PerModeMatrix
from .reduce import Reduce
from .restriction import Restriction

__all__ = [
    "Adjoint", "DFT", "Diagonal", "Identity", "InverseDFT", "Leaf", "Matrix",
    "PerModeMatrix", "Reduce", "Restriction", "Role",
]
