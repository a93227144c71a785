"""The ``openai-http`` engine: the same workloads against any OpenAI-compatible server.

Before anything is sent, the client reads ``GET {endpoint}/v1/models``
(``perfsuite.adapters.server_info``): the model it asks for is the one named
by ``server_model`` (or the only one served), and every request's prompt +
``max_new_tokens`` must fit that model's ``max_model_len`` when the server
states one. Then each ``Request`` is sent to ``/v1/completions`` (or, with
``api="chat"``, ``/v1/chat/completions``) at its arrival time (or, with
``max_concurrency``, as a closed loop of that many clients) as a streamed,
greedy request with ``max_tokens``, ``stream_options.include_usage``, and the
EOS control of ``HttpClientOptions.eos_control`` (``perfsuite.adapters.openai_payload``).
This works with ``perfsuite serve``, vLLM, SGLang, TGI and llama.cpp.

The prompt goes as token ids or as text (``prompt_format``). ``auto`` settles
it once per engine, before any timed request, with a 1-token probe request:
token ids when the server accepts them, else text. No request of a measured
run is sent twice or dropped. ``X-Request-Id`` is sent only with
``send_request_ids`` (llama.cpp answers it with an empty 400); ``api_key`` goes
as ``Authorization: Bearer`` on every request, ``/v1/models`` included.

Timestamps are the client's ``time.perf_counter`` when each streamed chunk
arrives, so latencies include the network and the server's HTTP layer. How
tokens are counted and timed (exact token ids, or text only) is
``perfsuite.adapters.openai_stream``'s rule; tokens are never invented. A server that reports its prefix
cache hits per request (``usage.prompt_tokens_details.cached_tokens``) has them recorded too (same module).

After a run, every request must have produced what it asked for
(``perfsuite.adapters.output_lengths``): a short or empty output fails the run
with ``ShortOutputError`` naming the requests, since it did less work.

``greedy_equal`` is true only when it can be: prompts go as token ids and the
server returns exact token ids (perfsuite serve; vLLM with ``return_token_ids``).
Chat (the server applies a template) and text prompts are never greedy-equal,
nor is ``eos_control="min_tokens"``: without ``ignore_eos``, a server that
honours ``min_tokens`` masks EOS, changing the greedy choice wherever EOS would
win. (vLLM masks EOS under ``min_tokens`` even with ``ignore_eos``; to check
its greedy outputs on requests that ignore EOS, use ``eos_control="ignore_eos"``.)
Reading it asks the server once (the probe above) if no run has yet; a run
that sees a text-only answer turns it false. Exact ids equal unbatched greedy
decoding only if the server's batching keeps them so; the correctness test
against a server checks that.

Only the given endpoint is contacted (no proxies from the environment); every
request has a timeout and so does the whole run. A failed request raises
``OpenAIHttpError`` naming it and what to try; no request is dropped silently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from perfsuite.adapters.error_body import error_message
from perfsuite.adapters.http_options import SERVER_ENGINE, HttpClientOptions, check_endpoint, endpoint_url
from perfsuite.adapters.openai_payload import TEXT, TOKEN_IDS, Detokenize, PayloadBuilder, detokenizer
from perfsuite.adapters.openai_stream import (
    OpenAIHttpError,
    Piece,
    Received,
    SendTimes,
    ServerRejectedError,
    StreamState,
    to_record,
)
from perfsuite.adapters.output_lengths import (
    LengthMismatch,
    ShortOutputError,
    check_output_lengths,
    check_prompts_fit,
    is_complete,
)
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.adapters.server_info import (
    ServedModel,
    ServerInfo,
    ServerInfoError,
    auth_headers,
    fetch_server_info,
)
from perfsuite.adapters.server_scrape import DEFAULT_INTERVAL_S, MetricsPage, RunScraper
from perfsuite.engine.admission import refuse_follow_ups
from perfsuite.engine.names import OPENAI_HTTP
from perfsuite.engine.server_metrics import ServerMetrics
from perfsuite.engine.types import (
    EngineCounters,
    FinishReason,
    Request,
    RequestRecord,
    RunResult,
    SamplingParams,
    StepOutput,
    check_unique_ids,
)

__all__ = ["OpenAIHttpEngine", "OpenAIHttpError", "ShortOutputError", "base_url", "build"]

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_RUN_TIMEOUT_S = 3600.0
PROBE_REQUEST_ID = "perfsuite-probe"
PROBE_TEXT = "Hello"
# HTTP statuses that say "not this request", as a server that cannot take a token-id prompt answers;
# an auth, routing, rate or server failure is no reason to try text instead.
_REJECTION_STATUSES = (400, 415, 422)


def build(backend: Backend, config: EngineConfig) -> OpenAIHttpEngine:
    check_endpoint((SERVER_ENGINE,), backend.endpoint)
    assert backend.endpoint is not None  # check_endpoint refuses a missing one
    return OpenAIHttpEngine(
        backend.endpoint,
        config.batch_size,
        _text_tokenizer(backend),
        detokenize=detokenizer(backend.tokenizer) if backend.tokenizer is not None else None,
        options=backend.http_options,
    )


def _text_tokenizer(backend: Backend) -> Callable[[str], Sequence[int]]:
    """Token ids of a text piece, without the BOS token a whole prompt would get."""
    if backend.tokenizer is not None:
        return lambda text: backend.tokenizer.encode(text, add_special_tokens=False)
    return backend.tokenize


def base_url(endpoint: str) -> str:
    """``endpoint`` without a trailing ``/`` or ``/v1``; a clear error for anything but an http(s) URL."""
    try:
        parts = urlsplit(endpoint_url(endpoint))
    except ValueError as error:
        raise ValueError(f"--perf-endpoint {error}") from None
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def _default_probe_prompt(tokenize_text: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    try:
        token_ids = tuple(int(t) for t in tokenize_text(PROBE_TEXT))
    except TypeError:  # a fake backend's tokenize may count instead
        token_ids = ()
    return token_ids[:8] or (0,)


@dataclass(frozen=True, slots=True)
class _Run:
    """What one run's event loop brings back: the streams, the timed region, the server's metrics around it."""

    received: list[Received]
    start: float
    end: float
    server_metrics: ServerMetrics | None


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What the probe settled: the prompt format used, and whether the server returns token ids."""

    prompt_format: str
    returns_token_ids: bool


