"""``perfsuite serve`` and the ``openai-http`` adapter, over loopback.

The model server runs tiny-random; the tests of disconnects, back-pressure and
engine failures run over a fake runner that sleeps each step, so a request
reliably outlives the client that leaves it. Servers run in-process on
background threads, so client and engine timestamps share one
``perf_counter`` clock and can be compared directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.adapters.openai_http import OpenAIHttpError
from perfsuite.cli import build_parser
from perfsuite.engine import FinishReason, Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.measure.metrics import request_metrics
from perfsuite.models import build_byte_tokenizer, load_model
from perfsuite.serve import CompletionServer, ServeLimits, ServeOptions, ServerThread, build_server
from perfsuite.report.server_metrics import server_metrics_facts
from test_server_metrics import as_session_result

MAX_SEQ_LEN = 128
BATCH_SIZE = 4
FAKE_VOCAB = 320
POISON_TOKEN = 13  # the fake runner fails the step that prefills it...
LATE_POISON_TOKEN = 14  # ...or, at the head of a prompt, the step after its second output token
HTTP_TIMEOUT_S = 10.0

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(url: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _no_proxy.open(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def health(server: ServerThread) -> dict:
    status, body = call(server.url + "/health")
    assert status == 200
    return json.loads(body)


def sse_events(raw: bytes) -> list[dict | str]:
    payloads = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def wait_until(condition, what: str, timeout_s: float = 5.0, interval_s: float = 0.02):
    for _ in range(int(timeout_s / interval_s)):
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"{what} did not happen within {timeout_s} s")


def counts_of(usage: dict) -> dict:
    """A usage's token counts, without ``prompt_tokens_details`` (tests/test_serve_prefix_cache.py checks it)."""
    return {name: value for name, value in usage.items() if name != "prompt_tokens_details"}


def records_by_id(server: ServerThread) -> dict:
    return {r.request_id: r for r in server.server.recent_records()}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def loaded():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def served(loaded):
    engine = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(BATCH_SIZE, MAX_SEQ_LEN))
    server = CompletionServer(
        engine, loaded.tokenizer, model_name="tiny-random", vocab_size=loaded.model.config.vocab_size
    )
    with ServerThread(server) as thread:
        yield thread


class FaultyModel:
    """Steps of the fake runner: each sleeps, and poisoned prompts make one fail."""

    def __init__(self) -> None:
        self._fail_at: dict[int, int] = {}  # slot -> position whose step fails

    def __call__(self, output) -> None:
        for chunk in output.chunks:
            if chunk.start_position == 0:
                self._fail_at.pop(chunk.slot, None)
                if chunk.token_ids[0] == LATE_POISON_TOKEN:
                    self._fail_at[chunk.slot] = chunk.num_tokens + 1  # the third token's step
            if POISON_TOKEN in chunk.token_ids or self._fail_at.get(chunk.slot) == chunk.start_position:
                raise RuntimeError("poisoned step")
        time.sleep(0.01)  # slow enough that a long request outlives its client


@pytest.fixture(scope="module")
def fake_served():
    runner = FakeRunner(vocab_size=FAKE_VOCAB, on_execute=FaultyModel())
    engine = inflight_engine(runner, decode_batch_size=2, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)
    server = CompletionServer(
        engine,
        build_byte_tokenizer(FAKE_VOCAB),
        model_name="fake",
        vocab_size=FAKE_VOCAB,
        limits=ServeLimits(max_open_requests=2),
    )
    with ServerThread(server) as thread:
        yield thread


