"""How many of the planned comparisons were judged, and why the rest were not: pure functions over results.

A comparison is *judged* when its verdict is improved, unchanged or
regressed. Noisy and inconclusive comparisons judge nothing, and neither does
a test with nothing to compare with (no baseline, baselines of other
environments only, a baseline of another configuration). A ``pytest --perf``
test that judged none of its comparisons is reported as skipped, with
``skip_reason``'s one line (docs/verdicts.md says why skipped); the session's
last line is ``Tally.line``, and ``perfsuite compare`` prints one too.

A test is judged while it runs, before the session-end Benjamini-Hochberg
adjustment (``judge.adjust_family``). That adjustment can move a comparison
between the three judged verdicts (a late regression) but never into or out
of them: noisy stays noisy, and inconclusive means too few samples, which no
p-value changes. So the count of judged comparisons, and a skip decided on a
pytest-xdist worker, hold at session end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.judge.catalogue import CAPACITY_METRICS
from perfsuite.judge.results import TestResult
from perfsuite.judge.stats import Verdict

JUDGED_VERDICTS = frozenset({Verdict.IMPROVED, Verdict.UNCHANGED, Verdict.REGRESSED})

# The baseline status of a test with nothing compared, as the session sets it (plugin.session).
NO_BASELINE = "no baseline"
OTHER_ENVIRONMENT = "other environment only"
OTHER_CONFIGURATION = "other configuration"

RECORD_BASELINES = "record baselines with --perf-save-baseline, or compare against a git ref with --perf-against REF"
RECORD_ONE = "record one with --perf-save-baseline, or compare against a git ref with --perf-against REF"
RERECORD = "re-record it with --perf-save-baseline if the change is intended"
RERECORD_ALL = "re-record them with --perf-save-baseline if the change is intended"
QUIET_RUNNER = "run on a quiet runner"
MORE_REPEATS = "raise --perf-repeats (a verdict needs 3 samples a side)"

# Why a planned comparison was not judged, as the session's line counts it, and what to do about it.
_STATUS_REASONS = {
    NO_BASELINE: ("without a baseline for this environment", RECORD_BASELINES),
    OTHER_ENVIRONMENT: ("with baselines only for other environments", RECORD_BASELINES),
    OTHER_CONFIGURATION: ("whose baseline measured another configuration", RERECORD_ALL),
}
_VERDICT_REASONS = {
    Verdict.NOISY: ("noisy (the machine was busy)", QUIET_RUNNER),
    Verdict.INCONCLUSIVE: ("inconclusive (too few repeats)", MORE_REPEATS),
}
MISSING_ON_ONE_SIDE = "not measured on both sides"  # a metric undefined in a run, goodput under another SLO
NOT_MEASURED = "not measured (their tests recorded no result)"  # failed or errored first, or measured nothing


def status_reason(status: str) -> str:
    """Why a test with nothing compared judged nothing, from its baseline status, as the session's line says it."""
    return _STATUS_REASONS.get(status, (status, None))[0]


def verdict_reason(verdict: Verdict) -> str | None:
    """Why a compared metric was not judged (noisy, inconclusive); None for a verdict that judged."""
    return _VERDICT_REASONS[verdict][0] if verdict in _VERDICT_REASONS else None


@dataclass(frozen=True, slots=True)
class Unjudged:
    """Planned comparisons not judged, for one reason."""

    reason: str
    count: int
    advice: str | None = None


@dataclass(frozen=True, slots=True)
class Tally:
    """Of the planned comparisons, how many were judged, and the rest by reason (the most first)."""

    num_planned: int
    num_judged: int
    unjudged: tuple[Unjudged, ...] = ()

    @property
    def all_judged(self) -> bool:
        return self.num_judged >= self.num_planned

    @property
    def num_unjudged(self) -> int:
        return sum(part.count for part in self.unjudged)

    def line(self) -> str:
        """``perfsuite: judged 0 of 8 planned comparisons (8 without a baseline ...): record baselines ...``"""
        line = f"perfsuite: judged {self.num_judged} of {self.num_planned} planned comparisons"
        if not self.unjudged:
            return line
        line += f" ({', '.join(f'{part.count} {part.reason}' for part in self.unjudged)})"
        advice = list(dict.fromkeys(part.advice for part in self.unjudged if part.advice))
        return f"{line}: {'; '.join(advice)}" if advice else line


