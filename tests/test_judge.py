"""One judging function for the session and ``perfsuite compare``: same metrics, rules and adjustment."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.types import EngineCounters
from perfsuite.judge.catalogue import GOODPUT, METRICS
from perfsuite.judge.compare import policy_of, rejudge
from perfsuite.judge.judge import FamilyPlan, Reference, adjust_family, judge
from perfsuite.judge.results import KV_COUNTERS as KV_NAMES
from perfsuite.judge.results import read_results
from perfsuite.judge.stats import PAIRED_MIN_EFFECT, STORED_MIN_EFFECT, Policy, Verdict
from perfsuite.workload import OutputLengths, Workload
from own_engines import own_engine
from report_fixtures import as_ab_session, fake_session, record_fake_test, tokenize
from results_builders import NEWER_THAN_VERSION_4, changed, make_result, make_results, version_4_document

BASE = [100.0, 101, 99, 100, 102, 98]
SLOWER = [70.0, 71, 69, 70, 72, 68]


def reference(samples: dict, counters=EngineCounters(num_forward_passes=10), slo=None) -> Reference:
    return Reference({k: tuple(v) for k, v in samples.items()}, counters, {"ttft_ms": (1.0,)}, slo)


def judged(result, ref, slo=None, num_comparisons=4):
    return judge(result, ref, status="compared", slo=slo, policy=Policy(), plan=FamilyPlan(num_comparisons))


def test_a_slower_run_regresses_and_carries_its_minimum_detectable_effect():
    judgement = judged(make_result("t.py::t", output_throughput=SLOWER), reference({"output_throughput": BASE}))
    [comparison] = judgement.result.judgement.comparisons
    assert comparison.verdict is Verdict.REGRESSED and comparison.min_detectable_effect >= 0.10
    assert judgement.result.judgement.baseline_status == "compared"
    assert judgement.result.judgement.baseline_request_samples == {"ttft_ms": (1.0,)}


def test_counters_are_compared_exactly_unless_arrivals_follow_the_clock():
    result = make_result("t.py::t", counters=EngineCounters(num_forward_passes=12))
    [change] = judged(result, reference({})).result.judgement.counter_changes
    assert (change.name, change.baseline, change.current) == ("num_forward_passes", 10, 12)
    timed = changed(result, arrival_rate=4.0)
    assert judged(timed, reference({})).result.judgement.counter_changes == ()


KV = EngineCounters(num_forward_passes=10, num_preemptions=2, num_recomputed_tokens=40, peak_kv_blocks_used=7)


def test_a_counter_the_reference_did_not_record_is_not_compared_and_is_said():
    """A baseline or results file older than the KV counters reads them as 0: that is no measurement."""
    older = dataclasses.replace(reference({}), unrecorded_counters=KV_NAMES)
    judged_result = judged(make_result("t.py::t", counters=KV), older).result
    assert judged_result.judgement.counter_changes == ()
    assert judged_result.judgement.baseline_unrecorded_counters == KV_NAMES
    # the same counters, recorded as 0 by the reference, are a change
    changes = judged(make_result("t.py::t", counters=KV), reference({})).result.judgement.counter_changes
    assert {c.name for c in changes} == {"num_preemptions", "num_recomputed_tokens", "peak_kv_blocks_used"}


def test_a_counter_this_result_did_not_record_is_not_compared():
    result = make_result("t.py::t", counters=EngineCounters(num_forward_passes=10), unrecorded_counters=KV_NAMES)
    assert judged(result, reference({}, counters=KV)).result.judgement.counter_changes == ()
    fewer_passes = changed(result, counters=EngineCounters(num_forward_passes=11))
    [change] = judged(fewer_passes, reference({}, counters=KV)).result.judgement.counter_changes
    assert change.name == "num_forward_passes", "the counters both recorded are still compared"


def test_perfsuite_compare_of_a_file_older_than_the_kv_counters_reports_no_counter_change(tmp_path):
    old_document = version_4_document(make_results(make_result("t.py::t", output_throughput=BASE)))
    old_document["schema_version"] = 3
    for test in old_document["tests"]:
        test["counters"] = {k: v for k, v in test["counters"].items() if k not in KV_NAMES}
        del test["memory"], test["baseline_unrecorded_counters"]
    (tmp_path / "old.json").write_text(json.dumps(old_document))
    old = read_results(tmp_path / "old.json")
    new = make_results(make_result("t.py::t", output_throughput=BASE, counters=KV))
    [test] = rejudge(old, new, Policy()).tests
    assert test.judgement.counter_changes == ()
    assert test.judgement.baseline_unrecorded_counters == KV_NAMES + NEWER_THAN_VERSION_4
    [test] = rejudge(new, new, Policy()).tests
    assert test.judgement.baseline_unrecorded_counters == ()


def test_goodput_against_another_slo_is_skipped_and_said():
    samples = {"output_throughput": BASE, GOODPUT: BASE}
    result = make_result("t.py::t", samples={k: tuple(v) for k, v in samples.items()})
    other = judged(result, reference(samples, slo="ttft=1ms"), slo="ttft=2ms")
    assert other.goodput_skipped and [c.metric for c in other.result.judgement.comparisons] == ["output_throughput"]
    same = judged(result, reference(samples, slo="ttft=2ms"), slo="ttft=2ms")
    assert not same.goodput_skipped and {c.metric for c in same.result.judgement.comparisons} == {"output_throughput", GOODPUT}


def test_a_noisy_result_judges_nothing():
    result = make_result("t.py::t", output_throughput=SLOWER, noisy="the machine was busy")
    [comparison] = judged(result, reference({"output_throughput": BASE})).result.judgement.comparisons
    assert comparison.verdict is Verdict.NOISY


def test_adjusting_a_family_names_what_it_newly_flags():
    raw = judged(make_result("t.py::t", output_throughput=SLOWER), reference({"output_throughput": BASE})).result
    bounded = raw.with_judgement(comparisons=tuple(dataclasses.replace(c, verdict=Verdict.UNCHANGED)
                                                   for c in raw.judgement.comparisons))  # fmt: skip
    [final], newly = adjust_family([bounded], Policy())
    assert final.judgement.comparisons[0].verdict is Verdict.REGRESSED and len(newly) == 1 and newly[0].startswith("t.py::t:")


def test_the_session_and_perfsuite_compare_reach_the_same_comparisons(tmp_path):
    """A session judging against its baselines and ``perfsuite compare`` of the two runs' results agree exactly."""
    runner = FakeRunner(on_execute=lambda output: time.sleep(0.001))
    requests = Workload(6, OutputLengths("uniform", 2, 10), seed=3).requests(tokenize)

    def run_session(save_baseline: bool):
        session = fake_session(tmp_path, save_baseline)
        session.num_planned_tests = 2
        for kind in ("static", "inflight"):
            record_fake_test(session, f"tests/perf/t.py::test_a[{kind}]", kind, runner, requests, 4)
        session.finish()
        return session.document()

    saved, compared = run_session(save_baseline=True), run_session(save_baseline=False)
    rejudged = rejudge(saved, compared, Policy())
    for by_session, by_compare in zip(compared.tests, rejudged.tests, strict=True):
        assert by_session.judgement.baseline_status == "compared" and by_compare.judgement.baseline_status == "compared with the old run"
        assert len(by_session.judgement.comparisons) == len(METRICS)
        assert by_session.judgement.comparisons == by_compare.judgement.comparisons
        assert by_session.judgement.counter_changes == by_compare.judgement.counter_changes
        assert by_session.judgement.baseline_request_samples == by_compare.judgement.baseline_request_samples


