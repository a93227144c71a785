"""The static-shape decode step computes what the packed path computes.

It runs every slot's row whatever is scheduled, so two things must hold: the
engines still match unbatched greedy decoding token for token, and a row
whose slot is free or still prefilling leaves that slot's cache bit for bit
as it was. On CPU the step runs eagerly; on CUDA the same code is captured
as a graph, which the ``gpu`` test replays.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings

from perfsuite.testing.greedy import assert_outputs_equal
from perfsuite.engine import Request, SamplingParams, ScheduledChunk, SchedulerOutput, inflight_engine
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.engine.static_decode import StaticDecodeStep
from perfsuite.models import load_model
from perfsuite.testing import Scenario, cached_reference, check_runner, drive, scenarios

MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return loaded, ModelRunner(loaded.model, decode_mode="static"), cached_reference(loaded)


def _request(index: int, prompt_len: int, max_new_tokens: int) -> Request:
    prompt = tuple((11 * index + 5 * j) % 250 + 3 for j in range(prompt_len))
    return Request(f"r{index}", prompt, SamplingParams(max_new_tokens, ignore_eos=True))


# r1 finishes early and frees slot 1 between running slots 0 and 2; r3 then
# takes it and, with a budget of 3 tokens, prefills one token a step while the
# other two decode: decode-only steps meet a free middle slot and a slot whose
# prefill is half done. (The in-flight scheduler always gives a running prompt
# at least one token, so a prefilling slot left out of a decode-only step is
# checked one step at a time below.)
FREE_MIDDLE_SLOT_AND_CHUNKED_PREFILL = Scenario(
    requests=(_request(0, 6, 24), _request(1, 5, 2), _request(2, 7, 24), _request(3, 14, 6)),
    arrival_steps=(0, 0, 0, 12),
    batch_size=4,
    prefill_batch_size=1,
    max_num_batched_tokens=3,
)


def check_engines(scenario: Scenario, loaded, runner, reference) -> None:
    check_runner(runner, scenario, reference, eos_token_id=loaded.eos_token_id, max_seq_len=MAX_SEQ_LEN).assert_passed()


@settings(max_examples=40)
@given(scenario=scenarios(vocab_size=320))
@example(scenario=FREE_MIDDLE_SLOT_AND_CHUNKED_PREFILL)
def test_engines_with_static_decode_equal_reference(tiny, scenario):
    loaded, runner, reference = tiny
    check_engines(scenario, loaded, runner, reference)


class _StepRecorder:
    """Passes steps to a runner and notes what its decode-only steps held."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.scheduler = None
        self.free_middle_slot_seen = False
        self.one_token_prompt_chunk_seen = False

    def new_kv_cache(self, num_slots, max_seq_len):
        return self.runner.new_kv_cache(num_slots, max_seq_len)

    def execute(self, output, kv_cache):
        if StaticDecodeStep.handles(output.chunks):
            self._note(output.chunks)
        return self.runner.execute(output, kv_cache)

    def _note(self, chunks) -> None:
        scheduled = {chunk.slot for chunk in chunks}
        owned = set(self.scheduler.kv_cache.owners().values())
        self.free_middle_slot_seen |= any(
            slot not in owned for slot in range(min(scheduled), max(scheduled))
        )
        self.one_token_prompt_chunk_seen |= any(chunk.is_prefill and not chunk.samples for chunk in chunks)


def test_the_example_reaches_the_hard_cases(tiny):
    _, runner, _ = tiny
    recorder = _StepRecorder(runner)
    engine = inflight_engine(
        recorder, decode_batch_size=4, prefill_batch_size=1, max_num_batched_tokens=3,
        max_seq_len=MAX_SEQ_LEN, eos_token_id=None,
    )
    recorder.scheduler = engine.scheduler
    drive(engine, FREE_MIDDLE_SLOT_AND_CHUNKED_PREFILL)
    assert recorder.free_middle_slot_seen
    assert recorder.one_token_prompt_chunk_seen


# -- one step, checked against the packed path over the same cache -----------


def _decode_chunk(slot: int, token_id: int, position: int) -> ScheduledChunk:
    return ScheduledChunk(f"s{slot}", slot, (token_id,), position, samples=True, is_prefill=False)


def _garbage_cache(runner: ModelRunner, num_slots: int):
    """Random entries everywhere: what lies past a row's position must be masked, not zero."""
    kv_cache = runner.new_kv_cache(num_slots, MAX_SEQ_LEN)
    generator = torch.Generator().manual_seed(0)
    for tensor in (kv_cache.keys, kv_cache.values):
        tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    return kv_cache


def _changed_slots(before, after) -> set[int]:
    return {
        slot
        for slot in range(before.num_slots)
        if not (torch.equal(before.keys[:, slot], after.keys[:, slot])
                and torch.equal(before.values[:, slot], after.values[:, slot]))
    }


