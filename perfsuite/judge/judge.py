"""Judging a test against what it is compared with, and a family of tests together.

One place for the ``pytest --perf`` session (a test against its baseline) and
``perfsuite compare`` (a test against the same test in an older results
file): the same metrics, machine-speed normalisation, SLO rule for goodput,
noisy rule, minimum detectable effect and Benjamini-Hochberg adjustment.
``judge`` compares one test and leaves its p-values raw; the caller adjusts
them over its family: ``adjust_family`` at the end, and a session also with
``stats.adjust_interim`` while it runs (``plugin.session`` says why).

There are two families, each adjusted on its own at the session's alpha: the
headline metrics (throughput and latencies, goodput, capacity), planned for
every test, and the rates behind MFU and MBU (``catalogue.UTILIZATION_METRICS``),
which only an engine that counts its work measures. Kept apart so that a
session of peers, which counts none, plans no comparison it cannot make, and
the headline verdicts keep their power where MFU and MBU are judged too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfsuite.engine.types import EngineCounters
from perfsuite.judge.baselines import Baseline
from perfsuite.judge.catalogue import (
    ALL_METRICS,
    GOODPUT,
    NORMALISED,
    PROBE,
    RAW_SERVER_FIGURES,
    UTILIZATION_METRICS,
    exact_counter_changes,
    normalize_to_machine_speed,
)
from perfsuite.judge.paired import compare_paired
from perfsuite.judge.power import PowerPlan, minimum_detectable_effect
from perfsuite.judge.results import KV_COUNTERS, Judgement, PolicyDescription, ProbeDescription, TestResult
from perfsuite.judge.stats import Comparison, Direction, Policy, Verdict, adjust, adjust_interim, compare, mark_noisy
from perfsuite.measure.summaries import Measured


@dataclass(frozen=True, slots=True)
class Reference:
    """What a test is compared with: its baseline, or the same test in an older run."""

    samples: Mapping[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: EngineCounters
    request_samples: Mapping[str, tuple[float, ...]]
    slo: str | None  # the SLO its goodput counts
    unrecorded_counters: tuple[str, ...] = ()  # its file predates them: never compared

    @classmethod
    def of_baseline(cls, baseline: Baseline) -> Reference:
        return cls(
            baseline.samples, baseline.counters, baseline.request_samples, baseline.slo, baseline.unrecorded_counters
        )

    @classmethod
    def of_result(cls, result: TestResult, slo: str | None) -> Reference:
        measured = result.measurement
        return cls(measured.samples, measured.counters, measured.request_samples, slo, measured.unrecorded_counters)

    @classmethod
    def of_reference_side(cls, reference: Measured, current: Measured, slo: str | None) -> Reference:
        """Side A of an A/B session (``--perf-against``), measured beside side B.

        A REF tree older than the KV counters sends none (the wire fills in
        0) and its runs name no KV pool; where side B's runs name one, A's KV
        counters are not recorded rather than 0.
        """
        older = reference.timeline.num_kv_blocks is None and current.timeline.num_kv_blocks is not None
        unrecorded = KV_COUNTERS if older else ()
        return cls(reference.samples, reference.counters, reference.request_samples, slo, unrecorded)


JUDGED_METRICS = {**ALL_METRICS, **UTILIZATION_METRICS}


HEADLINE, UTILIZATION = "headline", "utilization"  # the two families (module docstring)


def family_of(metric: str) -> str:
    return UTILIZATION if metric in UTILIZATION_METRICS else HEADLINE


@dataclass(frozen=True, slots=True)
class FamilyPlan:
    """How many comparisons each family plans: an upper bound on how many it will make (module docstring)."""

    headline: int
    utilization: int = 0

    @classmethod
    def of_tests(cls, num_tests: int, headline_metrics: int) -> FamilyPlan:
        return cls(max(1, num_tests * headline_metrics), max(1, num_tests * len(UTILIZATION_METRICS)))

    def size_of(self, metric: str) -> int:
        """The planned size of ``metric``'s family."""
        return max(1, self.utilization if family_of(metric) == UTILIZATION else self.headline)


def _per_family(
    comparisons: Sequence[Comparison], settle: Callable[[str, list[Comparison]], list[Comparison]]
) -> list[Comparison]:
    """``comparisons`` in their order, each family's settled by ``settle(family, its comparisons)``."""
    settled = list(comparisons)
    for family in (HEADLINE, UTILIZATION):
        where = [i for i, c in enumerate(comparisons) if family_of(c.metric) == family]
        if where:
            for i, comparison in zip(where, settle(family, [comparisons[i] for i in where])):
                settled[i] = comparison
    return settled


