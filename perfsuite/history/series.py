"""One test's metric over a run history: one point per session, among runs that measured the same thing.

A series is keyed by (test id, metric, environment fingerprint, run
configuration), the identity a baseline has (``perfsuite.judge.run_config``):
a run on another machine or library version, or of another workload, repeat
count or decode path, measures something else, so it starts a series of its
own rather than a step in this one.

A point is one session's median of the test's per-repeat samples, each repeat
first put on one machine speed the way a comparison does it
(``perfsuite.judge.catalogue.normalize_to_machine_speed``): rescaled by its
machine probe (``PROBE``) over the series' median probe, so a point does not
move because the VM was slower that day. The series' median rather than the
first run's: it does not hang on one reading, and a new run shifts it little.
A server in another process is never rescaled (``TestResult.is_remote``):
this machine's probe says nothing about the server's.

Left out of every series:

- A/B sessions' tests (``TestResult.is_paired``, ``--perf-against``). They
  measure REF against the current tree side by side on one runner, in worker
  processes and without rescaling by the probe; their B side is no point in
  time of the stored-mode series (a pull request's tree, measured in another
  set-up), and its level would read as a step.
- Tests marked noisy (other work held the CPU during their repeats): they
  judge nothing against a baseline, and a slow point would read as a step.
- A test whose result names no environment, so no fingerprint.
- A session whose samples give no finite value for the metric.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from perfsuite.judge.catalogue import (
    ALL_METRICS,
    CAPACITY,
    CAPACITY_METRICS,
    PROBE,
    RAW_SERVER_FIGURES,
    normalize_to_machine_speed,
)
from perfsuite.judge.results import Results, TestResult
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import Direction

# Every metric a session judges, with the direction that is better.
SERIES_METRICS: dict[str, Direction] = {**ALL_METRICS, **CAPACITY_METRICS}

THROUGHPUT = "output_throughput"

SERIES_NORMALISED = "each repeat rescaled by its machine probe over the series' median probe"
NOT_PROBED = "as measured: its runs recorded no machine probe"


@dataclass(frozen=True, slots=True)
class SeriesKey:
    """What a series is of: runs share a series only when all four match."""

    test_id: str
    metric: str
    fingerprint: str
    configuration: RunConfiguration | None  # None: an older file that did not record it

    @property
    def fingerprint_label(self) -> str:
        """The fingerprint's hash (its last part): the readable rest is in the test id and the report's header."""
        return self.fingerprint.rsplit("-", 1)[-1]

    @property
    def configuration_label(self) -> str:
        configuration = self.configuration
        if configuration is None:
            return "configuration not recorded"
        digest = hashlib.sha256(repr(configuration).encode()).hexdigest()[:8]
        return (
            f"{configuration.profile} {configuration.engine} {configuration.decode_mode} "
            f"x{configuration.repeats} ({digest})"
        )


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One session's value: the median over its repeats."""

    commit: str | None
    created_at: str
    value: float
    num_repeats: int

    @property
    def short_commit(self) -> str:
        return self.commit[:7] if self.commit else "unknown"


@dataclass(frozen=True, slots=True)
class Series:
    """One test's metric over sessions, oldest first."""

    key: SeriesKey
    direction: Direction
    points: tuple[SeriesPoint, ...]
    normalization: str  # how the points were put on one machine speed, if at all

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(point.value for point in self.points)


def headline_metric(test: TestResult) -> str:
    """The metric a test's trend is drawn for: a capacity test's capacity, any other's output throughput."""
    return CAPACITY if test.capacity is not None else THROUGHPUT


def build_series(
    sessions: Sequence[Results],
    test_ids: Collection[str] | None = None,
    metrics: Mapping[str, Direction] = SERIES_METRICS,
) -> list[Series]:
    """Every series in ``sessions`` (oldest first), of ``test_ids`` only when given; in order of first appearance."""
    runs: dict[SeriesKey, list[tuple[Results, TestResult]]] = {}
    for session in sessions:
        for test in session.tests:
            if test_ids is not None and test.test_id not in test_ids:
                continue
            fingerprint = _fingerprint(session, test)
            if fingerprint is None or test.is_paired or test.measurement.noisy:
                continue
            for metric in metrics:
                if test.measurement.samples.get(metric):
                    key = SeriesKey(test.test_id, metric, fingerprint, test.measurement.configuration)
                    runs.setdefault(key, []).append((session, test))
    return [_series(key, metrics[key.metric], found) for key, found in runs.items()]


def _fingerprint(session: Results, test: TestResult) -> str | None:
    return test.fingerprint or session.fingerprint


def _series(key: SeriesKey, direction: Direction, runs: list[tuple[Results, TestResult]]) -> Series:
    remote = any(test.is_remote for _, test in runs)
    probes = [] if remote else [probe for _, test in runs for probe in test.measurement.samples.get(PROBE, ())]
    reference = {PROBE: probes}
    points = []
    for session, test in runs:
        measured = test.measurement.samples
        samples = measured if remote else normalize_to_machine_speed(reference, measured)[1]
        value = _median(samples[key.metric])
        if value is not None:
            points.append(SeriesPoint(session.commit, session.created_at or "", value, len(samples[key.metric])))
    return Series(key, direction, tuple(points), _normalization(remote, [test for _, test in runs]))


def _median(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _normalization(remote: bool, tests: Sequence[TestResult]) -> str:
    if remote:
        return RAW_SERVER_FIGURES
    num_unprobed = sum(1 for test in tests if not test.measurement.samples.get(PROBE))
    if num_unprobed == len(tests):
        return NOT_PROBED
    if num_unprobed:
        return f"{SERIES_NORMALISED}; {num_unprobed} of {len(tests)} runs recorded no probe: as measured"
    return SERIES_NORMALISED
