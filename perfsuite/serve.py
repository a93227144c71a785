"""``perfsuite serve``: the in-flight engine behind an OpenAI-compatible HTTP API.

Endpoints:

- ``POST /v1/completions``: greedy completion of one prompt (a string or a list
  of token ids), streamed as server-sent events (one token per chunk, then
  ``data: [DONE]``) or returned whole. Besides OpenAI's fields it takes vLLM's
  ``ignore_eos`` and ``stop_token_ids``, and every choice carries the generated
  ``token_ids`` so that a client can compare outputs exactly.
- ``GET /health``: 200 with the engine's load (running, waiting, free slots).
- ``GET /v1/models``: the one model served.

Threading: the engine is not thread-safe, so every engine call (add, abort,
step) runs on one worker thread, a single-thread executor. The asyncio loop
owns the HTTP side; its engine-loop task submits one ``step`` at a time while
the engine has work, and hands each step's tokens to the waiting handlers.
Adds and aborts are submitted to the same executor, so they run between steps.

Everything is bounded: at most ``max_open_requests`` requests are open (more
get 429), prompt + ``max_tokens`` must fit ``max_seq_len``, bodies are capped,
and a client that disconnects has its request aborted and its slot freed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from perfsuite.engine import Engine, FinishReason, Request, RequestRecord, SamplingParams, StepOutput

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_MAX_OPEN_REQUESTS = 256
_CLIENT_ID_HEADER = "X-Request-Id"
_MAX_CLIENT_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """The bounds that keep one server's memory and queue finite."""

    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 16  # OpenAI's default when a request names none
    num_recent_records: int = 1024
    shutdown_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_open_requests", "max_body_bytes", "default_max_tokens", "num_recent_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeLimits.{name} must be >= 1, got {getattr(self, name)}")


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def kind(self) -> str:
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


class EngineFailure(Exception):
    """The engine raised while a request was in it; the request cannot finish."""


