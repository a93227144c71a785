"""A continuous-batching engine of our own, measured and checked with perfsuite."""

from outside_engine.engine import ContinuousBatchingEngine, lowest_free_slot, slot_after_the_running

__all__ = ["ContinuousBatchingEngine", "lowest_free_slot", "slot_after_the_running"]