def test_perfsuite_compare_applies_the_sessions_noisy_rule_and_minimum_detectable_effect():
    old = make_results(make_result("t.py::t", output_throughput=BASE))
    noisy = make_results(make_result("t.py::t", output_throughput=SLOWER, noisy="the machine was busy"))
    [comparison] = rejudge(old, noisy, Policy()).tests[0].judgement.comparisons
    assert comparison.verdict is Verdict.NOISY and comparison.min_detectable_effect is not None


def test_perfsuite_compare_says_when_goodput_counted_another_slo():
    samples = {"output_throughput": tuple(BASE), GOODPUT: tuple(BASE)}
    old = make_results(make_result("t.py::t", samples=samples), slo="ttft=1ms")
    new = make_results(make_result("t.py::t", samples=samples), slo="ttft=2ms")
    judged = rejudge(old, new, Policy())
    assert [c.metric for c in judged.tests[0].judgement.comparisons] == ["output_throughput"]
    assert any("SLO ttft=1ms" in w and "not compared" in w for w in judged.warnings)


def test_perfsuite_compare_takes_an_ab_session_as_a_separate_run_not_as_pairs():
    """Its current side is compared with the old run; nothing says A/B, and the stored minimum effect applies."""
    old = make_results(make_result("t.py::t", output_throughput=BASE))
    ab_new = as_ab_session(make_results(make_result("t.py::t", output_throughput=SLOWER)), ratios=(0.9,) * len(SLOWER))
    assert ab_new.against is not None and ab_new.tests[0].is_paired and ab_new.policy.min_effect == PAIRED_MIN_EFFECT
    policy = policy_of(ab_new)
    judged = rejudge(old, ab_new, policy)
    assert policy.min_effect == STORED_MIN_EFFECT
    assert judged.against is None and "Mann-Whitney" in judged.policy.test
    assert judged.policy.min_effect == STORED_MIN_EFFECT
    [test] = judged.tests
    assert not test.is_paired and test.reference is None
    [comparison] = test.judgement.comparisons
    assert comparison.baseline_median == statistics.median(BASE)  # the old run's, not side A's
    assert comparison.verdict is Verdict.REGRESSED


