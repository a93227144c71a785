"""``perfsuite serve``'s prefix cache figures and vLLM's extension fields, over loopback on a fake runner.

``usage.prompt_tokens_details.cached_tokens`` from the engine's record of each request, ``GET /metrics`` under
vLLM's metric names (a registry per server), and ``add_special_tokens`` honoured on both endpoints. The engine
is the in-flight engine on a fake runner, wrapped so that its records and counters say what a prefix-caching
engine would: a prompt seen before was cached but for its last token.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perfsuite.engine import EngineCounters, FinishReason, Request, RequestRecord, inflight_engine, paged_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.models import build_byte_tokenizer
from perfsuite.models.tokenizer import BOS_TOKEN_ID
from perfsuite.serve import CompletionServer, ServerThread
from perfsuite.serve.completion_request import PromptLimits, parse_chat_request, parse_completion_request
from perfsuite.serve.errors import ApiError
from perfsuite.serve.histograms import ServedHistograms
from perfsuite.serve.metrics import metrics_registry, metrics_text
from perfsuite.serve.worker import EngineLoad, ServedTotals, kv_cache_usage

VOCAB = 320
MAX_SEQ_LEN = 64
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrefixReportingEngine:
    """The engine, but each record says how much of its prompt was cached (``says_cached``) and the counters
    count every prefilled token as looked up (they start over whenever the engine goes idle, as the engine's)."""

    def __init__(self, says_cached: bool = True) -> None:
        runner = FakeRunner(vocab_size=VOCAB)
        self._engine = inflight_engine(runner, decode_batch_size=2, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)
        self._says_cached = says_cached
        self._prompts: dict[str, tuple[int, ...]] = {}
        self._seen: set[tuple[int, ...]] = set()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    @property
    def counters(self) -> EngineCounters:
        counters = self._engine.counters
        return dataclasses.replace(counters, num_prefix_cache_queried_tokens=counters.num_prefill_tokens)

    def add_request(self, request: Request, arrival_time: float | None = None) -> None:
        self._engine.add_request(request, arrival_time)
        self._prompts[request.request_id] = request.prompt_token_ids

    def forget_finished(self) -> list[RequestRecord]:
        return [dataclasses.replace(r, num_cached_tokens=self._cached(r)) for r in self._engine.forget_finished()]

    def _cached(self, record: RequestRecord) -> int | None:
        prompt = self._prompts.pop(record.request_id, None)
        if not self._says_cached or prompt is None:
            return None
        cached = len(prompt) - 1 if prompt in self._seen else 0
        self._seen.add(prompt)
        return cached


class BosTokenizer:
    """The byte tokenizer, adding BOS when asked for special tokens (as Llama's does)."""

    def __init__(self) -> None:
        self._tokenizer = build_byte_tokenizer(VOCAB)
        self._tokenizer.chat_template = CHAT_TEMPLATE

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": [BOS_TOKEN_ID, *ids] if add_special_tokens else ids}


def start(engine, name: str = "fake") -> ServerThread:
    server = CompletionServer(engine, BosTokenizer(), model_name=name, vocab_size=VOCAB)
    return ServerThread(server).__enter__()


@pytest.fixture(scope="module")
def served():
    thread = start(PrefixReportingEngine())
    yield thread
    thread.__exit__(None, None, None)


def post(url: str, body: dict) -> dict | list:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with _no_proxy.open(request, timeout=10) as response:
        raw = response.read()
    if not raw.startswith(b"data: "):
        return json.loads(raw)
    return [json.loads(p.removeprefix("data: ")) for p in raw.decode().split("\n\n") if p and p != "data: [DONE]"]


def usage_of(answer: dict | list) -> dict:
    return answer["usage"] if isinstance(answer, dict) else answer[-1]["usage"]


def scrape(thread: ServerThread) -> dict[tuple[str, tuple], float]:
    with _no_proxy.open(thread.url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_usage_carries_the_engines_cached_tokens_whole_and_in_the_final_stream_chunk(served, path, stream):
    case = 60 + 2 * stream + (path == "/v1/completions")  # a prompt of its own: its first request meets no cache
    prompt = {"prompt": [40, 41, case]} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": chr(case)}]}
    body = {**prompt, "max_tokens": 3, "ignore_eos": True, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})}  # fmt: skip
    first, again = usage_of(post(served.url + path, body)), usage_of(post(served.url + path, body))
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["prompt_tokens_details"] == {"cached_tokens": again["prompt_tokens"] - 1}


