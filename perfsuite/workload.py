"""Seeded workloads: which prompts arrive when, asking for how many tokens.

Pure Python; a tokenizer is passed in as a function.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources

from perfsuite.engine.types import Request, SamplingParams

LENGTH_KINDS = ("fixed", "uniform", "exponential")


def shipped_prompts() -> tuple[str, ...]:
    """The small prompt set shipped with perfsuite, one prompt a line."""
    text = resources.files("perfsuite").joinpath("data/prompts.txt").read_text(encoding="utf-8")
    # Prompts keep their trailing space ("Fun fact of the day: "), as seed 000 used them.
    return tuple(line.rstrip("\n") for line in text.splitlines() if line.strip())


@dataclass(frozen=True, slots=True)
class OutputLengths:
    """How many new tokens each request asks for.

    - ``fixed``: every request asks for ``high``;
    - ``uniform``: uniform in ``low..high``;
    - ``exponential``: exponential with mean ``mean``, at least ``low`` and capped
      at ``high`` (like Anyscale's benchmark: mean 64, cap 256).
    """

    kind: str = "uniform"
    low: int = 8
    high: int = 128
    mean: float = 64.0

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"lengths.kind must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}")
        if not 1 <= self.low <= self.high:
            raise ValueError(
                f"output lengths need 1 <= low <= high, got low (min_new_tokens)={self.low}, "
                f"high (max_new_tokens)={self.high}"
            )
        if self.mean <= 0:
            raise ValueError(f"lengths.mean must be > 0, got {self.mean}")

    def sample(self, rng: random.Random, count: int) -> list[int]:
        if self.kind == "fixed":
            return [self.high] * count
        if self.kind == "uniform":
            return [rng.randint(self.low, self.high) for _ in range(count)]
        return [min(self.high, max(self.low, round(rng.expovariate(1 / self.mean)))) for _ in range(count)]


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When requests arrive: all at t0 (``rate=None``) or a Poisson process of ``rate`` req/s."""

    rate: float | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"arrivals.rate must be > 0 requests/s or None for offline, got {self.rate}")

    def times(self, rng: random.Random, count: int) -> list[float]:
        if self.rate is None:
            return [0.0] * count
        now, times = 0.0, []
        for _ in range(count):
            times.append(now)
            now += rng.expovariate(self.rate)
        return times


@dataclass(frozen=True, slots=True)
class Workload:
    """Shipped prompts, drawn output lengths and arrival times, all from one seed.

    EOS is ignored so every request produces exactly its drawn length and runs
    are comparable.
    """

    num_requests: int = 32
    lengths: OutputLengths = field(default_factory=OutputLengths)
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")

    def output_lengths(self) -> list[int]:
        return self.lengths.sample(random.Random(self.seed), self.num_requests)

    def arrival_times(self) -> list[float]:
        return self.arrivals.times(random.Random(self.seed + 1), self.num_requests)

    def requests(self, tokenize: Callable[[str], Sequence[int]], prompts: Sequence[str] | None = None) -> list[Request]:
        prompts = shipped_prompts() if prompts is None else tuple(prompts)
        if not prompts:
            raise ValueError("the prompt set is empty; pass at least one prompt")
        token_ids = [tuple(tokenize(p)) for p in prompts]
        return [
            Request(
                request_id=f"req-{index}",
                prompt_token_ids=token_ids[index % len(prompts)],
                sampling_params=SamplingParams(max_new_tokens=length, ignore_eos=True),
                arrival_time=arrival,
            )
            for index, (length, arrival) in enumerate(zip(self.output_lengths(), self.arrival_times()))
        ]


def mixed_workload(num_requests: int = 32, min_new_tokens: int = 8, max_new_tokens: int = 128, seed: int = 0) -> Workload:
    """The default mixed workload: uniform 8..128 new tokens, all at t0."""
    return Workload(num_requests, OutputLengths("uniform", min_new_tokens, max_new_tokens), seed=seed)
