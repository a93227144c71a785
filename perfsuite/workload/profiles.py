"""Perf profiles: how big the workloads are and how often each is repeated.

``smoke`` exercises the whole plugin path in seconds (CI runs it on
``tiny-random``); ``ci`` is what GPU and CPU runners gate on; ``full`` is for
a person who wants tighter numbers. Repeats are per side of a comparison:
with R repeats a one-sided Mann-Whitney U test cannot go below
1 / C(2R, R), so R sets how many comparisons the session-wide correction can afford
(R=7 gives 1/3432).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsuite.workload.lengths import OutputLengths


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    repeats: int
    warmup_runs: int
    num_requests: int
    batch_sizes: tuple[int, ...]
    lengths: dict[str, OutputLengths]
    arrival_rates: tuple[float, ...]  # requests/s for the latency tests
    concurrency: int


PROFILES = {
    "smoke": Profile(
        name="smoke",
        repeats=3,
        warmup_runs=1,
        num_requests=4,
        batch_sizes=(2,),
        lengths={"fixed": OutputLengths("fixed", 4, 4), "uniform": OutputLengths("uniform", 1, 6)},
        arrival_rates=(50.0,),
        concurrency=2,
    ),
    "ci": Profile(
        name="ci",
        repeats=7,
        warmup_runs=1,
        num_requests=8,
        batch_sizes=(4, 8),
        lengths={
            "fixed": OutputLengths("fixed", 16, 16),
            "uniform": OutputLengths("uniform", 4, 24),
            "exponential": OutputLengths("exponential", 1, 32, mean=8),
        },
        arrival_rates=(4.0, 16.0),
        concurrency=4,
    ),
    "full": Profile(
        name="full",
        repeats=10,
        warmup_runs=2,
        num_requests=64,
        batch_sizes=(1, 4, 8, 16, 32),
        lengths={
            "fixed": OutputLengths("fixed", 128, 128),
            "uniform": OutputLengths("uniform", 8, 128),
            "exponential": OutputLengths("exponential", 1, 256, mean=64),
        },
        arrival_rates=(1.0, 4.0, 16.0),
        concurrency=8,
    ),
}
