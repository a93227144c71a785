"""One ``pytest --perf`` session: results, baselines, verdicts and results.json.

Significance is corrected across every comparison of the session by the
Benjamini-Hochberg procedure (``perfsuite.judge.stats`` says why). A test must pass
or fail while it runs, before the later p-values exist, so it is judged with
the comparisons made so far and the rest of the m planned ones counted as
p = 1 (m: what the collected perf tests will make). That bound only ever
overstates the final adjusted p, so whatever fails a test is also a
regression of the whole session. At the end of the session the report shows
the exact adjusted p-values; should they flag a regression that the bound
let pass, the session's exit status is set to failed and the summary names
it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.engine.types import Request, RunResult
from perfsuite.measure.metrics import SLO, Distribution, RunMetrics, goodput, run_metrics
from perfsuite.plugin.options import PerfOptions
from perfsuite.judge.power import PowerPlan, minimum_detectable_effect, plan_power
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import (
    Comparison,
    CounterChange,
    Direction,
    Verdict,
    adjust,
    adjust_interim,
    compare,
    compare_counters,
    mark_noisy,
)
from perfsuite.judge.baselines import Baseline, BaselineError, BaselineStore, write_json_atomic
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json

RESULTS_SCHEMA_VERSION = 1

# Per-repeat samples compared against the baseline. Repeats, not requests,
# are the independent units: requests of one run share its conditions.
# Request throughput is reported but not compared: the workload is seeded, so
# it is output throughput times a constant, and comparing both would spend the
# significance budget twice on one signal.
METRICS: dict[str, Direction] = {
    "output_throughput": Direction.HIGHER_IS_BETTER,
    "median_ttft_ms": Direction.LOWER_IS_BETTER,
    "median_tpot_ms": Direction.LOWER_IS_BETTER,
    "median_e2el_ms": Direction.LOWER_IS_BETTER,
}


GOODPUT = "request_goodput"
# Goodput is compared too when the session has an SLO (--perf-slo) and the
# baseline was measured against the same SLO.
ALL_METRICS: dict[str, Direction] = {**METRICS, GOODPUT: Direction.HIGHER_IS_BETTER}

# Seconds of measure.machine_probe around each repeat. A change to what the probe
# times must rename this key (it was "probe_seconds" for the memory part alone, taken
# before the repeat): baselines with the old key then lose their probe
# and are compared as measured, instead of being rescaled by a foreign unit.
PROBE = "probe_bracket_seconds"
# Other work's share of the machine's CPU time during each repeat (perfsuite.measure.contention); stored, never compared.
BUSY_SHARE = "cpu_busy_share"

# A server in another process: its precision is its own (no endpoint reports it), its decode path too.
SERVER_PRECISION = "unknown (server-side)"
SERVER_DECODE_MODE = "server"
NORMALISED = "each repeat rescaled by its machine probe over the baseline's median probe"
RAW_SERVER_FIGURES = (
    "none: a server in another process (runs_in_process = False) may run on another machine, which this "
    "machine's probe says nothing about; its figures are stored and compared as measured"
)


def normalize_to_machine_speed(
    baseline: dict[str, Sequence[float]], current: dict[str, Sequence[float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Put every repeat, baseline and current alike, on the baseline's typical machine speed.

    Each repeat carries the machine probe taken around it (the geometric mean
    of the readings just before and just after it). A repeat whose
    probe took k times the baseline's median probe ran on a machine k times
    slower: its throughput is multiplied and its latencies divided by k.
    Repeat by repeat rather than by one factor per side, because this VM's
    speed changes within seconds: on the ci workload it took the spread of
    repeats from 13% to 7% (bench/calibrate.py), and bench/probe_drift.py
    found a probe after the repeat as well as before it cuts what is left of a
    decode step's drift by a fifth. Without probes on both
    sides, samples pass as they are.
    """
    base = {name: list(values) for name, values in baseline.items()}
    cur = {name: list(values) for name, values in current.items()}
    if not base.get(PROBE) or not cur.get(PROBE):
        return base, cur
    reference = statistics.median(base[PROBE])
    for side in (base, cur):
        slowdowns = [probe / reference for probe in side[PROBE]]
        for name, direction in ALL_METRICS.items():
            if name in side and len(side[name]) == len(slowdowns):
                side[name] = [
                    value * k if direction is Direction.HIGHER_IS_BETTER else value / k
                    for value, k in zip(side[name], slowdowns)
                ]
    return base, cur


