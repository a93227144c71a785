"""``finish_reason`` as vLLM v1 gives it: the length is checked before EOS and stop tokens.

Over the fake runner, whose tokens are a pure function of the sequence, the
engine's EOS is set to the fifth token a prompt's continuation would have, so
a ``max_tokens`` of 5 puts EOS exactly at the limit ("length", as vLLM says)
and one of 8 puts it before the limit ("stop").
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from perfsuite.engine import FinishReason, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.models import build_byte_tokenizer
from perfsuite.serve import CompletionServer, ServerThread

VOCAB = 320
EOS_AT = 5  # the engine's EOS is the 5th token of the prompt's continuation
TEXT = "Hello there"
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
HTTP_TIMEOUT_S = 10.0

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_the_length_is_checked_before_eos_and_stop_tokens():
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(7,))
    assert params.finish_reason(2, 3, eos_token_id=2) is FinishReason.STOP  # EOS before the limit
    assert params.finish_reason(2, 4, eos_token_id=2) is FinishReason.LENGTH  # EOS as the last token allowed
    assert params.finish_reason(7, 3, eos_token_id=2) is FinishReason.STOP
    assert params.finish_reason(7, 4, eos_token_id=2) is FinishReason.LENGTH
    held_off = SamplingParams(max_new_tokens=4, min_tokens=4)
    assert held_off.finish_reason(2, 3, eos_token_id=2) is None
    assert held_off.finish_reason(2, 4, eos_token_id=2) is FinishReason.LENGTH


def prompt_ids(tokenizer, api: str) -> list[int]:
    if api == "chat":
        text = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(TEXT)["input_ids"]


def eos_for(prompt: list[int]) -> int:
    """A token that first appears as the ``EOS_AT``-th of ``prompt``'s continuation."""
    continuation = fake_reference(prompt, SamplingParams(max_new_tokens=EOS_AT, ignore_eos=True), None, VOCAB)
    assert continuation[EOS_AT - 1] not in continuation[: EOS_AT - 1], "pick another TEXT: the token repeats"
    return continuation[EOS_AT - 1]


@pytest.fixture(scope="module", params=["completions", "chat"])
def served(request):
    tokenizer = build_byte_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT_TEMPLATE
    eos = eos_for(prompt_ids(tokenizer, request.param))
    engine = inflight_engine(FakeRunner(vocab_size=VOCAB), decode_batch_size=2, max_seq_len=128, eos_token_id=eos)
    with ServerThread(CompletionServer(engine, tokenizer, model_name="fake", vocab_size=VOCAB)) as thread:
        yield request.param, thread


def post(served, max_tokens: int, stream: bool) -> list[dict]:
    """The answer's JSON bodies: one whole answer, or each streamed chunk."""
    api, thread = served
    if api == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]}
    else:
        path, body = "/v1/completions", {"prompt": TEXT}
    body |= {"max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        thread.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _no_proxy.open(request, timeout=HTTP_TIMEOUT_S) as response:
        raw = response.read().decode()
    if not stream:
        return [json.loads(raw)]
    payloads = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("max_tokens", "reason"), [(EOS_AT + 3, "stop"), (EOS_AT, "length")], ids=["eos-before-limit", "eos-at-limit"]
)
def test_finish_reason_is_length_when_eos_is_the_last_token_allowed(served, stream, max_tokens, reason):
    bodies = post(served, max_tokens, stream)
    reasons = [choice["finish_reason"] for body in bodies for choice in body["choices"]]
    assert [r for r in reasons if r is not None] == [reason]
    assert bodies[-1]["usage"]["completion_tokens"] == EOS_AT
