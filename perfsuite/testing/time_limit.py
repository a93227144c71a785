"""A wall-clock limit on one example of a ready test: an engine that never answers fails instead of hanging the run.

Hypothesis' own ``deadline`` measures an example only once it has returned,
and the ready tests turn it off (a model step on a CPU is slower than its
200 ms default), so the kit puts this limit in its place. The example runs
in a daemon thread that the test waits for with ``join(timeout)``: no signal,
so it works in any thread and under xdist. A thread cannot be stopped from
outside: on a timeout the call is abandoned, still running (and holding the
engine or runner it was given) until it returns or the process exits.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable

MAX_SECONDS_ENV = "PERFSUITE_MAX_SECONDS_PER_EXAMPLE"
DEFAULT_MAX_SECONDS_PER_EXAMPLE = 300.0


class NoAnswer(BaseException):
    """An example that did not return within its limit.

    A ``BaseException``, not an ``AssertionError``: Hypothesis catches
    ``Exception`` to shrink a failure, and shrinking a hang would wait the
    whole limit again for each smaller scenario while the abandoned call
    still holds the engine. This one ends the test at once, with the scenario
    as drawn; pytest reports it as a failure.
    """


def resolve_max_seconds(max_seconds: float | None) -> float:
    """``max_seconds`` if given, else ``$PERFSUITE_MAX_SECONDS_PER_EXAMPLE``, else 300; a ValueError if not > 0."""
    if max_seconds is None:
        raw = os.environ.get(MAX_SECONDS_ENV)
        if raw is None:
            return DEFAULT_MAX_SECONDS_PER_EXAMPLE
        try:
            max_seconds = float(raw)
        except ValueError:
            max_seconds = math.nan
        where = f"{MAX_SECONDS_ENV}={raw!r}"
    else:
        where = f"max_seconds_per_example={max_seconds!r}"
    if not 0 < max_seconds < math.inf:
        raise ValueError(
            f"{where} is not a number of seconds > 0; give the most one example may take, such as 600 "
            f"(default {DEFAULT_MAX_SECONDS_PER_EXAMPLE:g})"
        )
    return max_seconds


def call_within(max_seconds: float, call: Callable[[], None], what: str) -> None:
    """Run ``call`` in a daemon thread; re-raise what it raises, or ``NoAnswer`` (naming ``what``) past the limit.

    On a timeout the thread is abandoned, not stopped: it goes on running
    ``call`` in the background.
    """
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as error:  # re-raised in the caller's thread, whatever it was
            raised.append(error)

    thread = threading.Thread(target=target, name=f"perfsuite example: {what}", daemon=True)
    thread.start()
    thread.join(max_seconds)
    if thread.is_alive():
        raise NoAnswer(
            f"{what}: no answer in {max_seconds:g} s; the call is abandoned, still running in a daemon thread, "
            f"and the scenario was not shrunk (each smaller one would wait as long). If the engine is only slow, "
            f"raise the limit: max_seconds_per_example=... or {MAX_SECONDS_ENV}"
        )
    if raised:
        raise raised[0]
