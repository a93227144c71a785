"""What one equivalence check serves: requests, when they arrive, and the batch and KV knobs.

A ``Scenario`` is plain data. Its arrivals are counted in engine steps, the
clock of a step-driven engine (``perfsuite.testing.drive``); an engine that
only has ``BatchingEngine.run`` reads the same arrivals as seconds through
``timed_requests``, so one drawn scenario serves both and shrinks the same way.

``scenarios(...)`` is the Hypothesis strategy. Its sizes are parameters with
defaults that suit a small model on a CPU; the draws it makes, and their order,
are what perfsuite's own equivalence tests were tuned on (example counts,
preemption share, run time), so new knobs only draw when asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from hypothesis import strategies as st

from perfsuite.adapters.protocol import EngineConfig
from perfsuite.engine import Engine, Request, SamplingParams, inflight_engine, paged_engine, static_engine

if TYPE_CHECKING:
    from perfsuite.engine.engine import Runner

# With blocks of 16 in the mix, 29% of runs of perfsuite's paged engine preempted; with 1, 2 and 4, about
# 60%. The block-table walk does not depend on the block size beyond p // block_size.
DEFAULT_KV_BLOCK_SIZES = (1, 2, 4)


@dataclass(frozen=True)
class Scenario:
    """Requests, the step each one arrives at, and the knobs of the engines that serve them.

    ``batch_size`` is the static batch and the in-flight ``decode_batch_size``;
    ``num_kv_blocks`` blocks of ``kv_block_size`` tokens are the paged engine's
    pool (None: as much as the slot engines' cache) and ``paged_batch_size`` its
    ``decode_batch_size`` (None: ``batch_size``). With ``prefix_caching`` the
    paged engine with prefix caching (``paged-prefix``) serves them too, over
    the same pool.
    """

    requests: tuple[Request, ...]
    arrival_steps: tuple[int, ...]
    batch_size: int
    prefill_batch_size: int
    max_num_batched_tokens: int
    num_kv_blocks: int | None = None
    kv_block_size: int = 16
    paged_batch_size: int | None = None
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        if len(self.arrival_steps) != len(self.requests):
            raise ValueError(
                f"a scenario needs one arrival step per request: {len(self.requests)} requests, "
                f"{len(self.arrival_steps)} arrival steps"
            )

    @property
    def max_total_tokens(self) -> int:
        """The longest prompt + output of its requests: the least ``max_seq_len`` that serves them."""
        return max(request.max_total_tokens for request in self.requests)

    def timed_requests(self, seconds_per_step: float) -> tuple[Request, ...]:
        """The requests with ``arrival_time`` = arrival step x ``seconds_per_step``, for ``BatchingEngine.run``."""
        return tuple(
            dataclasses.replace(request, arrival_time=step * seconds_per_step)
            for request, step in zip(self.requests, self.arrival_steps, strict=True)
        )

    def engine_config(self, max_seq_len: int) -> EngineConfig:
        """The knobs as a registered engine's factory takes them.

        The pool is ``num_kv_blocks`` blocks of ``kv_block_size`` tokens, the
        scenario's own, so a paged engine that honours ``kv_block_size`` (perfsuite's
        does) gets the pool the scenario meant and preempts where it should.
        """
        return EngineConfig(
            self.batch_size,
            max_seq_len,
            self.prefill_batch_size,
            self.max_num_batched_tokens,
            self.num_kv_blocks,
            kv_block_size=self.kv_block_size,
        )

    def engines(self, runner: Runner, eos_token_id: int | None, max_seq_len: int) -> Iterator[Engine]:
        """perfsuite's static, in-flight and paged engines over ``runner`` (and ``paged-prefix``), with its knobs."""
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
        if self.prefix_caching:
            yield self.paged_engine(runner, eos_token_id, max_seq_len, enable_prefix_caching=True)

    def paged_engine(
        self, runner: Runner, eos_token_id: int | None, max_seq_len: int, enable_prefix_caching: bool = False
    ) -> Engine:
        return paged_engine(
            runner,
            decode_batch_size=self.paged_batch_size or self.batch_size,
            prefill_batch_size=self.prefill_batch_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_seq_len=max_seq_len,
            eos_token_id=eos_token_id,
            num_kv_blocks=self.num_kv_blocks,
            kv_block_size=self.kv_block_size,
            enable_prefix_caching=enable_prefix_caching,
        )

    def describe(self) -> str:
        """One line per request (prompt length, new tokens, arrival step) under the knobs: a counterexample to read."""
        pool = "as the slot cache" if self.num_kv_blocks is None else f"{self.num_kv_blocks} x {self.kv_block_size}"
        lines = [
            f"{_count(len(self.requests), 'request')}; batch {self.batch_size}, prefill batch "
            f"{self.prefill_batch_size}, {_count(self.max_num_batched_tokens, 'token')} a step, paged pool {pool} tokens"
        ]
        for request, step in zip(self.requests, self.arrival_steps, strict=True):
            params = request.sampling_params
            eos = ", EOS ignored" if params.ignore_eos else ""
            lines.append(
                f"  {request.request_id}: prompt {list(request.prompt_token_ids)}, "
                f"{_count(params.max_new_tokens, 'new token')}{eos}, arrives at step {step}"
            )
        return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


