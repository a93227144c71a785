"""Engines by name: perfsuite's own, the shipped peer adapters, and users' plugins.

A package registers its engine under the ``perfsuite.engines`` entry point
group, pointing at a factory ``(Backend, EngineConfig) -> BatchingEngine``::

    [project.entry-points."perfsuite.engines"]
    my-engine = "my_package.perf:build_engine"

An engine that lives in a project's own code is registered from its
``conftest.py`` instead::

    from perfsuite.adapters import register_engine
    register_engine("my-engine", build_my_engine)

Names are listed without importing anything (torch stays unimported until an
engine is built).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig, EngineFactory
from perfsuite.engine.names import (
    HF_CB,
    HF_STATIC,
    INFLIGHT,
    OPENAI_HTTP,
    PAGED,
    PAGED_PREFIX,
    STATIC,
    VLLM,
)

ENTRY_POINT_GROUP = "perfsuite.engines"

# every shipped engine by its name (perfsuite.engine.names) and the factory that builds it
BUILTIN_ENGINES: dict[str, str] = {
    STATIC: "perfsuite.adapters.builtin:build_static",
    INFLIGHT: "perfsuite.adapters.builtin:build_inflight",
    PAGED: "perfsuite.adapters.builtin:build_paged",
    PAGED_PREFIX: "perfsuite.adapters.builtin:build_paged_prefix",
    HF_STATIC: "perfsuite.adapters.hf_static:build",
    HF_CB: "perfsuite.adapters.hf_cb:build",
    OPENAI_HTTP: "perfsuite.adapters.openai_http:build",
}

# Engines over an optional package: listed only where that package is importable
# (``find_spec``, nothing imported). name -> (package, factory, how to install it).
OPTIONAL_ENGINES: dict[str, tuple[str, str, str]] = {
    VLLM: ("vllm", "perfsuite.adapters.vllm_engine:build", "pip install perfsuite[vllm], or `make peers`"),
}


_REGISTERED: dict[str, EngineFactory] = {}


class UnknownEngineError(ValueError):
    pass


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``factory`` available as ``--perf-engines name`` (call it at import time of a conftest.py)."""
    if name in BUILTIN_ENGINES or name in OPTIONAL_ENGINES or name in _plugin_engines():
        raise UnknownEngineError(f"engine name {name!r} is taken; register your engine under another name")
    if not callable(factory):
        raise TypeError(f"register_engine({name!r}, ...) needs a factory (backend, config) -> engine, got {factory!r}")
    _REGISTERED[name] = factory


def _plugin_engines() -> dict[str, str]:
    found = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in BUILTIN_ENGINES:
            raise UnknownEngineError(
                f"the {ENTRY_POINT_GROUP!r} entry point {entry.name!r} ({entry.value}) clashes with perfsuite's own "
                f"engine of that name; register it under another name"
            )
        found[entry.name] = entry.value
    return found


def _installed_optional_engines() -> dict[str, str]:
    return {
        name: factory
        for name, (package, factory, _) in OPTIONAL_ENGINES.items()
        if importlib.util.find_spec(package) is not None
    }


def available_engines() -> dict[str, str | EngineFactory]:
    """Every engine name and what builds it: a ``module:factory`` path or a registered factory."""
    return {**BUILTIN_ENGINES, **_installed_optional_engines(), **_plugin_engines(), **_REGISTERED}


def check_engine_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` unchanged if every one is known, else an error listing the choices."""
    known = available_engines()
    unknown = [name for name in names if name not in known]
    missing = [name for name in unknown if name in OPTIONAL_ENGINES]
    if missing:
        package, _, install = OPTIONAL_ENGINES[missing[0]]
        raise UnknownEngineError(
            f"engine {missing[0]!r} needs the {package!r} package, which is not installed here; {install}"
        )
    if unknown:
        raise UnknownEngineError(
            f"unknown engine {', '.join(map(repr, unknown))}; choose from {', '.join(known)} "
            f"or register one under the {ENTRY_POINT_GROUP!r} entry point group (docs/your-own-engine.md)"
        )
    if len(set(names)) != len(names):
        raise UnknownEngineError(f"engine names repeat in {', '.join(names)}; give each once")
    return names


def load_factory(name: str) -> EngineFactory:
    target = available_engines().get(name)
    if target is None:
        check_engine_names((name,))  # raises, naming the choices
        raise AssertionError(f"check_engine_names took the unknown engine {name!r}")
    if callable(target):
        return target
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """A registered engine's name and the ``EngineConfig`` it is built with: what the A/B and Ray wires carry to the
    process that builds it."""

    name: str
    config: EngineConfig

    def build(self, backend: Backend) -> BatchingEngine:
        return build_engine(self.name, backend, self.config)


def build_engine(name: str, backend: Backend, config: EngineConfig) -> BatchingEngine:
    """The engine registered as ``name``, built over ``backend``; checked against the protocol."""
    return checked_engine(name, load_factory(name)(backend, config))


def checked_engine(name: str, engine: object) -> BatchingEngine:
    """``engine``, which factory ``name`` returned, if it has the ``BatchingEngine`` protocol; else a TypeError.

    For a caller that builds many engines from one ``load_factory``: finding a
    factory by name reads every installed package's entry points.
    """
    if not isinstance(engine, BatchingEngine):
        raise TypeError(
            f"engine factory {name!r} returned {type(engine).__name__}, which lacks the BatchingEngine protocol "
            "(name, greedy_equal, batch_size, run); see perfsuite.adapters.protocol"
        )
    return engine