class OpenAIHttpEngine:
    """A client that measures an OpenAI-compatible server as a ``BatchingEngine``.

    ``batch_size`` caps the requests in flight at once, as the server's batch
    would; ``max_concurrency`` in ``run`` may lower it further. ``run`` drives
    its own event loop, so call it from synchronous code (as the harness does).
    ``detokenize`` turns a prompt's ids into text (for text prompts and chat);
    ``probe_prompt_ids`` is the prompt of the 1-token probe request (default:
    ``PROBE_TEXT`` tokenized, else token 0). ``scrape_interval_s``: how often the server's ``/metrics`` is read
    while a run is in flight (``perfsuite.adapters.server_scrape``); None: never read.
    """

    name = OPENAI_HTTP
    # The server does the work, in another process: its CPU use is not "other work" (perfsuite.measure.contention).
    runs_in_process = False

    def __init__(
        self,
        endpoint: str,
        batch_size: int,
        tokenize_text: Callable[[str], Sequence[int]],
        *,
        detokenize: Detokenize | None = None,
        options: HttpClientOptions = HttpClientOptions(),
        probe_prompt_ids: Sequence[int] | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
        scrape_interval_s: float | None = DEFAULT_INTERVAL_S,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if options.sends_text and detokenize is None:
            raise ValueError(
                f"api {options.api!r} with prompt_format {options.prompt_format!r} sends the prompt as text, which "
                "needs the model's tokenizer; use a backend loaded from a Hugging Face model (--perf-model)"
            )
        self.base_url = base_url(endpoint)
        self._batch_size = batch_size
        self._tokenize_text = tokenize_text
        self._detokenize = detokenize
        self._options = options
        self._probe_prompt_ids = tuple(probe_prompt_ids or _default_probe_prompt(tokenize_text))
        self._request_timeout_s = request_timeout_s
        self._run_timeout_s = run_timeout_s
        self._server_info: ServerInfo | None = None
        self._negotiated: Negotiated | None = None
        self._saw_text_only_output = False
        self._scrape_interval_s = scrape_interval_s  # None: never read the server's /metrics
        self._metrics_exposed: bool | None = None  # None: not asked yet

    # ------------------------------------------------------------------ what the server is

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def options(self) -> HttpClientOptions:
        return self._options

    @property
    def server_info(self) -> ServerInfo:
        """The server's ``/v1/models``, read once."""
        if self._server_info is None:
            try:
                self._server_info = fetch_server_info(self.base_url, api_key=self._options.api_key)
            except ServerInfoError as error:
                raise OpenAIHttpError(str(error)) from None
        return self._server_info

    @property
    def served_model(self) -> ServedModel:
        """The served model every request asks for (``server_model``, or the only one served)."""
        try:
            return self.server_info.select(self._options.server_model)
        except ServerInfoError as error:
            raise OpenAIHttpError(str(error)) from None

    @property
    def url(self) -> str:
        return self.base_url + ("/v1/chat/completions" if self._options.api == "chat" else "/v1/completions")

    @property
    def prompt_format(self) -> str:
        """``token_ids`` or ``text``: the form prompts go in (``auto`` is settled by asking the server)."""
        if self._options.sends_text:
            return TEXT
        return self._negotiate_now().prompt_format

    @property
    def greedy_equal(self) -> bool:
        """True only for exact token ids from the server on token-id prompts (see the module docstring)."""
        if self._options.sends_text or self._saw_text_only_output or not self._options.sends_ignore_eos:
            return False
        negotiated = self._negotiate_now()
        return negotiated.prompt_format == TOKEN_IDS and negotiated.returns_token_ids

    # ------------------------------------------------------------------ a run

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
        start_at: float | None = None,
    ) -> RunResult:
        """Serve ``requests`` over HTTP; ``on_step`` sees each received chunk's tokens (progress only).

        ``start_at``: the schedule's time zero on this process's ``time.perf_counter`` (a client shard's start,
        agreed with the others); None: as soon as the run is ready. A start already past makes the first
        sends late, which the send lag shows (``perfsuite.measure.send_lag``).
        """
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        ordered = sorted(requests, key=lambda r: r.arrival_time)
        check_unique_ids(ordered)
        refuse_follow_ups(ordered, self.name)
        served = self.served_model
        check_prompts_fit(ordered, served.max_model_len, served.model_id, self.base_url)
        run = asyncio.run(self._run_within_timeout(ordered, on_step, max_concurrency, start_at))
        if any(not r.has_exact_ids for r in run.received):
            self._saw_text_only_output = True
        records = tuple(to_record(r, self._tokenize_text) for r in run.received)
        self._check_output_lengths(run.received, records)
        return RunResult(self.name, records, run.start, run.end, EngineCounters(), server_metrics=run.server_metrics)

    @property
    def metrics_exposed(self) -> bool | None:
        """Whether the server's ``/metrics`` has vLLM's metrics (``perfsuite.adapters.server_scrape``); None until a
        run has asked."""
        return self._metrics_exposed

    def _start_scraper(self) -> RunScraper | None:
        """The server's metrics read before the run, and a thread reading them during it; None: not exposed."""
        if self._metrics_exposed is False or self._scrape_interval_s is None:
            return None
        page = MetricsPage(self.base_url, auth_headers(self._options.api_key))
        scraper = RunScraper(page, self.served_model.model_id, self._scrape_interval_s)
        self._metrics_exposed = scraper.start()
        return scraper if self._metrics_exposed else None

    def _check_output_lengths(self, received: Sequence[Received], records: Sequence[RequestRecord]) -> None:
        mismatches = [
            LengthMismatch(
                request_id=record.request_id,
                num_asked=one.request.sampling_params.max_new_tokens,
                num_received=record.num_output_tokens,
                finish_reason=record.finish_reason,
                ignore_eos=one.request.sampling_params.ignore_eos,
                count_source=one.count_source,
            )
            for one, record in zip(received, records)
            if not is_complete(one.request.sampling_params, record.num_output_tokens, record.finish_reason)
        ]
        check_output_lengths(mismatches, self.url, self._options.eos_control)

    async def _run_within_timeout(self, requests, on_step, max_concurrency, start_at=None):
        try:
            return await asyncio.wait_for(self._run(requests, on_step, max_concurrency, start_at), self._run_timeout_s)
        except TimeoutError:
            raise OpenAIHttpError(
                f"the run of {len(requests)} requests against {self.base_url} did not finish "
                f"within {self._run_timeout_s:g} s"
            ) from None

    async def _run(
        self,
        requests: list[Request],
        on_step: Callable[[list[StepOutput]], None] | None,
        max_concurrency: int | None,
        start_at: float | None = None,
    ) -> _Run:
        num_clients = min(self._batch_size, max_concurrency or self._batch_size)
        async with self._session(num_clients) as session:
            if self._negotiated is None:
                self._negotiated = await self._negotiate(session)
            scraper = await asyncio.to_thread(self._start_scraper)  # after the probe, so it does not count
            try:
                client = self._client(session, self._payload_builder(), on_step, scraper)
                payloads = {r.request_id: client.builder.payload(r) for r in requests}  # detokenized before timing
                start = time.perf_counter() if start_at is None else start_at
                if start > time.perf_counter():
                    await asyncio.sleep(start - time.perf_counter())
                received = await _send_all(
                    client, requests, payloads, start, num_clients, closed_loop=max_concurrency is not None
                )
                end = time.perf_counter()
            except BaseException:
                if scraper is not None:
                    scraper.stop()
                raise
        server_metrics = await asyncio.to_thread(scraper.finish, len(requests)) if scraper is not None else None
        return _Run(received, start, end, server_metrics)

    def _session(self, num_clients: int) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=num_clients),
            timeout=aiohttp.ClientTimeout(total=self._request_timeout_s),
            headers=auth_headers(self._options.api_key),
            trust_env=False,
        )

    def _client(
        self,
        session: aiohttp.ClientSession,
        builder: PayloadBuilder,
        on_step: Callable[[list[StepOutput]], None] | None,
        scraper: RunScraper | None = None,
    ) -> _Client:
        client = _Client(
            session, self.base_url + builder.path, builder, self._options.send_request_ids, on_step, self._tokenize_text
        )
        client.on_first_output = scraper.nudge if scraper is not None else None
        return client

    def _payload_builder(self, prompt_format: str | None = None) -> PayloadBuilder:
        if prompt_format is None and self._options.sends_text:
            prompt_format = TEXT
        elif prompt_format is None:
            assert self._negotiated is not None  # a run negotiates before it builds its payloads
            prompt_format = self._negotiated.prompt_format
        return PayloadBuilder(self._options, self.served_model.model_id, prompt_format, self._detokenize)

    # ------------------------------------------------------------------ the probe

    def _negotiate_now(self) -> Negotiated:
        """The probe's answer, asking the server (in a thread, with its own loop) if nobody has yet."""
        if self._negotiated is None:
            self.served_model  # noqa: B018 - fetched here, outside any event loop
            with ThreadPoolExecutor(1) as pool:
                self._negotiated = pool.submit(asyncio.run, self._negotiate_alone()).result()
        return self._negotiated

    async def _negotiate_alone(self) -> Negotiated:
        async with self._session(1) as session:
            return await self._negotiate(session)

    async def _negotiate(self, session: aiohttp.ClientSession) -> Negotiated:
        """Send the 1-token probe as token ids, then (``auto``, if the server rejects them) as text."""
        if self._options.sends_text:
            return Negotiated(TEXT, returns_token_ids=False)
        try:
            return Negotiated(TOKEN_IDS, await self._probe(session, TOKEN_IDS))
        except ServerRejectedError as error:
            if self._options.prompt_format != "auto" or error.status not in _REJECTION_STATUSES:
                raise
            if self._detokenize is None:
                raise OpenAIHttpError(
                    f"{error}. The server may not take token-id prompts, and this backend has no tokenizer to "
                    "send text instead; use a backend loaded from a Hugging Face model"
                ) from None
            rejection = str(error)
        try:
            return Negotiated(TEXT, await self._probe(session, TEXT))
        except ServerRejectedError as error:
            raise OpenAIHttpError(
                f"the server rejected the probe request both with a token-id prompt ({rejection}) and with a text "
                f"prompt ({error})"
            ) from None

    async def _probe(self, session: aiohttp.ClientSession, prompt_format: str) -> bool:
        """Whether the server answered the probe with token ids; ``ServerRejectedError`` if it refused it."""
        builder = self._payload_builder(prompt_format)
        probe = Request(PROBE_REQUEST_ID, self._probe_prompt_ids, SamplingParams(1, ignore_eos=True))
        client = self._client(session, builder, None)
        received = await client.complete(probe, builder.payload(probe), time.perf_counter())
        return received.has_exact_ids


