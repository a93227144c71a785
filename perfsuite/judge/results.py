"""results.json as typed values: a test's result, a session's results, and the one place they meet JSON.

``Results`` is what a ``pytest --perf`` session wrote and what ``perfsuite
report`` and ``perfsuite compare`` read back. A ``TestResult`` is a
composition: its ``Measurement`` (what every mode measures), its
``Judgement`` (how it was compared, and with what), and what only some modes
have: the REF side of an A/B test (``ReferenceSide``) and a capacity test's
searches (``CapacityRecord``). ``write_results`` and ``read_results`` are the
only code that turns them into JSON and back, through the structural codec
(``perfsuite.codec``) that the A/B workers' wire uses too: each dataclass is
an object of its fields, rebuilt by its type hints.

The file is standard JSON (``baselines.write_json_atomic`` refuses NaN and
infinity): a figure the run did not define (no TPOT when every output is one
token) is null and reads back as NaN; an infinite one (a comparison's change
when the baseline's median was 0) is ``{"float": "inf"}``. Beside the codec's
fields each test carries what readers outside perfsuite read (``READER_KEYS``:
vLLM's flat figures, ``memory``, ``fingerprint``, ``normalization``), and the
session its ``fingerprint``; they are written, never read back.

A session whose tests measured unique completions over N runs
(``perf.measure_determinism``) also holds ``determinism``: one
``DeterminismResult`` per such test, each with its derived figures
(``UniqueCompletions.summary``) beside its fields for readers outside
perfsuite. The key is written only when a session recorded one, so every
other file is as version 5 wrote it before and older readers read it.

Schema versions: 5 writes through the codec: each test holds ``measurement``,
``judgement``, ``reference`` (A/B only) and ``capacity`` (capacity tests
only); its summary is an object, its counters all of them with
``unrecorded_counters`` naming those its run did not record. 4 added the KV
cache and device memory: a counter that a file does not hold (one older than
the counter) is *not recorded*: it is read as its default but never compared
(``baselines.counters_from_json``). 3 added what an A/B session
(``--perf-against``) measured on its reference side; 2 stores each timeline
step and request as an object with named fields (1 stored a step's chunks as
positional lists). Versions 1 to 4 are converted on reading, one step each,
so a history of older runs keeps its trend.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.codec import decode, encode
from perfsuite.engine.server_metrics import ServerMetrics, pooled
from perfsuite.engine.types import EngineCounters
from perfsuite.judge.baselines import counters_from_json, write_json_atomic
from perfsuite.judge.catalogue import BUSY_SHARE, NORMALISED, RAW_SERVER_FIGURES
from perfsuite.judge.instructions import InstructionResult
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.samples import measurement_problem
from perfsuite.judge.stats import Comparison, CounterChange, Direction, Verdict
from perfsuite.measure.capacity import CapacityRecord
from perfsuite.measure.determinism import PromptCompletions, UniqueCompletions
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json, environment_problem
from perfsuite.measure.peaks import MachinePeaks
from perfsuite.measure.prefix_cache import (
    CachedPrompts,
    PrefixCacheFigures,
    TtftSplit,
    prefix_cache_figures,
    ttft_split,
)
from perfsuite.measure.send_lag import SendLag
from perfsuite.measure.summaries import (
    GOODPUT,
    LATENCIES,
    PERCENTILES,
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
    "RESULTS_SCHEMA_VERSION",
    "AgainstDescription",
    "CapacityRecord",
    "DeterminismResult",
    "Judgement",
    "Measurement",
    "MemoryUse",
    "PolicyDescription",
    "ProbeDescription",
    "PromptCompletions",
    "ReferenceSide",
    "Results",
    "ResultsFileError",
    "RunSummary",
    "RunTimeline",
    "SizingParameters",
    "TestResult",
    "TimelineChunk",
    "TimelineRequest",
    "TimelineStep",
    "UniqueCompletions",
    "read_results",
    "results_from_json",
    "write_results",
]

RESULTS_SCHEMA_VERSION = 5  # 5: the codec's layout; 4: KV cache and memory; 3: A/B; 2: named timeline fields
CONVERTED_VERSIONS = (1, 2, 3, 4)
REWRITE_HINT = "re-create it with `pytest --perf` (it writes reports/results.json)"

# Counters a version 3 file cannot hold; without them its memory figures would read as an empty cache.
KV_COUNTERS = (
    "num_preemptions",
    "num_recomputed_tokens",
    "peak_kv_blocks_used",
    "peak_num_running",
    "kv_blocks_used_step_sum",
    "kv_tokens_used_step_sum",
    "kv_token_capacity_step_sum",
)


@dataclass(frozen=True, slots=True)
class Measurement:
    """What a test measured, before any judging: the same in every mode."""

    engine_name: str
    parameters: SizingParameters
    arrival_rate: float | None
    samples: dict[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: EngineCounters
    summary: RunSummary  # vLLM's figures over every request of every repeat
    configuration: RunConfiguration | None = None
    noisy: str | None = None  # why these repeats cannot support a verdict
    request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per request, all repeats
    timeline: RunTimeline | None = None  # one timed run, for the report
    environment: Environment | ServerEnvironment | None = None  # the fingerprint its baseline lives under
    unrecorded_counters: tuple[str, ...] = ()  # its file predates these counters: defaults, never compared
    send_lag: SendLag | None = None  # open loop: the load generator's worst repeat; None: closed loop, not recorded
    cached_prompts: CachedPrompts | None = None  # what the requests said of the prefix cache; None: nothing, older
    server_metrics: tuple[ServerMetrics, ...] = ()  # a server's /metrics around each repeat; none: not exposed

    @property
    def pooled_server_metrics(self) -> ServerMetrics | None:
        """Every repeat's server-side figures together; None where the server exposed none."""
        return pooled(self.server_metrics)

    @property
    def busy_shares(self) -> tuple[float, ...]:
        """Other work's share of the machine's CPU during each repeat (none: not read, or a server's)."""
        return tuple(self.samples.get(BUSY_SHARE, ()))

    @classmethod
    def of(
        cls,
        measured: Measured,
        parameters: SizingParameters,
        configuration: RunConfiguration,
        arrival_rate: float | None,
        environment: Environment | ServerEnvironment,
    ) -> Measurement:
        return cls(
            engine_name=measured.engine_name,
            parameters=parameters,
            arrival_rate=arrival_rate,
            samples=measured.samples,
            counters=measured.counters,
            summary=measured.summary,
            configuration=configuration,
            noisy=measured.noisy,
            request_samples=measured.request_samples,
            timeline=measured.timeline,
            environment=environment,
            send_lag=measured.send_lag,
            cached_prompts=measured.cached_prompts,
            server_metrics=measured.server_metrics,
        )


