"""The HTTP side of ``perfsuite serve``: aiohttp handlers over one ``EngineWorker``.

Endpoints:

- ``POST /v1/completions``: greedy completion of a prompt (a string or a list
  of token ids) or of several (a list of either: one engine request each, one
  choice each, told apart by ``index``), streamed as server-sent events (one
  token per chunk, then ``data: [DONE]``) or returned whole.
- ``POST /v1/chat/completions``: the same for ``messages``, rendered with the
  model's chat template; streamed as ``chat.completion.chunk`` objects whose
  ``delta`` carries the text (the first with ``role``), or returned whole as a
  ``chat.completion``. A model without a chat template answers 400.
- ``GET /health``: 200 with the engine's load (running, waiting, free slots).
- ``GET /metrics``: the load, the totals (prefix cache queries and hits, preemptions, tokens, finished
  requests) and the latency and length histograms in Prometheus' text format under vLLM's metric names
  (``perfsuite.serve.metrics``).
- ``GET /v1/models``: the one model served, under its served name, with its
  ``max_model_len`` and ``root`` (the folder of its tokenizer files, when it
  has one, so a client can load the same tokenizer).

Besides OpenAI's fields, a request may carry vLLM's ``ignore_eos``,
``stop_token_ids`` and ``min_tokens`` (EOS and stop tokens do not end it
before that many tokens), ``max_completion_tokens`` (another name for
``max_tokens``), ``add_special_tokens`` (tokenize with the tokenizer's special
tokens: default true for a completion's text prompt, false on top of a chat
template, as in vLLM) and ``stream_options`` (``include_usage``,
``continuous_usage_stats``); every choice carries the generated ``token_ids``
so that a client can compare outputs exactly. The usage of a whole answer, and
the final usage chunk of a stream, carry ``prompt_tokens_details.cached_tokens``
(the prompt tokens the engine found in its prefix cache, summed over the
request's prompts) when the engine says. Any other field is rejected
with a 400 that names it (``completion_request``), and a ``model`` other than
the served name gets a 404, as from vLLM.

Every request is logged, one line at INFO (``request_log``; ``request_log=False``
leaves the log out). A path the server does not answer is a 404 that names it
and lists the endpoints (``ROUTES``). Every error is answered in OpenAI's shape,
from one middleware; malformed
bodies (bad UTF-8 or JSON, lone surrogates, deep nesting, huge integers) are
400s, and a body not declared ``application/json`` is a 415, as from vLLM
(``json_body``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from perfsuite.engine import Engine, FinishReason, RequestRecord, StepOutput
from perfsuite.serve.chat_messages import render_chat_prompt
from perfsuite.serve.completion_request import (
    CompletionRequest,
    PromptLimits,
    parse_chat_request,
    parse_completion_request,
)
from perfsuite.serve.detokenizer import IncrementalDetokenizer
from perfsuite.serve.errors import ApiError, EngineFailure, invalid_request
from perfsuite.serve.json_body import check_json_content_type, parse_json_body
from perfsuite.serve.limits import ServeLimits
from perfsuite.serve.metrics import CONTENT_TYPE, metrics_registry, metrics_text
from perfsuite.serve.request_log import RequestProgress, log_requests, progress_of
from perfsuite.serve.responses import CompletionEnvelope, sse_event
from perfsuite.serve.worker import EngineWorker, TokenStream

log = logging.getLogger(__name__)

# What the server answers: (method, path, CompletionServer's handler).
ROUTES = (
    ("POST", "/v1/completions", "_completions"),
    ("POST", "/v1/chat/completions", "_chat_completions"),
    ("GET", "/v1/models", "_models"),
    ("GET", "/health", "_health"),
    ("GET", "/metrics", "_metrics_page"),
)
_ENDPOINT_LIST = ", ".join(f"{method} {path}" for method, path, _ in ROUTES)
_MAX_PATH_CHARS = 200

_CLIENT_ID_HEADER = "X-Request-Id"
_MAX_CLIENT_ID_CHARS = 128


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


@web.middleware
async def _json_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return _error_response(error)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return _error_response(ApiError(error.status, _http_error_message(request, error)))
    except Exception as error:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return _error_response(ApiError(500, f"internal error: {type(error).__name__}: {error}"))


def _http_error_message(request: web.Request, error: web.HTTPException) -> str:
    """aiohttp's routing errors, saying what was asked for and what this server answers."""
    path = request.path if len(request.path) <= _MAX_PATH_CHARS else request.path[:_MAX_PATH_CHARS] + "..."
    if isinstance(error, web.HTTPNotFound):
        return f"no endpoint {request.method} {path}; this server answers {_ENDPOINT_LIST}"
    if isinstance(error, web.HTTPMethodNotAllowed):
        allowed = " or ".join(sorted(error.allowed_methods))
        return f"{path} takes {allowed}, not {request.method}; this server answers {_ENDPOINT_LIST}"
    return error.text or error.reason


