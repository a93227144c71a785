"""How the ``openai-http`` client talks to a server: the choices a user makes, in one frozen value.

Pure Python (no aiohttp), so the pytest options and ``Backend`` can carry it
without importing the client. See ``perfsuite.adapters.openai_http`` for what
each choice does on the wire.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from perfsuite.engine.names import OPENAI_HTTP

PROMPT_FORMATS = ("auto", "token_ids", "text")
EOS_CONTROLS = ("ignore_eos", "min_tokens", "both")
APIS = ("completions", "chat")
API_KEY_VARIABLES = ("PERFSUITE_API_KEY", "OPENAI_API_KEY")  # read in this order when no key is given
SERVER_ENGINE = OPENAI_HTTP  # the engine these options drive; it measures the server at the endpoint


@dataclass(frozen=True, slots=True)
class HttpClientOptions:
    """The ``openai-http`` client's options (pytest: ``--perf-server-model`` and its neighbours).

    - ``server_model``: the served model to ask for; None: the only one the server serves.
    - ``api_key``: sent as ``Authorization: Bearer`` on every request; never shown in a repr.
    - ``prompt_format``: ``token_ids`` sends the prompt's ids; ``text`` sends them detokenized
      (the server re-tokenizes); ``auto`` sends ids unless a probe shows the server rejects them.
    - ``eos_control``: how ``ignore_eos`` requests are asked to run to ``max_new_tokens``: vLLM's
      ``ignore_eos``, the ``min_tokens`` that llama.cpp and others honour instead, or both.
    - ``api``: ``completions`` (``/v1/completions``) or ``chat`` (``/v1/chat/completions``).
    - ``send_request_ids``: send perfsuite's request id as ``X-Request-Id`` (llama.cpp rejects it).
    """

    server_model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    prompt_format: str = "auto"
    eos_control: str = "both"
    api: str = "completions"
    send_request_ids: bool = False

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("prompt_format", self.prompt_format, PROMPT_FORMATS),
            ("eos_control", self.eos_control, EOS_CONTROLS),
            ("api", self.api, APIS),
        ):
            if value not in choices:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(choices)}")

    @property
    def sends_ignore_eos(self) -> bool:
        return self.eos_control in ("ignore_eos", "both")

    @property
    def sends_min_tokens(self) -> bool:
        return self.eos_control in ("min_tokens", "both")

    @property
    def sends_text(self) -> bool:
        """Known before asking the server: the prompt goes as text (a chat message is always text)."""
        return self.api == "chat" or self.prompt_format == "text"


def api_key_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """The first non-empty key of ``API_KEY_VARIABLES``; None when neither is set."""
    for name in API_KEY_VARIABLES:
        if environ.get(name):
            return environ[name]
    return None


def endpoint_url(text: str) -> str:
    """``text`` stripped, when it is a server's base URL (http or https, a host, optionally a path); else ValueError.

    The one check of ``--perf-endpoint`` and ``perfsuite run --endpoint``, made
    while their arguments are parsed, before a model loads.
    """
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f"{text!r} is not a server's base URL; write it as http://HOST:PORT, e.g. http://127.0.0.1:8000 "
            "(optionally ending in /v1)"
        )
    return text.strip()


def check_endpoint(engines: Sequence[str], endpoint: str | None) -> None:
    """ValueError when ``engines`` include the server's client but no ``endpoint`` says where the server is."""
    if SERVER_ENGINE in engines and not endpoint:
        raise ValueError(
            f"--perf-engines {SERVER_ENGINE} measures a server: pass its base URL with --perf-endpoint "
            "http://HOST:PORT (e.g. where `perfsuite serve` or vLLM listens)"
        )