async def _send_all(
    client: _Client,
    requests: list[Request],
    payloads: dict[str, dict],
    start: float,
    num_clients: int,
    *,
    closed_loop: bool,
) -> list[Received]:
    """Send each request at its arrival time, at most ``num_clients`` at once, in arrival order.

    Open loop: a request's arrival is its scheduled time, so waiting for a free client counts as queueing. Closed
    loop: its arrival is when it is sent. An open-loop request also records when it was scheduled, when it could
    first have gone (its schedule, or the moment a busy client freed) and when it went: the gap between the last
    two is this loop's own lateness (``perfsuite.measure.send_lag``), e.g. while it parses other streams.
    """
    free_clients = asyncio.Semaphore(num_clients)
    releases: list[float] = []  # when each request's client was freed, in order
    tasks: list[asyncio.Task] = []
    try:
        for request in requests:
            scheduled = start + request.arrival_time
            await _sleep_until(scheduled)
            num_released = len(releases) if free_clients.locked() else None
            await free_clients.acquire()
            sent = time.perf_counter()
            if _any_failed(tasks):
                free_clients.release()
                break  # a request failed; gather below raises its error
            arrival = sent if closed_loop else scheduled
            times = None if closed_loop else SendTimes(scheduled, _ready_time(scheduled, releases, num_released), sent)
            payload = payloads[request.request_id]
            sending = _send_one(client, request, payload, arrival, free_clients, releases, times)
            tasks.append(asyncio.create_task(sending))
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _any_failed(tasks: Sequence[asyncio.Task]) -> bool:
    return any(task.done() and not task.cancelled() and task.exception() for task in tasks)


