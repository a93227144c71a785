"""Session results for the report tests, made with the pure-Python fake runner (no torch).

The runs are real engine runs whose steps sleep a millisecond, so timelines,
queues and latencies have the shape of a measured session. Verdicts are set
with ``perfsuite.judge.stats.compare`` on chosen samples, as a session would.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.judge.catalogue import METRICS
from perfsuite.judge.judge import PAIRED_TEST
from perfsuite.judge.paired import compare_paired
from perfsuite.judge.results import AgainstDescription, Results, TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs, workload_digest
from perfsuite.judge.stats import CounterChange, Direction, Policy, adjust, compare
from perfsuite.measure.summaries import Repeats, sizing_parameters
from perfsuite.plugin.against import ORDER
from perfsuite.judge.stats import PAIRED_MIN_EFFECT
from perfsuite.plugin.options import PerfOptions
from perfsuite.plugin.session import PerfSession, TimedEntry
from perfsuite.workload.profiles import PROFILES
from perfsuite.measure.environment import Environment
from perfsuite.workload import Arrivals, OutputLengths, Workload
from own_engines import own_engine
from results_builders import changed

ENVIRONMENT = Environment(
    device_name="cpu",
    torch_version="2.13.0+cpu",
    transformers_version="5.0.0",
    dtype="float32",
    model="fake",
    cpu_model="Test CPU @ 2.0GHz",
    num_threads=2,
)
LENGTHS = {"fixed": OutputLengths("fixed", 8, 8), "uniform": OutputLengths("uniform", 2, 14)}
REPEATS = 3
THROUGHPUT = "tests/perf/test_throughput.py::test_throughput[{engine}-B{batch}-{lengths}]"
POISSON = "tests/perf/test_latency.py::test_latency_poisson[{engine}-400rps]"


def fake_results(root: Path, step_seconds: float = 0.001) -> Results:
    """A session's results.json: throughput tests over engine x batch size x lengths, and a Poisson test."""
    session = fake_session(root)
    runner = FakeRunner(on_execute=lambda output: time.sleep(step_seconds))
    for engine_kind in ("static", "inflight"):
        for batch_size in (2, 4):
            for lengths in LENGTHS:
                requests = Workload(8, LENGTHS[lengths], seed=3).requests(tokenize)
                test_id = THROUGHPUT.format(engine=engine_kind, batch=batch_size, lengths=lengths)
                record_fake_test(session, test_id, engine_kind, runner, requests, batch_size)
        requests = Workload(6, LENGTHS["uniform"], Arrivals(400.0), seed=3).requests(tokenize)
        record_fake_test(session, POISSON.format(engine=engine_kind), engine_kind, runner, requests, 4, 400.0)
    session.finish()
    return dataclasses.replace(session.document(), created_at="2026-01-02T03:04:05+00:00")


def with_verdicts(results: Results) -> Results:
    """``results`` with a regressed, an improved and an inconclusive test, each named in ``VERDICT_TESTS``."""
    tests = {test.test_id: test for test in results.tests}
    baseline = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0]
    chosen = {
        "regressed": [70.0, 71.0, 72.0, 73.0, 74.0, 75.0, 76.0],
        "improved": [130.0, 131.0, 132.0, 133.0, 134.0, 135.0, 136.0],
        "inconclusive": [90.0, 91.0],  # below the policy's min_samples
    }
    raw = [
        compare("output_throughput", baseline, current, METRICS["output_throughput"], Policy())
        for current in chosen.values()
    ]
    for (verdict, _), comparison in zip(chosen.items(), adjust(raw, Policy())):
        assert comparison.verdict.value == verdict, comparison
        test = tests[VERDICT_TESTS[verdict]]
        tests[test.test_id] = changed(
            test,
            comparisons=(comparison,),
            baseline_status="compared",
            baseline_request_samples={
                k: tuple(0.8 * v for v in vs) for k, vs in test.measurement.request_samples.items()
            },
        )
    regressed = tests[VERDICT_TESTS["regressed"]]
    passes = regressed.measurement.counters.num_forward_passes
    tests[regressed.test_id] = changed(
        regressed, counter_changes=(CounterChange("num_forward_passes", passes - 2, passes),)
    )
    return dataclasses.replace(results, tests=tuple(tests.values()))


VERDICT_TESTS = {
    "regressed": THROUGHPUT.format(engine="static", batch=4, lengths="uniform"),
    "improved": THROUGHPUT.format(engine="inflight", batch=4, lengths="uniform"),
    "inconclusive": THROUGHPUT.format(engine="static", batch=2, lengths="fixed"),
}


