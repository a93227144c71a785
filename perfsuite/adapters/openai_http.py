"""The ``openai-http`` engine: the same workloads against any OpenAI-compatible server.

Each ``Request`` is sent to ``POST {endpoint}/v1/completions`` at its arrival
time (or, with ``max_concurrency``, as a closed loop of that many clients) as
a streamed, greedy completion: the prompt as token ids, ``max_tokens``, vLLM's
``ignore_eos`` and ``return_token_ids``, and ``stream_options.include_usage``.
This works with ``perfsuite serve``, vLLM, SGLang and TGI.

Timestamps are the client's ``time.perf_counter`` when each streamed chunk
arrives, so latencies include the network and the server's HTTP layer. A
chunk may carry several tokens: they are counted from its ``token_ids`` when
the server sends them, else by tokenizing its text with the backend's
tokenizer, and all share the chunk's arrival time. The server's ``usage``
count, when sent, is the final word on how many tokens were produced.

``greedy_equal`` is claimed, but the adapter is only as greedy-equal as the
server behind it: the outputs are exact token ids only when the server returns
them (perfsuite serve does; vLLM does with ``return_token_ids``), and equal to
unbatched greedy decoding only if the server's batching keeps them so.

Only the given endpoint is contacted (no proxies from the environment); every
request has a timeout and so does the whole run. A failed request raises
``OpenAIHttpError`` naming it; no request is dropped silently.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.engine.types import (
    EngineCounters,
    FinishReason,
    Request,
    RequestRecord,
    RunResult,
    StepOutput,
    check_unique_ids,
)

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_RUN_TIMEOUT_S = 3600.0

_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class OpenAIHttpError(RuntimeError):
    """A request the server did not complete; the message names the request and the cause."""


def build(backend: Backend, config: EngineConfig) -> OpenAIHttpEngine:
    if not backend.endpoint:
        raise ValueError(
            "the openai-http engine needs the base URL of an OpenAI-compatible server: pass "
            "--perf-endpoint http://HOST:PORT (e.g. where `perfsuite serve` or vLLM listens)"
        )
    return OpenAIHttpEngine(backend.endpoint, config.batch_size, _text_tokenizer(backend))


def _text_tokenizer(backend: Backend) -> Callable[[str], Sequence[int]]:
    """Token ids of a text piece, without the BOS token a whole prompt would get."""
    if backend.tokenizer is not None:
        return lambda text: backend.tokenizer.encode(text, add_special_tokens=False)
    return backend.tokenize


def base_url(endpoint: str) -> str:
    """``endpoint`` without a trailing ``/`` or ``/v1``; a clear error for anything but an http(s) URL."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f"--perf-endpoint {endpoint!r} is not a server's base URL; write it as http://HOST:PORT "
            "(optionally ending in /v1)"
        )
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


