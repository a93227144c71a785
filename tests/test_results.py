"""results.json: typed values written and read through the codec, its schema version, and files of versions 1 to 4."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from perfsuite.codec import encode
from perfsuite.judge.results import (
    KV_COUNTERS,
    RESULTS_SCHEMA_VERSION,
    AgainstDescription,
    Results,
    ResultsFileError,
    read_results,
    write_results,
)
from perfsuite.engine.types import EngineCounters
from perfsuite.judge.stats import CounterChange, Direction, Policy, compare
from perfsuite.measure.capacity import Capacity, CapacityRecord, ProbeOutcome
from perfsuite.measure.environment import ServerEnvironment
from perfsuite.measure.send_lag import SendLag
from perfsuite.measure.summaries import (
    DEVICE_MEMORY,
    LatencySummary,
    RunTimeline,
    TimelineChunk,
    TimelineRequest,
    TimelineStep,
)
from results_builders import (
    NEWER_THAN_VERSION_4,
    changed,
    make_result,
    make_results,
    version_4_document,
    with_counters_unrecorded,
)

VERSION_4_FILE = Path(__file__).with_name("data") / "results_v4.json"  # written by perfsuite's version 4 writer

TIMELINE = RunTimeline(
    duration=0.5,
    num_slots=2,
    steps=(
        TimelineStep(0.0, 0.2, num_waiting=1, chunks=(TimelineChunk(0, "r0", 5, True, False),)),
        TimelineStep(0.2, 0.5, 0, (TimelineChunk(0, "r0", 1, False, False), TimelineChunk(1, "r1", 1, False, True))),
    ),
    requests=(TimelineRequest("r0", 0.0, 0.2, 0.5), TimelineRequest("r1", 0.1, None, None)),
)


def judged_results() -> Results:
    comparison = compare("output_throughput", [100.0, 101, 102], [70.0, 71, 72], Direction.HIGHER_IS_BETTER, Policy())
    test = make_result(
        "tests/perf/t.py::test_a[static]",
        timeline=TIMELINE,
        comparisons=(dataclasses.replace(comparison, min_detectable_effect=0.2),),
        counter_changes=(CounterChange("num_forward_passes", 8, 10),),
        baseline_request_samples={"ttft_ms": (1.0, 2.0)},
        request_samples={"ttft_ms": (1.5, 2.5)},
        baseline_status="compared",
    )
    return make_results(test, make_result("tests/perf/t.py::test_b"), warnings=("a warning",))


def test_results_written_are_read_back_equal(tmp_path):
    results = judged_results()
    write_results(tmp_path / "results.json", results)
    assert read_results(tmp_path / "results.json") == results
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["schema_version"] == RESULTS_SCHEMA_VERSION == 5
    assert stored["fingerprint"] == results.environment.fingerprint()


def test_a_timeline_is_stored_with_named_fields(tmp_path):
    write_results(tmp_path / "results.json", judged_results())
    step = json.loads((tmp_path / "results.json").read_text())["tests"][0]["measurement"]["timeline"]["steps"][1]
    assert step["num_waiting"] == 0
    padding = {"slot": 1, "request_id": "r1", "num_tokens": 1, "is_prefill": False, "is_padding": True}
    assert step["chunks"][1] == padding


def test_the_summary_keeps_vllms_flat_keys_at_the_top_of_each_test(tmp_path):
    write_results(tmp_path / "results.json", judged_results())
    test = json.loads((tmp_path / "results.json").read_text())["tests"][0]
    assert test["output_throughput"] == pytest.approx(100.0) and test["p99_ttft_ms"] == 14.0
    assert "request_goodput" not in test, "goodput only with an SLO"


def version_1(document: dict) -> dict:
    """What perfsuite wrote before the typed model: positional chunks, 'waiting' and 'id', and summary_keys."""
    document = version_2(document)
    tests = []
    for test in document["tests"]:
        timeline = test["timeline"]
        if timeline is not None:
            timeline = {
                "duration": timeline["duration"],
                "num_slots": timeline["num_slots"],
                "steps": [
                    {"start": s["start"], "end": s["end"], "waiting": s["num_waiting"],
                     "chunks": [[c["slot"], c["request_id"], c["num_tokens"], c["is_prefill"], c["is_padding"]]
                                for c in s["chunks"]]}
                    for s in timeline["steps"]
                ],
                "requests": [{"id": r["request_id"], "arrival": r["arrival"], "first_token": r["first_token"],
                              "finished": r["finished"]} for r in timeline["requests"]],
            }  # fmt: skip
        tests.append({**test, "timeline": timeline or {}, "summary_keys": []})
    return {**document, "schema_version": 1, "tests": tests}


PREFIX_CACHE_COUNTERS = NEWER_THAN_VERSION_4


def without_kv_counters(results: Results) -> Results:
    """``results`` as a file older than the KV counters reads: those counters (and the later ones) not recorded."""
    tests = [changed(t, unrecorded_counters=KV_COUNTERS + PREFIX_CACHE_COUNTERS) for t in results.tests]
    return dataclasses.replace(results, tests=tuple(tests))


def test_a_version_1_file_is_converted_on_reading(tmp_path):
    results = judged_results()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(version_1(version_4_document(results))))
    assert read_results(path) == without_kv_counters(results)


def version_3(document: dict) -> dict:
    """What perfsuite wrote before KV counters: no KV figures in counters or timelines, no 'memory'."""
    tests = [
        {
            **{k: v for k, v in test.items() if k not in ("memory", "baseline_unrecorded_counters")},
            "counters": {k: v for k, v in test["counters"].items() if k not in KV_COUNTERS},
            "timeline": timeline_v3(test["timeline"]),
            "reference_timeline": timeline_v3(test["reference_timeline"]),
        }
        for test in document["tests"]
    ]
    return {**document, "schema_version": 3, "tests": tests}


def timeline_v3(timeline: dict | None) -> dict | None:
    if timeline is None:
        return None
    step_kv = ("num_kv_blocks_used", "num_kv_tokens_used", "preempted_request_ids")
    steps = [{k: v for k, v in step.items() if k not in step_kv} for step in timeline["steps"]]
    return {**{k: v for k, v in timeline.items() if k not in ("num_kv_blocks", "kv_block_size")}, "steps": steps}


def test_a_version_3_file_reads_its_kv_counters_as_not_recorded_and_writes_them_back_so(tmp_path):
    results = judged_results()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(version_3(version_4_document(results))))
    read = read_results(path)
    assert read == without_kv_counters(results)
    assert read.tests[0].measurement.counters.num_preemptions == 0 and read.tests[0].memory is None
    write_results(tmp_path / "again.json", read)
    measurement = json.loads((tmp_path / "again.json").read_text())["tests"][0]["measurement"]
    assert set(KV_COUNTERS + PREFIX_CACHE_COUNTERS) == set(measurement["unrecorded_counters"]) and "num_preemptions" in KV_COUNTERS
    assert measurement["counters"]["num_forward_passes"] == 10
    assert read_results(tmp_path / "again.json") == read


def version_2(document: dict) -> dict:
    """What perfsuite wrote before A/B sessions: no reference side, no 'against'."""
    document = version_3(document)
    reference_keys = ("reference_samples", "reference_timeline", "pair_order")
    tests = [{k: v for k, v in test.items() if k not in reference_keys} for test in document["tests"]]
    return {**{k: v for k, v in document.items() if k != "against"}, "schema_version": 2, "tests": tests}


def test_a_version_2_file_is_converted_on_reading(tmp_path):
    results = judged_results()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(version_2(version_4_document(results))))
    assert read_results(path) == without_kv_counters(results)


def paired_results() -> Results:
    test = changed(
        judged_results().tests[0],
        reference_samples={"output_throughput": (99.0, 101.0, 100.0)},
        reference_timeline=TIMELINE,
        pair_order=("AB", "BA", "AB"),
        baseline_status="A/B against HEAD (0123456789ab)",
    )
    against = AgainstDescription("HEAD", "0123456789abcdef", "fedcba9876543210", "ABBA")
    return dataclasses.replace(judged_results(), tests=(test,), against=against)


def test_an_ab_session_keeps_both_sides_and_its_reference(tmp_path):
    results = paired_results()
    write_results(tmp_path / "results.json", results)
    assert read_results(tmp_path / "results.json") == results
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["against"]["commit"] == "0123456789abcdef"
    assert stored["tests"][0]["reference"]["samples"]["output_throughput"] == [99.0, 101.0, 100.0]
    assert stored["tests"][0]["reference"]["pair_order"] == ["AB", "BA", "AB"]
    assert "reference" not in judged_results().to_json()["tests"][0], "a test judged against baselines has no REF"
    assert results.tests[0].is_paired and not judged_results().tests[0].is_paired


@pytest.mark.parametrize("version", [0, 6, None, "5"])
def test_a_file_of_another_version_names_the_file_its_version_and_the_fix(tmp_path, version):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**judged_results().to_json(), "schema_version": version}))
    with pytest.raises(ResultsFileError) as error:
        read_results(path)
    message = str(error.value)
    for part in (str(path), f"schema_version {version!r}", "reads versions 1, 2, 3, 4, 5", "pytest --perf"):
        assert part in message


@pytest.mark.parametrize("missing", ["policy", "tests"])
def test_a_file_missing_a_field_says_which(tmp_path, missing):
    document = judged_results().to_json()
    del document[missing]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFileError, match=f"{missing}.*pytest --perf"):
        read_results(path)


KV_TIMELINE = dataclasses.replace(
    TIMELINE,
    steps=(
        dataclasses.replace(TIMELINE.steps[0], num_kv_blocks_used=1, num_kv_tokens_used=5),
        dataclasses.replace(TIMELINE.steps[1], num_kv_blocks_used=2, num_kv_tokens_used=7,
                            preempted_request_ids=("r2",)),
    ),
    num_kv_blocks=8,
    kv_block_size=4,
)  # fmt: skip
KV_COUNTERS_OF_A_RUN = EngineCounters(
    num_forward_passes=2, num_preemptions=1, num_recomputed_tokens=3, peak_kv_blocks_used=2, peak_num_running=2,
    kv_blocks_used_step_sum=3, kv_tokens_used_step_sum=12, kv_token_capacity_step_sum=12 + 4,
)  # fmt: skip


def test_kv_figures_and_the_device_peak_are_stored_and_read_back(tmp_path):
    samples = {"output_throughput": (1.0, 2.0), DEVICE_MEMORY: (3 * 2**20, 5 * 2**20)}
    test = make_result("t.py::t[inflight]", timeline=KV_TIMELINE, counters=KV_COUNTERS_OF_A_RUN, samples=samples)
    write_results(tmp_path / "results.json", make_results(test))
    assert read_results(tmp_path / "results.json").tests[0] == test
    stored = json.loads((tmp_path / "results.json").read_text())["tests"][0]
    assert stored["measurement"]["timeline"]["steps"][1]["preempted_request_ids"] == ["r2"]
    assert stored["measurement"]["counters"]["num_preemptions"] == 1
    assert stored["memory"] == {
        "num_kv_blocks": 8, "kv_block_size": 4, "peak_kv_blocks_used": 2, "mean_kv_blocks_used": 1.5,
        "kv_utilisation": 0.75, "num_preemptions": 1, "num_recomputed_tokens": 3, "peak_num_running": 2,
        "max_memory_allocated_bytes": 5 * 2**20,
    }  # fmt: skip


def test_a_test_without_a_kv_pool_or_a_device_peak_has_no_memory_figures(tmp_path):
    write_results(tmp_path / "results.json", judged_results())
    assert json.loads((tmp_path / "results.json").read_text())["tests"][0]["memory"] is None
    assert judged_results().tests[0].memory is None


def test_a_counter_this_perfsuite_does_not_know_is_a_malformed_field(tmp_path):
    document = judged_results().to_json()
    document["tests"][0]["measurement"]["counters"]["num_teleports"] = 3
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFileError, match="num_teleports.*pytest --perf"):
        read_results(path)


def test_the_kv_counters_named_for_older_files_are_engine_counters():
    names = {f.name for f in dataclasses.fields(EngineCounters)}
    assert set(KV_COUNTERS) <= names and "num_preemptions" in KV_COUNTERS
    assert not {"num_forward_passes", "num_padding_tokens"} & set(KV_COUNTERS), "a version 3 file has these"


def test_the_files_written_are_standard_json_with_undefined_figures_as_null(tmp_path):
    """A run whose outputs are one token each has no TPOT or ITL; a baseline median of 0 makes a ratio unbounded."""
    undefined = LatencySummary.of([])
    unbounded = compare("request_goodput", [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], Direction.HIGHER_IS_BETTER, Policy())
    test = make_result("t.py::t", comparisons=(unbounded,))
    summary = test.measurement.summary
    test = changed(test, summary=dataclasses.replace(summary, tpot=undefined, itl=undefined))
    path = tmp_path / "results.json"
    write_results(path, make_results(test))
    stored = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert stored["tests"][0]["median_tpot_ms"] is None and stored["tests"][0]["p99_itl_ms"] is None
    assert stored["tests"][0]["measurement"]["summary"]["tpot"]["median_ms"] is None
    stored_comparison = stored["tests"][0]["judgement"]["comparisons"][0]
    assert stored_comparison["change"] == {"float": "inf"} == stored_comparison["ci_high"]
    [back] = read_results(path).tests
    assert math.isnan(back.measurement.summary.tpot.median_ms) and math.isnan(back.measurement.summary.itl.p99_ms)
    assert back.measurement.summary.ttft == test.measurement.summary.ttft
    assert back.judgement.comparisons[0].change == math.inf == unbounded.change
    assert back.judgement.comparisons[0] == unbounded


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({"samples": {"output_throughput": (-1.0, -2.0, -3.0)}},
         "samples['output_throughput'] holds -1.0, but output_throughput cannot be negative"),
        ({"samples": {"output_throughput": ()}}, "samples['output_throughput'] is an empty list"),
        ({"samples": {"output_throughput": (100.0, "x", 99.0)}},
         "samples['output_throughput'] holds 'x', which is not a number"),
        ({"request_samples": {"ttft_ms": (1.0, -1.0)}}, "request_samples['ttft_ms'] holds -1.0"),
        ({"baseline_request_samples": {"ttft_ms": (None,)}}, "baseline_request_samples['ttft_ms'] holds None"),
        ({"reference_samples": {"median_e2el_ms": (1.0, -2.0)}}, "reference_samples['median_e2el_ms'] holds -2.0"),
        ({"counters": EngineCounters(num_forward_passes=-3)}, "counters['num_forward_passes'] is -3"),
    ],
    ids=["negative", "empty", "not-a-number", "request", "baseline-request", "reference", "counter"],
)
def test_unusable_measurements_name_the_file_the_test_the_field_and_the_value(tmp_path, changes, shown):
    path = tmp_path / "results.json"
    write_results(path, make_results(make_result("t.py::good"), make_result("t.py::bad", **changes)))
    with pytest.raises(ResultsFileError) as error:
        read_results(path)
    assert f"{path}: tests[1] ('t.py::bad'): {shown}" in str(error.value)
    assert str(error.value).endswith("re-create it with `pytest --perf` (it writes reports/results.json)")


@pytest.mark.parametrize(
    ("where", "shown"),
    [((), "environment is 'cpu', not an object"),
     (("tests", 1), "tests[1] ('t.py::b'): environment is 'cpu', not an object")],
    ids=["session", "test"],
)
def test_an_environment_that_is_not_one_names_the_file_and_the_test(tmp_path, where, shown):
    document = make_results(make_result("t.py::a"), make_result("t.py::b")).to_json()
    holder = document["tests"][where[1]]["measurement"] if where else document
    holder["environment"] = "cpu"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFileError) as error:
        read_results(path)
    assert str(error.value).startswith(f"{path}: {shown}") and "pytest --perf" in str(error.value)


# -- version 4: each test flat, its summary as vLLM's keys; and every mode through the codec ---------------------


KV_TIMELINE_OF_TWO = RunTimeline(
    duration=0.5, num_slots=2,
    steps=(TimelineStep(0.0, 0.2, 1, (TimelineChunk(0, "r0", 5, True, False),), 1, 5, ()),
           TimelineStep(0.2, 0.5, 0, (TimelineChunk(0, "r0", 1, False, False), TimelineChunk(1, "r1", 1, False, True)),
                        2, 7, ("r1",))),
    requests=(TimelineRequest("r0", 0.0, 0.2, 0.5), TimelineRequest("r1", 0.1, None, None)),
    num_kv_blocks=8, kv_block_size=4,
)  # fmt: skip


def every_mode() -> Results:
    """A test of each mode: stored (judged, an unbounded change), one with NaN figures and unrecorded counters,
    A/B, capacity (NaN probe latencies), a remote server (send lag); ``tests/data/results_v4.json`` holds these,
    written by version 4."""
    stored = make_result(
        "t.py::test_stored[static]", timeline=KV_TIMELINE_OF_TWO,
        comparisons=(compare("output_throughput", [100.0, 101, 102], [70.0, 71, 72], Direction.HIGHER_IS_BETTER,
                             Policy()),
                     compare("request_goodput", [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], Direction.HIGHER_IS_BETTER, Policy())),
        counter_changes=(CounterChange("num_forward_passes", 8, 10),),
        baseline_request_samples={"ttft_ms": (1.0, 2.0)}, request_samples={"ttft_ms": (1.5, 2.5)},
        baseline_status="compared",
    )  # fmt: skip
    one_token = make_result("t.py::test_one_token[inflight]", noisy="the machine was busy",
                            unrecorded_counters=KV_COUNTERS, baseline_unrecorded_counters=("num_preemptions",))
    undefined = LatencySummary.of([])
    one_token = changed(one_token, summary=dataclasses.replace(one_token.measurement.summary, tpot=undefined,
                                                               itl=undefined))  # fmt: skip
    paired = make_result("t.py::test_paired[static]", timeline=KV_TIMELINE_OF_TWO,
                         reference_samples={"output_throughput": (99.0, 101.0, 100.0)},
                         reference_timeline=KV_TIMELINE_OF_TWO, pair_order=("AB", "BA", "AB"),
                         baseline_status="A/B against HEAD (0123456789ab)")  # fmt: skip
    probe = ProbeOutcome(2.0, 0.95, 10, 12.0, 30.0, math.nan, math.nan, True)
    record = CapacityRecord((Capacity(2.0, (2.0, 2.5), (probe,), "bracket", 0.9, 0.1),), 500.0, None, None,
                            ("a note",))  # fmt: skip
    capacity = make_result("t.py::test_capacity[inflight]", arrival_rate=2.0, samples={"capacity_under_slo": (2.0,)},
                           capacity=record)  # fmt: skip
    server = ServerEnvironment("served-model", 2048, "vllm-cpu", "vllm")
    remote = make_result("t.py::test_server[http]", environment=server, arrival_rate=4.0,
                         send_lag=SendLag(6, 0.5, 1.0, 2.0, 5.0, 4.0, 3.9))  # fmt: skip
    return make_results(stored, one_token, paired, capacity, remote, servers=(server,), warnings=("a warning",),
                        against=AgainstDescription("HEAD", "0123456789abcdef", None, "ABBA"),
                        late_regressions=("x",))  # fmt: skip


def exactly(value) -> str:
    """``value`` as the codec tags it: NaN equal to NaN, so two results compare field by field."""
    return json.dumps(encode(value), sort_keys=True)


def test_every_mode_round_trips_through_the_codec(tmp_path):
    results = every_mode()
    write_results(tmp_path / "results.json", results)
    back = read_results(tmp_path / "results.json")
    assert exactly(back) == exactly(results)
    assert [t.is_paired for t in back.tests] == [False, False, True, False, False]
    assert back.tests[3].capacity == results.tests[3].capacity and back.tests[4].is_remote
    assert math.isnan(back.tests[3].capacity.searches[0].probes[0].p50_tpot_ms)
    assert back.tests[1].measurement.unrecorded_counters == KV_COUNTERS and back.tests[1].memory is None


def test_each_test_keeps_what_readers_outside_perfsuite_read_beside_the_codecs_fields(tmp_path):
    write_results(tmp_path / "results.json", every_mode())
    stored = json.loads((tmp_path / "results.json").read_text())
    stored_test, one_token, remote = stored["tests"][0], stored["tests"][1], stored["tests"][4]
    assert stored_test["median_ttft_ms"] == 9.0 and one_token["median_tpot_ms"] is None
    assert stored_test["memory"]["num_kv_blocks"] == 8 and one_token["memory"] is None
    assert remote["normalization"] != stored_test["normalization"]
    assert remote["fingerprint"].startswith("server-vllm-cpu") and stored["servers"][0]["fingerprint"] == remote["fingerprint"]
    assert stored["fingerprint"] == every_mode().environment.fingerprint()
    assert set(stored_test) == {"test_id", "measurement", "judgement", "memory", "fingerprint", "normalization",
                                *every_mode().tests[0].measurement.summary.vllm_keys()}  # fmt: skip


def test_a_version_4_file_written_by_version_4_is_converted_on_reading():
    expected = with_counters_unrecorded(every_mode(), PREFIX_CACHE_COUNTERS)  # it predates prefix caching
    assert exactly(read_results(VERSION_4_FILE)) == exactly(expected)


def test_a_version_5_file_written_before_a_counter_existed_reads_it_as_unrecorded_not_as_zero(tmp_path):
    document = every_mode().to_json()
    for test in document["tests"]:
        for name in PREFIX_CACHE_COUNTERS:
            del test["measurement"]["counters"][name]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    back = read_results(path)
    assert exactly(back) == exactly(with_counters_unrecorded(every_mode(), PREFIX_CACHE_COUNTERS))
    write_results(path, back)
    assert read_results(path).tests[0].measurement.unrecorded_counters[-len(PREFIX_CACHE_COUNTERS):] == PREFIX_CACHE_COUNTERS


def test_the_version_4_fixture_of_these_tests_writes_what_version_4_wrote():
    assert json.loads(json.dumps(version_4_document(every_mode()))) == json.loads(VERSION_4_FILE.read_text())


def test_a_version_4_test_with_a_malformed_field_names_it(tmp_path):
    document = json.loads(VERSION_4_FILE.read_text())
    document["tests"][2]["samples"]["output_throughput"] = [1.0, "x"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFileError, match=r"tests\[2\] \('t.py::test_paired\[static\]'\): samples"):
        read_results(path)


def test_a_field_this_perfsuite_does_not_know_is_an_error_naming_it(tmp_path):
    document = every_mode().to_json()
    document["tests"][0]["judgement"]["verdict_of_the_future"] = 1
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFileError, match="has no field verdict_of_the_future.*pytest --perf"):
        read_results(path)