def test_an_engine_that_does_not_say_leaves_prompt_tokens_details_out():
    thread = start(PrefixReportingEngine(says_cached=False))
    try:
        answer = post(thread.url + "/v1/completions", {"prompt": [40, 41], "max_tokens": 2, "stream": True,
                                                       "stream_options": {"include_usage": True}})  # fmt: skip
        assert "prompt_tokens_details" not in usage_of(answer) and usage_of(answer)["completion_tokens"] == 2
    finally:
        thread.__exit__(None, None, None)


def test_metrics_are_vllms_names_per_server_and_count_across_the_engine_going_idle():
    first, second = start(PrefixReportingEngine(), "first"), start(PrefixReportingEngine(), "second")
    try:
        for prompt in ([40, 41, 42], [50, 51, 52, 53]):  # one after the other: the engine idles in between
            post(first.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "ignore_eos": True})
        metrics = scrape(first)
        label = (("model_name", "first"),)
        assert metrics[("vllm:prefix_cache_queries_total", label)] == 7, "both requests' prefills, summed"
        assert metrics[("vllm:prefix_cache_hits_total", label)] == 0
        assert metrics[("vllm:prompt_tokens_total", label)] == 7
        assert metrics[("vllm:generation_tokens_total", label)] == 8
        assert metrics[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 2
        assert metrics[("vllm:num_requests_running", label)] == 0
        assert metrics[("vllm:num_requests_waiting", label)] == 0
        assert metrics[("vllm:kv_cache_usage_perc", label)] == 0
        assert metrics[("vllm:num_preemptions_total", label)] == 0
        assert scrape(second)[("vllm:prompt_tokens_total", (("model_name", "second"),))] == 0, "a registry each"
    finally:
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)


def test_a_paged_prefix_engine_reports_real_hits_and_counts_its_idle_cached_blocks_as_free():
    """The real prefix-caching engine (``perfsuite serve --engine paged-prefix``): the second of two identical
    prompts finds its full blocks cached, in its usage and in /metrics; once idle, the blocks that stay cached
    for later prompts count as free in vllm:kv_cache_usage_perc, as vLLM counts them."""
    engine = paged_engine(FakeRunner(vocab_size=VOCAB), decode_batch_size=2, max_seq_len=MAX_SEQ_LEN,
                          eos_token_id=None, kv_block_size=4, enable_prefix_caching=True)  # fmt: skip
    thread = start(engine, "cached")
    try:
        body = {"prompt": list(range(40, 50)), "max_tokens": 2, "ignore_eos": True}
        first, again = post(thread.url + "/v1/completions", body), post(thread.url + "/v1/completions", body)
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}, "two full blocks of 4"
        metrics = scrape(thread)
        label = (("model_name", "cached"),)
        assert metrics[("vllm:prefix_cache_hits_total", label)] == 8
        assert metrics[("vllm:prefix_cache_queries_total", label)] == 20
        assert engine.scheduler.kv_cache.num_cached_blocks > 0
        assert metrics[("vllm:kv_cache_usage_perc", label)] == 0
        with _no_proxy.open(thread.url + "/health", timeout=10) as response:
            health = json.loads(response.read())
        assert (health["free_slots"], health["num_slots"]) == (2, 2), "a pool's slots: the running requests' limit"
    finally:
        thread.__exit__(None, None, None)