def adjust_interim_by_family(
    current: Sequence[Comparison], earlier: Sequence[Comparison], plan: FamilyPlan, policy: Policy
) -> list[Comparison]:
    """``stats.adjust_interim`` within each family, its not-yet-made comparisons counted up to its planned size."""

    def settle(family: str, made: list[Comparison]) -> list[Comparison]:
        before = [c for c in earlier if family_of(c.metric) == family]
        return adjust_interim(made, before, plan.size_of(made[0].metric), policy)

    return _per_family(current, settle)


@dataclass(frozen=True, slots=True)
class Judged:
    """A test judged against its reference, its p-values not yet adjusted over the family."""

    result: TestResult
    goodput_skipped: bool  # both sides measured goodput, but against different SLOs


def judge(
    result: TestResult,
    reference: Reference,
    *,
    status: str,
    slo: str | None,
    policy: Policy,
    plan: FamilyPlan,
    metrics: Mapping[str, Direction] = JUDGED_METRICS,
) -> Judged:
    """``result`` compared with ``reference``, metric by metric, and its exact counters.

    Samples are first put on one machine speed (``normalize_to_machine_speed``);
    goodput is compared only when both count the same SLO. Each comparison
    carries the smallest slowdown a lone regression among its family's planned
    comparisons could be flagged for; a noisy result's comparisons judge nothing.
    """
    base, current = normalize_to_machine_speed(reference.samples, result.measurement.samples)
    goodput_skipped = GOODPUT in base and GOODPUT in current and reference.slo != slo
    comparisons = []
    for name, direction in metrics.items():
        if not base.get(name) or not current.get(name) or (name == GOODPUT and goodput_skipped):
            continue
        comparison = dataclasses.replace(
            compare(name, base[name], current[name], direction, policy),
            min_detectable_effect=minimum_detectable_effect(
                base[name], direction, policy.alpha / plan.size_of(name), policy.min_effect
            ),
        )
        comparisons.append(mark_noisy(comparison) if result.measurement.noisy else comparison)
    judged = result.with_judgement(
        baseline_status=status,
        baseline_request_samples=dict(reference.request_samples),
        comparisons=tuple(comparisons),
        **_counters_judged(result, reference),
    )
    return Judged(judged, goodput_skipped)


def judge_paired(
    result: TestResult,
    reference: Reference,
    *,
    status: str,
    policy: Policy,
    plan: FamilyPlan,
    metrics: Mapping[str, Direction] = JUDGED_METRICS,
) -> TestResult:
    """``result`` (side B) against ``reference`` (side A) measured beside it, repeat i of each forming pair i.

    Nothing is rescaled: both sides of a pair ran on the same machine within
    seconds, which is what the pairing is for. Each metric is judged on its
    pair ratios (``perfsuite.judge.paired``); the exact counters, A against B.
    """
    current = result.measurement.samples
    comparisons = tuple(
        compare_paired(
            name, reference.samples[name], current[name], direction, policy, num_comparisons=plan.size_of(name)
        )
        for name, direction in metrics.items()
        if reference.samples.get(name) and current.get(name)
    )
    return result.with_judgement(
        baseline_status=status,
        baseline_request_samples=dict(reference.request_samples),
        comparisons=comparisons,
        **_counters_judged(result, reference),
    )


def _counters_judged(result: TestResult, reference: Reference) -> dict:
    """The exact counters' changes, leaving out those either side did not record, and which the reference lacked."""
    measured = result.measurement
    unrecorded = (*reference.unrecorded_counters, *measured.unrecorded_counters)
    changes = exact_counter_changes(reference.counters, measured.counters, measured.arrival_rate, unrecorded)
    return {"counter_changes": tuple(changes), "baseline_unrecorded_counters": tuple(reference.unrecorded_counters)}


def not_compared(result: TestResult, status: str) -> TestResult:
    """``result`` with nothing to compare it with, and why."""
    return dataclasses.replace(result, judgement=Judgement(baseline_status=status))


