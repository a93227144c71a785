"""The ``openai-http`` client against fake servers that behave like llama.cpp and vLLM, over loopback.

``FakeOpenAIServer`` is configured per test (``Behaviour``): llama.cpp-like
(text only, no usage, rejects token-id prompts and answers ``X-Request-Id``
with an empty 400, ignores ``ignore_eos`` but honours ``min_tokens``) or
vLLM-like (token ids, usage, ``ignore_eos``; optionally cutting outputs short
while saying ``length``). Its output is deterministic: token i is the byte of
letter i % 26, so the byte codec below turns it into text and back exactly.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field, replace

import pytest
from aiohttp import web

from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.adapters.openai_http import OpenAIHttpEngine, OpenAIHttpError, ShortOutputError
from perfsuite.adapters.openai_stream import Piece, Received, to_record
from perfsuite.engine import FinishReason, Request, SamplingParams
from perfsuite.measure.metrics import request_metrics, run_metrics
from perfsuite.measure.prefix_cache import cached_prompts
from perfsuite.measure.summaries import vllm_summary
from perfsuite.serve import ServerThread
from fake_backend import FAKE_BACKEND_CONFTEST

pytest_plugins = ["pytester"]

BYTE_OFFSET = 3  # as perfsuite's byte tokenizer: byte b is token 3 + b


def encode(text: str) -> list[int]:
    return [BYTE_OFFSET + b for b in text.encode()]


def decode(token_ids) -> str:
    return bytes(t - BYTE_OFFSET for t in token_ids).decode()


class ByteTokenizer:
    """The two Hugging Face tokenizer calls the client makes."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return encode(text)

    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None) -> str:
        return decode(token_ids)


@dataclass(frozen=True)
class Behaviour:
    model_ids: tuple[str, ...] = ("fake-model",)
    max_model_len: int | None = 256
    accepts_token_ids: bool = True
    rejects_request_id_header: bool = False  # llama.cpp: 400 with an empty body
    sends_token_ids: bool = True
    sends_usage: bool = True
    honours_ignore_eos: bool = True
    honours_min_tokens: bool = True
    eos_after: int | None = None  # the model picks EOS after this many tokens
    cut_to: int | None = None  # outputs capped at this many tokens, still finishing with "length"
    silent_tokens: int = 0  # the last tokens stream no text (EOS or special tokens, skipped when detokenizing)
    usage_extra: int = 0  # usage counts this many tokens more than were produced (a broken server)
    tokens_per_chunk: int = 1
    api_key: str | None = None
    html_error: tuple[str, int] | None = None  # (path, status): a web server's HTML error page, not an API's JSON
    # usage.prompt_tokens_details.cached_tokens, vLLM's: a prompt seen before is cached but for its last token
    prefix_cache: bool = False
    cached_tokens: object = None  # sent as cached_tokens whatever the prompt (a broken server)
    chat_template_tokens: int = 0  # usage.prompt_tokens of a chat request counts this many more than its message
    prompt_tokens: object = None  # sent as usage.prompt_tokens whatever the prompt (a broken server)


VLLM = Behaviour()
# What a proxy or a web server that is not an OpenAI server answers: a page, tens of kB with its styles.
HTML_ERROR_PAGE = (
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<title>502 Bad Gateway</title>\n<style>\n"
    + "body { font-family: sans-serif; margin: 0 auto; }\n" * 400
    + "</style>\n<script>var config = {\"retry\": true};</script>\n</head>\n<body>\n"
    + "<h1>Bad Gateway</h1>\n<p>The upstream server did not answer &amp; was marked down.</p>\n"
    + "<p>Reference: incident 12345.</p>\n" * 200
    + "<hr><center>nginx</center>\n</body>\n</html>\n"
)
LLAMA_CPP = Behaviour(
    accepts_token_ids=False,
    rejects_request_id_header=True,
    sends_token_ids=False,
    sends_usage=False,
    honours_ignore_eos=False,
)


