"""The work a step does: its FLOPs and the bytes it moves, counted from its chunks and the model's shapes.

Pure Python (no torch), so the engine counts every step's work as it runs
and a test can prove the count against ``torch.utils.flop_counter``
(tests/test_work.py). What is counted, per real token (padding rows are the
cost of static batching, not work; prefix-cache hits are never scheduled, so
they cost only the reads of their keys):

- every projection of every layer: 2 x rows x in x out (query-key-value,
  output, gate-up, down), and the lm head over the rows that sample only
  (a chunked prefill's chunk that stops short of the prompt's end samples
  nothing, as the runner does);
- attention scores and values: a query at position p attends over its p + 1
  keys, 2 x head_dim x (p + 1) per query head for the scores and as many for
  the values. This is the causal triangle, the work the model needs; the
  runner's SDPA computes its padded, masked rectangle (the test bounds that);
- RMSNorm: 4 per element (square, sum, scale, weight), the two of each layer
  over every token and the final one over the sampled rows.

Bytes, at the model's dtype: every weight once a step (the lm head and the
final norm only when a row samples), the embedding rows of the step's
tokens, each chunk's keys and values read over its whole context (its own
new tokens included) and written for its new tokens. A step that mixes
prefill and decode chunks splits its shared weight reads between the two by
their tokens; everything else belongs to one chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Chunk(Protocol):
    """What the count reads of ``perfsuite.engine.types.ScheduledChunk`` (types.py imports this module).

    Read-only members: a frozen dataclass's fields and its ``num_tokens`` property both satisfy them.
    """

    @property
    def num_tokens(self) -> int: ...
    @property
    def start_position(self) -> int: ...
    @property
    def samples(self) -> bool: ...
    @property
    def is_prefill(self) -> bool: ...
    @property
    def is_padding(self) -> bool: ...


NORM_FLOPS_PER_ELEMENT = 4


def _config_value(config: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """A Hugging Face config's value: a key of its dict, or an attribute of a ``PretrainedConfig``."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A Llama-architecture decoder's shapes and its weights' element size: all a step's work depends on."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, dtype_bytes: int) -> ModelShape:
        """From a Hugging Face config (a ``LlamaConfig`` or its dict, e.g. ``spec.RANDOM_CONFIGS[name]``)."""
        get = functools.partial(_config_value, config)
        num_heads = get("num_attention_heads")
        return cls(
            num_layers=get("num_hidden_layers"),
            hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"),
            num_heads=num_heads,
            num_kv_heads=get("num_key_value_heads") or num_heads,
            head_dim=get("head_dim") or get("hidden_size") // num_heads,
            vocab_size=get("vocab_size"),
            dtype_bytes=dtype_bytes,
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            attention_bias=bool(get("attention_bias", False)),
        )

    @property
    def qkv_size(self) -> int:
        """Outputs of the fused query-key-value projection: every query head, and the keys and values of each KV head."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def layer_matmul_elements(self) -> int:
        """Weight elements of one layer's projections (a token's multiply-adds through them)."""
        attention = self.hidden_size * self.qkv_size + self.num_heads * self.head_dim * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_weight_bytes(self) -> int:
        biases = self.qkv_size if self.attention_bias else 0
        return (self.layer_matmul_elements + 2 * self.hidden_size + biases) * self.dtype_bytes

    @property
    def head_weight_bytes(self) -> int:
        """The final norm and the lm head: read by a step that samples."""
        return (self.hidden_size + self.vocab_size * self.hidden_size) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's keys and values over every layer."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_parameters(self) -> int:
        """Parameters of the model (a tied lm head is the embedding, counted once)."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (
            self.vocab_size * self.hidden_size
            + head
            + self.hidden_size
            + self.num_layers * self.layer_weight_bytes // self.dtype_bytes
        )


