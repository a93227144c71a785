"""The ``perf`` fixture's object: measure an engine, then assert no regression."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from perfsuite.adapters.protocol import Backend, BatchingEngine
from perfsuite.engine import Request, RunResult
from perfsuite.session import PerfSession, TestResult, sizing_parameters


class PerfRecorder:
    def __init__(self, session: PerfSession, test_id: str, benchmark, backend: Backend) -> None:
        self.session = session
        self.test_id = test_id
        self.benchmark = benchmark
        self.backend = backend
        self.result: TestResult | None = None

    def measure(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        *,
        max_concurrency: int | None = None,
        arrival_rate: float | None = None,
        repeats: int | None = None,
    ) -> TestResult:
        """Warm up (discarded), then time ``repeats`` (default: the profile's) through pytest-benchmark."""
        from perfsuite.measure import timed_run

        options = self.session.options
        repeats = repeats or options.repeats
        for _ in range(options.profile.warmup_runs):
            engine.run(requests, max_concurrency=max_concurrency)
        runs: list[RunResult] = []
        probes: list[float] = []

        def one_run() -> None:
            if self.backend.probe is not None:
                probes.append(self.backend.probe(self.backend.device))
            runs.append(timed_run(engine, requests, self.backend.device, max_concurrency=max_concurrency))

        self.benchmark.pedantic(one_run, rounds=repeats, iterations=1, warmup_rounds=0)
        while len(runs) < repeats:  # --benchmark-disable runs the target only once
            one_run()
        concurrency = max_concurrency or engine.batch_size
        parameters = sizing_parameters(requests, options.model, options.dtype, concurrency)
        self.result = self.session.record(self.test_id, runs, parameters, arrival_rate, probes)
        self.benchmark.extra_info.update(
            {
                "engine": self.result.engine_name,
                "parameters": dataclasses.asdict(self.result.parameters),
                **self.result.summary,
                "counters": self.result.counters,
                "baseline": self.result.baseline_status,
            }
        )
        return self.result

    def assert_no_regression(self) -> None:
        if self.result is None:
            raise RuntimeError("call perf.measure(engine, requests) before perf.assert_no_regression()")
        if self.result.regressions and not self.session.options.save_baseline:
            lines = "\n".join(f"  {c.describe()}" for c in self.result.regressions)
            pytest.fail(f"performance regression in {self.test_id}:\n{lines}", pytrace=False)
