"""The paged engine's bucketed static-shape decode step computes what the packed path computes.

Its rows are padded to a bucket by repeating the first row, and its keys are
read through a fixed width masked by position. So three things must hold:
the paged engines still match unbatched greedy decoding token for token; a
step writes each scheduled request's cell and no other cell of the pool; and
under ``cuda-graph`` every bucket is captured once, at engine build, and a
step of ``n`` rows replays the bucket that holds ``n``. No GPU here: the
capture is replaced by a stand-in that replays the step over exactly the
buffers it was given (``_record``), everything else is the real code.

Mutants these tests kill: padding rows that point at block 0 instead of
repeating row 0 (they overwrite a cell of a request owning block 0); a mask
that lets a row see keys past its position (stale cells of its last block);
a bucket chosen below the number of rows (a request dropped from the step).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perfsuite.engine import Request, SamplingParams, ScheduledChunk, SchedulerOutput, paged_engine
from perfsuite.engine.decode_buckets import bucket_for, decode_buckets
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.engine.paged_decode import PagedDecodeStep
from perfsuite.models import load_model
from perfsuite.testing.greedy import assert_outputs_equal
from perfsuite.testing import Scenario, cached_reference, drive, scenarios

MAX_SEQ_LEN = 64
BLOCK_SIZE = 4


# -- buckets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [(1, (1,)), (3, (1, 2, 3)), (8, (1, 2, 4, 8)), (10, (1, 2, 4, 8, 10)), (32, (1, 2, 4, 8, 16, 24, 32))],
)
def test_buckets_are_powers_of_two_to_eight_then_multiples_of_eight_and_the_limit(max_num_seqs, expected):
    assert decode_buckets(max_num_seqs) == expected


@given(max_num_seqs=st.integers(1, 300), data=st.data())
def test_every_step_gets_the_smallest_bucket_that_holds_it(max_num_seqs, data):
    buckets = decode_buckets(max_num_seqs)
    num_rows = data.draw(st.integers(1, max_num_seqs))
    bucket = bucket_for(buckets, num_rows)
    assert num_rows <= bucket and bucket in buckets
    assert all(smaller < num_rows for smaller in buckets if smaller < bucket)
    assert bucket - num_rows < max(num_rows, 8), "padding is at most 7 rows past 8, less than the rows below"


def test_a_step_past_the_largest_bucket_and_bad_limits_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="33 rows is larger than the largest captured bucket, 32 .*at least 33"):
        bucket_for(decode_buckets(32), 33)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        decode_buckets(0)
    with pytest.raises(ValueError, match="at least one row, got 0"):
        bucket_for(decode_buckets(4), 0)


# -- the math on CPU -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return loaded, ModelRunner(loaded.model, decode_mode="static"), cached_reference(loaded)


def _request(index: int, prompt_len: int, max_new_tokens: int) -> Request:
    prompt = tuple((13 * index + 7 * j) % 250 + 3 for j in range(prompt_len))
    return Request(f"r{index}", prompt, SamplingParams(max_new_tokens, ignore_eos=True))


# Five requests in a pool of few blocks: decode steps of 1..5 rows (buckets 1, 2, 4 and 5, padded), blocks freed
# and reused by later requests; in a pool of 16 blocks, requests preempted and recomputed too.
FIVE_IN_A_SMALL_POOL = Scenario(
    requests=tuple(_request(i, 3 + 4 * i, 10 + 3 * i) for i in range(5)),
    arrival_steps=(0, 0, 1, 2, 3),
    batch_size=5,
    prefill_batch_size=2,
    max_num_batched_tokens=16,
    num_kv_blocks=24,
    kv_block_size=BLOCK_SIZE,
)
PREEMPTING = dataclasses.replace(FIVE_IN_A_SMALL_POOL, num_kv_blocks=16)


@settings(max_examples=15)
@given(scenario=scenarios(vocab_size=320))
@example(scenario=FIVE_IN_A_SMALL_POOL)
@example(scenario=PREEMPTING)
def test_paged_engines_with_the_bucketed_decode_step_equal_reference(tiny, scenario):
    # The paged engines only: the slot engines' static step is tests/test_static_decode.py's
    loaded, runner, reference = tiny
    expected, margins = reference.outputs(scenario.requests)
    for prefix_caching in (False, True):
        engine = scenario.paged_engine(runner, loaded.eos_token_id, MAX_SEQ_LEN, enable_prefix_caching=prefix_caching)
        assert_outputs_equal(engine.name, expected, drive(engine, scenario), margins, 0.0)


def test_the_paged_engine_decodes_through_its_bucketed_step_and_the_packed_runner_does_not(tiny):
    loaded, runner, reference = tiny
    engine = FIVE_IN_A_SMALL_POOL.paged_engine(runner, None, MAX_SEQ_LEN)
    drive(engine, FIVE_IN_A_SMALL_POOL)
    step = engine.kv_cache.decode_step
    assert isinstance(step, PagedDecodeStep) and step.num_steps > 20
    assert step.buckets == (1, 2, 4, 5) and step.max_blocks_per_seq == MAX_SEQ_LEN // BLOCK_SIZE
    packed = FIVE_IN_A_SMALL_POOL.paged_engine(ModelRunner(loaded.model), None, MAX_SEQ_LEN)
    assert packed.kv_cache.decode_step is None
    preempting = PREEMPTING.paged_engine(runner, None, MAX_SEQ_LEN)
    drive(preempting, PREEMPTING)
    assert preempting.result(0.0, 1.0).counters.num_preemptions > 0, "the example reaches preemption"


def _decode_chunks(tables: dict[str, tuple[int, ...]], positions: dict[str, int]) -> tuple[ScheduledChunk, ...]:
    return tuple(
        ScheduledChunk(request_id=rid, slot=row, token_ids=(17 + row,), start_position=positions[rid],
                       samples=True, is_prefill=False, block_table=tables[rid])
        for row, rid in enumerate(tables)
    )  # fmt: skip


# Three requests (bucket 4: one padding row); block 0 belongs to "c", whose cells the padding must not touch.
THREE_ROWS = _decode_chunks({"a": (3, 5), "b": (1,), "c": (0, 2, 4)}, {"a": 6, "b": 2, "c": 9})


def _run_step(runner: ModelRunner, chunks) -> tuple[list[int], torch.Tensor, object]:
    engine_pool = runner.new_paged_kv_cache(num_blocks=8, block_size=BLOCK_SIZE)
    pool = runner.with_paged_decode(engine_pool, max_num_seqs=4, max_seq_len=16)
    generator = torch.Generator().manual_seed(0)
    pool.keys.copy_(torch.randn(pool.keys.shape, generator=generator, dtype=pool.keys.dtype))
    pool.values.copy_(torch.randn(pool.values.shape, generator=generator, dtype=pool.values.dtype))
    before = pool.keys.clone()
    tokens = runner.execute(SchedulerOutput(chunks, num_waiting=0), pool)
    return tokens, before, pool


def _changed_cells(before: torch.Tensor, pool) -> set[int]:
    changed = (pool.keys != before).any(dim=4).any(dim=3).any(dim=0)  # [blocks, block_size]
    return set(changed.flatten().nonzero().flatten().tolist())


def test_a_padded_step_equals_the_packed_step_and_writes_only_its_requests_cells(tiny):
    loaded, static_runner, _ = tiny
    static_tokens, before, static_pool = _run_step(static_runner, THREE_ROWS)
    packed_tokens, _, packed_pool = _run_step(ModelRunner(loaded.model), THREE_ROWS)
    assert static_pool.decode_step.num_steps == 1 and packed_pool.decode_step is None
    assert static_tokens == packed_tokens
    written = {5 * BLOCK_SIZE + 2, 1 * BLOCK_SIZE + 2, 4 * BLOCK_SIZE + 1}  # a at 6, b at 2, c at 9
    assert _changed_cells(before, static_pool) == written
    torch.testing.assert_close(static_pool.keys, packed_pool.keys, rtol=0, atol=1e-12)
    torch.testing.assert_close(static_pool.values, packed_pool.values, rtol=0, atol=1e-12)


class _PaddingAtBlockZero(PagedDecodeStep):
    def row_inputs(self, chunks):
        rows = super().row_inputs(chunks)
        rows[len(chunks) :] = 0
        return rows


def test_the_cell_check_catches_padding_rows_that_write_block_zero(tiny):
    _, runner, _ = tiny
    tokens, before, pool = _run_step(runner, THREE_ROWS)
    padded = _PaddingAtBlockZero(runner.decoder, pool, max_num_seqs=4, max_blocks_per_seq=4)
    pool.keys.copy_(before)
    padded(THREE_ROWS)
    assert 0 in _changed_cells(before, pool), "the mutant writes cell 0, which belongs to request c"


def test_a_table_longer_than_the_engine_was_built_for_is_refused(tiny):
    _, runner, _ = tiny
    pool = runner.with_paged_decode(runner.new_paged_kv_cache(8, BLOCK_SIZE), max_num_seqs=2, max_seq_len=8)
    long_table = _decode_chunks({"a": (0, 1, 2)}, {"a": 9})
    with pytest.raises(ValueError, match="'a' holds 3 blocks, more than the 2 .*max_seq_len"):
        runner.execute(SchedulerOutput(long_table, num_waiting=0), pool)
    past_table = _decode_chunks({"a": (0,)}, {"a": 4})
    with pytest.raises(ValueError, match="'a' at position 4 is past its 1 blocks of 4 tokens"):
        runner.execute(SchedulerOutput(past_table, num_waiting=0), pool)


# -- capture, with a stand-in for the CUDA graph -------------------------------------


class _FakeGraph:
    """Replays ``forward`` over exactly the input buffer it was captured with, into its output buffer."""

    def __init__(self, step: PagedDecodeStep, inputs: torch.Tensor, pool) -> None:
        self.step, self.inputs, self.pool = step, inputs, pool
        self.next_tokens = step.forward(inputs)
        self.num_replays = 0

    def replay(self) -> None:
        self.next_tokens.copy_(self.step.forward(self.inputs))
        self.num_replays += 1


class _FakeCapture(PagedDecodeStep):
    captures: list[tuple[int, object]]

    @staticmethod
    def _can_capture_on(device):
        return True

    @staticmethod
    def _new_pool():
        return object()

    def _record(self, inputs, pool):
        type(self).captures.append((inputs.shape[0], pool))
        graph = _FakeGraph(self, inputs, pool)
        return graph, graph.next_tokens


def test_every_bucket_is_captured_once_at_build_largest_first_and_steps_replay_their_bucket(tiny, monkeypatch):
    loaded, _, reference = tiny
    monkeypatch.setattr("perfsuite.engine.model_runner.PagedDecodeStep", _FakeCapture)
    _FakeCapture.captures = []
    runner = ModelRunner(loaded.model, decode_mode="static")
    runner.static_decode.use_cuda_graph = True  # what cuda-graph mode sets; its slot step is not used here
    engine = FIVE_IN_A_SMALL_POOL.paged_engine(runner, None, MAX_SEQ_LEN)

    assert [rows for rows, _ in _FakeCapture.captures] == [5, 4, 2, 1], "at build, largest first"
    assert len({id(pool) for _, pool in _FakeCapture.captures}) == 1, "one memory pool shared by the buckets"
    step = engine.kv_cache.decode_step
    outputs = drive(engine, FIVE_IN_A_SMALL_POOL)
    assert len(_FakeCapture.captures) == 4, "nothing captured while requests run"
    replays = {rows: bucket.graph.num_replays for rows, bucket in step.captured.items()}
    assert sum(replays.values()) == step.num_steps and all(replays.values()), replays
    expected, margins = reference.outputs(FIVE_IN_A_SMALL_POOL.requests)
    assert outputs == expected


def test_cuda_graphs_off_cuda_are_refused(tiny):
    loaded, runner, _ = tiny
    pool = runner.new_paged_kv_cache(4, BLOCK_SIZE)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, the model is on cpu"):
        PagedDecodeStep(runner.decoder, pool, max_num_seqs=2, max_blocks_per_seq=2, use_cuda_graph=True)
