"""Argument checks for graphalloc's Python functions, before anything reaches the C ABI.

ctypes converts what it is given without a word: an int of 2**64 wraps to 0 (``malloc(2**64)`` "succeeded"
with the null pointer), 2**64 + 4096 to 4096, -1 to 2**64 - 1 (an out-of-memory error), 1.5 to 1. Every
public function that takes a size, a count, a device, a pool id or an address checks it here first and
raises TypeError (not an integer) or ValueError (out of range) naming the function and the argument.
Integers are what ``operator.index`` accepts (int, numpy integers), but not bool.
"""
from __future__ import annotations

import numbers
import operator

U64_END = 1 << 64  # sizes, addresses, streams and pool ids are unsigned 64-bit
INT_END = 1 << 31  # devices are C ints


def integer(function: str, name: str, value, low: int = 0, end: int = U64_END) -> int:
    """`value` as an int in [low, end), or TypeError / ValueError naming `function` and `name`."""
    if isinstance(value, bool):
        raise TypeError(f"graphalloc.{function}: {name} must be an int, not bool ({value!r})")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"graphalloc.{function}: {name} must be an int, not {type(value).__name__} "
                        f"({value!r})") from None
    if not low <= n < end:
        raise ValueError(f"graphalloc.{function}: {name} must be at least {low} and {_bound(end)}, not {n}")
    return n


def size(function: str, name: str, value) -> int:
    """A byte count: 0 <= value < 2**64."""
    return integer(function, name, value)


def device(function: str, value) -> int:
    """A CUDA device ordinal: 0 <= device < 2**31."""
    return integer(function, "device", value, 0, INT_END)


def fraction(function: str, name: str, value) -> float:
    """A share of the device, 0 <= value <= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"graphalloc.{function}: {name} must be a number, not {type(value).__name__} "
                        f"({value!r})")
    x = float(value)
    if not 0.0 <= x <= 1.0:  # NaN fails too
        raise ValueError(f"graphalloc.{function}: {name} must be between 0 and 1, not {value!r}")
    return x


def _bound(end: int) -> str:
    """ "below 2**64", "at most 2**28", "at most 9" for the exclusive bound `end`."""
    if end & (end - 1) == 0:
        return f"below 2**{end.bit_length() - 1}"
    last = end - 1
    if last & (last - 1) == 0:
        return f"at most 2**{last.bit_length() - 1}"
    return f"at most {last}"
