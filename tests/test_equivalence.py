"""Batched engines compute exactly what unbatched greedy decoding computes.

The oracle runs the Hugging Face model one request at a time; the engines run
perfsuite's model runner over batches that requests join and leave. In
float64 on ``tiny-random`` every token must be equal. SmolLM2 runs in float32,
where a different batch shape can flip a genuine near-tie; the failure
message gives the reference's top-1/top-2 margin so a reader can tell.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import event, example, given, settings

from perfsuite.testing.greedy import assert_outputs_equal, find_divergences
from perfsuite.engine import Request, SamplingParams, inflight_engine
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.models import load_model
from perfsuite.testing import (
    FLOAT32_NEAR_TIE,
    Scenario,
    cached_reference,
    check_runner,
    drive,
    scenarios,
    shared_prefix_scenarios,
)
from smollm2 import load_smollm2_or_skip

TINY_MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    runner = ModelRunner(loaded.model)
    return loaded, runner, cached_reference(loaded)


def check_scenario(scenario: Scenario, loaded, runner, reference, max_seq_len, near_tie_tolerance=0.0):
    """Every engine's outputs against the reference; the near-ties and the paged engine's preemptions."""
    check = check_runner(
        runner, scenario, reference, eos_token_id=loaded.eos_token_id, max_seq_len=max_seq_len,
        near_tie_tolerance=near_tie_tolerance,
    )  # fmt: skip
    check.assert_passed()
    return check.near_ties, check.counters("paged").num_preemptions


def _scenario(
    *lengths, batch_size=3, prefill_batch_size=2, max_num_batched_tokens=16, arrival_steps=None, prompt_len=9,
    num_kv_blocks=None, kv_block_size=16,
):
    requests = tuple(
        Request(f"r{i}", tuple((7 * i + 3 * j) % 250 + 3 for j in range(prompt_len + i)), SamplingParams(n, ignore_eos=True))
        for i, n in enumerate(lengths)
    )
    return Scenario(
        requests=requests,
        arrival_steps=arrival_steps or tuple(0 for _ in lengths),
        batch_size=batch_size,
        prefill_batch_size=prefill_batch_size,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=num_kv_blocks,
        kv_block_size=kv_block_size,
    )


def test_tiny_random_float64_engines_equal_reference(tiny):
    """The property over static, slot in-flight and paged; most paged runs must preempt (the share is printed)."""
    loaded, runner, reference = tiny
    preempted = []

    # 150 examples, not the 200 the two-engine property ran: Hypothesis makes its largest scenarios last, and
    # examples 151-200 of three engines took ~4 minutes of this 2-core VM, where 150 take under one (the
    # two-engine property at 200: ~2 minutes).
    @settings(max_examples=150)
    @given(scenario=scenarios(vocab_size=320))
    @example(scenario=_scenario(5, 12, 3, 20, 7, batch_size=3, max_num_batched_tokens=4,
                                arrival_steps=(0, 0, 2, 5, 5), num_kv_blocks=8, kv_block_size=4))  # fmt: skip
    def engines_equal_reference(scenario):
        _, num_preemptions = check_scenario(scenario, loaded, runner, reference, TINY_MAX_SEQ_LEN)
        event(f"paged engine preempted: {'yes' if num_preemptions else 'no'}")
        preempted.append(num_preemptions > 0)

    engines_equal_reference()
    share = sum(preempted) / len(preempted)
    print(f"paged runs that preempted: {sum(preempted)} of {len(preempted)} ({share:.0%})")
    assert share >= 0.5, f"only {share:.0%} of the paged runs preempted; shrink the pools in perfsuite.testing.scenarios"


def test_prompts_through_sdpa_beside_prompts_read_in_place_equal_the_reference(tiny):
    """A runner whose prompt budget is 20 keys: a step's prompts go in place or to SDPA by their length and start
    (a chunk of 5 from position 0 reads 15 keys, one of 5 from 9 reads 60), so both paths, and steps that switch
    between them as chunks arrive, are held to the reference."""
    loaded, _, reference = tiny
    runner = ModelRunner(loaded.model, in_place_prefill_max_keys=20)

    @settings(max_examples=40)
    @given(scenario=scenarios(vocab_size=320))
    def engines_equal_reference(scenario):
        check_scenario(scenario, loaded, runner, reference, TINY_MAX_SEQ_LEN)

    engines_equal_reference()


def test_the_paged_engine_preempts_and_recomputes_yet_equals_the_reference(tiny):
    loaded, runner, reference = tiny
    # Four requests of 9-12 prompt tokens and 12-20 new ones in 8 blocks of 4 (32 tokens): they outgrow it
    # twice (three requests preempt once since admission keeps a watermark of free blocks).
    scenario = _scenario(12, 20, 16, 18, batch_size=3, max_num_batched_tokens=64, num_kv_blocks=8, kv_block_size=4)
    expected, margins = reference.outputs(scenario.requests)
    engine = scenario.paged_engine(runner, loaded.eos_token_id, TINY_MAX_SEQ_LEN)
    assert_outputs_equal("paged", expected, drive(engine, scenario), margins)
    counters = engine.result(0.0, 1.0).counters
    assert counters.num_preemptions >= 2 and counters.num_recomputed_tokens > 0
    assert counters.peak_kv_blocks_used == 8


def test_tiny_random_float64_prefix_caching_equals_reference(tiny):
    """The model runner under paged-prefix: a chunk starts after blocks another request computed, and attends to them.

    Only the prefix engine runs here (tests/test_prefix_equivalence.py runs the
    property over all four engines on the fake runner, with many more examples).
    """
    loaded, runner, reference = tiny
    hits = []

    @settings(max_examples=8)
    @given(scenario=shared_prefix_scenarios(vocab_size=320, max_requests=4, max_prompt_len=16, max_new_tokens=6))
    @example(scenario=dataclasses.replace(
        _scenario(6, 9, 4, prompt_len=12, max_num_batched_tokens=8, arrival_steps=(0, 1, 3), num_kv_blocks=12,
                  kv_block_size=4),
        requests=tuple(Request(f"r{i}", tuple(range(3, 15)) + (40 + i,) * i, SamplingParams(n, ignore_eos=True))
                       for i, n in enumerate((6, 9, 4))),
        prefix_caching=True,
    ))  # fmt: skip
    def prefix_engine_equals_reference(scenario):
        engine = scenario.paged_engine(runner, loaded.eos_token_id, TINY_MAX_SEQ_LEN, enable_prefix_caching=True)
        expected, margins = reference.outputs(scenario.requests)
        assert_outputs_equal("paged-prefix", expected, drive(engine, scenario), margins)
        hits.append(engine.result(0.0, 1.0).counters.num_prefix_cache_hit_tokens > 0)

    prefix_engine_equals_reference()
    print(f"paged-prefix runs that hit: {sum(hits)} of {len(hits)}")
    assert sum(hits) >= len(hits) // 3, f"only {sum(hits)} of {len(hits)} runs hit the prefix cache"


# -- mutants: the property must catch bugs in positions, masks and slots ------


class _PositionBug(ModelRunner):
    def _prepare(self, chunks, kv_cache):
        batch = super()._prepare(chunks, kv_cache)
        shifted = torch.where(batch.positions > 4, batch.positions + 1, batch.positions)
        return type(batch)(batch.input_ids, shifted.clamp(max=TINY_MAX_SEQ_LEN - 1), batch.token_slots,
                           batch.sample_index, batch.groups)


class _MaskBug(ModelRunner):
    """Every key visible to SDPA, stale ones too (built with in_place_prefill_max_keys=0, so prompts go to SDPA)."""

    def _attention_group(self, *args, **kwargs):
        group = super()._attention_group(*args, **kwargs)
        if group.mask is None:
            return group
        leaky = group.mask.clone()
        leaky[..., : group.max_key_len] |= torch.ones_like(leaky)  # every key visible, stale ones too
        return dataclasses.replace(group, mask=leaky)


class _CausalityBug(ModelRunner):
    """Each token the kernel reads in place sees its whole chunk, not its keys 0..its position (the in-place
    kernel's open mask)."""

    def _attention_group(self, *args, **kwargs):
        group = super()._attention_group(*args, **kwargs)
        if group.key_lengths is None:
            return group
        request = group.block_tables[:, 0]  # a request's first block (a slot cache: its slot's one-head block)
        longest = torch.zeros(int(request.max()) + 1, dtype=torch.long)
        longest = longest.scatter_reduce(0, request, group.key_lengths, "amax")
        return dataclasses.replace(group, key_lengths=longest[request])


class _SlotBug(ModelRunner):
    """Reads each row's keys from another row's slot: through the slot index (SDPA) and, where the kernel reads
    in place, through its one-head blocks (``_per_token_tables``)."""

    def _attention_group(self, *args, **kwargs):
        group = super()._attention_group(*args, **kwargs)
        if group.key_lengths is not None:  # [tokens * kv_heads, 1]: the tokens' order reversed, heads kept in order
            tables = group.block_tables.view(-1, self.decoder.heads.num_kv_heads).flip(0).reshape(-1, 1)
            return dataclasses.replace(group, block_tables=tables)
        if isinstance(group.slots, slice) or group.num_rows < 2:
            return group
        return dataclasses.replace(group, slots=group.slots.flip(0))


class _BlockTableBug(ModelRunner):
    """Walks each row's block table backwards, as an off-by-one in the table walk would misplace keys."""

    def _attention_group(self, plan, tensors, block_size, **kwargs):
        group = super()._attention_group(plan, tensors, block_size, **kwargs)
        return dataclasses.replace(group, block_tables=group.block_tables.flip(1))


SDPA_PROMPTS = {"in_place_prefill_max_keys": 0}  # every prompt group through SDPA and its mask


@pytest.mark.parametrize(
    ("mutant", "engine_kind", "runner_options"),
    [(_PositionBug, "inflight", {}), (_MaskBug, "inflight", SDPA_PROMPTS), (_CausalityBug, "inflight", {}),
     (_SlotBug, "inflight", {}), (_SlotBug, "inflight", SDPA_PROMPTS), (_MaskBug, "paged", SDPA_PROMPTS),
     (_CausalityBug, "paged", {}), (_BlockTableBug, "paged", {}), (_BlockTableBug, "paged", SDPA_PROMPTS)],
    ids=["positions", "mask", "in-place-causality", "slot-index", "slot-index-sdpa", "paged-mask",
         "paged-in-place-causality", "paged-block-table", "paged-block-table-sdpa"],
)  # fmt: skip
def test_a_runner_bug_breaks_the_property(tiny, mutant, engine_kind, runner_options):
    loaded, _, reference = tiny
    broken = mutant(loaded.model, **runner_options)
    # Slots 0 and 2 decode while slot 1 is free, so the decode group needs an index, not a slice.
    scenario = _scenario(14, 2, 14, 6, batch_size=3, prefill_batch_size=3, max_num_batched_tokens=64,
                         num_kv_blocks=8, kv_block_size=4)  # fmt: skip
    expected, margins = reference.outputs(scenario.requests)
    if engine_kind == "paged":
        engine = scenario.paged_engine(broken, loaded.eos_token_id, TINY_MAX_SEQ_LEN)
    else:
        engine = inflight_engine(broken, decode_batch_size=3, max_seq_len=TINY_MAX_SEQ_LEN,
                                 eos_token_id=loaded.eos_token_id, prefill_batch_size=3, max_num_batched_tokens=64)
    divergences = find_divergences("mutant", expected, drive(engine, scenario), margins)
    assert divergences, f"{mutant.__name__} went unnoticed"
    assert not all(d.is_near_tie(FLOAT32_NEAR_TIE) for d in divergences), "a real bug must not look like a near-tie"


# -- the real model -----------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_smollm2_or_skip()
    return loaded, ModelRunner(loaded.model), cached_reference(loaded)


@pytest.mark.slow
@settings(max_examples=8)
@given(scenario=scenarios(vocab_size=49152, max_requests=5, max_prompt_len=24, max_new_tokens=10, max_batch_size=4))
def test_smollm2_float32_engines_equal_reference(smollm2, scenario):
    loaded, runner, reference = smollm2
    near_ties, _ = check_scenario(scenario, loaded, runner, reference, 64, near_tie_tolerance=FLOAT32_NEAR_TIE)
    assert len(near_ties) <= 1, f"too many near-ties to be chance: {[d.describe() for d in near_ties]}"


@pytest.mark.slow
def test_smollm2_fun_fact_prompts_equal_reference(smollm2):
    loaded, runner, reference = smollm2
    prompt = tuple(loaded.tokenizer("Fun fact of the day: ")["input_ids"])
    requests = tuple(
        Request(f"fun-{n}", prompt, SamplingParams(n, ignore_eos=True)) for n in (3, 17, 9, 24, 1, 12)
    )
    scenario = Scenario(requests, (0, 0, 1, 3, 3, 8), batch_size=4, prefill_batch_size=2, max_num_batched_tokens=20)
    check_scenario(scenario, loaded, runner, reference, 64, near_tie_tolerance=FLOAT32_NEAR_TIE)


def test_ignoring_eos_never_changes_the_chosen_tokens(tiny):
    loaded, runner, reference = tiny
    prompt = tuple(range(40, 52))
    free_run = reference.decoder.generate(Request("free", prompt, SamplingParams(20, ignore_eos=True))).token_ids
    eos = free_run[5]  # pretend the sixth token is EOS
    first_eos = free_run.index(eos)
    requests = [
        Request("stops", prompt, SamplingParams(20)),
        Request("ignores", prompt, SamplingParams(20, ignore_eos=True)),
    ]
    result = inflight_engine(runner, decode_batch_size=2, max_seq_len=TINY_MAX_SEQ_LEN, eos_token_id=eos).run(requests)
    outputs = result.outputs()
    assert outputs["stops"] == free_run[: first_eos + 1]
    assert outputs["ignores"] == free_run, "EOS must stay a candidate: masking it would change greedy choices"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_cuda_engines_equal_reference():
    loaded = load_model("tiny-random", device="cuda", dtype="float64")
    runner = ModelRunner(loaded.model)
    reference = cached_reference(loaded)
    scenario = _scenario(5, 12, 3, 20, 7, batch_size=3, max_num_batched_tokens=4, arrival_steps=(0, 0, 2, 5, 5))
    check_scenario(scenario, loaded, runner, reference, TINY_MAX_SEQ_LEN)