class StubWorker:
    load = EngineLoad(num_running=3, num_waiting=2, num_free_slots=1, num_slots=4, kv_cache_usage=0.75)
    totals = ServedTotals(EngineCounters(num_prefix_cache_queried_tokens=400, num_prefix_cache_hit_tokens=160,
                                         num_preemptions=5), num_stopped=1, num_aborted=2)  # fmt: skip
    finished = RequestRecord("r", num_prompt_tokens=3, output_token_ids=(7, 8), arrival_time=10.0,
                             first_scheduled_time=10.0, token_times=(10.004, 10.024), finished_time=10.024,
                             finish_reason=FinishReason.LENGTH)  # fmt: skip
    histograms = ServedHistograms.empty(max_model_len=64).after_finishing([finished])


def test_the_collector_writes_the_load_and_totals_it_is_given():
    text = metrics_text(metrics_registry(StubWorker(), "m")).decode()
    for line in ('vllm:num_requests_running{model_name="m"} 3.0', 'vllm:num_requests_waiting{model_name="m"} 2.0',
                 'vllm:kv_cache_usage_perc{model_name="m"} 0.75',
                 'vllm:prefix_cache_queries_total{model_name="m"} 400.0',
                 'vllm:prefix_cache_hits_total{model_name="m"} 160.0', 'vllm:num_preemptions_total{model_name="m"} 5.0',
                 'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0',
                 'vllm:request_success_total{finished_reason="abort",model_name="m"} 2.0',
                 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0',
                 'vllm:time_to_first_token_seconds_bucket{le="0.005",model_name="m"} 1.0',
                 'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 1.0',
                 'vllm:time_to_first_token_seconds_count{model_name="m"} 1.0',
                 'vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="m"} 0.0',
                 'vllm:inter_token_latency_seconds_bucket{le="0.025",model_name="m"} 1.0',
                 'vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="m"} 1.0',
                 'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 1.0',
                 'vllm:request_prompt_tokens_bucket{le="2.0",model_name="m"} 0.0',
                 'vllm:request_prompt_tokens_bucket{le="5.0",model_name="m"} 1.0',
                 'vllm:request_generation_tokens_bucket{le="2.0",model_name="m"} 1.0',
                 'vllm:request_generation_tokens_bucket{le="50.0",model_name="m"} 1.0',
                 'vllm:request_generation_tokens_sum{model_name="m"} 2.0'):  # fmt: skip
        assert line in text.splitlines(), line
    assert 'vllm:request_generation_tokens_bucket{le="100.0",model_name="m"} 1.0' not in text, "buckets up to 64"


def test_totals_add_each_steps_growth_of_the_engines_counters():
    totals = ServedTotals(EngineCounters(num_prefix_cache_queried_tokens=10, num_preemptions=1, peak_num_running=5))
    before = EngineCounters(num_prefix_cache_queried_tokens=4, num_prefix_cache_hit_tokens=2, num_preemptions=1,
                            peak_num_running=2)  # fmt: skip
    after = EngineCounters(num_prefix_cache_queried_tokens=9, num_prefix_cache_hit_tokens=6, num_preemptions=3,
                           peak_num_running=3)  # fmt: skip
    grown = totals.after_step(before, after, num_tokens=2)
    assert (grown.engine.num_prefix_cache_queried_tokens, grown.engine.num_prefix_cache_hit_tokens,
            grown.engine.num_preemptions, grown.num_generation_tokens) == (15, 4, 3, 2)  # fmt: skip
    assert grown.engine.peak_num_running == 5, "a peak is the largest seen, not a sum"
    records = [RequestRecord("r", 1, (), 0.0, None, (), None, reason) for reason in
               (FinishReason.STOP, FinishReason.LENGTH, FinishReason.LENGTH, FinishReason.ABORT)]  # fmt: skip
    finished = grown.after_finishing(records)
    assert (finished.num_stopped, finished.num_length_capped, finished.num_aborted) == (1, 2, 1)


class _Pool:
    num_blocks, num_free_blocks = 8, 6


class _Slots:
    num_slots, num_free_slots = 4, 1


def test_kv_cache_usage_is_the_share_of_blocks_or_slots_in_use():
    assert kv_cache_usage(_Pool()) == 0.25 and kv_cache_usage(_Slots()) == 0.75


# --------------------------------------------------------------------------- add_special_tokens

LIMITS = PromptLimits(MAX_SEQ_LEN, VOCAB, 4)


