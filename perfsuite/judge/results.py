"""results.json as typed values: a test's result, a session's results, and the one place they meet JSON.

``Results`` is what a ``pytest --perf`` session wrote and what ``perfsuite
report`` and ``perfsuite compare`` read back: every field below is a frozen
dataclass or a mapping of metric name to samples, from the session to the
HTML report. ``write_results`` and ``read_results`` are the only code that
turns them into JSON and back; the on-disk keys are documented by ``to_json``.
The file is standard JSON (``baselines.write_json_atomic`` refuses NaN and
infinity): a summary figure the run did not define (no TPOT when every output
is one token) is null, and so is a comparison's change or ratio bound that is
unbounded because the baseline's median was 0; both read back as before.

Schema versions: 4 adds the KV cache and device memory: KV counters among
each test's ``counters``, each timeline step's KV use and preemptions, the
run's KV pool, and ``memory`` (``MemoryUse``, written for readers and rebuilt
from the rest on reading). A counter that a file does not hold (one older than
the counter) is *not recorded*: it is read as its default but never compared
(``baselines.counters_from_json``), and a file read and written again still
lacks it. 3 adds what an A/B session (``--perf-against``) measured on
its reference side (``against`` at the top; each test's ``reference_samples``,
``reference_timeline`` and ``pair_order``); 2 stores each timeline step and
request as an object with named fields (1 stored a step's chunks as
positional lists). Versions 1 and 2 are converted on reading, so a history of
older runs keeps its trend.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.engine.types import EngineCounters
from perfsuite.judge.baselines import counters_from_json, recorded_counters, write_json_atomic
from perfsuite.judge.catalogue import NORMALISED, RAW_SERVER_FIGURES
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.samples import measurement_problem
from perfsuite.judge.stats import Comparison, CounterChange, Direction, Verdict
from perfsuite.measure.capacity import CapacityRecord
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json, environment_problem
from perfsuite.measure.send_lag import SendLag
from perfsuite.measure.summaries import (
    Measured,
    MemoryUse,
    RunSummary,
    RunTimeline,
    SizingParameters,
    TimelineChunk,
    TimelineRequest,
    TimelineStep,
    memory_use,
)

__all__ = [  # the timeline and summary types are measure's, named here so the report need not reach below the judge
    "RESULTS_SCHEMA_VERSION", "AgainstDescription", "CapacityRecord", "MemoryUse", "PolicyDescription", "ProbeDescription", "Results",
    "ResultsFileError", "RunSummary", "RunTimeline", "SizingParameters", "TestResult", "TimelineChunk",
    "TimelineRequest", "TimelineStep", "archive_results", "read_history", "read_results", "results_from_json",
    "write_results",
]  # fmt: skip

RESULTS_SCHEMA_VERSION = 4  # 4: KV cache and device memory; 3: A/B sessions; 2: timeline objects with named fields
CONVERTED_VERSIONS = (1, 2, 3)
REWRITE_HINT = "re-create it with `pytest --perf` (it writes reports/results.json)"

# Counters a version 3 file cannot hold; without them its memory figures would read as an empty cache.
KV_COUNTERS = (
    "num_preemptions", "num_recomputed_tokens", "peak_kv_blocks_used", "peak_num_running",
    "kv_blocks_used_step_sum", "kv_tokens_used_step_sum", "kv_token_capacity_step_sum",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TestResult:
    """One perf test of a session: what it measured, and how it was judged."""

    __test__ = False  # a result, not a test class for pytest to collect

    test_id: str
    engine_name: str
    parameters: SizingParameters
    arrival_rate: float | None
    samples: dict[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: EngineCounters
    summary: RunSummary  # vLLM's figures over every request of every repeat
    baseline_status: str
    configuration: RunConfiguration | None = None
    noisy: str | None = None
    request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per request, all repeats
    timeline: RunTimeline | None = None  # one timed run, for the report
    baseline_request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    comparisons: tuple[Comparison, ...] = ()
    counter_changes: tuple[CounterChange, ...] = ()
    environment: Environment | ServerEnvironment | None = None  # the fingerprint its baseline lives under
    # --perf-against: the reference side (A) measured beside this one, pair by pair ("AB" or "BA" each)
    reference_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    reference_timeline: RunTimeline | None = None
    pair_order: tuple[str, ...] = ()
    unrecorded_counters: tuple[str, ...] = ()  # its file predates these counters: defaults, never compared
    baseline_unrecorded_counters: tuple[str, ...] = ()  # what it was compared with lacked these: not compared
    send_lag: SendLag | None = None  # open loop: the load generator's worst repeat; None: closed loop, not recorded
    capacity: CapacityRecord | None = None  # a capacity test's searches (perfsuite/suites/test_capacity.py)

    @classmethod
    def measured(
        cls,
        test_id: str,
        measured: Measured,
        parameters: SizingParameters,
        configuration: RunConfiguration,
        arrival_rate: float | None,
        environment: Environment | ServerEnvironment,
    ) -> TestResult:
        """A result not judged yet."""
        return cls(
            test_id=test_id,
            engine_name=measured.engine_name,
            parameters=parameters,
            arrival_rate=arrival_rate,
            samples=measured.samples,
            counters=measured.counters,
            summary=measured.summary,
            baseline_status="no baseline",
            configuration=configuration,
            noisy=measured.noisy,
            request_samples=measured.request_samples,
            timeline=measured.timeline,
            environment=environment,
            send_lag=measured.send_lag,
        )

    @property
    def memory(self) -> MemoryUse | None:
        """The KV pool and its use (the last repeat), preemptions, and the device's peak; None when not recorded."""
        if any(name in self.unrecorded_counters for name in KV_COUNTERS):
            return None
        return memory_use(self.counters, self.timeline, self.samples)

    @property
    def is_paired(self) -> bool:
        """Measured side by side with a reference tree (``--perf-against``), not against a stored baseline."""
        return bool(self.pair_order)

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict is Verdict.REGRESSED]

    @property
    def is_remote(self) -> bool:
        """Served by another process: stored under the server's fingerprint, never probe-normalised."""
        return isinstance(self.environment, ServerEnvironment)

    @property
    def normalization(self) -> str:
        return RAW_SERVER_FIGURES if self.is_remote else NORMALISED

    def to_json(self) -> dict[str, Any]:
        return {
            "test_id": self.test_id,
            "engine": self.engine_name,
            "parameters": dataclasses.asdict(self.parameters),
            "configuration": self.configuration.to_json() if self.configuration else None,
            "arrival_rate": self.arrival_rate,
            **_nan_as_null(self.summary.vllm_keys()),  # at the top of each test, as vLLM's benchmark writes them
            **self.summary.interval_keys(),  # each percentile's interval beside it (older files: none)
            "samples": _lists(self.samples),
            "request_samples": _lists(self.request_samples),
            "baseline_request_samples": _lists(self.baseline_request_samples),
            "timeline": dataclasses.asdict(self.timeline) if self.timeline else None,
            "counters": recorded_counters(self.counters, self.unrecorded_counters),
            "baseline_unrecorded_counters": list(self.baseline_unrecorded_counters),
            "memory": dataclasses.asdict(memory) if (memory := self.memory) else None,  # not read: rebuilt
            "baseline": self.baseline_status,
            "noisy": self.noisy,
            "comparisons": [_comparison_json(c) for c in self.comparisons],
            "counter_changes": [dataclasses.asdict(c) for c in self.counter_changes],
            "environment": dataclasses.asdict(self.environment) if self.environment else None,
            "fingerprint": self.environment.fingerprint() if self.environment else None,
            "normalization": self.normalization,
            "reference_samples": _lists(self.reference_samples),
            "reference_timeline": dataclasses.asdict(self.reference_timeline) if self.reference_timeline else None,
            "pair_order": list(self.pair_order),
            "send_lag": dataclasses.asdict(self.send_lag) if self.send_lag else None,
            "capacity": self.capacity.to_json() if self.capacity else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestResult:
        counters, unrecorded = counters_from_json(data["counters"])
        return cls(
            test_id=data["test_id"],
            engine_name=data["engine"],
            parameters=SizingParameters(**data["parameters"]),
            arrival_rate=data["arrival_rate"],
            samples=_tuples(data["samples"]),
            counters=counters,
            summary=RunSummary.from_vllm_keys(data),
            baseline_status=data["baseline"],
            configuration=RunConfiguration.from_json(data["configuration"]) if data["configuration"] else None,
            noisy=data["noisy"],
            request_samples=_tuples(data["request_samples"]),
            timeline=_timeline_from_json(data["timeline"]) if data["timeline"] else None,
            baseline_request_samples=_tuples(data["baseline_request_samples"]),
            comparisons=tuple(_comparison_from_json(c) for c in data["comparisons"]),
            counter_changes=tuple(CounterChange(**c) for c in data["counter_changes"]),
            environment=environment_from_json(data["environment"]) if data["environment"] else None,
            reference_samples=_tuples(data["reference_samples"]),
            reference_timeline=_timeline_from_json(data["reference_timeline"]) if data["reference_timeline"] else None,
            pair_order=tuple(data["pair_order"]),
            unrecorded_counters=unrecorded,
            baseline_unrecorded_counters=tuple(data["baseline_unrecorded_counters"]),
            send_lag=SendLag(**data["send_lag"]) if data.get("send_lag") else None,  # older files: not recorded
            capacity=CapacityRecord.from_json(data["capacity"]) if data.get("capacity") else None,  # optional key
        )


@dataclass(frozen=True, slots=True)
class AgainstDescription:
    """An A/B session's reference (``--perf-against REF``): what was measured beside the current tree."""

    ref: str  # as given: origin/main, HEAD~1, a path
    commit: str | None  # what it resolved to (None: a checkout outside git)
    current_commit: str | None  # the current tree's HEAD (its uncommitted changes are measured too)
    order: str  # how the repeats were interleaved


@dataclass(frozen=True, slots=True)
class PolicyDescription:
    """How a session judged: what results.json's readers need to trust or question a verdict."""

    alpha: float
    min_effect: float
    test: str
    correction: str
    normalization: str
    num_planned_comparisons: int
    smallest_p: float
    max_comparisons_for_lone_regression: int
    min_detectable_effect: str
    noisy: str


@dataclass(frozen=True, slots=True)
class ProbeDescription:
    """What the machine probe (``PROBE`` samples) measures, and which tests it rescales."""

    key: str
    unit: str
    measures: str
    applies_to: str


@dataclass(frozen=True, slots=True)
class Results:
    """One session's results.json."""

    created_at: str
    commit: str | None
    environment: Environment | ServerEnvironment | None  # the session's machine, or its one server
    servers: tuple[ServerEnvironment, ...]  # each server measured in another process, once
    profile: str
    repeats: int
    decode_mode: str
    policy: PolicyDescription
    probe: ProbeDescription
    slo: str | None
    tests: tuple[TestResult, ...]
    late_regressions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    against: AgainstDescription | None = None  # an A/B session; None: judged against stored baselines

    @property
    def fingerprint(self) -> str | None:
        return self.environment.fingerprint() if self.environment else None

    def test(self, test_id: str) -> TestResult | None:
        return next((t for t in self.tests if t.test_id == test_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "created_at": self.created_at,
            "commit": self.commit,
            "environment": dataclasses.asdict(self.environment) if self.environment else None,
            "fingerprint": self.fingerprint,
            "servers": [{**dataclasses.asdict(s), "fingerprint": s.fingerprint()} for s in self.servers],
            "profile": self.profile,
            "repeats": self.repeats,
            "decode_mode": self.decode_mode,
            "policy": dataclasses.asdict(self.policy),
            "probe": dataclasses.asdict(self.probe),
            "slo": self.slo,
            "tests": [t.to_json() for t in self.tests],
            "late_regressions": list(self.late_regressions),
            "warnings": list(self.warnings),
            "against": dataclasses.asdict(self.against) if self.against else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Results:
        return cls(
            created_at=data["created_at"],
            commit=data["commit"],
            environment=environment_from_json(data["environment"]) if data["environment"] else None,
            servers=tuple(
                ServerEnvironment(**{k: v for k, v in s.items() if k != "fingerprint"}) for s in data["servers"]
            ),
            profile=data["profile"],
            repeats=data["repeats"],
            decode_mode=data["decode_mode"],
            policy=PolicyDescription(**data["policy"]),
            probe=ProbeDescription(**data["probe"]),
            slo=data["slo"],
            tests=tuple(TestResult.from_json(t) for t in data["tests"]),
            late_regressions=tuple(data["late_regressions"]),
            warnings=tuple(data["warnings"]),
            against=AgainstDescription(**data["against"]) if data["against"] else None,
        )


class ResultsFileError(RuntimeError):
    """A results file that cannot be used; the message names the file and the fix."""


def write_results(path: Path, results: Results) -> None:
    write_json_atomic(path, results.to_json())


def read_results(path: Path) -> Results:
    path = Path(path)
    if not path.is_file():
        raise ResultsFileError(f"{path}: no such file; pass the path of a results.json, or {REWRITE_HINT}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path} is not a readable JSON file ({error}); {REWRITE_HINT}") from error
    return results_from_json(data, str(path))


def results_from_json(data: Any, source: str) -> Results:
    """A results document of any readable schema version, checked and converted; ``source`` names it in errors.

    ``read_results`` reads files through it, and the history store
    (``perfsuite.history``) the documents it holds, so both convert older
    versions alike.
    """
    if not isinstance(data, dict):
        raise ResultsFileError(
            f"{source} is not a perfsuite results file: expected a JSON object, found {type(data).__name__}; "
            f"{REWRITE_HINT}"
        )
    version = data.get("schema_version")
    if version != RESULTS_SCHEMA_VERSION and version not in CONVERTED_VERSIONS:
        readable = ", ".join(map(str, (*CONVERTED_VERSIONS, RESULTS_SCHEMA_VERSION)))
        raise ResultsFileError(
            f"{source} has schema_version {version!r}; this perfsuite reads versions {readable}: {REWRITE_HINT}"
        )
    try:
        data = _converted(data, version)
        problem = _measurements_problem(data)
        if problem is None:
            return Results.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ResultsFileError(
            f"{source} is not a perfsuite results file: a field is missing or malformed ({error!r}); {REWRITE_HINT}"
        ) from error
    raise ResultsFileError(f"{source}: {problem}; {REWRITE_HINT}")


# What a test holds that a comparison or the report reads as samples: each field checked by one rule.
SAMPLE_FIELDS = ("samples", "request_samples", "baseline_request_samples", "reference_samples")


def _measurements_problem(data: Mapping[str, Any]) -> str | None:
    """The first environment, sample list or counter a reader cannot use (``perfsuite.judge.samples``), described."""
    problem = _optional_environment_problem(data["environment"])
    for index, test in enumerate(data["tests"]):
        if problem is not None:
            break
        problem = measurement_problem(test, SAMPLE_FIELDS) or _optional_environment_problem(test["environment"])
        if problem is not None:
            problem = f"tests[{index}] ({test['test_id']!r}): {problem}"
    return problem


def _optional_environment_problem(environment: Any) -> str | None:
    return None if environment is None else environment_problem(environment)


def read_history(directory: Path, newest: int | None = None) -> tuple[list[Results], list[str]]:
    """The stored results in ``directory`` (the ``newest`` by name), and why any is unusable."""
    documents, problems = [], []
    paths = sorted(Path(directory).glob("*.json"))
    for path in paths[-newest:] if newest else paths:
        try:
            documents.append(read_results(path))
        except ResultsFileError as error:
            problems.append(f"{error} (or delete it from the history)")
    return documents, problems


def archive_results(results: Results, history_dir: Path) -> Path:
    """Keep a copy of one run's results under ``history_dir``, named by when it was made."""
    stamp = (results.created_at or "unknown").replace(":", "-")
    path = Path(history_dir) / f"{stamp}.json"
    write_results(path, results)
    return path


def _comparison_json(comparison: Comparison) -> dict[str, Any]:
    unbounded = {name: None for name in _RATIOS if getattr(comparison, name) == math.inf}
    return {
        **dataclasses.asdict(comparison),
        **unbounded,
        "direction": comparison.direction.value,
        "verdict": comparison.verdict.value,
    }


def _comparison_from_json(data: Mapping[str, Any]) -> Comparison:
    unbounded = {name: math.inf for name in _RATIOS if data[name] is None}
    return Comparison(
        **{**data, **unbounded, "direction": Direction(data["direction"]), "verdict": Verdict(data["verdict"])}
    )


# A comparison's change and ratio bounds are unbounded (infinity) when the baseline's median is 0 and the
# current one is not (goodput from none to some). JSON has no infinity, so they are written as null; samples
# are never negative, so nothing else a comparison holds is infinite.
_RATIOS = ("change", "ci_low", "ci_high")


def _nan_as_null(figures: Mapping[str, float]) -> dict[str, float | None]:
    """vLLM's figures with the undefined ones (NaN: no TPOT when every output is one token) as null."""
    return {name: None if isinstance(v, float) and math.isnan(v) else v for name, v in figures.items()}


def _timeline_from_json(data: Mapping[str, Any]) -> RunTimeline:
    return RunTimeline(
        duration=data["duration"],
        num_slots=data["num_slots"],
        steps=tuple(
            TimelineStep(
                start=step["start"],
                end=step["end"],
                num_waiting=step["num_waiting"],
                chunks=tuple(TimelineChunk(**chunk) for chunk in step["chunks"]),
                num_kv_blocks_used=step["num_kv_blocks_used"],
                num_kv_tokens_used=step["num_kv_tokens_used"],
                preempted_request_ids=tuple(step["preempted_request_ids"]),
            )
            for step in data["steps"]
        ),
        requests=tuple(TimelineRequest(**request) for request in data["requests"]),
        num_kv_blocks=data["num_kv_blocks"],
        kv_block_size=data["kv_block_size"],
    )


def _converted(data: Mapping[str, Any], version: int) -> Mapping[str, Any]:
    if version == 1:
        data = _from_version_1(data)
    if version in (1, 2):
        data = _from_version_2(data)
    if version in (1, 2, 3):
        data = _from_version_3(data)
    return data


def _from_version_3(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 3 document as version 4 writes it: no KV figures in its timelines.

    Its counters lack the KV ones, so they read as not recorded; what it
    was compared with is not known, so nothing is said about that side.
    """
    tests = [
        {
            **test,
            "timeline": _timeline_v3(test["timeline"]),
            "reference_timeline": _timeline_v3(test["reference_timeline"]),
            "baseline_unrecorded_counters": [],
        }
        for test in data["tests"]
    ]
    return {**data, "tests": tests}


def _timeline_v3(timeline: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not timeline:
        return None
    no_kv = {"num_kv_blocks_used": 0, "num_kv_tokens_used": 0, "preempted_request_ids": []}
    steps = [{**step, **no_kv} for step in timeline["steps"]]
    return {**timeline, "steps": steps, "num_kv_blocks": None, "kv_block_size": None}


def _from_version_2(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 2 document as version 3 writes it: no A/B session, so nothing on a reference side."""
    tests = [{**test, "reference_samples": {}, "reference_timeline": None, "pair_order": []} for test in data["tests"]]
    return {**data, "tests": tests, "against": None}


def _from_version_1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 document as version 2 writes it: only the timeline's shape changed."""
    return {**data, "tests": [{**test, "timeline": _timeline_v1(test.get("timeline"))} for test in data["tests"]]}


def _timeline_v1(timeline: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not timeline:
        return None
    return {
        "duration": timeline["duration"],
        "num_slots": timeline["num_slots"],
        "steps": [
            {
                "start": step["start"],
                "end": step["end"],
                "num_waiting": step["waiting"],
                "chunks": [dict(zip(_V1_CHUNK_FIELDS, chunk)) for chunk in step["chunks"]],
            }
            for step in timeline["steps"]
        ],
        "requests": [
            {"request_id": r["id"], "arrival": r["arrival"], "first_token": r["first_token"], "finished": r["finished"]}
            for r in timeline["requests"]
        ],
    }


_V1_CHUNK_FIELDS = ("slot", "request_id", "num_tokens", "is_prefill", "is_padding")


def _lists(samples: Mapping[str, tuple[float, ...]]) -> dict[str, list[float]]:
    return {name: list(values) for name, values in samples.items()}


def _tuples(samples: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    return {name: tuple(values) for name, values in samples.items()}
