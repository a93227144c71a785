"""Engine adapters: one protocol for perfsuite's engines and peers alike."""

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig, EngineFactory
from perfsuite.adapters.registry import (
    ENTRY_POINT_GROUP,
    UnknownEngineError,
    available_engines,
    build_engine,
    check_engine_names,
    register_engine,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BatchingEngine",
    "EngineConfig",
    "EngineFactory",
    "UnknownEngineError",
    "available_engines",
    "build_engine",
    "check_engine_names",
    "register_engine",
]
