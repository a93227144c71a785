"""Values that cross the engine's module boundaries.

Everything here is a frozen dataclass and pure Python: the scheduler, the
metrics and the tests use these types without importing torch.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field, fields

from perfsuite.engine.server_metrics import ServerMetrics
from perfsuite.engine.work import StepWork


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


class DecodeMode(enum.Enum):
    """How the model runner computes a step whose chunks are all one token; other steps are always packed."""

    PACKED = "packed"  # as every step: the chunks' tokens packed into one batch
    # Static shapes: over all cache slots (perfsuite.engine.static_decode), or for the paged engine over the rows
    # padded to a bucket (perfsuite.engine.paged_decode)
    STATIC = "static"
    CUDA_GRAPH = "cuda-graph"  # the static step captured as a CUDA graph (per shape, or per bucket) and replayed

    @classmethod
    def parse(cls, value: DecodeMode | str) -> DecodeMode:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown decode_mode {value!r}; choose one of {', '.join(DECODE_MODES)}") from None


DECODE_MODES = tuple(mode.value for mode in DecodeMode)  # the names options and stored runs use


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Greedy decoding limits for one request.

    ``ignore_eos`` keeps decoding past EOS but never changes which token is
    chosen: the EOS logit is not masked (masking it, as ``min_new_tokens``
    does, would change greedy choices). ``stop_token_ids`` still stop a request
    that ignores EOS, as in vLLM.

    ``min_tokens``: neither EOS nor a stop token ends a request before it has
    that many tokens. As with ``ignore_eos`` nothing is masked, so the greedy
    choices stay the same (vLLM's ``min_tokens`` masks them instead, so its
    tokens after a would-be stop differ).
    """

    max_new_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}; ask for at least one new token"
            )
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_tokens must be an integer in 0..max_new_tokens ({self.max_new_tokens}), "
                f"got {self.min_tokens!r}; lower it or raise max_new_tokens"
            )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def finish_reason(self, token_id: int, num_generated: int, eos_token_id: int | None) -> FinishReason | None:
        """Why generation stops after ``token_id``, the ``num_generated``-th token; None to go on.

        The length is checked first, as vLLM v1's ``check_stop`` does: an EOS or stop token that is also the last
        token allowed finishes the request for its length. Which tokens come out is the same either way.
        """
        if num_generated >= self.max_new_tokens:
            return FinishReason.LENGTH
        if num_generated < self.min_tokens:
            return None
        if token_id in self.stop_token_ids:
            return FinishReason.STOP
        if not self.ignore_eos and eos_token_id is not None and token_id == eos_token_id:
            return FinishReason.STOP
        return None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """The next turn of a conversation: a request whose prompt is only known once another has finished.

    When the parent request finishes, the follow-up's prompt becomes the
    parent's prompt, then its output, then the follow-up's own
    ``prompt_token_ids`` (the new user message), and it arrives
    ``think_time`` seconds after the parent's last token.
    ``max_context_tokens`` is the parent's ``max_total_tokens``, the longest
    the conversation can be before the new message, so the follow-up's size
    is bounded before the run (engines are sized from it).
    """

    parent_id: str
    think_time: float
    max_context_tokens: int

    def __post_init__(self) -> None:
        if not isinstance(self.think_time, (int, float)) or not 0 <= self.think_time < float("inf"):
            raise ValueError(
                f"follow-up of {self.parent_id!r}: think_time must be seconds >= 0, got {self.think_time!r}"
            )
        if not isinstance(self.max_context_tokens, int) or self.max_context_tokens < 1:
            raise ValueError(
                f"follow-up of {self.parent_id!r}: max_context_tokens must be the parent's max_total_tokens "
                f"(>= 1), got {self.max_context_tokens!r}"
            )


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request.

    ``arrival_time`` is seconds after the start of a run: 0.0 for offline runs
    where every request is there at t0.

    A request that ``follows`` another (a later turn of a conversation) holds
    only its new message in ``prompt_token_ids``; the engine's arrival queue
    makes the whole prompt when the parent finishes (``FollowUp``). Its
    ``arrival_time`` stays 0: it arrives ``think_time`` after its parent ends.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    follows: FollowUp | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(
                f"request {self.request_id!r}: prompt_token_ids is empty; "
                "a prompt needs at least one token (e.g. the BOS token)"
            )
        if self.arrival_time < 0:
            raise ValueError(
                f"request {self.request_id!r}: arrival_time must be >= 0 seconds "
                f"after the run starts, got {self.arrival_time}"
            )
        if self.follows is not None and self.arrival_time != 0:
            raise ValueError(
                f"request {self.request_id!r} follows {self.follows.parent_id!r}, so it arrives think_time after "
                f"that one finishes; leave its arrival_time at 0, got {self.arrival_time}"
            )

    @property
    def num_prompt_tokens(self) -> int:
        """The prompt's tokens; of a follow-up not yet resolved, its new message's only."""
        return len(self.prompt_token_ids)

    @property
    def max_prompt_tokens(self) -> int:
        """The longest the prompt can be: a follow-up's includes the conversation before it."""
        context = 0 if self.follows is None else self.follows.max_context_tokens
        return context + self.num_prompt_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.max_prompt_tokens + self.sampling_params.max_new_tokens

    def continued(self, parent_prompt: tuple[int, ...], parent_output: tuple[int, ...], arrival_time: float) -> Request:
        """This follow-up with its whole prompt (the parent's prompt and output, then its message)."""
        if self.follows is None:
            raise ValueError(f"request {self.request_id!r} follows no other request; there is nothing to continue")
        context = tuple(parent_prompt) + tuple(parent_output)
        if len(context) > self.follows.max_context_tokens:
            raise ValueError(
                f"request {self.request_id!r}: the conversation before it holds {len(context)} tokens, more than "
                f"its max_context_tokens={self.follows.max_context_tokens}; set that to the parent's max_total_tokens"
            )
        return Request(self.request_id, context + self.prompt_token_ids, self.sampling_params, arrival_time)

    def check_fits(self, max_seq_len: int) -> None:
        """Refuse a request that no slot of ``max_seq_len`` tokens could hold (it would fail or wait forever)."""
        if self.max_total_tokens > max_seq_len:
            raise ValueError(
                f"request {self.request_id!r}: prompt ({self.num_prompt_tokens} tokens) + max_new_tokens "
                f"({self.sampling_params.max_new_tokens}) = {self.max_total_tokens} exceeds the "
                f"engine's context of {max_seq_len} tokens; shorten the prompt, lower "
                "max_new_tokens or build the engine with a larger max_seq_len"
            )


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """Tokens of one request that one forward pass computes.

    A prefill chunk carries several prompt tokens, a decode chunk carries the
    last sampled token. ``samples`` is false for a prefill chunk that does not
    reach the end of the prompt (chunked prefill) and for padding rows.

    ``slot`` is the request's cache slot in a slot cache, and its row (a lane
    of the timeline, below ``decode_batch_size``) in a paged one, where the
    keys and values live in the blocks of ``block_table`` instead: position
    ``p`` sits in block ``block_table[p // block_size]``. A slot cache's
    chunks carry no block table.
    """

    request_id: str
    slot: int
    token_ids: tuple[int, ...]
    start_position: int
    samples: bool
    is_prefill: bool
    is_padding: bool = False
    block_table: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What one engine step computes: one chunk per scheduled request.

    The KV figures describe the cache once this step has run: blocks held (a
    slot cache's slots count as blocks of ``max_seq_len`` tokens), the tokens
    they hold and their capacity in tokens. ``preempted_request_ids`` lost
    their blocks to make room for this step (newest first) and wait to be
    recomputed; ``num_recomputed_tokens`` of this step's tokens had been
    computed before, by a request since preempted.
    """

    chunks: tuple[ScheduledChunk, ...]
    num_waiting: int
    num_running: int = 0
    num_kv_blocks_used: int = 0
    num_kv_tokens_used: int = 0
    kv_token_capacity: int = 0
    preempted_request_ids: tuple[str, ...] = ()
    num_recomputed_tokens: int = 0
    # Prefix caching, this step's admissions: prompt tokens looked up, found cached, and cached blocks evicted.
    num_prefix_cache_queried_tokens: int = 0
    num_prefix_cache_hit_tokens: int = 0
    num_evicted_blocks: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def num_scheduled_tokens(self) -> int:
        """Real tokens only: padding rows are the cost of static batching, not work."""
        return sum(c.num_tokens for c in self.chunks if not c.is_padding)

    @property
    def num_padding_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks if c.is_padding)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """A token produced for one request in one step; ``logprob``: its log-probability, where the runner was asked
    for them (``ModelRunner(logprobs=True)``), else None."""

    request_id: str
    token_id: int
    finish_reason: FinishReason | None
    logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Monotonic timestamps (``time.perf_counter`` seconds) of one request's life.

    Metrics are computed from these later (``perfsuite.measure.metrics``); the engine
    records and never summarises.

    ``token_times`` has one time per output token when the engine sees each
    token (every in-process engine, and an HTTP server that streams token
    ids). A client of a server that streams text only sees chunks, not
    tokens: it records one time per chunk (fewer than the tokens), the text
    re-tokenized as ``output_token_ids``, and the server's own count, when
    sent, as ``num_reported_output_tokens`` (see ``perfsuite.adapters.openai_stream``).
    """

    request_id: str
    num_prompt_tokens: int
    output_token_ids: tuple[int, ...]
    arrival_time: float
    first_scheduled_time: float | None
    token_times: tuple[float, ...]
    finished_time: float | None
    finish_reason: FinishReason | None
    num_reported_output_tokens: int | None = None  # None: the count is len(output_token_ids)
    # Open loop only (None: a closed loop, a peer that does not say, or an older record): when the schedule
    # said to send it; when it could first have gone (later than scheduled while the engine was mid-step or
    # every client connection was busy: queueing, which its latencies count); when it actually went.
    # sent - send_ready is the load generator's own lateness (perfsuite.measure.send_lag).
    scheduled_time: float | None = None
    send_ready_time: float | None = None
    sent_time: float | None = None
    # Prompt tokens whose KV came from the prefix cache instead of a prefill (0: none, or an engine without
    # one); None: not known (a peer that does not say, an older record).
    num_cached_tokens: int | None = None
    # One log-probability per output token, where the engine was asked for them (perfsuite's engines over
    # ModelRunner(logprobs=True)); None: not asked, or an engine that does not give them.
    output_logprobs: tuple[float, ...] | None = None
    # A server's client: the prompt as perfsuite built it, where the server's usage counted another number of
    # prompt tokens (num_prompt_tokens: a chat template's tokens); None: they agree, or nobody else counted.
    num_client_prompt_tokens: int | None = None

    @property
    def num_output_tokens(self) -> int:
        if self.num_reported_output_tokens is not None:
            return self.num_reported_output_tokens
        return len(self.output_token_ids)


@dataclass(frozen=True, slots=True)
class StepTrace:
    """What the batch looked like during one step, for timelines.

    ``num_kv_blocks_used`` and ``num_kv_tokens_used``: the KV cache once the
    step has run (see ``SchedulerOutput``); ``preempted_request_ids``: the
    requests preempted to make room for this step.
    """

    start_time: float
    end_time: float
    num_waiting: int
    chunks: tuple[ScheduledChunk, ...]
    num_kv_blocks_used: int = 0
    num_kv_tokens_used: int = 0
    preempted_request_ids: tuple[str, ...] = ()
    work: StepWork | None = None  # its FLOPs and bytes by kind (perfsuite.engine.work); None: no model shape


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Exact, noise-free counts of the work a run did.

    All are integers (stored baselines read them as such) and default to 0,
    so a run recorded before a counter existed reads as 0. The KV counters:
    ``num_preemptions`` (a request preempted twice counts twice),
    ``num_recomputed_tokens`` (tokens computed again after a preemption),
    ``peak_kv_blocks_used`` and ``peak_num_running`` (the most blocks held and
    requests running in one step), and three sums over steps from which the
    means follow (``mean_kv_blocks_used``, ``kv_utilisation``).
    """

    num_forward_passes: int = 0
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_padding_tokens: int = 0
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    peak_kv_blocks_used: int = 0
    peak_num_running: int = 0
    kv_blocks_used_step_sum: int = 0  # blocks held, summed over steps
    kv_tokens_used_step_sum: int = 0  # tokens held in those blocks, summed over steps
    kv_token_capacity_step_sum: int = 0  # the blocks' capacity in tokens, summed over steps
    # Prefix caching (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens): the prompt tokens looked up in
    # the cache at each admission (a readmission after preemption looks up again), those found there, and
    # cached blocks evicted to make room for new ones.
    num_prefix_cache_queried_tokens: int = 0
    num_prefix_cache_hit_tokens: int = 0
    num_evicted_blocks: int = 0
    # The work done (perfsuite.engine.work, where the runner gives the model's shape; 0 otherwise): FLOPs of
    # prefill and of decode chunks, the bytes of weights read, and of keys and values read and written.
    prefill_flops: int = 0
    decode_flops: int = 0
    weight_bytes_read: int = 0
    kv_bytes_read: int = 0
    kv_bytes_written: int = 0

    def plus(self, output: SchedulerOutput, work: StepWork | None = None) -> EngineCounters:
        prefill = sum(c.num_tokens for c in output.chunks if c.is_prefill and not c.is_padding)
        decode = sum(c.num_tokens for c in output.chunks if not c.is_prefill and not c.is_padding)
        return EngineCounters(
            num_forward_passes=self.num_forward_passes + 1,
            num_decode_steps=self.num_decode_steps + (1 if decode else 0),
            num_prefill_tokens=self.num_prefill_tokens + prefill,
            num_decode_tokens=self.num_decode_tokens + decode,
            num_padding_tokens=self.num_padding_tokens + output.num_padding_tokens,
            num_preemptions=self.num_preemptions + len(output.preempted_request_ids),
            num_recomputed_tokens=self.num_recomputed_tokens + output.num_recomputed_tokens,
            peak_kv_blocks_used=max(self.peak_kv_blocks_used, output.num_kv_blocks_used),
            peak_num_running=max(self.peak_num_running, output.num_running),
            kv_blocks_used_step_sum=self.kv_blocks_used_step_sum + output.num_kv_blocks_used,
            kv_tokens_used_step_sum=self.kv_tokens_used_step_sum + output.num_kv_tokens_used,
            kv_token_capacity_step_sum=self.kv_token_capacity_step_sum + output.kv_token_capacity,
            num_prefix_cache_queried_tokens=self.num_prefix_cache_queried_tokens
            + output.num_prefix_cache_queried_tokens,
            num_prefix_cache_hit_tokens=self.num_prefix_cache_hit_tokens + output.num_prefix_cache_hit_tokens,
            num_evicted_blocks=self.num_evicted_blocks + output.num_evicted_blocks,
            **self._plus_work(work or StepWork()),
        )

    def _plus_work(self, work: StepWork) -> dict[str, int]:
        total = work.total
        return {
            "prefill_flops": self.prefill_flops + work.prefill.flops,
            "decode_flops": self.decode_flops + work.decode.flops,
            "weight_bytes_read": self.weight_bytes_read + total.weight_bytes_read,
            "kv_bytes_read": self.kv_bytes_read + total.kv_bytes_read,
            "kv_bytes_written": self.kv_bytes_written + total.kv_bytes_written,
        }

    @property
    def flops_per_step(self) -> float:
        """FLOPs of the mean step (``perfsuite.engine.work``); 0 where the runner gave no model shape."""
        flops = self.prefill_flops + self.decode_flops
        return flops / self.num_forward_passes if self.num_forward_passes else 0.0

    def combined(self, other: EngineCounters) -> EngineCounters:
        """Two runs' counters as one run's: the sums, and the larger of each peak."""
        return self._fieldwise(other, operator.add, max)

    def since(self, earlier: EngineCounters) -> EngineCounters:
        """What one run's counters grew by since ``earlier`` (of the same run); the peaks as they are now."""
        return self._fieldwise(earlier, operator.sub, lambda now, _: now)

    def _fieldwise(
        self, other: EngineCounters, count: Callable[[int, int], int], peak: Callable[[int, int], int]
    ) -> EngineCounters:
        return EngineCounters(
            **{
                f.name: (peak if f.name.startswith("peak_") else count)(getattr(self, f.name), getattr(other, f.name))
                for f in fields(self)
            }
        )

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache over those looked up; None when nothing was looked up."""
        if not self.num_prefix_cache_queried_tokens:
            return None
        return self.num_prefix_cache_hit_tokens / self.num_prefix_cache_queried_tokens

    @property
    def mean_kv_blocks_used(self) -> float:
        """Blocks held in the mean step."""
        return self.kv_blocks_used_step_sum / self.num_forward_passes if self.num_forward_passes else 0.0

    @property
    def kv_utilisation(self) -> float:
        """Tokens held over the capacity of the blocks holding them, over all steps (each weighted by its blocks)."""
        if not self.kv_token_capacity_step_sum:
            return 0.0
        return self.kv_tokens_used_step_sum / self.kv_token_capacity_step_sum


@dataclass(frozen=True, slots=True)
class RunResult:
    """Everything one ``Engine.run`` observed."""

    engine_name: str
    records: tuple[RequestRecord, ...]
    start_time: float
    end_time: float
    counters: EngineCounters
    steps: tuple[StepTrace, ...] = ()
    num_kv_blocks: int | None = None  # the KV pool (a slot cache's slots); None: not perfsuite's engine
    kv_block_size: int | None = None  # tokens per block (a slot's max_seq_len)
    server_metrics: ServerMetrics | None = None  # a server's /metrics around the run; None: not exposed, in-process

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time

    def outputs(self) -> dict[str, tuple[int, ...]]:
        return {r.request_id: r.output_token_ids for r in self.records}

    def logprobs(self) -> dict[str, tuple[float, ...] | None]:
        """Each request's tokens' log-probabilities, None where the engine gave none."""
        return {r.request_id: r.output_logprobs for r in self.records}


def check_unique_ids(requests: Iterable[Request]) -> None:
    """Every engine refuses a run whose request ids repeat: records are keyed by id."""
    seen: set[str] = set()
    for request in requests:
        check_new_request_id(request.request_id, seen, "appears twice in the run")
        seen.add(request.request_id)


def check_new_request_id(request_id: str, ids_in_use: Container[str], clash: str) -> None:
    """Refuse an id already in ``ids_in_use``; ``clash`` says where it is in use, for the message."""
    if request_id in ids_in_use:
        raise ValueError(f"request_id {request_id!r} {clash}; give every request a unique id")