class OpenAIHttpEngine:
    """A client that measures an OpenAI-compatible server as a ``BatchingEngine``.

    ``batch_size`` caps the requests in flight at once, as the server's batch
    would; ``max_concurrency`` in ``run`` may lower it further. ``run`` drives
    its own event loop, so call it from synchronous code (as the harness does).
    """

    name = "openai-http"
    greedy_equal = True
    # The server does the work, in another process: its CPU use is not "other work" (perfsuite.contention).
    runs_in_process = False

    def __init__(
        self,
        endpoint: str,
        batch_size: int,
        tokenize_text: Callable[[str], Sequence[int]],
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.base_url = base_url(endpoint)
        self._batch_size = batch_size
        self._tokenize_text = tokenize_text
        self._request_timeout_s = request_timeout_s
        self._run_timeout_s = run_timeout_s

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def completions_url(self) -> str:
        return f"{self.base_url}/v1/completions"

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve ``requests`` over HTTP; ``on_step`` sees each received chunk's tokens (progress only)."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        ordered = sorted(requests, key=lambda r: r.arrival_time)
        check_unique_ids(ordered)
        return asyncio.run(self._run_within_timeout(ordered, on_step, max_concurrency))

    async def _run_within_timeout(self, requests, on_step, max_concurrency) -> RunResult:
        try:
            return await asyncio.wait_for(self._run(requests, on_step, max_concurrency), self._run_timeout_s)
        except asyncio.TimeoutError:
            raise OpenAIHttpError(
                f"the run of {len(requests)} requests against {self.base_url} did not finish "
                f"within {self._run_timeout_s:g} s"
            ) from None

    async def _run(
        self,
        requests: list[Request],
        on_step: Callable[[list[StepOutput]], None] | None,
        max_concurrency: int | None,
    ) -> RunResult:
        num_clients = min(self._batch_size, max_concurrency or self._batch_size)
        connector = aiohttp.TCPConnector(limit=num_clients)
        timeout = aiohttp.ClientTimeout(total=self._request_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:
            client = _Client(session, self.completions_url, self._tokenize_text, on_step)
            await client.find_model(f"{self.base_url}/v1/models")
            start = time.perf_counter()
            records = await _send_all(client, requests, start, num_clients, closed_loop=max_concurrency is not None)
            end = time.perf_counter()
        return RunResult(self.name, tuple(records), start, end, EngineCounters())


async def _send_all(
    client: _Client, requests: list[Request], start: float, num_clients: int, *, closed_loop: bool
) -> list[RequestRecord]:
    """Send each request at its arrival time, at most ``num_clients`` at once, in arrival order.

    Open loop: a request's arrival is its scheduled time, so waiting for a free
    client counts as queueing. Closed loop: its arrival is when it is sent.
    """
    free_clients = asyncio.Semaphore(num_clients)
    tasks: list[asyncio.Task] = []
    try:
        for request in requests:
            delay = start + request.arrival_time - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await free_clients.acquire()
            if any(task.done() and not task.cancelled() and task.exception() for task in tasks):
                free_clients.release()
                break  # a request failed; gather below raises its error
            arrival = time.perf_counter() if closed_loop else start + request.arrival_time
            tasks.append(asyncio.create_task(_send_one(client, request, arrival, free_clients)))
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _send_one(
    client: _Client, request: Request, arrival: float, free_clients: asyncio.Semaphore
) -> RequestRecord:
    try:
        return await client.complete(request, arrival)
    finally:
        free_clients.release()


@dataclass(slots=True)
class _Received:
    """What one streamed completion has delivered so far."""

    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_usage_tokens: int | None = None
    is_done: bool = False

    def add(self, arrival: float, token_ids: Sequence[int]) -> None:
        self.token_times.extend([arrival] * len(token_ids))
        self.token_ids.extend(token_ids)

    def fitted_to_usage(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Times and ids with the server's token count, when it sent one.

        Tokens counted from text can differ from the server's; the difference
        is settled at the last chunk (its time repeated, its last id repeated).
        """
        count = self.num_usage_tokens if self.num_usage_tokens is not None else len(self.token_ids)
        times, ids = self.token_times[:count], self.token_ids[:count]
        missing = count - len(ids)
        if missing > 0 and ids:
            times += [times[-1]] * missing
            ids += [ids[-1]] * missing
        return tuple(times), tuple(ids)


class _Client:
    """One session's requests: the payload, the SSE parsing, the record."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        tokenize_text: Callable[[str], Sequence[int]],
        on_step: Callable[[list[StepOutput]], None] | None,
    ) -> None:
        self._session = session
        self._url = url
        self._tokenize_text = tokenize_text
        self._on_step = on_step
        self._model: str | None = None

    async def find_model(self, models_url: str) -> None:
        """The served model's name, which vLLM requires in every request; none if the server does not say."""
        try:
            async with self._session.get(models_url) as response:
                if response.status == 200:
                    models = (await response.json()).get("data") or []
                    self._model = models[0]["id"] if models else None
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as error:
            raise OpenAIHttpError(
                f"cannot reach the server at {models_url}: {type(error).__name__}: {error}; "
                "is it running? (--perf-endpoint)"
            ) from None
        except (aiohttp.ContentTypeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            self._model = None

    def _payload(self, request: Request) -> dict:
        params = request.sampling_params
        payload = {
            "prompt": list(request.prompt_token_ids),
            "max_tokens": params.max_new_tokens,
            "ignore_eos": params.ignore_eos,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if params.stop_token_ids:
            payload["stop_token_ids"] = list(params.stop_token_ids)
        if self._model is not None:
            payload["model"] = self._model
        return payload

    async def complete(self, request: Request, arrival: float) -> RequestRecord:
        where = f"request {request.request_id!r} to {self._url}"
        try:
            received = await self._stream(request)
        except asyncio.TimeoutError:
            raise OpenAIHttpError(f"{where}: no complete response within the request timeout") from None
        except aiohttp.ClientError as error:
            raise OpenAIHttpError(f"{where} failed: {type(error).__name__}: {error}") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise OpenAIHttpError(f"{where}: malformed stream chunk: {error}") from None
        if not received.is_done or received.finish_reason is None:
            raise OpenAIHttpError(f"{where}: the stream ended before a finish_reason and data: [DONE]")
        token_times, token_ids = received.fitted_to_usage()
        return RequestRecord(
            request_id=request.request_id,
            num_prompt_tokens=request.num_prompt_tokens,
            output_token_ids=token_ids,
            arrival_time=arrival,
            first_scheduled_time=None,  # the client cannot see when the server schedules
            token_times=token_times,
            finished_time=time.perf_counter(),
            finish_reason=received.finish_reason,
        )

    async def _stream(self, request: Request) -> _Received:
        received = _Received()
        headers = {"X-Request-Id": request.request_id}
        async with self._session.post(self._url, json=self._payload(request), headers=headers) as response:
            if response.status != 200:
                raise OpenAIHttpError(
                    f"request {request.request_id!r}: HTTP {response.status} from {self._url}: "
                    f"{_error_message(await response.text())}"
                )
            async for line in response.content:
                arrival = time.perf_counter()
                data = line.decode("utf-8").strip()
                if not data.startswith("data:"):
                    continue
                data = data[len("data:") :].strip()
                if data == "[DONE]":
                    received.is_done = True
                    break
                self._take_chunk(request, json.loads(data), arrival, received)
        return received

    def _take_chunk(self, request: Request, chunk: dict, arrival: float, received: _Received) -> None:
        if "error" in chunk:
            raise OpenAIHttpError(
                f"request {request.request_id!r}: the server failed mid-stream: {_error_message(json.dumps(chunk))}"
            )
        for choice in chunk.get("choices") or []:
            token_ids = self._chunk_token_ids(choice)
            received.add(arrival, token_ids)
            reason = choice.get("finish_reason")
            if reason is not None:
                if reason not in _FINISH_REASONS:
                    raise OpenAIHttpError(f"request {request.request_id!r}: the server finished it with {reason!r}")
                received.finish_reason = _FINISH_REASONS[reason]
            if self._on_step is not None and token_ids:
                self._on_step(self._step_outputs(request.request_id, token_ids, received.finish_reason))
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            received.num_usage_tokens = int(usage["completion_tokens"])

    def _chunk_token_ids(self, choice: dict) -> Sequence[int]:
        token_ids = choice.get("token_ids")
        if token_ids is not None:
            return [int(t) for t in token_ids]
        text = choice.get("text") or ""
        return self._tokenize_text(text) if text else []

    @staticmethod
    def _step_outputs(
        request_id: str, token_ids: Sequence[int], finish_reason: FinishReason | None
    ) -> list[StepOutput]:
        last = len(token_ids) - 1
        return [StepOutput(request_id, t, finish_reason if i == last else None) for i, t in enumerate(token_ids)]


def _error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body itself (shortened)."""
    try:
        error = json.loads(body)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (json.JSONDecodeError, KeyError, TypeError):
        return body[:500]