@dataclass
class FakeOpenAIServer:
    behaviour: Behaviour
    seen: list[tuple[str, dict, dict]] = field(default_factory=list)  # (path, headers, body)
    prompts_seen: set[tuple[int, ...]] = field(default_factory=set)  # the prefix cache, when it has one

    @property
    def completion_bodies(self) -> list[dict]:
        return [body for path, _, body in self.seen if path != "/v1/models"]

    async def start(self, host: str, port: int) -> int:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()

    def _unauthorized(self, request: web.Request) -> bool:
        key = self.behaviour.api_key
        return key is not None and request.headers.get("Authorization") != f"Bearer {key}"

    def _html_error(self, request: web.Request) -> web.Response | None:
        if self.behaviour.html_error is None or self.behaviour.html_error[0] != request.path:
            return None
        return web.Response(text=HTML_ERROR_PAGE, status=self.behaviour.html_error[1], content_type="text/html")

    async def _models(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers), {}))
        if (page := self._html_error(request)) is not None:
            return page
        if self._unauthorized(request):
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        length = {"max_model_len": self.behaviour.max_model_len} if self.behaviour.max_model_len else {}
        return web.json_response({"data": [{"id": m, "object": "model", **length} for m in self.behaviour.model_ids]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, dict(request.headers), body))
        behaviour = self.behaviour
        if self._unauthorized(request):
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        if (page := self._html_error(request)) is not None:
            return page
        if behaviour.rejects_request_id_header and "X-Request-Id" in request.headers:
            return web.Response(status=400)
        if isinstance(body.get("prompt"), list) and not behaviour.accepts_token_ids:
            return web.json_response({"detail": [{"loc": ["body", "prompt"], "msg": "str type expected"}]}, status=422)
        if body.get("model") not in behaviour.model_ids:
            return web.json_response({"error": {"message": f"model {body.get('model')!r} not found"}}, status=404)
        num_tokens, reason = self._output_length(body)
        return await self._stream(request, body, num_tokens, reason)

    def _output_length(self, body: dict) -> tuple[int, str]:
        behaviour = self.behaviour
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        ignores_eos = behaviour.honours_ignore_eos and body.get("ignore_eos", False)
        min_tokens = body.get("min_tokens", 0) if behaviour.honours_min_tokens else 0
        num_tokens, reason = max_tokens, "length"
        eos = behaviour.eos_after
        if eos is not None and eos < max_tokens and not ignores_eos and min_tokens <= eos:
            num_tokens, reason = eos, "stop"
        if behaviour.cut_to is not None:
            num_tokens = min(num_tokens, behaviour.cut_to)
        return num_tokens, reason

    async def _stream(self, request: web.Request, body: dict, num_tokens: int, reason: str) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        ids = [BYTE_OFFSET + ord("a") + i % 26 for i in range(num_tokens)]
        num_with_text = num_tokens - self.behaviour.silent_tokens
        per_chunk = self.behaviour.tokens_per_chunk
        starts = range(0, num_tokens, per_chunk) if num_tokens else [0]
        for number, first in enumerate(starts):
            chunk_ids = ids[first : first + per_chunk]
            text = decode(ids[first : min(first + per_chunk, num_with_text)])
            finish = reason if number == len(starts) - 1 else None
            await response.write(self._event({"choices": [self._choice(body, chunk_ids, text, finish)]}))
        if self.behaviour.sends_usage and body.get("stream_options", {}).get("include_usage"):
            usage = {"completion_tokens": num_tokens + self.behaviour.usage_extra, **self._prompt_details(body),
                     "prompt_tokens": self._prompt_tokens(body)}  # fmt: skip
            await response.write(self._event({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        return response

    def _prompt_tokens(self, body: dict) -> object:
        if self.behaviour.prompt_tokens is not None:
            return self.behaviour.prompt_tokens
        if "messages" in body:
            return len(encode(body["messages"][-1]["content"])) + self.behaviour.chat_template_tokens
        prompt = body["prompt"]
        return len(prompt) if isinstance(prompt, list) else len(encode(prompt))

    def _prompt_details(self, body: dict) -> dict:
        if self.behaviour.cached_tokens is not None:
            return {"prompt_tokens_details": {"cached_tokens": self.behaviour.cached_tokens}}
        if not self.behaviour.prefix_cache:
            return {}
        prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        prompt = tuple(prompt) if isinstance(prompt, list) else tuple(encode(prompt))
        cached = len(prompt) - 1 if prompt in self.prompts_seen else 0
        self.prompts_seen.add(prompt)
        return {"prompt_tokens_details": {"cached_tokens": cached}}

    def _choice(self, body: dict, token_ids: list[int], text: str, finish: str | None) -> dict:
        choice = {"index": 0, "finish_reason": finish}
        if "messages" in body:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        if self.behaviour.sends_token_ids and body.get("return_token_ids"):
            choice["token_ids"] = token_ids
        return choice

    @staticmethod
    def _event(chunk: dict) -> bytes:
        return f"data: {json.dumps(chunk)}\n\n".encode()


@pytest.fixture
def serve():
    """``serve(behaviour)`` -> a running fake server; all are stopped after the test."""
    threads = []

    def start(behaviour: Behaviour) -> tuple[FakeOpenAIServer, str]:
        server = FakeOpenAIServer(behaviour)
        thread = ServerThread(server)
        thread.__enter__()
        threads.append(thread)
        return server, thread.url

    yield start
    for thread in threads:
        thread.__exit__(None, None, None)


def engine_for(url: str, batch_size: int = 2, **options) -> OpenAIHttpEngine:
    return OpenAIHttpEngine(url, batch_size, encode, detokenize=decode, options=HttpClientOptions(**options))


PROMPT = tuple(encode("Hello"))


def requests(n: int = 3, max_new_tokens: int = 6, ignore_eos: bool = True, prompt=PROMPT) -> list[Request]:
    return [Request(f"r{i}", prompt, SamplingParams(max_new_tokens, ignore_eos=ignore_eos)) for i in range(n)]


# --------------------------------------------------------------------------- 1. X-Request-Id, empty error bodies


def test_request_ids_are_not_sent_unless_asked(serve):
    server, url = serve(LLAMA_CPP)
    result = engine_for(url).run(requests())
    assert all(len(r.token_times) > 0 for r in result.records)
    assert not any("X-Request-Id" in headers for _, headers, _ in server.seen)


def test_an_empty_error_body_says_so_and_hints_at_the_header(serve):
    _, url = serve(replace(VLLM, rejects_request_id_header=True))
    with pytest.raises(OpenAIHttpError, match=r"HTTP 400 from .*: \(empty body\); .*drop --perf-send-request-ids"):
        engine_for(url, send_request_ids=True, prompt_format="token_ids").run(requests())


def assert_the_html_page_is_cut_to_its_words(message: str, status: int, url: str) -> None:
    assert f"HTTP {status}" in message and url in message
    assert "502 Bad Gateway" in message and "did not answer & was marked down" in message
    assert "<" not in message and "font-family" not in message and "\n" not in message
    assert len(message) < 600, f"{len(message)} characters of a {len(HTML_ERROR_PAGE)}-character page"


def test_an_html_error_page_from_a_completion_is_cut_to_its_words_keeping_the_status_and_url(serve):
    _, url = serve(replace(VLLM, html_error=("/v1/completions", 502)))
    with pytest.raises(OpenAIHttpError) as error:
        engine_for(url, prompt_format="token_ids").run(requests())
    assert_the_html_page_is_cut_to_its_words(str(error.value), 502, f"{url}/v1/completions")


def test_an_html_error_page_for_the_model_list_is_cut_to_its_words_keeping_the_status_and_url(serve):
    _, url = serve(replace(VLLM, html_error=("/v1/models", 404)))
    with pytest.raises(OpenAIHttpError) as error:
        engine_for(url).run(requests())
    assert_the_html_page_is_cut_to_its_words(str(error.value), 404, f"{url}/v1/models")


# --------------------------------------------------------------------------- 2. prompt formats


def test_text_prompts_are_the_same_ids_detokenized(serve):
    server, url = serve(VLLM)
    engine = engine_for(url, prompt_format="text")
    engine.run(requests(2))
    assert [body["prompt"] for body in server.completion_bodies] == ["Hello", "Hello"], "no probe for text"
    assert engine.prompt_format == "text" and not engine.greedy_equal


def test_auto_falls_back_to_text_once_before_timing_and_sends_each_request_once(serve):
    server, url = serve(LLAMA_CPP)
    engine = engine_for(url)
    first = engine.run(requests(3))
    second = engine.run(requests(3))
    prompts = [body["prompt"] for body in server.completion_bodies]
    assert prompts == [list(PROMPT), "Hello"] + ["Hello"] * 6, "one probe as ids, one as text, then the runs"
    assert [body["max_tokens"] for body in server.completion_bodies] == [1, 1] + [6] * 6
    assert engine.prompt_format == "text" and not engine.greedy_equal
    for result in (first, second):
        assert sorted(r.request_id for r in result.records) == ["r0", "r1", "r2"]


def test_auto_keeps_token_ids_where_the_server_takes_them(serve):
    server, url = serve(VLLM)
    engine = engine_for(url)
    result = engine.run(requests(2))
    assert [body["prompt"] for body in server.completion_bodies[1:]] == [list(PROMPT)] * 2
    assert engine.prompt_format == "token_ids" and engine.greedy_equal
    assert all(r.output_token_ids == tuple(encode("abcdef")) for r in result.records)


def test_token_ids_only_names_the_text_format_when_refused(serve):
    _, url = serve(LLAMA_CPP)
    with pytest.raises(OpenAIHttpError, match=r"HTTP 422.*str type expected.*--perf-prompt-format text"):
        engine_for(url, prompt_format="token_ids").run(requests())


# --------------------------------------------------------------------------- 3. short outputs, lengths that fit


def test_a_server_that_ignores_ignore_eos_fails_the_run_and_names_min_tokens(serve):
    _, url = serve(replace(LLAMA_CPP, eos_after=2))
    with pytest.raises(ShortOutputError) as caught:
        engine_for(url, eos_control="ignore_eos").run(requests(3, max_new_tokens=6))
    message = str(caught.value)
    assert "3 requests" in message and "'r0': asked 6, got 2 (finish_reason stop, ignore_eos" in message
    assert "--perf-eos-control min_tokens" in message
    assert [m.num_received for m in caught.value.mismatches] == [2, 2, 2]


def test_min_tokens_makes_such_a_server_produce_what_was_asked(serve):
    server, url = serve(replace(LLAMA_CPP, eos_after=2))
    result = engine_for(url).run(requests(2, max_new_tokens=6))  # eos_control "both" by default
    assert [r.num_output_tokens for r in result.records] == [6, 6]
    body = server.completion_bodies[-1]
    assert body["ignore_eos"] is True and body["min_tokens"] == 6


def test_outputs_cut_short_with_finish_reason_length_fail_the_run(serve):
    _, url = serve(replace(VLLM, cut_to=4))
    with pytest.raises(ShortOutputError, match=r"'r0': asked 6, got 4 \(finish_reason length.*still said 'length'"):
        engine_for(url).run(requests(2, max_new_tokens=6, ignore_eos=False))


def test_zero_tokens_always_fail_and_an_early_stop_without_ignore_eos_passes(serve):
    _, url = serve(replace(VLLM, eos_after=0))
    with pytest.raises(ShortOutputError, match=r"asked 6, got 0 .*no output token"):
        engine_for(url).run(requests(1, max_new_tokens=6, ignore_eos=False))
    _, url = serve(replace(VLLM, eos_after=3))
    (record,) = engine_for(url).run(requests(1, max_new_tokens=6, ignore_eos=False)).records
    assert record.num_output_tokens == 3 and record.finish_reason is FinishReason.STOP


def test_prompts_must_fit_the_servers_max_model_len_before_anything_is_sent(serve):
    server, url = serve(replace(VLLM, max_model_len=10))
    fits = Request("fits", PROMPT, SamplingParams(5))
    too_long = Request("too-long", PROMPT, SamplingParams(6))
    expected = r"max_model_len of 10 .*'too-long' needs 11 tokens \(5 prompt \+ 6 output\)"
    with pytest.raises(OpenAIHttpError, match=expected):
        engine_for(url).run([fits, too_long])
    assert server.completion_bodies == [], "nothing was sent"


# --------------------------------------------------------------------------- 4. /v1/models


def test_the_served_model_is_chosen_by_name_and_checked(serve):
    server, url = serve(replace(VLLM, model_ids=("a", "b"), max_model_len=99))
    with pytest.raises(OpenAIHttpError, match=r"serves 2 models.*--perf-server-model"):
        engine_for(url).run(requests(1))
    with pytest.raises(OpenAIHttpError, match=r"does not serve a model called 'c'"):
        engine_for(url, server_model="c").run(requests(1))
    engine = engine_for(url, server_model="b")
    engine.run(requests(1))
    assert engine.served_model.model_id == "b" and engine.served_model.max_model_len == 99
    assert {body["model"] for body in server.completion_bodies} == {"b"}


# --------------------------------------------------------------------------- 5. counting without inventing


def test_a_text_only_stream_counts_usage_and_claims_only_observed_times(serve):
    _, url = serve(replace(LLAMA_CPP, sends_usage=True, silent_tokens=2, tokens_per_chunk=2))
    (record,) = engine_for(url).run(requests(1, max_new_tokens=6)).records
    # 6 tokens in 3 chunks, the last chunk's 2 without text; usage says 6: the count is the server's,
    # the ids are the text re-tokenized and the times are the arrivals of the 2 chunks that carried text.
    assert record.num_output_tokens == 6 and record.num_reported_output_tokens == 6
    assert record.output_token_ids == tuple(encode("abcd")), "nothing repeated to make up the count"
    assert len(record.token_times) == 2 and record.token_times == tuple(sorted(record.token_times))
    metrics = request_metrics(record)
    assert metrics.tpot == pytest.approx((metrics.e2e - metrics.ttft) / 5)


def test_a_text_only_stream_without_usage_counts_the_text_re_tokenized(serve):
    _, url = serve(LLAMA_CPP)
    (record,) = engine_for(url).run(requests(1, max_new_tokens=6)).records
    assert record.num_output_tokens == 6 and record.num_reported_output_tokens is None
    assert record.output_token_ids == tuple(encode("abcdef")) and len(record.token_times) == 6


def test_exact_ids_that_disagree_with_usage_are_an_error(serve):
    _, url = serve(replace(VLLM, usage_extra=1))
    with pytest.raises(OpenAIHttpError, match=r"'r0': the server streamed 6 token ids but its usage counts 7"):
        engine_for(url).run(requests(1, max_new_tokens=6))


# --------------------------------------------------------------------------- 6. API key, chat


def test_the_api_key_goes_on_every_request_and_never_into_a_repr(serve):
    server, url = serve(replace(VLLM, api_key="sk-secret"))
    with pytest.raises(OpenAIHttpError, match=r"HTTP 401.*--perf-api-key"):
        engine_for(url).run(requests(1))
    server.seen.clear()
    engine_for(url, api_key="sk-secret").run(requests(1))
    assert server.seen and all(headers.get("Authorization") == "Bearer sk-secret" for _, headers, _ in server.seen)
    assert "/v1/models" in [path for path, _, _ in server.seen]
    assert "sk-secret" not in repr(HttpClientOptions(api_key="sk-secret"))


def test_chat_sends_the_prompt_as_a_message_and_is_never_greedy_equal(serve):
    server, url = serve(VLLM)
    engine = engine_for(url, api="chat")
    (record,) = engine.run(requests(1, max_new_tokens=5)).records
    (body,) = server.completion_bodies
    assert server.seen[-1][0] == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "Hello"}]
    assert body["max_completion_tokens"] == body["max_tokens"] == 5
    assert record.output_token_ids == tuple(encode("abcde"))
    assert not engine.greedy_equal


# --------------------------------------------------------------------------- 7. greedy_equal, plumbing


def test_greedy_equal_needs_exact_ids_on_token_id_prompts(serve):
    _, exact = serve(VLLM)
    _, text_only = serve(replace(VLLM, sends_token_ids=False))
    assert engine_for(exact).greedy_equal
    assert not engine_for(exact, prompt_format="text").greedy_equal
    assert not engine_for(exact, eos_control="min_tokens").greedy_equal, "min_tokens masks EOS"
    assert not engine_for(text_only).greedy_equal


def test_options_reach_the_engine_through_the_backend(serve):
    server, url = serve(replace(VLLM, model_ids=("a", "b")))
    options = HttpClientOptions(server_model="b", prompt_format="text", eos_control="min_tokens")
    backend = Backend(None, encode, None, 256, "cpu", tokenizer=ByteTokenizer(), endpoint=url, http_options=options)
    engine = build_engine("openai-http", backend, EngineConfig(2, 64))
    assert engine.options == options
    engine.run(requests(1))
    (body,) = server.completion_bodies
    assert body["model"] == "b" and body["prompt"] == "Hello"
    assert body["min_tokens"] == 6 and "ignore_eos" not in body


def test_pytest_options_build_the_client_options(pytester, monkeypatch):
    monkeypatch.setenv("PERFSUITE_API_KEY", "sk-from-env")
    from perfsuite.plugin.options import read_options

    config = pytester.parseconfig(
        "--perf-server-model", "m", "--perf-prompt-format", "text", "--perf-eos-control", "ignore_eos",
        "--perf-api", "chat", "--perf-send-request-ids",
    )  # fmt: skip
    options = read_options(config).http_client
    assert options == HttpClientOptions("m", "sk-from-env", "text", "ignore_eos", "chat", True)
    assert read_options(pytester.parseconfig("--perf-api-key", "sk-flag")).http_client.api_key == "sk-flag"
    assert "sk-from-env" not in repr(read_options(config))


SERVER_TESTS = """
import pytest

@pytest.mark.perf
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_server(perf, perf_engine_factory, batch_size):
    perf_engine_factory("openai-http", batch_size=batch_size)
"""


def test_a_server_that_is_not_there_fails_one_test_of_the_session_and_skips_the_rest_naming_the_url(pytester):
    """Issue 37: each openai-http test failed on its own, with the client's traceback, after its own connect."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    pytester.makeconftest(FAKE_BACKEND_CONFTEST)
    pytester.makepyfile(test_server=SERVER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-rs", "--perf",
                                          "--perf-history", "none", "--perf-engines", "openai-http",
                                          "--perf-endpoint", url)  # fmt: skip
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "_* test_server[[]1[]] _*",
        f"cannot reach the server at {url}/v1/models: *Connection refused; is it running? (--perf-endpoint)",
        "=*",  # the next section: the failure is that one line, no traceback
    ], consecutive=True)  # fmt: skip
    result.stdout.fnmatch_lines([f"SKIPPED [[]2[]] * --perf-endpoint {url} did not answer; the session's first "
                                 "openai-http test says why"])  # fmt: skip


# --------------------------------------------------------------------------- 6. the server's prefix cache


def test_the_servers_cached_tokens_are_recorded_per_request_and_sum_to_its_hit_rate(serve):
    _, url = serve(replace(VLLM, prefix_cache=True))
    engine = engine_for(url)
    shared = tuple(encode("Shared prefix"))  # not the probe request's prompt: the first run meets it uncached
    other = Request("r3", tuple(encode("Other prompt")), SamplingParams(6, ignore_eos=True))
    first, *again = requests(3, prompt=shared)
    (missed,) = engine.run([first]).records
    run = engine.run([*again, other])
    assert missed.num_cached_tokens == 0
    cached = {r.request_id: r.num_cached_tokens for r in run.records}
    assert cached == {"r1": len(shared) - 1, "r2": len(shared) - 1, "r3": 0}
    prompts = cached_prompts(run_metrics(run).requests)
    assert prompts.num_hits == 2
    assert prompts.hit_rate == 2 * (len(shared) - 1) / (2 * len(shared) + other.num_prompt_tokens)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_server_that_does_not_say_leaves_cached_tokens_unknown(serve, api):
    _, url = serve(VLLM)
    (record,) = engine_for(url, api=api).run(requests(1)).records
    assert record.num_cached_tokens is None


@pytest.mark.parametrize("value", [-1, 2.5, "4", True])
def test_a_malformed_cached_tokens_is_an_error_naming_the_request_and_the_field(serve, value):
    _, url = serve(replace(VLLM, cached_tokens=value))
    expected = r"request '(perfsuite-probe|r0)': the server's usage.prompt_tokens_details.cached_tokens is"
    with pytest.raises(OpenAIHttpError, match=expected):
        engine_for(url).run(requests(1))


def test_cached_tokens_count_at_most_the_prompt_a_chat_template_adds_to():
    request = requests(1)[0]
    received = Received(request, 1.0, 2.0, (Piece(1.5, "ab", (1, 2)),), FinishReason.LENGTH, 2,
                        num_cached_tokens=len(PROMPT) + 7)  # fmt: skip
    assert to_record(received, encode).num_cached_tokens == len(PROMPT)


# --------------------------------------------------------------------------- the server's /metrics


def test_a_server_without_metrics_runs_as_before_and_records_nothing_server_side(serve):
    from perfsuite.report.server_metrics import NOT_EXPOSED, server_metrics_facts
    from test_server_metrics import as_session_result

    _, url = serve(VLLM)  # no /metrics: 404
    client = engine_for(url)
    first, second = client.run(requests()), client.run(requests())
    assert first.server_metrics is None and second.server_metrics is None
    assert client.metrics_exposed is False
    assert [len(r.records) for r in (first, second)] == [3, 3]
    assert server_metrics_facts(as_session_result(first)) == [("server metrics", NOT_EXPOSED)]



# --------------------------------------------------------------------------- prompt tokens: the server's count


def test_chat_records_the_servers_prompt_count_and_the_clients_where_they_differ(serve):
    _, url = serve(replace(VLLM, chat_template_tokens=30))
    result = engine_for(url, api="chat").run(requests())
    assert {(r.num_prompt_tokens, r.num_client_prompt_tokens) for r in result.records} == {
        (len(PROMPT) + 30, len(PROMPT))
    }, "the server's usage.prompt_tokens counts the chat template; the client's count is kept beside it"
    summary = vllm_summary([run_metrics(result)])
    assert (summary.total_input_tokens, summary.total_client_input_tokens) == (3 * (len(PROMPT) + 30), 3 * len(PROMPT))
    assert summary.vllm_keys()["total_input_tokens"] == 3 * (len(PROMPT) + 30)


def test_completions_whose_count_the_server_agrees_with_keep_one_count(serve):
    _, url = serve(VLLM)
    result = engine_for(url).run(requests())
    assert {(r.num_prompt_tokens, r.num_client_prompt_tokens) for r in result.records} == {(len(PROMPT), None)}
    assert vllm_summary([run_metrics(result)]).total_client_input_tokens is None


def test_a_server_without_usage_leaves_the_clients_prompt_count(serve):
    _, url = serve(replace(LLAMA_CPP, accepts_token_ids=True, honours_ignore_eos=True, rejects_request_id_header=False))
    result = engine_for(url).run(requests())
    assert {(r.num_prompt_tokens, r.num_client_prompt_tokens) for r in result.records} == {(len(PROMPT), None)}


def test_a_malformed_prompt_count_is_an_error_naming_the_request(serve):
    _, url = serve(replace(VLLM, prompt_tokens="many"))
    with pytest.raises(OpenAIHttpError, match=r"the server's usage.prompt_tokens is 'many', not a count of tokens"):
        engine_for(url).run(requests())
