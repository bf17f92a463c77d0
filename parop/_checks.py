"""The rule for the integer arguments every part of parop takes (sizes, counts, steps,
seeds, batch shapes): a Python or NumPy integer, never a bool, kept as a Python `int`."""

from __future__ import annotations

import numbers

import numpy as np


def is_int(value) -> bool:
    """Whether `value` is an integer: a Python or NumPy one, not a bool.

    >>> import numpy as np
    >>> is_int(np.int64(3)), is_int(True), is_int(3.0)
    (True, False, False)"""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def divisors(n: int) -> list[int]:
    """The counts that split `n` evenly, in order (what a split-size error offers).

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]"""
    return [d for d in range(1, n + 1) if n % d == 0]


def is_positive_int(value) -> bool:
    """Whether `value` is an integer >= 1 (`is_int`)."""
    return is_int(value) and value >= 1


def is_axes(value) -> bool:
    """Whether `value` lists one entry per axis: a tuple, a list or a 1-D NumPy array (a
    grid, modes, a partition)."""
    return isinstance(value, (tuple, list)) or isinstance(value, np.ndarray) and value.ndim == 1


def positive_int(value, what: str, where: str) -> int:
    """`value` as an int >= 1, or a `ValueError` that names the operator or function
    `where` and the argument `what`.

    >>> import numpy as np
    >>> positive_int(np.int64(3), "n", "DFT")
    3"""
    if not is_positive_int(value):
        raise ValueError(f"{where}: {what} must be a positive int, got {value!r}")
    return int(value)


def int_at_least(value, least: int, what: str, where: str, kind: str = "an int") -> int:
    """`value` as an int >= `least`, or a `TypeError` (not an integer: `kind` says what
    is wanted) or `ValueError` (below `least`) naming `where` and the argument `what`.

    >>> int_at_least(0, 0, "step", "save")
    0"""
    if not is_int(value):
        raise TypeError(f"{where}: {what} must be {kind}, got {what}={value!r} ({type(value).__name__})")
    if value < least:
        raise ValueError(f"{where}: {what} must be at least {least}, got {what}={value}")
    return int(value)


def batch_sizes(batch_shape, where: str) -> tuple[int, ...]:
    """`batch_shape` (the sizes of an input's trailing batch axes) as a tuple of ints, or
    a `TypeError` (not a sequence of ints) or `ValueError` (a size below 1) that starts
    with `where`.

    >>> import numpy as np
    >>> batch_sizes([np.int64(4), 2], "plan_for"), batch_sizes(np.array([3]), "plan_for")
    ((4, 2), (3,))"""
    if not is_axes(batch_shape) or not all(map(is_int, batch_shape)):
        raise TypeError(f"{where} takes a tuple of batch sizes (ints), got {batch_shape!r}")
    if any(n < 1 for n in batch_shape):
        raise ValueError(f"{where}: batch sizes must be positive (an empty batch holds nothing to plan, apply or "
                         f"test), got {tuple(batch_shape)}")
    return tuple(int(n) for n in batch_shape)