# Slots 0 and 3 decode; slot 1 (mid-prefill) and slot 2 (free) are left out.
SPARSE_DECODE = SchedulerOutput((_decode_chunk(3, 41, 17), _decode_chunk(0, 9, 5)), num_waiting=0)


def _run_step(runner: ModelRunner, output: SchedulerOutput):
    kv_cache = _garbage_cache(runner, num_slots=4)
    before = type(kv_cache)(kv_cache.keys.clone(), kv_cache.values.clone())
    return runner.execute(output, kv_cache), before, kv_cache


def test_a_static_step_equals_the_packed_step_and_leaves_other_slots_alone(tiny):
    loaded, static_runner, _ = tiny
    packed_runner = ModelRunner(loaded.model)
    static_tokens, before, static_cache = _run_step(static_runner, SPARSE_DECODE)
    packed_tokens, _, packed_cache = _run_step(packed_runner, SPARSE_DECODE)
    assert static_tokens == packed_tokens
    assert _changed_slots(before, static_cache) == {0, 3}
    torch.testing.assert_close(static_cache.keys, packed_cache.keys, rtol=0, atol=1e-12)
    torch.testing.assert_close(static_cache.values, packed_cache.values, rtol=0, atol=1e-12)


class _LeakyStore(StaticDecodeStep):
    """Writes every row's keys and values, scheduled or not."""

    @staticmethod
    def _store(cache, rows, positions, is_scheduled, new):
        cache[rows, :, positions] = new


def _runner_with(loaded, step_class) -> ModelRunner:
    runner = ModelRunner(loaded.model, decode_mode="static")
    runner.static_decode = step_class(runner.decoder)
    return runner


def test_the_slot_check_catches_a_leaking_write(tiny):
    loaded, _, _ = tiny
    _, before, after = _run_step(_runner_with(loaded, _LeakyStore), SPARSE_DECODE)
    assert _changed_slots(before, after) == {0, 1, 2, 3}


class _StaleKeyMask(StaticDecodeStep):
    """Lets each row see one key past its position: a stale one from the slot's last owner."""

    @staticmethod
    def _mask(positions, max_seq_len):
        return StaticDecodeStep._mask(positions + 1, max_seq_len)


def test_the_property_catches_a_mask_that_shows_stale_keys(tiny):
    loaded, _, reference = tiny
    with pytest.raises(AssertionError, match="diverges"):
        check_engines(FREE_MIDDLE_SLOT_AND_CHUNKED_PREFILL, loaded, _runner_with(loaded, _StaleKeyMask), reference)


def test_steps_with_a_longer_chunk_take_the_packed_path(tiny):
    _, runner, _ = tiny
    prefill = ScheduledChunk("p", 1, (3, 4, 5), 0, samples=True, is_prefill=True)
    assert StaticDecodeStep.handles(SPARSE_DECODE.chunks)
    assert not StaticDecodeStep.handles(SPARSE_DECODE.chunks + (prefill,))
    assert not StaticDecodeStep.handles(())


def test_decode_mode_is_checked(tiny):
    loaded, _, _ = tiny
    with pytest.raises(ValueError, match="unknown decode_mode 'graph'"):
        ModelRunner(loaded.model, decode_mode="graph")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
            ModelRunner(loaded.model, decode_mode="cuda-graph")


# -- CUDA graphs -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_cuda_graph_decode_equals_packed_and_captures_once_per_cache():
    loaded = load_model("tiny-random", device="cuda", dtype="float64")
    reference = cached_reference(loaded)
    scenario = FREE_MIDDLE_SLOT_AND_CHUNKED_PREFILL
    packed = ModelRunner(loaded.model)
    graphed = ModelRunner(loaded.model, decode_mode="cuda-graph")
    eos = loaded.eos_token_id
    expected, margins = reference.outputs(scenario.requests)
    num_slot_engines = 0
    for packed_engine, graphed_engine in zip(
        scenario.engines(packed, eos, MAX_SEQ_LEN), scenario.engines(graphed, eos, MAX_SEQ_LEN)
    ):
        packed_outputs = drive(packed_engine, scenario)
        graphed_outputs = drive(graphed_engine, scenario)
        assert graphed_outputs == packed_outputs
        assert_outputs_equal(graphed_engine.name, expected, graphed_outputs, margins, 0.0)
        paged_step = getattr(graphed_engine.kv_cache, "decode_step", None)
        if paged_step is None:  # a slot engine: one capture of the runner's slot step per engine's cache
            num_slot_engines += 1
        else:  # the paged engine: its pool's own step, every bucket captured at build and replayed
            assert sorted(paged_step.captured) == list(paged_step.buckets) and paged_step.num_steps > 0
        assert graphed.static_decode.num_captures == num_slot_engines, "one capture per slot engine's cache"
    assert num_slot_engines == 2, "static and in-flight"
