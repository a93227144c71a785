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
    """

    request: Request
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    finish_reason: FinishReason | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

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
        prompt = self.request.prompt_token_ids
        if stop <= len(prompt):
            return prompt[start:stop]
        return (prompt + tuple(self.output_token_ids))[start:stop]

    def append_token(self, token_id: int, eos_token_id: int | None) -> FinishReason | None:
        self.output_token_ids.append(token_id)
        return self.request.sampling_params.finish_reason(token_id, len(self.output_token_ids), eos_token_id)
