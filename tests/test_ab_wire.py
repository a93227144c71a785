"""perfsuite.ab.wire, the A/B workers' protocol, and a worker process spoken to over its pipes (no model).

The codec must give back every engine value it carries (non-finite floats,
None, empty tuples and unicode ids included), rebuilt from the receiver's
own classes; a value that the receiver's classes cannot hold, and a line
that is not a message of this protocol, must be a ``WireError`` that says
why.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import math
import re
import struct
import subprocess
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.ab import wire, workers
from perfsuite.ab.wire import WireError, decode, dumps_message, encode, loads_message
from perfsuite.ab.workers import Side, Worker, WorkerError
from perfsuite.engine.types import (
    EngineCounters,
    FinishReason,
    Request,
    RequestRecord,
    RunResult,
    SamplingParams,
    ScheduledChunk,
    StepTrace,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
ANSWER_SECONDS = 30.0  # a worker's answers here take milliseconds; this only bounds a hung one


def comparable(value: Any) -> Any:
    """``value`` in a form ``==`` compares exactly: types kept, nan equal to nan, -0.0 apart from 0.0."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple(comparable(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (tuple, list)):
        return type(value), tuple(comparable(item) for item in value)
    if isinstance(value, float):
        return float, "nan" if math.isnan(value) else repr(value)
    return type(value), value


def through_json(annotation: Any, value: Any) -> Any:
    """``value`` sent as the codec sends it (strict JSON: no NaN literals) and decoded as ``annotation``."""
    return decode(annotation, json.loads(json.dumps(encode(value), allow_nan=False)))


# -- strategies for the engine's values ---------------------------------------------------------------------------


def builds_every_field(cls: type, **explicit: Any) -> st.SearchStrategy:
    """``st.builds`` that draws the fields with defaults too (plain ``builds`` leaves those at their default)."""
    inferred = {f.name: ... for f in dataclasses.fields(cls)}
    return st.builds(cls, **{**inferred, **explicit})


def tuples_of(items: st.SearchStrategy, min_size: int = 0, max_size: int = 4) -> st.SearchStrategy:
    return st.lists(items, min_size=min_size, max_size=max_size).map(tuple)


REQUEST_IDS = st.text()  # any unicode, "" included
TOKEN_IDS = st.integers()
ANY_FLOAT = st.floats()  # nan (of either sign and any payload), inf, -inf, -0.0 and subnormals included
OPTIONAL_FLOAT = st.none() | ANY_FLOAT


@st.composite
def sampling_params(draw: st.DrawFn) -> SamplingParams:
    max_new_tokens = draw(st.integers(min_value=1, max_value=10**6))
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        ignore_eos=draw(st.booleans()),
        stop_token_ids=draw(tuples_of(TOKEN_IDS)),
        min_tokens=draw(st.integers(min_value=0, max_value=max_new_tokens)),
    )


REQUESTS = st.builds(
    Request,
    request_id=REQUEST_IDS,
    prompt_token_ids=tuples_of(TOKEN_IDS, min_size=1),
    sampling_params=sampling_params(),
    arrival_time=st.floats(min_value=0.0),  # inf included
)
CHUNKS = builds_every_field(ScheduledChunk, request_id=REQUEST_IDS, token_ids=tuples_of(TOKEN_IDS))
RECORDS = builds_every_field(
    RequestRecord,
    request_id=REQUEST_IDS,
    output_token_ids=tuples_of(TOKEN_IDS),
    arrival_time=ANY_FLOAT,
    first_scheduled_time=OPTIONAL_FLOAT,
    token_times=tuples_of(ANY_FLOAT),
    finished_time=OPTIONAL_FLOAT,
    finish_reason=st.none() | st.sampled_from(FinishReason),
)
STEPS = builds_every_field(StepTrace, start_time=ANY_FLOAT, end_time=ANY_FLOAT, chunks=tuples_of(CHUNKS, max_size=3))
COUNTERS = builds_every_field(EngineCounters)
RUN_RESULTS = builds_every_field(
    RunResult,
    engine_name=st.text(),
    records=tuples_of(RECORDS, max_size=3),
    start_time=ANY_FLOAT,
    end_time=ANY_FLOAT,
    counters=COUNTERS,
    steps=tuples_of(STEPS, max_size=3),
)
ENGINE_VALUES = {
    FinishReason: st.sampled_from(FinishReason),
    SamplingParams: sampling_params(),
    Request: REQUESTS,
    ScheduledChunk: CHUNKS,
    RequestRecord: RECORDS,
    StepTrace: STEPS,
    EngineCounters: COUNTERS,
    RunResult: RUN_RESULTS,
}


