"""Serving a scenario step by step, with arrivals counted in steps.

For an engine with perfsuite's step API (``add_request``, ``step``,
``has_unfinished_requests``, ``result``): a request arrives at a fixed step,
whatever the machine's speed, so a scenario replays exactly when Hypothesis
shrinks it.
"""

from __future__ import annotations

from collections import defaultdict

from perfsuite.engine import Engine
from perfsuite.testing.scenarios import Scenario

# Every step computes at least one token of a request that has arrived; preemptions recompute, so leave room.
MAX_STEPS_PER_TOKEN = 50


def drive(engine: Engine, scenario: Scenario) -> dict[str, tuple[int, ...]]:
    """Add each request at its arrival step and step until everything finished; the outputs by request id.

    Fails when the engine still holds a KV slot or block once every request
    has finished, and when it has not finished after far more steps than its
    tokens need (a stalled engine, say one that leaked blocks, would loop forever).
    """
    arrivals = defaultdict(list)
    for request, step in zip(scenario.requests, scenario.arrival_steps, strict=True):
        arrivals[step].append(request)
    max_steps = max(scenario.arrival_steps) + MAX_STEPS_PER_TOKEN * sum(r.max_total_tokens for r in scenario.requests)
    step = 0
    while arrivals or engine.has_unfinished_requests():
        assert step < max_steps, f"the engine has not finished after {step} steps: it stalled"
        for request in arrivals.pop(step, []):
            engine.add_request(request)
        engine.step()
        step += 1
    assert engine.scheduler.kv_cache.num_used_blocks == 0, "a KV slot or block leaked"
    return engine.result(0.0, 1.0).outputs()
