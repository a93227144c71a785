"""Parsing and validating a ``/v1/completions`` or ``/v1/chat/completions`` body into a ``CompletionRequest``.

Every field a body may hold is on an explicit allow-list (``COMPLETION_FIELDS``,
``CHAT_FIELDS``): an unknown field is rejected rather than ignored, because a
field ignored silently changes what a benchmark measures (a client that asks
for ``min_tokens`` and gets fewer tokens). Sampling fields are accepted only at
their neutral value (the engine decodes greedily). Every rejection is an
``ApiError`` that names the field at fault: 400, or 404 for a model this server
does not serve.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.engine import Request, SamplingParams
from perfsuite.serve.chat_messages import parse_messages
from perfsuite.serve.errors import ApiError, invalid_request

COMPLETIONS = "completions"
CHAT = "chat"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a request: one engine request."""

    token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated body: one or more prompts and how to decode and answer them."""

    api: str  # COMPLETIONS or CHAT
    prompts: tuple[Prompt, ...]
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool  # usage so far on every streamed chunk (vLLM's continuous_usage_stats)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)

    def engine_request_ids(self, completion_id: str) -> tuple[str, ...]:
        if len(self.prompts) == 1:
            return (completion_id,)
        return tuple(f"{completion_id}-{index}" for index in range(len(self.prompts)))

    def to_engine_requests(self, completion_id: str) -> tuple[Request, ...]:
        return tuple(
            Request(request_id, prompt.token_ids, self._params(prompt))
            for request_id, prompt in zip(self.engine_request_ids(completion_id), self.prompts)
        )

    def _params(self, prompt: Prompt) -> SamplingParams:
        return SamplingParams(
            prompt.max_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=self.stop_token_ids,
            min_tokens=self.min_tokens,
        )


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a request must fit: the served model, the engine's slot length, the vocabulary, the prompt count."""

    max_seq_len: int
    vocab_size: int
    default_max_tokens: int
    served_model_name: str | None = None  # None: any model name is accepted
    max_prompts: int = 1


# Parameters that would change which tokens come out. The engine decodes
# greedily, so each is accepted only at its neutral value rather than ignored.
_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "temperature": (None, 0),
    "top_p": (None, 1),
    "top_k": (None, 0, -1),
    "min_p": (None, 0),
    "n": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "stop": (None, "", []),
    "logit_bias": (None, {}),
    "skip_special_tokens": (None, True),  # the text of a choice never holds special tokens
}
_COMPLETION_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None,),
    "suffix": (None, ""),
}
_CHAT_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
}

# Fields with a meaning here (parsed below), shared by both endpoints.
_SUPPORTED_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "max_completion_tokens",  # OpenAI's newer name for max_tokens
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "stream",
        "stream_options",
        "return_token_ids",  # vLLM: every choice carries token_ids here anyway
        "seed",  # greedy decoding does not sample, so any seed gives the same tokens
        "user",  # an end-user id for the server's logs; this server keeps none
        "add_special_tokens",  # vLLM: whether tokenizing adds the tokenizer's special tokens (BOS); see below
    }
)
COMPLETION_FIELDS = frozenset({*_SUPPORTED_FIELDS, "prompt", *_NEUTRAL_VALUES, *_COMPLETION_NEUTRAL_VALUES})
CHAT_FIELDS = frozenset({*_SUPPORTED_FIELDS, "messages", *_NEUTRAL_VALUES, *_CHAT_NEUTRAL_VALUES})
_STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})
# Fields vLLM types without null (pydantic refuses it there): a null is refused here too, not read as the default
# (a client sending add_special_tokens: null may mean false). The others, null in OpenAI's and vLLM's schemas, read
# null as left out.
_NOT_NULL: dict[str, str] = {
    "add_special_tokens": "a boolean (true or false)",
    "ignore_eos": "a boolean (true or false)",
    "skip_special_tokens": "a boolean (true or false)",
    "min_tokens": "an integer >= 0",
}
_OTHER_ENDPOINT = {"messages": "/v1/chat/completions", "prompt": "/v1/completions"}

# (text, add_special_tokens) -> token ids
Tokenize = Callable[[str, bool], Sequence[int]]
# text -> token ids, special tokens settled by the request
TokenizeText = Callable[[str], Sequence[int]]