# -- the codec gives back every engine value -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(ENGINE_VALUES), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_every_engine_value_survives_encode_json_decode(cls, data):
    value = data.draw(ENGINE_VALUES[cls], label=cls.__name__)
    assert comparable(through_json(cls, value)) == comparable(value)


@pytest.mark.parametrize("reason", list(FinishReason))
def test_an_enum_travels_by_its_value(reason):
    assert encode(reason) == reason.value
    assert decode(FinishReason, reason.value) is reason


NAN_WITH_A_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]


@pytest.mark.parametrize(
    "value, tag",
    [(math.nan, "nan"), (-math.nan, "nan"), (NAN_WITH_A_PAYLOAD, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
)
def test_a_non_finite_float_travels_tagged(value, tag):
    assert encode(value) == {"float": tag}
    assert comparable(through_json(float, value)) == comparable(value)


# -- messages ------------------------------------------------------------------------------------------------------

# What encode makes of a value sent as Any: plain JSON data, with no tuples and no non-finite floats.
JSON_DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=8,
)


def field_strategy(hint: Any) -> st.SearchStrategy:
    if hint is Any:
        return JSON_DATA
    if hint == tuple[Any, ...]:
        return tuples_of(JSON_DATA)
    if hint == dict[str, Any]:
        return st.dictionaries(st.text(), JSON_DATA, max_size=3)
    return st.from_type(hint)


def messages_of(cls: type) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: field_strategy(hints[f.name]) for f in dataclasses.fields(cls)})


ANY_MESSAGE = st.one_of(*(messages_of(cls) for cls in wire.MESSAGES.values()))


