"""The public correctness kit, ``perfsuite.testing``, on its own: scenarios, checks and the ready tests.

Mostly on perfsuite's fake runner, whose unbatched reference is pure Python
(``fake_reference``), so a check's verdict is known exactly; the ready tests
themselves on tiny-random.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given, settings

from perfsuite.engine import Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.testing import (
    CachedReference,
    Scenario,
    check_engine,
    check_runner,
    equivalence_test,
    runner_equivalence_test,
    scenarios,
)

VOCAB_SIZE = 97
MAX_SEQ_LEN = 64


@dataclass(frozen=True)
class FakeOutput:
    token_ids: tuple[int, ...]
    top2_margins: tuple[float, ...]


class FakeDecoder:
    """Unbatched greedy decoding of the fake model; every margin 1.0, so no flip is a near-tie."""

    def __init__(self) -> None:
        self.num_decoded = 0

    def generate(self, request: Request) -> FakeOutput:
        self.num_decoded += 1
        tokens = fake_reference(request.prompt_token_ids, request.sampling_params, None, VOCAB_SIZE)
        return FakeOutput(tokens, (1.0,) * len(tokens))


class OffByOneRunner(FakeRunner):
    """A runner that samples one past the greedy token once a request has three outputs: a real bug."""

    def execute(self, output, kv_cache):
        sampled = super().execute(output, kv_cache)
        chunks = [chunk for chunk in output.chunks if chunk.samples]
        return [
            (token + 1) % VOCAB_SIZE if not chunk.is_prefill and chunk.start_position >= 8 else token
            for chunk, token in zip(chunks, sampled)
        ]


def staggered(**knobs) -> Scenario:
    requests = tuple(
        Request(f"r{i}", tuple(range(3 + i, 9 + 2 * i)), SamplingParams(4 + 3 * i, ignore_eos=True)) for i in range(4)
    )
    defaults = dict(batch_size=2, prefill_batch_size=1, max_num_batched_tokens=8, num_kv_blocks=8, kv_block_size=2)
    return Scenario(requests, (0, 0, 2, 5), **{**defaults, **knobs})


def test_a_scenario_reads_its_arrival_steps_as_seconds_and_its_knobs_as_an_engine_config():
    scenario = staggered()
    assert [request.arrival_time for request in scenario.timed_requests(0.5)] == [0.0, 0.0, 1.0, 2.5]
    assert scenario.max_total_tokens == max(request.max_total_tokens for request in scenario.requests)
    config = scenario.engine_config(MAX_SEQ_LEN)
    assert (config.batch_size, config.max_seq_len, config.prefill_batch_size) == (2, MAX_SEQ_LEN, 1)
    assert (config.max_num_batched_tokens, config.num_kv_blocks) == (8, 8)
    assert "r2: prompt [5, 6, 7, 8, 9, 10, 11, 12], 10 new tokens, EOS ignored, arrives at step 2" in scenario.describe()


def test_a_scenario_needs_one_arrival_step_per_request():
    with pytest.raises(ValueError, match="one arrival step per request: 4 requests, 3 arrival steps"):
        dataclasses.replace(staggered(), arrival_steps=(0, 0, 1))


@settings(max_examples=50)
@given(scenario=scenarios(vocab_size=8, max_requests=3, max_prompt_len=6, avoid_token_ids=(0, 5, 7)))
def test_scenarios_keep_within_their_sizes_and_away_from_the_tokens_to_avoid(scenario):
    assert 1 <= len(scenario.requests) <= 3 and len(scenario.arrival_steps) == len(scenario.requests)
    for request in scenario.requests:
        assert 1 <= request.num_prompt_tokens <= 6
        assert set(request.prompt_token_ids) <= {1, 2, 3, 4, 6}
    assert scenario.kv_block_size in (1, 2, 4)
    blocks_longest = -(-scenario.max_total_tokens // scenario.kv_block_size)
    assert blocks_longest <= scenario.num_kv_blocks <= blocks_longest + 1, "a pool the longest request just fits"


def test_the_cached_reference_decodes_each_prompt_once():
    decoder = FakeDecoder()
    reference = CachedReference(decoder)
    scenario = staggered()
    first, _ = reference.outputs(scenario.requests)
    again, margins = reference.outputs(scenario.timed_requests(1.0))
    assert first == again and decoder.num_decoded == len(scenario.requests)
    assert all(set(m) == {1.0} for m in margins.values())


def test_check_engine_runs_an_engine_or_builds_one_from_the_scenarios_knobs():
    reference = CachedReference(FakeDecoder())
    scenario = staggered()
    built = []

    def build(config):
        built.append(config)
        return inflight_engine(FakeRunner(VOCAB_SIZE), decode_batch_size=config.batch_size,
                               max_seq_len=config.max_seq_len, eos_token_id=None)  # fmt: skip

    check = check_engine(build, scenario, reference, max_seq_len=MAX_SEQ_LEN, seconds_per_step=0.001)
    assert check.passed and check.num_requests == 4 and check.engine_name == "inflight"
    assert built == [scenario.engine_config(MAX_SEQ_LEN)]
    engine = inflight_engine(OffByOneRunner(VOCAB_SIZE), decode_batch_size=2, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)
    broken = check_engine(engine, scenario, reference)
    assert not broken.passed and {d.request_id for d in broken.real_divergences} == {"r0", "r1", "r2", "r3"}
    with pytest.raises(AssertionError, match="request 'r0' diverges at output position"):
        broken.assert_passed()


def test_check_runner_serves_the_scenario_with_perfsuites_three_schedulers():
    reference = CachedReference(FakeDecoder())
    scenario = staggered(num_kv_blocks=23, kv_block_size=1, paged_batch_size=3)
    check = check_runner(FakeRunner(VOCAB_SIZE), scenario, reference, eos_token_id=None, max_seq_len=MAX_SEQ_LEN)
    assert check.passed and [run.check.engine_name for run in check.runs] == ["static", "inflight", "paged"]
    assert check.counters("paged").num_preemptions > 0, "23 one-token blocks hold the longest request (22 tokens) and little more"
    broken = check_runner(OffByOneRunner(VOCAB_SIZE), scenario, reference, eos_token_id=None)
    assert not broken.passed and all(not run.check.passed for run in broken.runs)
    with pytest.raises(AssertionError, match="outputs differ from the unbatched reference"):
        broken.assert_passed()
    with pytest.raises(KeyError, match="no 'vllm' run"):
        check.counters("vllm")


# -- the ready tests, on tiny-random -------------------------------------------------------------------------


def test_the_ready_engine_test_passes_perfsuites_inflight_engine():
    equivalence_test("inflight", max_examples=5)()


def test_the_ready_runner_test_passes_perfsuites_model_runner():
    from perfsuite.engine.model_runner import ModelRunner

    runner_equivalence_test(lambda loaded: ModelRunner(loaded.model), max_examples=5)()


def test_the_ready_test_fails_an_engine_that_is_not_an_engine():
    def not_an_engine(backend, config):
        return object()

    with pytest.raises(TypeError, match="not_an_engine"):
        equivalence_test(not_an_engine, max_examples=1)()
