"""``perfsuite serve`` from the command line: load the model, warm up, serve until signalled.

The model is served under ``--served-model-name`` (default: its short name, or
a local folder's name), and ``/v1/models`` names a folder of its tokenizer
files as ``root``: a copy that transformers 4.x and 5.x both load
(``perfsuite.models.portable_tokenizer``), written under the cache root at
start-up, whatever the model (a local folder, the SmolLM2 copy, a random
model's tokenizer built in code). The start-up banner prints it, for clients
that cannot reach a hub.

Each request is logged at INFO on ``perfsuite.serve.requests``
(``perfsuite.serve.request_log``), which the command line sends to stderr;
``--no-request-log`` leaves the log out.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfsuite.engine import Engine, Request
from perfsuite.engine.names import INFLIGHT, PAGED, PAGED_PREFIX
from perfsuite.serve.app import CompletionServer
from perfsuite.serve.limits import DEFAULT_MAX_OPEN_REQUESTS, ServeLimits
from perfsuite.serve.request_log import REQUEST_LOGGER

if TYPE_CHECKING:
    from perfsuite.models import LoadedModel

DEFAULT_MAX_SEQ_LEN = 2048
# perfsuite's own engines that serve one request at a time as it comes; paged-prefix reuses the KV of prompt
# prefixes seen before (usage.prompt_tokens_details.cached_tokens and /metrics' prefix cache counters show it).
SERVE_ENGINES = (INFLIGHT, PAGED, PAGED_PREFIX)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """``perfsuite serve``'s command line."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    batch_size: int = 8
    max_seq_len: int | None = None
    dtype: str = "float32"
    device: str = "auto"
    threads: int | None = None
    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS
    served_model_name: str | None = None  # None: the model's short name
    engine: str = INFLIGHT
    request_log: bool = True  # a line per request at INFO (--no-request-log: none)

    def __post_init__(self) -> None:
        if self.engine not in SERVE_ENGINES:
            raise ValueError(
                f"--engine {self.engine!r} is not one perfsuite serve runs; choose from {', '.join(SERVE_ENGINES)}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name must not be empty; leave it out to serve the model's short name")


def serve(options: ServeOptions) -> int:
    """Load the model, warm the engine up and serve until interrupted."""
    if options.request_log:
        log_requests_to_stderr()
    asyncio.run(build_server(options).serve_until_signalled(options.host, options.port))
    return 0


def build_server(options: ServeOptions) -> CompletionServer:
    from perfsuite.adapters import Backend, EngineConfig, build_engine
    from perfsuite.engine.kv_memory import KVMemoryError
    from perfsuite.measure.timing import configure_threads, resolve_device, warm_up
    from perfsuite.models import load_model

    device = resolve_device(options.device)
    threads = configure_threads(options.threads) if device == "cpu" else None
    loaded = load_model(options.model, device=device, dtype=options.dtype)
    max_seq_len = options.max_seq_len or min(DEFAULT_MAX_SEQ_LEN, loaded.max_context)
    if max_seq_len > loaded.max_context:
        raise ValueError(f"--max-seq-len {max_seq_len} exceeds the model's context of {loaded.max_context} tokens")
    try:
        config = EngineConfig(options.batch_size, max_seq_len)
        engine = build_engine(options.engine, Backend.from_loaded(loaded), config)
    except KVMemoryError as error:
        raise ValueError(f"{error.message('--batch-size')}, or lower --max-seq-len") from None
    assert isinstance(engine, Engine)  # SERVE_ENGINES are perfsuite's own, which the worker steps
    warm_up(engine, [Request("warm-up", tuple(loaded.tokenizer("Hello")["input_ids"]) or (0,))])
    served_name = options.served_model_name or short_model_name(loaded)
    root = tokenizer_folder(loaded, served_name)
    print(
        f"perfsuite serve: {loaded.spec.name} {options.dtype} on {device}, engine {options.engine}"
        + (f" ({threads} threads)" if threads else "")
        + f", batch size {options.batch_size}, max_seq_len {max_seq_len}, served as {served_name!r}\n"
        + f"perfsuite serve: tokenizer files (transformers 4.x and 5.x load them; /v1/models' root): {root}",
        file=sys.stderr,
    )
    return CompletionServer(
        engine,
        loaded.tokenizer,
        model_name=served_name,
        vocab_size=loaded.model.config.vocab_size,
        limits=ServeLimits(max_open_requests=options.max_open_requests),
        model_root=root,
        request_log=options.request_log,
    )


def short_model_name(loaded: LoadedModel) -> str:
    """A known model's name, or a local model folder's own name."""
    if loaded.spec.path is not None:
        return Path(loaded.spec.path).name
    return loaded.spec.name


def tokenizer_folder(loaded: LoadedModel, served_name: str) -> str:
    """The folder of the tokenizer's portable copy (written once, under the cache root), for ``root``."""
    from perfsuite.models import served_tokenizer_folder

    return str(served_tokenizer_folder(loaded.tokenizer, served_name))


def log_requests_to_stderr() -> None:
    """Send the request log's INFO lines to stderr (a library user configures logging as they like)."""
    logger = logging.getLogger(REQUEST_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s perfsuite serve: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
