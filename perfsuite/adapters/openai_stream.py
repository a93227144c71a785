"""One streamed OpenAI completion (server-sent events) read into a ``RequestRecord``.

How tokens are counted and timed, per request:

- **Exact**: every chunk that carried output also carried ``token_ids`` (perfsuite
  serve; vLLM with ``return_token_ids``). The output is those ids; a chunk's
  tokens all get its arrival time. A ``usage`` count that differs from the ids
  received is an error naming the request: the stream lost or invented tokens.
- **Text only** (llama.cpp, or any server that streams ``text``/``delta.content``
  without ids): the count is the server's ``usage.completion_tokens`` when it
  sends one, else the number of tokens of the whole streamed text re-tokenized
  with the backend's tokenizer. ``output_token_ids`` is that re-tokenized text
  (not the server's ids), and ``token_times`` holds one arrival per chunk that
  carried text: the client cannot see when each token inside a chunk was made,
  so it claims no more timestamps than it observed.

Tokens are never invented: no id or time is repeated to make up a count.

**Prompt tokens**: the server's ``usage.prompt_tokens``, when it sends one, is the record's ``num_prompt_tokens``
(a chat template's tokens are part of what the server computed); where it differs from the prompt perfsuite
built, that count is kept too, as ``num_client_prompt_tokens``. Completion tokens follow the counting rule above.

**Prefix cache**: a server that says how many of the prompt's tokens it found in its prefix cache
(``usage.prompt_tokens_details.cached_tokens``: vLLM with ``--enable-prompt-tokens-details``, in the final
usage chunk that ``stream_options.include_usage`` asks for; SGLang) has it read into
``RequestRecord.num_cached_tokens``, at most the record's prompt tokens; a server that does not say (no ``prompt_tokens_details``, or a
null one) leaves it None. Anything but a non-negative integer is an error naming the request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perfsuite.adapters.error_body import error_message
from perfsuite.engine.types import FinishReason, Request, RequestRecord

_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}

COUNTED_FROM_IDS = "token ids"
COUNTED_FROM_USAGE = "the server's usage"
COUNTED_FROM_TEXT = "the streamed text re-tokenized"


class OpenAIHttpError(RuntimeError):
    """A request the server did not complete; the message names the request and the cause."""


class ServerRejectedError(OpenAIHttpError):
    """The server answered a request with an HTTP error status (``status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Piece:
    """The output one chunk delivered: its text, and its token ids when the server sent them."""

    arrival: float
    text: str
    token_ids: tuple[int, ...] | None  # None: the chunk carried text without ids


@dataclass(slots=True)
class StreamState:
    """What one streamed completion has delivered so far."""

    request_id: str
    pieces: list[Piece] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_usage_tokens: int | None = None
    num_usage_prompt_tokens: int | None = None  # usage.prompt_tokens; None: not said
    num_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: not said
    is_done: bool = False

    def take(self, data: str, arrival: float) -> list[Piece]:
        """Take one ``data:`` payload; the pieces of output it carried (for progress)."""
        if data == "[DONE]":
            self.is_done = True
            return []
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise TypeError(f"a chunk must be a JSON object, got {data[:200]}")
        if "error" in chunk:
            raise OpenAIHttpError(
                f"request {self.request_id!r}: the server failed mid-stream: {error_message(json.dumps(chunk))}"
            )
        new_pieces = []
        for choice in chunk.get("choices") or []:
            piece = _piece(choice, arrival)
            if piece is not None:
                new_pieces.append(piece)
            self._take_finish_reason(choice.get("finish_reason"))
        self.pieces.extend(new_pieces)
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.num_usage_tokens = int(usage["completion_tokens"])
        if isinstance(usage, dict):
            prompt_tokens = self._count(usage.get("prompt_tokens"), "prompt_tokens")
            if prompt_tokens is not None:
                self.num_usage_prompt_tokens = prompt_tokens
            self._take_cached_tokens(usage.get("prompt_tokens_details"))
        return new_pieces

    def _count(self, value: object, name: str) -> int | None:
        """A usage count: None where not said, else an integer >= 0 or an error naming the request."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OpenAIHttpError(
                f"request {self.request_id!r}: the server's usage.{name} is {value!r}, not a count of tokens (an "
                "integer >= 0); the server's usage is malformed (report it to the server's maintainers)"
            )
        return value

    def _take_cached_tokens(self, details: object) -> None:
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is not None:
            self.num_cached_tokens = self._count(cached, "prompt_tokens_details.cached_tokens")

    def _take_finish_reason(self, reason: object) -> None:
        if reason is None:
            return
        if reason not in _FINISH_REASONS:
            raise OpenAIHttpError(f"request {self.request_id!r}: the server finished it with {reason!r}")
        self.finish_reason = _FINISH_REASONS[reason]


def _piece(choice: dict, arrival: float) -> Piece | None:
    token_ids = choice.get("token_ids")
    text = choice.get("text")
    if text is None:  # a chat chunk
        text = (choice.get("delta") or {}).get("content")
    text = text or ""
    if token_ids is None and not text:
        return None
    ids = None if token_ids is None else tuple(int(t) for t in token_ids)
    return Piece(arrival, str(text), ids)


@dataclass(frozen=True, slots=True)
class SendTimes:
    """An open-loop request's send: scheduled, could first have gone (a client was free), went."""

    scheduled: float
    ready: float
    sent: float


@dataclass(frozen=True, slots=True)
class Received:
    """A completed stream: everything needed to build its record after the timed region."""

    request: Request
    arrival: float
    finished_time: float
    pieces: tuple[Piece, ...]
    finish_reason: FinishReason
    num_usage_tokens: int | None
    send_times: SendTimes | None = None  # open loop only
    num_cached_tokens: int | None = None  # the server's prefix cache hit, in prompt tokens; None: not said
    num_usage_prompt_tokens: int | None = None  # the server's usage.prompt_tokens; None: not said

    @property
    def has_exact_ids(self) -> bool:
        return bool(self.pieces) and all(p.token_ids is not None for p in self.pieces)

    @property
    def count_source(self) -> str:
        if self.has_exact_ids:
            return COUNTED_FROM_IDS
        return COUNTED_FROM_USAGE if self.num_usage_tokens is not None else COUNTED_FROM_TEXT


def to_record(received: Received, encode_text: Callable[[str], Sequence[int]]) -> RequestRecord:
    """The request's record under the counting rule of this module's docstring."""
    if received.has_exact_ids:
        return _exact_record(received)
    return _text_record(received, encode_text)


def _exact_record(received: Received) -> RequestRecord:
    token_ids = tuple(t for p in received.pieces for t in p.token_ids or ())  # every piece has ids here
    usage = received.num_usage_tokens
    if usage is not None and usage != len(token_ids):
        raise OpenAIHttpError(
            f"request {received.request.request_id!r}: the server streamed {len(token_ids)} token ids but its "
            f"usage counts {usage} completion tokens; the stream lost or invented tokens, so this server's "
            "output cannot be measured (report it to the server's maintainers)"
        )
    token_times = tuple(p.arrival for p in received.pieces for _ in p.token_ids or ())
    return _record(received, token_ids, token_times, None)


def _text_record(received: Received, encode_text: Callable[[str], Sequence[int]]) -> RequestRecord:
    text = "".join(p.text for p in received.pieces)
    token_ids = tuple(int(t) for t in encode_text(text)) if text else ()
    token_times = tuple(p.arrival for p in received.pieces if p.text)
    return _record(received, token_ids, token_times, received.num_usage_tokens)


def _record(
    received: Received, token_ids: tuple[int, ...], token_times: tuple[float, ...], num_reported: int | None
) -> RequestRecord:
    request = received.request
    num_prompt_tokens = received.num_usage_prompt_tokens
    if num_prompt_tokens is None:
        num_prompt_tokens = request.num_prompt_tokens
    return RequestRecord(
        request_id=request.request_id,
        num_prompt_tokens=num_prompt_tokens,
        num_client_prompt_tokens=None if num_prompt_tokens == request.num_prompt_tokens else request.num_prompt_tokens,
        output_token_ids=token_ids,
        arrival_time=received.arrival,
        first_scheduled_time=None,  # the client cannot see when the server schedules
        token_times=token_times,
        finished_time=received.finished_time,
        finish_reason=received.finish_reason,
        num_reported_output_tokens=num_reported,
        scheduled_time=received.send_times.scheduled if received.send_times else None,
        send_ready_time=received.send_times.ready if received.send_times else None,
        sent_time=received.send_times.sent if received.send_times else None,
        num_cached_tokens=None
        if received.num_cached_tokens is None
        else min(received.num_cached_tokens, num_prompt_tokens),
    )
