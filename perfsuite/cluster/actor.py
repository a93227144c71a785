"""The measurement actor: one per node and model, holding the loaded model; it measures what it is sent.

The class is plain Python: the controller's pool makes it a Ray actor
(``ray.remote(...)(MeasureActor)``), so this module imports neither Ray nor,
until the actor starts, torch. Every method takes and returns a string of
``perfsuite.cluster.wire``. The machine probe and the CPU meter are read on
the actor's node, around each repeat, as the in-process recorder reads them
on its machine; a disturbed repeat is reported (``busy_shares``, ``noisy``)
but not re-run: the controller's verdict calls it noisy.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import socket

from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire


class MeasureActor:
    def __init__(self, spec_text: str) -> None:
        from perfsuite.adapters import Backend
        from perfsuite.measure.environment import capture_environment
        from perfsuite.measure.probe import machine_probe
        from perfsuite.measure.timing import configure_threads, resolve_device
        from perfsuite.models import load_model

        spec = wire.loads(wire.ActorModel, spec_text)
        device = resolve_device(spec.device)
        if device == "cpu":
            configure_threads(None)
        loaded = load_model(spec.model, device=device, dtype=spec.dtype)
        self._backend = Backend.from_loaded(loaded, decode_mode=spec.decode_mode, probe=machine_probe)
        self._environment = capture_environment(spec.model, spec.dtype, self._backend.device)
        self._node = this_node()
        self._engines: dict[EngineSpec, object] = {}

    def describe(self) -> str:
        backend = self._backend
        return wire.dumps(
            wire.Described(
                node=self._node,
                environment=self._environment,
                device=backend.device,
                max_context=backend.max_context,
                eos_token_id=backend.eos_token_id,
                vocab_size=backend.vocab_size,
                special_token_ids=tuple(backend.special_token_ids),
            )
        )

    def tokenize(self, text: str) -> str:
        message = wire.loads(wire.Tokenize, text)
        return wire.dumps(wire.Tokens(tuple(int(t) for t in self._backend.tokenize(message.text))))

    def measure(self, text: str) -> str:
        from perfsuite.adapters.protocol import check_serves_follow_ups
        from perfsuite.measure.contention import CpuMeter, contention_reason
        from perfsuite.measure.timing import DevicePeakMemory, timed_run

        request = wire.loads(wire.MeasureRequest, text)
        engine = self._engine(request.engine)
        requests, device = list(request.requests), self._backend.device
        check_serves_follow_ups(engine, requests)  # the controller's stand-in cannot know what this engine does
        for _ in range(request.warmup_runs):
            engine.run(requests, max_concurrency=request.max_concurrency)
        readings = [self._backend.probe(device)]
        runs, uses, peaks = [], [], []
        for _ in range(request.repeats):
            with CpuMeter() as meter, DevicePeakMemory(device) as memory:
                runs.append(timed_run(engine, requests, device, max_concurrency=request.max_concurrency))
            uses.append(meter.use)
            peaks.append(memory.peak_bytes)
            readings.append(self._backend.probe(device))
        return wire.dumps(
            wire.MeasureResult(
                test_id=request.test_id,
                node=self._node,
                environment=self._environment,
                runs=tuple(runs),
                probes=bracketed(readings),
                busy_shares=tuple(u.busy_share for u in uses if u is not None),
                noisy=contention_reason(uses, request.busy_threshold),
                device_memory=tuple(peaks) if all(p is not None for p in peaks) else (),
                runs_in_process=getattr(engine, "runs_in_process", True),
            )
        )

    def measure_capacity(self, text: str) -> str:
        """A capacity test's every run on this node: warm-ups, the start, then each search between two probes."""
        from perfsuite.adapters.protocol import check_serves_follow_ups
        from perfsuite.measure.capacity import CapacityError
        from perfsuite.measure.capacity_runs import CapacityRuns, scaled_to
        from perfsuite.measure.contention import CpuMeter, contention_reason
        from perfsuite.measure.timing import timed_run

        request = wire.loads(wire.CapacityRequest, text)
        engine = self._engine(request.engine)
        device, requests = self._backend.device, request.requests
        check_serves_follow_ups(engine, requests)

        def run(sent, max_concurrency):
            return timed_run(engine, sent, device, max_concurrency=max_concurrency)

        runs = CapacityRuns(
            run, lambda rate: scaled_to(requests, rate), request.slo, request.steady_state, request.choices
        )
        search = runs.prepare(request.warmup_runs)
        found = wire.CapacityResult(
            request.test_id,
            self._node,
            self._environment,
            search,
            runs_in_process=getattr(engine, "runs_in_process", True),
        )
        readings, searches, at_capacity, uses = [self._backend.probe(device)], [], [], []
        for _ in range(request.repeats):
            with CpuMeter() as meter:
                try:
                    capacity, at = runs.one_search()
                except CapacityError as error:  # the test fails: no search of it is kept
                    return wire.dumps(dataclasses.replace(found, no_capacity=str(error)))
            searches.append(capacity)
            at_capacity.append(at)
            uses.append(meter.use)
            readings.append(self._backend.probe(device))
        return wire.dumps(
            dataclasses.replace(
                found,
                searches=tuple(searches),
                at_capacity=tuple(at_capacity),
                probes=bracketed(readings),
                busy_shares=tuple(u.busy_share for u in uses if u is not None),
                noisy=contention_reason(uses, request.busy_threshold),
            )
        )

    def _engine(self, spec: EngineSpec):
        if spec not in self._engines:
            self._engines[spec] = spec.build(self._backend)
        return self._engines[spec]


def bracketed(readings: list[float]) -> tuple[float, ...]:
    """One probe per run: the geometric mean of the readings just before and just after it (as the recorder's)."""
    return tuple(math.sqrt(before * after) for before, after in itertools.pairwise(readings))


def this_node() -> wire.NodeInfo:
    import ray

    context = ray.get_runtime_context()
    return wire.NodeInfo(context.get_node_id(), socket.gethostname(), ray.util.get_node_ip_address())
