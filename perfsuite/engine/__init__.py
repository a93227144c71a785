"""Engines: pure-Python scheduling over one torch model runner.

Importing this package does not import torch; ``layers`` (the decoder),
``model_runner``, ``static_decode`` and ``reference`` do, and are imported
only where a model is used.
"""

from perfsuite.engine.block_manager import BlockManager
from perfsuite.engine.engine import Engine, inflight_engine, paged_engine, static_engine
from perfsuite.engine.kv_cache import KVCacheManager
from perfsuite.engine.paged_scheduler import PagedScheduler
from perfsuite.engine.scheduler import InflightScheduler, Scheduler, StaticScheduler
from perfsuite.engine.types import (
    EngineCounters,
    FinishReason,
    FollowUp,
    Request,
    RequestRecord,
    RunResult,
    SamplingParams,
    ScheduledChunk,
    SchedulerOutput,
    StepOutput,
    StepTrace,
)

__all__ = [
    "BlockManager",
    "Engine",
    "EngineCounters",
    "FinishReason",
    "FollowUp",
    "InflightScheduler",
    "KVCacheManager",
    "PagedScheduler",
    "Request",
    "RequestRecord",
    "RunResult",
    "SamplingParams",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerOutput",
    "StaticScheduler",
    "StepOutput",
    "StepTrace",
    "inflight_engine",
    "paged_engine",
    "static_engine",
]
