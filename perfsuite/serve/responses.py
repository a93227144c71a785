"""The JSON bodies of ``/v1/completions`` answers, whole or as server-sent events."""

from __future__ import annotations

import json
from dataclasses import dataclass

from perfsuite.engine import FinishReason
from perfsuite.serve.completion_request import CompletionRequest

_FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True, slots=True)
class CompletionEnvelope:
    """What every response body of one request shares."""

    completion_id: str
    created: int
    model: str
    request: CompletionRequest

    def body(self, choices: list[dict], usage: dict | None = None) -> dict:
        body = {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None or self.request.include_usage:
            body["usage"] = usage
        return body

    def usage(self, num_output_tokens: int) -> dict:
        num_prompt_tokens = len(self.request.prompt_token_ids)
        return {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens,
        }


def choice(text: str, token_ids: list[int], finish_reason: FinishReason | None) -> dict:
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": None if finish_reason is None else _FINISH_REASONS[finish_reason],
        "token_ids": token_ids,
    }


def sse_event(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
