"""The rule for the integer arguments every part of parop takes (sizes, counts, steps,
seeds): a Python or NumPy integer, never a bool, kept as a Python `int`."""

from __future__ import annotations

import numbers


def is_int(value) -> bool:
    """Whether `value` is an integer: a Python or NumPy one, not a bool.

    >>> import numpy as np
    >>> is_int(np.int64(3)), is_int(True), is_int(3.0)
    (True, False, False)"""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_positive_int(value) -> bool:
    """Whether `value` is an integer >= 1 (`is_int`)."""
    return is_int(value) and value >= 1


def positive_int(value, what: str, where: str) -> int:
    """`value` as an int >= 1, or a `ValueError` that names the operator or function
    `where` and the argument `what`.

    >>> import numpy as np
    >>> positive_int(np.int64(3), "n", "DFT")
    3"""
    if not is_positive_int(value):
        raise ValueError(f"{where}: {what} must be a positive int, got {value!r}")
    return int(value)
