"""Shared-prefix groups: prompts that share exactly their first tokens within a group, and none across groups.

The shape of SGLang's ``generated-shared-prefix`` and inference-perf's
``shared_prefix``: ``groups`` x ``prompts`` per group, each prompt a
``prefix``-token block its group shares followed by a ``suffix`` of its own,
asking for ``output`` new tokens. Token ids, not text, so the lengths are exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from perfsuite.engine.types import Request, SamplingParams
from perfsuite.workload.checks import check_int
from perfsuite.workload.limits import check_fits_context, check_num_requests, check_prompt_tokens
from perfsuite.workload.prompts import Vocab

SHARED_PREFIX_KEYS = ("groups", "prompts", "prefix", "suffix", "output")


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """``groups`` x ``prompts`` requests ``g<group>-p<prompt>``, in a seeded shuffled order.

    Within a group every prompt starts with the same ``prefix`` tokens and
    then differs at its first suffix token (so the shared part is exactly the
    prefix); groups differ at their first token. ``suffix`` may be 0: a
    group's prompts are then identical.
    """

    groups: int
    prompts: int
    prefix: int
    suffix: int = 32
    output: int = 32

    def __post_init__(self) -> None:
        check_int(self.groups, "shared_prefix.groups")
        check_int(self.prompts, "shared_prefix.prompts")
        check_int(self.prefix, "shared_prefix.prefix")
        check_int(self.suffix, "shared_prefix.suffix", minimum=0)
        check_int(self.output, "shared_prefix.output")
        what = f"shared_prefix groups x prompts = {self.groups} x {self.prompts}"
        check_num_requests(self.num_requests, what, "lower groups or prompts")
        check_prompt_tokens(
            self.num_requests * (self.prefix + self.suffix),
            f"shared_prefix groups x prompts x (prefix + suffix) = {self.groups} x {self.prompts} x "
            f"({self.prefix} + {self.suffix})",
            "lower groups or prompts, or shorten prefix or suffix",
        )

    @property
    def num_requests(self) -> int:
        return self.groups * self.prompts

    @property
    def max_total_tokens(self) -> int:
        """Prompt and output tokens of each request, so of the longest."""
        return self.prefix + self.suffix + self.output

    def check_context(self, max_context: int) -> None:
        what = f"each shared_prefix request (prefix + suffix + output = {self.prefix} + {self.suffix} + {self.output})"
        check_fits_context(self.max_total_tokens, max_context, what, "shorten prefix, suffix or output")

    @property
    def label(self) -> str:
        return f"sp{self.groups}x{self.prompts}-prefix{self.prefix}-suffix{self.suffix}-out{self.output}"

    def prompt_token_ids(self, rng: random.Random, vocab: Vocab) -> dict[str, tuple[int, ...]]:
        """Each request id's prompt."""
        group_starts = vocab.draw_distinct(rng, self.groups, "shared_prefix.groups")
        prompts = {}
        for group, start in enumerate(group_starts):
            prefix = (start, *vocab.draw(rng, self.prefix - 1))
            suffix_starts = vocab.draw_distinct(rng, self.prompts, "shared_prefix.prompts") if self.suffix else ()
            for index in range(self.prompts):
                suffix = (suffix_starts[index], *vocab.draw(rng, self.suffix - 1)) if self.suffix else ()
                prompts[f"g{group}-p{index}"] = prefix + suffix
        return prompts

    def requests(self, vocab: Vocab, seed: int, arrival_times: list[float]) -> list[Request]:
        rng = random.Random(f"{seed}:shared_prefix")
        prompts = list(self.prompt_token_ids(rng, vocab).items())
        rng.shuffle(prompts)  # groups interleave, as users of one system prompt arrive among others
        params = SamplingParams(self.output, ignore_eos=True)
        return [
            Request(request_id, prompt, params, arrival_time=arrival)
            for (request_id, prompt), arrival in zip(prompts, arrival_times, strict=True)
        ]
