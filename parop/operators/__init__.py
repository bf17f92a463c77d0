"""The leaf operators, one per module."""

from .base import Adjoint, Leaf, Role
from .convolution import Convolution, Correlation
from .dft import DFT, InverseDFT
from .diagonal import Diagonal
from .identity import Identity
from .matrix import Matrix
from .permode import PerModeMatrix
from .reduce import Reduce
from .restriction import Restriction
from .stencil import Stencil

__all__ = [
    "Adjoint", "Convolution", "Correlation", "DFT", "Diagonal", "Identity", "InverseDFT",
    "Leaf", "Matrix", "PerModeMatrix", "Reduce", "Restriction", "Role", "Stencil",
]