def test_an_ab_reference_tree_older_than_the_kv_counters_has_them_not_recorded():
    """Its runs name no KV pool and the wire fills its KV counters with 0: no counter change against side B."""
    from perfsuite.judge.judge import judge_paired
    from perfsuite.measure.summaries import Repeats, summarise

    requests = Workload(6, OutputLengths("uniform", 20, 40), seed=3).requests(tokenize)
    engine = own_engine("paged", FakeRunner(), batch_size=6, max_seq_len=64, eos_token_id=None, num_kv_blocks=20,
                        kv_block_size=4)  # fmt: skip
    current = summarise(Repeats(tuple(engine.run(requests) for _ in range(3))), METRICS)
    assert current.counters.num_preemptions > 0
    old_counters = EngineCounters(**{k: v for k, v in dataclasses.asdict(current.counters).items() if k not in KV_NAMES})
    older_tree = dataclasses.replace(current, counters=old_counters,
                                     timeline=dataclasses.replace(current.timeline, num_kv_blocks=None))  # fmt: skip
    result = make_result("t.py::t", counters=current.counters, samples=current.samples)

    def changes(reference):
        judged = judge_paired(result, Reference.of_reference_side(reference, current, None), status="A/B",
                              policy=Policy(), plan=FamilyPlan(4))  # fmt: skip
        return {c.name for c in judged.judgement.counter_changes}, judged.judgement.baseline_unrecorded_counters

    assert changes(older_tree) == (set(), KV_NAMES)
    same_tree_fewer_blocks = dataclasses.replace(current, counters=old_counters)  # names its pool: KV recorded as 0
    assert changes(same_tree_fewer_blocks)[0] >= {"num_preemptions", "peak_kv_blocks_used"}
    assert changes(current) == (set(), ())