@dataclass(frozen=True, slots=True)
class Judgement:
    """How a test was judged: against a stored baseline, another run, or (A/B) its REF side."""

    baseline_status: str = "no baseline"  # what it was compared with, or why not
    comparisons: tuple[Comparison, ...] = ()
    counter_changes: tuple[CounterChange, ...] = ()
    baseline_request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)
    baseline_unrecorded_counters: tuple[str, ...] = ()  # what it was compared with lacked these: not compared


@dataclass(frozen=True, slots=True)
class ReferenceSide:
    """``--perf-against``: the REF tree measured beside this one, pair by pair."""

    samples: dict[str, tuple[float, ...]]
    timeline: RunTimeline | None
    pair_order: tuple[str, ...]  # "AB" or "BA", each pair
    num_threads: int | None = None  # every worker's intra-op threads, both sides; None: as loaded (not chosen)

    @property
    def busy_shares(self) -> tuple[float, ...]:
        """Other work's share of the machine's CPU during each of this side's runs (none: not read)."""
        return tuple(self.samples.get(BUSY_SHARE, ()))


@dataclass(frozen=True, slots=True)
class TestResult:
    """One perf test of a session: what it measured, how it was judged, and what only some modes have."""

    __test__ = False  # a result, not a test class for pytest to collect

    test_id: str
    measurement: Measurement
    judgement: Judgement = field(default_factory=Judgement)
    reference: ReferenceSide | None = None  # an A/B test's REF side; None: judged against stored baselines
    capacity: CapacityRecord | None = None  # a capacity test's searches (perfsuite/suites/test_capacity.py)
    node: str | None = None  # --perf-ray: the cluster node whose actor measured every repeat (docs/ray.md)

    @property
    def memory(self) -> MemoryUse | None:
        """The KV pool and its use (the last repeat), preemptions, and the device's peak; None when not recorded."""
        measured = self.measurement
        if any(name in measured.unrecorded_counters for name in KV_COUNTERS):
            return None
        return memory_use(measured.counters, measured.timeline, measured.samples)

    @property
    def prefix_cache(self) -> PrefixCacheFigures | None:
        """The prefix cache hit rate shown for this test (``measure.prefix_cache`` says whose); None: nothing was
        looked up, or nothing says."""
        # An older file reads the cache counters as 0 (unrecorded) and holds no reports: None, never a measured 0%.
        return prefix_cache_figures(self.measurement.counters, self.measurement.cached_prompts)

    @property
    def ttft_by_cache_hit(self) -> TtftSplit | None:
        """TTFT of the requests that hit the prefix cache and of those that missed; None when none hit."""
        return ttft_split(self.measurement.request_samples)

    @property
    def is_paired(self) -> bool:
        """Measured side by side with a reference tree (``--perf-against``), not against a stored baseline."""
        return self.reference is not None

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.judgement.comparisons if c.verdict is Verdict.REGRESSED]

    @property
    def is_remote(self) -> bool:
        """Served by another process: stored under the server's fingerprint, never probe-normalised."""
        return isinstance(self.measurement.environment, ServerEnvironment)

    @property
    def normalization(self) -> str:
        return RAW_SERVER_FIGURES if self.is_remote else NORMALISED

    @property
    def fingerprint(self) -> str | None:
        environment = self.measurement.environment
        return environment.fingerprint() if environment else None

    def with_judgement(self, **changes: Any) -> TestResult:
        """This result with its judgement's ``changes`` (``baseline_status=...``, ``comparisons=...``)."""
        return dataclasses.replace(self, judgement=dataclasses.replace(self.judgement, **changes))

    def to_json(self) -> dict[str, Any]:
        """The codec's fields, with what readers outside perfsuite read beside them (``READER_KEYS``)."""
        memory = self.memory
        return {
            "test_id": self.test_id,
            **_nan_as_null(self.measurement.summary.vllm_keys()),  # at the top of each test, as vLLM writes them
            **self.measurement.summary.interval_keys(),  # each percentile's interval beside it
            **encode(self, nan_as_null=True),
            "memory": encode(memory, nan_as_null=True) if memory else None,
            "fingerprint": self.fingerprint,
            "normalization": self.normalization,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestResult:
        fields = {k: v for k, v in data.items() if k not in READER_KEYS}
        return decode(
            cls, {**fields, "measurement": _with_newer_counters_unrecorded(fields["measurement"])}, nan_as_null=True
        )


def _with_newer_counters_unrecorded(measurement: Mapping[str, Any]) -> dict[str, Any]:
    """A file written before a counter existed lacks it: name it unrecorded, never read it as a measured 0."""
    stored = measurement.get("counters") or {}
    earlier = tuple(measurement.get("unrecorded_counters") or ())
    missing = tuple(
        f.name for f in dataclasses.fields(EngineCounters) if f.name not in stored and f.name not in earlier
    )
    return {**measurement, "unrecorded_counters": [*earlier, *missing]} if missing else dict(measurement)


# What results.json writes beside the codec's fields of a test, for readers outside perfsuite; read back from
# the fields, never from these: vLLM's figures (``RunSummary.vllm_keys``) and each percentile's interval
# (``RunSummary.interval_keys``), memory, fingerprint, normalization.
READER_KEYS = frozenset(
    {
        "request_throughput",
        "output_throughput",
        "completed",
        "total_output_tokens",
        "total_input_tokens",
        GOODPUT,
        *(f"{statistic}_{name}_ms" for name in LATENCIES for statistic in ("mean", "median", "std", "p90", "p99")),
        *(
            f"{statistic}_{name}_ms_{part}"
            for name in LATENCIES
            for statistic in PERCENTILES
            for part in ("ci", "supported")
        ),
        *(f"{name}_num_values" for name in LATENCIES),
        "memory",
        "fingerprint",
        "normalization",
    }
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
class DeterminismResult:
    """A test's unique completions over N runs (``perf.measure_determinism``): recorded and shown, never judged."""

    test_id: str
    engine_name: str
    completions: UniqueCompletions

    def to_json(self) -> dict[str, Any]:
        """The codec's fields, and the derived figures beside them for readers outside perfsuite (never read back)."""
        return {**encode(self), "summary": self.completions.summary()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeterminismResult:
        return decode(cls, {k: v for k, v in data.items() if k != "summary"})


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
    determinism: tuple[DeterminismResult, ...] | None = None  # None: no test measured it (no key written)
    peaks: MachinePeaks | None = None  # this machine's roofs, measured (and datasheet's); None: not measured (no key)
    instructions: tuple[InstructionResult, ...] | None = None  # --perf-instructions' counts; None: none (no key)

    @property
    def fingerprint(self) -> str | None:
        return self.environment.fingerprint() if self.environment else None

    def test(self, test_id: str) -> TestResult | None:
        return next((t for t in self.tests if t.test_id == test_id), None)

    def to_json(self) -> dict[str, Any]:
        """The codec's fields, each test's with its readers' keys, and the fingerprints of the session's machines."""
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            **{
                k: v
                for k, v in encode(
                    dataclasses.replace(self, tests=(), determinism=None, instructions=None), nan_as_null=True
                ).items()
                if k not in ("peaks", "instructions") or v is not None
            },
            **({"determinism": [d.to_json() for d in self.determinism]} if self.determinism is not None else {}),
            **({"instructions": [i.to_json() for i in self.instructions]} if self.instructions is not None else {}),
            "fingerprint": self.fingerprint,
            "servers": [{**encode(s, nan_as_null=True), "fingerprint": s.fingerprint()} for s in self.servers],
            "tests": [t.to_json() for t in self.tests],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Results:
        """A version 5 document (``results_from_json`` converts older ones); what is written for readers is dropped."""
        written_only = ("schema_version", "fingerprint", "tests", "servers", "determinism", "instructions")
        fields = {k: v for k, v in data.items() if k not in written_only}
        servers = [{k: v for k, v in s.items() if k != "fingerprint"} for s in data["servers"]]
        session = decode(cls, {**fields, "servers": servers, "tests": []}, nan_as_null=True)
        determinism, instructions = data.get("determinism"), data.get("instructions")
        return dataclasses.replace(
            session,
            tests=tuple(TestResult.from_json(t) for t in data["tests"]),
            determinism=None if determinism is None else tuple(DeterminismResult.from_json(d) for d in determinism),
            instructions=None if instructions is None else tuple(InstructionResult.from_json(i) for i in instructions),
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
        data = _converted_to_version_4(data, version) if version != RESULTS_SCHEMA_VERSION else data
        problem = _measurements_problem(data, version == RESULTS_SCHEMA_VERSION)
        if problem is None:
            return Results.from_json(data if version == RESULTS_SCHEMA_VERSION else _from_version_4(data))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ResultsFileError(
            f"{source} is not a perfsuite results file: a field is missing or malformed ({error!r}); {REWRITE_HINT}"
        ) from error
    raise ResultsFileError(f"{source}: {problem}; {REWRITE_HINT}")


# What a test holds that a comparison or the report reads as samples: each field checked by one rule.
SAMPLE_FIELDS = ("samples", "request_samples", "baseline_request_samples", "reference_samples")


def _measurements_problem(data: Mapping[str, Any], is_current: bool) -> str | None:
    """The first environment, sample list or counter a reader cannot use (``perfsuite.judge.samples``), described.

    ``is_current``: ``data`` has this version's layout; else version 4's (flat tests), which is checked
    before it is converted.
    """
    problem = _optional_environment_problem(data["environment"])
    for index, test in enumerate(data["tests"]):
        if problem is not None:
            break
        flat = _flat_measurements(test) if is_current else test
        problem = measurement_problem(flat, SAMPLE_FIELDS) or _optional_environment_problem(flat.get("environment"))
        if problem is not None:
            problem = f"tests[{index}] ({test['test_id']!r}): {problem}"
    return problem


def _flat_measurements(test: Mapping[str, Any]) -> dict[str, Any]:
    """A version 5 test's samples, counters and environment under the names a version 4 test held them."""
    measured, judged, reference = test["measurement"], test.get("judgement") or {}, test.get("reference") or {}
    return {
        "samples": measured.get("samples", {}),
        "request_samples": measured.get("request_samples", {}),
        "baseline_request_samples": judged.get("baseline_request_samples", {}),
        "reference_samples": reference.get("samples", {}),
        "counters": measured.get("counters", {}),
        "environment": measured.get("environment"),
    }


def _optional_environment_problem(environment: Any) -> str | None:
    return None if environment is None else environment_problem(environment)


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


def _converted_to_version_4(data: Mapping[str, Any], version: int) -> Mapping[str, Any]:
    if version == 1:
        data = _from_version_1(data)
    if version in (1, 2):
        data = _from_version_2(data)
    if version in (1, 2, 3):
        data = _from_version_3(data)
    return data


def _from_version_4(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 4 document as version 5 writes it: each test read by version 4's rules, written by the codec.

    The session's own fields kept their layout (the codec reads what
    ``dataclasses.asdict`` wrote); a test's moved into its measurement,
    judgement, reference side and capacity.
    """
    return {**data, "tests": [_test_from_version_4(test).to_json() for test in data["tests"]]}


def _test_from_version_4(data: Mapping[str, Any]) -> TestResult:
    counters, unrecorded = counters_from_json(data["counters"])
    measurement = Measurement(
        engine_name=data["engine"],
        parameters=SizingParameters(**data["parameters"]),
        arrival_rate=data["arrival_rate"],
        samples=_tuples(data["samples"]),
        counters=counters,
        summary=RunSummary.from_vllm_keys(data),
        configuration=RunConfiguration.from_json(data["configuration"]) if data["configuration"] else None,
        noisy=data["noisy"],
        request_samples=_tuples(data["request_samples"]),
        timeline=_timeline_from_json(data["timeline"]) if data["timeline"] else None,
        environment=environment_from_json(data["environment"]) if data["environment"] else None,
        unrecorded_counters=unrecorded,
        send_lag=SendLag(**data["send_lag"]) if data.get("send_lag") else None,  # older files: not recorded
    )
    judgement = Judgement(
        baseline_status=data["baseline"],
        comparisons=tuple(_comparison_from_json(c) for c in data["comparisons"]),
        counter_changes=tuple(CounterChange(**c) for c in data["counter_changes"]),
        baseline_request_samples=_tuples(data["baseline_request_samples"]),
        baseline_unrecorded_counters=tuple(data["baseline_unrecorded_counters"]),
    )
    reference = None
    if data["pair_order"]:
        reference_timeline = data["reference_timeline"]
        reference = ReferenceSide(
            samples=_tuples(data["reference_samples"]),
            timeline=_timeline_from_json(reference_timeline) if reference_timeline else None,
            pair_order=tuple(data["pair_order"]),
        )
    capacity = CapacityRecord.from_json(data["capacity"]) if data.get("capacity") else None  # optional key
    return TestResult(data["test_id"], measurement, judgement, reference, capacity)


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


def _tuples(samples: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    return {name: tuple(values) for name, values in samples.items()}
