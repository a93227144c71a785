"""perfsuite's own engines over a bare runner (a ``FakeRunner``), built the one way engines are built: by registered
name (``perfsuite.adapters.build_engine``) from an ``EngineConfig``."""

from __future__ import annotations

from perfsuite.adapters import Backend, EngineConfig, build_engine


def own_engine(name: str, runner, *, eos_token_id: int | None = None, clock=None, sleep=None, **knobs):
    """The engine registered as ``name`` over ``runner``, with ``knobs`` as its ``EngineConfig``.

    ``clock`` and ``sleep``: a test's step clock, put in place of the real one before anything runs (the registry
    builds every engine on the real clock).
    """
    backend = Backend(runner, tokenize=list, eos_token_id=eos_token_id, max_context=1 << 20, device="cpu")
    engine = build_engine(name, backend, EngineConfig(**knobs))
    if clock is not None:
        engine._clock = clock
    if sleep is not None:
        engine._sleep = sleep
    return engine
