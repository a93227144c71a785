"""The in-place paged decode attention kernel computes what gathering the blocks and attending does.

Mutants it kills: a kernel that reads a row's keys from the wrong block or
offset, past its length, or with another KV head's keys (grouped-query
attention); a missing scale or max subtraction; a kernel that ignores q's
row stride; a bounds check that lets a bad block id or length through (or
refuses a good one); a runner that builds the kernel but never calls it, calls
it for prompts past their key budget or sends those within it to SDPA, or
splits a step it reads in place into groups; a build failure that is not
reported.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perfsuite.cache_dir import CACHE_DIR_ENV
from perfsuite.engine import Request, SamplingParams, model_runner
from perfsuite.engine.layers import PagedKVCache, grouped_query_attention
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.engine.paged_attention import BUILD_FIX, PagedAttention, Unavailable, build, load_paged_attention
from perfsuite.engine.reference import ReferenceDecoder
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput
from perfsuite.models import load_model
from perfsuite.testing.drive import drive
from perfsuite.testing.scenarios import Scenario
from own_engines import own_engine


def _kernel_or_skip() -> PagedAttention:
    kernel = load_paged_attention()
    if isinstance(kernel, Unavailable):
        pytest.skip(f"no in-place kernel here: {kernel.reason}")
    return kernel


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_kernel_builds_where_there_is_a_c_compiler():
    kernel = load_paged_attention()
    assert isinstance(kernel, PagedAttention), kernel


@st.composite
def paged_cases(draw):
    num_kv_heads = draw(st.integers(1, 3))
    group = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([1, 3, 8, 17, 64, 128]))  # 64 and 128 have kernels of their own
    block_size = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    width = max(-(-length // block_size) for length in lengths) + draw(st.integers(0, 2))  # padded tables
    num_blocks = len(lengths) * width + draw(st.integers(0, 5))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    return num_kv_heads, group, head_dim, block_size, lengths, width, num_blocks, dtype, seed


def _tensors(num_kv_heads, group, head_dim, block_size, lengths, width, num_blocks, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    shape = (1, num_blocks, block_size, num_kv_heads, head_dim)
    pool = PagedKVCache(torch.randn(shape, generator=generator, dtype=dtype),
                        torch.randn(shape, generator=generator, dtype=dtype))  # fmt: skip
    rows, num_heads = len(lengths), num_kv_heads * group
    # Each row's blocks scattered through the pool, never shared; the padding points at any block.
    tables = torch.randperm(num_blocks, generator=generator)[: rows * width].view(rows, width).contiguous()
    # q as the model gives it: a split of a wider tensor, so its rows are strided.
    wide = torch.randn(rows, num_heads + num_kv_heads, head_dim, generator=generator, dtype=dtype)
    q = wide[:, :num_heads]
    return pool, tables, torch.tensor(lengths), q


def _gathered_attention(pool: PagedKVCache, tables, lengths, q) -> torch.Tensor:
    num_keys = int(lengths.max())
    keys, values = pool.keys_of_rows(0, tables, num_keys)
    mask = (torch.arange(num_keys)[None, :] < lengths[:, None])[:, None, None, :]
    return grouped_query_attention(q.unsqueeze(1), keys, values, mask).squeeze(1)


@settings(max_examples=150, deadline=None)
@given(case=paged_cases())
@example(case=(3, 3, 64, 16, [257, 1, 40], 17, 60, torch.float32, 0))  # SmolLM2's heads, a long and a 1-key row
@example(case=(1, 1, 1, 1, [1], 1, 1, torch.float64, 0))
def test_in_place_attention_equals_gathering_the_blocks(case):
    kernel = _kernel_or_skip()
    pool, tables, lengths, q = _tensors(*case)
    keys, values = pool.layer_pools(0)
    before = keys.clone(), values.clone()
    got = kernel(q, keys, values, tables, lengths)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if q.dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(got, _gathered_attention(pool, tables, lengths, q), **tolerance)
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1]), "the pool is only read"


@pytest.mark.parametrize(
    ("lengths", "table_fix", "message"),
    [
        ([0, 5], None, "key count is below 1"),
        ([5, 13], None, "past its block table"),  # 13 keys in 3 blocks of 4
        ([5, 9], (1, 2, 99), "block id is outside the pool"),
        ([5, 9], (1, 2, -1), "block id is outside the pool"),
    ],
)
def test_a_row_past_its_blocks_is_refused_not_read(lengths, table_fix, message):
    kernel = _kernel_or_skip()
    pool, tables, _, q = _tensors(2, 2, 8, 4, [9, 9], 3, 8, torch.float32, 1)
    if table_fix is not None:
        row, column, block = table_fix
        tables[row, column] = block
    with pytest.raises(ValueError, match=message) as refused:
        kernel(q, *pool.layer_pools(0), tables, torch.tensor(lengths))
    assert "the scheduler must give each row the blocks its keys fill" in str(refused.value)


def test_a_block_past_a_rows_length_is_never_read():
    """Padding columns of a table may hold any id (the runner pads with 0); only the blocks a row's keys fill count."""
    kernel = _kernel_or_skip()
    pool, tables, lengths, q = _tensors(2, 2, 8, 4, [5, 9], 4, 12, torch.float32, 2)
    expected = kernel(q, *pool.layer_pools(0), tables, lengths)
    tables[0, 2:] = 10**9  # row 0's 5 keys fill blocks 0 and 1
    torch.testing.assert_close(kernel(q, *pool.layer_pools(0), tables, lengths), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "spoil",
    ["int32 tables", "float16 pool", "heads not a multiple", "strided heads"],
)
def test_inputs_the_kernel_cannot_read_are_refused_with_what_it_needs(spoil):
    kernel = _kernel_or_skip()
    pool, tables, lengths, q = _tensors(2, 2, 8, 4, [5, 9], 3, 8, torch.float32, 3)
    keys, values = pool.layer_pools(0)
    if spoil == "int32 tables":
        tables = tables.int()
    elif spoil == "float16 pool":
        keys, values = keys.half(), values.half()
    elif spoil == "heads not a multiple":
        q = q[:, :3]
    else:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match="paged decode attention needs"):
        kernel(q, keys, values, tables, lengths)


