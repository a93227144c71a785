"""A test's result (``TestResult``) and its JSON; reading results.json documents back, and keeping history.

A results document is what ``PerfSession.results_json()`` wrote. It stays a
dict here: the report and ``perfsuite compare`` read it the way a reviewer's
tool would, and the checks below only make sure it is one.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.judge.baselines import write_json_atomic
from perfsuite.judge.catalogue import NORMALISED, RAW_SERVER_FIGURES, comparison_from_json, comparison_json
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import Comparison, CounterChange, Verdict
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json
from perfsuite.measure.summaries import SizingParameters


RESULTS_SCHEMA_VERSION = 1

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


COMPARISON_KEYS = (
    "metric", "baseline_median", "current_median", "change", "ci_low", "ci_high", "p_adjusted", "verdict"
)  # fmt: skip
REWRITE_HINT = "re-create it with `pytest --perf` (it writes reports/results.json)"


class ResultsFileError(RuntimeError):
    """A results file that cannot be used; the message names the file and the fix."""


def read_results(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ResultsFileError(f"{path}: no such file; pass the path of a results.json, or {REWRITE_HINT}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path} is not a readable JSON file ({error}); {REWRITE_HINT}") from error
    problem = _problem_with(data)
    if problem:
        raise ResultsFileError(f"{path} is not a perfsuite results file: {problem}; {REWRITE_HINT}")
    return data


def read_history(directory: Path, newest: int | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The stored results documents in ``directory`` (the ``newest`` by name), and why any is unusable."""
    documents, problems = [], []
    paths = sorted(Path(directory).glob("*.json"))
    for path in paths[-newest:] if newest else paths:
        try:
            documents.append(read_results(path))
        except ResultsFileError as error:
            problems.append(f"{error} (or delete it from the history)")
    return documents, problems


def archive_results(results: dict[str, Any], history_dir: Path) -> Path:
    """Keep a copy of one run's results under ``history_dir``, named by when it was made."""
    stamp = str(results.get("created_at") or "unknown").replace(":", "-")
    path = Path(history_dir) / f"{stamp}.json"
    write_json_atomic(path, results)
    return path


def _problem_with(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, found {type(data).__name__}"
    version = data.get("schema_version")
    if version != RESULTS_SCHEMA_VERSION:
        return f"schema_version is {version!r}, this perfsuite reads {RESULTS_SCHEMA_VERSION}"
    tests = data.get("tests")
    if not isinstance(tests, list):
        return "it has no 'tests' list"
    for index, test in enumerate(tests):
        if not isinstance(test, dict):
            return f"tests[{index}] is not an object"
        missing = [key for key in ("test_id", "engine", "parameters") if key not in test]
        if missing:
            return f"tests[{index}] lacks {', '.join(missing)}"
        for comparison in test.get("comparisons") or []:
            if not isinstance(comparison, dict) or any(key not in comparison for key in COMPARISON_KEYS):
                return f"tests[{index}] ({test['test_id']}) has a comparison without {', '.join(COMPARISON_KEYS)}"
    return None