def _ready_time(scheduled: float, releases: Sequence[float], num_released: int | None) -> float:
    """When a request could first have gone: its schedule, or the release of a client it waited for.

    ``num_released``: the releases counted when it found no client free (None: one was free). Only the send loop
    acquires, so the first release after that is the one that let it go.
    """
    freed = releases[num_released] if num_released is not None and len(releases) > num_released else None
    return scheduled if freed is None else max(scheduled, freed)


async def _send_one(
    client: _Client,
    request: Request,
    payload: dict,
    arrival: float,
    free_clients: asyncio.Semaphore,
    releases: list[float],
    times: SendTimes | None,
) -> Received:
    try:
        received = await client.complete(request, payload, arrival)
    finally:
        releases.append(time.perf_counter())
        free_clients.release()
    return dataclasses.replace(received, send_times=times)


class _Client:
    """One session's requests to one URL: sending, the SSE parsing, errors that say what to try."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        builder: PayloadBuilder,
        send_request_ids: bool,
        on_step: Callable[[list[StepOutput]], None] | None,
        tokenize_text: Callable[[str], Sequence[int]],
    ) -> None:
        self._session = session
        self._url = url
        self.builder = builder
        self._send_request_ids = send_request_ids
        self._on_step = on_step
        self._tokenize_text = tokenize_text
        self.on_first_output: Callable[[], None] | None = None  # called once, at the first chunk with output

    async def complete(self, request: Request, payload: dict, arrival: float) -> Received:
        where = f"request {request.request_id!r} to {self._url}"
        try:
            state = await self._stream(request, payload)
        except TimeoutError:
            raise OpenAIHttpError(f"{where}: no complete response within the request timeout") from None
        except aiohttp.ClientConnectionError as error:
            raise OpenAIHttpError(
                f"{where} failed: cannot reach the server: {type(error).__name__}: {error}; is it running? "
                "(--perf-endpoint)"
            ) from None
        except aiohttp.ClientError as error:
            raise OpenAIHttpError(f"{where} failed: {type(error).__name__}: {error}") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise OpenAIHttpError(f"{where}: malformed stream chunk: {error}") from None
        if not state.is_done or state.finish_reason is None:
            raise OpenAIHttpError(f"{where}: the stream ended before a finish_reason and data: [DONE]")
        return Received(
            request=request,
            arrival=arrival,
            finished_time=time.perf_counter(),
            pieces=tuple(state.pieces),
            finish_reason=state.finish_reason,
            num_usage_tokens=state.num_usage_tokens,
            num_cached_tokens=state.num_cached_tokens,
            num_usage_prompt_tokens=state.num_usage_prompt_tokens,
        )

    async def _stream(self, request: Request, payload: dict) -> StreamState:
        state = StreamState(request.request_id)
        headers = {"X-Request-Id": request.request_id} if self._send_request_ids else {}
        async with self._session.post(self._url, json=payload, headers=headers) as response:
            if response.status != 200:
                message = self._rejection(request, response.status, await response.text())
                raise ServerRejectedError(message, response.status)
            async for line in response.content:
                arrival = time.perf_counter()
                data = line.decode("utf-8").strip()
                if not data.startswith("data:"):
                    continue
                pieces = state.take(data[len("data:") :].strip(), arrival)
                if pieces and self.on_first_output is not None:
                    self._first_output_came()
                if state.is_done:
                    break
                if self._on_step is not None and pieces:
                    self._report_progress(request.request_id, pieces, state.finish_reason)
        return state

    def _first_output_came(self) -> None:
        """The run's first output: the server holds its requests now, so its load is worth a reading."""
        first_output, self.on_first_output = self.on_first_output, None
        assert first_output is not None
        first_output()

    def _rejection(self, request: Request, status: int, body: str) -> str:
        message = f"request {request.request_id!r}: HTTP {status} from {self._url}: {error_message(body)}"
        hints = _rejection_hints(status, self._send_request_ids, self.builder)
        return message + (f"; {'; '.join(hints)}" if hints else "")

    def _report_progress(self, request_id: str, pieces: Sequence[Piece], finish_reason: FinishReason | None) -> None:
        token_ids = [t for p in pieces for t in self._progress_ids(p)]
        last = len(token_ids) - 1
        outputs = [StepOutput(request_id, t, finish_reason if i == last else None) for i, t in enumerate(token_ids)]
        assert self._on_step is not None  # called only when there is someone to report to
        self._on_step(outputs)

    def _progress_ids(self, piece: Piece) -> Sequence[int]:
        """A chunk's ids, or its text tokenized: for a progress bar only, never for the record."""
        return piece.token_ids if piece.token_ids is not None else self._tokenize_text(piece.text)


def _rejection_hints(status: int, sent_request_id: bool, builder: PayloadBuilder) -> list[str]:
    """What to try after an HTTP error, from what this request carried."""
    if status in (401, 403):
        return ["the server wants an API key: pass it with --perf-api-key (or set PERFSUITE_API_KEY)"]
    if status == 404:
        return [f"check --perf-endpoint and that the server serves {builder.model_id!r} at {builder.path}"]
    hints = []
    if status in _REJECTION_STATUSES:
        if sent_request_id:
            hints.append("the server may refuse the X-Request-Id header (llama.cpp does): drop --perf-send-request-ids")
        if builder.prompt_format == TOKEN_IDS and builder.options.api == "completions":
            hints.append("it may not take token-id prompts: try --perf-prompt-format text")
    return hints
