"""``perfsuite serve``'s API as benchmark clients use it, over loopback with tiny-random.

Chat completions with the model's chat template, the allow-list of request
fields (and the default payloads of guidellm, aiperf, inference-perf and
``vllm bench serve``), ``min_tokens`` and ``max_completion_tokens``, the served
model name, several prompts in one request, and malformed bodies that must be
400s, not 500s.
"""

from __future__ import annotations

import copy
import http.client
import json
import types
import urllib.error
import urllib.parse
import urllib.request

import pytest

from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.cache_dir import CACHE_DIR_ENV
from perfsuite.cli import build_parser
from perfsuite.engine import FinishReason, SamplingParams
from perfsuite.models import ModelSpec, load_model
from perfsuite.serve import CompletionServer, ServeLimits, ServerThread
from perfsuite.serve.launch import ServeOptions, build_server, short_model_name

MAX_SEQ_LEN = 128
SERVED_NAME = "tiny-served"
ROOT = "/models/tiny-random"
MAX_OPEN_REQUESTS = 6
PROMPT = [40, 41, 42, 43]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
HTTP_TIMEOUT_S = 10.0

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(url: str, body: dict | bytes | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with _no_proxy.open(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def ok(url: str, body: dict | bytes) -> dict | list:
    status, raw = call(url, body)
    assert status == 200, raw
    return json.loads(raw) if not raw.startswith(b"data: ") else sse_events(raw)


def error_of(url: str, body: dict | bytes, status: int = 400) -> dict:
    got, raw = call(url, body)
    assert got == status, raw
    return json.loads(raw)["error"]


def sse_events(raw: bytes) -> list[dict | str]:
    payloads = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


@pytest.fixture(scope="module")
def loaded():
    return load_model("tiny-random")


def start_server(loaded, tokenizer, **kwargs) -> ServerThread:
    engine = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(4, MAX_SEQ_LEN))
    limits = ServeLimits(max_open_requests=MAX_OPEN_REQUESTS)
    vocab_size = loaded.model.config.vocab_size
    return ServerThread(CompletionServer(engine, tokenizer, vocab_size=vocab_size, limits=limits, **kwargs))


@pytest.fixture(scope="module")
def chat_tokenizer(loaded):
    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def served(loaded, chat_tokenizer):
    with start_server(loaded, chat_tokenizer, model_name=SERVED_NAME, model_root=ROOT) as thread:
        yield thread


@pytest.fixture(scope="module")
def url(served):
    return served.url + "/v1/completions"


@pytest.fixture(scope="module")
def chat_url(served):
    return served.url + "/v1/chat/completions"


def rendered_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def completion_ids(url: str, prompt, max_tokens: int, **fields) -> list[int]:
    body = ok(url, {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **fields})
    return body["choices"][0]["token_ids"]


# --------------------------------------------------------------------------- chat completions


def test_a_chat_completion_is_the_completion_of_the_rendered_template(url, chat_url, chat_tokenizer):
    body = ok(chat_url, {"messages": MESSAGES, "max_tokens": 8, "ignore_eos": True})
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == SERVED_NAME
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    prompt = rendered_ids(chat_tokenizer, MESSAGES)
    assert choice["token_ids"] == completion_ids(url, prompt, 8), "the same greedy tokens as the rendered prompt's"
    assert choice["message"]["content"] == chat_tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    counts = {name: value for name, value in body["usage"].items() if name != "prompt_tokens_details"}
    assert counts == {"prompt_tokens": len(prompt), "completion_tokens": 8, "total_tokens": len(prompt) + 8}


def test_a_streamed_chat_completion_sends_deltas_the_first_with_the_role(chat_url):
    whole = ok(chat_url, {"messages": MESSAGES, "max_tokens": 6, "ignore_eos": True})["choices"][0]
    events = ok(chat_url, {"messages": MESSAGES, "max_tokens": 6, "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}})  # fmt: skip
    *chunks, usage_chunk, done = events
    assert done == "[DONE]" and len(chunks) == 6
    assert {c["object"] for c in chunks + [usage_chunk]} == {"chat.completion.chunk"}
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert "".join(d["content"] for d in deltas) == whole["message"]["content"]
    assert [c["choices"][0]["token_ids"][0] for c in chunks] == whole["token_ids"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6


def test_text_parts_are_joined_into_the_message(chat_url):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    joined = [{"role": "user", "content": "Hello\nthere"}]
    as_parts = ok(chat_url, {"messages": parts, "max_tokens": 4, "ignore_eos": True})
    as_text = ok(chat_url, {"messages": joined, "max_tokens": 4, "ignore_eos": True})
    assert as_parts["usage"] == as_text["usage"]
    assert as_parts["choices"][0]["token_ids"] == as_text["choices"][0]["token_ids"]


def test_a_model_without_a_chat_template_answers_400_saying_so(loaded):
    assert not getattr(loaded.tokenizer, "chat_template", None), "tiny-random's own tokenizer has no template"
    with start_server(loaded, loaded.tokenizer, model_name="tiny-random") as thread:
        error = error_of(thread.url + "/v1/chat/completions", {"messages": MESSAGES})
    assert "no chat template" in error["message"] and "/v1/completions" in error["message"]
    assert error["param"] == "messages"


@pytest.mark.parametrize(
    "messages",
    [
        None,
        [],
        "Hello",
        ["Hello"],
        [{"role": "robot", "content": "hi"}],
        [{"role": "user"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": [{"type": "text", "text": 7}]}],
        [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}],
    ],
)
def test_malformed_messages_get_a_400_naming_messages(chat_url, messages):
    body = {"max_tokens": 2} if messages is None else {"messages": messages, "max_tokens": 2}
    error = error_of(chat_url, body)
    assert error["param"] == "messages" and "messages" in error["message"]


def test_chat_is_greedy_only_and_takes_no_prompt(chat_url):
    assert error_of(chat_url, {"messages": MESSAGES, "temperature": 0.7})["param"] == "temperature"
    assert error_of(chat_url, {"messages": MESSAGES, "logprobs": True})["param"] == "logprobs"
    error = error_of(chat_url, {"messages": MESSAGES, "prompt": "hi"})
    assert error["param"] == "prompt" and "/v1/completions" in error["message"]


# --------------------------------------------------------------------------- request fields


def test_an_unknown_field_is_rejected_by_name(url):
    error = error_of(url, {"prompt": "hi", "max_tokens": 2, "frobnicate": 1})
    assert error["param"] == "frobnicate" and "'frobnicate'" in error["message"]
    assert error_of(url, {"prompt": "hi", "tools": []})["param"] == "tools"
    assert error_of(url, {"prompt": "hi", "messages": MESSAGES})["param"] == "messages"
    error = error_of(url, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True, "x": 1}})
    assert error["param"] == "stream_options.x"


@pytest.mark.parametrize(
    ("client", "path", "body"),
    [
        ("guidellm completions", "/v1/completions", {
            "model": SERVED_NAME, "prompt": "Hello there", "max_tokens": 5, "stop": None, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        ("guidellm chat", "/v1/chat/completions", {
            "model": SERVED_NAME, "max_completion_tokens": 5, "stop": None, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]}),
        ("aiperf chat", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hello there"}], "model": SERVED_NAME, "stream": True,
            "max_completion_tokens": 5, "ignore_eos": True, "stream_options": {"include_usage": True}}),
        ("aiperf completions", "/v1/completions", {
            "prompt": ["Hello there"], "model": SERVED_NAME, "stream": False, "max_tokens": 5, "ignore_eos": True}),
        ("vllm bench completions", "/v1/completions", {
            "model": SERVED_NAME, "prompt": "Hello there", "repetition_penalty": 1.0, "max_tokens": 5,
            "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "temperature": 0.0}),
        ("vllm bench chat", "/v1/chat/completions", {
            "model": SERVED_NAME, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
            "max_completion_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}),
        ("inference-perf completions", "/v1/completions", {
            "model": SERVED_NAME, "prompt": "Hello there", "max_tokens": 5, "ignore_eos": True, "stream": False}),
        ("inference-perf chat", "/v1/chat/completions", {
            "model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 5,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "add_special_tokens": False}),
        ("perfsuite openai-http", "/v1/completions", {
            "model": SERVED_NAME, "prompt": PROMPT, "return_token_ids": True, "max_tokens": 5, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": 5}),
        ("openai python defaults", "/v1/chat/completions", {
            "model": SERVED_NAME, "messages": MESSAGES, "max_completion_tokens": 5, "ignore_eos": True,
            "n": 1, "seed": 1234, "user": "someone", "presence_penalty": 0, "frequency_penalty": 0,
            "logit_bias": {}, "top_logprobs": 0}),
    ],
    ids=lambda value: value if isinstance(value, str) and not value.startswith("/") else None,
)  # fmt: skip
def test_the_default_payloads_of_benchmark_clients_are_served(served, client, path, body):
    answer = ok(served.url + path, body)
    if isinstance(answer, dict):
        assert answer["usage"]["completion_tokens"] == 5, client
        return
    assert answer[-1] == "[DONE]"
    chunks = [e for e in answer[:-1] if e["choices"]]
    assert len(chunks) == 5 and answer[-2]["usage"]["completion_tokens"] == 5, client
    if "continuous_usage_stats" in body["stream_options"]:
        assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5]


def test_max_completion_tokens_is_max_tokens(url):
    body = ok(url, {"prompt": PROMPT, "max_completion_tokens": 7, "ignore_eos": True})
    assert body["usage"]["completion_tokens"] == 7, "not the default of 16"
    assert ok(url, {"prompt": PROMPT, "max_tokens": 3, "max_completion_tokens": 3})["usage"]["completion_tokens"] <= 3
    error = error_of(url, {"prompt": PROMPT, "max_tokens": 3, "max_completion_tokens": 4})
    assert error["param"] == "max_completion_tokens" and "differ" in error["message"]
    error = error_of(url, {"prompt": PROMPT, "max_completion_tokens": MAX_SEQ_LEN})
    assert error["param"] == "max_completion_tokens" and "max_seq_len" in error["message"]


def test_min_tokens_keeps_a_stop_token_from_ending_the_request_early(url):
    free_run = completion_ids(url, PROMPT, 12)
    stop = free_run[2]
    body = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "stop_token_ids": [stop]}
    stopped = ok(url, body)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["token_ids"] == free_run[: free_run.index(stop) + 1]

    held = ok(url, {**body, "min_tokens": 8})["choices"][0]
    late_stops = [i for i, token in enumerate(free_run) if token == stop and i >= 7]
    expected = free_run[: late_stops[0] + 1] if late_stops else free_run
    assert held["token_ids"] == expected, "no stop before the 8th token, and the greedy choices are unchanged"
    assert held["finish_reason"] == ("stop" if late_stops else "length")


def test_min_tokens_must_fit_max_tokens(url):
    error = error_of(url, {"prompt": PROMPT, "max_tokens": 4, "min_tokens": 5})
    assert error["param"] == "min_tokens" and "max_tokens (4)" in error["message"]
    error = error_of(url, {"prompt": PROMPT, "min_tokens": 20})
    assert error["param"] == "min_tokens" and "default max_tokens (16)" in error["message"]
    assert error_of(url, {"prompt": PROMPT, "min_tokens": -1})["param"] == "min_tokens"


def test_min_tokens_holds_off_eos_without_masking_it():
    eos = 2
    params = SamplingParams(10, min_tokens=4)
    assert [params.finish_reason(eos, n, eos) for n in (1, 3)] == [None, None]
    assert params.finish_reason(eos, 4, eos) is FinishReason.STOP
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(3, min_tokens=4)


# --------------------------------------------------------------------------- the served model


def test_models_names_the_served_model_its_length_and_folder(served):
    status, raw = call(served.url + "/v1/models")
    assert status == 200
    (model,) = json.loads(raw)["data"]
    assert (model["id"], model["max_model_len"], model["root"]) == (SERVED_NAME, MAX_SEQ_LEN, ROOT)


def test_a_request_for_another_model_gets_404_naming_the_served_one(url, chat_url):
    for endpoint, body in ((url, {"prompt": "hi"}), (chat_url, {"messages": MESSAGES})):
        error = error_of(endpoint, {**body, "model": "gpt-4", "max_tokens": 2}, status=404)
        assert error["param"] == "model" and "'gpt-4'" in error["message"] and SERVED_NAME in error["message"]
        assert ok(endpoint, {**body, "model": SERVED_NAME, "max_tokens": 2})["model"] == SERVED_NAME
        assert ok(endpoint, {**body, "max_tokens": 2})["model"] == SERVED_NAME, "model may be left out"


def test_serve_takes_a_served_model_name(tmp_path):
    args = build_parser().parse_args(["serve", "--model", "tiny-random", "--served-model-name", "my-model"])
    assert args.served_model_name == "my-model"
    with pytest.raises(ValueError, match="--served-model-name"):
        ServeOptions(model="tiny-random", served_model_name=" ")
    local = types.SimpleNamespace(spec=ModelSpec("/m/SmolLM2", "local", path=str(tmp_path)))
    assert short_model_name(local) == tmp_path.name
    assert short_model_name(types.SimpleNamespace(spec=ModelSpec("smollm2-135m", "gguf-package"))) == "smollm2-135m"


def test_build_server_serves_the_served_model_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    options = ServeOptions(model="tiny-random", port=0, batch_size=2, max_seq_len=64, device="cpu",
                           served_model_name="my-model")  # fmt: skip
    with ServerThread(build_server(options)) as thread:
        status, raw = call(thread.url + "/v1/models")
        assert status == 200
        (model,) = json.loads(raw)["data"]
        assert (model["id"], model["max_model_len"]) == ("my-model", 64)
        assert model["root"].startswith(str(tmp_path / "tokenizers" / "my-model-")), "the tokenizer's portable copy"
        assert f"tokenizer files (transformers 4.x and 5.x load them; /v1/models' root): {model['root']}" in (
            capsys.readouterr().err
        ), "the banner names the folder, for a client that cannot reach a hub"
        error = error_of(thread.url + "/v1/completions", {"prompt": "hi", "model": "tiny-random"}, status=404)
        assert "'my-model'" in error["message"]


# --------------------------------------------------------------------------- several prompts


def test_a_list_of_prompts_gets_one_choice_each_and_summed_usage(url, loaded):
    prompts = ["Hello", "The quick brown fox", [40, 41, 42]]
    body = ok(url, {"prompt": prompts, "max_tokens": 5, "ignore_eos": True})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in body["choices"]] == [completion_ids(url, p, 5) for p in prompts]
    num_prompt_tokens = sum(len(loaded.tokenizer(p)["input_ids"]) for p in prompts[:2]) + 3
    assert body["usage"] == {"prompt_tokens": num_prompt_tokens, "completion_tokens": 15,
                             "total_tokens": num_prompt_tokens + 15,
                             "prompt_tokens_details": {"cached_tokens": 0}}, "the in-flight engine caches nothing"


def test_a_streamed_list_of_prompts_tags_each_chunk_with_its_choice(url):
    prompts = [[40, 41], [50, 51, 52], [60]]
    events = ok(url, {"prompt": prompts, "max_tokens": 4, "ignore_eos": True, "stream": True,
                      "stream_options": {"include_usage": True}})  # fmt: skip
    *chunks, usage_chunk, done = events
    assert done == "[DONE]" and usage_chunk["usage"]["completion_tokens"] == 12
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        by_index[choice["index"]] += choice["token_ids"]
    assert [by_index[i] for i in range(3)] == [completion_ids(url, p, 4) for p in prompts]


def test_the_prompts_of_one_request_are_bounded(url):
    error = error_of(url, {"prompt": [[5]] * (MAX_OPEN_REQUESTS + 1), "max_tokens": 1})
    assert error["param"] == "prompt" and f"at most {MAX_OPEN_REQUESTS}" in error["message"]
    assert error_of(url, {"prompt": [[5], "x", 6], "max_tokens": 1})["param"] == "prompt"
    error = error_of(url, {"prompt": [[5], list(range(3, 3 + MAX_SEQ_LEN))], "max_tokens": 1})
    assert "prompt[1]" in error["message"]


# --------------------------------------------------------------------------- malformed bodies


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"prompt": "\\ud800", "max_tokens": 2}', "surrogate"),
        (b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "surrogate"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "levels deep"),
        (b'{"prompt": ' + b"[" * 40 + b"5" + b"]" * 40 + b"}", "levels deep"),
        (b'{"prompt": [' + b"7" * 5000 + b"]}", "5000 digits"),
        (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "5000 digits"),
        (b'{"prompt": "\xff"}', "UTF-8"),
    ],
    ids=["surrogate", "surrogate-chat", "nested-100k", "nested-40", "long-int", "long-max-tokens", "bad-utf8"],
)
def test_malformed_bodies_are_400s_that_say_why(served, raw, says):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    error = error_of(served.url + path, raw)
    assert error["type"] == "invalid_request_error" and says in error["message"]
    assert ok(served.url + "/v1/completions", {"prompt": "still serving", "max_tokens": 2})["choices"]


def post_as(url: str, content_type: str | None) -> tuple[int, bytes]:
    """A JSON completion request declared as ``content_type`` (None: no Content-Type; urllib would add one)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    try:
        body = json.dumps({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        connection.request("POST", parts.path, body, {"Content-Type": content_type} if content_type else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "Application/JSON", "application/json ; charset=UTF-8"]
)
def test_a_json_content_type_with_parameters_is_read(url, content_type):
    status, raw = post_as(url, content_type)
    assert status == 400 and b"messages" in raw, "read as JSON: the completion refuses the chat field by name"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/vnd.api+json", None]
)
def test_a_body_not_declared_as_json_gets_415_naming_its_content_type(url, chat_url, content_type):
    for endpoint in (url, chat_url):
        status, raw = post_as(endpoint, content_type)
        assert status == 415, raw
        error = json.loads(raw)["error"]
        assert error["type"] == "invalid_request_error" and "Content-Type: application/json" in error["message"]
        assert (content_type or "no Content-Type") in error["message"]
