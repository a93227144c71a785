"""Small typed results, built by hand, for tests of judging and of results.json (no engine run)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from perfsuite.engine.types import EngineCounters
from perfsuite.judge.baselines import recorded_counters
from perfsuite.judge.results import (
    Judgement,
    Measurement,
    PolicyDescription,
    ProbeDescription,
    ReferenceSide,
    Results,
    TestResult,
)
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.measure.environment import Environment
from perfsuite.measure.summaries import LatencySummary, RunSummary, SizingParameters

ENVIRONMENT = Environment("cpu", "2.13.0", "5.23.0", "float32", "smollm2-135m", "Some CPU @ 2GHz", 2)
LATENCY = LatencySummary(mean_ms=10.0, median_ms=9.0, std_ms=1.0, p90_ms=12.0, p99_ms=14.0)
POLICY = PolicyDescription(
    alpha=0.05, min_effect=0.10, test="one-sided Mann-Whitney U on per-repeat samples",
    correction="benjamini-hochberg", normalization="as measured", num_planned_comparisons=4, smallest_p=0.001,
    max_comparisons_for_lone_regression=50, min_detectable_effect="-", noisy="-",
)  # fmt: skip
PROBE = ProbeDescription(key="probe_bracket_seconds", unit="seconds", measures="-", applies_to="-")


NEWER_THAN_VERSION_4 = (
    "num_prefix_cache_queried_tokens", "num_prefix_cache_hit_tokens", "num_evicted_blocks",
    "prefill_flops", "decode_flops", "weight_bytes_read", "kv_bytes_read", "kv_bytes_written",  # the work counted
)  # fmt: skip


def make_result(
    test_id: str,
    configuration: RunConfiguration | None = None,
    output_throughput: list[float] = (100.0, 101.0, 99.0),
    **changes,
) -> TestResult:
    summary = RunSummary(
        request_throughput=1.0, output_throughput=sum(output_throughput) / len(output_throughput), completed=6,
        total_output_tokens=600, ttft=LATENCY, tpot=LATENCY, itl=LATENCY, e2el=LATENCY,
    )  # fmt: skip
    fields = {
        "engine_name": "static",
        "parameters": SizingParameters("smollm2-135m", "float32", input_length=9.5, output_length=7.0, concurrency=4),
        "arrival_rate": None,
        "samples": {"output_throughput": tuple(output_throughput)},
        "counters": EngineCounters(num_forward_passes=10),
        "summary": summary,
        "environment": ENVIRONMENT,
        "configuration": configuration,
    }
    measured = {name: value for name, value in changes.items() if name in MEASUREMENT_FIELDS}
    result = TestResult(test_id, Measurement(**{**fields, **measured}))
    return changed(result, **{name: value for name, value in changes.items() if name not in measured})


MEASUREMENT_FIELDS = {f.name for f in dataclasses.fields(Measurement)}
JUDGEMENT_FIELDS = {f.name for f in dataclasses.fields(Judgement)}
REFERENCE_FIELDS = {"reference_samples": "samples", "reference_timeline": "timeline", "pair_order": "pair_order"}


def changed(result: TestResult, **fields: Any) -> TestResult:
    """``result`` with fields of its measurement, its judgement or its REF side replaced, each named as the
    field is (the REF side's with ``reference_`` before ``samples`` and ``timeline``), its ``capacity`` or
    its ``node``."""
    unknown = set(fields) - MEASUREMENT_FIELDS - JUDGEMENT_FIELDS - set(REFERENCE_FIELDS) - {"capacity", "node"}
    assert not unknown, f"no such field of a test's result: {sorted(unknown)}"
    measured = {name: value for name, value in fields.items() if name in MEASUREMENT_FIELDS}
    judged = {name: value for name, value in fields.items() if name in JUDGEMENT_FIELDS}
    reference = {REFERENCE_FIELDS[name]: value for name, value in fields.items() if name in REFERENCE_FIELDS}
    if reference:
        side = result.reference or ReferenceSide(samples={}, timeline=None, pair_order=())
        result = dataclasses.replace(result, reference=dataclasses.replace(side, **reference))
    if "capacity" in fields:
        result = dataclasses.replace(result, capacity=fields["capacity"])
    if "node" in fields:
        result = dataclasses.replace(result, node=fields["node"])
    return dataclasses.replace(
        result,
        measurement=dataclasses.replace(result.measurement, **measured),
        judgement=dataclasses.replace(result.judgement, **judged),
    )


def make_results(*tests: TestResult, **changes) -> Results:
    return Results(
        **{
            "created_at": "2026-01-02T03:04:05+00:00", "commit": "abc123", "environment": ENVIRONMENT,
            "servers": (), "profile": "ci", "repeats": 3, "decode_mode": "packed", "policy": POLICY,
            "probe": PROBE, "slo": None, "tests": tests, **changes,
        }
    )  # fmt: skip


def version_4_document(results: Results) -> dict:
    """``results`` as perfsuite's version 4 wrote them (tests/test_results.py checks this against such a file)."""
    return {
        "schema_version": 4, "created_at": results.created_at, "commit": results.commit,
        "environment": _asdict(results.environment), "fingerprint": results.fingerprint,
        "servers": [{**dataclasses.asdict(s), "fingerprint": s.fingerprint()} for s in results.servers],
        "profile": results.profile, "repeats": results.repeats, "decode_mode": results.decode_mode,
        "policy": dataclasses.asdict(results.policy), "probe": dataclasses.asdict(results.probe), "slo": results.slo,
        "tests": [_test_version_4(test) for test in results.tests], "late_regressions": list(results.late_regressions),
        "warnings": list(results.warnings), "against": _asdict(results.against),
    }  # fmt: skip


def _test_version_4(test) -> dict:
    measured, judged, reference = test.measurement, test.judgement, test.reference
    return {
        "test_id": test.test_id,
        "engine": measured.engine_name,
        "parameters": dataclasses.asdict(measured.parameters),
        "configuration": measured.configuration.to_json() if measured.configuration else None,
        "arrival_rate": measured.arrival_rate,
        **{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in measured.summary.vllm_keys().items()},
        **measured.summary.interval_keys(),
        "samples": _lists(measured.samples),
        "request_samples": _lists(measured.request_samples),
        "baseline_request_samples": _lists(judged.baseline_request_samples),
        "timeline": _asdict(measured.timeline),
        # version 4 knew no prefix cache counters
        "counters": recorded_counters(measured.counters, (*measured.unrecorded_counters, *NEWER_THAN_VERSION_4)),
        "baseline_unrecorded_counters": list(judged.baseline_unrecorded_counters),
        "memory": _asdict(test.memory),
        "baseline": judged.baseline_status,
        "noisy": measured.noisy,
        "comparisons": [
            {**dataclasses.asdict(c), **{k: None for k in ("change", "ci_low", "ci_high") if getattr(c, k) == math.inf},
             "direction": c.direction.value, "verdict": c.verdict.value}
            for c in judged.comparisons
        ],  # fmt: skip
        "counter_changes": [dataclasses.asdict(c) for c in judged.counter_changes],
        "environment": _asdict(measured.environment),
        "fingerprint": test.fingerprint,
        "normalization": test.normalization,
        "reference_samples": _lists(reference.samples) if reference else {},
        "reference_timeline": _asdict(reference.timeline) if reference else None,
        "pair_order": list(reference.pair_order) if reference else [],
        "send_lag": _asdict(measured.send_lag),
        "capacity": test.capacity.to_json() if test.capacity else None,
    }


def _asdict(value):
    return dataclasses.asdict(value) if value is not None else None


def _lists(samples: dict) -> dict:
    return {name: list(values) for name, values in samples.items()}


def with_counters_unrecorded(results: Results, names: tuple[str, ...] = NEWER_THAN_VERSION_4) -> Results:
    """``results`` as a file written before the counters ``names`` existed reads."""
    tests = []
    for test in results.tests:
        earlier = test.measurement.unrecorded_counters
        tests.append(changed(test, unrecorded_counters=earlier + tuple(n for n in names if n not in earlier)))
    return dataclasses.replace(results, tests=tuple(tests))
