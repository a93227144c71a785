"""One ``pytest --perf`` session's state: its results so far, the baselines it reads and saves, results.json.

What a test's repeats add up to is ``measure.summaries``'s; how a test is
judged, ``judge.judge``'s (the same for ``perfsuite compare``); the session
decides only what each test is judged against and when.

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
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, overload

from perfsuite.codec import decode, encode
from perfsuite.judge.baselines import Baseline, BaselineError, BaselineStore
from perfsuite.judge.catalogue import ALL_METRICS, CAPACITY_METRICS, METRICS, UTILIZATION_METRICS
from perfsuite.judge.instructions import InstructionBaselineStore, InstructionResult, judge_instructions
from perfsuite.judge.judge import (
    FamilyPlan,
    Reference,
    adjust_family,
    adjust_interim_by_family,
    describe_policy,
    describe_probe,
    judge,
    judge_paired,
    not_compared,
)
from perfsuite.judge.paired import pairs_with_room_for_disagreement, plan_paired_power
from perfsuite.judge.power import PowerPlan, plan_power
from perfsuite.judge.results import (
    CapacityRecord,
    DeterminismResult,
    Measurement,
    ReferenceSide,
    Results,
    TestResult,
    UniqueCompletions,
    write_results,
)
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import Direction
from perfsuite.judge.tally import OTHER_CONFIGURATION, OTHER_ENVIRONMENT, Tally, skip_reason, tally
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json
from perfsuite.measure.instructions import InstructionCount
from perfsuite.measure.peaks import MachinePeaks
from perfsuite.measure.summaries import Measured, Repeats, SizingParameters, summarise
from perfsuite.plugin.measurers import LocalMeasurer, Measurer
from perfsuite.plugin.options import PerfOptions

if TYPE_CHECKING:
    from perfsuite.cluster.client_pool import ClientShards
    from perfsuite.cluster.pool import RayPool
    from perfsuite.history.head import HeadCheck
    from perfsuite.plugin.against import Against

__all__ = [
    "SERVER_DECODE_MODE",
    "SERVER_PRECISION",
    "CapacityEntry",
    "DeterminismEntry",
    "Entry",
    "PairedEntry",
    "PerfSession",
    "Repeats",
    "TimedEntry",
]

# A server in another process: its precision is its own (no endpoint reports it), its decode path too.
SERVER_PRECISION = "unknown (server-side)"
SERVER_DECODE_MODE = "server"

UNLABELLED_SERVER = (
    "a server was measured without --perf-server-label: its baselines are known only by the served model "
    "and its length, so another server build or machine serving that model would be compared with them; "
    "name it, e.g. --perf-server-label vllm-0.32-cpu"
)


@dataclass(frozen=True, slots=True)
class TimedEntry:
    """A test's timed repeats, to be summarised and judged against its baseline."""

    test_id: str
    repeats: Repeats
    parameters: SizingParameters
    configuration: RunConfiguration
    arrival_rate: float | None = None
    environment: Environment | ServerEnvironment | None = None  # None: this machine's
    node: str | None = None  # --perf-ray: the node that measured it


@dataclass(frozen=True, slots=True)
class CapacityEntry:
    """A capacity test's searches: ``measured`` carries the capacities as samples, ``capacity`` what was found."""

    test_id: str
    measured: Measured
    capacity: CapacityRecord
    parameters: SizingParameters
    configuration: RunConfiguration
    environment: Environment | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class PairedEntry:
    """Both sides of an A/B test, summarised: side B (current) judged against side A (reference)."""

    test_id: str
    current: Measured
    reference: Measured
    pair_order: tuple[str, ...]
    parameters: SizingParameters
    configuration: RunConfiguration
    arrival_rate: float | None = None
    num_threads: int | None = None
    environment: Environment | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class DeterminismEntry:
    """A test's unique completions over N runs: kept for results.json and the report, judged against nothing."""

    test_id: str
    engine: str
    completions: UniqueCompletions