def test_a_compiler_that_fails_is_reported_not_raised(tmp_path):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: error: no such flag' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = build(str(failing))
    assert isinstance(result, Unavailable)
    assert "could not build paged_attention.c" in result.reason and "no such flag" in result.reason
    missing = build(str(tmp_path / "no-such-compiler"))
    assert isinstance(missing, Unavailable) and "could not run" in missing.reason


def test_a_cc_with_an_unclosed_quote_is_reported_not_raised():
    result = build("gcc -DFOO'")
    assert isinstance(result, Unavailable)
    assert result.reason.startswith('CC="gcc -DFOO\'" is not a command line: No closing quotation')
    assert result.fix == BUILD_FIX


def test_a_runner_whose_compiler_fails_gathers_and_says_why_and_the_fix(tiny, monkeypatch):
    loaded, _ = tiny
    monkeypatch.setenv("CC", "/bin/false")
    load_paged_attention.cache_clear()
    try:
        runner = ModelRunner(loaded.model)
        assert runner.paged_attention.startswith("gather: /bin/false could not build paged_attention.c")
        assert runner.paged_attention_fallback.startswith("/bin/false could not build paged_attention.c")
        assert runner.paged_attention_fallback.endswith(f"; {BUILD_FIX}")
        engine = own_engine("paged", runner, batch_size=2, max_seq_len=64, eos_token_id=None)
        assert engine.attention == "gather" and engine.attention_fallback == runner.paged_attention_fallback
    finally:
        load_paged_attention.cache_clear()  # the next test builds with the real compiler again
    chose_to_gather = ModelRunner(loaded.model, paged_attention=False)
    assert chose_to_gather.paged_attention_fallback is None, "nothing to fix"
    inflight = own_engine("inflight", runner, batch_size=2, max_seq_len=64, eos_token_id=None)
    assert inflight.attention == "gather", "a slot engine's decode reads its slots in place too, where it can"
    assert inflight.attention_fallback == runner.paged_attention_fallback


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_a_compiler_given_as_a_command_line_builds(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))  # a wrapper of its own: its build is kept here
    wrapper = tmp_path / "wrap"
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')  # as ccache or distcc would: the real compiler is its argument
    wrapper.chmod(0o755)
    assert isinstance(build(f"{wrapper} gcc"), PagedAttention)


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return loaded, ModelRunner(loaded.model)


