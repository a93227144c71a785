"""The ``messages`` of a ``/v1/chat/completions`` body, checked and rendered with the model's chat template.

A message is ``{"role", "content"}`` (and optionally ``name``); its content is a
string or a list of text parts (``{"type": "text", "text": ...}``), which are
joined with newlines, as vLLM does for templates that take strings. The prompt
is the tokenizer's chat template applied with ``add_generation_prompt=True``,
tokenized without adding special tokens again (the template writes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfsuite.serve.errors import invalid_request

ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_FIELDS = frozenset({"role", "content", "name"})


def parse_messages(messages: object) -> list[dict[str, str]]:
    """The messages as ``{"role", "content"[, "name"]}`` with string content; ``ApiError`` (400) otherwise."""
    if messages is None:
        raise invalid_request('messages is required: a list of {"role": ..., "content": ...} objects', "messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("messages must be a non-empty list of message objects", "messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def _message(message: object, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise invalid_request(f"{where} must be an object with role and content", "messages")
    unknown = sorted(set(message) - _MESSAGE_FIELDS)
    if unknown:
        raise invalid_request(
            f"{where} has the unsupported field {unknown[0]!r} (tool calls and the like are not served); "
            f"a message has {', '.join(sorted(_MESSAGE_FIELDS))}",
            "messages",
        )
    role = message.get("role")
    if role not in ROLES:
        raise invalid_request(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
    parsed = {"role": role, "content": _content(message.get("content"), f"{where}.content")}
    if message.get("name") is not None:
        if not isinstance(message["name"], str):
            raise invalid_request(f"{where}.name must be a string", "messages")
        parsed["name"] = message["name"]
    return parsed


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_part(part, f"{where}[{i}]") for i, part in enumerate(content))
    raise invalid_request(f"{where} must be a string or a list of text parts, got {type(content).__name__}", "messages")


def _text_part(part: object, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text":
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise invalid_request(
            f'{where} is a {kind!r} part; this server serves text only ({{"type": "text", "text": ...}})', "messages"
        )
    if not isinstance(part.get("text"), str):
        raise invalid_request(f"{where}.text must be a string", "messages")
    return part["text"]


def render_chat_prompt(
    tokenizer: Any, model_name: str, messages: list[dict[str, str]], add_special_tokens: bool = False
) -> Sequence[int]:
    """The token ids of ``messages`` under the tokenizer's chat template, ready for the assistant's reply; with
    ``add_special_tokens`` (vLLM's field), the tokenizer's special tokens (BOS) on top of the template's."""
    if not getattr(tokenizer, "chat_template", None):
        raise invalid_request(
            f"the model {model_name!r} has no chat template, so /v1/chat/completions cannot render messages; "
            "use /v1/completions with a prompt, or serve a model whose tokenizer has a chat template",
            "messages",
        )
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as error:  # jinja2's TemplateError, or a template's raise_exception(...)
        raise invalid_request(f"the model's chat template rejected the messages: {error}", "messages") from None
    return tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
