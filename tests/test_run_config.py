"""A baseline's identity: what was measured, not only where."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.engine.types import Request, SamplingParams
from perfsuite.judge.run_config import RunConfiguration, knobs, workload_digest

CONFIGURATION = RunConfiguration(
    profile="ci", workload_digest="0123456789abcdef", num_requests=8, engine="static",
    engine_knobs=knobs({"batch_size": 4, "prefill_batch_size": None, "token_budget": None}),
    decode_mode="packed", max_seq_len=128, repeats=7,
)  # fmt: skip


def requests(lengths=(4, 8), prompt=(1, 2, 3), arrivals=(0.0, 0.0)):
    return [
        Request(f"r{i}", prompt, SamplingParams(n, ignore_eos=True), arrival_time=t)
        for i, (n, t) in enumerate(zip(lengths, arrivals))
    ]


def test_json_round_trip():
    assert RunConfiguration.from_json(CONFIGURATION.to_json()) == CONFIGURATION


def test_unknown_fields_are_refused():
    with pytest.raises(KeyError, match="surprise"):
        RunConfiguration.from_json({**CONFIGURATION.to_json(), "surprise": 1})


def test_differences_name_every_field_that_differs_with_both_values():
    other = dataclasses.replace(
        CONFIGURATION, profile="full", decode_mode="static", engine_knobs=knobs({"batch_size": 8})
    )
    differences = CONFIGURATION.differences(other)
    assert differences == [
        "profile: ci -> full",
        "engine_knobs: {batch_size=4, prefill_batch_size=None, token_budget=None} -> {batch_size=8}",
        "decode_mode: packed -> static",
    ]
    assert CONFIGURATION.differences(CONFIGURATION) == []


@pytest.mark.parametrize(
    "changed",
    [
        requests(lengths=(4, 9)),
        requests(prompt=(1, 2, 4)),
        requests(arrivals=(0.0, 0.5)),
        [dataclasses.replace(r, sampling_params=SamplingParams(r.sampling_params.max_new_tokens)) for r in requests()],
        requests()[:1],
    ],
    ids=["output-length", "prompt", "arrival", "eos", "fewer-requests"],
)
def test_the_workload_digest_sees_every_change_to_what_is_served(changed):
    assert workload_digest(changed) != workload_digest(requests())


def test_the_digest_sees_how_requests_are_served():
    same = requests()
    assert workload_digest(same) == workload_digest(requests())
    assert workload_digest(same, max_concurrency=2) != workload_digest(same)
    assert workload_digest(same, arrival_rate=4.0) != workload_digest(same)


@given(st.lists(st.integers(0, 50_000), min_size=1, max_size=20), st.integers(1, 64))
def test_request_ids_do_not_matter(prompt, max_new_tokens):
    a = [Request("a", prompt, SamplingParams(max_new_tokens))]
    b = [Request("b", prompt, SamplingParams(max_new_tokens))]
    assert workload_digest(a) == workload_digest(b)


def test_perfsuite_compare_never_judges_runs_of_unlike_configurations():
    from perfsuite.judge.compare import rejudge
    from perfsuite.judge.stats import Policy
    from results_builders import make_result, make_results

    def document(configuration, throughput):
        return make_results(make_result("t.py::t", configuration=configuration, output_throughput=throughput))

    old = document(CONFIGURATION, [100.0, 101, 99, 100, 102, 98])
    slower = [50.0, 51, 49, 50, 52, 48]
    same = rejudge(old, document(CONFIGURATION, slower), Policy())
    assert [c.verdict.value for c in same.tests[0].judgement.comparisons] == ["regressed"]
    other = dataclasses.replace(CONFIGURATION, decode_mode="static")
    unlike = rejudge(old, document(other, slower), Policy())
    assert unlike.tests[0].judgement.comparisons == ()
    assert unlike.tests[0].judgement.baseline_status == "another configuration in the old run: not compared"
