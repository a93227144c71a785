"""The measurement actor: one per node and model, holding the loaded model; it measures what it is sent.

The class is plain Python: the controller's pool makes it a Ray actor
(``ray.remote(...)(MeasureActor)``), so this module imports neither Ray nor,
until the actor starts, torch. Every method takes and returns a string of
``perfsuite.cluster.wire``. The repeats run through the same loop as the
in-process recorder's (``perfsuite.measure.repeats``), on the actor's node:
the machine probe around each repeat, the CPU meter, a disturbed repeat
re-run once the node is quiet again, and the reason the rest is noisy
(``busy_shares``, ``noisy``), which the controller's verdict reads.
"""

from __future__ import annotations

import dataclasses
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
        """A test's warm-ups and repeats on this node, through the one repeat loop (``measure.repeats``)."""
        from perfsuite.adapters.protocol import check_serves_follow_ups
        from perfsuite.measure.repeats import EngineRepeats, measure_engine, runs_in_process

        request = wire.loads(wire.MeasureRequest, text)
        engine = self._engine(request.engine)
        requests, backend = list(request.requests), self._backend
        check_serves_follow_ups(engine, requests)  # the controller's stand-in cannot know what this engine does
        repeats = EngineRepeats(engine, requests, request.max_concurrency, request.warmup_runs, request.repeats)
        timed = measure_engine(repeats, backend.device, backend.probe, request.busy_threshold).summarised()
        in_process = runs_in_process(engine)
        return wire.dumps(
            wire.MeasureResult(
                test_id=request.test_id,
                node=self._node,
                environment=self._environment,
                runs=timed.runs,
                probes=timed.probes,
                busy_shares=timed.busy_shares,
                noisy=timed.noisy,
                device_memory=timed.device_memory,
                runs_in_process=in_process,
            )
        )

    def measure_capacity(self, text: str) -> str:
        """A capacity test's every run on this node: warm-ups, the start, then the capacity loop of ``measure.repeats``."""
        from perfsuite.adapters.protocol import check_serves_follow_ups
        from perfsuite.measure.capacity import CapacityError
        from perfsuite.measure.repeats import BracketingProbe, MachineMeter, search_capacity

        request = wire.loads(wire.CapacityRequest, text)
        engine = self._engine(request.engine)
        runs = self._capacity_runs(engine, request)
        check_serves_follow_ups(engine, request.requests)
        in_process = getattr(engine, "runs_in_process", True)
        found = wire.CapacityResult(
            request.test_id,
            self._node,
            self._environment,
            runs.prepare(request.warmup_runs),
            runs_in_process=in_process,
        )
        probes = BracketingProbe(self._backend.probe, self._backend.device)
        meter = MachineMeter("cpu", reads_cpu=True, in_process=in_process)  # the CPU only: no device peak is kept
        try:
            searches, timed = search_capacity(runs, request.repeats, probes, meter, request.busy_threshold)
        except CapacityError as error:  # the test fails: no search of it is kept
            return wire.dumps(dataclasses.replace(found, no_capacity=str(error)))
        repeats = timed.summarised()
        return wire.dumps(
            dataclasses.replace(
                found,
                searches=searches,
                at_capacity=repeats.runs,
                probes=repeats.probes,
                busy_shares=repeats.busy_shares,
                noisy=repeats.noisy,
            )
        )

    def _capacity_runs(self, engine, request: wire.CapacityRequest):
        from perfsuite.measure.capacity_runs import CapacityRuns, scaled_to
        from perfsuite.measure.timing import timed_run

        device, requests = self._backend.device, request.requests

        def run(sent, max_concurrency):
            return timed_run(engine, sent, device, max_concurrency=max_concurrency)

        return CapacityRuns(
            run, lambda rate: scaled_to(requests, rate), request.slo, request.steady_state, request.choices
        )

    def _engine(self, spec: EngineSpec):
        if spec not in self._engines:
            self._engines[spec] = spec.build(self._backend)
        return self._engines[spec]


def this_node() -> wire.NodeInfo:
    import ray

    context = ray.get_runtime_context()
    return wire.NodeInfo(context.get_node_id(), socket.gethostname(), ray.util.get_node_ip_address())
