"""Collectives and the bytes they move, read from compiled HLO text: the library's
`parop.distributed.hlo` (the dry run reads its collectives there too)."""

from parop.distributed.hlo import KINDS, collectives, shape_bytes

__all__ = ["KINDS", "collectives", "shape_bytes"]
