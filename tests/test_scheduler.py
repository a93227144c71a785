"""Scheduling policies over the fake runner: no torch, no model."""

from __future__ import annotations

import pytest

from perfsuite.engine import (
    FinishReason,
    InflightScheduler,
    KVCacheManager,
    Request,
    SamplingParams,
    StaticScheduler,
    inflight_engine,
    static_engine,
)
from perfsuite.engine.fake_runner import FakeRunner, fake_reference

VOCAB = 97
EOS = 5


def make_request(request_id: str, prompt_len: int = 3, max_new_tokens: int = 4, **params) -> Request:
    seed = sum(map(ord, request_id))
    prompt = tuple(10 + (seed + 7 * i) % 50 for i in range(prompt_len))
    params.setdefault("ignore_eos", True)
    return Request(request_id, prompt, SamplingParams(max_new_tokens, **params))


def drain(engine) -> None:
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise AssertionError("engine did not finish")


def test_static_admits_only_into_an_empty_batch_and_pads_finished_slots():
    kv = KVCacheManager(num_slots=2, max_seq_len=32)
    scheduler = StaticScheduler(kv, EOS, batch_size=2)
    scheduler.add_request(make_request("short", max_new_tokens=1))
    scheduler.add_request(make_request("long", max_new_tokens=3))
    scheduler.add_request(make_request("late", max_new_tokens=1))

    first = scheduler.schedule()
    assert [c.request_id for c in first.chunks] == ["short", "long"]
    assert all(c.is_prefill and c.samples for c in first.chunks)
    scheduler.update_from_output(first, [1, 1])  # "short" is done after its first token

    second = scheduler.schedule()
    padding = [c for c in second.chunks if c.is_padding]
    assert [c.request_id for c in padding] == ["short"]
    assert second.num_padding_tokens == 1
    assert "late" not in {c.request_id for c in second.chunks}
    assert kv.num_used_slots == 2  # the finished slot stays held until the batch ends
    scheduler.update_from_output(second, [1])
    scheduler.update_from_output(scheduler.schedule(), [1])  # "long" finishes

    assert kv.num_used_slots == 0
    third = scheduler.schedule()
    assert [c.request_id for c in third.chunks] == ["late"]


def test_inflight_fills_a_freed_slot_at_the_next_step():
    kv = KVCacheManager(num_slots=2, max_seq_len=32)
    scheduler = InflightScheduler(kv, EOS, decode_batch_size=2)
    for request_id, length in (("a", 1), ("b", 3), ("c", 2)):
        scheduler.add_request(make_request(request_id, max_new_tokens=length))
    first = scheduler.schedule()
    scheduler.update_from_output(first, [1, 1])  # "a" finishes
    second = scheduler.schedule()
    assert [(c.request_id, c.is_prefill) for c in second.chunks] == [("b", False), ("c", True)]
    assert second.num_padding_tokens == 0


def test_inflight_respects_prefill_batch_size_and_max_num_batched_tokens():
    kv = KVCacheManager(num_slots=4, max_seq_len=64)
    scheduler = InflightScheduler(kv, EOS, decode_batch_size=4, prefill_batch_size=1, max_num_batched_tokens=5)
    for request_id in "abc":
        scheduler.add_request(make_request(request_id, prompt_len=8, max_new_tokens=2))
    first = scheduler.schedule()
    # One admission per step, and an 8-token prompt is chunked to the 5-token budget.
    assert [(c.request_id, c.num_tokens, c.samples) for c in first.chunks] == [("a", 5, False)]
    scheduler.update_from_output(first, [])
    second = scheduler.schedule()
    assert [(c.request_id, c.start_position, c.num_tokens) for c in second.chunks] == [("a", 5, 3), ("b", 0, 2)]
    assert second.num_scheduled_tokens <= 5


def test_chunked_prefill_gives_the_same_tokens_as_the_reference():
    runner = FakeRunner(VOCAB)
    engine = inflight_engine(runner, decode_batch_size=3, max_seq_len=64, eos_token_id=EOS, max_num_batched_tokens=3)
    requests = [make_request(f"r{i}", prompt_len=7 + i, max_new_tokens=5) for i in range(5)]
    result = engine.run(requests)
    for request in requests:
        expected = fake_reference(request.prompt_token_ids, request.sampling_params, EOS, VOCAB)
        assert result.outputs()[request.request_id] == expected