def planned_comparisons(result: TestResult, metrics_per_test: int) -> int:
    """What a test was to compare: each of the session's metrics, a capacity test its capacity alone."""
    planned = len(CAPACITY_METRICS) if result.capacity is not None else metrics_per_test
    return max(planned, len(result.judgement.comparisons))


def num_judged(results: Sequence[TestResult]) -> int:
    return sum(c.verdict in JUDGED_VERDICTS for result in results for c in result.judgement.comparisons)


def tally(results: Sequence[TestResult], metrics_per_test: int, num_planned_tests: int | None = None) -> Tally:
    """``results`` counted; with ``num_planned_tests``, the planned tests that recorded none count as not judged."""
    reasons: Counter[str] = Counter()
    advice: dict[str, str | None] = {}
    for result in results:
        for reason, count, what_to_do in _unjudged_of(result, metrics_per_test):
            reasons[reason] += count
            advice[reason] = what_to_do
    num_planned = sum(planned_comparisons(result, metrics_per_test) for result in results)
    if num_planned_tests is not None:
        num_missing_tests = max(0, num_planned_tests - len({result.test_id for result in results}))
        if num_missing_tests:
            reasons[NOT_MEASURED] += num_missing_tests * metrics_per_test
            advice[NOT_MEASURED] = None
            num_planned += num_missing_tests * metrics_per_test
    unjudged = tuple(Unjudged(reason, count, advice[reason]) for reason, count in reasons.most_common() if count)
    return Tally(num_planned, num_judged(results), unjudged)


def skip_reason(results: Sequence[TestResult], metrics_per_test: int) -> str | None:
    """Why one test's ``results`` judged nothing, and what to do, in one line; None when any comparison was judged.

    ``perfsuite: judged 0 of 4 comparisons: no baseline for this environment (cpu-...); record one with ...``
    """
    if not results or num_judged(results):
        return None
    num_planned = sum(planned_comparisons(result, metrics_per_test) for result in results)
    details = list(dict.fromkeys(_detail_of(result) for result in results))
    why = "; ".join(detail for detail, _ in details)
    advice = "; ".join(dict.fromkeys(what_to_do for _, what_to_do in details if what_to_do))
    return f"perfsuite: judged 0 of {num_planned} comparisons: {why}" + (f"; {advice}" if advice else "")


def _unjudged_of(result: TestResult, metrics_per_test: int) -> list[tuple[str, int, str | None]]:
    planned = planned_comparisons(result, metrics_per_test)
    if not result.judgement.comparisons:
        reason, advice = _STATUS_REASONS.get(result.judgement.baseline_status, (result.judgement.baseline_status, None))
        return [(reason, planned, advice)]
    unjudged = []
    comparisons = result.judgement.comparisons
    for verdict, count in Counter(c.verdict for c in comparisons if c.verdict not in JUDGED_VERDICTS).items():
        reason, advice = _VERDICT_REASONS[verdict]
        unjudged.append((reason, count, advice))
    missing = planned - len(result.judgement.comparisons)
    return unjudged + ([(MISSING_ON_ONE_SIDE, missing, None)] if missing else [])


def _detail_of(result: TestResult) -> tuple[str, str | None]:
    """Why this result judged nothing (it judged nothing), and what to do about it."""
    if not result.judgement.comparisons:
        where = result.fingerprint or "unknown"
        status = result.judgement.baseline_status
        if status == NO_BASELINE:
            return f"no baseline for this environment ({where})", RECORD_ONE
        if status == OTHER_ENVIRONMENT:
            return f"baselines exist only for other environments, not for this one ({where})", RECORD_ONE
        if status == OTHER_CONFIGURATION:
            return "its baseline measured another configuration", RERECORD
        return f"not compared: {status}", None
    if any(c.verdict is Verdict.NOISY for c in result.judgement.comparisons):
        return f"noisy: {result.measurement.noisy or 'the machine was busy'}", QUIET_RUNNER
    sides = min(min(c.n_baseline, c.n_current) for c in result.judgement.comparisons)
    return f"inconclusive: too few repeats ({sides} a side) for a verdict", MORE_REPEATS