@st.composite
def scenarios(
    draw: st.DrawFn,
    vocab_size: int,
    max_requests: int = 12,
    max_prompt_len: int = 40,
    max_new_tokens: int = 24,
    max_batch_size: int = 6,
    kv_block_sizes: Sequence[int] = DEFAULT_KV_BLOCK_SIZES,
    avoid_token_ids: Collection[int] = (),
    min_requests: int = 1,
) -> Scenario:
    """Scenarios of ``min_requests``..``max_requests`` requests over token ids ``0..vocab_size-1``.

    Each request has a prompt of 1..``max_prompt_len`` tokens, asks for
    1..``max_new_tokens`` (EOS ignored or not) and arrives at a step in
    0..2 x ``max_new_tokens``, so some join a batch that is decoding. The batch
    size is 1..``max_batch_size``; the prefill batch and the per-step token
    budget are drawn below it, so prompts are chunked and prefills wait.

    The paged pool holds the longest request and at most one block more, so
    two requests at once mostly outgrow it and one is preempted (KV pressure).
    Its blocks are drawn from ``kv_block_sizes``: small ones, since admission
    keeps a watermark of one free block per running request plus one, and a
    pool of a few 16-token blocks would almost never admit a second request.
    ``Scenario.engine_config`` hands the pool to a registered engine with its
    block size (``EngineConfig.kv_block_size``); perfsuite's paged factories
    honour it, an engine that ignores it counts ``num_kv_blocks`` in its own
    blocks (a larger pool that seldom preempts).

    ``avoid_token_ids`` (a tokenizer's special tokens, say) are never drawn
    into a prompt; the prompts of perfsuite's own tests use every id.
    """
    prompt_token = _prompt_tokens(vocab_size, avoid_token_ids)
    num_requests = draw(st.integers(min_requests, max_requests))
    requests, arrival_steps = _draw_requests(draw, num_requests, prompt_token, max_prompt_len, max_new_tokens)
    batch_size = draw(st.integers(1, max_batch_size))
    kv_block_size = draw(st.sampled_from(list(kv_block_sizes)))
    batching = _Batching(batch_size, kv_block_size, 2 * max_prompt_len, max_batch_size)
    return _draw_scheduling(draw, requests, arrival_steps, batching)


def _draw_requests(
    draw: st.DrawFn, num_requests: int, prompt_token: st.SearchStrategy[int], max_prompt_len: int, max_new_tokens: int
) -> tuple[list[Request], list[int]]:
    """``num_requests`` requests of drawn prompts, each arriving at a step in 0..2 x ``max_new_tokens``."""
    requests, arrival_steps = [], []
    for index in range(num_requests):
        prompt = tuple(draw(st.lists(prompt_token, min_size=1, max_size=max_prompt_len)))
        requests.append(_draw_request(draw, index, prompt, max_new_tokens))
        arrival_steps.append(draw(st.integers(0, 2 * max_new_tokens)))
    return requests, arrival_steps


def _draw_request(draw: st.DrawFn, index: int, prompt: tuple[int, ...], max_new_tokens: int) -> Request:
    params = SamplingParams(draw(st.integers(1, max_new_tokens)), ignore_eos=draw(st.booleans()))
    return Request(f"r{index}", prompt, params)


@dataclass(frozen=True, slots=True)
class _Batching:
    """The drawn batch size and block size, and the bounds the rest of a scenario's knobs are drawn within."""

    batch_size: int
    kv_block_size: int
    max_budget: int  # the per-step token budget is drawn in 1..max_budget
    max_batch_size: int
    prefix_caching: bool = False


