"""``perfsuite serve`` from the command line: load the model, warm up, serve until signalled."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from perfsuite.engine import Request
from perfsuite.serve.app import CompletionServer
from perfsuite.serve.limits import DEFAULT_MAX_OPEN_REQUESTS, ServeLimits

DEFAULT_MAX_SEQ_LEN = 2048


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

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")


def serve(options: ServeOptions) -> int:
    """Load the model, warm the engine up and serve until interrupted."""
    asyncio.run(build_server(options).serve_until_signalled(options.host, options.port))
    return 0


def build_server(options: ServeOptions) -> CompletionServer:
    from perfsuite.adapters import Backend, EngineConfig, build_engine
    from perfsuite.measure import configure_threads, resolve_device, warm_up
    from perfsuite.models import load_model

    device = resolve_device(options.device)
    threads = configure_threads(options.threads) if device == "cpu" else None
    loaded = load_model(options.model, device=device, dtype=options.dtype)
    max_seq_len = options.max_seq_len or min(DEFAULT_MAX_SEQ_LEN, loaded.max_context)
    if max_seq_len > loaded.max_context:
        raise ValueError(f"--max-seq-len {max_seq_len} exceeds the model's context of {loaded.max_context} tokens")
    engine = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(options.batch_size, max_seq_len))
    warm_up(engine, [Request("warm-up", tuple(loaded.tokenizer("Hello")["input_ids"]) or (0,))])
    print(
        f"perfsuite serve: {loaded.spec.name} {options.dtype} on {device}"
        + (f" ({threads} threads)" if threads else "")
        + f", batch size {options.batch_size}, max_seq_len {max_seq_len}",
        file=sys.stderr,
    )
    return CompletionServer(
        engine,
        loaded.tokenizer,
        model_name=loaded.spec.name,
        vocab_size=loaded.model.config.vocab_size,
        limits=ServeLimits(max_open_requests=options.max_open_requests),
    )
