"""Judge one results file against another, as ``perfsuite compare`` does.

The older run plays the baseline: every test present in both, with the same
run configuration, is judged by ``judge.judge`` exactly as a ``pytest --perf``
session judges a test against its baseline, and the p-values of all of them
are Benjamini-Hochberg-adjusted together.

Either file may come from an A/B session (``--perf-against``): its current
side (B) is what is compared, as two separate runs, never pair by pair, so
the result carries no A/B labels, and the minimum effect defaults to the
stored-baseline one (a run of another time is as far as a stored baseline).
"""

from __future__ import annotations

import dataclasses

from perfsuite.judge.catalogue import ALL_METRICS, CAPACITY_METRICS, METRICS, UTILIZATION_METRICS
from perfsuite.judge.judge import FamilyPlan, Reference, adjust_family, judge, not_compared, sequential_policy
from perfsuite.judge.results import Results, TestResult
from perfsuite.judge.stats import STORED_MIN_EFFECT, Policy
from perfsuite.judge.tally import Tally, tally


def policy_of(results: Results, alpha: float | None = None, min_effect: float | None = None) -> Policy:
    """The policy a results file was judged under, with any override."""
    if min_effect is None:
        min_effect = STORED_MIN_EFFECT if results.against is not None else results.policy.min_effect
    return Policy(alpha=alpha if alpha is not None else results.policy.alpha, min_effect=min_effect)


def rejudge(old: Results, new: Results, policy: Policy, old_name: str = "the old run") -> Results:
    """``new`` with its comparisons, counter changes and baseline samples taken against ``old``."""
    # a capacity test's capacities too; its configuration names its SLO, so another SLO is another configuration
    headline = {**(ALL_METRICS if new.slo is not None else METRICS), **CAPACITY_METRICS}
    metrics = {**headline, **UTILIZATION_METRICS}
    comparable = {t.test_id for t in new.tests if _comparable(old.test(t.test_id), t)}
    judged, skipped_goodput = [], False
    for test in new.tests:
        before = old.test(test.test_id)
        if before is None:
            judged.append(not_compared(test, f"not in {old_name}"))
        elif test.test_id not in comparable:
            judged.append(not_compared(test, f"another configuration in {old_name}: not compared"))
        else:
            judgement = judge(
                test,
                Reference.of_result(before, old.slo),
                status=f"compared with {old_name}",
                slo=new.slo,
                policy=policy,
                plan=FamilyPlan.of_tests(len(comparable), len(headline)),
                metrics=metrics,
            )
            judged.append(judgement.result)
            skipped_goodput = skipped_goodput or judgement.goodput_skipped
    tests, _ = adjust_family(judged, policy)
    warnings = [*new.warnings, *_environment_warnings(old, new, old_name)]
    if skipped_goodput:
        warnings.append(f"{old_name} counted goodput against SLO {old.slo}, this run against {new.slo}: not compared")
    return dataclasses.replace(
        new,
        tests=tuple(_without_reference_side(t) for t in tests),
        policy=sequential_policy(new.policy, policy),
        warnings=tuple(warnings),
        against=None,
    )


def judged_tally(judged: Results) -> Tally:
    """Of the comparisons ``rejudge`` planned (each test of NEW, every metric, a capacity test its capacity), how
    many were judged, and why the rest were not."""
    return tally(judged.tests, len(ALL_METRICS if judged.slo is not None else METRICS))


def _without_reference_side(test: TestResult) -> TestResult:
    """An A/B session's test, compared as a separate run: its REF side is not what it was compared with."""
    return dataclasses.replace(test, reference=None)


def _comparable(before: TestResult | None, after: TestResult) -> bool:
    """Runs that measured different workloads, knobs or decode paths are never compared."""
    return before is not None and before.measurement.configuration == after.measurement.configuration


def _environment_warnings(old: Results, new: Results, old_name: str) -> list[str]:
    if old.fingerprint == new.fingerprint:
        return []
    return [
        f"{old_name} ran on environment {old.fingerprint}, this one on {new.fingerprint}: "
        "differences may come from the machine, not the code"
    ]
