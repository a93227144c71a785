"""A step's FLOPs and bytes (perfsuite.engine.work), proved against what the model runner actually computes.

The FLOPs against ``torch.utils.flop_counter.FlopCounterMode`` over
``ModelRunner.execute``, with SDPA on its math backend (whose products are
``bmm``s the counter sees; the CPU's fused kernel is not in its registry) and
the plain projections (``pack_weights=False``: the decode-sized oneDNN/MKL
kernels are ops the counter does not know). The one difference, explained and
bounded: the runner's attention computes each group's padded rectangle (rows
x longest query x longest context) and masks it, while the count is the causal
triangle the model needs; the rectangle is computed here from the runner's
grouping rule and the two must add up exactly. Norms are not matmuls: they
are checked by counting the elements ``rms_norm`` is called on.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from perfsuite.engine import layers
from perfsuite.engine.layer_ops import LayerOps
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput
from perfsuite.engine.work import NORM_FLOPS_PER_ELEMENT, ModelShape, chunk_work, step_work
from perfsuite.models.spec import RANDOM_CONFIGS

SHAPES = {
    "tiny-random": RANDOM_CONFIGS["tiny-random"],  # GQA 4 heads over 2
    "mha-tied": {**RANDOM_CONFIGS["tiny-random"], "num_key_value_heads": 4, "tie_word_embeddings": True},
    "gqa-8-over-2-head-dim-24": {
        **RANDOM_CONFIGS["tiny-random"], "hidden_size": 96, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 24, "intermediate_size": 160, "num_hidden_layers": 3, "vocab_size": 200,
    },
}  # fmt: skip
MAX_SEQ_LEN = 64


def chunk(slot: int, start: int, num_tokens: int, *, prefill: bool, samples: bool = True) -> ScheduledChunk:
    return ScheduledChunk(f"r{slot}", slot, tuple(range(3, 3 + num_tokens)), start, samples, prefill)


STEPS = {
    "prefill": (chunk(0, 0, 9, prefill=True), chunk(1, 0, 5, prefill=True)),
    "prefill-after-prefix-hit": (chunk(0, 16, 7, prefill=True),),  # 16 tokens came from the cache
    "decode-equal-contexts": tuple(chunk(slot, 20, 1, prefill=False) for slot in range(4)),
    "decode-ragged": (chunk(0, 3, 1, prefill=False), chunk(1, 30, 1, prefill=False), chunk(2, 11, 1, prefill=False)),
    "mixed-with-chunked-prefill": (
        chunk(0, 12, 1, prefill=False), chunk(1, 4, 1, prefill=False),
        chunk(2, 8, 6, prefill=True, samples=False),  # a chunk short of its prompt's end samples nothing
        chunk(3, 0, 3, prefill=True),
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(SHAPES))
def runner(request) -> ModelRunner:
    config = LlamaConfig(**SHAPES[request.param])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return ModelRunner(model, dtype=torch.float32, pack_weights=False, paged_attention=False)


def padded_attention_flops(chunks, shape: ModelShape) -> int:
    """What the runner's attention computes: per group (decode rows, prefill rows), rows x longest query x longest
    context, per query head, scores and values."""
    total = 0
    for group in ([c for c in chunks if c.num_tokens == 1], [c for c in chunks if c.num_tokens > 1]):
        if group:
            longest_query = max(c.num_tokens for c in group)
            longest_context = max(c.start_position + c.num_tokens for c in group)
            total += len(group) * longest_query * longest_context
    return shape.num_layers * 4 * shape.num_heads * shape.head_dim * total


def causal_attention_flops(chunks, shape: ModelShape) -> int:
    keys = sum(c.num_tokens * c.start_position + c.num_tokens * (c.num_tokens + 1) // 2 for c in chunks)
    return shape.num_layers * 4 * shape.num_heads * shape.head_dim * keys


def counted_flops(runner: ModelRunner, chunks) -> int:
    cache = runner.new_kv_cache(4, MAX_SEQ_LEN)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        runner.execute(SchedulerOutput(chunks, num_waiting=0), cache)
    return counter.get_total_flops()


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_matmul_flops_are_what_flop_counter_mode_counts_less_the_masked_attention(runner, step):
    chunks, shape = STEPS[step], runner.model_shape
    work = step_work(chunks, shape).total
    masked = padded_attention_flops(chunks, shape) - causal_attention_flops(chunks, shape)
    assert masked >= 0
    assert work.matmul_flops + masked == counted_flops(runner, chunks)


def test_a_decode_step_over_equal_contexts_is_counted_exactly_with_nothing_masked(runner):
    chunks = STEPS["decode-equal-contexts"]
    assert step_work(chunks, runner.model_shape).total.matmul_flops == counted_flops(runner, chunks)


def test_the_count_fails_when_the_lm_head_is_counted_over_every_row(runner):
    """The runner computes logits for the sampled rows only; counting them for the chunk that samples nothing
    would be off by exactly one lm head row."""
    chunks, shape = STEPS["mixed-with-chunked-prefill"], runner.model_shape
    every_row = sum(chunk_work(c.__class__(**{**_fields(c), "samples": True}), shape).matmul_flops for c in chunks)
    masked = padded_attention_flops(chunks, shape) - causal_attention_flops(chunks, shape)
    assert every_row + masked - counted_flops(runner, chunks) == 2 * shape.hidden_size * shape.vocab_size


def _fields(c: ScheduledChunk) -> dict:
    return {name: getattr(c, name) for name in c.__slots__}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_norm_flops_are_four_per_element_rms_norm_is_called_on(runner, step, monkeypatch):
    elements = []
    real = layers.rms_norm

    def counting(hidden, weight, eps):
        elements.append(hidden.numel())
        return real(hidden, weight, eps)

    monkeypatch.setattr(layers, "rms_norm", counting)
    real_fused, real_fused_add = LayerOps.rms_norm, LayerOps.add_rms_norm  # a float32 runner's fused norms
    monkeypatch.setattr(LayerOps, "rms_norm", lambda self, x, *a: elements.append(x.numel()) or real_fused(self, x, *a))
    monkeypatch.setattr(
        LayerOps, "add_rms_norm", lambda self, h, *a: elements.append(h.numel()) or real_fused_add(self, h, *a)
    )
    runner.execute(SchedulerOutput(STEPS[step], num_waiting=0), runner.new_kv_cache(4, MAX_SEQ_LEN))
    assert step_work(STEPS[step], runner.model_shape).total.norm_flops == NORM_FLOPS_PER_ELEMENT * sum(elements)


def test_the_weight_bytes_are_the_runners_weights_and_the_steps_embedding_rows(runner):
    decoder, chunks = runner.decoder, STEPS["mixed-with-chunked-prefill"]
    weights = [decoder.final_norm, decoder.lm_head.weight]
    for layer in decoder.layers:
        weights += [layer.input_norm, layer.post_norm, layer.qkv.weight, layer.out.weight, layer.gate_up.weight,
                    layer.down.weight]  # fmt: skip
    num_tokens = sum(c.num_tokens for c in chunks)
    expected = sum(w.nbytes for w in weights) + num_tokens * decoder.embed[0].nbytes
    assert step_work(chunks, runner.model_shape).total.weight_bytes_read == expected


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_parameters_are_the_models_with_a_tied_head_counted_once(name):
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[name]))
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert ModelShape.from_config(model.config, 4).num_parameters == sum(unique.values())


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_kv_bytes_written_are_the_cache_cells_the_step_changes(runner, step):
    cache = runner.new_kv_cache(4, MAX_SEQ_LEN)
    runner.execute(SchedulerOutput(STEPS[step], num_waiting=0), cache)
    changed = int((cache.keys != 0).sum() + (cache.values != 0).sum())
    assert step_work(STEPS[step], runner.model_shape).total.kv_bytes_written == changed * cache.keys.itemsize


@pytest.mark.parametrize("step", ["decode-equal-contexts", "prefill-after-prefix-hit"])
def test_the_kv_bytes_read_are_the_keys_and_values_attention_reads(runner, step, monkeypatch):
    """Where every row of a group has one context, the runner reads exactly the count's keys and values;
    elsewhere it reads its padded rectangle, at least the count."""
    from perfsuite.engine import model_runner

    read = []
    real = model_runner._group_keys

    def counting(*args):
        keys, values = real(*args)
        read.append(keys.nbytes + values.nbytes)
        return keys, values

    monkeypatch.setattr(model_runner, "_group_keys", counting)
    runner.execute(SchedulerOutput(STEPS[step], num_waiting=0), runner.new_kv_cache(4, MAX_SEQ_LEN))
    assert step_work(STEPS[step], runner.model_shape).total.kv_bytes_read == sum(read)


def test_a_mixed_steps_weights_are_split_by_tokens_and_add_up():
    shape = ModelShape.from_config(RANDOM_CONFIGS["tiny-random"], 4)
    work = step_work(STEPS["mixed-with-chunked-prefill"], shape)
    weights = shape.num_layers * shape.layer_weight_bytes + shape.head_weight_bytes + 11 * shape.hidden_size * 4
    assert work.prefill.weight_bytes_read + work.decode.weight_bytes_read == weights
    assert work.prefill.num_tokens == 9 and work.decode.num_tokens == 2
    assert work.decode.weight_bytes_read < work.prefill.weight_bytes_read


def test_padding_rows_are_not_work():
    shape = ModelShape.from_config(RANDOM_CONFIGS["tiny-random"], 4)
    real = chunk(0, 5, 1, prefill=False)
    padding = ScheduledChunk("gone", 1, (0,), 5, False, False, is_padding=True)
    assert step_work((real, padding), shape) == step_work((real,), shape)