def _draw_scheduling(
    draw: st.DrawFn, requests: Sequence[Request], arrival_steps: Sequence[int], batching: _Batching
) -> Scenario:
    """The scenario: a prefill batch and token budget drawn below the batch, a pool of the longest request + 0..1."""
    batch_size, block_size = batching.batch_size, batching.kv_block_size
    num_blocks_longest = max(-(-request.max_total_tokens // block_size) for request in requests)
    return Scenario(
        requests=tuple(requests),
        arrival_steps=tuple(arrival_steps),
        batch_size=batch_size,
        prefill_batch_size=draw(st.integers(1, batch_size)),
        max_num_batched_tokens=draw(st.integers(1, batching.max_budget)),
        num_kv_blocks=num_blocks_longest + draw(st.integers(0, 1)),
        kv_block_size=block_size,
        paged_batch_size=draw(st.integers(max(2, batch_size), batching.max_batch_size + 2)),
        prefix_caching=batching.prefix_caching,
    )


class ScenarioSize(TypedDict, total=False):
    """The size arguments of ``scenarios``, for a named size passed as ``**size``."""

    min_requests: int
    max_requests: int
    max_prompt_len: int
    max_new_tokens: int
    max_batch_size: int


# More requests than any pool of a long scenario holds: slots, blocks and request ids are reused after the pool
# wraps, several times over (a batch of at most 3, a paged pool of the longest request and at most one block more).
LONG: ScenarioSize = {
    "min_requests": 16,
    "max_requests": 24,
    "max_prompt_len": 8,
    "max_new_tokens": 8,
    "max_batch_size": 3,
}


def long_scenarios(vocab_size: int, avoid_token_ids: Collection[int] = ()) -> st.SearchStrategy[Scenario]:
    """``scenarios`` of 16-24 short requests over a batch of at most 3: each slot and block is reused many times."""
    return scenarios(vocab_size, avoid_token_ids=avoid_token_ids, **LONG)


SHARING_KINDS = ("same", "shares_blocks", "prefix_of", "fresh")


@st.composite
def shared_prefix_scenarios(
    draw: st.DrawFn,
    vocab_size: int,
    max_requests: int = 8,
    max_prompt_len: int = 32,
    max_new_tokens: int = 12,
    max_batch_size: int = 4,
    kv_block_sizes: Sequence[int] = DEFAULT_KV_BLOCK_SIZES,
    avoid_token_ids: Collection[int] = (),
) -> Scenario:
    """Scenarios whose prompts share prefixes on purpose, served with prefix caching too (``prefix_caching``).

    Each prompt after the first is an earlier prompt again (``same``), the
    first 0..n full blocks of one of a few shared stems and then a cut
    mid-block and a suffix of its own (``shares_blocks``), a prefix of an
    earlier prompt (``prefix_of``) or a prompt of its own (``fresh``).
    Requests arrive within a few steps of each other while the token budget
    chunks prefills, so one often arrives while its sharer is still
    prefilling. The pool holds the longest request and at most one block
    more, as in ``scenarios``: cached blocks are evicted and sharers
    preempted.
    """
    prompt_token = _prompt_tokens(vocab_size, avoid_token_ids)
    block_size = draw(st.sampled_from(list(kv_block_sizes)))
    stems = draw(st.lists(st.lists(prompt_token, min_size=1, max_size=max_prompt_len), min_size=1, max_size=3))
    prompts: list[tuple[int, ...]] = []
    requests, arrival_steps = [], []
    for index in range(draw(st.integers(2, max_requests))):
        kind = draw(st.sampled_from(SHARING_KINDS)) if prompts else "shares_blocks"
        prompts.append(_draw_shared_prompt(draw, kind, prompts, stems, prompt_token, block_size, max_prompt_len))
        requests.append(_draw_request(draw, index, prompts[-1], max_new_tokens))
        arrival_steps.append(draw(st.integers(0, 6)))
    batch_size = draw(st.integers(1, max_batch_size))
    batching = _Batching(batch_size, block_size, max_prompt_len, max_batch_size, prefix_caching=True)
    return _draw_scheduling(draw, requests, arrival_steps, batching)


def _draw_shared_prompt(
    draw: st.DrawFn,
    kind: str,
    earlier_prompts: Sequence[tuple[int, ...]],
    stems: Sequence[Sequence[int]],
    prompt_token: st.SearchStrategy[int],
    block_size: int,
    max_prompt_len: int,
) -> tuple[int, ...]:
    """A prompt of one of ``SHARING_KINDS``, as ``shared_prefix_scenarios`` says."""
    if kind == "same":
        return draw(st.sampled_from(earlier_prompts))
    if kind == "prefix_of":
        earlier = draw(st.sampled_from(earlier_prompts))
        return earlier[: draw(st.integers(1, len(earlier)))]
    if kind == "shares_blocks":
        stem = draw(st.sampled_from(stems))
        cut = draw(st.integers(0, len(stem) // block_size)) * block_size + draw(st.integers(0, block_size - 1))
        suffix = draw(st.lists(prompt_token, min_size=1, max_size=max(1, max_prompt_len // 4)))
        return (tuple(stem[:cut]) + tuple(suffix))[:max_prompt_len]
    return tuple(draw(st.lists(prompt_token, min_size=1, max_size=max_prompt_len)))


def _prompt_tokens(vocab_size: int, avoid_token_ids: Collection[int]) -> st.SearchStrategy[int]:
    if not avoid_token_ids:
        return st.integers(0, vocab_size - 1)
    avoided = frozenset(avoid_token_ids)
    return st.sampled_from([token for token in range(vocab_size) if token not in avoided])
