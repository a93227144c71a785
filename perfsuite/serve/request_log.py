"""One log line per HTTP request, at INFO on the ``perfsuite.serve.requests`` logger.

The line is ``key=value`` pairs (a value with spaces or quotes is JSON-quoted,
one not known is ``-``): method, path, status, the completion's id and the
client's ``X-Request-Id``, prompt and output tokens, the time to the first
token and the whole duration (seconds, from when the server read the request
line), and each choice's finish reason. A client that disconnects mid-request
shows as status 499 (nginx's "client closed request") and finish reason
``abort``, as does a stream whose client left between two tokens. The fields
also travel on the log record as ``served_request`` (a ``ServedRequest``), for
handlers that want them structured.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields

from aiohttp import web

from perfsuite.engine import FinishReason

REQUEST_LOGGER = "perfsuite.serve.requests"
CLIENT_CLOSED_REQUEST = 499
_MAX_PATH_CHARS = 200

log = logging.getLogger(REQUEST_LOGGER)


@dataclass(slots=True)
class RequestProgress:
    """What a completion handler learns of its request as it goes (mutable: the handler fills it in)."""

    start_time: float
    request_id: str | None = None
    client_request_id: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int = 0
    first_token_time: float | None = None
    finish_reasons: Sequence[FinishReason | None] = ()

    def add_token(self) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.num_output_tokens += 1


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One log line's fields."""

    method: str
    path: str
    status: int
    request_id: str | None
    client_request_id: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    ttft_s: float | None
    duration_s: float
    finish_reason: str | None

    def line(self) -> str:
        return " ".join(f"{field.name}={_value(getattr(self, field.name))}" for field in fields(self))


_PROGRESS_KEY = web.RequestKey("perfsuite_request_progress", RequestProgress)


def progress_of(http_request: web.Request) -> RequestProgress:
    """The request's progress that the log line reads; a throw-away one when the log is off."""
    progress = http_request.get(_PROGRESS_KEY)
    return progress if progress is not None else RequestProgress(time.perf_counter())


@web.middleware
async def log_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Log each request once it is answered, or once its client has gone (the handler cancelled)."""
    progress = RequestProgress(time.perf_counter())
    request[_PROGRESS_KEY] = progress
    status, left = CLIENT_CLOSED_REQUEST, True
    try:
        response = await handler(request)
        status, left = response.status, False
        return response
    finally:
        served = _served_request(request, status, progress, client_left=left or _unfinished(progress))
        log.info(served.line(), extra={"served_request": served})


def _unfinished(progress: RequestProgress) -> bool:
    return any(reason is None for reason in progress.finish_reasons)


def _served_request(request: web.Request, status: int, progress: RequestProgress, client_left: bool) -> ServedRequest:
    now = time.perf_counter()
    path = request.path if len(request.path) <= _MAX_PATH_CHARS else request.path[:_MAX_PATH_CHARS] + "..."
    is_completion = progress.request_id is not None
    return ServedRequest(
        method=request.method,
        path=path,
        status=status,
        request_id=progress.request_id,
        client_request_id=progress.client_request_id,
        prompt_tokens=progress.num_prompt_tokens,
        output_tokens=progress.num_output_tokens if is_completion else None,
        ttft_s=None if progress.first_token_time is None else progress.first_token_time - progress.start_time,
        duration_s=now - progress.start_time,
        finish_reason=_finish_reasons(progress, client_left) if is_completion else None,
    )


def _finish_reasons(progress: RequestProgress, client_left: bool) -> str | None:
    reasons = [
        reason.value if reason is not None else (FinishReason.ABORT.value if client_left else None)
        for reason in progress.finish_reasons
    ]
    if client_left and not reasons:
        return FinishReason.ABORT.value
    return ",".join(r for r in reasons if r is not None) or None


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6f}"
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "='):
        return text
    return json.dumps(text)