@dataclass(frozen=True, slots=True)
class SizingParameters:
    """The six numbers a person sizing a deployment asks for first."""

    model: str
    precision: str
    input_length: float  # mean prompt tokens
    output_length: float  # mean requested new tokens
    concurrency: int  # batch slots, or clients in a closed loop
    tensor_parallelism: int = 1


@dataclass(frozen=True, slots=True)
class Repeats:
    """A test's timed repeats and what was measured around each of them."""

    runs: tuple[RunResult, ...]
    probes: tuple[float, ...] = ()  # machine probe seconds around each repeat (before and after, geometric mean)
    busy_shares: tuple[float, ...] = ()  # other work's share of the machine's CPU during each repeat
    noisy: str | None = None  # why these repeats cannot support a verdict (perfsuite.measure.contention)


@dataclass(frozen=True, slots=True)
class TestResult:
    test_id: str
    engine_name: str
    parameters: SizingParameters
    arrival_rate: float | None
    samples: dict[str, tuple[float, ...]]
    counters: dict[str, int]
    summary: dict[str, float]  # vLLM-style keys over every request of every repeat
    baseline_status: str
    configuration: RunConfiguration | None = None
    noisy: str | None = None
    request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per request, all repeats
    timeline: dict[str, Any] = field(default_factory=dict)  # one timed run, for the report
    baseline_request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    comparisons: tuple[Comparison, ...] = ()
    counter_changes: tuple[CounterChange, ...] = ()
    environment: Environment | ServerEnvironment | None = None  # the fingerprint its baseline lives under

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict is Verdict.REGRESSED]

    @property
    def is_remote(self) -> bool:
        """Served by another process: stored under the server's fingerprint, never probe-normalised."""
        return isinstance(self.environment, ServerEnvironment)


def repeat_samples(metrics: RunMetrics, slo: SLO | None = None) -> dict[str, float]:
    samples = {
        "output_throughput": metrics.output_throughput,
        "request_throughput": metrics.request_throughput,
        "median_ttft_ms": 1e3 * metrics.ttft.median,
        "median_tpot_ms": 1e3 * metrics.tpot.median,
        "median_e2el_ms": 1e3 * metrics.e2el.median,
    }
    if slo is not None:
        samples[GOODPUT] = goodput(metrics, slo)
    return samples


def vllm_summary(runs: Sequence[RunMetrics], slo: SLO | None = None) -> dict[str, float]:
    """vLLM's benchmark keys, pooled over the requests of every repeat."""
    summary: dict[str, float] = {
        "request_throughput": statistics.fmean(r.request_throughput for r in runs),
        "output_throughput": statistics.fmean(r.output_throughput for r in runs),
        "completed": sum(r.num_completed for r in runs),
        "total_output_tokens": sum(r.num_output_tokens for r in runs),
    }
    if slo is not None:
        summary[GOODPUT] = statistics.fmean(goodput(r, slo) for r in runs)
    pooled = {
        "ttft": [m.ttft for r in runs for m in r.requests if m.ttft is not None],
        "tpot": [m.tpot for r in runs for m in r.requests if m.tpot is not None],
        "itl": [gap for r in runs for m in r.requests for gap in m.itls],
        "e2el": [m.e2e for r in runs for m in r.requests if m.e2e is not None],
    }
    for name, values in pooled.items():
        distribution = Distribution.of(values)
        summary[f"mean_{name}_ms"] = 1e3 * distribution.mean
        summary[f"median_{name}_ms"] = 1e3 * distribution.median
        summary[f"std_{name}_ms"] = 1e3 * distribution.std
        summary[f"p90_{name}_ms"] = 1e3 * distribution.p90
        summary[f"p99_{name}_ms"] = 1e3 * distribution.p99
    return summary


def per_request_samples(runs: Sequence[RunMetrics]) -> dict[str, tuple[float, ...]]:
    """TTFT, TPOT and E2E of every request of every repeat, in ms (for distributions)."""
    requests = [m for r in runs for m in r.requests]
    return {
        "ttft_ms": tuple(1e3 * m.ttft for m in requests if m.ttft is not None),
        "tpot_ms": tuple(1e3 * m.tpot for m in requests if m.tpot is not None),
        "e2el_ms": tuple(1e3 * m.e2e for m in requests if m.e2e is not None),
    }


