"""Value checks shared by the workload's parts; each failure is a ValueError naming the field."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (``True`` is 1 to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float, not a bool."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value``, once it is an integer (not a bool) of at least ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_positive(value: object, name: str) -> None:
    if not is_number(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_bounds(low: object, high: object, name: str, low_alias: str = "low", high_alias: str = "high") -> None:
    if check_int(low, f"{name}.low") > check_int(high, f"{name}.high"):
        raise ValueError(f"{name} needs low <= high, got {low_alias}={low}, {high_alias}={high}")


def reject_unknown_keys(keys: Iterable[str], known: Iterable[str], what: str, where: str = "") -> None:
    """Raise ``unknown <what> 'arival' (did you mean 'arrivals'?); known keys: ...`` for the first stranger.

    ``where`` (a file, a line of it) leads the message as ``<where>: unknown ...``.
    """
    known = sorted(known)
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            prefix = f"{where}: " if where else ""
            raise ValueError(f"{prefix}unknown {what} {key!r}{hint}; known keys: {', '.join(known)}")
