"""The workload: prompts, output lengths and arrival times drawn from one seed, turned into requests."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.engine.types import Request, SamplingParams
from perfsuite.workload.arrivals import Arrivals, parse_arrivals
from perfsuite.workload.checks import check_int, is_int, reject_unknown_keys
from perfsuite.workload.lengths import OutputLengths, parse_output_lengths
from perfsuite.workload.limits import check_arrival_times, check_fits_context, check_num_requests, check_prompt_tokens
from perfsuite.workload.prompts import (
    JsonlPrompts,
    PromptSource,
    ShippedPrompts,
    SyntheticPrompts,
    Vocab,
    parse_prompts,
    shipped_prompts,
)

WORKLOAD_KEYS = ("arrivals", "num_requests", "output_lengths", "prompts", "seed")


@dataclass(frozen=True, slots=True)
class Workload:
    """Prompts, output lengths and arrival times, all from one seed.

    EOS is ignored so every request produces exactly its drawn length and runs
    are comparable.
    """

    num_requests: int = 32
    lengths: OutputLengths = field(default_factory=OutputLengths)
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0
    prompts: PromptSource = field(default_factory=ShippedPrompts)

    def __post_init__(self) -> None:
        check_int(self.num_requests, "num_requests")
        if not is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.lengths.kind == "from_file" and not isinstance(self.prompts, JsonlPrompts):
            raise ValueError(
                "output_lengths kind 'from_file' reads output_len from a JSONL prompt file, "
                f"but the prompts are {self.prompts.description}; use JSONL prompts "
                '(prompts = {kind = "jsonl", path = "..."} in a config) or another output_lengths kind'
            )
        check_num_requests(self.num_requests, "num_requests", "lower num_requests")
        if isinstance(self.prompts, SyntheticPrompts):
            what = f"num_requests x prompts.high = {self.num_requests} x {self.prompts.lengths.high}"
            check_prompt_tokens(self.num_requests * self.prompts.lengths.high, what, "lower either")
        if self.arrivals.rate is not None:
            names = [f"req-{index}" for index in range(self.num_requests)]
            fix = f"raise arrivals.rate above {self.arrivals.rate:g} req/s or lower num_requests"
            check_arrival_times(self.arrival_times(), names, fix)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], *, base_dir: Path | None = None) -> Workload:
        """A workload from plain data; each key as in ``parse_prompts``, ``parse_output_lengths``, ``parse_arrivals``.

        ``{"num_requests": 8, "seed": 0, "prompts": 32, "output_lengths": {"kind": "uniform", "low": 4,
        "high": 24}, "arrivals": {"rate": 4.0}}``; a JSONL path is relative to ``base_dir``.
        """
        if not isinstance(spec, Mapping):
            raise ValueError(f"a workload spec must be a table of {', '.join(WORKLOAD_KEYS)}, got {spec!r}")
        reject_unknown_keys(spec, WORKLOAD_KEYS, "workload key")
        defaults = cls()
        return cls(
            num_requests=spec.get("num_requests", defaults.num_requests),
            lengths=parse_output_lengths(spec["output_lengths"]) if "output_lengths" in spec else defaults.lengths,
            arrivals=parse_arrivals(spec["arrivals"]) if "arrivals" in spec else defaults.arrivals,
            seed=spec.get("seed", defaults.seed),
            prompts=parse_prompts(spec["prompts"], base_dir) if "prompts" in spec else defaults.prompts,
        )

    @property
    def max_concurrency(self) -> int | None:
        """Pass to ``Engine.run(requests, max_concurrency=...)``; None for an open loop."""
        return self.arrivals.concurrency

    @property
    def label(self) -> str:
        """A readable id such as ``in32-out_uniform4_24-4rps``."""
        return f"{self.prompts.label}-{self.lengths.label}-{self.arrivals.label}"

    def check_context(self, max_context: int) -> None:
        """Refuse the longest synthetic request that cannot fit the model's context (text is checked once tokenized)."""
        if isinstance(self.prompts, SyntheticPrompts):
            what = f"the longest request (prompts.high + output_lengths.high = {self.prompts.lengths.high} + "
            what += f"{self.lengths.high})"
            fix = "lower prompts.high or output_lengths.high"
            check_fits_context(self.prompts.lengths.high + self.lengths.high, max_context, what, fix)

    def output_lengths(self) -> list[int]:
        if self.lengths.kind == "from_file":
            assert isinstance(self.prompts, JsonlPrompts), "__post_init__ refuses from_file without JSONL prompts"
            from_file = self.prompts.output_lengths()
            return [from_file[index % len(from_file)] for index in range(self.num_requests)]
        return self.lengths.sample(random.Random(self.seed), self.num_requests)

    def arrival_times(self) -> list[float]:
        return self.arrivals.times(random.Random(self.seed + 1), self.num_requests)

    def prompt_token_ids(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        texts: Sequence[str] | None = None,
        vocab: Vocab | None = None,
    ) -> list[tuple[int, ...]]:
        """One prompt per request; text prompts repeat in order when there are fewer than requests."""
        if isinstance(self.prompts, SyntheticPrompts):
            if texts is not None:
                raise ValueError("prompts= replaces the shipped prompt set; this workload's prompts are synthetic")
            if vocab is None:
                raise ValueError("synthetic prompts need vocab=Vocab(size=..., special_ids=(eos, bos, ...))")
            # A string seed keeps this stream apart from the lengths' and arrivals' integer seeds.
            return self.prompts.token_ids(random.Random(f"{self.seed}:prompts"), self.num_requests, vocab)
        texts = self._texts(texts)
        if tokenize is None:
            raise ValueError(f"{self.prompts.description} is text; pass tokenize=")
        token_ids = [tuple(tokenize(text)) for text in texts]
        return [token_ids[index % len(texts)] for index in range(self.num_requests)]

    def _texts(self, override: Sequence[str] | None) -> tuple[str, ...]:
        if isinstance(self.prompts, JsonlPrompts):
            if override is not None:
                raise ValueError(f"prompts= replaces the shipped prompt set; this workload reads {self.prompts.path}")
            return tuple(line.text for line in self.prompts.lines())
        texts = shipped_prompts() if override is None else tuple(override)
        if not texts:
            raise ValueError("the prompt set is empty; pass at least one prompt")
        return texts

    def requests(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        prompts: Sequence[str] | None = None,
        *,
        vocab: Vocab | None = None,
    ) -> list[Request]:
        """The requests, ``req-0`` onwards; ``prompts`` (texts) replaces the shipped set."""
        token_ids = self.prompt_token_ids(tokenize, prompts, vocab)
        return [
            Request(
                request_id=f"req-{index}",
                prompt_token_ids=token_ids[index],
                sampling_params=SamplingParams(max_new_tokens=length, ignore_eos=True),
                arrival_time=arrival,
            )
            for index, (length, arrival) in enumerate(zip(self.output_lengths(), self.arrival_times()))
        ]


def mixed_workload(
    num_requests: int = 32, min_new_tokens: int = 8, max_new_tokens: int = 128, seed: int = 0
) -> Workload:
    """The default mixed workload: uniform 8..128 new tokens, all at t0."""
    return Workload(num_requests, OutputLengths("uniform", min_new_tokens, max_new_tokens), seed=seed)