class CompletionServer:
    """The HTTP side: parses requests, feeds the engine worker, writes responses."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model_name: str,
        vocab_size: int,
        limits: ServeLimits = ServeLimits(),
        model_root: str | None = None,
        request_log: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._model_root = model_root
        self._limits = limits
        self._request_log = request_log
        self._prompt_limits = PromptLimits(
            engine.max_seq_len, vocab_size, limits.default_max_tokens, model_name, limits.max_prompts
        )
        self._worker = EngineWorker(engine, limits.num_recent_records)
        self._metrics = metrics_registry(self._worker, model_name)
        self._ids = itertools.count()
        self._started = int(time.time())
        self._runner: web.AppRunner | None = None

    def recent_records(self) -> tuple[RequestRecord, ...]:
        return self._worker.recent_records()

    # -- lifecycle ----------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port."""
        await self._worker.start()
        middlewares = [log_requests, _json_errors] if self._request_log else [_json_errors]
        app = web.Application(middlewares=middlewares, client_max_size=self._limits.max_body_bytes)
        for method, path, handler in ROUTES:
            add = app.router.add_get if method == "GET" else app.router.add_post  # add_get answers HEAD too
            add(path, getattr(self, handler))
        # handler_cancellation: a client that disconnects cancels its handler,
        # whose cleanup aborts the request even while it waits for a token.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=self._limits.shutdown_timeout_s
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as error:
            await self.stop()
            raise RuntimeError(f"cannot listen on {host}:{port}: {error}") from None
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._worker.stop()

    async def serve_until_signalled(self, host: str, port: int) -> None:
        """Serve until SIGINT or SIGTERM, then close connections and stop the engine thread."""
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stopping.set)
        bound = await self.start(host, port)
        try:
            print(f"perfsuite serve: listening on http://{host}:{bound}", file=sys.stderr, flush=True)
            await stopping.wait()
        finally:
            await self.stop()
        print("perfsuite serve: stopped", file=sys.stderr)

    # -- handlers -----------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        load = self._worker.load
        return web.json_response(
            {
                "status": "ok",
                "model": self._model_name,
                "running": load.num_running,
                "waiting": load.num_waiting,
                "free_slots": load.num_free_slots,
                "num_slots": load.num_slots,
                "open_requests": self._worker.num_open_requests,
            }
        )

    async def _metrics_page(self, _: web.Request) -> web.Response:
        return web.Response(body=metrics_text(self._metrics), headers={"Content-Type": CONTENT_TYPE})

    async def _models(self, _: web.Request) -> web.Response:
        model = {
            "id": self._model_name,
            "object": "model",
            "created": self._started,
            "owned_by": "perfsuite",
            "root": self._model_root,
            "parent": None,
            "max_model_len": self._prompt_limits.max_seq_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _completions(self, http_request: web.Request) -> web.StreamResponse:
        body = await _read_body(http_request)
        request = parse_completion_request(body, self._prompt_limits, self._tokenize)
        return await self._serve(http_request, request, f"cmpl-{next(self._ids)}")

    async def _chat_completions(self, http_request: web.Request) -> web.StreamResponse:
        body = await _read_body(http_request)
        request = parse_chat_request(body, self._prompt_limits, self._render_chat)
        return await self._serve(http_request, request, f"chatcmpl-{next(self._ids)}")

    def _tokenize(self, text: str, add_special_tokens: bool) -> Sequence[int]:
        return self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def _render_chat(self, messages: list[dict], add_special_tokens: bool) -> Sequence[int]:
        return render_chat_prompt(self._tokenizer, self._model_name, messages, add_special_tokens)

    async def _serve(
        self, http_request: web.Request, request: CompletionRequest, completion_id: str
    ) -> web.StreamResponse:
        completion = CompletionEnvelope(completion_id, int(time.time()), self._model_name, request)
        progress = progress_of(http_request)
        progress.request_id, progress.num_prompt_tokens = completion_id, request.num_prompt_tokens
        progress.client_request_id = _client_id(http_request)
        self._check_room(len(request.prompts))
        engine_requests = request.to_engine_requests(completion_id)
        client_ids = _client_ids(http_request, len(engine_requests))
        choices = _Choices([r.request_id for r in engine_requests], progress)
        try:
            stream = await self._worker.open(engine_requests, client_ids)
            if request.stream:
                return await self._stream(http_request, completion, choices, stream)
            return await self._complete(completion, choices, stream)
        finally:
            self._worker.close(choices.request_ids)

    def _check_room(self, num_prompts: int) -> None:
        num_open = self._worker.num_open_requests
        if num_open + num_prompts > self._limits.max_open_requests:
            raise ApiError(
                429,
                f"the server has {num_open} of its {self._limits.max_open_requests} open requests in use and this "
                f"request needs {num_prompts}; retry later",
            )

    async def _complete(self, completion: CompletionEnvelope, choices: _Choices, stream: TokenStream) -> web.Response:
        try:
            async for output in stream.outputs():
                choices.add(output)
        except EngineFailure as failure:
            raise ApiError(500, str(failure)) from None
        decode = lambda ids: self._tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        usage = completion.usage(choices.num_output_tokens, self._worker.take_cached_tokens(choices.request_ids))
        return web.json_response(completion.body(choices.whole(completion, decode), usage))

    async def _stream(
        self, http_request: web.Request, completion: CompletionEnvelope, choices: _Choices, stream: TokenStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await self._write_events(http_request, response, completion, choices, stream)
        except ConnectionResetError:
            pass  # the client left; the caller's cleanup aborts the request
        return response

    async def _write_events(
        self,
        http_request: web.Request,
        response: web.StreamResponse,
        completion: CompletionEnvelope,
        choices: _Choices,
        stream: TokenStream,
    ) -> None:
        detokenizers = [IncrementalDetokenizer(self._tokenizer) for _ in range(choices.num_choices)]
        try:
            async for output in stream.outputs():
                if not response.prepared:  # headers go out with the first token: a failure before it is a 500
                    await response.prepare(http_request)
                index, is_first = choices.add(output)
                piece = detokenizers[index].piece(output.token_id, is_last=output.finished)
                chunk = completion.chunk_choice(index, piece, [output.token_id], output.finish_reason, is_first)
                usage = completion.usage(choices.num_output_tokens) if completion.request.continuous_usage else None
                await response.write(sse_event(completion.body([chunk], usage)))
        except EngineFailure as failure:
            if not response.prepared:
                raise ApiError(500, str(failure)) from None
            await response.write(sse_event(ApiError(500, str(failure)).body()))
        else:
            if completion.request.include_usage:
                cached = self._worker.take_cached_tokens(choices.request_ids)
                usage = completion.usage(choices.num_output_tokens, cached)
                await response.write(sse_event(completion.body([], usage)))
        await response.write(sse_event("[DONE]"))
        await response.write_eof()


@dataclass(slots=True)
class _Choices:
    """The tokens of each choice (one per prompt) as they arrive."""

    request_ids: list[str]
    progress: RequestProgress  # the request log's view, told of each token
    token_ids: list[list[int]] = field(init=False)
    finish_reasons: list[FinishReason | None] = field(init=False)
    _index_of: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.token_ids = [[] for _ in self.request_ids]
        self.finish_reasons = [None for _ in self.request_ids]
        self._index_of = {request_id: index for index, request_id in enumerate(self.request_ids)}
        self.progress.finish_reasons = self.finish_reasons

    @property
    def num_choices(self) -> int:
        return len(self.request_ids)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)

    def add(self, output: StepOutput) -> tuple[int, bool]:
        """Record ``output``; its choice's index and whether it is that choice's first token."""
        index = self._index_of[output.request_id]
        self.token_ids[index].append(output.token_id)
        self.finish_reasons[index] = output.finish_reason
        self.progress.add_token()
        return index, len(self.token_ids[index]) == 1

    def whole(self, completion: CompletionEnvelope, decode: Callable[[list[int]], str]) -> list[dict]:
        return [
            completion.choice(index, decode(ids), ids, reason)
            for index, (ids, reason) in enumerate(zip(self.token_ids, self.finish_reasons))
        ]


async def _read_body(http_request: web.Request) -> object:
    check_json_content_type(http_request.headers.get("Content-Type"))
    return parse_json_body(await http_request.read())


def _client_ids(http_request: web.Request, num_requests: int) -> list[str | None]:
    """Names for the engine's records: the client's ``X-Request-Id`` (suffixed ``-INDEX`` for several prompts)."""
    client_id = _client_id(http_request)
    if client_id is None or num_requests == 1:
        return [client_id] * num_requests
    return [f"{client_id}-{index}" for index in range(num_requests)]


def _client_id(http_request: web.Request) -> str | None:
    value = http_request.headers.get(_CLIENT_ID_HEADER)
    if value is None:
        return None
    if not value or len(value) > _MAX_CLIENT_ID_CHARS or not value.isprintable():
        raise invalid_request(f"{_CLIENT_ID_HEADER} must be 1 to {_MAX_CLIENT_ID_CHARS} printable characters")
    return value
