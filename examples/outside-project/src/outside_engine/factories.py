"""The engines as perfsuite builds them: ``factory(backend, config) -> BatchingEngine``."""

from __future__ import annotations

from perfsuite.adapters import Backend, EngineConfig

from outside_engine.engine import ContinuousBatchingEngine, lowest_free_slot, slot_after_the_running


def build(backend: Backend, config: EngineConfig) -> ContinuousBatchingEngine:
    return ContinuousBatchingEngine(
        "outside", backend.runner, config.batch_size, config.max_seq_len, backend.eos_token_id, lowest_free_slot
    )


def build_broken(backend: Backend, config: EngineConfig) -> ContinuousBatchingEngine:
    """The same engine with a batching bug: a joining request may get a KV slot that another still holds."""
    return ContinuousBatchingEngine(
        "outside-broken",
        backend.runner,
        config.batch_size,
        config.max_seq_len,
        backend.eos_token_id,
        slot_after_the_running,
    )
