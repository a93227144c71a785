"""Multi-turn follow-ups through the engine: a turn's prompt is the conversation so far, due after its parent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from own_engines import own_engine

from perfsuite.engine import FinishReason, Request, SamplingParams
from perfsuite.engine.admission import ArrivalQueue, resolved_prompts
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.engine.types import FollowUp

VOCAB = 97


class StepClock:
    """A clock that moves 10 ms per forward pass, and on sleeps, so times are exact and tests never wait."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + 1e-9  # past the arrival even where the float sum rounds below it

    def on_execute(self, _output) -> None:
        self.now += 0.01


def conversation(session: str, turns: int, think_time: float, output: int = 3) -> list[Request]:
    """``turns`` requests ``<session>-t0..``; each later turn follows the one before it."""
    params = SamplingParams(output, ignore_eos=True)
    first = Request(f"{session}-t0", (5, 6, 7, 8), params)
    requests = [first]
    for turn in range(1, turns):
        parent = requests[-1]
        message = (10 + turn, 20 + turn)
        follows = FollowUp(parent.request_id, think_time, parent.max_total_tokens)
        requests.append(Request(f"{session}-t{turn}", message, params, follows=follows))
    return requests


def run(kind: str, requests: list[Request], max_concurrency: int | None = None):
    clock = StepClock()
    runner = FakeRunner(VOCAB, on_execute=clock.on_execute)
    engine = own_engine(kind, runner, batch_size=2, max_seq_len=64, eos_token_id=None,
                        clock=clock, sleep=clock.sleep)  # fmt: skip
    return engine.run(requests, max_concurrency=max_concurrency)


@pytest.mark.parametrize("kind", ["static", "inflight", "paged"])
def test_each_turn_continues_the_conversation_and_arrives_after_its_parent_plus_think_time(kind):
    requests = conversation("s0", 3, think_time=0.5) + conversation("s1", 3, think_time=0.25)
    result = run(kind, requests)
    records = {r.request_id: r for r in result.records}
    assert sorted(records) == sorted(r.request_id for r in requests)  # nothing dropped
    prompts = resolved_prompts(requests, result.outputs())
    for request in requests:
        record = records[request.request_id]
        assert record.finish_reason is FinishReason.LENGTH
        # Greedy-equal to an unbatched decode of the whole conversation so far.
        assert record.output_token_ids == fake_reference(prompts[request.request_id], request.sampling_params,
                                                         None, VOCAB)  # fmt: skip
        assert record.num_prompt_tokens == len(prompts[request.request_id])
        if request.follows is None:
            continue
        parent = records[request.follows.parent_id]
        parent_prompt = prompts[parent.request_id]
        assert prompts[request.request_id] == parent_prompt + parent.output_token_ids + request.prompt_token_ids
        assert record.arrival_time == pytest.approx(parent.finished_time + request.follows.think_time)
        assert record.token_times[0] > record.arrival_time


def test_a_closed_loop_lets_a_due_follow_up_in_when_a_client_is_free():
    requests = conversation("s0", 2, think_time=0.0) + conversation("s1", 2, think_time=0.0)
    result = run("inflight", requests, max_concurrency=1)
    records = {r.request_id: r for r in result.records}
    assert len(records) == 4
    for session in ("s0", "s1"):
        assert records[f"{session}-t1"].arrival_time >= records[f"{session}-t0"].finished_time
    in_flight = sorted((r.arrival_time, r.finished_time) for r in result.records)
    assert all(later[0] >= earlier[1] for earlier, later in zip(in_flight, in_flight[1:]))


def test_requests_without_follow_ups_run_as_before():
    requests = [Request(f"r{i}", (1, 2, 3 + i), SamplingParams(4, ignore_eos=True), arrival_time=0.1 * i)
                for i in range(4)]  # fmt: skip
    result = run("paged", requests)
    for request, record in zip(requests, sorted(result.records, key=lambda r: r.request_id)):
        assert record.output_token_ids == fake_reference(request.prompt_token_ids, request.sampling_params,
                                                         None, VOCAB)  # fmt: skip
        assert record.arrival_time == pytest.approx(50.0 + request.arrival_time)