def workload(tokenizer) -> list[Request]:
    texts = ["Hello there", "The quick brown fox", "a", "Batching over HTTP", "1 2 3 4 5", "ok"]
    requests = []
    for i, text in enumerate(texts):
        params = SamplingParams(max_new_tokens=6 + 3 * i, ignore_eos=i % 2 == 0)
        prompt = tuple(tokenizer(text)["input_ids"])
        requests.append(Request(f"req-{i}", prompt, params, arrival_time=0.01 * (i // 2)))
    return requests


@pytest.fixture(scope="module")
def http_run(loaded, served):
    """One workload through the adapter, the engine's records of it, and the same workload in-process."""
    requests = workload(loaded.tokenizer)
    # X-Request-Id names the server's records after the client's requests
    backend = Backend.from_loaded(loaded, endpoint=served.url, http_options=HttpClientOptions(send_request_ids=True))
    client_result = build_engine("openai-http", backend, EngineConfig(BATCH_SIZE, MAX_SEQ_LEN)).run(requests)
    engine_records = records_by_id(served)
    in_process = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(BATCH_SIZE, MAX_SEQ_LEN))
    return client_result, engine_records, in_process.run(requests)


# --------------------------------------------------------------------------- the adapter


def test_outputs_over_http_equal_the_in_process_engines(http_run):
    client_result, _, in_process = http_run
    assert client_result.engine_name == "openai-http"
    assert client_result.outputs() == in_process.outputs()
    reasons = {r.request_id: r.finish_reason for r in in_process.records}
    assert {r.request_id: r.finish_reason for r in client_result.records} == reasons


def test_client_timestamps_enclose_the_engines(http_run):
    # Same clock: the client stamps arrival before sending and each token after
    # receiving it, the engine stamps in between, so every client latency is
    # at least the engine's.
    client_result, engine_records, _ = http_run
    for client in client_result.records:
        engine = engine_records[client.request_id]
        assert client.arrival_time <= engine.arrival_time
        assert len(client.token_times) == len(engine.token_times) == client.num_output_tokens
        assert all(c >= e for c, e in zip(client.token_times, engine.token_times))
        assert request_metrics(client).ttft >= request_metrics(engine).ttft
        assert request_metrics(client).e2e >= request_metrics(engine).e2e


def test_adapter_without_endpoint_names_the_option():
    backend = Backend(runner=None, tokenize=lambda text: [], eos_token_id=None, max_context=256, device="cpu")
    with pytest.raises(ValueError, match="--perf-endpoint"):
        build_engine("openai-http", backend, EngineConfig(2, 64))
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        build_engine("openai-http", Backend(None, len, None, 256, "cpu", endpoint="ftp://x"), EngineConfig(2, 64))


def test_adapter_checks_the_servers_max_model_len_before_sending(loaded, served):
    engine = build_engine("openai-http", Backend.from_loaded(loaded, endpoint=served.url), EngineConfig(2, 64))
    too_long = Request("too-long", tuple(range(3, 3 + MAX_SEQ_LEN)), SamplingParams(4))
    fine = Request("fine", (5, 6), SamplingParams(4))
    with pytest.raises(OpenAIHttpError, match=rf"max_model_len of {MAX_SEQ_LEN} .*'too-long' needs {MAX_SEQ_LEN + 4}"):
        engine.run([fine, too_long])


def test_adapter_reports_an_unreachable_server(loaded):
    backend = Backend.from_loaded(loaded, endpoint="http://127.0.0.1:1/v1")
    with pytest.raises(OpenAIHttpError, match="cannot reach"):
        build_engine("openai-http", backend, EngineConfig(2, 64)).run([Request("r", (5,), SamplingParams(2))])


# --------------------------------------------------------------------------- the server's API


def test_health_reports_the_engines_load(served):
    # An earlier test's client may have gone away a moment ago: its abort reaches the engine asynchronously.
    # A request that is never freed still fails here, once the deadline passes.
    deadline = time.monotonic() + 10
    load = health(served)
    while (load["running"] or load["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        load = health(served)
    assert load["status"] == "ok"
    assert load["free_slots"] == load["num_slots"] == BATCH_SIZE
    assert load["running"] == load["waiting"] == 0


def test_a_stream_carries_one_token_per_chunk_then_usage_and_done(loaded, served):
    body = {"prompt": "Stream me", "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    status, raw = call(served.url + "/v1/completions", body)
    assert status == 200
    *chunks, usage_chunk, done = sse_events(raw)
    assert done == "[DONE]"
    assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [1] * 12
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 11 + ["length"]
    token_ids = [c["choices"][0]["token_ids"][0] for c in chunks]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == loaded.tokenizer.decode(token_ids, skip_special_tokens=True)
    prompt_tokens = len(loaded.tokenizer("Stream me")["input_ids"])
    assert usage_chunk["choices"] == []
    assert counts_of(usage_chunk["usage"]) == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                                    "total_tokens": prompt_tokens + 12}  # fmt: skip


def test_a_whole_completion_equals_the_streamed_one(served):
    prompt = [40, 41, 42, 43]
    status, raw = call(served.url + "/v1/completions", {"prompt": prompt, "max_tokens": 9, "ignore_eos": True})
    assert status == 200
    whole = json.loads(raw)
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    assert counts_of(whole["usage"]) == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    (choice,) = whole["choices"]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 9
    status, raw = call(served.url + "/v1/completions", {"prompt": [prompt], "max_tokens": 9, "ignore_eos": True,
                                                        "stream": True})  # fmt: skip
    streamed = [e["choices"][0] for e in sse_events(raw) if e != "[DONE]"]
    assert [c["token_ids"][0] for c in streamed] == choice["token_ids"]
    assert "".join(c["text"] for c in streamed) == choice["text"]


def test_models_lists_the_served_model(served):
    status, raw = call(served.url + "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(raw)["data"]] == ["tiny-random"]


TOO_LONG = list(range(3, 3 + MAX_SEQ_LEN))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": {"text": "hi"}}, "prompt"),
        ({"prompt": [["one"]]}, "prompt"),
        ({"prompt": [5, "x"]}, "prompt"),
        ({"prompt": [5, 99999]}, "prompt"),
        ({"prompt": TOO_LONG}, "prompt"),
        ({"prompt": [5, 6], "max_tokens": MAX_SEQ_LEN}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": "8"}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
        ({"prompt": "hi", "stream": "yes"}, "stream"),
        ({"prompt": "hi", "ignore_eos": 1}, "ignore_eos"),
        ({"prompt": "hi", "temperature": 0.8}, "temperature"),
        ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "hi", "stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({"prompt": "hi", "model": 7}, "model"),
        ({"prompt": "hi", "stop_token_ids": [1.5]}, "stop_token_ids"),
    ],
)
def test_malformed_requests_get_an_openai_error(served, body, param):
    status, raw = call(served.url + "/v1/completions", body)
    assert status == 400
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]


def test_unknown_routes_get_json_errors(served):
    status, raw = call(served.url + "/v1/chat/nothing", {"prompt": "hi"})
    assert status == 404 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    status, raw = call(served.url + "/v1/completions")  # GET
    assert status == 405 and "error" in json.loads(raw)


# --------------------------------------------------------------------------- disconnects, back-pressure, failures


def open_stream(server: ServerThread, request_id: str, prompt=(5, 6, 7)) -> http.client.HTTPConnection:
    """A streamed request that has produced its first token, left open."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=HTTP_TIMEOUT_S)
    body = {"prompt": list(prompt), "max_tokens": MAX_SEQ_LEN - len(prompt), "stream": True}
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    connection.request("POST", "/v1/completions", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    return connection


def test_a_client_that_disconnects_frees_its_slot(fake_served):
    connection = open_stream(fake_served, "leaver")
    assert health(fake_served)["running"] == 1
    connection.close()
    wait_until(lambda: health(fake_served)["free_slots"] == 2, "the slot being freed")
    record = wait_until(lambda: records_by_id(fake_served).get("leaver"), "the aborted request's record")
    assert record.finish_reason is FinishReason.ABORT
    assert record.num_output_tokens < MAX_SEQ_LEN - 3
    assert health(fake_served)["open_requests"] == 0


def test_a_full_server_answers_429(fake_served):
    connections = [open_stream(fake_served, f"holder-{i}") for i in range(2)]
    try:
        status, raw = call(fake_served.url + "/v1/completions", {"prompt": [5], "max_tokens": 2})
        assert status == 429
        assert json.loads(raw)["error"]["type"] == "rate_limit_error"
    finally:
        for connection in connections:
            connection.close()
    wait_until(lambda: health(fake_served)["open_requests"] == 0, "the held requests being closed")
    assert call(fake_served.url + "/v1/completions", {"prompt": [5], "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_failure_is_a_500_and_the_server_keeps_serving(fake_served, stream):
    status, raw = call(fake_served.url + "/v1/completions", {"prompt": [5, POISON_TOKEN], "stream": stream})
    assert status == 500
    error = json.loads(raw)["error"]
    assert error["type"] == "server_error" and "poisoned step" in error["message"]
    wait_until(lambda: health(fake_served)["free_slots"] == 2, "the failed request's slot being freed")
    status, raw = call(fake_served.url + "/v1/completions", {"prompt": [5, 6], "max_tokens": 3})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3


def test_a_failure_mid_stream_ends_the_stream_with_an_error(fake_served):
    body = {"prompt": [LATE_POISON_TOKEN, 5, 6], "max_tokens": 20, "stream": True}
    status, raw = call(fake_served.url + "/v1/completions", body)
    assert status == 200, "headers went out with the first token"
    *tokens, error, done = sse_events(raw)
    assert len(tokens) == 2 and done == "[DONE]"
    assert error["error"]["type"] == "server_error" and "poisoned step" in error["error"]["message"]

    adapter = build_engine("openai-http", Backend(None, len, None, 256, "cpu", endpoint=fake_served.url),
                           EngineConfig(2, MAX_SEQ_LEN))  # fmt: skip
    with pytest.raises(OpenAIHttpError, match="'doomed'.*mid-stream.*poisoned step"):
        adapter.run([Request("doomed", (LATE_POISON_TOKEN, 5, 6), SamplingParams(20))])


class TextOnlyServer:
    """A peer that sends two tokens per chunk as text, without token ids."""

    async def start(self, host: str, port: int) -> int:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "text-only"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for text, reason in (("ab", None), ("cd", None), ("e", "length")):
            chunk = {"choices": [{"index": 0, "text": text, "finish_reason": reason}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.02)
        await response.write(b'data: {"choices": [], "usage": {"completion_tokens": 5}}\n\ndata: [DONE]\n\n')
        return response


def test_a_text_only_stream_has_one_time_per_chunk_and_the_servers_count():
    with ServerThread(TextOnlyServer()) as peer:
        bytes_of = lambda text: list(text.encode())  # noqa: E731
        adapter = build_engine("openai-http", Backend(None, bytes_of, None, 256, "cpu", endpoint=peer.url + "/v1"),
                               EngineConfig(1, 64))  # fmt: skip
        (record,) = adapter.run([Request("r", (5,), SamplingParams(5))]).records
    assert record.output_token_ids == tuple(b"abcde") and record.num_output_tokens == 5
    times = record.token_times
    assert len(times) == 3 and times[0] < times[1] < times[2], "the client saw 3 chunks, not 5 token arrivals"
    assert record.finish_reason is FinishReason.LENGTH
    assert not adapter.greedy_equal, "text without token ids"


# --------------------------------------------------------------------------- the command line


def test_serve_command_builds_a_working_server():
    args = build_parser().parse_args(["serve", "--model", "tiny-random", "--port", "0", "--max-seq-len", "64"])
    assert (args.command, args.port, args.max_seq_len, args.host) == ("serve", 0, 64, "127.0.0.1")
    assert args.engine == "inflight"
    options = ServeOptions(model="tiny-random", port=0, batch_size=2, max_seq_len=64, device="cpu")
    with ServerThread(build_server(options)) as thread:
        assert health(thread)["num_slots"] == 2
        assert thread.server.recent_records() == (), "the warm-up is not one of the server's requests"


def test_serve_engine_paged_prefix_reports_the_cached_prompt_tokens_of_a_repeated_prompt():
    args = build_parser().parse_args(["serve", "--model", "tiny-random", "--engine", "paged-prefix"])
    options = ServeOptions(model=args.model, port=0, batch_size=2, max_seq_len=64, device="cpu", engine=args.engine)
    with ServerThread(build_server(options)) as thread:
        body = {"prompt": list(range(100, 120)), "max_tokens": 2, "ignore_eos": True}
        usages = [json.loads(call(thread.url + "/v1/completions", body)[1])["usage"] for _ in range(2)]
    assert [usage["prompt_tokens_details"]["cached_tokens"] for usage in usages] == [0, 16], "one full block of 16"


def test_serve_refuses_an_engine_it_does_not_run():
    with pytest.raises(ValueError, match="--engine 'static' is not one perfsuite serve runs; choose from inflight, "
                                         "paged, paged-prefix"):  # fmt: skip
        ServeOptions(model="tiny-random", engine="static")


# --------------------------------------------------------------------------- the server's metrics, read by the client


def spread_requests(tokenizer, num_requests: int = 5, gap_s: float = 0.3) -> list[Request]:
    """Open-loop requests over longer than the client's scrape interval, so the load gauges are read in flight."""
    prompt = tuple(tokenizer("The server's own view of a run")["input_ids"])
    params = SamplingParams(16, ignore_eos=True)
    return [Request(f"spread-{i}", prompt, params, arrival_time=i * gap_s) for i in range(num_requests)]


def test_a_client_run_records_the_servers_kv_usage_counters_and_ttft_and_the_report_shows_the_gap(loaded, served):
    """Acceptance (issue 41): server-side TTFT and KV usage in results.json, client − server TTFT in the report."""
    client = build_engine("openai-http", Backend.from_loaded(loaded, endpoint=served.url), EngineConfig(2, 256))
    requests_sent = spread_requests(loaded.tokenizer)
    run = client.run(requests_sent)
    server = run.server_metrics
    assert server is not None and client.metrics_exposed
    assert server.num_scrapes_during >= 1, "the run lasts past one scrape interval"
    assert server.kv_cache_usage is not None and 0 <= server.kv_cache_usage.max <= 1
    assert server.num_waiting is not None and server.num_preemptions == 0
    assert server.prefix_cache_queries is not None and server.prefix_cache_hits is not None
    result = as_session_result(run)
    assert result.measurement.server_metrics == (server,), "results.json keeps each repeat's server figures"
    assert server.ttft is not None and server.ttft.count == len(requests_sent)
    assert server.ttft.mean is not None and 0 < server.ttft.mean <= result.measurement.summary.ttft.mean_ms / 1e3
    facts = dict(server_metrics_facts(result))
    assert "client - server TTFT (mean)" in facts and "server TTFT mean / p50 / p99" in facts


def test_a_run_shorter_than_the_scrape_interval_still_reads_the_servers_load_once_in_flight(loaded, served):
    client = build_engine("openai-http", Backend.from_loaded(loaded, endpoint=served.url), EngineConfig(2, 256))
    run = client.run([dataclasses.replace(r, arrival_time=0.0) for r in spread_requests(loaded.tokenizer, 2)])
    assert run.server_metrics is not None and run.server_metrics.num_scrapes_during >= 1, (
        "the first output nudges a reading")
    assert run.server_metrics.kv_cache_usage is not None
