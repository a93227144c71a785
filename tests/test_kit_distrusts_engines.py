"""The correctness kit checks engines it does not know, so it trusts nothing they return and waits for none forever.

``validate_run_result`` is tested over each bad shape of a result; the ready
tests end to end with perfsuite's in-flight engine on tiny-random, its result
tampered with on the way out, and with engines and runners that never answer.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from hypothesis import strategies as st

from perfsuite.adapters.builtin import build_inflight
from perfsuite.testing.greedy import InvalidRunResult, validate_run_result
from perfsuite.engine import EngineCounters, FinishReason, Request, RequestRecord, RunResult, SamplingParams
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.testing import Scenario, equivalence_test, runner_equivalence_test
from perfsuite.testing.time_limit import (
    DEFAULT_MAX_SECONDS_PER_EXAMPLE,
    MAX_SECONDS_ENV,
    NoAnswer,
    call_within,
    resolve_max_seconds,
)

REQUESTS = (Request("r0", (3, 4), SamplingParams(2)), Request("r1", (5,), SamplingParams(2)))
# One scenario, so that a ready test that fails runs one example and has nothing to shrink: seconds, not tens.
ONE_SCENARIO = st.just(
    Scenario(
        (Request("r0", (3, 4, 5), SamplingParams(3, ignore_eos=True)),
         Request("r1", (6,), SamplingParams(2, ignore_eos=True))),
        (0, 1), batch_size=2, prefill_batch_size=1, max_num_batched_tokens=8,
    )
)  # fmt: skip


def record(request_id: object, token_ids: object = (7, 8)) -> RequestRecord:
    # the bad shapes are the point, so no types are checked here
    return RequestRecord(request_id, 2, token_ids, 0.0, 0.0, (0.1, 0.2), 0.2, FinishReason.LENGTH)  # type: ignore


def result(*records: object) -> RunResult:
    return RunResult("engine", records, 0.0, 1.0, EngineCounters())  # type: ignore[arg-type]


# -- validate_run_result, over each bad shape ------------------------------------------------------------------


def test_a_result_with_one_record_of_int_tokens_per_request_has_no_problem():
    assert validate_run_result(REQUESTS, result(record("r1"), record("r0", [7]))) == []


@pytest.mark.parametrize(
    ("returned", "fragments"),
    [
        (None, ["run() returned None", "must return a perfsuite.engine.RunResult"]),
        ({"r0": (7, 8)}, ["run() returned dict {'r0': (7, 8)}", "RunResult"]),
        (dataclasses.replace(result(), records=None), ["RunResult.records is None", "tuple of"]),
        (result(record("r0"), {"request_id": "r1"}), ["records[1] is dict", "not a perfsuite.engine.RequestRecord"]),
        (result(record("r0"), record(1)), ["records[1] has request_id int 1"]),
        (result(record("r0"), record("r1"), record("ghost")), ["request id 'ghost', which was never sent"]),
        (result(record("r0"), record("r0")), ["request id 'r0' has 2 records", "no record for requests ['r1']"]),
        (result(record("r1")), ["no record for requests ['r0']: a request was lost"]),
        (result(record("r0", (5.0, 8)), record("r1")), ["request 'r0'", "1 of 2", "position 0: float 5.0"]),
        (result(record("r0"), record("r1", (7, 8.5, 9.5))), ["request 'r1'", "2 of 3", "position 1: float 8.5"]),
        (result(record("r0", (7, -1)), record("r1")), ["position 1: int -1"]),
        (result(record("r0", (True, 8)), record("r1")), ["position 0: bool True"]),
        (result(record("r0", "78"), record("r1")), ["request 'r0': output_token_ids is str '78'"]),
    ],
    ids=["none", "dict", "records-none", "record-dict", "int-id", "unknown-id", "duplicate-id", "lost", "float-int",
         "float-fraction", "negative", "bool", "str-tokens"],  # fmt: skip
)
def test_each_bad_shape_of_a_result_is_named(returned, fragments):
    problems = validate_run_result(REQUESTS, returned)
    assert problems, "a bad result must have a problem"
    text = "\n".join(problems)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def test_an_invalid_result_fails_as_an_assertion_naming_the_engine_and_each_problem():
    error = InvalidRunResult("my-engine", ["first", "second"])
    assert isinstance(error, AssertionError) and error.problems == ("first", "second")
    assert str(error).startswith("my-engine: its result cannot be compared") and "\n  first\n  second" in str(error)


# -- the ready test, with an engine whose result is tampered with ------------------------------------------------


class Tampered:
    """perfsuite's in-flight engine, its result passed through ``tamper`` before the kit sees it."""

    greedy_equal = True

    def __init__(self, name, engine, tamper) -> None:
        self.name, self._engine, self._tamper = name, engine, tamper

    @property
    def batch_size(self) -> int:
        return self._engine.batch_size

    def run(self, requests, on_step=None, max_concurrency=None):
        return self._tamper(self._engine.run(requests, on_step, max_concurrency))


def tampered(name, tamper):
    def factory(backend, config):
        return Tampered(name, build_inflight(backend, config), tamper)

    factory.__name__ = name
    return factory