Entry = TimedEntry | CapacityEntry | PairedEntry | DeterminismEntry


@dataclass
class PerfSession:
    """The session's state: its options, this machine, the results so far and what to tell the user."""

    options: PerfOptions
    rootdir: Path
    environment: Environment | None = None
    peaks: MachinePeaks | None = None  # this machine's roofs, measured once (MFU and MBU divide by them)
    commit: str | None = None
    num_planned_tests: int = 0
    num_self_skipped_tests: int = 0  # planned tests that skipped themselves before recording a result
    results: list[TestResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    late_regressions: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)  # tests that failed before their result was recorded, and why
    determinism: list[DeterminismResult] = field(default_factory=list)  # unique completions, recorded, never judged
    instructions: list[InstructionResult] = field(default_factory=list)  # --perf-instructions: judged by a threshold
    against: Against | None = None  # --perf-against: the reference tree and the two workers
    cluster: RayPool | None = None  # --perf-ray: the actors that measure on the cluster's nodes
    client_shards: ClientShards | None = None  # --perf-client-shards N: openai-http's load generator on the cluster
    measurer: Measurer = field(default_factory=LocalMeasurer)  # how this session's mode measures (plugin.measurers)
    finished: Results | None = None  # the document finish() made: results.json's, and what the history gets
    head_check: HeadCheck | None = None  # change points at the head of the run history, once finished
    earlier_sessions: list[Results] = field(default_factory=list)  # the run history before this session, once finished

    @property
    def store(self) -> BaselineStore:
        return BaselineStore(self.options.baseline_dir)

    @property
    def compared_metrics(self) -> dict[str, Direction]:
        return ALL_METRICS if self.options.slo is not None else METRICS

    @property
    def judged_metrics(self) -> dict[str, Direction]:
        """The compared metrics, and MFU's and MBU's rates wherever both sides counted the engine's work."""
        return {**self.compared_metrics, **UTILIZATION_METRICS}

    @property
    def num_planned_comparisons(self) -> int:
        """The headline family's planned comparisons (``judge.judge`` says why MFU and MBU are a family apart)."""
        return self.family_plan.headline

    @property
    def family_plan(self) -> FamilyPlan:
        return FamilyPlan.of_tests(self.num_planned_tests, len(self.compared_metrics))

    @property
    def slo_label(self) -> str | None:
        return self.options.slo.label if self.options.slo else None

    @property
    def repeats(self) -> int:
        """Timed repeats per test; A/B pairs, unless given, enough that a few pairs against a regression are survivable."""
        options = self.options
        if options.against is None or options.repeats_given:
            return options.repeats
        needed = pairs_with_room_for_disagreement(self.num_planned_comparisons, options.policy.alpha)
        return max(options.repeats, needed or options.repeats)

    def plan_power(self) -> PowerPlan:
        """Can a lone regression be flagged at all in a session of this size?"""
        repeats, alpha = self.repeats, self.options.policy.alpha
        if self.options.against is not None:
            return plan_paired_power(self.num_planned_comparisons, repeats, alpha)
        return plan_power(self.num_planned_comparisons, repeats, repeats, alpha)

    @overload
    def record(self, entry: DeterminismEntry) -> DeterminismResult: ...

    @overload
    def record(self, entry: TimedEntry | CapacityEntry | PairedEntry) -> TestResult: ...

    def record(self, entry: Entry) -> TestResult | DeterminismResult:
        """Record one test's result of any kind (``Entry``): judged, saved if asked, kept for results.json.

        Timed repeats are summarised and judged against the test's baseline;
        a capacity test's searches likewise, as one higher-is-better sample
        each; A/B pairs side B against side A, with no baseline; unique
        completions are kept and judged against nothing.
        """
        if isinstance(entry, DeterminismEntry):
            recorded = DeterminismResult(entry.test_id, entry.engine, entry.completions)
            self.determinism.append(recorded)
            return recorded
        if isinstance(entry, PairedEntry):
            result = self._paired(entry)
        elif isinstance(entry, CapacityEntry):
            result = self._judged_and_saved(self._capacity_result(entry), CAPACITY_METRICS)
        else:
            result = self._judged_and_saved(self._timed_result(entry), self.judged_metrics)
        self.results.append(result)
        return result

    @property
    def num_untimed_tests(self) -> int:
        """Tests that measured unique completions or counted instructions and timed nothing: no timed comparison."""
        untimed = {d.test_id for d in self.determinism} | {i.test_id for i in self.instructions}
        return len(untimed - {r.test_id for r in self.results})

    def record_instructions(self, test_id: str, count: InstructionCount) -> InstructionResult:
        """A count of the instruction lane: judged against the stored figure by the threshold, saved if asked.

        Raises ``BaselineError`` for an unreadable stored figure and ``OutputError`` when it cannot be saved.
        """
        store = InstructionBaselineStore(self.options.baseline_dir)
        result = judge_instructions(test_id, count, store.load(test_id), self.options.instructions_threshold)
        if self.options.save_baseline:
            path = store.save(test_id, count)
            result = dataclasses.replace(result, note=f"saved to {_shown_path(path, self.rootdir)}")
        self.instructions.append(result)
        return result

    def _timed_result(self, entry: TimedEntry) -> TestResult:
        """``environment``: the fingerprint the test's baseline lives under; this machine's (the session's) unless
        the engine is a server in another process, or ``--perf-ray`` measured it on ``node``, whose environment it is.
        """
        environment = entry.environment or self.environment
        assert environment is not None, "capture the environment before recording"
        measured = summarise(entry.repeats, self.compared_metrics, self.options.slo, peaks=self.peaks)
        measurement = Measurement.of(measured, entry.parameters, entry.configuration, entry.arrival_rate, environment)
        result = TestResult(entry.test_id, measurement, node=entry.node)
        if isinstance(environment, ServerEnvironment) and environment.label is None:
            self._warn_once(UNLABELLED_SERVER)
        return result

    def _capacity_result(self, entry: CapacityEntry) -> TestResult:
        """A capacity test (``plugin.capacity``): its one sample per search judged like throughput, higher better.

        ``entry.measured`` summarises the runs at each search's capacity; its
        samples carry the capacities under ``CAPACITY`` and the machine probe
        around each search. The SLO is part of the configuration: a baseline
        searched against another SLO is another configuration, not compared.
        """
        environment = entry.environment or self.environment
        assert environment is not None, "capture the environment before recording"
        rate = entry.capacity.requests_per_second
        measurement = Measurement.of(entry.measured, entry.parameters, entry.configuration, rate, environment)
        return TestResult(entry.test_id, measurement, capacity=entry.capacity, node=entry.node)

    def _judged_and_saved(self, result: TestResult, metrics: dict[str, Direction]) -> TestResult:
        noisy = result.measurement.noisy
        if noisy:
            self.warnings.append(f"{result.test_id}: noisy, judges nothing: {noisy}")
        result = self._judge(result, metrics)
        return self._save(result) if self.options.save_baseline else result

    def _paired(self, entry: PairedEntry) -> TestResult:
        """Judge side B's repeats against side A's, measured beside them (``--perf-against``); no baseline.

        ``num_threads``: the workers' intra-op threads for this test, which its
        environment (and so its fingerprint in the run history) records.
        ``environment`` and ``node``: under ``--perf-ray``, the node that ran
        both sides, and its environment (else this machine's).
        """
        assert self.environment is not None and self.against is not None, "start the A/B workers first"
        environment = entry.environment or self.environment
        if entry.num_threads is not None:
            environment = dataclasses.replace(environment, num_threads=entry.num_threads)
            if entry.node is None:  # this machine's cores; a node's other work is in each run's CPU reading
                self._note_fewer_threads(entry.test_id, entry.num_threads)
        current, reference = entry.current, entry.reference
        measurement = Measurement.of(current, entry.parameters, entry.configuration, entry.arrival_rate, environment)
        side = ReferenceSide(reference.samples, reference.timeline, entry.pair_order, entry.num_threads)
        result = judge_paired(
            TestResult(entry.test_id, measurement, reference=side, node=entry.node),
            Reference.of_reference_side(reference, current, self.slo_label),
            status=f"A/B against {self.against.label}",
            policy=self.options.policy,
            plan=self.family_plan,
            metrics=self.judged_metrics,
        )
        return self._bounded(result)

    def _note_fewer_threads(self, test_id: str, num_threads: int) -> None:
        usable = len(os.sched_getaffinity(0))
        if num_threads < usable:
            self._warn_once(
                f"--perf-against: other work held cores of this machine (from {test_id} on), so both sides' workers "
                f"ran with fewer intra-op threads than its {usable} usable cores (each test's count and the CPU "
                "other work used during its runs are in the report); the sides stay comparable, the figures are "
                "slower than on a quiet machine"
            )

    def _bounded(self, result: TestResult) -> TestResult:
        """With the session's not-yet-made comparisons counted as p = 1 (module docstring)."""
        earlier = [c for r in self.results for c in r.judgement.comparisons]
        current = result.judgement.comparisons
        bounded = adjust_interim_by_family(current, earlier, self.family_plan, self.options.policy)
        return result.with_judgement(comparisons=tuple(bounded))

    def _warn_once(self, warning: str) -> None:
        if warning not in self.warnings:
            self.warnings.append(warning)

    def _judge(self, result: TestResult, metrics: dict[str, Direction] | None = None) -> TestResult:
        """Against its baseline, with the session's not-yet-made comparisons counted as p = 1 (module docstring)."""
        measured = result.measurement
        assert measured.environment is not None and measured.configuration is not None, "a recorded measurement"
        baseline = self._load_baseline(result.test_id, measured.environment)
        if baseline is None:
            return self._without_baseline(result)
        if baseline.configuration != measured.configuration:
            differences = baseline.configuration.differences(measured.configuration)
            self.warnings.append(
                f"{result.test_id}: the baseline measured another configuration ({'; '.join(differences)}); "
                "not compared. If the change is intended, re-record it with --perf-save-baseline"
            )
            return not_compared(result, OTHER_CONFIGURATION)
        policy = self.options.policy
        judgement = judge(
            result,
            Reference.of_baseline(baseline),
            status="compared",
            slo=self.slo_label,
            policy=policy,
            plan=self.family_plan,
            metrics=metrics or self.judged_metrics,
        )
        if judgement.goodput_skipped:
            self.warnings.append(
                f"{result.test_id}: the baseline's goodput counts SLO {baseline.slo}, this run's {self.slo_label}; "
                f"goodput not compared (re-record the baseline with --perf-save-baseline --perf-slo {self.slo_label})"
            )
        return self._bounded(judgement.result)

    def _load_baseline(self, test_id: str, environment: Environment | ServerEnvironment) -> Baseline | None:
        try:
            return self.store.load(test_id, environment)
        except BaselineError as error:
            if not self.options.save_baseline:
                raise
            self.warnings.append(f"{error}; --perf-save-baseline replaces it with this run")
            return None

    def _without_baseline(self, result: TestResult) -> TestResult:
        environment = result.measurement.environment
        assert environment is not None, "a recorded measurement has its environment"
        others = self.store.other_fingerprints(result.test_id, environment)
        if not others:
            return result
        label = " (a server's label comes from --perf-server-label)" if result.is_remote else ""
        self.warnings.append(
            f"{result.test_id}: baselines exist only for other environments ({', '.join(others)}); "
            f"not compared. This one is {result.fingerprint}{label}: "
            "record its baseline with --perf-save-baseline (docs/baselines-and-ci.md)"
        )
        return not_compared(result, OTHER_ENVIRONMENT)

    def _save(self, result: TestResult) -> TestResult:
        measured = result.measurement
        if measured.noisy:
            return result.with_judgement(baseline_status=f"not saved: {measured.noisy}")
        assert measured.environment is not None and measured.configuration is not None, "a recorded measurement"
        path = self.store.save(
            Baseline(
                test_id=result.test_id,
                environment=measured.environment,
                configuration=measured.configuration,
                commit=self.commit,
                created_at=_now(),
                samples=measured.samples,
                counters=measured.counters,
                parameters=measured.parameters,
                slo=self.slo_label,
                request_samples=measured.request_samples,
            )
        )
        return result.with_judgement(baseline_status=f"saved to {_shown_path(path, self.rootdir)}")

    def has_recorded(self, test_id: str) -> bool:
        return any(result.test_id == test_id for result in self.results)

    def judged_nothing(self, test_id: str) -> str | None:
        """Why the test ``test_id`` judged none of its comparisons, in one line; None when it judged one, or
        recorded nothing, or the session records baselines (which is what it was asked to do)."""
        if self.options.save_baseline:
            return None
        results = [result for result in self.results if result.test_id == test_id]
        return skip_reason(results, len(self.compared_metrics))

    def tally(self) -> Tally:
        """The session's planned comparisons, less those of tests that skipped themselves, and how many were judged."""
        num_tests = max(0, self.num_planned_tests - self.num_self_skipped_tests - self.num_untimed_tests)
        return tally(self.results, len(self.compared_metrics), num_tests)

    @property
    def fails_strict(self) -> bool:
        """``--perf-strict`` and not every planned comparison judged (a --perf-save-baseline session records)."""
        return self.options.strict and not self.options.save_baseline and not self.tally().all_judged

    def note_unrecorded(self, test_id: str, reason: str) -> None:
        """A test failed before its result was recorded (a corrupt baseline): results.json names it."""
        self.unrecorded.append(f"{test_id}: no result recorded: {reason}")

    @property
    def results_path(self) -> Path:
        return self.options.report_dir / "results.json"

    def finish(self) -> Path | None:
        """Adjust the whole session's p-values together and write results.json; its path, None when not written.

        Also written when no test was recorded but one failed trying: a results.json left
        from an earlier session would pass for this one's.
        """
        self.results = self.adjusted_results()
        if not self.results and not self.unrecorded and not self.determinism and not self.instructions:
            return None
        from perfsuite.plugin.change_points import check_session, history_sessions  # only a --perf session's end pays

        document = self.document()
        history = history_sessions(self.options, document.fingerprint)
        self.earlier_sessions = history.sessions
        self.head_check = check_session(document, history)
        self.finished = dataclasses.replace(document, warnings=(*document.warnings, *self.head_check.warnings))
        write_results(self.results_path, self.finished)
        return self.results_path

    @property
    def failing_change_points(self) -> tuple[str, ...]:
        """New head change points that are regressions, when ``--perf-fail-on-change-point`` makes them fail it.

        A step an earlier session already reported fails nothing again.
        """
        if self.head_check is None or not self.options.fail_on_change_point:
            return ()
        return tuple(change.describe() for change in self.head_check.new_regressions)

    def append_to_history(self) -> str | None:
        """Append the finished session to ``--perf-history``; where it went, or None when there is nothing to keep.

        Every measured session is kept, a ``--perf-save-baseline`` one too: its
        samples are as much a point of the series as any other run's. Raises
        ``perfsuite.history.store.HistoryError`` when the store cannot be opened or written.
        """
        location = self.options.history_store
        if location is None or self.finished is None:
            return None
        from perfsuite.history.store import HistoryStore  # SQLAlchemy: only a --perf session that keeps a history pays

        with HistoryStore.open(location) as store:
            session_id = store.append(self.finished)
        shown = _shown_path(location, self.rootdir) if isinstance(location, Path) else store.location
        return f"session {session_id} in {shown}"

    def adjusted_results(self) -> list[TestResult]:
        """Every result with the session-wide adjustment; what it newly flags goes to ``late_regressions``."""
        final, newly_regressed = adjust_family(self.results, self.options.policy)
        self.late_regressions.extend(newly_regressed)
        return final

    def worker_output(self) -> str:
        """What a pytest-xdist worker hands the controller, which alone adjusts, judges and writes."""
        return json.dumps(
            {
                "environment": dataclasses.asdict(self.environment) if self.environment else None,
                "peaks": encode(self.peaks) if self.peaks else None,
                "commit": self.commit,
                "num_planned_tests": self.num_planned_tests,
                "num_self_skipped_tests": self.num_self_skipped_tests,
                "results": [encode(r) for r in self.results],  # tagged non-finite floats: every value exact
                "warnings": self.warnings,
                "unrecorded": self.unrecorded,
                "determinism": [encode(d) for d in self.determinism],
                "instructions": [encode(i) for i in self.instructions],
            }
        )

    def add_worker_output(self, text: str) -> None:
        data = json.loads(text)
        if data["environment"] is not None and self.environment is None:
            environment = environment_from_json(data["environment"])
            assert isinstance(environment, Environment), "a worker's session environment is its machine's"
            self.environment = environment
        if data.get("peaks") is not None and self.peaks is None:
            self.peaks = decode(MachinePeaks, data["peaks"])
        self.commit = self.commit or data["commit"]
        self.num_planned_tests = max(self.num_planned_tests, data["num_planned_tests"])  # each worker collects all
        self.num_self_skipped_tests += data["num_self_skipped_tests"]  # each worker counts the tests it ran
        self.results.extend(decode(TestResult, r) for r in data["results"])
        self.results.sort(key=lambda r: r.test_id)
        self.warnings.extend(w for w in data["warnings"] if w not in self.warnings)
        self.unrecorded.extend(data["unrecorded"])
        self.determinism.extend(decode(DeterminismResult, d) for d in data.get("determinism", ()))
        self.determinism.sort(key=lambda d: d.test_id)
        self.instructions.extend(decode(InstructionResult, i) for i in data.get("instructions", ()))
        self.instructions.sort(key=lambda i: i.test_id)

    @property
    def shown_environment(self) -> Environment | ServerEnvironment | None:
        """The environment results.json names at its top: the server's when it alone was measured.

        Each test also names its own (a session may measure in-process engines
        and a server side by side).
        """
        servers = {e for r in self.results if isinstance(e := r.measurement.environment, ServerEnvironment)}
        if self.results and len(servers) == 1 and all(r.is_remote for r in self.results):
            return servers.pop()
        return self.environment

    def document(self) -> Results:
        """What results.json holds for this session."""
        options = self.options
        on_cuda = self.environment is not None and self.environment.cuda_version is not None
        return Results(
            created_at=_now(),
            commit=self.commit,
            environment=self.shown_environment,
            servers=tuple(
                dict.fromkeys(e for r in self.results if isinstance(e := r.measurement.environment, ServerEnvironment))
            ),
            profile=options.profile.name,
            repeats=self.repeats,
            decode_mode=options.decode_mode,
            policy=describe_policy(
                options.policy, self.plan_power(), options.busy_threshold, paired=self.against is not None
            ),
            probe=describe_probe(on_cuda),
            slo=self.slo_label,
            tests=tuple(self.results),
            late_regressions=tuple(self.late_regressions),
            warnings=(*self.warnings, *self.unrecorded),
            against=self.against.describe() if self.against is not None else None,
            determinism=tuple(self.determinism) or None,
            instructions=tuple(self.instructions) or None,
            peaks=self.peaks,
        )


def _shown_path(path: Path, rootdir: Path) -> str:
    """Relative to the rootdir where it lies inside it (a baseline directory may lie anywhere)."""
    try:
        return str(path.resolve().relative_to(rootdir.resolve()))
    except ValueError:
        return str(path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
