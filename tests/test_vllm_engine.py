"""The ``vllm`` engine's loop and registration, without vLLM: a fake ``LLMEngine`` steps in for it.

The real engine runs in the peers tier (tests/peers/test_peer_vllm_engine.py).
The fake produces one token per running request per step and stamps it the
way vLLM's ``RequestStateStats`` do, with ``time.monotonic()``.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from perfsuite.adapters import Backend, EngineConfig, UnknownEngineError, available_engines, check_engine_names
from perfsuite.adapters import registry
from perfsuite.adapters.vllm_engine import (
    KV_BLOCK_TOKENS,
    VLLMEngine,
    VLLMEngineError,
    VLLMSettings,
    kv_bytes_per_token,
    model_directory,
    sampling_arguments,
)
from perfsuite.engine.types import FinishReason, Request, SamplingParams

EOS = 50
VOCAB = 64


@dataclass
class FakeStats:
    scheduled_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class FakeRequest:
    prompt: list[int]
    params: dict
    stats: FakeStats = field(default_factory=FakeStats)
    num_tokens: int = 0
    stamps: list[float] = field(default_factory=list)


class FakeLLMEngine:
    """vLLM's ``LLMEngine`` as the adapter uses it: token n of a request is ``prompt[0] + n``."""

    def __init__(self, finish_early_after: int | None = None, with_metrics: bool = True) -> None:
        self.finish_early_after = finish_early_after
        self.with_metrics = with_metrics
        self.running: dict[str, FakeRequest] = {}
        self.added_at: dict[str, float] = {}
        self.stamps: dict[str, list[float]] = {}
        self.aborted: list[str] = []
        self.most_running = 0

    def add_request(self, request_id, prompt, params) -> None:
        self.running[request_id] = FakeRequest(prompt, params)
        self.added_at[request_id] = time.perf_counter()

    def abort_request(self, request_ids) -> None:
        self.aborted.extend(request_ids)
        for request_id in request_ids:
            self.running.pop(request_id, None)

    def step(self) -> list:
        self.most_running = max(self.most_running, len(self.running))
        now = time.monotonic()
        outputs = []
        for request_id, state in list(self.running.items()):
            token = (state.prompt[0] + state.num_tokens) % VOCAB
            state.num_tokens += 1
            state.stats.scheduled_ts = state.stats.scheduled_ts or now
            state.stats.last_token_ts = now
            self.stamps.setdefault(request_id, []).append(now)
            finished = self._finishes(state, token)
            if finished:
                del self.running[request_id]
            completion = SimpleNamespace(token_ids=[token], finish_reason="length" if finished else None)
            metrics = state.stats if self.with_metrics else None
            outputs.append(SimpleNamespace(request_id=request_id, outputs=[completion], finished=finished,
                                           metrics=metrics))
        return outputs

    def _finishes(self, state: FakeRequest, token: int) -> bool:
        if self.finish_early_after is not None and state.num_tokens >= self.finish_early_after:
            return True
        return state.num_tokens >= state.params["max_tokens"] or token in state.params["stop_token_ids"]


def fake_engine(llm_engine: FakeLLMEngine, batch_size: int = 4) -> VLLMEngine:
    return VLLMEngine(
        llm_engine,
        make_params=lambda params: sampling_arguments(params, EOS),
        make_prompt=list,
        eos_token_id=EOS,
        config=EngineConfig(batch_size=batch_size, max_seq_len=64),
        vocab_size=VOCAB,
    )


def request(request_id: str, first_token: int, max_new_tokens: int, arrival_time: float = 0.0, **params) -> Request:
    return Request(request_id, (first_token, 1, 2), SamplingParams(max_new_tokens, **params), arrival_time)


# --------------------------------------------------------------------------- the run loop


def test_every_request_in_full_with_vllms_timestamps_on_the_records_clock():
    llm = FakeLLMEngine()
    result = fake_engine(llm).run([request("a", 3, 5, ignore_eos=True), request("b", 10, 2, ignore_eos=True)])
    records = {r.request_id: r for r in result.records}
    assert records["a"].output_token_ids == (3, 4, 5, 6, 7)
    assert records["b"].output_token_ids == (10, 11)
    assert records["a"].finish_reason is FinishReason.LENGTH
    shift = time.perf_counter() - time.monotonic()
    for request_id, record in records.items():
        assert record.token_times == pytest.approx([t + shift for t in llm.stamps[request_id]], abs=1e-3)
        assert record.first_scheduled_time == pytest.approx(llm.stamps[request_id][0] + shift, abs=1e-3)
        assert result.start_time <= record.arrival_time <= record.token_times[0] <= result.end_time


def test_a_request_is_added_only_once_it_has_arrived():
    llm = FakeLLMEngine()
    result = fake_engine(llm).run([request("now", 3, 2), request("later", 3, 2, arrival_time=0.2)])
    late = next(r for r in result.records if r.request_id == "later")
    assert late.arrival_time == pytest.approx(result.start_time + 0.2)
    assert llm.added_at["later"] >= result.start_time + 0.2