# --------------------------------------------------------------------------- request parsing


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated ``/v1/completions`` body."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool

    def to_engine_request(self, request_id: str) -> Request:
        params = SamplingParams(self.max_tokens, ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids)
        return Request(request_id, self.prompt_token_ids, params)


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a request must fit: the engine's slot length and the model's vocabulary."""

    max_seq_len: int
    vocab_size: int
    default_max_tokens: int


# Parameters that would change which tokens come out. The engine decodes
# greedily, so each is accepted only at its neutral value rather than ignored.
_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "temperature": (None, 0),
    "top_p": (None, 1),
    "top_k": (None, 0, -1),
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "echo": (None, False),
    "logprobs": (None,),
    "suffix": (None, ""),
    "stop": (None, "", []),
}


def parse_completion_request(
    body: object, limits: PromptLimits, tokenize: Callable[[str], Sequence[int]]
) -> CompletionRequest:
    """The request a JSON body asks for; ``ApiError`` (400) saying which field is wrong otherwise."""
    if not isinstance(body, dict):
        raise _invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    if "model" in body and not isinstance(body["model"], (str, type(None))):
        raise _invalid("model must be a string", "model")
    _check_greedy(body)
    prompt = _prompt_token_ids(body.get("prompt"), limits.vocab_size, tokenize)
    stream = _boolean(body, "stream")
    return CompletionRequest(
        prompt_token_ids=prompt,
        max_tokens=_max_tokens(body, len(prompt), limits),
        ignore_eos=_boolean(body, "ignore_eos"),
        stop_token_ids=_token_ids(body.get("stop_token_ids") or [], "stop_token_ids", limits.vocab_size),
        stream=stream,
        include_usage=_include_usage(body, stream),
    )


def _check_greedy(body: dict) -> None:
    for name, neutral in _NEUTRAL_VALUES.items():
        value = body.get(name)
        if value not in neutral:
            raise _invalid(
                f"{name}={json.dumps(value)} is not supported: this server decodes greedily, so {name} "
                f"must be left out or be {json.dumps(neutral[-1])}",
                name,
            )


def _prompt_token_ids(prompt: object, vocab_size: int, tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if prompt is None:
        raise _invalid("prompt is required: a string or a list of token ids", "prompt")
    if isinstance(prompt, str):
        token_ids = tuple(tokenize(prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise _invalid(f"prompt holds {len(prompt)} prompts; send one prompt per request", "prompt")
    elif isinstance(prompt, list):
        token_ids = _token_ids(prompt, "prompt", vocab_size)
    else:
        raise _invalid(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if not token_ids:
        raise _invalid("prompt is empty; it needs at least one token", "prompt")
    return token_ids


def _token_ids(values: object, name: str, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(_is_int(v) for v in values):
        raise _invalid(f"{name} must be a list of integer token ids", name)
    outside = [v for v in values if not 0 <= v < vocab_size]
    if outside:
        raise _invalid(f"{name} holds token id {outside[0]}, outside the vocabulary [0, {vocab_size})", name)
    return tuple(values)


def _max_tokens(body: dict, num_prompt_tokens: int, limits: PromptLimits) -> int:
    room = limits.max_seq_len - num_prompt_tokens
    if room < 1:
        raise _invalid(
            f"the prompt has {num_prompt_tokens} tokens but this server's max_seq_len is {limits.max_seq_len}, "
            "leaving no room for output; shorten the prompt",
            "prompt",
        )
    value = body.get("max_tokens")
    if value is None:
        return min(limits.default_max_tokens, room)
    if not _is_int(value) or value < 1:
        raise _invalid(f"max_tokens must be an integer >= 1, got {json.dumps(value)}", "max_tokens")
    if value > room:
        raise _invalid(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({value}) exceeds this server's max_seq_len of "
            f"{limits.max_seq_len}; ask for at most {room} tokens",
            "max_tokens",
        )
    return value


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _invalid("stream_options must be an object", "stream_options")
    if not stream:
        raise _invalid("stream_options is only allowed with stream: true", "stream_options")
    return _boolean(options, "include_usage", param="stream_options.include_usage")


def _boolean(body: dict, name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _invalid(f"{param or name} must be true or false, got {json.dumps(value)}", param or name)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- text


class IncrementalDetokenizer:
    """Text pieces of a growing token sequence, one per token.

    A token that ends inside a multi-byte character decodes to U+FFFD, so its
    text is held back (an empty piece) until a later token completes it; the
    pieces then concatenate to the text of the whole sequence (TGI's method).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def piece(self, token_id: int, is_last: bool) -> str:
        self._token_ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._token_ids))
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not is_last):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(self._token_ids[start:stop], skip_special_tokens=True)


# --------------------------------------------------------------------------- the engine thread


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's occupancy after its latest call, for ``/health``."""

    num_running: int
    num_waiting: int
    num_free_slots: int
    num_slots: int


