"""What the plugin keeps in ``config.stash``, and ``perf_options`` for conftest files.

``pytest_configure`` builds one ``PerfSession`` per run and keeps it under
``SESSION_KEY``; every hook and fixture reads it from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsuite.plugin.gpu_workers import GpuAssignment
from perfsuite.plugin.options import PerfOptions
from perfsuite.plugin.session import PerfSession

SESSION_KEY = pytest.StashKey[PerfSession]()
GPU_ASSIGNMENT_KEY = pytest.StashKey[GpuAssignment]()  # pytest-xdist's controller: which worker holds which GPU
RESULTS_KEY = pytest.StashKey[Path]()  # results.json, once written at session end
REPORT_KEY = pytest.StashKey[Path]()  # the HTML report written at session end
SUMMARY_KEY = pytest.StashKey[Path]()  # the Markdown summary beside it (reports/summary.md)
OUTPUT_ERROR_KEY = pytest.StashKey[str]()  # why results.json or a baseline could not be written
HISTORY_KEY = pytest.StashKey[str]()  # where the session was appended to the run history (--perf-history)
HISTORY_ERROR_KEY = pytest.StashKey[str]()  # why it could not be


def perf_options(config: pytest.Config) -> PerfOptions:
    """The parsed ``--perf-*`` options, e.g. to parametrize tests from the profile in ``pytest_generate_tests``."""
    return config.stash[SESSION_KEY].options