def with_tokens(result: RunResult, token) -> RunResult:
    records = [dataclasses.replace(r, output_token_ids=tuple(map(token, r.output_token_ids))) for r in result.records]
    return dataclasses.replace(result, records=tuple(records))


def with_records(result: RunResult, *records: RequestRecord) -> RunResult:
    return dataclasses.replace(result, records=records)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda res: None, r"run\(\) returned None; it must return a perfsuite.engine.RunResult"),
        (
            lambda res: with_records(res, *res.records, dataclasses.replace(res.records[0], request_id="ghost")),
            r"a record for request id 'ghost', which was never sent",
        ),
        (lambda res: with_records(res, res.records[0], *res.records), r"request id 'r\d' has 2 records"),
        (lambda res: with_tokens(res, float), r"request 'r\d': \d+ of \d+ output token ids are not non-negative ints, "
                                              r"the first at output position 0: float \d+\.0"),  # fmt: skip
        (lambda res: with_tokens(res, lambda t: t + 0.5), r"output token ids are not non-negative ints.*float \d+\.5"),
    ],
    ids=["none", "unknown-id", "duplicate-id", "int-valued-floats", "fractional-floats"],
)
def test_the_ready_test_fails_an_engine_whose_result_is_not_one_record_of_int_tokens_per_request(tamper, message):
    equivalence_test(tampered("untampered", lambda res: res), strategy=ONE_SCENARIO)()  # the engine itself is right
    with pytest.raises(AssertionError, match=message) as failure:
        equivalence_test(tampered("tampered", tamper), strategy=ONE_SCENARIO)()
    assert "scenario: " in str(failure.value)
    assert "differs from unbatched greedy decoding" not in str(failure.value)


# -- the time limit --------------------------------------------------------------------------------------------


class NeverAnswers:
    """An engine whose ``run`` waits until the test releases it."""

    name = "never-answers"
    greedy_equal = True
    batch_size = 4

    def __init__(self, release: threading.Event, calls: list[int]) -> None:
        self._release, self._calls = release, calls

    def run(self, requests, on_step=None, max_concurrency=None):
        self._calls.append(1)
        self._release.wait()
        return None


@pytest.fixture
def release():
    """Set at the end of a test, so the call it abandoned returns and its daemon thread ends."""
    event = threading.Event()
    yield event
    event.set()


def test_an_engine_that_never_answers_fails_after_the_limit_with_the_scenario_and_is_not_shrunk(release):
    calls: list[int] = []
    ready_test = equivalence_test(lambda backend, config: NeverAnswers(release, calls), max_examples=5,
                                  max_seconds_per_example=0.5, strategy=ONE_SCENARIO)  # fmt: skip
    with pytest.raises(NoAnswer, match=r"no answer in 0.5 s; the call is abandoned") as failure:
        ready_test()
    assert "scenario: " in str(failure.value) and "max_seconds_per_example" in str(failure.value)
    assert calls == [1], "one hang ends the test: shrinking would wait the limit again for each smaller scenario"


def test_the_limit_comes_from_the_environment_when_not_given(release, monkeypatch):
    monkeypatch.setenv(MAX_SECONDS_ENV, "0.25")
    ready_test = equivalence_test(lambda backend, config: NeverAnswers(release, []), strategy=ONE_SCENARIO)
    with pytest.raises(NoAnswer, match=r"no answer in 0.25 s"):
        ready_test()


def test_a_runner_that_never_answers_fails_after_the_limit(release):
    ready_test = runner_equivalence_test(lambda loaded: FakeRunner(on_execute=lambda output: release.wait()),
                                         strategy=ONE_SCENARIO, max_seconds_per_example=0.25)  # fmt: skip
    with pytest.raises(NoAnswer, match=r"no answer in 0.25 s[\s\S]*scenario: "):
        ready_test()


def test_the_limit_defaults_to_minutes_and_refuses_what_is_not_a_positive_number(monkeypatch):
    monkeypatch.delenv(MAX_SECONDS_ENV, raising=False)
    assert resolve_max_seconds(None) == DEFAULT_MAX_SECONDS_PER_EXAMPLE >= 120
    assert resolve_max_seconds(2.5) == 2.5
    with pytest.raises(ValueError, match=r"max_seconds_per_example=0 is not a number of seconds > 0; give"):
        equivalence_test("inflight", max_seconds_per_example=0)
    monkeypatch.setenv(MAX_SECONDS_ENV, "soon")
    with pytest.raises(ValueError, match=rf"{MAX_SECONDS_ENV}='soon' is not a number of seconds > 0"):
        resolve_max_seconds(None)


def test_call_within_returns_or_reraises_what_the_call_raised():
    call_within(5.0, lambda: None, "quick")
    error = KeyError("from the engine")

    def fails():
        raise error

    with pytest.raises(KeyError) as raised:
        call_within(5.0, fails, "failing")
    assert raised.value is error
    started = time.perf_counter()
    with pytest.raises(NoAnswer, match="slow: no answer in 0.05 s"):
        call_within(0.05, lambda: time.sleep(0.5), "slow")
    assert time.perf_counter() - started < 0.4
