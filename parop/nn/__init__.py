"""Neural networks built from parop operators: a model-parallel Fourier neural operator
and what training it needs."""

from .dryrun import dry_run
from .fno import FNO, channel_mixing, spectral_convolution
from .train import UnitGaussianNormalizer, as_complex, as_real, evaluate, fit, relative_l2

__all__ = [
    "FNO", "UnitGaussianNormalizer", "as_complex", "as_real", "channel_mixing", "dry_run", "evaluate", "fit",
    "relative_l2", "spectral_convolution",
]