def adjust_family(results: Sequence[TestResult], policy: Policy) -> tuple[list[TestResult], list[str]]:
    """Every comparison of ``results`` adjusted within its family; and what the adjustment newly flags as regressed."""
    everything = [c for r in results for c in r.judgement.comparisons]
    adjusted = iter(_per_family(everything, lambda _, family: adjust(family, policy)))
    final, newly_regressed = [], []
    for result in results:
        comparisons = tuple(next(adjusted) for _ in result.judgement.comparisons)
        for before, after in zip(result.judgement.comparisons, comparisons):
            if after.verdict is Verdict.REGRESSED and before.verdict is not Verdict.REGRESSED:
                newly_regressed.append(f"{result.test_id}: {after.describe()}")
        final.append(result.with_judgement(comparisons=comparisons))
    return final, newly_regressed


# -- what results.json says about the method ---------------------------------------------------------------------

MDE_METHOD = (
    "per metric, the smallest slowdown that, applied to the baseline's own (probe-normalised) samples, "
    "a lone regression of this session would be flagged for: one-sided Mann-Whitney p below alpha over "
    "the session's planned comparisons, and at least the minimum effect"
)

CPU_PROBE = (
    "geometric mean of two parts, in seconds per iteration (20 each, wall clock): an (8 x 512) by (512 x 32768) "
    "float32 matmul (memory-bound) and a (256 x 1024) by (1024 x 1024) float32 matmul (compute-bound); "
    "per repeat, the geometric mean of the probes taken just before and just after it"
)
CUDA_PROBE = (
    "geometric mean of two parts, in seconds per iteration (20 each, CUDA events): a 512 MiB device-to-device "
    "copy (bandwidth-bound) and a 4096-square bfloat16 matmul (compute-bound); per repeat, the geometric mean "
    "of the probes taken just before and just after it"
)


PAIRED_TEST = (
    "one-sided exact Wilcoxon signed-rank test on the log ratios current/reference of adjacent A/B repeats "
    "(ABBA order); CI: distribution-free (Walsh averages) for the median ratio"
)
PAIRED_MDE_METHOD = (
    "per metric, the smallest slowdown that, applied to every pair of this test, would give a one-sided "
    "Wilcoxon signed-rank p below alpha over the session's planned comparisons, and at least the minimum effect"
)
PAIRED_NORMALIZATION = "none: both sides of a pair ran on this machine within seconds of each other"
PAIRED_NOISY = (
    "not marked: both sides share the machine's load, which widens the pair ratios' spread (lowering power) "
    "without favouring either side"
)


STORED_TEST = "one-sided Mann-Whitney U on per-repeat samples"


def sequential_policy(description: PolicyDescription, policy: Policy) -> PolicyDescription:
    """How a comparison of two separate runs (``perfsuite compare``) judged, whatever each run's own session did."""
    return dataclasses.replace(
        description,
        alpha=policy.alpha,
        min_effect=policy.min_effect,
        test=STORED_TEST,
        normalization=f"in-process engines: {NORMALISED}; servers in another process: {RAW_SERVER_FIGURES}",
        min_detectable_effect=MDE_METHOD,
    )


def describe_policy(policy: Policy, plan: PowerPlan, busy_threshold: float, paired: bool = False) -> PolicyDescription:
    if paired:
        test, normalization, mde, noisy = PAIRED_TEST, PAIRED_NORMALIZATION, PAIRED_MDE_METHOD, PAIRED_NOISY
    else:
        test = STORED_TEST
        normalization = f"in-process engines: {NORMALISED}; servers in another process: {RAW_SERVER_FIGURES}"
        mde = MDE_METHOD
        noisy = (
            f"a test is noisy when other work used more than {busy_threshold:.0%} "
            "of the machine's CPU during a repeat; its comparisons are shown but judge nothing"
        )
    return PolicyDescription(
        alpha=policy.alpha,
        min_effect=policy.min_effect,
        test=test,
        correction="benjamini-hochberg",
        normalization=normalization,
        num_planned_comparisons=plan.num_comparisons,
        smallest_p=plan.smallest_p,
        max_comparisons_for_lone_regression=plan.max_comparisons,
        min_detectable_effect=mde,
        noisy=noisy,
    )


def describe_probe(on_cuda: bool) -> ProbeDescription:
    return ProbeDescription(
        key=PROBE,
        unit="seconds",
        measures=CUDA_PROBE if on_cuda else CPU_PROBE,
        applies_to="tests of engines that run in this process; a server in another process is not "
        "probed and its figures are not rescaled (each test's 'normalization' says which)",
    )
