"""The bitwise lane: every request's tokens and log-probabilities, served in a batch, are the bits it gets alone.

``equivalence_test(..., bitwise=True)`` and ``runner_equivalence_test(...,
bitwise=True)`` draw ``Composition``s (``compositions``): a needle request
among N companions, N+1 a batch size around the decode kernels' row-count
edges (``BATCH_SIZES``), with a token budget that may split prompts
(chunked prefill), companions that may share the needle's first tokens
(prefix-cache hits where the engine caches prefixes), and a paged pool that
may be too small for all of them (preemption and recompute). Every request
of the composition is then served alone by the same engine (a batch of one,
no token budget, an ample pool, the same block size and ``max_seq_len``: the
strategy's longest request, so a request alone is served once a test) and
its tokens and log-probabilities must be the same bits: ``==`` on token ids
and on the float's bit pattern, never a tolerance. It is vLLM's
batch-invariance check (a needle alone against batches of N) for any engine.

Log-probabilities reach the lane through ``RequestRecord.output_logprobs``
(one float per output token, the sampled token's log-probability; perfsuite's
engines fill it from a runner's ``last_logprobs``, as ``ModelRunner(logprobs=True)``
keeps them). They are optional in the protocol, but not in the lane: an
engine whose records carry none is refused (``NoLogprobs``) rather than
checked on tokens alone, since a token-only pass would read as "bitwise" while
most non-invariant kernels change a logit's last bits long before they change
an argmax.

Pure Python on top of the engines; torch is imported only by the runner the
caller builds.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from perfsuite.engine import Request, SamplingParams
from perfsuite.testing.drive import drive
from perfsuite.testing.greedy import InvalidRunResult, validate_run_result
from perfsuite.testing.scenarios import DEFAULT_KV_BLOCK_SIZES, Scenario

if TYPE_CHECKING:
    from perfsuite.adapters.protocol import BatchingEngine, EngineConfig
    from perfsuite.engine.engine import Runner
    from perfsuite.engine.types import EngineCounters, RunResult

# Rows in the decode batch (the needle and its companions): 1, 2, 4 and each side of 8 and 16, where CUDA-graph
# buckets change (vLLM's 15/16/17), and 3 and 5 each side of perfsuite's own packed-kernel edge (PACKED_MIN_ROWS = 4).
BATCH_SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17)
DEFAULT_MAX_EXAMPLES = 12
MAX_PROMPT_LEN = 12
MAX_NEW_TOKENS = 4
NUM_COMPANION_PROMPTS = 32  # companions come from a fixed family, so their runs alone are reused across examples

Served = tuple[tuple[int, ...], tuple[float, ...]]  # a request's output tokens and their log-probabilities


class NoLogprobs(BaseException):
    """The engine under the bitwise lane gives no log-probabilities, so there are no bits to compare.

    A ``BaseException``, as ``time_limit.NoAnswer`` is: it is a property of
    the engine, not of the composition, so Hypothesis must not shrink it.
    """


@dataclass(frozen=True)
class Composition:
    """A needle request among companions, and the knobs that put them in one batch, as a ``Scenario``."""

    scenario: Scenario
    needle_id: str
    knobs: tuple[str, ...]  # what this composition presses on, in words
    max_seq_len: int  # the strategy's longest request, not this one's: a request alone is served once per strategy

    @property
    def requests(self) -> tuple[Request, ...]:
        return self.scenario.requests

    def describe(self) -> str:
        companions = len(self.requests) - 1
        return (
            f"needle {self.needle_id!r} among {companions} companion{'' if companions == 1 else 's'}: "
            f"{'; '.join(self.knobs)}\n{self.scenario.describe()}"
        )

    def alone(self, request: Request) -> Scenario:
        """``request`` served alone: a batch of one, no token budget, an ample pool, the same block size."""
        return Scenario(
            requests=(Request(request.request_id, request.prompt_token_ids, request.sampling_params),),
            arrival_steps=(0,),
            batch_size=1,
            prefill_batch_size=1,
            max_num_batched_tokens=self.max_seq_len,
            kv_block_size=self.scenario.kv_block_size,
            prefix_caching=True,  # so the alone runs include the prefix-caching engine's own
        )


@st.composite
def compositions(
    draw: st.DrawFn,
    vocab_size: int,
    avoid_token_ids: Collection[int] = (),
    batch_sizes: Sequence[int] = BATCH_SIZES,
    kv_block_sizes: Sequence[int] = DEFAULT_KV_BLOCK_SIZES,
    max_prompt_len: int = MAX_PROMPT_LEN,
) -> Composition:
    """A needle (a drawn prompt of 1..``max_prompt_len`` tokens, 1..``MAX_NEW_TOKENS`` new ones) among companions.

    The batch (needle included) is one of ``batch_sizes``; the needle sits at
    a drawn place among the companions and arrives at step 0..3 (the step
    drive of ``runner_equivalence_test``; ``BatchingEngine.run`` gets them
    all at once). Knobs, each drawn: a token budget of 1..``max_prompt_len``
    that splits prompts (else one that never does); the companions starting
    with the needle's first tokens, served with prefix caching; a paged pool
    of the longest request and at most one block more, so requests are
    preempted and recomputed (else as much as the slot engines' cache).

    A prefix is cached in whole blocks, and a request prefilled in the same
    step as its sharer finds nothing cached yet: the hits come from blocks of
    1, 2 or 4 tokens under a token budget. A registered engine is handed the
    composition's block size (``EngineConfig.kv_block_size``), which perfsuite's
    ``paged-prefix`` honours; an engine that keeps 16-token blocks cannot hit
    with the default 12-token prompts (a larger ``max_prompt_len`` makes it
    possible, not frequent).
    """
    max_seq_len = max_prompt_len + MAX_NEW_TOKENS
    allowed = [token for token in range(vocab_size) if token not in frozenset(avoid_token_ids)]
    batch = draw(st.sampled_from(list(batch_sizes)))
    knobs = [f"batch of {batch}"]
    needle, requests, shared = _draw_batch(draw, batch, allowed, max_prompt_len, knobs)
    scenario = _draw_scenario(draw, needle, requests, shared > 0, max_prompt_len, kv_block_sizes, knobs)
    return Composition(scenario, needle.request_id, tuple(knobs), max_seq_len)


def _draw_batch(
    draw: st.DrawFn, batch: int, allowed: Sequence[int], max_prompt_len: int, knobs: list[str]
) -> tuple[Request, tuple[Request, ...], int]:
    """The needle, the batch in arrival order (the needle at a drawn place) and how many prompt tokens they share."""
    needle_prompt = tuple(draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=max_prompt_len)))
    needle = Request("needle", needle_prompt, SamplingParams(draw(st.integers(1, MAX_NEW_TOKENS)), ignore_eos=True))
    shared = draw(st.integers(0, len(needle_prompt))) if batch > 1 and draw(st.booleans()) else 0
    if shared:
        knobs.append(f"companions start with the needle's first {shared} token(s) (served with prefix caching too)")
    companions = [
        _companion(
            index, draw(st.integers(0, NUM_COMPANION_PROMPTS - 1)), needle_prompt[:shared], allowed, max_prompt_len
        )
        for index in range(batch - 1)
    ]
    place = draw(st.integers(0, len(companions)))
    return needle, (*companions[:place], needle, *companions[place:]), shared


def _draw_scenario(
    draw: st.DrawFn,
    needle: Request,
    requests: tuple[Request, ...],
    prefix_caching: bool,
    max_prompt_len: int,
    kv_block_sizes: Sequence[int],
    knobs: list[str],
) -> Scenario:
    """The batch served under drawn knobs: a token budget, a block size, a tight paged pool, the needle's step."""
    batch = len(requests)
    budget = (max_prompt_len + MAX_NEW_TOKENS) * batch
    if draw(st.booleans()):
        budget = draw(st.integers(1, max_prompt_len))
        knobs.append(f"a budget of {budget} tokens a step (chunked prefill)")
    block_size = draw(st.sampled_from(list(kv_block_sizes)))
    num_kv_blocks = None
    if draw(st.booleans()):
        num_kv_blocks = max(-(-r.max_total_tokens // block_size) for r in requests) + draw(st.integers(0, 1))
        knobs.append(f"a paged pool of {num_kv_blocks} x {block_size} tokens (preemption)")
    needle_step = draw(st.integers(0, 3))
    if needle_step:
        knobs.append(f"the needle arrives at step {needle_step} of a step-driven run")
    return Scenario(
        requests=requests,
        arrival_steps=tuple(needle_step if r is needle else 0 for r in requests),
        batch_size=batch,
        prefill_batch_size=batch,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_kv_blocks,
        kv_block_size=block_size,
        paged_batch_size=batch,
        prefix_caching=prefix_caching,
    )


def _companion(
    index: int, family: int, prefix: tuple[int, ...], allowed: Sequence[int], max_prompt_len: int
) -> Request:
    """Companion ``family`` of a fixed family: 1..8 tokens of its own after ``prefix``, 1..4 new tokens."""
    own = tuple(allowed[(7 * family + 3 * j + 1) % len(allowed)] for j in range(1 + family % 8))
    prompt = (prefix + own)[:max_prompt_len]
    return Request(f"c{index}", prompt, SamplingParams(1 + family % MAX_NEW_TOKENS, ignore_eos=True))


@dataclass(frozen=True, slots=True)
class BitwiseDifference:
    """Where one request served in a batch first differs from the same request served alone."""

    engine_name: str
    request_id: str
    position: int
    what: str  # "token", "log-probability" or "length"
    batched: object
    alone: object

    def describe(self) -> str:
        shown = _float_shown if self.what == "log-probability" else repr
        return (
            f"{self.engine_name}: request {self.request_id!r}, output position {self.position}: {self.what} "
            f"{shown(self.batched)} in the batch, {shown(self.alone)} alone"
        )


def first_difference(engine_name: str, request_id: str, batched: Served, alone: Served) -> BitwiseDifference | None:
    """The first position where ``batched`` and ``alone`` differ (a token, then its log-probability's bits)."""
    (tokens, logprobs), (alone_tokens, alone_logprobs) = batched, alone
    for position, (token, alone_token) in enumerate(zip(tokens, alone_tokens)):
        if token != alone_token:
            return BitwiseDifference(engine_name, request_id, position, "token", token, alone_token)
        if not same_bits(logprobs[position], alone_logprobs[position]):
            return BitwiseDifference(
                engine_name, request_id, position, "log-probability", logprobs[position], alone_logprobs[position]
            )
    if len(tokens) != len(alone_tokens):
        shorter = min(len(tokens), len(alone_tokens))
        return BitwiseDifference(engine_name, request_id, shorter, "length", len(tokens), len(alone_tokens))
    return None


def same_bits(a: float, b: float) -> bool:
    """The same IEEE double, bit for bit (so 0.0 and -0.0 differ, and a NaN equals only its own bits)."""
    return struct.pack("<d", a) == struct.pack("<d", b)


def _float_shown(value: object) -> str:
    return f"{value!r} ({float.hex(value)})" if isinstance(value, float) else repr(value)


def served_of(engine_name: str, requests: Sequence[Request], result: RunResult) -> dict[str, Served]:
    """Each request's tokens and log-probabilities from ``result``, its log-probabilities checked first.

    ``NoLogprobs`` when no record carries any; ``InvalidRunResult`` when some
    do and others not, or a record's are not one real number per token.
    """
    records = {record.request_id: record for record in result.records}
    logprobs = {rid: getattr(record, "output_logprobs", None) for rid, record in records.items()}
    if all(values is None for values in logprobs.values()):
        raise NoLogprobs(
            f"{engine_name}: no request's record carries log-probabilities, so the bitwise lane has no bits to "
            "compare; an engine exposes them as RequestRecord.output_logprobs, one float per output token "
            "(perfsuite's engines do over ModelRunner(logprobs=True)); without them, use the per-token verdict "
            "(bitwise=False)"
        )
    problems = []
    for request in requests:
        tokens, values = records[request.request_id].output_token_ids, logprobs[request.request_id]
        if values is None or len(values) != len(tokens):
            problems.append(
                f"request {request.request_id!r}: {0 if values is None else len(values)} log-probabilities for "
                f"{len(tokens)} tokens"
            )
        elif not all(isinstance(v, Real) and not isinstance(v, bool) for v in values):
            problems.append(f"request {request.request_id!r}: log-probabilities that are not real numbers")
    if problems:
        raise InvalidRunResult(engine_name, problems)
    return {
        rid: (tuple(records[rid].output_token_ids), tuple(float(v) for v in logprobs[rid] or ())) for rid in records
    }


def assert_same_bits(
    composition: Composition, batched: Mapping[str, Mapping[str, Served]], alone: Callable[[str, Request], Served]
) -> None:
    """Fail naming each request whose bits in the batch are not its bits alone (``batched``: by engine, by request)."""
    differences = [
        difference
        for engine_name, outputs in batched.items()
        for request in composition.requests
        if (
            difference := first_difference(
                engine_name, request.request_id, outputs[request.request_id], alone(engine_name, request)
            )
        )
        is not None
    ]
    if differences:
        lines = "\n".join(f"  {difference.describe()}" for difference in differences)
        raise AssertionError(
            f"not the same bits in a batch as alone ({len(differences)} of "
            f"{len(composition.requests) * len(batched)} request runs differ; each at its first difference):\n{lines}"
        )


def _alone_key(composition: Composition, request: Request) -> tuple:
    return (request.prompt_token_ids, request.sampling_params, composition.max_seq_len)


class EngineLane:
    """The bitwise lane over an engine built from ``EngineConfig``s; its runs alone kept for the whole test."""

    def __init__(self, name: str, build: Callable[[EngineConfig], BatchingEngine], batch_invariant: bool) -> None:
        self._name, self._build, self._batch_invariant = name, build, batch_invariant
        self._alone: dict[tuple, Served] = {}
        self.batched_runs: list[tuple[str, EngineCounters]] = []  # what the compositions pressed on, for a summary

    def check(self, composition: Composition) -> None:
        config = self._config(composition.scenario, composition.max_seq_len)
        batched = {self._name: self._serve(config, composition.requests, self.batched_runs)}
        assert_same_bits(composition, batched, lambda _, request: self._served_alone(composition, request))

    def _served_alone(self, composition: Composition, request: Request) -> Served:
        key = _alone_key(composition, request)
        if key not in self._alone:
            scenario = composition.alone(request)
            config = self._config(scenario, composition.max_seq_len)
            self._alone[key] = self._serve(config, scenario.requests)[request.request_id]
        return self._alone[key]

    def _config(self, scenario: Scenario, max_seq_len: int) -> EngineConfig:
        from perfsuite.adapters.protocol import EngineConfig

        knobs = scenario.engine_config(max_seq_len)
        return EngineConfig(
            knobs.batch_size,
            max_seq_len,
            knobs.prefill_batch_size,
            knobs.max_num_batched_tokens,
            knobs.num_kv_blocks,
            batch_invariant=self._batch_invariant,
            kv_block_size=knobs.kv_block_size,
        )

    def _serve(
        self, config: EngineConfig, requests: tuple[Request, ...], runs: list | None = None
    ) -> dict[str, Served]:
        result = self._build(config).run(requests)
        problems = validate_run_result(requests, result)
        if problems:
            raise InvalidRunResult(self._name, problems)
        if runs is not None:
            runs.append((self._name, result.counters))
        return served_of(self._name, requests, result)


class RunnerLane:
    """The bitwise lane over a runner under perfsuite's schedulers, step by step; runs alone kept per engine."""

    def __init__(self, runner: Runner, eos_token_id: int | None) -> None:
        self._runner, self._eos_token_id = runner, eos_token_id
        self._alone: dict[tuple, dict[str, Served]] = {}
        self.batched_runs: list[tuple[str, EngineCounters]] = []  # what the compositions pressed on, for a summary

    def check(self, composition: Composition) -> None:
        batched = dict(self._serve(composition.scenario, composition.max_seq_len, self.batched_runs))
        assert_same_bits(composition, batched, lambda engine, request: self._served_alone(composition, request)[engine])

    def _served_alone(self, composition: Composition, request: Request) -> dict[str, Served]:
        key = (*_alone_key(composition, request), composition.scenario.kv_block_size)
        if key not in self._alone:
            alone = self._serve(composition.alone(request), composition.max_seq_len)
            self._alone[key] = {name: outputs[request.request_id] for name, outputs in alone}
        return self._alone[key]

    def _serve(
        self, scenario: Scenario, max_seq_len: int, runs: list | None = None
    ) -> Iterator[tuple[str, dict[str, Served]]]:
        for engine in scenario.engines(self._runner, self._eos_token_id, max_seq_len):
            drive(engine, scenario)
            result = engine.result(0.0, 1.0)
            if runs is not None:
                runs.append((engine.name, result.counters))
            yield engine.name, served_of(engine.name, scenario.requests, result)