def test_a_closed_loop_keeps_at_most_max_concurrency_requests_in_vllm():
    llm = FakeLLMEngine()
    requests = [request(f"r{i}", i, 3, ignore_eos=True) for i in range(5)]
    result = fake_engine(llm).run(requests, max_concurrency=2)
    assert llm.most_running == 2
    assert all(len(r.output_token_ids) == 3 for r in result.records)


def test_eos_stops_a_request_in_vllm_as_in_perfsuite():
    llm = FakeLLMEngine()
    result = fake_engine(llm).run([request("eos", EOS - 2, 10)])
    assert result.records[0].output_token_ids == (EOS - 2, EOS - 1, EOS)
    assert result.records[0].finish_reason is FinishReason.STOP
    assert llm.aborted == []


def test_min_tokens_is_left_to_perfsuites_rule_and_vllm_is_aborted_there():
    """vLLM's min_tokens would mask EOS (other greedy tokens); perfsuite stops the request and aborts it in vLLM."""
    llm = FakeLLMEngine()
    result = fake_engine(llm).run([request("m", EOS - 3, 10, min_tokens=2)])
    assert result.records[0].output_token_ids == (EOS - 3, EOS - 2, EOS - 1, EOS)
    assert llm.aborted == ["m"]


def test_a_request_vllm_ends_short_fails_the_run_naming_it():
    llm = FakeLLMEngine(finish_early_after=2)
    engine = fake_engine(llm)
    with pytest.raises(VLLMEngineError, match=r"request 'short' finished \(length\) after 2 of its 6 tokens"):
        engine.run([request("short", 3, 6, ignore_eos=True), request("other", 9, 6, ignore_eos=True, arrival_time=5)])
    assert llm.running == {}


class SilentLLMEngine(FakeLLMEngine):
    def step(self) -> list:
        return []


def test_an_engine_that_stops_answering_fails_the_run_instead_of_hanging():
    engine = fake_engine(SilentLLMEngine())
    engine.stall_timeout_s = 0.2
    with pytest.raises(VLLMEngineError, match=r"no output for 0.2 s with requests \['a'\] unfinished"):
        engine.run([request("a", 3, 2)])


def test_missing_request_metrics_name_the_setting():
    with pytest.raises(VLLMEngineError, match="disable_log_stats=False"):
        fake_engine(FakeLLMEngine(with_metrics=False)).run([request("a", 3, 2)])


def test_bad_requests_are_refused_before_anything_runs():
    llm = FakeLLMEngine()
    with pytest.raises(ValueError, match="exceeds the engine's context of 64 tokens"):
        fake_engine(llm).run([request("long", 3, 62)])
    assert llm.added_at == {}


# --------------------------------------------------------------------------- settings


def test_sampling_arguments_stop_as_perfsuite_does():
    assert sampling_arguments(SamplingParams(8), EOS) == {
        "temperature": 0.0, "max_tokens": 8, "ignore_eos": False, "stop_token_ids": [EOS],
    }  # fmt: skip
    ignoring = sampling_arguments(SamplingParams(8, ignore_eos=True, stop_token_ids=(7,)), EOS)
    assert ignoring["ignore_eos"] is True and ignoring["stop_token_ids"] == [7]
    with_min = sampling_arguments(SamplingParams(8, stop_token_ids=(7,), min_tokens=3), EOS)
    assert with_min["ignore_eos"] is True and with_min["stop_token_ids"] == []


def test_engine_arguments_size_vllm_like_the_inflight_engine():
    per_token = 1024 * 1024
    arguments = VLLMSettings.from_config("/m", "float32", EngineConfig(8, 300), per_token).engine_arguments()
    assert arguments["max_num_seqs"] == 8
    assert arguments["max_model_len"] == 300
    assert arguments["max_num_batched_tokens"] == 8 * 300
    assert arguments["kv_cache_memory_bytes"] == 8 * (300 + KV_BLOCK_TOKENS) * per_token  # B requests always fit
    assert arguments["enable_prefix_caching"] is False
    assert arguments["disable_log_stats"] is False
    budgeted = VLLMSettings.from_config("/m", "float32", EngineConfig(8, 300, max_num_batched_tokens=256), per_token)
    assert budgeted.engine_arguments()["max_num_batched_tokens"] == 256


def test_kv_bytes_per_token_follow_the_models_shape():
    smollm2 = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_bytes_per_token(smollm2, dtype_bytes=4) == 2 * 30 * 3 * 64 * 4


def test_a_model_built_in_code_has_no_folder_for_vllm():
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path=""))
    backend = Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device="cpu", model=model)
    with pytest.raises(ValueError, match="not a model built in code such as tiny-random"):
        model_directory(backend)


# --------------------------------------------------------------------------- registration


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_is_not_offered_without_vllm_and_asking_for_it_says_how_to_install():
    assert "vllm" not in available_engines()
    with pytest.raises(UnknownEngineError, match=r"needs the 'vllm' package.*make peers"):
        check_engine_names(("inflight", "vllm"))


def test_vllm_is_offered_where_vllm_is_importable(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    assert available_engines()["vllm"] == "perfsuite.adapters.vllm_engine:build"
    assert check_engine_names(("inflight", "vllm")) == ("inflight", "vllm")


def test_the_name_vllm_is_reserved():
    with pytest.raises(UnknownEngineError, match="taken"):
        registry.register_engine("vllm", lambda backend, config: None)
