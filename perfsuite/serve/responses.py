"""The JSON bodies of completion and chat completion answers, whole or as server-sent events.

``/v1/completions`` answers ``text_completion`` objects whose choices carry
``text``; ``/v1/chat/completions`` answers ``chat.completion`` (a ``message``
per choice) or, streamed, ``chat.completion.chunk`` (a ``delta`` per choice,
the first of each choice with ``role``). Every choice carries its ``index`` (its
prompt's place in the request) and the generated ``token_ids``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from perfsuite.engine import FinishReason
from perfsuite.serve.completion_request import CHAT, CompletionRequest

_FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True, slots=True)
class CompletionEnvelope:
    """What every response body of one request shares."""

    completion_id: str
    created: int
    model: str
    request: CompletionRequest

    @property
    def is_chat(self) -> bool:
        return self.request.api == CHAT

    def body(self, choices: list[dict], usage: dict | None = None) -> dict:
        """A whole answer, or (streamed) one chunk."""
        if self.is_chat:
            kind = "chat.completion.chunk" if self.request.stream else "chat.completion"
        else:
            kind = "text_completion"
        body = {
            "id": self.completion_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None or self.request.include_usage:
            body["usage"] = usage
        return body

    def usage(self, num_output_tokens: int, num_cached_tokens: int | None = None) -> dict:
        """OpenAI's usage; with ``prompt_tokens_details.cached_tokens`` (vLLM's and OpenAI's field) when the
        engine said how many prompt tokens it found in its prefix cache."""
        num_prompt_tokens = self.request.num_prompt_tokens
        usage: dict = {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens,
        }
        if num_cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
        return usage

    def choice(self, index: int, text: str, token_ids: list[int], finish_reason: FinishReason | None) -> dict:
        """A whole choice (not streamed)."""
        if self.is_chat:
            return _chat_choice(index, "message", {"role": "assistant", "content": text}, token_ids, finish_reason)
        return _text_choice(index, text, token_ids, finish_reason)

    def chunk_choice(
        self, index: int, text: str, token_ids: list[int], finish_reason: FinishReason | None, is_first: bool
    ) -> dict:
        """One streamed piece of a choice."""
        if self.is_chat:
            delta = {"role": "assistant", "content": text} if is_first else {"content": text}
            return _chat_choice(index, "delta", delta, token_ids, finish_reason)
        return _text_choice(index, text, token_ids, finish_reason)


def _text_choice(index: int, text: str, token_ids: list[int], finish_reason: FinishReason | None) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": _finish(finish_reason),
        "token_ids": token_ids,
    }


def _chat_choice(index: int, key: str, message: dict, token_ids: list[int], finish_reason: FinishReason | None) -> dict:
    return {
        "index": index,
        key: message,
        "logprobs": None,
        "finish_reason": _finish(finish_reason),
        "token_ids": token_ids,
    }


def _finish(finish_reason: FinishReason | None) -> str | None:
    return None if finish_reason is None else _FINISH_REASONS[finish_reason]


def sse_event(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