def parse_completion_request(body: object, limits: PromptLimits, tokenize: Tokenize) -> CompletionRequest:
    """The ``/v1/completions`` request a JSON body asks for; ``ApiError`` saying which field is wrong otherwise.

    vLLM's ``add_special_tokens`` (default true, as in vLLM) says whether a text prompt is tokenized with the
    tokenizer's special tokens (BOS); a prompt of token ids is taken as it is.
    """
    body = _checked_body(body, COMPLETION_FIELDS, _COMPLETION_NEUTRAL_VALUES, limits)
    add_special_tokens = _boolean(body, "add_special_tokens", default=True)
    prompts = _completion_prompts(body.get("prompt"), limits, lambda text: tokenize(text, add_special_tokens))
    where = ["the prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]
    return _request(COMPLETIONS, body, _Prompts(prompts, where, "prompt"), limits, limits.default_max_tokens)


def parse_chat_request(
    body: object, limits: PromptLimits, render: Callable[[list[dict], bool], Sequence[int]]
) -> CompletionRequest:
    """The ``/v1/chat/completions`` request a JSON body asks for; ``render`` turns its messages into token ids
    (``render(messages, add_special_tokens)``).

    As in vLLM, a chat request without ``max_tokens`` may run to the end of its slot, and ``add_special_tokens``
    (default false: the chat template writes the special tokens it wants) adds the tokenizer's special tokens on
    top of the rendered template (inference-perf sends it with chat templates).
    """
    body = _checked_body(body, CHAT_FIELDS, _CHAT_NEUTRAL_VALUES, limits)
    add_special_tokens = _boolean(body, "add_special_tokens", default=False)
    token_ids = tuple(render(parse_messages(body.get("messages")), add_special_tokens))
    if not token_ids:
        raise invalid_request("the messages render to an empty prompt; send at least one message with text", "messages")
    return _request(CHAT, body, _Prompts([token_ids], ["the rendered messages"], "messages"), limits, None)


# --------------------------------------------------------------------------- the whole body


def _checked_body(
    body: object, allowed: frozenset[str], endpoint_neutral: dict[str, tuple[Any, ...]], limits: PromptLimits
) -> dict:
    if not isinstance(body, dict):
        raise invalid_request(f"the request body must be a JSON object, got {type(body).__name__}")
    _check_known_fields(body, allowed)
    _check_not_null(body)
    _check_model(body.get("model"), limits.served_model_name)
    _check_greedy(body, _NEUTRAL_VALUES | endpoint_neutral)
    _check_optional(body, "seed", _is_int, "an integer")
    _check_optional(body, "user", lambda v: isinstance(v, str), "a string")
    _boolean(body, "return_token_ids")
    return body


def _check_known_fields(body: dict, allowed: frozenset[str]) -> None:
    for name in body:
        if name in allowed:
            continue
        hint = f"; {name} belongs to {_OTHER_ENDPOINT[name]}" if name in _OTHER_ENDPOINT else ""
        raise invalid_request(
            f"unknown or unsupported field {name!r}{hint}: remove it. This server accepts {', '.join(sorted(allowed))}",
            name,
        )


def _check_not_null(body: dict) -> None:
    for name, kind in _NOT_NULL.items():
        if name in body and body[name] is None:
            raise invalid_request(f"{name} must be {kind}, got null; send a value or leave {name} out", name)


def _check_model(model: object, served_model_name: str | None) -> None:
    if model is None:
        return
    if not isinstance(model, str):
        raise invalid_request("model must be a string", "model")
    if served_model_name is not None and model != served_model_name:
        raise ApiError(
            404,
            f"The model {model!r} does not exist (model_not_found): this server serves {served_model_name!r} "
            "(GET /v1/models); ask for it or leave model out",
            "model",
        )


def _check_greedy(body: dict, neutral_values: dict[str, tuple[Any, ...]]) -> None:
    for name, neutral in neutral_values.items():
        value = body.get(name)
        if value not in neutral:
            raise invalid_request(
                f"{name}={json.dumps(value)} is not supported: this server decodes greedily, so {name} "
                f"must be left out or be {json.dumps(neutral[-1])}",
                name,
            )


@dataclass(frozen=True, slots=True)
class _Prompts:
    """A body's prompts as token ids, what to call each in an error, and the field they came from."""

    token_ids: list[tuple[int, ...]]
    names: list[str]
    param: str


def _request(
    api: str, body: dict, prompts: _Prompts, limits: PromptLimits, default_max_tokens: int | None
) -> CompletionRequest:
    asked = _asked_max_tokens(body)
    sized = tuple(
        Prompt(ids, _max_tokens(asked, ids, name, prompts.param, limits, default_max_tokens))
        for ids, name in zip(prompts.token_ids, prompts.names)
    )
    stream = _boolean(body, "stream")
    include_usage, continuous_usage = _stream_options(body, stream)
    return CompletionRequest(
        api=api,
        prompts=sized,
        min_tokens=_min_tokens(body, asked, sized),
        ignore_eos=_boolean(body, "ignore_eos"),
        stop_token_ids=_token_ids(body.get("stop_token_ids") or [], "stop_token_ids", limits.vocab_size),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
    )


# --------------------------------------------------------------------------- prompts


def _completion_prompts(prompt: object, limits: PromptLimits, tokenize: TokenizeText) -> list[tuple[int, ...]]:
    if prompt is None:
        raise invalid_request(
            "prompt is required: a string, a list of token ids, or a list of either (several prompts)", "prompt"
        )
    batch = _as_batch(prompt)
    if batch is None:
        return [_one_prompt(prompt, "prompt", limits.vocab_size, tokenize)]
    if len(batch) > limits.max_prompts:
        raise invalid_request(
            f"prompt holds {len(batch)} prompts but this server takes at most {limits.max_prompts} per request; "
            "split them over several requests",
            "prompt",
        )
    return [_one_prompt(p, f"prompt[{i}]", limits.vocab_size, tokenize) for i, p in enumerate(batch)]


def _as_batch(prompt: object) -> list | None:
    """The prompts of a batch (a list of strings or of token-id lists); None for a single prompt."""
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(isinstance(p, (str, list)) for p in prompt):
        return prompt
    if any(isinstance(p, (str, list)) for p in prompt):
        raise invalid_request(
            "prompt mixes prompts with token ids; send one prompt (a string or a list of token ids) "
            "or a list of prompts",
            "prompt",
        )
    return None


def _one_prompt(prompt: object, where: str, vocab_size: int, tokenize: TokenizeText) -> tuple[int, ...]:
    if isinstance(prompt, str):
        token_ids = tuple(tokenize(prompt))
    elif isinstance(prompt, list):
        token_ids = _token_ids(prompt, "prompt", vocab_size, where)
    else:
        raise invalid_request(f"{where} must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if not token_ids:
        raise invalid_request(f"{where} is empty; it needs at least one token", "prompt")
    return token_ids


def _token_ids(values: object, name: str, vocab_size: int, where: str | None = None) -> tuple[int, ...]:
    where = where or name
    if not isinstance(values, list) or not all(_is_int(v) for v in values):
        raise invalid_request(f"{where} must be a list of integer token ids", name)
    outside = [v for v in values if not 0 <= v < vocab_size]
    if outside:
        raise invalid_request(f"{where} holds token id {outside[0]}, outside the vocabulary [0, {vocab_size})", name)
    return tuple(values)


# --------------------------------------------------------------------------- lengths


def _asked_max_tokens(body: dict) -> tuple[str, int] | None:
    """The field that names the output length and its value (``max_tokens`` and ``max_completion_tokens`` agree)."""
    asked = {name: body[name] for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None}
    for name, value in asked.items():
        if not _is_int(value) or value < 1:
            raise invalid_request(f"{name} must be an integer >= 1, got {json.dumps(value)}", name)
    if len(set(asked.values())) > 1:
        raise invalid_request(
            f"max_tokens ({asked['max_tokens']}) and max_completion_tokens ({asked['max_completion_tokens']}) "
            "differ; they are two names for one limit: send one of them, or the same value in both",
            "max_completion_tokens",
        )
    return next(iter(asked.items()), None)


def _max_tokens(
    asked: tuple[str, int] | None,
    token_ids: tuple[int, ...],
    where: str,
    param: str,
    limits: PromptLimits,
    default_max_tokens: int | None,
) -> int:
    room = limits.max_seq_len - len(token_ids)
    if room < 1:
        raise invalid_request(
            f"{where} has {len(token_ids)} tokens but this server's max_seq_len is {limits.max_seq_len}, "
            "leaving no room for output; shorten it",
            param,
        )
    if asked is None:
        return room if default_max_tokens is None else min(default_max_tokens, room)
    name, value = asked
    if value > room:
        raise invalid_request(
            f"{where} ({len(token_ids)} tokens) + {name} ({value}) exceeds this server's max_seq_len of "
            f"{limits.max_seq_len}; ask for at most {room} tokens",
            name,
        )
    return value


def _min_tokens(body: dict, asked: tuple[str, int] | None, prompts: Sequence[Prompt]) -> int:
    value = body.get("min_tokens")
    if value is None:
        return 0
    if not _is_int(value) or value < 0:
        raise invalid_request(f"min_tokens must be an integer >= 0, got {json.dumps(value)}", "min_tokens")
    max_tokens = min(p.max_tokens for p in prompts)
    if value > max_tokens:
        limit = f"{asked[0]} ({max_tokens})" if asked else f"the default max_tokens ({max_tokens})"
        raise invalid_request(
            f"min_tokens ({value}) exceeds {limit}; lower min_tokens or raise max_tokens", "min_tokens"
        )
    return value


# --------------------------------------------------------------------------- small fields


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise invalid_request("stream_options must be an object", "stream_options")
    if not stream:
        raise invalid_request("stream_options is only allowed with stream: true", "stream_options")
    unknown = sorted(set(options) - _STREAM_OPTIONS)
    if unknown:
        raise invalid_request(
            f"unknown field stream_options.{unknown[0]}: remove it; stream_options accepts "
            f"{', '.join(sorted(_STREAM_OPTIONS))}",
            f"stream_options.{unknown[0]}",
        )
    include_usage = _boolean(options, "include_usage", param="stream_options.include_usage")
    continuous = _boolean(options, "continuous_usage_stats", param="stream_options.continuous_usage_stats")
    return include_usage, continuous


def _boolean(body: dict, name: str, param: str | None = None, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"{param or name} must be true or false, got {json.dumps(value)}", param or name)
    return value


def _check_optional(body: dict, name: str, is_valid: Callable[[object], bool], kind: str) -> None:
    value = body.get(name)
    if value is not None and not is_valid(value):
        raise invalid_request(f"{name} must be {kind}, got {json.dumps(value)}", name)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