def test_a_follow_up_is_sized_by_the_longest_conversation_before_it():
    first, second, third = conversation("s", 3, think_time=0.0, output=5)
    assert second.max_prompt_tokens == first.max_total_tokens + 2
    assert third.max_total_tokens == second.max_total_tokens + 2 + 5
    with pytest.raises(ValueError, match="context of 20 tokens"):
        own_engine("inflight", FakeRunner(VOCAB), batch_size=2, max_seq_len=20, eos_token_id=None).run(
            [first, second, third]
        )


@pytest.mark.parametrize(
    ("requests", "words"),
    [
        ([Request("b", (1,), follows=FollowUp("a", 0.0, 17))], "'a', which is not in the run"),
        (
            [Request("a", (1,), SamplingParams(4)), Request("b", (1,), follows=FollowUp("a", 0.0, 9))],
            "max_context_tokens=9 but its parent 'a' can reach 5",
        ),
        (
            [Request("a", (1,), follows=FollowUp("b", 0.0, 17)), Request("b", (1,), follows=FollowUp("a", 0.0, 17))],
            "make them equal",  # a cycle: each turn's bound exceeds its parent's, so they cannot agree
        ),
    ],
)
def test_a_follow_up_without_a_proper_parent_is_refused_before_anything_runs(requests, words):
    with pytest.raises(ValueError, match=words):
        ArrivalQueue(requests, None, resolves_follow_ups=True)


def test_a_run_loop_that_cannot_feed_outputs_back_refuses_follow_ups_naming_them():
    with pytest.raises(ValueError, match=r"cannot serve multi-turn follow-ups \('s0-t1', 's0-t2'.*static, inflight"):
        ArrivalQueue(conversation("s0", 3, 0.0), None)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: FollowUp("a", -1.0, 4), "think_time must be seconds >= 0"),
        (lambda: FollowUp("a", 0.0, 0), "max_context_tokens must be"),
        (lambda: Request("b", (1,), arrival_time=2.0, follows=FollowUp("a", 0.0, 4)), "leave its arrival_time at 0"),
        (lambda: Request("b", (1,)).continued((1,), (2,), 0.0), "follows no other request"),
        (lambda: Request("b", (1,), follows=FollowUp("a", 0.0, 2)).continued((1, 2), (3,), 0.0), "holds 3 tokens"),
    ],
)
def test_bad_follow_ups_are_refused_with_the_fix(make, words):
    with pytest.raises(ValueError, match=words):
        make()


class FakeReference:
    """Unbatched greedy decoding over the fake model, as ``check_greedy_equal`` asks of a reference."""

    def __init__(self) -> None:
        self.prompts: dict[str, tuple[int, ...]] = {}

    def generate(self, request):
        self.prompts[request.request_id] = request.prompt_token_ids
        tokens = fake_reference(request.prompt_token_ids, request.sampling_params, None, VOCAB)
        return SimpleNamespace(token_ids=tokens, top2_margins=[1.0] * len(tokens))


def test_the_greedy_check_decodes_a_follow_up_on_the_conversation_its_reference_made():
    from perfsuite.testing.greedy import check_greedy_equal

    requests = conversation("s0", 3, think_time=0.0)
    reference = FakeReference()
    engine = own_engine("paged", FakeRunner(VOCAB), batch_size=2, max_seq_len=64, eos_token_id=None)
    check = check_greedy_equal(engine, requests, reference)
    check.assert_passed()
    assert check.num_requests == 3
    first_output = fake_reference(requests[0].prompt_token_ids, requests[0].sampling_params, None, VOCAB)
    assert reference.prompts["s0-t1"] == requests[0].prompt_token_ids + first_output + requests[1].prompt_token_ids


