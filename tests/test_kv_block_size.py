"""EngineConfig.kv_block_size: a scenario's pool reaches a registered paged engine in the scenario's own blocks.

Before it, ``Scenario.engine_config`` handed ``num_kv_blocks`` blocks of 1, 2
or 4 tokens to an engine that counted them in its own 16-token blocks, so
through ``equivalence_test("paged")`` the pool was 4 to 16 times too large and
the engine never preempted. The knob travels every way ``EngineConfig`` does
(the A/B and cluster wires) and is in a run's identity only when set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from perfsuite.ab import wire
from perfsuite.ab.worker_main import Worker
from perfsuite.ab.workers import build_message, engine_id
from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire as cluster_wire
from perfsuite.cluster.actor import MeasureActor
from perfsuite.engine import Request, SamplingParams
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.plugin.against import WorkerEngine
from perfsuite.plugin.cluster import ClusterEngine
from perfsuite.testing.scenarios import Scenario


def fake_backend() -> Backend:
    return Backend(runner=FakeRunner(vocab_size=50), tokenize=lambda text: [1] * len(text), eos_token_id=None,
                   max_context=512, device="cpu", probe=None)  # fmt: skip


def tight_scenario() -> Scenario:
    """Three requests of 10-14 tokens each over 8 blocks of 2 tokens: two cannot both finish without preemption."""
    requests = tuple(
        Request(f"r{i}", tuple(range(3 + i, 9 + i)), SamplingParams(4 + 2 * i, ignore_eos=True)) for i in range(3)
    )
    return Scenario(requests, (0, 0, 1), batch_size=3, prefill_batch_size=3, max_num_batched_tokens=32,
                    num_kv_blocks=8, kv_block_size=2)  # fmt: skip


def test_unset_kv_block_size_is_left_out_of_a_runs_identity_and_a_set_one_is_in_it():
    assert "kv_block_size" not in EngineConfig(8, 64).identity()  # stored baselines keep their identity
    assert "kv_block_size" not in EngineConfig(8, 64, num_kv_blocks=40).identity()
    assert EngineConfig(8, 64, num_kv_blocks=40, kv_block_size=4).identity()["kv_block_size"] == 4


def test_kv_block_size_below_one_is_refused():
    with pytest.raises(ValueError, match="kv_block_size must be >= 1, got 0; or leave it unset"):
        EngineConfig(2, 64, num_kv_blocks=4, kv_block_size=0)


def test_a_scenarios_engine_config_carries_its_block_size():
    scenario = tight_scenario()
    config = scenario.engine_config(32)
    assert (config.num_kv_blocks, config.kv_block_size) == (8, 2)


@pytest.mark.parametrize("name", ["paged", "paged-prefix"])
def test_perfsuites_paged_builders_honour_the_block_size(name):
    sized = build_engine(name, fake_backend(), EngineConfig(3, 64, num_kv_blocks=5, kv_block_size=2))
    assert (sized.scheduler.kv_cache.num_blocks, sized.scheduler.kv_cache.block_size) == (5, 2)
    default = build_engine(name, fake_backend(), EngineConfig(3, 64, num_kv_blocks=5))
    assert (default.scheduler.kv_cache.num_blocks, default.scheduler.kv_cache.block_size) == (5, 16)
    no_pool = build_engine(name, fake_backend(), EngineConfig(3, 64, kv_block_size=4))
    assert (no_pool.scheduler.kv_cache.num_blocks, no_pool.scheduler.kv_cache.block_size) == (3 * 16, 4)


def test_the_registered_paged_engine_preempts_where_the_scenario_means_it_to():
    scenario = tight_scenario()
    max_seq_len = scenario.max_total_tokens
    registered = build_engine("paged", fake_backend(), scenario.engine_config(max_seq_len))
    result = registered.run(scenario.timed_requests(0.0))
    assert result.num_kv_blocks == 8 and result.counters.num_preemptions > 0
    for request in scenario.requests:
        assert result.outputs()[request.request_id] == fake_reference(
            request.prompt_token_ids, request.sampling_params, None, 50
        )
    # the same pool counted in 16-token blocks (the gap this knob closes) holds everything: no preemption
    sixteen = build_engine("paged", fake_backend(), EngineConfig(3, max_seq_len, 3, 32, num_kv_blocks=8))
    assert sixteen.run(scenario.timed_requests(0.0)).counters.num_preemptions == 0


@dataclass(frozen=True, slots=True)
class ConfigBeforeKvBlockSize:
    """``EngineConfig`` as a tree older than ``kv_block_size`` has it."""

    batch_size: int
    max_seq_len: int
    prefill_batch_size: int | None = None
    max_num_batched_tokens: int | None = None
    num_kv_blocks: int | None = None


def test_the_ab_wire_carries_the_block_size_and_an_older_tree_still_decodes_a_build_without_it():
    spec = EngineSpec("paged", EngineConfig(2, 64, num_kv_blocks=9, kv_block_size=2))
    assert engine_id(spec) == "paged:2,64,None,None,9,block=2"
    assert engine_id(EngineSpec("paged", EngineConfig(2, 64, num_kv_blocks=9))) == "paged:2,64,None,None,9"  # as before
    assert WorkerEngine("paged", spec.config).spec == spec
    sent = wire.loads_message(wire.dumps_message(build_message(spec)))
    config = Worker(wire, Path("."))._engine_config(sent)
    assert config == EngineConfig(2, 64, num_kv_blocks=9, kv_block_size=2)
    with pytest.raises(wire.WireError, match="has no field kv_block_size: this side's code predates"):
        wire.decode(ConfigBeforeKvBlockSize, sent.config)
    unset = build_message(EngineSpec("paged", EngineConfig(2, 64, num_kv_blocks=9)))
    assert "kv_block_size" not in unset.config
    assert wire.decode(ConfigBeforeKvBlockSize, unset.config).num_kv_blocks == 9


def test_the_cluster_wire_carries_the_block_size_to_the_actors_engine():
    config = EngineConfig(2, 64, num_kv_blocks=9, kv_block_size=2)
    knobs = ClusterEngine("paged", config).knobs
    assert knobs.config.kv_block_size == 2
    request = cluster_wire.MeasureRequest("t", knobs, tight_scenario().requests, None, 0, 1, 0.05)
    assert cluster_wire.loads(cluster_wire.MeasureRequest, cluster_wire.dumps(request)).engine == knobs
    actor = MeasureActor.__new__(MeasureActor)  # without Ray: its constructor loads a model
    actor._backend, actor._engines = fake_backend(), {}
    engine = actor._engine(knobs)
    assert (engine.scheduler.kv_cache.num_blocks, engine.scheduler.kv_cache.block_size) == (9, 2)
    unset = cluster_wire.MeasureRequest("t", ClusterEngine("paged", EngineConfig(2, 64)).knobs, (), None, 0, 1, 0.05)
    assert "kv_block_size" not in cluster_wire.dumps(unset)  # the codec leaves an unset knob out
