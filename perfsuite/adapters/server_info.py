"""What an OpenAI-compatible server says it serves: ``GET /v1/models``, read once before a run.

The answer decides which model a run asks for, how long a request may be (the
server's own ``max_model_len``, not the local model's context), and the
server's identity that results are stored under. Only the given URL is
contacted: proxies from the environment are not used.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from perfsuite.adapters.error_body import error_message, shown_body

DEFAULT_TIMEOUT_S = 30.0

# Where servers put the longest prompt + output they accept: vLLM and perfsuite serve use the first.
_MAX_LENGTH_KEYS = ("max_model_len", "context_length", "max_context_length")


class ServerInfoError(RuntimeError):
    """The server could not be asked, or its answer does not name the model a run needs."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of ``/v1/models``."""

    model_id: str
    max_model_len: int | None = None  # None: the server does not say
    root: str | None = None  # where the server loaded it from (vLLM, perfsuite serve): a tokenizer folder
    owned_by: str | None = None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A server's base URL and the models it serves."""

    base_url: str
    models: tuple[ServedModel, ...]

    def select(self, name: str | None) -> ServedModel:
        """The served model called ``name``; with no name, the only one served."""
        served = ", ".join(repr(m.model_id) for m in self.models) or "none"
        if name is None:
            if len(self.models) == 1:
                return self.models[0]
            raise ServerInfoError(
                f"{self.base_url} serves {len(self.models)} models ({served}); name the one to measure "
                "with --perf-server-model NAME"
            )
        for model in self.models:
            if model.model_id == name:
                return model
        raise ServerInfoError(
            f"{self.base_url} does not serve a model called {name!r} (it serves {served}); "
            "fix --perf-server-model or start the server with that name (vLLM: --served-model-name)"
        )


def parse_models(base_url: str, body: object) -> ServerInfo:
    """A ``/v1/models`` body as ``ServerInfo``; ``ServerInfoError`` naming what is malformed."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ServerInfoError(f"{base_url}/v1/models did not answer an OpenAI model list ({{'data': [...]}})")
    return ServerInfo(base_url, tuple(_served_model(base_url, entry) for entry in data))


def _served_model(base_url: str, entry: object) -> ServedModel:
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
        raise ServerInfoError(f"{base_url}/v1/models lists an entry without a model id: {json.dumps(entry)[:200]}")
    return ServedModel(
        model_id=entry["id"],
        max_model_len=_max_model_len(entry),
        root=entry["root"] if isinstance(entry.get("root"), str) else None,
        owned_by=entry["owned_by"] if isinstance(entry.get("owned_by"), str) else None,
    )


def _max_model_len(entry: dict) -> int | None:
    for key in _MAX_LENGTH_KEYS:
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_server_info(base_url: str, *, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> ServerInfo:
    """Ask ``{base_url}/v1/models``; ``ServerInfoError`` saying what failed and what to check."""
    url = f"{base_url}/v1/models"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "application/json", **auth_headers(api_key)})
    try:
        with opener.open(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        hint = " (pass the server's key with --perf-api-key)" if error.code in (401, 403) else ""
        reason = error_message(_decoded(error.read()))
        raise ServerInfoError(f"GET {url} answered HTTP {error.code}{hint}: {reason}") from None
    except (urllib.error.URLError, OSError) as error:
        cause: object = getattr(error, "reason", error)
        raise ServerInfoError(f"cannot reach the server at {url}: {cause}; is it running? (--perf-endpoint)") from None
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ServerInfoError(f"GET {url} did not answer JSON: {shown_body(_decoded(raw))}") from None
    return parse_models(base_url, body)


def _decoded(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
