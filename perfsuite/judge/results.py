"""Reading results.json documents back, and keeping one copy per run as history.

A results document is what ``PerfSession.results_json()`` wrote. It stays a
dict here: the report and ``perfsuite compare`` read it the way a reviewer's
tool would, and the checks below only make sure it is one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfsuite.plugin.session import RESULTS_SCHEMA_VERSION
from perfsuite.judge.baselines import write_json_atomic

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
