"""Mutable per-request state owned by a scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from perfsuite.engine.types import FinishReason, Request


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """A request as the scheduler tracks it.

    ``num_computed_tokens`` counts tokens whose keys and values sit in the
    sequence's cache slot. The last sampled token is not computed yet: a decode
    step computes it and samples the next one.

    ``all_token_ids`` is the prompt followed by the output so far, one list
    appended in place, so a step reads its chunk without copying the prompt.

    A preempted sequence (paged engine) loses its cache: ``num_computed_tokens``
    drops to 0 and ``num_previously_computed_tokens`` keeps how far it had
    got, so the tokens computed again are counted as recomputed.

    ``num_cached_tokens``: the tokens a prefix cache held for it at its first
    admission (None until it is admitted; 0 for an engine without one).
    """

    request: Request
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    num_previously_computed_tokens: int = 0
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.request.prompt_token_ids)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        return tuple(self.all_token_ids[start:stop])

    def append_token(self, token_id: int, eos_token_id: int | None) -> FinishReason | None:
        self.all_token_ids.append(token_id)
        return self.request.sampling_params.finish_reason(token_id, self.num_output_tokens, eos_token_id)