AGAINST = AgainstDescription(
    ref="origin/main",
    commit="3f2a9c1d0e4b5a69788b1c2d3e4f5a6b7c8d9e0f",
    current_commit="4f1de97c0ffee0123456789abcdef0123456789a",
    order=ORDER,
)
PAIR_RATIOS = (0.91, 0.93, 0.92)  # B's throughput over A's per pair, one per repeat: B a little slower in each


def as_ab_session(results: Results, ratios: tuple[float, ...] = PAIR_RATIOS) -> Results:
    """``results`` as a ``--perf-against origin/main`` session wrote it: each test judged on pairs against side A.

    Side A's samples are B's over ``ratios`` pair by pair (latencies times them: A faster throughout), its
    requests 10% faster, and its timed run is B's own (the report draws both; what they show is not under test).
    """
    policy = Policy(min_effect=PAIRED_MIN_EFFECT)
    tests = [_paired_test(test, ratios, policy) for test in results.tests]
    adjusted = iter(adjust([c for t in tests for c in t.judgement.comparisons], policy))
    tests = [t.with_judgement(comparisons=tuple(next(adjusted) for _ in t.judgement.comparisons)) for t in tests]
    described = dataclasses.replace(results.policy, test=PAIRED_TEST, min_effect=PAIRED_MIN_EFFECT)
    return dataclasses.replace(results, tests=tuple(tests), against=AGAINST, policy=described)


def _paired_test(test: TestResult, ratios: tuple[float, ...], policy: Policy) -> TestResult:
    reference = {
        metric: tuple(v / r if METRICS.get(metric) is Direction.HIGHER_IS_BETTER else v * r
                      for v, r in zip(values, ratios))
        for metric, values in test.measurement.samples.items()
    }  # fmt: skip
    comparisons = tuple(
        compare_paired(metric, reference[metric], test.measurement.samples[metric], direction, policy)
        for metric, direction in METRICS.items()
        if test.measurement.samples.get(metric)
    )
    return changed(
        test,
        reference_samples=reference,
        reference_timeline=test.measurement.timeline,
        pair_order=tuple("AB" if i % 2 == 0 else "BA" for i in range(len(ratios))),
        baseline_status=f"A/B against {AGAINST.ref} ({AGAINST.commit[:12]})",
        baseline_request_samples={k: tuple(0.9 * v for v in vs) for k, vs in test.measurement.request_samples.items()},
        comparisons=comparisons,
    )


def earlier_run(results: Results, created_at: str, throughput_factor: float) -> Results:
    """An earlier run of the same tests, as the run history store holds it."""
    tests = tuple(
        changed(test, samples=with_samples(test.measurement.samples, "output_throughput", throughput_factor))
        for test in results.tests
    )
    return dataclasses.replace(results, created_at=created_at, tests=tests)


def with_samples(samples: dict, metric: str, factor: float) -> dict:
    return {**samples, metric: tuple(v * factor for v in samples[metric])}


def with_test_samples(results: Results, index: int, metric: str, values: list[float]) -> Results:
    """``results`` with one test's samples of ``metric`` replaced."""
    tests = list(results.tests)
    tests[index] = changed(tests[index], samples={**tests[index].measurement.samples, metric: tuple(values)})
    return dataclasses.replace(results, tests=tuple(tests))


def tokenize(text: str) -> list[int]:
    return [3 + b % 90 for b in text.encode()][:12]


def fake_session(root: Path, save_baseline: bool = False) -> PerfSession:
    options = PerfOptions(
        enabled=True,
        save_baseline=save_baseline,
        model="fake",
        device="cpu",
        dtype="float32",
        profile=PROFILES["smoke"],
        repeats=REPEATS,
        baseline_dir=root / "baselines",
        report_dir=root / "reports",
        policy=Policy(),
    )
    session = PerfSession(options, root)
    session.environment = ENVIRONMENT
    session.commit = "4f1de97c0ffee"
    return session


def record_fake_test(session, test_id, engine_kind, runner, requests, batch_size, arrival_rate=None) -> None:
    engine = own_engine(engine_kind, runner, batch_size=batch_size, max_seq_len=64, eos_token_id=None)
    runs = tuple(engine.run(requests) for _ in range(REPEATS))
    parameters = sizing_parameters(requests, "fake", "float32", batch_size)
    configuration = RunConfiguration(
        profile="smoke", workload_digest=workload_digest(requests, arrival_rate=arrival_rate),
        num_requests=len(requests), engine=engine_kind, engine_knobs=knobs({"batch_size": batch_size}),
        decode_mode="packed", max_seq_len=64, repeats=REPEATS,
    )  # fmt: skip
    session.record(TimedEntry(test_id, Repeats(runs), parameters, configuration, arrival_rate))
