"""Seeded workloads: which prompts arrive when, asking for how many tokens.

Pure Python; a tokenizer is passed in as a function.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

from perfsuite.engine.types import Request, SamplingParams


def shipped_prompts() -> tuple[str, ...]:
    """The small prompt set shipped with perfsuite, one prompt a line."""
    text = resources.files("perfsuite").joinpath("data/prompts.txt").read_text(encoding="utf-8")
    # Prompts keep their trailing space ("Fun fact of the day: "), as seed 000 used them.
    return tuple(line.rstrip("\n") for line in text.splitlines() if line.strip())


@dataclass(frozen=True, slots=True)
class MixedWorkload:
    """Shipped prompts with output lengths uniform in ``min_new_tokens..max_new_tokens``.

    EOS is ignored so every request produces exactly its drawn length and
    runs are comparable; every request arrives at t0 (an offline run).
    """

    num_requests: int = 32
    min_new_tokens: int = 8
    max_new_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if not 1 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                "need 1 <= min_new_tokens <= max_new_tokens, got "
                f"min_new_tokens={self.min_new_tokens}, max_new_tokens={self.max_new_tokens}"
            )

    def output_lengths(self) -> list[int]:
        rng = random.Random(self.seed)
        return [rng.randint(self.min_new_tokens, self.max_new_tokens) for _ in range(self.num_requests)]

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
            )
            for index, length in enumerate(self.output_lengths())
        ]