def test_in_flight_wastes_no_slot_tokens_where_static_does():
    requests = [make_request(f"r{i}", max_new_tokens=n) for i, n in enumerate((1, 8, 1, 8))]
    static = static_engine(FakeRunner(VOCAB), batch_size=2, max_seq_len=32, eos_token_id=EOS).run(requests)
    inflight = inflight_engine(FakeRunner(VOCAB), decode_batch_size=2, max_seq_len=32, eos_token_id=EOS).run(requests)
    assert static.outputs() == inflight.outputs()
    assert static.counters.num_padding_tokens == 2 * 7  # each 1-token request idles 7 steps
    assert inflight.counters.num_padding_tokens == 0
    assert inflight.counters.num_forward_passes < static.counters.num_forward_passes


def test_eos_and_stop_tokens_finish_requests_unless_eos_is_ignored():
    runner = FakeRunner(VOCAB)
    prompt = (11, 12, 13)
    first = fake_reference(prompt, SamplingParams(1), None, VOCAB)[0]
    engine = inflight_engine(runner, decode_batch_size=2, max_seq_len=32, eos_token_id=first)
    result = engine.run(
        [
            Request("stops", prompt, SamplingParams(6)),
            Request("ignores", prompt, SamplingParams(6, ignore_eos=True)),
            Request("stop-id", prompt, SamplingParams(6, ignore_eos=True, stop_token_ids=(first,))),
        ]
    )
    by_id = {r.request_id: r for r in result.records}
    assert by_id["stops"].output_token_ids == (first,)
    assert by_id["stops"].finish_reason is FinishReason.STOP
    assert len(by_id["ignores"].output_token_ids) == 6
    assert by_id["ignores"].finish_reason is FinishReason.LENGTH
    assert by_id["stop-id"].output_token_ids == (first,)


