"""Reading a request body as JSON, with a 400 that names the problem for every malformed input.

A body is read only when its ``Content-Type`` is ``application/json`` (any
parameters, such as ``charset``, in any case); anything else, a missing
header included, is a 415. That is vLLM's rule (its ``validate_json_request``
compares the media type with ``application/json`` and refuses an absent
one), kept here so that a client that works against ``perfsuite serve``
works against vLLM too. FastAPI alone would also take ``application/*+json``
and a body without the header.

``json.loads`` alone turns some inputs into errors that are not ``JSONDecodeError``
(and so became 500s): nesting deep enough to exhaust the recursion limit
(``RecursionError``), an integer longer than Python converts (``ValueError``),
and a lone UTF-16 surrogate escape (``"\\ud800"``), which decodes but is not
Unicode text and fails later, in the tokenizer. Each is answered here instead.
"""

from __future__ import annotations

import json

from perfsuite.serve.errors import ApiError, invalid_request

MAX_INTEGER_DIGITS = 20  # any count or token id fits; 2**64 has 20 digits
MAX_NESTING = 32  # a chat request nests objects about 4 deep


class _IntegerTooLong(ValueError):
    pass


JSON_MEDIA_TYPE = "application/json"


def check_json_content_type(content_type: str | None) -> None:
    """``ApiError`` (415) unless ``content_type`` (the header's value, None when absent) declares JSON."""
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() == JSON_MEDIA_TYPE:
        return
    declared = f"Content-Type {content_type!r}" if content_type is not None else "no Content-Type"
    raise ApiError(415, f"send the request body as JSON with Content-Type: {JSON_MEDIA_TYPE}; this one has {declared}")


def parse_json_body(raw: bytes) -> object:
    """The JSON value of ``raw``; ``ApiError`` (400) saying what is wrong with it otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise invalid_request(f"the request body is not UTF-8 text (byte {error.start} is invalid)") from None
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise invalid_request(f"the request body is not valid JSON: {error}") from None
    except _IntegerTooLong as error:
        raise invalid_request(str(error)) from None
    except RecursionError:
        raise invalid_request(_too_deep_message()) from None
    _check_values(value)
    return value


def _bounded_int(digits: str) -> int:
    num_digits = len(digits.lstrip("-"))
    if num_digits > MAX_INTEGER_DIGITS:
        raise _IntegerTooLong(
            f"the request body holds an integer of {num_digits} digits; numbers in a request have at most "
            f"{MAX_INTEGER_DIGITS} digits"
        )
    return int(digits)


def _too_deep_message() -> str:
    return f"the request body nests arrays or objects more than {MAX_NESTING} levels deep; flatten it"


def _check_values(value: object) -> None:
    """Every string is Unicode text and nothing nests deeper than ``MAX_NESTING`` (iteratively: no recursion)."""
    pending: list[tuple[object, str, int]] = [(value, "body", 0)]
    while pending:
        item, where, depth = pending.pop()
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_NESTING:
                raise invalid_request(_too_deep_message())
            if isinstance(item, dict):
                for key, member in item.items():
                    _check_text(key, f"a key of {where}")
                    pending.append((member, f"{where}.{key}", depth + 1))
            else:
                pending.extend((member, f"{where}[{i}]", depth + 1) for i, member in enumerate(item))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code_point = ord(text[error.start])
        raise invalid_request(
            f"{where} holds a lone UTF-16 surrogate (\\u{code_point:04x} at character {error.start}), which is "
            "not Unicode text; send surrogates only in pairs"
        ) from None