@pytest.mark.parametrize("cls", list(wire.MESSAGES.values()), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_every_message_survives_one_json_line(cls, data):
    message = data.draw(messages_of(cls), label=cls.__name__)
    line = dumps_message(message)
    assert "\n" not in line
    assert comparable(loads_message(line)) == comparable(message)


@given(
    engine_id=st.text(),
    requests=st.lists(REQUESTS, max_size=4),
    max_concurrency=st.none() | st.integers(min_value=1, max_value=256),
)
def test_a_run_message_gives_back_its_requests(engine_id, requests, max_concurrency):
    sent = wire.Run(engine_id, tuple(encode(r) for r in requests), max_concurrency)
    received = loads_message(dumps_message(sent))
    assert (received.engine_id, received.max_concurrency) == (engine_id, max_concurrency)
    assert comparable([decode(Request, item) for item in received.requests]) == comparable(requests)


@given(result=RUN_RESULTS)
def test_a_run_done_message_gives_back_its_run_result(result):
    received = loads_message(dumps_message(wire.RunDone(encode(result))))
    assert comparable(decode(RunResult, received.result)) == comparable(result)


@given(messages=st.lists(ANY_MESSAGE, max_size=5))
def test_a_stream_gives_back_its_messages_in_order_then_none(messages):
    stream = io.StringIO()
    for message in messages:
        wire.write_message(stream, message)
    stream.seek(0)
    received = [wire.read_message(stream) for _ in messages]
    assert comparable(received) == comparable(messages)
    assert wire.read_message(stream) is None


# -- the codec against another tree's classes ----------------------------------------------------------------------


class OlderTree:
    """Classes as a reference tree from before ``min_tokens`` might have them, under the same names."""

    @dataclass(frozen=True, slots=True)
    class SamplingParams:
        max_new_tokens: int = 32  # not this tree's default: a sent value must win over the receiver's default
        ignore_eos: bool = False
        stop_token_ids: tuple[int, ...] = ()

    @dataclass(frozen=True, slots=True)
    class Request:
        request_id: str
        prompt_token_ids: tuple[int, ...]
        sampling_params: OlderTree.SamplingParams = field(default_factory=lambda: OlderTree.SamplingParams())
        arrival_time: float = 0.0

    class FinishReason(enum.Enum):
        LENGTH = "length"
        STOP = "stop"


class NewerTree:
    """A tree whose ``Request`` needs a field this tree's does not have."""

    @dataclass(frozen=True, slots=True)
    class Request:
        request_id: str
        prompt_token_ids: tuple[int, ...]
        priority: int
        sampling_params: SamplingParams = field(default_factory=SamplingParams)
        arrival_time: float = 0.0


@given(request=REQUESTS)
def test_a_field_the_receiver_lacks_is_an_error_naming_it(request):
    with pytest.raises(WireError, match=r"OlderTree\.SamplingParams has no field min_tokens"):
        through_json(OlderTree.Request, request)


@given(request=REQUESTS, priority=st.integers())
def test_a_field_this_tree_lacks_is_an_error_naming_it(request, priority):
    newer = NewerTree.Request(request.request_id, request.prompt_token_ids, priority)
    with pytest.raises(WireError, match=r"Request has no field priority"):
        through_json(Request, newer)


@given(request=REQUESTS)
def test_a_required_field_not_sent_is_an_error_naming_it(request):
    with pytest.raises(WireError, match=r"NewerTree\.Request needs priority, which the other side did not send"):
        through_json(NewerTree.Request, request)


@given(
    request_id=REQUEST_IDS,
    prompt_token_ids=tuples_of(TOKEN_IDS, min_size=1),
    max_new_tokens=st.integers(min_value=1, max_value=10**6),
)
def test_a_field_not_sent_that_has_a_default_gets_the_receivers_default(request_id, prompt_token_ids, max_new_tokens):
    older = OlderTree.Request(request_id, prompt_token_ids, OlderTree.SamplingParams(max_new_tokens))
    expected = Request(request_id, prompt_token_ids, SamplingParams(max_new_tokens, min_tokens=0))
    assert comparable(through_json(Request, older)) == comparable(expected)


def test_a_sent_default_wins_over_the_receivers_default():
    assert through_json(SamplingParams, OlderTree.SamplingParams()) == SamplingParams(max_new_tokens=32)


def test_an_enum_member_the_receiver_lacks_is_an_error():
    with pytest.raises(WireError, match=r"'abort' is not a FinishReason"):
        through_json(OlderTree.FinishReason, FinishReason.ABORT)


@pytest.mark.parametrize("bad", ["eos", "STOP", 1, None, ["stop"]])
def test_a_bad_enum_value_is_an_error(bad):
    with pytest.raises(WireError, match=re.escape(f"{bad!r} is not a FinishReason")):
        decode(FinishReason, bad)


def test_a_bad_enum_value_in_an_optional_field_is_an_error_saying_so():
    record = encode(RequestRecord("r", 1, (), 0.0, None, (), None, FinishReason.STOP))
    with pytest.raises(WireError, match=r"'eos' is not a FinishReason"):
        decode(RequestRecord, {**record, "finish_reason": "eos"})


def test_a_value_the_receivers_class_refuses_is_an_error_saying_why():
    request = {**encode(Request("r", (1,))), "prompt_token_ids": []}
    with pytest.raises(WireError, match=r"Request: request 'r': prompt_token_ids is empty"):
        decode(Request, request)


@pytest.mark.parametrize(
    "annotation, data, why",
    [
        (int, True, "expected an integer, got True"),
        (int, 1.5, "expected an integer, got 1.5"),
        (float, "1.5", "expected a number, got '1.5'"),
        (float, {"float": "NaN"}, "expected a number"),
        (str, 3, "expected str"),
        (tuple[int, ...], {"0": 1}, "expected list"),
        (SamplingParams, [16], "expected dict"),
    ],
)
def test_data_of_the_wrong_shape_is_an_error(annotation, data, why):
    with pytest.raises(WireError, match=re.escape(why)):
        decode(annotation, data)


# -- protocol errors -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, why",
    [
        ("this is not JSON", "not a JSON line"),
        ("", "not a JSON line"),
        ('["Tokens", 1]', "not a message (no 'type')"),
        ("42", "not a message (no 'type')"),
        ('{"v": 1, "token_ids": []}', "not a message (no 'type')"),
        ('{"type": "Tokens", "token_ids": []}', "protocol version None, this side speaks 1"),
        ('{"type": "Tokens", "v": 2, "token_ids": []}', "protocol version 2, this side speaks 1"),
        ('{"type": "Tokens", "v": "1", "token_ids": []}', "protocol version '1', this side speaks 1"),
        ('{"type": "Tokens", "v": true, "token_ids": []}', "protocol version True, this side speaks 1"),
        ('{"type": "Tokens", "v": 1.0, "token_ids": []}', "protocol version 1.0, this side speaks 1"),
        ('{"type": "Detokenize", "v": 1, "token_ids": []}', "unknown message 'Detokenize'"),
        ('{"type": ["Tokens"], "v": 1, "token_ids": []}', "unknown message ['Tokens']"),
        ('{"type": "Tokens", "v": 1, "token_ids": "abc"}', "expected list"),
        ('{"type": "Tokens", "v": 1, "token_ids": [], "text": "a"}', "Tokens has no field text"),
        ('{"type": "Tokens", "v": 1}', "Tokens needs token_ids"),
    ],
)
def test_a_line_that_is_not_a_message_of_this_protocol_is_an_error_saying_which(line, why):
    with pytest.raises(WireError, match=re.escape(why)):
        loads_message(line)


@dataclass(frozen=True)
class Tokens:
    """Not ``wire.Tokens``, only of the same name."""

    token_ids: tuple[int, ...]


