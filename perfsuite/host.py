"""The machine as people read it: its CPU's name, and byte counts in binary units.

The standard library only: the engine (its kernel choices are kept per CPU),
the measurement (a run's environment) and the report use it.
"""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says of it, else ``"unknown"``."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_features() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``: ``flags`` on x86, ``Features`` on ARM), else its
    architecture: what a compiler's ``-march=native`` builds for."""
    return _cpuinfo("flags", "Features") or platform.machine()


def _cpuinfo(*fields: str) -> str | None:
    """The first CPU's value of the first of ``fields`` that ``/proc/cpuinfo`` lists; None where it lists none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in fields:
                return value.strip()
    return None


def format_bytes(num_bytes: float | None) -> str:
    """``8192`` -> ``"8.00 KiB"``: three significant figures in the largest binary unit below the value; ``-`` for
    None (not measured)."""
    if num_bytes is None:
        return "-"
    value, unit = float(num_bytes), "B"
    for larger in _BINARY_UNITS:
        if value < 1024:
            break
        value, unit = value / 1024, larger
    if unit == "B":
        return f"{int(value)} B"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {unit}"