def timeline_of(run: RunResult) -> dict[str, Any]:
    """Which request held which slot at every step, and the queue, relative to the run's start."""
    t0 = run.start_time
    return {
        "duration": run.duration,
        "num_slots": 1 + max((c.slot for step in run.steps for c in step.chunks), default=0),
        "steps": [
            {
                "start": step.start_time - t0,
                "end": step.end_time - t0,
                "waiting": step.num_waiting,
                "chunks": [[c.slot, c.request_id, c.num_tokens, c.is_prefill, c.is_padding] for c in step.chunks],
            }
            for step in run.steps
        ],
        "requests": [
            {
                "id": r.request_id,
                "arrival": r.arrival_time - t0,
                "first_token": r.token_times[0] - t0 if r.token_times else None,
                "finished": r.finished_time - t0 if r.finished_time is not None else None,
            }
            for r in run.records
        ],
    }


def exact_counter_changes(
    baseline: dict[str, int], current: dict[str, int], arrival_rate: float | None
) -> list[CounterChange]:
    """Counter changes, where counters are exact.

    With wall-clock arrivals the number of steps depends on the machine's
    speed, so those runs' counters are not compared.
    """
    return [] if arrival_rate else compare_counters(baseline, current)


def counters_of(result: RunResult) -> dict[str, int]:
    return dataclasses.asdict(result.counters)


def sizing_parameters(
    requests: Sequence[Request], model: str, precision: str, concurrency: int
) -> SizingParameters:
    return SizingParameters(
        model=model,
        precision=precision,
        input_length=statistics.fmean(r.num_prompt_tokens for r in requests),
        output_length=statistics.fmean(r.sampling_params.max_new_tokens for r in requests),
        concurrency=concurrency,
    )