@pytest.mark.parametrize(
    "not_a_message, why",
    [
        (Request("r", (1,)), "Request is not a message of protocol 1"),
        ({"type": "Tokens", "token_ids": []}, "dict is not a message of protocol 1"),
        (Tokens((1,)), "Tokens is not a message of protocol 1"),
        (wire.Tokens, "type is not a message of protocol 1"),
    ],
)
def test_dumping_what_is_not_a_message_is_an_error(not_a_message, why):
    with pytest.raises(WireError, match=re.escape(why)):
        dumps_message(not_a_message)


def test_a_message_holding_what_cannot_travel_is_an_error():
    with pytest.raises(WireError, match="a object cannot travel"):
        dumps_message(wire.Run("e", (object(),)))


# -- a worker process over its pipes, with no model ----------------------------------------------------------------


@pytest.fixture
def started_processes(monkeypatch):
    """The processes ``Worker`` starts, so a test sees them even when the constructor raised."""
    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(workers.subprocess, "Popen", recording_popen)
    yield started
    for process in started:  # a failed test leaves no worker behind
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def current_worker(started_processes):
    worker = Worker(Side("B", "the current tree", REPO_ROOT))
    yield worker
    worker.close()


def tokenize(worker: Worker, text: str) -> wire.Tokens:
    return worker.request(wire.Tokenize(text), wire.Tokens, ANSWER_SECONDS, "tokenize")


def test_a_worker_imports_perfsuite_from_its_tree(current_worker):
    hello = current_worker.hello
    assert REPO_ROOT in Path(hello.perfsuite_file).parents
    assert (hello.tree, hello.pid, hello.protocol_version) == (str(REPO_ROOT), current_worker.pid, 1)


def test_a_worker_that_fails_a_command_says_why_and_takes_the_next(current_worker):
    with pytest.raises(WorkerError, match="failed to tokenize: RuntimeError: .*send Load first"):
        tokenize(current_worker, "hello")
    assert current_worker.alive
    with pytest.raises(WorkerError, match="send Load first"):
        tokenize(current_worker, "hello again")


def test_a_worker_sets_the_threads_it_is_sent_and_refuses_fewer_than_one(current_worker):
    set_threads = current_worker.request(wire.SetThreads(1), wire.ThreadsSet, ANSWER_SECONDS, "set threads")
    assert set_threads == wire.ThreadsSet(1), "torch in the worker reports the count it was given"
    with pytest.raises(WorkerError, match="num_threads must be >= 1, got 0"):
        current_worker.request(wire.SetThreads(0), wire.ThreadsSet, ANSWER_SECONDS, "set threads")
    assert current_worker.alive


def test_a_worker_answers_a_line_that_is_not_json_with_failed_and_lives_on(current_worker):
    current_worker._process.stdin.write("this is not JSON\n")
    current_worker._process.stdin.flush()
    with pytest.raises(WorkerError, match="failed to x: WireError: not a JSON line"):
        current_worker._expect(wire.Tokens, ANSWER_SECONDS, "x")
    assert current_worker.alive
    with pytest.raises(WorkerError, match="send Load first"):
        tokenize(current_worker, "hello")


def test_a_closed_worker_has_exited_with_code_zero(current_worker):
    current_worker.close()
    assert not current_worker.alive
    assert current_worker._process.returncode == 0


def test_a_worker_whose_controller_closed_its_stdin_exits(current_worker):
    current_worker._process.stdin.close()
    assert current_worker._process.wait(ANSWER_SECONDS) == 0


def test_a_request_to_a_dead_worker_says_it_died(current_worker):
    current_worker.kill()
    with pytest.raises(WorkerError, match=r"worker B, the current tree died \(exit code -9\) during tokenize"):
        tokenize(current_worker, "hello")


def test_a_worker_whose_tree_has_no_perfsuite_is_refused_and_stopped(tmp_path, started_processes):
    installed = REPO_ROOT / "perfsuite" / "__init__.py"  # the virtual environment's editable install
    why = f"imported perfsuite from {installed}, not from its tree {tmp_path}"
    with pytest.raises(WorkerError, match=re.escape(why)):
        Worker(Side("A", "an empty tree", tmp_path))
    [process] = started_processes
    assert process.poll() is not None


def test_a_worker_whose_tree_cannot_be_imported_says_why_and_is_stopped(tmp_path, started_processes):
    (tmp_path / "perfsuite").mkdir()
    (tmp_path / "perfsuite" / "__init__.py").write_text("raise ImportError('this tree is broken')\n")
    with pytest.raises(WorkerError, match="failed to start: ImportError: this tree is broken"):
        Worker(Side("A", "a broken tree", tmp_path))
    [process] = started_processes
    assert process.poll() == 3
