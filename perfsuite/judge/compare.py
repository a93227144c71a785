"""Judge one results document against another, as ``perfsuite compare`` does.

The older run plays the baseline: every test present in both is compared per
metric on its per-repeat samples (put on one machine speed where both carry
the probe), and the p-values of all of them are Benjamini-Hochberg-adjusted together,
exactly as a ``pytest --perf`` session does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from perfsuite.judge.catalogue import ALL_METRICS, comparison_json, exact_counter_changes, normalize_to_machine_speed
from perfsuite.measure.summaries import GOODPUT
from perfsuite.judge.stats import Comparison, Policy, adjust, compare


def policy_of(results: dict[str, Any], alpha: float | None = None, min_effect: float | None = None) -> Policy:
    """The policy a results document was judged under, with any override."""
    stored, defaults = results.get("policy") or {}, Policy()
    return Policy(
        alpha=alpha if alpha is not None else float(stored.get("alpha", defaults.alpha)),
        min_effect=min_effect if min_effect is not None else float(stored.get("min_effect", defaults.min_effect)),
    )


def rejudge(old: dict[str, Any], new: dict[str, Any], policy: Policy, old_name: str = "the old run") -> dict[str, Any]:
    """``new`` with its comparisons, counter changes and baseline samples taken against ``old``."""
    old_tests = {test["test_id"]: test for test in old["tests"]}
    matched = [(old_tests[test["test_id"]], test) for test in new["tests"] if test["test_id"] in old_tests]
    pairs = [(before, after) for before, after in matched if _same_configuration(before, after)]
    same_slo = old.get("slo") == new.get("slo")
    raw = [_compare_samples(before, after, policy, same_slo) for before, after in pairs]
    adjusted = iter(adjust([c for comparisons in raw for c in comparisons], policy))
    judged = {}
    for (before, after), comparisons in zip(pairs, raw):
        final = [next(adjusted) for _ in comparisons]
        judged[after["test_id"]] = {
            **after,
            "baseline": f"compared with {old_name}",
            "baseline_request_samples": before.get("request_samples") or {},
            "comparisons": [comparison_json(c) for c in final],
            "counter_changes": [
                dataclasses.asdict(change)
                for change in exact_counter_changes(
                    before.get("counters") or {}, after.get("counters") or {}, after.get("arrival_rate")
                )
            ],
        }
    unmatched = {
        "baseline": f"not in {old_name}",
        "comparisons": [],
        "counter_changes": [],
        "baseline_request_samples": {},
    }
    unlike = {**unmatched, "baseline": f"another configuration in {old_name}: not compared"}
    tests = [
        judged.get(test["test_id"], {**test, **(unlike if test["test_id"] in old_tests else unmatched)})
        for test in new["tests"]
    ]
    return {
        **new,
        "tests": tests,
        "policy": {**(new.get("policy") or {}), "alpha": policy.alpha, "min_effect": policy.min_effect},
        "warnings": list(new.get("warnings") or []) + _environment_warnings(old, new, old_name),
    }


def _same_configuration(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Runs that measured different workloads, knobs or decode paths are never compared."""
    return before.get("configuration") == after.get("configuration")


def _compare_samples(
    before: dict[str, Any], after: dict[str, Any], policy: Policy, same_slo: bool
) -> list[Comparison]:
    old_samples, new_samples = normalize_to_machine_speed(before.get("samples") or {}, after.get("samples") or {})
    return [
        compare(metric, old_samples[metric], new_samples[metric], direction, policy)
        for metric, direction in ALL_METRICS.items()
        if old_samples.get(metric) and new_samples.get(metric) and (metric != GOODPUT or same_slo)
    ]


def _environment_warnings(old: dict[str, Any], new: dict[str, Any], old_name: str) -> list[str]:
    if old.get("fingerprint") == new.get("fingerprint"):
        return []
    return [
        f"{old_name} ran on environment {old.get('fingerprint')}, this one on {new.get('fingerprint')}: "
        "differences may come from the machine, not the code"
    ]