@dataclass
class PerfSession:
    options: PerfOptions
    rootdir: Path
    environment: Environment | None = None
    commit: str | None = None
    num_planned_tests: int = 0
    results: list[TestResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    late_regressions: list[str] = field(default_factory=list)

    @property
    def store(self) -> BaselineStore:
        return BaselineStore(self.options.baseline_dir)

    @property
    def compared_metrics(self) -> dict[str, Direction]:
        return ALL_METRICS if self.options.slo is not None else METRICS

    @property
    def num_planned_comparisons(self) -> int:
        return max(1, self.num_planned_tests * len(self.compared_metrics))

    def plan_power(self) -> PowerPlan:
        """Can a lone regression be flagged at all in a session of this size?"""
        repeats = self.options.repeats
        return plan_power(self.num_planned_comparisons, repeats, repeats, self.options.policy.alpha)

    def record(
        self,
        test_id: str,
        repeats: Repeats,
        parameters: SizingParameters,
        configuration: RunConfiguration,
        arrival_rate: float | None = None,
        environment: Environment | ServerEnvironment | None = None,
    ) -> TestResult:
        """Summarise a test's timed repeats, judge them against its baseline, and save it if asked.

        ``environment``: the fingerprint the test's baseline lives under; this
        machine's (the session's) unless the engine is a server in another process.
        """
        environment = environment or self.environment
        assert environment is not None, "capture the environment before recording"
        result = dataclasses.replace(
            self._summarise(test_id, repeats, parameters, configuration, arrival_rate), environment=environment
        )
        if result.is_remote and result.environment.label is None:
            self._warn_once(UNLABELLED_SERVER)
        if result.noisy:
            self.warnings.append(f"{test_id}: noisy, judges nothing: {result.noisy}")
        result = self._judge(result)
        if self.options.save_baseline:
            result = self._save(result)
        self.results.append(result)
        return result

    def _summarise(
        self,
        test_id: str,
        repeats: Repeats,
        parameters: SizingParameters,
        configuration: RunConfiguration,
        arrival_rate: float | None,
    ) -> TestResult:
        slo = self.options.slo
        metrics = [run_metrics(run) for run in repeats.runs]
        per_repeat = [repeat_samples(m, slo) for m in metrics]
        samples = {name: tuple(s[name] for s in per_repeat) for name in self.compared_metrics}
        # A metric that is undefined in some repeat (TPOT when every request
        # made one token) has nothing to compare: dropped, not stored as NaN.
        samples = {name: values for name, values in samples.items() if all(map(math.isfinite, values))}
        if repeats.probes:
            samples[PROBE] = tuple(repeats.probes)
        if repeats.busy_shares:
            samples[BUSY_SHARE] = tuple(repeats.busy_shares)
        return TestResult(
            test_id=test_id,
            engine_name=repeats.runs[-1].engine_name,
            parameters=parameters,
            arrival_rate=arrival_rate,
            samples=samples,
            counters=counters_of(repeats.runs[-1]),
            summary=vllm_summary(metrics, slo),
            baseline_status="no baseline",
            configuration=configuration,
            noisy=repeats.noisy,
            request_samples={k: v for k, v in per_request_samples(metrics).items() if v},
            timeline=timeline_of(repeats.runs[-1]),
        )

    def _warn_once(self, warning: str) -> None:
        if warning not in self.warnings:
            self.warnings.append(warning)

    def _save(self, result: TestResult) -> TestResult:
        if result.noisy:
            return dataclasses.replace(result, baseline_status=f"not saved: {result.noisy}")
        slo = self.options.slo
        path = self.store.save(
            Baseline(
                test_id=result.test_id,
                environment=result.environment,
                configuration=result.configuration,
                commit=self.commit,
                created_at=_now(),
                samples=result.samples,
                counters=result.counters,
                parameters={**dataclasses.asdict(result.parameters), "slo": slo.label if slo else None},
                request_samples=result.request_samples,
            )
        )
        return dataclasses.replace(result, baseline_status=f"saved to {_shown_path(path, self.rootdir)}")

    def _load_baseline(self, test_id: str, environment: Environment | ServerEnvironment) -> Baseline | None:
        try:
            return self.store.load(test_id, environment)
        except BaselineError as error:
            if not self.options.save_baseline:
                raise
            self.warnings.append(f"{error}; --perf-save-baseline replaces it with this run")
            return None

    def _judge(self, result: TestResult) -> TestResult:
        baseline = self._load_baseline(result.test_id, result.environment)
        if baseline is None:
            return self._without_baseline(result)
        if baseline.configuration != result.configuration:
            differences = baseline.configuration.differences(result.configuration)
            self.warnings.append(
                f"{result.test_id}: the baseline measured another configuration ({'; '.join(differences)}); "
                "not compared. If the change is intended, re-record it with --perf-save-baseline"
            )
            return dataclasses.replace(result, baseline_status="other configuration")
        comparisons = self._compare(result, baseline)
        earlier = [c for r in self.results for c in r.comparisons]
        bounded = adjust_interim(comparisons, earlier, self.num_planned_comparisons, self.options.policy)
        return dataclasses.replace(
            result,
            baseline_status="compared",
            baseline_request_samples=baseline.request_samples,
            comparisons=tuple(bounded),
            counter_changes=tuple(exact_counter_changes(baseline.counters, result.counters, result.arrival_rate)),
        )

    def _without_baseline(self, result: TestResult) -> TestResult:
        others = self.store.other_fingerprints(result.test_id, result.environment)
        if not others:
            return result
        label = " (a server's label comes from --perf-server-label)" if result.is_remote else ""
        self.warnings.append(
            f"{result.test_id}: baselines exist only for other environments ({', '.join(others)}); "
            f"not compared. This one is {result.environment.fingerprint()}{label}: "
            "record its baseline with --perf-save-baseline (README, 'Baselines')"
        )
        return dataclasses.replace(result, baseline_status="other environment only")

    def _compare(self, result: TestResult, baseline: Baseline) -> list[Comparison]:
        policy = self.options.policy
        base, current = normalize_to_machine_speed(baseline.samples, result.samples)
        slo = self.options.slo.label if self.options.slo else None
        if GOODPUT in base and GOODPUT in current and baseline.parameters.get("slo") != slo:
            self.warnings.append(
                f"{result.test_id}: the baseline's goodput counts SLO {baseline.parameters.get('slo')}, this run's "
                f"{slo}; goodput not compared (re-record the baseline with --perf-save-baseline --perf-slo {slo})"
            )
            del base[GOODPUT]
        lone_alpha = policy.alpha / self.num_planned_comparisons
        comparisons = []
        for name, direction in self.compared_metrics.items():
            if name not in base or name not in current:
                continue
            comparison = dataclasses.replace(
                compare(name, base[name], current[name], direction, policy),
                min_detectable_effect=minimum_detectable_effect(base[name], direction, lone_alpha, policy.min_effect),
            )
            comparisons.append(mark_noisy(comparison) if result.noisy else comparison)
        return comparisons

    def finish(self) -> None:
        """Adjust the whole session's p-values together and write results.json."""
        self.results = self.adjusted_results()
        if self.results:
            write_json_atomic(self.options.report_dir / "results.json", self.results_json())

    def adjusted_results(self) -> list[TestResult]:
        """Every result with the session-wide adjustment; what it newly flags goes to ``late_regressions``."""
        everything = [c for r in self.results for c in r.comparisons]
        adjusted = iter(adjust(everything, self.options.policy))
        final = []
        for result in self.results:
            comparisons = tuple(next(adjusted) for _ in result.comparisons)
            for before, after in zip(result.comparisons, comparisons):
                if after.verdict is Verdict.REGRESSED and before.verdict is not Verdict.REGRESSED:
                    self.late_regressions.append(f"{result.test_id}: {after.describe()}")
            final.append(dataclasses.replace(result, comparisons=comparisons))
        return final

    def worker_output(self) -> str:
        """What a pytest-xdist worker hands the controller, which alone adjusts, judges and writes."""
        return json.dumps(
            {
                "environment": dataclasses.asdict(self.environment) if self.environment else None,
                "commit": self.commit,
                "num_planned_tests": self.num_planned_tests,
                "results": [result_json(r) for r in self.results],
                "warnings": self.warnings,
            }
        )

    def add_worker_output(self, text: str) -> None:
        data = json.loads(text)
        if data["environment"] is not None and self.environment is None:
            self.environment = Environment(**data["environment"])
        self.commit = self.commit or data["commit"]
        self.num_planned_tests = max(self.num_planned_tests, data["num_planned_tests"])
        self.results.extend(result_from_json(r) for r in data["results"])
        self.results.sort(key=lambda r: r.test_id)
        self.warnings.extend(w for w in data["warnings"] if w not in self.warnings)

    @property
    def shown_environment(self) -> Environment | ServerEnvironment | None:
        """The environment results.json names at its top: the server's when it alone was measured.

        Each test also names its own (a session may measure in-process engines
        and a server side by side).
        """
        servers = {r.environment for r in self.results if r.is_remote}
        if self.results and len(servers) == 1 and all(r.is_remote for r in self.results):
            return servers.pop()
        return self.environment

    def results_json(self) -> dict[str, Any]:
        plan = self.plan_power()
        shown = self.shown_environment
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "created_at": _now(),
            "commit": self.commit,
            "environment": dataclasses.asdict(shown) if shown else None,
            "fingerprint": shown.fingerprint() if shown else None,
            "servers": _servers_json(self.results),
            "profile": self.options.profile.name,
            "repeats": self.options.repeats,
            "decode_mode": self.options.decode_mode,
            "policy": {
                "alpha": self.options.policy.alpha,
                "min_effect": self.options.policy.min_effect,
                "test": "one-sided Mann-Whitney U on per-repeat samples",
                "correction": "benjamini-hochberg",
                "normalization": f"in-process engines: {NORMALISED}; servers in another process: {RAW_SERVER_FIGURES}",
                "num_planned_comparisons": plan.num_comparisons,
                "smallest_p": plan.smallest_p,
                "max_comparisons_for_lone_regression": plan.max_comparisons,
                "min_detectable_effect": MDE_METHOD,
                "noisy": f"a test is noisy when other work used more than {self.options.busy_threshold:.0%} "
                "of the machine's CPU during a repeat; its comparisons are shown but judge nothing",
            },
            "probe": probe_description(self.environment),
            "slo": self.options.slo.label if self.options.slo else None,
            "tests": [result_json(r) for r in self.results],
            "late_regressions": list(self.late_regressions),
            "warnings": list(self.warnings),
        }


