"""Prefix cache figures: the hit rate (prompt tokens found cached over those looked up), evictions, and TTFT
split by whether a request's prompt hit the cache.

Two sources, one figure. perfsuite's own engine counts every lookup exactly (``EngineCounters``: a
readmission after preemption looks up again). A server counts for itself and tells each request how many of
its prompt tokens were cached (``usage.prompt_tokens_details.cached_tokens``, read into
``RequestRecord.num_cached_tokens``); its hit rate is SGLang's Σcached / Σprompt over the requests that said.
The engine's counters win when they looked anything up; the requests' reports stand in only for an engine
that counts no steps of its own (a server, an outside engine), so an engine without a cache, whose requests
report 0 cached tokens, shows no hit rate at all rather than a measured 0%.

Pure functions over ``measure.metrics.RequestMetrics`` and ``EngineCounters``; no torch.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perfsuite.engine.types import EngineCounters
from perfsuite.measure.metrics import RequestMetrics, percentile

# Per-request sample series (ms, every repeat) of TTFT for requests that found some of their prompt cached and
# for those that found none; written only when some request hit, beside ``ttft_ms``.
TTFT_HIT = "ttft_ms_hit"
TTFT_MISS = "ttft_ms_miss"


@dataclass(frozen=True, slots=True)
class CachedPrompts:
    """What the completed requests of every repeat reported about the prefix cache (those that said)."""

    num_requests: int  # requests that reported their cached tokens
    num_hits: int  # of them, those with at least one prompt token cached
    num_prompt_tokens: int
    num_cached_tokens: int

    @property
    def hit_rate(self) -> float | None:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else None


def cached_prompts(requests: Iterable[RequestMetrics]) -> CachedPrompts | None:
    """The reports summed; None when no request said how many of its prompt tokens were cached."""
    reporting = [r for r in requests if r.num_cached_tokens is not None]
    if not reporting:
        return None
    return CachedPrompts(
        num_requests=len(reporting),
        num_hits=sum(1 for r in reporting if r.num_cached_tokens),
        num_prompt_tokens=sum(r.num_prompt_tokens for r in reporting),
        num_cached_tokens=sum(r.num_cached_tokens or 0 for r in reporting),
    )


def ttft_by_cache_hit(requests: Sequence[RequestMetrics]) -> dict[str, tuple[float, ...]]:
    """TTFT in ms of the requests that hit the cache and of those that missed; empty when none hit (the split
    would be the whole TTFT again, or a run without a cache)."""
    timed = [r for r in requests if r.ttft is not None and r.num_cached_tokens is not None]
    if not any(r.num_cached_tokens for r in timed):
        return {}
    hits = tuple(1e3 * r.ttft for r in timed if r.num_cached_tokens)  # type: ignore[operator]
    misses = tuple(1e3 * r.ttft for r in timed if not r.num_cached_tokens)  # type: ignore[operator]
    return {name: values for name, values in ((TTFT_HIT, hits), (TTFT_MISS, misses)) if values}


class HitRateSource(enum.Enum):
    ENGINE = "engine counters"  # a test's: of its last repeat, as every counter
    REQUESTS = "requests' cached_tokens"  # a test's: summed over every repeat


@dataclass(frozen=True, slots=True)
class PrefixCacheFigures:
    """The hit rate a reader is shown, where it came from, and (the engine's only) evicted blocks."""

    num_hit_tokens: int
    num_queried_tokens: int
    source: HitRateSource
    num_evicted_blocks: int | None  # None: the server does not say

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens

    def describe(self) -> str:
        """``62.5% of 2,048 prompt tokens looked up (engine counters)``."""
        return f"{self.hit_rate:.1%} of {self.num_queried_tokens:,} prompt tokens looked up ({self.source.value})"


def prefix_cache_figures(counters: EngineCounters, prompts: CachedPrompts | None) -> PrefixCacheFigures | None:
    """The engine's counters when they looked anything up; else the requests' reports when the engine counts no
    steps of its own (the module docstring says why); else None: nothing was looked up, or nothing says."""
    if counters.num_prefix_cache_queried_tokens:
        return PrefixCacheFigures(
            num_hit_tokens=counters.num_prefix_cache_hit_tokens,
            num_queried_tokens=counters.num_prefix_cache_queried_tokens,
            source=HitRateSource.ENGINE,
            num_evicted_blocks=counters.num_evicted_blocks,
        )
    if prompts is None or not prompts.num_prompt_tokens or counters.num_forward_passes:
        return None
    return PrefixCacheFigures(
        num_hit_tokens=prompts.num_cached_tokens,
        num_queried_tokens=prompts.num_prompt_tokens,
        source=HitRateSource.REQUESTS,
        num_evicted_blocks=None,
    )


@dataclass(frozen=True, slots=True)
class TtftSplit:
    """TTFT of the requests that hit the cache and of those that missed: count, p50 and p90 in ms."""

    num_hits: int
    hit_p50_ms: float | None
    hit_p90_ms: float | None
    num_misses: int
    miss_p50_ms: float | None
    miss_p90_ms: float | None


def ttft_split(request_samples: dict[str, tuple[float, ...]] | None) -> TtftSplit | None:
    """The split from a test's per-request samples; None when it has none (no request hit, or an older file)."""
    samples = request_samples or {}
    hits, misses = samples.get(TTFT_HIT, ()), samples.get(TTFT_MISS, ())
    if not hits and not misses:
        return None

    def tails(values: Sequence[float]) -> tuple[float | None, float | None]:
        return (percentile(values, 50), percentile(values, 90)) if values else (None, None)

    return TtftSplit(len(hits), *tails(hits), len(misses), *tails(misses))