def test_the_paged_engine_decodes_through_the_kernel_and_equals_unbatched_greedy(tiny, monkeypatch):
    loaded, runner = tiny
    _kernel_or_skip()
    assert runner.paged_attention == "in place"
    rows_per_call = []
    real_call = PagedAttention.__call__

    def counting_call(self, q, *args):
        rows_per_call.append(q.shape[0])
        return real_call(self, q, *args)

    monkeypatch.setattr(PagedAttention, "__call__", counting_call)
    requests = [Request(f"r{i}", tuple(range(3 + i, 14 + 3 * i)), SamplingParams(6 + i, ignore_eos=True))
                for i in range(4)]  # fmt: skip
    # 10 blocks of 4 for four requests of up to 33 tokens, the last arriving late: blocks are freed and reused,
    # so tables scatter.
    scenario = Scenario(tuple(requests), arrival_steps=(0, 0, 1, 6), batch_size=3, prefill_batch_size=2,
                        max_num_batched_tokens=16, num_kv_blocks=10, kv_block_size=4)  # fmt: skip
    outputs = drive(scenario.paged_engine(runner, None, 64), scenario)
    reference = ReferenceDecoder(loaded.model, eos_token_id=None)
    for request in requests:
        assert outputs[request.request_id] == reference.generate(request).token_ids, request.request_id
    layers = len(runner.decoder.layers)
    assert rows_per_call and len(rows_per_call) % layers == 0, "every layer of a decode step"
    assert max(rows_per_call) > 1, "decode rows batched into one call"


def _prompt_step(runner, prompt_lens, decode_positions, paged):
    """One step of prompts of ``prompt_lens`` tokens (from position 0) beside decode tokens at ``decode_positions``,
    over a fresh cache; its sampled tokens."""
    chunks, rows = [], len(prompt_lens) + len(decode_positions)
    pool = runner.new_paged_kv_cache(rows * 4, 8) if paged else runner.new_kv_cache(rows, 32)
    lengths = [(n, 0) for n in prompt_lens] + [(1, p) for p in decode_positions]
    for row, (num_tokens, start) in enumerate(lengths):
        tokens = tuple(3 + (5 * row + j) % 200 for j in range(num_tokens))
        table = tuple(range(4 * row, 4 * row + 4)) if paged else ()
        chunks.append(ScheduledChunk(f"r{row}", row, tokens, start, samples=True, is_prefill=start == 0,
                                     block_table=table))  # fmt: skip
    return runner.execute(SchedulerOutput(tuple(chunks), num_waiting=0), pool)


