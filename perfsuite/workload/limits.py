"""How big and how long a workload may be: checked from its parameters, before prompts are built or a model loads.

A workload's size is arithmetic on its parameters (requests, prompt tokens,
the longest request), so a workload that cannot run is refused in one line
naming the number, instead of after minutes of building prompts or loading a
model. The limits:

- ``MAX_NUM_REQUESTS`` requests in one workload;
- ``MAX_PROMPT_TOKENS`` prompt tokens over all its requests (they are held in
  memory, a Python int reference each);
- every request arrives within ``MAX_ARRIVAL_SECONDS`` of the first (a run
  waits for its last arrival); a gap longer than ``LONG_GAP_SECONDS`` is
  allowed but warned of, as the engine idles through it;
- the longest request (prompt and output) fits the model's context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_NUM_REQUESTS = 100_000
MAX_PROMPT_TOKENS = 250_000_000  # about 2 GB of token ids
MAX_ARRIVAL_SECONDS = 3600.0
LONG_GAP_SECONDS = 60.0


def check_num_requests(count: int, what: str, fix: str) -> None:
    """``what`` (``shared_prefix groups x prompts = 8 x 8``) is ``count`` requests; refuse above the maximum."""
    if count > MAX_NUM_REQUESTS:
        raise ValueError(f"{what} = {count} requests, more than a workload may have ({MAX_NUM_REQUESTS}); {fix}")


def check_prompt_tokens(count: int, what: str, fix: str) -> None:
    """``what`` is ``count`` prompt tokens over all requests; refuse above the maximum."""
    if count > MAX_PROMPT_TOKENS:
        raise ValueError(f"{what} = {count} prompt tokens, more than a workload may hold ({MAX_PROMPT_TOKENS}); {fix}")


def check_arrival(seconds: float, what: str, fix: str) -> None:
    """``what`` (a request, a trace line) arrives ``seconds`` after the workload's start: finite, within the horizon."""
    if not math.isfinite(seconds) or seconds > MAX_ARRIVAL_SECONDS:
        raise ValueError(
            f"{what} arrives {seconds:.10g} s after the workload starts, past the {MAX_ARRIVAL_SECONDS:g} s a "
            f"workload may span; {fix}"
        )


def check_arrival_times(times: Sequence[float], names: Sequence[str], fix: str) -> None:
    """The first of ``times`` (seconds, each request named by ``names``) past the horizon is refused."""
    for name, seconds in zip(names, times):
        check_arrival(seconds, f"request {name}", fix)


def long_gaps(times: Sequence[float], names: Sequence[str]) -> list[str]:
    """A warning for each gap between consecutive arrivals longer than ``LONG_GAP_SECONDS``."""
    return [
        f"{name} arrives {later - earlier:g} s after {previous}: the engine idles that long "
        f"(gaps over {LONG_GAP_SECONDS:g} s are warned of)"
        for (previous, earlier), (name, later) in zip(zip(names, times), zip(names[1:], times[1:]))
        if later - earlier > LONG_GAP_SECONDS
    ]


def check_fits_context(num_tokens: int, max_context: int, what: str, fix: str) -> None:
    """``what`` needs ``num_tokens`` (prompt and output) in one sequence; refuse above the model's context."""
    if num_tokens > max_context:
        raise ValueError(f"{what} needs {num_tokens} tokens but the model's context is {max_context}; {fix}")