def test_a_turns_ttft_counts_from_its_own_arrival_not_the_sessions():
    from perfsuite.measure.metrics import run_metrics

    requests = conversation("s0", 3, think_time=0.5)
    result = run("inflight", requests)
    metrics = {m.request_id: m for m in run_metrics(result).requests}
    records = {r.request_id: r for r in result.records}
    for turn in ("s0-t1", "s0-t2"):
        # a token or two of prefill after arriving, never the 0.5 s think time or the turns before
        assert 0 < metrics[turn].ttft < 0.05
        assert metrics[turn].ttft == pytest.approx(records[turn].token_times[0] - records[turn].arrival_time)


def test_a_follow_up_travels_to_an_ab_worker_whole_and_a_plain_request_as_before():
    from perfsuite.codec import decode, encode

    requests = conversation("s0", 2, think_time=0.5)
    assert [decode(Request, encode(r)) for r in requests] == requests
    assert "follows" not in encode(requests[0]), "a tree without follow-ups still reads a plain request"


def serve_conversations(kind, turns, think_time, output, max_concurrency, tight_pool):
    """Serve sessions of ``turns`` turns and check each turn: served once, on the prompt its conversation made,
    greedy-equal, never before its parent's end plus think time. The run's result."""
    sessions = [conversation(f"s{session}", count, think_time, output) for session, count in enumerate(turns)]
    requests = [request for session in sessions for request in session]
    clock = StepClock()
    largest = max(r.max_total_tokens for r in requests)
    engine = own_engine(kind, FakeRunner(VOCAB, on_execute=clock.on_execute), batch_size=2, max_seq_len=largest,
                        eos_token_id=None, num_kv_blocks=-(-largest // 16) if tight_pool else None,
                          clock=clock, sleep=clock.sleep)  # fmt: skip
    result = engine.run(requests, max_concurrency=max_concurrency)
    records = {r.request_id: r for r in result.records}
    assert sorted(records) == sorted(r.request_id for r in requests)
    prompts = resolved_prompts(requests, result.outputs())
    for request in requests:
        record = records[request.request_id]
        expected = fake_reference(prompts[request.request_id], request.sampling_params, None, VOCAB)
        assert record.output_token_ids == expected and record.num_prompt_tokens == len(prompts[request.request_id])
        if request.follows is not None:
            parent = records[request.follows.parent_id]
            assert record.arrival_time >= parent.finished_time + think_time - 1e-9
    return result


@settings(max_examples=30)
@given(
    kind=st.sampled_from(["static", "inflight", "paged"]),
    turns=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    think_time=st.sampled_from([0.0, 0.005, 0.03]),
    output=st.integers(1, 30),
    max_concurrency=st.sampled_from([None, 1, 2]),
    tight_pool=st.booleans(),
)
def test_any_mix_of_conversations_is_served_whole_greedy_equal_and_on_time(
    kind, turns, think_time, output, max_concurrency, tight_pool
):
    serve_conversations(kind, turns, think_time, output, max_concurrency, tight_pool)


def test_a_turn_preempted_from_a_tight_pool_is_still_served_whole():
    result = serve_conversations("paged", [2, 2, 2], 0.0, 30, None, tight_pool=True)
    assert result.counters.num_preemptions > 0


def test_a_run_loop_that_forgets_to_report_a_finish_fails_instead_of_waiting_forever():
    clock = StepClock()
    queue = ArrivalQueue(conversation("s0", 2, 0.0), None, clock=clock, resolves_follow_ups=True)
    queue.start()
    assert [a.request.request_id for a in queue.admit(num_unfinished=0)] == ["s0-t0"]
    assert len(queue) == 1
    with pytest.raises(RuntimeError, match=r"follow-ups \['s0-t1'\] wait for \['s0-t0'\].*ArrivalQueue.finished"):
        queue.seconds_to_next_arrival()