@dataclass(frozen=True, slots=True)
class Work:
    """FLOPs and bytes of some chunks of a step (integers: exact, summed over steps)."""

    matmul_flops: int = 0
    norm_flops: int = 0
    weight_bytes_read: int = 0
    kv_bytes_read: int = 0
    kv_bytes_written: int = 0
    num_tokens: int = 0

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.norm_flops

    @property
    def bytes_moved(self) -> int:
        return self.weight_bytes_read + self.kv_bytes_read + self.kv_bytes_written

    def plus(self, other: Work) -> Work:
        return Work(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(work: Work) -> tuple[int, ...]:
    return (
        work.matmul_flops,
        work.norm_flops,
        work.weight_bytes_read,
        work.kv_bytes_read,
        work.kv_bytes_written,
        work.num_tokens,
    )


@dataclass(frozen=True, slots=True)
class StepWork:
    """A step's work split by kind: its prefill chunks' and its decode chunks'."""

    prefill: Work = Work()
    decode: Work = Work()

    @property
    def total(self) -> Work:
        return self.prefill.plus(self.decode)


def chunk_work(chunk: Chunk, shape: ModelShape) -> Work:
    """One chunk's own work: its tokens through the layers, its attention, its lm head row, its keys and values.

    Not the layers' weights, which a step reads once for all its chunks (``step_work``).
    """
    return chunks_work((chunk,), shape)


def chunks_work(chunks: Iterable[Chunk], shape: ModelShape) -> Work:
    """The chunks' own work, summed (``chunk_work`` of each); in one pass of integer sums, as the engine counts
    every step: a Work per chunk cost 150 us a 32-row step."""
    tokens = attended_keys = context = sampled = 0
    for chunk in chunks:
        n, start = chunk.num_tokens, chunk.start_position
        tokens += n
        attended_keys += n * start + n * (n + 1) // 2  # positions start .. start + n - 1 each see position + 1 keys
        context += start + n
        sampled += 1 if chunk.samples else 0
    per = _per_unit(shape)
    return Work(
        matmul_flops=tokens * per.token_flops + attended_keys * per.key_flops + sampled * per.head_flops,
        norm_flops=tokens * per.token_norm_flops + sampled * per.head_norm_flops,
        weight_bytes_read=tokens * per.embedding_row_bytes,  # the tokens' embedding rows
        kv_bytes_read=context * shape.kv_bytes_per_token,
        kv_bytes_written=tokens * shape.kv_bytes_per_token,
        num_tokens=tokens,
    )


@dataclass(frozen=True, slots=True)
class _PerUnit:
    token_flops: int  # a token through every layer's projections
    key_flops: int  # a query attending over one key, every head and layer (scores and values)
    head_flops: int  # a sampled row through the lm head
    token_norm_flops: int
    head_norm_flops: int
    embedding_row_bytes: int
    step_weight_bytes: int  # every layer's weights
    head_weight_bytes: int


@functools.lru_cache(maxsize=16)
def _per_unit(shape: ModelShape) -> _PerUnit:
    """A shape's work per token, key and sampled row, computed once: the engine counts every step."""
    return _PerUnit(
        token_flops=2 * shape.num_layers * shape.layer_matmul_elements,
        key_flops=4 * shape.num_layers * shape.num_heads * shape.head_dim,
        head_flops=2 * shape.hidden_size * shape.vocab_size,
        token_norm_flops=NORM_FLOPS_PER_ELEMENT * shape.hidden_size * 2 * shape.num_layers,
        head_norm_flops=NORM_FLOPS_PER_ELEMENT * shape.hidden_size,
        embedding_row_bytes=shape.hidden_size * shape.dtype_bytes,
        step_weight_bytes=shape.num_layers * shape.layer_weight_bytes,
        head_weight_bytes=shape.head_weight_bytes,
    )


def step_work(chunks: Iterable[Chunk], shape: ModelShape) -> StepWork:
    """The work of a step of ``chunks``; padding rows are not work."""
    real = [chunk for chunk in chunks if not chunk.is_padding]
    if not real:
        return StepWork()
    prefill = chunks_work((chunk for chunk in real if chunk.is_prefill), shape)
    decode = chunks_work((chunk for chunk in real if not chunk.is_prefill), shape)
    per = _per_unit(shape)
    weights = per.step_weight_bytes + (per.head_weight_bytes if any(chunk.samples for chunk in real) else 0)
    prefill_share = weights * prefill.num_tokens // (prefill.num_tokens + decode.num_tokens)
    return StepWork(
        prefill=prefill.plus(Work(weight_bytes_read=prefill_share)),
        decode=decode.plus(Work(weight_bytes_read=weights - prefill_share)),
    )
