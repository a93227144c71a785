"""Unique completions over N runs (``perfsuite.measure.determinism``), with fakes whose batch effects are known."""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.types import EngineCounters, FinishReason, FollowUp, Request, RequestRecord, RunResult
from perfsuite.measure.determinism import trial_batches, unique_completions
from own_engines import own_engine

PROMPTS = tuple(Request(f"r{i}", (5 + i, 7, 11 + 2 * i)) for i in range(6))


class BatchEngine:
    """Answers each request with ``answer(prompt, batch)``; records every batch it served."""

    def __init__(self, answer, name: str = "fake") -> None:
        self.name, self.answer, self.batches = name, answer, []

    def run(self, requests, on_step=None, max_concurrency=None) -> RunResult:
        batch = list(requests)
        self.batches.append(batch)
        records = tuple(record(r.request_id, self.answer(r, batch)) for r in batch)
        return RunResult(self.name, records, 0.0, 1.0, EngineCounters())


def record(request_id: str, tokens) -> RequestRecord:
    return RequestRecord(request_id, 3, tokens, 0.0, 0.0, (0.5,) * len(tokens), 1.0, FinishReason.LENGTH)


def by_prompt(request, batch) -> tuple[int, ...]:
    return (sum(request.prompt_token_ids) % 97, 1)


def odd_batch_differs(request, batch) -> tuple[int, ...]:
    return (sum(request.prompt_token_ids) % 97, len(batch) % 2)


def expected_parities(trials: int, seed: int) -> list[int]:
    """Per prompt, how many batch-size parities its trials put it in: the odd-batch engine's distinct count."""
    parities = [set() for _ in PROMPTS]
    for trial in range(trials):
        for batch in trial_batches(len(PROMPTS), trial, seed, 0.0):
            for index in batch.indices:
                parities[index].add(len(batch.indices) % 2)
    return [len(found) for found in parities]


def test_an_engine_whose_output_is_the_prompts_alone_is_deterministic_for_every_prompt():
    result = unique_completions(BatchEngine(by_prompt), PROMPTS, trials=5, max_arrival_offset=0.0)
    assert [p.num_distinct for p in result.prompts] == [1] * 6
    assert (result.max_distinct, result.mean_distinct, result.fraction_deterministic) == (1, 1.0, 1.0)
    assert result.num_trials == 5 and result.num_prompts == 6
    assert result.describe() == "max 1 distinct completion over 5 trials; 6 of 6 prompts deterministic"


def test_an_engine_that_answers_odd_batches_otherwise_is_counted_exactly():
    expected = expected_parities(trials=5, seed=1)
    assert expected == [2, 2, 1, 2, 1, 2]  # both kinds of prompt, and the seeded plan pinned across versions
    result = unique_completions(BatchEngine(odd_batch_differs), PROMPTS, trials=5, seed=1, max_arrival_offset=0.0)
    assert [p.num_distinct for p in result.prompts] == expected
    assert result.max_distinct == 2
    assert result.num_deterministic == expected.count(1)
    assert result.mean_distinct == pytest.approx(sum(expected) / 6)
    assert result.fraction_deterministic == pytest.approx(expected.count(1) / 6)


def test_a_prompt_alone_in_every_batch_is_always_deterministic_under_the_odd_batch_engine():
    result = unique_completions(BatchEngine(odd_batch_differs), PROMPTS[:1], trials=4)
    assert [p.num_distinct for p in result.prompts] == [1]


def test_an_answer_by_position_in_the_batch_counts_every_position_a_prompt_was_sent_at():
    def position(request, batch):
        return (batch.index(request),)

    engine = BatchEngine(position)
    result = unique_completions(engine, PROMPTS, trials=5, seed=1, max_arrival_offset=0.0)
    positions = {r.request_id: set() for r in PROMPTS}
    for batch in engine.batches:
        for at, request in enumerate(batch):
            positions[request.request_id].add(at)
    assert {p.request_id: p.num_distinct for p in result.prompts} == {k: len(v) for k, v in positions.items()}
    assert result.max_distinct > 1


def test_every_trial_serves_every_prompt_once_in_compositions_that_vary_and_arrive_within_the_offset():
    engine = BatchEngine(by_prompt)
    unique_completions(engine, PROMPTS, trials=8, seed=7, max_arrival_offset=0.05)
    plans = [trial_batches(6, trial, 7, 0.05) for trial in range(8)]
    assert [len(b) for b in engine.batches] == [len(b.indices) for plan in plans for b in plan]
    for plan in plans:
        assert sorted(i for b in plan for i in b.indices) == list(range(6))
    assert len({tuple(len(b.indices) for b in plan) for plan in plans}) > 1  # batch sizes differ between trials
    assert len({tuple(i for b in plan for i in b.indices) for plan in plans}) > 1  # and so do the orders
    offsets = [r.arrival_time for batch in engine.batches for r in batch]
    assert all(0.0 <= t < 0.05 for t in offsets) and len(set(offsets)) == len(offsets)


def test_the_same_seed_gives_the_same_compositions_and_counts_and_another_seed_other_compositions():
    def plans(seed):
        return [trial_batches(6, trial, seed, 0.02) for trial in range(5)]

    assert plans(11) == plans(11) and plans(11) != plans(12)
    runs = [unique_completions(BatchEngine(odd_batch_differs), PROMPTS, trials=5, seed=11) for _ in range(2)]
    assert runs[0] == runs[1]


def test_perfsuites_inflight_engine_over_the_fake_runner_is_deterministic_under_every_composition():
    engine = own_engine("inflight", FakeRunner(vocab_size=97), batch_size=3, max_seq_len=32, eos_token_id=None)
    result = unique_completions(engine, PROMPTS, trials=4, max_arrival_offset=0.002)
    assert result.max_distinct == 1 and result.num_deterministic == 6


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda records, sent: records[1:], "no record for 1 of"),
        (lambda records, sent: records + records[:1], "two records for"),
        (lambda records, sent: (dataclasses.replace(records[0], request_id="x"), *records[1:]), "which was not sent"),
        (lambda records, sent: (dataclasses.replace(records[0], output_token_ids=(1.5,)), *records[1:]),
         "not a sequence of ints"),
        (lambda records, sent: None, "not a RunResult with records"),
    ],
)  # fmt: skip
def test_an_engine_whose_records_do_not_answer_what_was_sent_is_an_error_naming_it(answer, message):
    class Wrong(BatchEngine):
        def run(self, requests, on_step=None, max_concurrency=None):
            result = super().run(requests)
            records = answer(result.records, requests)
            return None if records is None else dataclasses.replace(result, records=tuple(records))

    with pytest.raises(ValueError, match=message) as error:
        unique_completions(Wrong(by_prompt, name="wrong"), PROMPTS[:2], trials=2)
    assert "engine 'wrong', trial 0" in str(error.value)


@pytest.mark.parametrize(
    ("requests", "trials", "offset", "message"),
    [
        (PROMPTS, 1, 0.0, "trials must be an integer >= 2"),
        ((), 3, 0.0, "no requests"),
        (PROMPTS, 3, float("nan"), "max_arrival_offset must be finite"),
        (PROMPTS[:1] * 2, 3, 0.0, "appears twice"),
        ((Request("turn2", (1,), follows=FollowUp("r0", 0.0, 8)),), 3, 0.0, "later turn of a conversation"),
    ],
)
def test_unusable_arguments_are_refused_before_the_engine_runs(requests, trials, offset, message):
    engine = BatchEngine(by_prompt)
    with pytest.raises(ValueError, match=message):
        unique_completions(engine, requests, trials=trials, max_arrival_offset=offset)
    assert engine.batches == []
