"""The JSON body of one streamed, greedy request to an OpenAI-compatible server.

Completions (``/v1/completions``) send the prompt as token ids or as text;
chat (``/v1/chat/completions``) sends it as one user message. Text is the
prompt's ids detokenized with the backend's tokenizer, special tokens kept:
the server re-tokenizes it, so the ids it computes on may differ from the
workload's (a tokenizer need not round-trip, and a server may add a BOS token
or, for chat, its template).

How a request that ignores EOS is asked to run to ``max_new_tokens`` follows
``HttpClientOptions.eos_control``: vLLM's ``ignore_eos`` (which keeps EOS
selectable), ``min_tokens`` (which servers such as llama.cpp honour instead),
or both. ``min_tokens`` is not sent when the request has stop token ids: it
would keep them from stopping it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.engine.types import Request

TOKEN_IDS = "token_ids"
TEXT = "text"

Detokenize = Callable[[Sequence[int]], str]


@dataclass(frozen=True, slots=True)
class PayloadBuilder:
    """Bodies for one server, once the prompt format is settled (``token_ids`` or ``text``)."""

    options: HttpClientOptions
    model_id: str
    prompt_format: str
    detokenize: Detokenize | None

    def __post_init__(self) -> None:
        if self.prompt_format not in (TOKEN_IDS, TEXT):
            raise ValueError(f"prompt_format must be settled to {TOKEN_IDS!r} or {TEXT!r}, got {self.prompt_format!r}")
        if self.sends_text and self.detokenize is None:
            raise ValueError(
                "a text prompt (prompt_format 'text', or the chat API) is the prompt's ids detokenized, and this "
                "backend has no tokenizer to do it; use a backend loaded from a Hugging Face model"
            )

    @property
    def sends_text(self) -> bool:
        return self.options.api == "chat" or self.prompt_format == TEXT

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.options.api == "chat" else "/v1/completions"

    def payload(self, request: Request) -> dict:
        params = request.sampling_params
        body: dict = {"model": self.model_id}
        if self.options.api == "chat":
            body["messages"] = [{"role": "user", "content": self._text(request)}]
            body["max_completion_tokens"] = params.max_new_tokens
        else:
            body["prompt"] = self._text(request) if self.sends_text else list(request.prompt_token_ids)
            body["return_token_ids"] = True  # vLLM: the exact output ids in every chunk
        body["max_tokens"] = params.max_new_tokens
        body.update(temperature=0.0, stream=True, stream_options={"include_usage": True})
        body.update(self._eos_fields(request))
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        return body

    def _text(self, request: Request) -> str:
        assert self.detokenize is not None  # __post_init__: a builder that sends text has a detokenizer
        return self.detokenize(request.prompt_token_ids)

    def _eos_fields(self, request: Request) -> dict:
        params = request.sampling_params
        fields: dict = {}
        if self.options.sends_ignore_eos:
            fields["ignore_eos"] = params.ignore_eos
        if self.options.sends_min_tokens and params.ignore_eos and not params.stop_token_ids:
            fields["min_tokens"] = params.max_new_tokens
        return fields


def detokenizer(tokenizer: Any) -> Detokenize:
    """A Hugging Face tokenizer's ``decode`` that keeps every token (special ones too) and its spacing."""

    def detokenize(token_ids: Sequence[int]) -> str:
        return tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return detokenize
