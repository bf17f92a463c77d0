"""Data sets generated in code, for examples, tests and benchmarks, and data sets in a
chunked zarr store (`open_store`, `write_darcy`; the `data` extra)."""

from .darcy import darcy_blocks, darcy_flow

__all__ = ["CountingStore", "StoreDataset", "darcy_blocks", "darcy_flow", "open_store", "write_darcy"]

_STORE = ("CountingStore", "StoreDataset", "open_store", "write_darcy")


def __getattr__(name: str):
    # the store's names import zarr (an extra) only when used
    if name in _STORE:
        try:
            from . import store
        except ImportError as error:
            raise ImportError(f"parop.datasets.{name} needs zarr: pip install 'parop[data]'") from error
        return getattr(store, name)
    raise AttributeError(f"module 'parop.datasets' has no attribute {name!r}")
