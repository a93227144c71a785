"""The engine registry and protocol: names, entry points, errors."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from perfsuite.adapters import (
    Backend,
    BatchingEngine,
    EngineConfig,
    UnknownEngineError,
    available_engines,
    build_engine,
    check_engine_names,
    register_engine,
)
from perfsuite.adapters import registry
from perfsuite.engine.names import DEFAULT_ENGINES
from perfsuite.engine import Request, SamplingParams
from perfsuite.engine.fake_runner import FakeRunner


def fake_backend() -> Backend:
    return Backend(runner=FakeRunner(vocab_size=50), tokenize=lambda text: [1] * len(text), eos_token_id=None,
                   max_context=512, device="cpu", probe=None)


def user_engine(backend: Backend, config: EngineConfig):
    from perfsuite.adapters.builtin import build_inflight

    engine = build_inflight(backend, config)
    engine.name = "user-engine"
    return engine


def not_an_engine(backend, config):
    return object()


@pytest.fixture
def plugin_engines(monkeypatch):
    """Pretend an installed package registered engines under the entry point group."""

    def install(**targets):
        points = [EntryPoint(name, target, registry.ENTRY_POINT_GROUP) for name, target in targets.items()]
        monkeypatch.setattr(registry, "entry_points", lambda group: points if group == registry.ENTRY_POINT_GROUP else [])

    return install


def test_defaults_and_peers_are_registered():
    names = available_engines()
    assert set(DEFAULT_ENGINES) <= set(names)
    assert {"hf-static", "hf-cb", "openai-http"} <= set(names)


@pytest.mark.parametrize("name", DEFAULT_ENGINES)
def test_builtin_engines_follow_the_protocol_and_serve_every_request(name):
    engine = build_engine(name, fake_backend(), EngineConfig(batch_size=2, max_seq_len=64))
    assert isinstance(engine, BatchingEngine)
    assert engine.batch_size == 2 and engine.greedy_equal
    requests = [Request(f"r{i}", (1, 2, 3 + i), SamplingParams(4, ignore_eos=True)) for i in range(5)]
    result = engine.run(requests)
    assert sorted(result.outputs()) == [f"r{i}" for i in range(5)]
    assert all(len(tokens) == 4 for tokens in result.outputs().values())


def test_unknown_engine_names_list_the_choices():
    with pytest.raises(UnknownEngineError, match=r"unknown engine 'turbo'.*choose from static, inflight.*entry point"):
        check_engine_names(("static", "turbo"))
    with pytest.raises(UnknownEngineError, match="repeat"):
        check_engine_names(("static", "static"))
    with pytest.raises(UnknownEngineError, match="turbo"):
        build_engine("turbo", fake_backend(), EngineConfig(batch_size=1, max_seq_len=8))


def test_an_entry_point_engine_is_listed_and_built(plugin_engines):
    plugin_engines(**{"user-engine": f"{__name__}:user_engine"})
    assert available_engines()["user-engine"] == f"{__name__}:user_engine"
    assert check_engine_names(("inflight", "user-engine")) == ("inflight", "user-engine")
    engine = build_engine("user-engine", fake_backend(), EngineConfig(batch_size=3, max_seq_len=32))
    assert engine.name == "user-engine" and engine.batch_size == 3


def test_an_entry_point_may_not_shadow_a_builtin(plugin_engines):
    plugin_engines(inflight=f"{__name__}:user_engine")
    with pytest.raises(UnknownEngineError, match="clashes with perfsuite's own engine"):
        available_engines()


def test_a_factory_that_returns_no_engine_is_named(plugin_engines):
    plugin_engines(broken=f"{__name__}:not_an_engine")
    with pytest.raises(TypeError, match="'broken' returned object.*BatchingEngine protocol"):
        build_engine("broken", fake_backend(), EngineConfig(batch_size=1, max_seq_len=8))


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("max_seq_len", 1)])
def test_engine_config_rejects_impossible_sizes(field, value):
    kwargs = {"batch_size": 2, "max_seq_len": 16, field: value}
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_a_conftest_can_register_an_engine(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTERED", {})
    register_engine("local-engine", user_engine)
    assert check_engine_names(("local-engine",)) == ("local-engine",)
    engine = build_engine("local-engine", fake_backend(), EngineConfig(batch_size=2, max_seq_len=32))
    assert engine.name == "user-engine"
    with pytest.raises(UnknownEngineError, match="'static' is taken"):
        register_engine("static", user_engine)
    with pytest.raises(TypeError, match="needs a factory"):
        register_engine("other", "not callable")


def test_the_decode_mode_option_offers_what_the_runner_has():
    from perfsuite.engine.types import DECODE_MODES, DecodeMode
    from perfsuite.plugin.options import DECODE_MODES as OPTION_MODES

    RUNNER_MODES = tuple(mode.value for mode in DecodeMode)
    assert OPTION_MODES == RUNNER_MODES
    assert OPTION_MODES is DECODE_MODES, "the modes are listed once, in the engine"


def test_a_backend_probes_the_machine_only_with_the_probe_its_builder_passes_in():
    from perfsuite.models import load_model

    def probe(device: str) -> float:
        return 0.001

    loaded = load_model("tiny-random", dtype="float32")
    assert Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device="cpu").probe is None
    assert Backend.from_loaded(loaded).probe is None
    assert Backend.from_loaded(loaded, probe=probe).probe is probe