class _TokenStream:
    """One request's step outputs, passed from the engine loop to its HTTP handler.

    The queue is unbounded in type but not in use: the engine produces at most
    ``max_tokens`` outputs per request.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[StepOutput | EngineFailure] = asyncio.Queue()

    def put(self, output: StepOutput) -> None:
        self._queue.put_nowait(output)

    def fail(self, failure: EngineFailure) -> None:
        self._queue.put_nowait(failure)

    async def outputs(self) -> AsyncIterator[StepOutput]:
        while True:
            item = await self._queue.get()
            if isinstance(item, EngineFailure):
                raise item
            yield item
            if item.finished:
                return


class EngineWorker:
    """Owns the engine: its one thread, the stepping task and the open streams."""

    def __init__(self, engine: Engine, num_recent_records: int) -> None:
        self._engine = engine
        self._executor: ThreadPoolExecutor | None = None
        self._drive_task: asyncio.Task | None = None
        self._has_work = asyncio.Event()
        self._streams: dict[str, _TokenStream] = {}
        # Touched only on the engine thread:
        self._client_ids: dict[str, str] = {}
        # Written on the engine thread, read anywhere:
        self._load = self._current_load()
        self._recent_records: deque[RequestRecord] = deque(maxlen=num_recent_records)
        self._records_lock = threading.Lock()
        if not engine.has_unfinished_requests():
            engine.run(())  # forget earlier runs (a warm-up): they are not this server's requests

    # -- the asyncio side ---------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perfsuite-engine")
        self._drive_task = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        if self._drive_task is not None:
            self._drive_task.cancel()
            await asyncio.gather(self._drive_task, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def load(self) -> EngineLoad:
        return self._load

    @property
    def num_open_requests(self) -> int:
        return len(self._streams)

    def recent_records(self) -> tuple[RequestRecord, ...]:
        """The engine's records of recently finished requests, named by their ``X-Request-Id`` when sent."""
        with self._records_lock:
            return tuple(self._recent_records)

    async def open(self, request: Request, client_id: str | None) -> _TokenStream:
        """Add ``request`` to the running batch; its outputs arrive on the returned stream."""
        stream = _TokenStream()
        self._streams[request.request_id] = stream
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._add, request, client_id)
        except ValueError as error:
            del self._streams[request.request_id]
            raise _invalid(str(error)) from None
        self._has_work.set()
        return stream

    def close(self, request_id: str) -> None:
        """Forget a request; one still unfinished is aborted so its slot is freed."""
        if self._streams.pop(request_id, None) is not None:
            self._submit_abort(request_id)

    def _submit_abort(self, request_id: str) -> None:
        try:
            self._executor.submit(self._abort, request_id)
        except RuntimeError:  # the executor is shut down: the server is stopping
            pass

    async def _drive(self) -> None:
        # Clearing before each step cannot lose a wake-up: an add submitted
        # after this step runs after it (one thread, FIFO) and sets the event.
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            self._has_work.clear()
            try:
                outputs, is_busy = await loop.run_in_executor(self._executor, self._step)
            except Exception as error:
                log.exception("engine step failed; aborting its %d open requests", len(self._streams))
                self._fail_open_requests(EngineFailure(f"the engine failed: {type(error).__name__}: {error}"))
                continue
            self._deliver(outputs)
            if is_busy:
                self._has_work.set()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:  # closed while its step ran; its abort is queued
                continue
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]

    def _fail_open_requests(self, failure: EngineFailure) -> None:
        for request_id, stream in list(self._streams.items()):
            stream.fail(failure)
            self.close(request_id)

    # -- the engine thread --------------------------------------------------

    def _add(self, request: Request, client_id: str | None) -> None:
        self._engine.add_request(request)
        if client_id is not None:
            self._client_ids[request.request_id] = client_id
        self._settle()

    def _abort(self, request_id: str) -> None:
        try:
            self._engine.abort_request(request_id)
        except Exception:
            log.exception("aborting request %s failed", request_id)
        self._settle()

    def _step(self) -> tuple[list[StepOutput], bool]:
        outputs = self._engine.step()
        self._settle()
        return outputs, self._engine.has_unfinished_requests()

    def _settle(self) -> None:
        self._load = self._current_load()
        if not self._engine.has_unfinished_requests():
            self._archive_records()

    def _archive_records(self) -> None:
        # The engine keeps a record per request until its next run starts; an
        # empty run is its public reset, so an idle server's memory stays flat.
        records = self._engine.result(0.0, 0.0).records
        if not records:
            return
        self._engine.run(())
        named = [replace(r, request_id=self._client_ids.pop(r.request_id, r.request_id)) for r in records]
        self._client_ids.clear()
        with self._records_lock:
            self._recent_records.extend(named)

    def _current_load(self) -> EngineLoad:
        scheduler = self._engine.scheduler
        return EngineLoad(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_free_slots=scheduler.kv_cache.num_free_slots,
            num_slots=scheduler.kv_cache.num_slots,
        )


# --------------------------------------------------------------------------- HTTP


_FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True, slots=True)
class _Completion:
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


def _choice(text: str, token_ids: list[int], finish_reason: FinishReason | None) -> dict:
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": None if finish_reason is None else _FINISH_REASONS[finish_reason],
        "token_ids": token_ids,
    }


