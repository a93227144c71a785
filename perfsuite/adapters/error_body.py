"""What a server's error answer shows in a message: one line, short, in words.

An OpenAI-compatible server answers an error as ``{"error": {"message": ...}}``:
that message is shown. Any other body is shown as its text on one line, cut
to ``MAX_SHOWN_CHARS``. An HTML page (a proxy's or a web server's, which
says the endpoint is likely not the server meant) is shown as its words:
without tags, styles or scripts, which would otherwise fill the message.
"""

from __future__ import annotations

import html
import json
import re

MAX_SHOWN_CHARS = 300

_HTML = re.compile(r"^\s*<(!doctype\s+html|html|head|body)\b", re.IGNORECASE)
_NOT_WORDS = re.compile(r"<(script|style)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else ``shown_body(body)``."""
    try:
        error = json.loads(body)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (json.JSONDecodeError, KeyError, TypeError):
        return shown_body(body)


def shown_body(body: str) -> str:
    """``body`` on one line and at most ``MAX_SHOWN_CHARS`` long; an HTML page as its words."""
    is_html = _HTML.match(body) is not None
    text = html.unescape(_TAG.sub(" ", _NOT_WORDS.sub(" ", body))) if is_html else body
    text = " ".join(text.split())
    if not text:
        return "(empty body)"
    if len(text) > MAX_SHOWN_CHARS:
        text = f"{text[:MAX_SHOWN_CHARS]}… ({len(text) - MAX_SHOWN_CHARS} more characters)"
    return f"an HTML page: {text}" if is_html else text
