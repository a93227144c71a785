"""The paged engine and its num_kv_blocks knob through every place knobs flow, with old identities kept."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from perfsuite.ab import wire
from perfsuite.ab.workers import build_message, engine_id
from perfsuite.adapters import Backend, EngineConfig, available_engines, build_engine
from perfsuite.adapters.registry import EngineSpec
from perfsuite.engine import Request, SamplingParams
from perfsuite.engine.fake_runner import FakeRunner, fake_reference


def fake_backend() -> Backend:
    return Backend(runner=FakeRunner(vocab_size=50), tokenize=lambda text: [1] * len(text), eos_token_id=None,
                   max_context=512, device="cpu", probe=None)  # fmt: skip


def test_paged_is_a_registered_engine_built_with_its_pool():
    assert "paged" in available_engines()
    engine = build_engine("paged", fake_backend(), EngineConfig(batch_size=3, max_seq_len=64, num_kv_blocks=5))
    assert engine.name == "paged" and engine.batch_size == 3
    assert (engine.scheduler.kv_cache.num_blocks, engine.scheduler.kv_cache.block_size) == (5, 16)
    # 33-42 tokens each (3 blocks) in 5 blocks: two run at once past the admission watermark, then outgrow it
    requests = [Request(f"r{i}", (1, 2, 3) * (i + 1), SamplingParams(30, ignore_eos=True)) for i in range(4)]
    result = engine.run(requests)
    for request in requests:
        assert result.outputs()[request.request_id] == fake_reference(
            request.prompt_token_ids, request.sampling_params, None, 50
        )
    assert result.counters.num_preemptions > 0 and result.num_kv_blocks == 5


def test_unset_num_kv_blocks_leaves_a_stored_identity_as_it_was():
    unset = EngineConfig(batch_size=8, max_seq_len=64)
    # the knobs of baselines/*/test_throughput[inflight-B8-fixed].json, plus max_seq_len stored apart
    assert unset.identity() == {"batch_size": 8, "max_seq_len": 64, "prefill_batch_size": None,
                                "max_num_batched_tokens": None}  # fmt: skip
    assert EngineConfig(8, 64, num_kv_blocks=40).identity()["num_kv_blocks"] == 40
    assert engine_id(EngineSpec("inflight", EngineConfig(2, 64))) == "inflight:2,64,None,None"
    assert engine_id(EngineSpec("paged", EngineConfig(2, 64, num_kv_blocks=9))) == "paged:2,64,None,None,9"


def test_num_kv_blocks_below_one_is_refused():
    with pytest.raises(ValueError, match="num_kv_blocks must be >= 1, got 0; or leave it unset"):
        EngineConfig(batch_size=2, max_seq_len=64, num_kv_blocks=0)


@dataclass(frozen=True, slots=True)
class ConfigAtOldestSupported:
    """``EngineConfig`` as ``OLDEST_SUPPORTED`` (14782f4), older than the paged engine, has it."""

    batch_size: int
    max_seq_len: int
    prefill_batch_size: int | None = None
    max_num_batched_tokens: int | None = None


def test_a_build_without_num_kv_blocks_still_decodes_in_the_oldest_supported_tree():
    sent = wire.loads_message(wire.dumps_message(build_message(EngineSpec("inflight", EngineConfig(2, 64)))))
    assert sent.config == {"batch_size": 2, "max_seq_len": 64, "prefill_batch_size": None,
                           "max_num_batched_tokens": None}  # fmt: skip
    assert wire.decode(ConfigAtOldestSupported, sent.config) == ConfigAtOldestSupported(2, 64)
    with_blocks = build_message(EngineSpec("paged", EngineConfig(2, 64, num_kv_blocks=9)))
    assert wire.decode(EngineConfig, with_blocks.config).num_kv_blocks == 9
    with pytest.raises(wire.WireError, match="has no field num_kv_blocks: this side's code predates"):
        wire.decode(ConfigAtOldestSupported, with_blocks.config)