@pytest.mark.parametrize("paged", [True, False], ids=["pool", "slots"])
@pytest.mark.parametrize(("prompt_lens", "decode_positions"), [((5, 3), ()), ((4, 6, 2), (7, 12)), ((9,), (3,))])
def test_prompts_within_their_key_budget_are_read_in_place_with_the_decode_tokens(tiny, monkeypatch, paged,
                                                                                 prompt_lens, decode_positions):
    """The budget is the keys the prompts' tokens read in all (n (n + 1) / 2 for a prompt of n from position 0).
    Within it, a step is one kernel call a layer over every token in order; one key past it, the prompts go to SDPA
    (the decode tokens stay in place); and both give the same tokens."""
    loaded, _ = tiny
    _kernel_or_skip()
    keys_read = sum(n * (n + 1) // 2 for n in prompt_lens)
    num_tokens, layers = sum(prompt_lens) + len(decode_positions), len(loaded.model.model.layers)
    kernel_rows, sdpa_calls = [], []
    real_call = PagedAttention.__call__
    real_sdpa = model_runner.grouped_query_attention
    monkeypatch.setattr(PagedAttention, "__call__", lambda self, q, *a: kernel_rows.append(q.shape[0]) or
                        real_call(self, q, *a))  # fmt: skip
    monkeypatch.setattr(model_runner, "grouped_query_attention", lambda *a: sdpa_calls.append(1) or real_sdpa(*a))
    tokens = {}
    for budget in (keys_read, keys_read - 1, 10**9, 0):
        kernel_rows.clear(), sdpa_calls.clear()
        runner = ModelRunner(loaded.model, in_place_prefill_max_keys=budget)
        heads = runner.decoder.heads
        rows_per_token = 1 if paged else heads.num_kv_heads
        tokens[budget] = _prompt_step(runner, prompt_lens, decode_positions, paged)
        if budget >= keys_read:
            assert kernel_rows == [num_tokens * rows_per_token] * layers and not sdpa_calls, budget
        else:
            assert sdpa_calls == [1] * layers, budget
            assert kernel_rows == [len(decode_positions) * rows_per_token] * layers * bool(decode_positions), budget
    assert tokens[keys_read] == tokens[keys_read - 1] == tokens[10**9] == tokens[0]


def test_a_negative_prompt_key_budget_is_refused_with_what_zero_means(tiny):
    loaded, _ = tiny
    with pytest.raises(ValueError, match=r"in_place_prefill_max_keys must be 0 or more \(0 sends every prompt to SDPA\), got -1"):
        ModelRunner(loaded.model, in_place_prefill_max_keys=-1)


def test_a_runner_told_not_to_gathers_and_says_so(tiny):
    loaded, _ = tiny
    runner = ModelRunner(loaded.model, paged_attention=False)
    assert runner.paged_attention == "gather: turned off (paged_attention=False)"
    float16 = ModelRunner(load_model("tiny-random", dtype="float16").model)
    assert float16.paged_attention.startswith("gather: the kernel is for float32 and float64 on the CPU")


def test_a_paged_engine_says_which_attention_it_measured_and_a_slot_engine_only_a_gather(tiny):
    loaded, _ = tiny
    in_place, gathering = ModelRunner(loaded.model), ModelRunner(loaded.model, paged_attention=False)
    assert own_engine("paged", in_place, batch_size=2, max_seq_len=64, eos_token_id=None).attention == "in place"
    assert own_engine("paged", gathering, batch_size=2, max_seq_len=64, eos_token_id=None).attention == "gather"
    assert own_engine("inflight", in_place, batch_size=2, max_seq_len=64, eos_token_id=None).attention is None
    assert own_engine("inflight", gathering, batch_size=2, max_seq_len=64, eos_token_id=None).attention == "gather"


@pytest.mark.parametrize("kind", ["inflight", "static"])
def test_a_slot_engine_decodes_through_the_kernel_and_equals_unbatched_greedy(tiny, kind, monkeypatch):
    """Its decode group reads each slot's KV head as a block of its own (``_slot_decode_tables``)."""
    loaded, runner = tiny
    _kernel_or_skip()
    calls = []
    real_call = PagedAttention.__call__

    def counting_call(self, q, keys, values, tables, lengths):
        calls.append((q.shape[0], keys.shape[1], tables.shape[1]))
        return real_call(self, q, keys, values, tables, lengths)

    monkeypatch.setattr(PagedAttention, "__call__", counting_call)
    requests = [Request(f"r{i}", tuple(range(3 + i, 9 + 2 * i)), SamplingParams(5 + 2 * i, ignore_eos=True))
                for i in range(4)]  # fmt: skip
    scenario = Scenario(tuple(requests), arrival_steps=(0, 0, 1, 4), batch_size=3, prefill_batch_size=2,
                        max_num_batched_tokens=16)  # fmt: skip
    static, inflight, *_ = scenario.engines(runner, None, 40)
    outputs = drive(inflight if kind == "inflight" else static, scenario)
    reference = ReferenceDecoder(loaded.model, eos_token_id=None)
    for request in requests:
        assert outputs[request.request_id] == reference.generate(request).token_ids, request.request_id
    num_kv_heads = runner.decoder.heads.num_kv_heads
    assert calls and all(width == 1 and block == 40 for _, block, width in calls), "a slot's head: one block"
    assert max(rows for rows, _, _ in calls) >= 2 * num_kv_heads, "decode rows batched into one call"


@settings(max_examples=30)
@given(
    tokens=st.integers(0, 6),
    num_kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([1, 8, 64]),
    paged=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_store_writes_what_torchs_indexed_store_writes(tokens, num_kv_heads, head_dim, paged, dtype, seed):
    """A pool's cells or a slot cache's (slot, position), each token's heads from strided rows of a fused projection."""
    kernel = _kernel_or_skip()
    generator = torch.Generator().manual_seed(seed)
    width = 2 * num_kv_heads * head_dim + 3  # k and v split from wider rows, as from the fused QKV
    fused = torch.randn(tokens, width, generator=generator, dtype=dtype)
    k = fused[:, : num_kv_heads * head_dim].view(tokens, num_kv_heads, head_dim)
    v = fused[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(tokens, num_kv_heads, head_dim)
    if paged:
        shape, cells = (12, num_kv_heads, head_dim), torch.randperm(12, generator=generator)[:tokens]
        offsets, head_stride = cells * num_kv_heads * head_dim, head_dim
    else:
        slots, max_seq_len = 3, 5
        shape = (slots, num_kv_heads, max_seq_len, head_dim)
        cells = torch.randperm(slots * max_seq_len, generator=generator)[:tokens]
        slot, position = cells // max_seq_len, cells % max_seq_len
        offsets = (slot * num_kv_heads * max_seq_len + position) * head_dim
        head_stride = max_seq_len * head_dim
    k_cache, v_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    if paged:
        expected_k[cells], expected_v[cells] = k, v
    else:
        expected_k[slot, :, position], expected_v[slot, :, position] = k, v
    kernel.store(k_cache, v_cache, k, v, offsets.contiguous(), head_stride)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_store_refuses_an_offset_outside_the_cache_and_writes_nothing():
    kernel = _kernel_or_skip()
    k_cache, v_cache = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    k = v = torch.ones(2, 2, 8)
    for bad in (3 * 16 + 1, -16):  # the last cell's second head would end past the cache; before it
        with pytest.raises(ValueError, match=f"refused offsets \\[0, {bad}\\] \\(head stride 8\\).*nothing was written"):
            kernel.store(k_cache, v_cache, k, v, torch.tensor([0, bad]), 8)
        assert not k_cache.any() and not v_cache.any()
    kernel.store(k_cache, v_cache, k, v, torch.tensor([0, 3 * 16]), 8)  # the last cell exactly: allowed
    assert k_cache[3].eq(1).all() and k_cache[0].eq(1).all() and not k_cache[1:3].any()
    with pytest.raises(ValueError, match="storing keys and values needs"):
        kernel.store(k_cache, v_cache.double(), k, v, torch.tensor([0, 16]), 8)
    with pytest.raises(ValueError, match="storing keys and values needs"):
        kernel.store(k_cache, v_cache, k, v, torch.tensor([0, 16], dtype=torch.int32), 8)


def test_a_runner_with_the_kernel_stores_every_layers_keys_through_it(tiny, monkeypatch):
    loaded, runner = tiny
    _kernel_or_skip()
    stored = []
    real_store = PagedAttention.store

    def counting_store(self, k_cache, v_cache, k, v, offsets, head_stride):
        stored.append(k.shape[0])
        return real_store(self, k_cache, v_cache, k, v, offsets, head_stride)

    monkeypatch.setattr(PagedAttention, "store", counting_store)
    request = Request("r", tuple(range(3, 12)), SamplingParams(4, ignore_eos=True))
    scenario = Scenario((request,), arrival_steps=(0,), batch_size=1, prefill_batch_size=1, max_num_batched_tokens=16)
    reference = ReferenceDecoder(loaded.model, eos_token_id=None).generate(request).token_ids
    for kind in ("paged", "inflight"):
        stored.clear()
        engine = own_engine(kind, runner, batch_size=1, max_seq_len=32, eos_token_id=None)
        assert drive(engine, scenario)["r"] == reference, kind
        assert stored == [9] * len(runner.decoder.layers) + [1] * 3 * len(runner.decoder.layers), kind
