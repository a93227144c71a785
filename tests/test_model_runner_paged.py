"""The model runner's paged path, its one-copy step indices and its attention formulation (CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from perfsuite.engine import Request, SamplingParams, inflight_engine, paged_engine
from perfsuite.engine.layers import PagedKVCache, grouped_query_attention
from perfsuite.engine.model_runner import ModelRunner, _HostIndices
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput
from perfsuite.models import load_model


@pytest.fixture(scope="module")
def runner():
    return ModelRunner(load_model("tiny-random", dtype="float64").model)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "q_len"), [(9, 3, 1), (9, 3, 7), (4, 4, 5), (8, 1, 3)])
def test_folded_grouped_query_attention_equals_sdpa_with_enable_gqa(num_heads, num_kv_heads, q_len):
    generator = torch.Generator().manual_seed(num_heads * 10 + q_len)
    rows, num_keys, head_dim = 3, 11, 8
    queries = torch.randn(rows, q_len, num_heads, head_dim, generator=generator, dtype=torch.float64)
    keys = torch.randn(rows, num_kv_heads, num_keys, head_dim, generator=generator, dtype=torch.float64)
    values = torch.randn(rows, num_kv_heads, num_keys, head_dim, generator=generator, dtype=torch.float64)
    last = torch.tensor([4, 10, 7])  # each row sees keys up to its own position
    query_pos = (last[:, None] - torch.arange(q_len).flip(0)[None, :]).clamp(min=0)
    mask = (torch.arange(num_keys)[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
    expected = F.scaled_dot_product_attention(
        queries.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(grouped_query_attention(queries, keys, values, mask), expected)


def _steps(engine, requests):
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished_requests():
        output = engine.scheduler.schedule()
        yield output
        engine.scheduler.update_from_output(output, engine.runner.execute(output, engine.kv_cache))


@pytest.mark.parametrize("kind", ["inflight", "paged"])
def test_a_step_copies_its_indices_to_the_device_once(runner, kind, monkeypatch):
    requests = [Request(f"r{i}", tuple(range(3, 12 + 3 * i)), SamplingParams(4, ignore_eos=True)) for i in range(3)]
    if kind == "paged":
        engine = paged_engine(runner, decode_batch_size=3, max_seq_len=64, eos_token_id=None,
                              num_kv_blocks=6, kv_block_size=4)  # fmt: skip
    else:
        engine = inflight_engine(runner, decode_batch_size=3, max_seq_len=64, eos_token_id=None)
    made = []
    real_tensor = torch.tensor

    def counting_tensor(*args, **kwargs):
        made.append(args)
        return real_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counting_tensor)
    num_steps = 0
    for output in _steps(engine, requests):
        batch = engine.runner._prepare(output.chunks, engine.kv_cache)
        indices = [batch.input_ids, batch.positions, batch.token_slots, batch.sample_index]
        for group in batch.groups:
            indices += [t for t in (group.token_index, group.query_rows, group.query_cols, group.block_tables)
                        if t is not None]  # fmt: skip
            if isinstance(group.slots, torch.Tensor):
                indices.append(group.slots)
        assert len({t.untyped_storage().data_ptr() for t in indices}) == 1, "every index is a view of one buffer"
        num_steps += 1
    assert num_steps > 3
    assert len(made) == 2 * num_steps, "one host tensor per _prepare, two _prepare calls per step here"


def test_the_host_buffer_is_pinned_only_for_cuda(monkeypatch):
    indices = _HostIndices()
    indices.add([1, 2, 3])

    def refuse(_self):
        raise AssertionError("pinned for a CPU device")

    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    assert indices.host_tensor(torch.device("cpu")).tolist() == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_the_host_buffer_bound_for_cuda_is_pinned():
    indices = _HostIndices()
    indices.add([4, 5])
    assert indices.host_tensor(torch.device("cuda")).is_pinned()
    assert [t.tolist() for t in indices.upload(torch.device("cuda"))] == [[4, 5]]


def test_the_paged_cache_has_one_pool_per_layer(runner):
    cache = runner.new_paged_kv_cache(num_blocks=5, block_size=4)
    heads = runner.decoder.heads
    assert isinstance(cache, PagedKVCache)
    assert cache.keys.shape == (len(runner.decoder.layers), 5, 4, heads.num_kv_heads, heads.head_dim)
    assert (cache.num_blocks, cache.block_size) == (5, 4)
    keys, _ = cache.token_rows(0)
    assert keys.shape == (20, heads.num_kv_heads, heads.head_dim) and keys.data_ptr() == cache.keys[0].data_ptr()
    with pytest.raises(ValueError, match="num_blocks and block_size must be >= 1, got 0 and 4"):
        runner.new_paged_kv_cache(0, 4)


def test_a_chunk_past_its_blocks_is_refused_before_it_writes(runner):
    cache = runner.new_paged_kv_cache(num_blocks=4, block_size=4)
    chunk = ScheduledChunk("r", slot=0, token_ids=(5,) * 6, start_position=0, samples=True, is_prefill=True,
                           block_table=(2,))  # fmt: skip
    with pytest.raises(ValueError, match=r"'r' reaches position 6 beyond its 1 blocks of 4 tokens; the scheduler"):
        runner.execute(SchedulerOutput((chunk,), num_waiting=0), cache)
    assert not cache.keys.any(), "nothing written"


def test_keys_of_rows_gathers_whole_blocks_as_the_cells_they_hold():
    # The cell-by-cell gather it replaced: position p of a row sits in cell table[p // size] * size + p % size.
    from perfsuite.engine.layers import PagedKVCache

    layers, num_blocks, block_size, kv_heads, head_dim = 2, 7, 4, 3, 5
    shape = (layers, num_blocks, block_size, kv_heads, head_dim)
    pool = PagedKVCache(torch.randn(shape), torch.randn(shape))
    tables = torch.tensor([[5, 2, 0, 0], [1, 6, 3, 4]])  # row 0 owns 2 blocks, padded with block 0
    for num_keys in (1, 4, 6, 13, 16):
        keys, values = pool.keys_of_rows(1, tables, num_keys)
        assert keys.shape == values.shape == (2, kv_heads, num_keys, head_dim)
        positions = torch.arange(num_keys)
        cells = tables[:, positions // block_size] * block_size + positions % block_size
        k_cells, v_cells = pool.token_rows(1)
        assert torch.equal(keys, k_cells[cells].transpose(1, 2)) and torch.equal(values, v_cells[cells].transpose(1, 2))
