"""Neural networks built from parop operators: a model-parallel Fourier neural operator
and what training it needs."""

from .fno import FNO, channel_mixing, spectral_convolution
from .train import UnitGaussianNormalizer, as_complex, as_real, evaluate, fit, relative_l2

__all__ = [
    "FNO", "UnitGaussianNormalizer", "as_complex", "as_real", "channel_mixing", "dry_run", "evaluate", "fit",
    "relative_l2", "spectral_convolution",
]


def __getattr__(name: str):
    # `dry_run` is imported when first asked for, so that `python -m parop.nn.dryrun`
    # runs its module once (runpy warns where the package has imported it already)
    if name == "dry_run":
        from .dryrun import dry_run

        return dry_run
    raise AttributeError(f"module 'parop.nn' has no attribute {name!r}")