def test_add_special_tokens_reaches_the_tokenizer_with_vllms_defaults():
    asked = []

    def tokenize(text, add_special_tokens):
        asked.append(add_special_tokens)
        return [40]

    def render(messages, add_special_tokens):
        asked.append(add_special_tokens)
        return [40]

    parse_completion_request({"prompt": "hi"}, LIMITS, tokenize)
    parse_completion_request({"prompt": "hi", "add_special_tokens": False}, LIMITS, tokenize)
    parse_chat_request({"messages": [{"role": "user", "content": "hi"}]}, LIMITS, render)
    parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True}, LIMITS, render)
    assert asked == [True, False, False, True]
    with pytest.raises(ApiError, match="add_special_tokens must be true or false") as error:
        parse_completion_request({"prompt": "hi", "add_special_tokens": "yes"}, LIMITS, tokenize)
    assert error.value.body()["error"]["param"] == "add_special_tokens"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("add_special_tokens", "a boolean (true or false)"), ("ignore_eos", "a boolean (true or false)"),
     ("skip_special_tokens", "a boolean (true or false)"), ("min_tokens", "an integer >= 0")],
)  # fmt: skip
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_null_where_vllm_takes_no_null_is_a_400_naming_the_field(name, kind, endpoint):
    """A null was read as the field's default: add_special_tokens: null tokenized with BOS."""
    if endpoint == "completions":
        parse = lambda body: parse_completion_request({"prompt": "hi", **body}, LIMITS, lambda text, add: [1, 2])
    else:
        messages = [{"role": "user", "content": "hi"}]
        parse = lambda body: parse_chat_request({"messages": messages, **body}, LIMITS, lambda m, add: [1, 2])
    with pytest.raises(ApiError) as error:
        parse({name: None})
    assert error.value.status == 400
    assert error.value.body()["error"] == {**error.value.body()["error"], "param": name, "message": (
        f"{name} must be {kind}, got null; send a value or leave {name} out")}  # fmt: skip
    parse({})  # left out: its default


def test_a_null_where_openai_allows_one_reads_as_left_out():
    body = {"prompt": "hi", "stream": None, "stream_options": None, "return_token_ids": None, "seed": None,
            "user": None, "max_tokens": None, "stop_token_ids": None, "model": None, "logprobs": None}  # fmt: skip
    request = parse_completion_request(body, LIMITS, lambda text, add: [1, 2])
    assert (request.stream, request.ignore_eos, request.stop_token_ids) == (False, False, ())


def test_add_special_tokens_adds_bos_over_http_where_asked(served):
    def prompt_tokens(path: str, body: dict) -> int:
        return post(served.url + path, {**body, "max_tokens": 1})["usage"]["prompt_tokens"]

    text = {"prompt": "Hi"}
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    assert prompt_tokens("/v1/completions", text) == 3, "BOS by default, as vLLM"
    assert prompt_tokens("/v1/completions", {**text, "add_special_tokens": False}) == 2
    rendered = len("<user>Hi<assistant>")
    assert prompt_tokens("/v1/chat/completions", chat) == rendered, "the template's tokens alone by default"
    assert prompt_tokens("/v1/chat/completions", {**chat, "add_special_tokens": True}) == rendered + 1


def test_openai_http_reads_what_perfsuite_serve_returns(served):
    from perfsuite.adapters.http_options import HttpClientOptions
    from perfsuite.adapters.openai_http import OpenAIHttpEngine
    from perfsuite.engine import SamplingParams

    tokenizer = BosTokenizer()
    engine = OpenAIHttpEngine(served.url, 2, lambda text: tokenizer(text)["input_ids"], detokenize=tokenizer.decode,
                              options=HttpClientOptions(prompt_format="token_ids"))  # fmt: skip
    prompt = (70, 71, 72, 73)
    requests = [Request(f"r{i}", prompt, SamplingParams(3, ignore_eos=True)) for i in range(2)]
    first = engine.run(requests[:1]).records
    again = engine.run(requests[1:]).records
    assert [r.num_cached_tokens for r in (*first, *again)] == [0, len(prompt) - 1]
