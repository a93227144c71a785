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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.engine.types import RunResult
from perfsuite.measure.metrics import SLO, goodput, run_metrics
from perfsuite.plugin.options import PerfOptions
from perfsuite.judge.power import PowerPlan, minimum_detectable_effect, plan_power
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import (
    Comparison,
    Direction,
    Verdict,
    adjust,
    adjust_interim,
    compare,
    mark_noisy,
)
from perfsuite.judge.baselines import Baseline, BaselineError, BaselineStore, write_json_atomic
from perfsuite.judge.catalogue import (
    ALL_METRICS,
    BUSY_SHARE,
    METRICS,
    NORMALISED,
    PROBE,
    RAW_SERVER_FIGURES,
    exact_counter_changes,
    normalize_to_machine_speed,
)
from perfsuite.judge.results import RESULTS_SCHEMA_VERSION, TestResult, result_from_json, result_json
from perfsuite.measure.summaries import (
    GOODPUT,
    SizingParameters,
    counters_of,
    per_request_samples,
    repeat_samples,
    timeline_of,
    vllm_summary,
)
from perfsuite.measure.environment import Environment, ServerEnvironment


# A server in another process: its precision is its own (no endpoint reports it), its decode path too.
SERVER_PRECISION = "unknown (server-side)"
SERVER_DECODE_MODE = "server"


@dataclass(frozen=True, slots=True)
class Repeats:
    """A test's timed repeats and what was measured around each of them."""

    runs: tuple[RunResult, ...]
    probes: tuple[float, ...] = ()  # machine probe seconds around each repeat (before and after, geometric mean)
    busy_shares: tuple[float, ...] = ()  # other work's share of the machine's CPU during each repeat
    noisy: str | None = None  # why these repeats cannot support a verdict (perfsuite.measure.contention)


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


def _shown_path(path: Path, rootdir: Path) -> str:
    """Relative to the rootdir where it lies inside it (a baseline directory may lie anywhere)."""
    try:
        return str(path.resolve().relative_to(rootdir.resolve()))
    except ValueError:
        return str(path)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