MDE_METHOD = (
    "per metric, the smallest slowdown that, applied to the baseline's own (probe-normalised) samples, "
    "a lone regression of this session would be flagged for: one-sided Mann-Whitney p below alpha over "
    "the session's planned comparisons, and at least the minimum effect"
)

CPU_PROBE = (
    "geometric mean of two parts, in seconds per iteration (20 each, wall clock): an (8 x 512) by (512 x 32768) "
    "float32 matmul (memory-bound) and a (256 x 1024) by (1024 x 1024) float32 matmul (compute-bound); "
    "per repeat, the geometric mean of the probes taken just before and just after it"
)
CUDA_PROBE = (
    "geometric mean of two parts, in seconds per iteration (20 each, CUDA events): a 512 MiB device-to-device "
    "copy (bandwidth-bound) and a 4096-square bfloat16 matmul (compute-bound); per repeat, the geometric mean "
    "of the probes taken just before and just after it"
)


UNLABELLED_SERVER = (
    "a server was measured without --perf-server-label: its baselines are known only by the served model "
    "and its length, so another server build or machine serving that model would be compared with them; "
    "name it, e.g. --perf-server-label vllm-0.32-cpu"
)


def probe_description(environment: Environment | ServerEnvironment | None) -> dict[str, str]:
    on_cuda = isinstance(environment, Environment) and environment.cuda_version is not None
    return {
        "key": PROBE,
        "unit": "seconds",
        "measures": CUDA_PROBE if on_cuda else CPU_PROBE,
        "applies_to": "tests of engines that run in this process; a server in another process is not "
        "probed and its figures are not rescaled (each test's 'normalization' says which)",
    }