def test_run_honours_arrival_times_with_an_injected_clock():
    now = [0.0]
    runner = FakeRunner(VOCAB, on_execute=lambda output: now.__setitem__(0, now[0] + 0.01))
    engine = inflight_engine(
        runner,
        decode_batch_size=2,
        max_seq_len=32,
        eos_token_id=EOS,
        clock=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    early = make_request("early", max_new_tokens=2)
    late = Request("late", (1, 2), SamplingParams(2, ignore_eos=True), arrival_time=1.0)
    result = engine.run([late, early])
    records = {r.request_id: r for r in result.records}
    assert records["late"].arrival_time == pytest.approx(1.0)
    assert records["late"].first_scheduled_time >= 1.0
    assert records["early"].finished_time < 1.0
    assert len(result.steps) == result.counters.num_forward_passes


def test_abort_frees_the_slot_and_records_the_reason():
    engine = inflight_engine(FakeRunner(VOCAB), decode_batch_size=1, max_seq_len=32, eos_token_id=EOS)
    engine.add_request(make_request("victim", max_new_tokens=10))
    engine.add_request(make_request("next", max_new_tokens=2))
    engine.step()
    assert engine.abort_request("victim")
    assert not engine.abort_request("victim")
    assert engine.scheduler.kv_cache.num_free_slots == 1
    drain(engine)
    result = engine.result(0.0, 1.0)
    records = {r.request_id: r for r in result.records}
    assert records["victim"].finish_reason is FinishReason.ABORT
    assert len(records["next"].output_token_ids) == 2


def test_an_aborted_request_gets_no_placeholder_token():
    scheduler = InflightScheduler(KVCacheManager(2, 32), EOS, decode_batch_size=2)
    scheduler.add_request(make_request("victim", max_new_tokens=10))
    assert scheduler.abort_request("victim") is True, "the abort is a yes or no, not a step output with a token"
    assert scheduler.abort_request("victim") is False
    engine = inflight_engine(FakeRunner(VOCAB), decode_batch_size=1, max_seq_len=32, eos_token_id=EOS)
    engine.add_request(make_request("victim", max_new_tokens=10))
    engine.step()
    engine.abort_request("victim")
    [record] = engine.result(0.0, 1.0).records
    assert record.finish_reason is FinishReason.ABORT
    assert len(record.output_token_ids) == len(record.token_times) == 1
    assert all(token >= 0 for token in record.output_token_ids)


@pytest.mark.parametrize("build", ["static", "inflight"])
@pytest.mark.parametrize(
    ("bad_request", "words"),
    [
        (lambda: Request("empty", (), SamplingParams(2)), ["prompt_token_ids", "empty", "at least one token"]),
        (lambda: make_request("long", prompt_len=30, max_new_tokens=5), ["max_new_tokens", "32 tokens", "shorten"]),
        (lambda: make_request("zero", max_new_tokens=0), ["max_new_tokens", ">= 1"]),
        (lambda: make_request("dup", max_new_tokens=2), ["request_id", "'dup'", "unique"]),
    ],
    ids=["empty-prompt", "over-context", "zero-new-tokens", "duplicate-id"],
)
def test_bad_input_names_the_field_and_leaves_the_engine_usable(build, bad_request, words):
    factory = {"static": static_engine, "inflight": inflight_engine}[build]
    size_kwarg = {"static": "batch_size", "inflight": "decode_batch_size"}[build]
    engine = factory(FakeRunner(VOCAB), max_seq_len=32, eos_token_id=EOS, **{size_kwarg: 2})
    engine.add_request(make_request("dup", max_new_tokens=3))
    with pytest.raises(ValueError) as error:
        engine.add_request(bad_request())
    for word in words:
        assert word in str(error.value)
    engine.add_request(make_request("after", max_new_tokens=2))
    drain(engine)
    records = {r.request_id: r for r in engine.result(0.0, 1.0).records}
    assert set(records) == {"dup", "after"}
    assert all(r.finish_reason is FinishReason.LENGTH for r in records.values())
    assert engine.scheduler.kv_cache.num_used_slots == 0


def test_run_rejects_duplicate_ids_before_doing_any_work():
    runner = FakeRunner(VOCAB)
    engine = static_engine(runner, batch_size=2, max_seq_len=32, eos_token_id=EOS)
    with pytest.raises(ValueError, match="appears twice"):
        engine.run([make_request("x"), make_request("x")])
    assert runner.num_forward_passes == 0
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"decode_batch_size": 0}, "decode_batch_size"),
        ({"decode_batch_size": 2, "prefill_batch_size": 0}, "prefill_batch_size"),
        ({"decode_batch_size": 2, "max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ],
)
def test_bad_knobs_name_the_knob(kwargs, field):
    with pytest.raises(ValueError, match=field):
        InflightScheduler(KVCacheManager(2, 16), EOS, **kwargs)


class _RunnerReturning(FakeRunner):
    """The fake runner, but every sampled token id replaced by ``value``."""

    def __init__(self, value) -> None:
        super().__init__(VOCAB)
        self.value = value

    def execute(self, output, kv_cache):
        return [self.value for _ in super().execute(output, kv_cache)]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (47.9, "token id 47.9 (float) for request 'r0'"),
        (5.0, "token id 5.0 (float) for request 'r0'"),
        ("7", "token id '7' (str) for request 'r0'"),
        (-1, "token id -1 for request 'r0'; token ids are >= 0"),
    ],
)
@pytest.mark.parametrize("build", [static_engine, inflight_engine])
def test_a_runner_token_id_that_is_not_a_nonnegative_integer_is_its_bug_not_truncated(build, value, message):
    size = {"batch_size": 1} if build is static_engine else {"decode_batch_size": 1}
    engine = build(_RunnerReturning(value), max_seq_len=32, eos_token_id=EOS, **size)
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        engine.run([make_request("r0")])


def test_integer_token_ids_of_any_integer_type_are_taken():
    numpy = pytest.importorskip("numpy")
    engine = inflight_engine(_RunnerReturning(numpy.int64(7)), decode_batch_size=1, max_seq_len=32, eos_token_id=EOS)
    outputs = engine.run([make_request("r0", max_new_tokens=2)]).outputs()
    assert outputs == {"r0": (7, 7)} and all(type(token) is int for token in outputs["r0"])
