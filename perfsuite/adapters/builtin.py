"""perfsuite's own engines as factories of the adapter protocol."""

from __future__ import annotations

from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.engine import Engine, inflight_engine, paged_engine, static_engine


def runner_for(backend: Backend, config: EngineConfig):
    """The backend's runner, refused where its batch invariance is not what ``config`` asks for (and records)."""
    runner_invariant = bool(getattr(backend.runner, "batch_invariant", False))
    if runner_invariant != config.batch_invariant:
        raise ValueError(
            f"the engine config asks for batch_invariant={config.batch_invariant} but the backend's runner was built "
            f"with batch_invariant={runner_invariant}; build both alike (--perf-batch-invariant sets both)"
        )
    return backend.runner


def build_static(backend: Backend, config: EngineConfig) -> Engine:
    return static_engine(
        runner_for(backend, config),
        batch_size=config.batch_size,
        max_seq_len=config.max_seq_len,
        eos_token_id=backend.eos_token_id,
    )


def build_inflight(backend: Backend, config: EngineConfig) -> Engine:
    return inflight_engine(
        runner_for(backend, config),
        decode_batch_size=config.batch_size,
        prefill_batch_size=config.prefill_batch_size,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_seq_len=config.max_seq_len,
        eos_token_id=backend.eos_token_id,
    )


def build_paged(backend: Backend, config: EngineConfig, enable_prefix_caching: bool = False) -> Engine:
    """The paged engine over ``num_kv_blocks`` blocks of ``kv_block_size`` tokens (unset: ``DEFAULT_KV_BLOCK_SIZE``)."""
    block_size = {} if config.kv_block_size is None else {"kv_block_size": config.kv_block_size}
    return paged_engine(
        runner_for(backend, config),
        decode_batch_size=config.batch_size,
        prefill_batch_size=config.prefill_batch_size,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_kv_blocks=config.num_kv_blocks,
        max_seq_len=config.max_seq_len,
        eos_token_id=backend.eos_token_id,
        enable_prefix_caching=enable_prefix_caching,
        **block_size,
    )


def build_paged_prefix(backend: Backend, config: EngineConfig) -> Engine:
    """The paged engine with prefix caching: an engine kind of its own, so stored ``paged`` runs stay comparable."""
    return build_paged(backend, config, enable_prefix_caching=True)
