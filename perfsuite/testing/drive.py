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


def drive(engine: Engine, scenario: Scenario) -> dict[str, tuple[int, ...]]:
    """Add each request at its arrival step and step until everything finished; the outputs by request id.

    Fails when the engine still holds a KV slot or block once every request
    has finished.
    """
    arrivals = defaultdict(list)
    for request, step in zip(scenario.requests, scenario.arrival_steps, strict=True):
        arrivals[step].append(request)
    step = 0
    while arrivals or engine.has_unfinished_requests():
        for request in arrivals.pop(step, []):
            engine.add_request(request)
        engine.step()
        step += 1
    assert engine.scheduler.kv_cache.num_used_blocks == 0, "a KV slot or block leaked"
    return engine.result(0.0, 1.0).outputs()
