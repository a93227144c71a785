"""A session's ``Results`` as the store's rows, and its rows back as a results document: no database here."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from perfsuite.judge.results import Results, TestResult


def session_key(results: Results) -> str:
    """What makes two appends the same session: when it was made, its commit, its machine, and each test's samples.

    Appending the same ``Results`` again, or importing the results.json of a
    session already stored, finds this key and
    adds nothing. Two different sessions never share it: even two CI jobs of
    one commit on identical runners that finish in the same second measured
    different samples.
    """
    identity = [
        results.created_at,
        results.commit,
        results.fingerprint,
        sorted([test.test_id, _lists(test.measurement.samples)] for test in results.tests),
    ]
    return hashlib.sha256(_canonical(identity).encode()).hexdigest()


def created_at_problem(created_at: object) -> str | None:
    """Why a session's ``created_at`` cannot place it in the store's order (a text column sorted as written); None
    when it can: an ISO 8601 date and time with its UTC offset, as perfsuite writes it."""
    try:
        stamp = dt.datetime.fromisoformat(created_at) if isinstance(created_at, str) else None
    except ValueError:
        stamp = None
    if stamp is not None and stamp.tzinfo is not None:
        return None
    return (
        f"its created_at {created_at!r} is not an ISO 8601 date and time with a UTC offset, as perfsuite writes it "
        "(2026-03-01T10:00:00+00:00); correct the field"
    )


def session_row(results: Results) -> dict[str, Any]:
    document = results.to_json()
    del document["tests"]
    return {
        "session_key": session_key(results),
        "created_at": results.created_at,
        "commit": results.commit,
        "fingerprint": results.fingerprint,
        "document": document,
    }


def test_rows(results: Results, session_id: int) -> list[dict[str, Any]]:
    return [_test_row(results, test, session_id, position) for position, test in enumerate(results.tests)]


def _test_row(results: Results, test: TestResult, session_id: int, position: int) -> dict[str, Any]:
    measured = test.measurement
    configuration = measured.configuration.to_json() if measured.configuration else None
    return {
        "session_id": session_id,
        "position": position,
        "test_id": test.test_id,
        "commit": results.commit,
        "created_at": results.created_at,
        "fingerprint": test.fingerprint,
        "configuration": configuration,
        "configuration_key": configuration_key(configuration),
        "samples": _lists(measured.samples),
        "verdicts": verdicts(test),
        "result": test.to_json(),
    }


def configuration_key(configuration: Mapping[str, Any] | None) -> str | None:
    """A short digest of a ``RunConfiguration.to_json()``, equal exactly when the configurations are; None for none."""
    if configuration is None:
        return None
    return hashlib.sha256(_canonical(configuration).encode()).hexdigest()[:16]


def verdicts(test: TestResult) -> dict[str, Any]:
    """How the test was judged: its baseline status, why it was noisy (if so), and each metric's verdict."""
    return {
        "baseline": test.judgement.baseline_status,
        "noisy": test.measurement.noisy,
        "metrics": {comparison.metric: comparison.verdict.value for comparison in test.judgement.comparisons},
    }


def results_document(session_document: Mapping[str, Any], test_documents: Sequence[Mapping[str, Any]]) -> dict:
    """The results document a session's rows hold: what ``results_from_json`` reads."""
    return {**session_document, "tests": list(test_documents)}


def _lists(samples: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    return {name: list(values) for name, values in samples.items()}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