def _sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@web.middleware
async def _json_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return ApiError(error.status, error.text or error.reason).response()
    except Exception as error:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return ApiError(500, f"internal error: {type(error).__name__}: {error}").response()


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
        completion = _Completion(
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
            raise _invalid(f"the request body is not valid JSON: {error}") from None
        except UnicodeDecodeError:
            raise _invalid("the request body is not UTF-8 text") from None
        return parse_completion_request(body, self._prompt_limits, self._tokenize)

    def _tokenize(self, text: str) -> Sequence[int]:
        return self._tokenizer(text)["input_ids"]

    async def _complete(self, completion: _Completion, stream: _TokenStream) -> web.Response:
        token_ids: list[int] = []
        finish_reason = None
        try:
            async for output in stream.outputs():
                token_ids.append(output.token_id)
                finish_reason = output.finish_reason
        except EngineFailure as failure:
            raise ApiError(500, str(failure)) from None
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        body = completion.body([_choice(text, token_ids, finish_reason)], completion.usage(len(token_ids)))
        return web.json_response(body)

    async def _stream(
        self, http_request: web.Request, completion: _Completion, stream: _TokenStream
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await self._write_events(http_request, response, completion, stream)
        except ConnectionResetError:
            pass  # the client left; the caller's cleanup aborts the request
        return response

    async def _write_events(
        self, http_request: web.Request, response: web.StreamResponse, completion: _Completion, stream: _TokenStream
    ) -> None:
        detokenizer = IncrementalDetokenizer(self._tokenizer)
        num_tokens = 0
        try:
            async for output in stream.outputs():
                if not response.prepared:  # headers go out with the first token: a failure before it is a 500
                    await response.prepare(http_request)
                num_tokens += 1
                piece = detokenizer.piece(output.token_id, is_last=output.finished)
                await response.write(_sse(completion.body([_choice(piece, [output.token_id], output.finish_reason)])))
        except EngineFailure as failure:
            if not response.prepared:
                raise ApiError(500, str(failure)) from None
            await response.write(_sse(ApiError(500, str(failure)).body()))
        else:
            if completion.request.include_usage:
                await response.write(_sse(completion.body([], completion.usage(num_tokens))))
        await response.write(_sse("[DONE]"))
        await response.write_eof()


def _client_id(http_request: web.Request) -> str | None:
    value = http_request.headers.get(_CLIENT_ID_HEADER)
    if value is None:
        return None
    if not value or len(value) > _MAX_CLIENT_ID_CHARS or not value.isprintable():
        raise _invalid(f"{_CLIENT_ID_HEADER} must be 1 to {_MAX_CLIENT_ID_CHARS} printable characters")
    return value


# --------------------------------------------------------------------------- running it


class ServerThread:
    """A ``CompletionServer`` on its own event loop in a background thread (tests, notebooks)."""

    def __init__(self, server: CompletionServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="perfsuite-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout=30.0):
            raise RuntimeError("the server did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error}") from self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30.0)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to __enter__ when it happens before ready
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.port = await self.server.start(self.host, self.port)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await self.server.stop()


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """``perfsuite serve``'s command line."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    batch_size: int = 8
    max_seq_len: int | None = None
    dtype: str = "float32"
    device: str = "auto"
    threads: int | None = None
    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")


def serve(options: ServeOptions) -> int:
    """Load the model, warm the engine up and serve until interrupted."""
    asyncio.run(build_server(options).serve_until_signalled(options.host, options.port))
    return 0


def build_server(options: ServeOptions) -> CompletionServer:
    from perfsuite.adapters import Backend, EngineConfig, build_engine
    from perfsuite.measure import configure_threads, resolve_device, warm_up
    from perfsuite.models import load_model

    device = resolve_device(options.device)
    threads = configure_threads(options.threads) if device == "cpu" else None
    loaded = load_model(options.model, device=device, dtype=options.dtype)
    max_seq_len = options.max_seq_len or min(DEFAULT_MAX_SEQ_LEN, loaded.max_context)
    if max_seq_len > loaded.max_context:
        raise ValueError(f"--max-seq-len {max_seq_len} exceeds the model's context of {loaded.max_context} tokens")
    engine = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(options.batch_size, max_seq_len))
    warm_up(engine, [Request("warm-up", tuple(loaded.tokenizer("Hello")["input_ids"]) or (0,))])
    print(
        f"perfsuite serve: {loaded.spec.name} {options.dtype} on {device}"
        + (f" ({threads} threads)" if threads else "")
        + f", batch size {options.batch_size}, max_seq_len {max_seq_len}",
        file=sys.stderr,
    )
    return CompletionServer(
        engine,
        loaded.tokenizer,
        model_name=loaded.spec.name,
        vocab_size=loaded.model.config.vocab_size,
        limits=ServeLimits(max_open_requests=options.max_open_requests),
    )
