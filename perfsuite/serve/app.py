"""The HTTP side of ``perfsuite serve``: aiohttp handlers over one ``EngineWorker``.

Endpoints:

- ``POST /v1/completions``: greedy completion of one prompt (a string or a list
  of token ids), streamed as server-sent events (one token per chunk, then
  ``data: [DONE]``) or returned whole. Besides OpenAI's fields it takes vLLM's
  ``ignore_eos`` and ``stop_token_ids``, and every choice carries the generated
  ``token_ids`` so that a client can compare outputs exactly.
- ``GET /health``: 200 with the engine's load (running, waiting, free slots).
- ``GET /v1/models``: the one model served.

Every error is answered in OpenAI's shape, from one middleware.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from perfsuite.engine import Engine, RequestRecord
from perfsuite.serve.completion_request import CompletionRequest, PromptLimits, parse_completion_request
from perfsuite.serve.detokenizer import IncrementalDetokenizer
from perfsuite.serve.errors import ApiError, EngineFailure, invalid_request
from perfsuite.serve.limits import ServeLimits
from perfsuite.serve.responses import CompletionEnvelope, choice, sse_event
from perfsuite.serve.worker import EngineWorker, TokenStream

log = logging.getLogger(__name__)

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
        return _error_response(ApiError(error.status, error.text or error.reason))
    except Exception as error:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return _error_response(ApiError(500, f"internal error: {type(error).__name__}: {error}"))


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
    ) -> None:
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._limits = limits
        self._prompt_limits = PromptLimits(engine.max_seq_len, vocab_size, limits.default_max_tokens)
        self._worker = EngineWorker(engine, limits.num_recent_records)
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None

    def recent_records(self) -> tuple[RequestRecord, ...]:
        return self._worker.recent_records()

    # -- lifecycle ----------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port."""
        await self._worker.start()
        app = web.Application(middlewares=[_json_errors], client_max_size=self._limits.max_body_bytes)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
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

    async def _models(self, _: web.Request) -> web.Response:
        model = {
            "id": self._model_name,
            "object": "model",
            "owned_by": "perfsuite",
            "max_model_len": self._prompt_limits.max_seq_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _completions(self, http_request: web.Request) -> web.StreamResponse:
        completion = CompletionEnvelope(
            completion_id=f"cmpl-{next(self._ids)}",
            created=int(time.time()),
            model=self._model_name,
            request=await self._parse(http_request),
        )
        if self._worker.num_open_requests >= self._limits.max_open_requests:
            raise ApiError(429, f"the server already has {self._limits.max_open_requests} open requests; retry later")
        engine_request = completion.request.to_engine_request(completion.completion_id)
        client_id = _client_id(http_request)
        try:
            stream = await self._worker.open(engine_request, client_id)
            if completion.request.stream:
                return await self._stream(http_request, completion, stream)
            return await self._complete(completion, stream)
        finally:
            self._worker.close(completion.completion_id)

    async def _parse(self, http_request: web.Request) -> CompletionRequest:
        try:
            body = await http_request.json()
        except json.JSONDecodeError as error:
            raise invalid_request(f"the request body is not valid JSON: {error}") from None
        except UnicodeDecodeError:
            raise invalid_request("the request body is not UTF-8 text") from None
        return parse_completion_request(body, self._prompt_limits, self._tokenize)

    def _tokenize(self, text: str) -> Sequence[int]:
        return self._tokenizer(text)["input_ids"]

    async def _complete(self, completion: CompletionEnvelope, stream: TokenStream) -> web.Response:
        token_ids: list[int] = []
        finish_reason = None
        try:
            async for output in stream.outputs():
                token_ids.append(output.token_id)
                finish_reason = output.finish_reason
        except EngineFailure as failure:
            raise ApiError(500, str(failure)) from None
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        body = completion.body([choice(text, token_ids, finish_reason)], completion.usage(len(token_ids)))
        return web.json_response(body)

    async def _stream(
        self, http_request: web.Request, completion: CompletionEnvelope, stream: TokenStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await self._write_events(http_request, response, completion, stream)
        except ConnectionResetError:
            pass  # the client left; the caller's cleanup aborts the request
        return response

    async def _write_events(
        self,
        http_request: web.Request,
        response: web.StreamResponse,
        completion: CompletionEnvelope,
        stream: TokenStream,
    ) -> None:
        detokenizer = IncrementalDetokenizer(self._tokenizer)
        num_tokens = 0
        try:
            async for output in stream.outputs():
                if not response.prepared:  # headers go out with the first token: a failure before it is a 500
                    await response.prepare(http_request)
                num_tokens += 1
                piece = detokenizer.piece(output.token_id, is_last=output.finished)
                event = completion.body([choice(piece, [output.token_id], output.finish_reason)])
                await response.write(sse_event(event))
        except EngineFailure as failure:
            if not response.prepared:
                raise ApiError(500, str(failure)) from None
            await response.write(sse_event(ApiError(500, str(failure)).body()))
        else:
            if completion.request.include_usage:
                await response.write(sse_event(completion.body([], completion.usage(num_tokens))))
        await response.write(sse_event("[DONE]"))
        await response.write_eof()


def _client_id(http_request: web.Request) -> str | None:
    value = http_request.headers.get(_CLIENT_ID_HEADER)
    if value is None:
        return None
    if not value or len(value) > _MAX_CLIENT_ID_CHARS or not value.isprintable():
        raise invalid_request(f"{_CLIENT_ID_HEADER} must be 1 to {_MAX_CLIENT_ID_CHARS} printable characters")
    return value
