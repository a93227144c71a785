"""Parsing and validating a ``/v1/completions`` body into a ``CompletionRequest``.

Every rejection is an ``ApiError`` (400) that names the field at fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.engine import Request, SamplingParams
from perfsuite.serve.errors import invalid_request


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
        raise invalid_request(f"the request body must be a JSON object, got {type(body).__name__}")
    if "model" in body and not isinstance(body["model"], (str, type(None))):
        raise invalid_request("model must be a string", "model")
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
            raise invalid_request(
                f"{name}={json.dumps(value)} is not supported: this server decodes greedily, so {name} "
                f"must be left out or be {json.dumps(neutral[-1])}",
                name,
            )


def _prompt_token_ids(prompt: object, vocab_size: int, tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if prompt is None:
        raise invalid_request("prompt is required: a string or a list of token ids", "prompt")
    if isinstance(prompt, str):
        token_ids = tuple(tokenize(prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid_request(f"prompt holds {len(prompt)} prompts; send one prompt per request", "prompt")
    elif isinstance(prompt, list):
        token_ids = _token_ids(prompt, "prompt", vocab_size)
    else:
        raise invalid_request(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    if not token_ids:
        raise invalid_request("prompt is empty; it needs at least one token", "prompt")
    return token_ids


def _token_ids(values: object, name: str, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(_is_int(v) for v in values):
        raise invalid_request(f"{name} must be a list of integer token ids", name)
    outside = [v for v in values if not 0 <= v < vocab_size]
    if outside:
        raise invalid_request(f"{name} holds token id {outside[0]}, outside the vocabulary [0, {vocab_size})", name)
    return tuple(values)


def _max_tokens(body: dict, num_prompt_tokens: int, limits: PromptLimits) -> int:
    room = limits.max_seq_len - num_prompt_tokens
    if room < 1:
        raise invalid_request(
            f"the prompt has {num_prompt_tokens} tokens but this server's max_seq_len is {limits.max_seq_len}, "
            "leaving no room for output; shorten the prompt",
            "prompt",
        )
    value = body.get("max_tokens")
    if value is None:
        return min(limits.default_max_tokens, room)
    if not _is_int(value) or value < 1:
        raise invalid_request(f"max_tokens must be an integer >= 1, got {json.dumps(value)}", "max_tokens")
    if value > room:
        raise invalid_request(
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
        raise invalid_request("stream_options must be an object", "stream_options")
    if not stream:
        raise invalid_request("stream_options is only allowed with stream: true", "stream_options")
    return _boolean(options, "include_usage", param="stream_options.include_usage")


def _boolean(body: dict, name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_request(f"{param or name} must be true or false, got {json.dumps(value)}", param or name)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
