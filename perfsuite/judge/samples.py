"""Which stored measurements a comparison can use: one rule for baselines, results.json and ``perfsuite compare``.

``baselines.read_baseline`` and ``results.read_results`` (which ``perfsuite
compare`` and ``perfsuite report`` read through) check every sample list and
counter with ``measurement_problem`` before typing a file, and name the file
and the fix around what it says; ``BaselineStore.save`` refuses what they
would refuse.

A sample list (``samples``: one value per repeat; ``request_samples``: one
per request) is a non-empty list of finite numbers: ints or floats, never a
bool, a string or null. No sample is negative: perfsuite stores durations,
rates, shares and bytes. Whether 0 is a measurement depends on the metric
(``catalogue.zero_is_measured``):

- 0 is refused for throughput (a repeat that completed no request measured
  nothing, and a ratio to it is unbounded), for a capacity under an SLO (the
  search fails below its floor rather than find 0) and for the machine probe
  (seconds of real work, and the divisor when normalising);
- 0 is accepted for goodput (no request met the SLO), for latencies (tokens
  that one step produces share a timestamp, so an ITL, or the TPOT of an
  output a server streamed in one chunk, is 0, as is the queueing delay of a
  request scheduled on arrival), for the machine's busy share and for a
  device's memory peak, and for a metric this perfsuite does not know.

A counter is an integer (not a bool) and never negative.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from perfsuite.judge.catalogue import zero_is_measured

BASELINE_SAMPLE_FIELDS = ("samples", "request_samples")


def measurement_problem(data: Mapping[str, Any], sample_fields: Iterable[str] = BASELINE_SAMPLE_FIELDS) -> str | None:
    """The first sample list or counter in ``data`` (a baseline, or one test of results.json) that a comparison
    cannot use, described with its field and value; else None. Missing fields are left to the caller's typing."""
    for field_name in sample_fields:
        problem = samples_problem(field_name, data.get(field_name, {}))
        if problem is not None:
            return problem
    return counters_problem(data.get("counters", {}))


def samples_problem(field_name: str, samples: Any) -> str | None:
    if not isinstance(samples, dict):
        return f"{field_name} is {reprlib.repr(samples)}, not an object of metric -> list of numbers"
    for metric, values in samples.items():
        where = f"{field_name}[{metric!r}]"
        if not isinstance(values, (list, tuple)):
            return f"{where} is {reprlib.repr(values)}, not a list of numbers"
        if not values:
            return f"{where} is an empty list"
        for value in values:
            problem = sample_problem(metric, value)
            if problem is not None:
                return f"{where} holds {reprlib.repr(value)}, {problem}"
    return None


def sample_problem(metric: str, value: Any) -> str | None:
    """Why ``value`` cannot be a sample of ``metric`` (the module docstring's rule), as a clause; else None."""
    # bool is an int to Python, but true/false in a sample list is a corrupt file, not a number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "which is not a number"
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        number = math.inf
    if not math.isfinite(number):
        return "which is not a finite number"
    if number < 0:
        return f"but {metric} cannot be negative"
    if number == 0 and not zero_is_measured(metric):
        return f"but {metric} must be above 0"
    return None


def counters_problem(counters: Any) -> str | None:
    if not isinstance(counters, dict):
        return f"counters is {reprlib.repr(counters)}, not an object of counter -> integer"
    for name, value in counters.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"counters[{name!r}] is {reprlib.repr(value)}, which is not an integer >= 0"
    return None