def _servers_json(results: Sequence[TestResult]) -> list[dict[str, Any]]:
    """Each server measured in the session, once, with the fingerprint its baselines live under."""
    servers = dict.fromkeys(r.environment for r in results if r.is_remote)
    return [{**dataclasses.asdict(server), "fingerprint": server.fingerprint()} for server in servers]


def result_json(result: TestResult) -> dict[str, Any]:
    return {
        "test_id": result.test_id,
        "engine": result.engine_name,
        "parameters": dataclasses.asdict(result.parameters),
        "configuration": result.configuration.to_json() if result.configuration else None,
        "arrival_rate": result.arrival_rate,
        **result.summary,
        "summary_keys": sorted(result.summary),
        "samples": {k: list(v) for k, v in result.samples.items()},
        "request_samples": {k: list(v) for k, v in result.request_samples.items()},
        "baseline_request_samples": {k: list(v) for k, v in result.baseline_request_samples.items()},
        "timeline": result.timeline,
        "counters": result.counters,
        "baseline": result.baseline_status,
        "noisy": result.noisy,
        "comparisons": [comparison_json(c) for c in result.comparisons],
        "counter_changes": [dataclasses.asdict(c) for c in result.counter_changes],
        "environment": dataclasses.asdict(result.environment) if result.environment else None,
        "fingerprint": result.environment.fingerprint() if result.environment else None,
        "normalization": RAW_SERVER_FIGURES if result.is_remote else NORMALISED,
    }


def result_from_json(data: dict[str, Any]) -> TestResult:
    """The inverse of ``result_json`` (a pytest-xdist worker's results reach the controller this way)."""
    return TestResult(
        test_id=data["test_id"],
        engine_name=data["engine"],
        parameters=SizingParameters(**data["parameters"]),
        arrival_rate=data["arrival_rate"],
        samples={k: tuple(v) for k, v in data["samples"].items()},
        counters=dict(data["counters"]),
        summary={key: data[key] for key in data["summary_keys"]},
        baseline_status=data["baseline"],
        configuration=RunConfiguration.from_json(data["configuration"]) if data["configuration"] else None,
        noisy=data["noisy"],
        request_samples={k: tuple(v) for k, v in data["request_samples"].items()},
        timeline=data["timeline"],
        baseline_request_samples={k: tuple(v) for k, v in data["baseline_request_samples"].items()},
        comparisons=tuple(comparison_from_json(c) for c in data["comparisons"]),
        counter_changes=tuple(CounterChange(**c) for c in data["counter_changes"]),
        environment=environment_from_json(data["environment"]) if data.get("environment") else None,
    )


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """The shape results.json stores a comparison in."""
    return {
        **dataclasses.asdict(comparison),
        "direction": comparison.direction.value,
        "verdict": comparison.verdict.value,
    }


def comparison_from_json(data: dict[str, Any]) -> Comparison:
    return Comparison(**{**data, "direction": Direction(data["direction"]), "verdict": Verdict(data["verdict"])})


def _shown_path(path: Path, rootdir: Path) -> str:
    """Relative to the rootdir where it lies inside it (a baseline directory may lie anywhere)."""
    try:
        return str(path.resolve().relative_to(rootdir.resolve()))
    except ValueError:
        return str(path)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
