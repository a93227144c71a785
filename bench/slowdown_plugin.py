"""A pytest plugin that makes the model runner uniformly slower, for bench/calibrate_e2e.py.

    PYTHONPATH=bench PERFSUITE_SLOWDOWN=0.25 pytest perfsuite/suites --perf -p slowdown_plugin

With ``PERFSUITE_SLOWDOWN=f`` (a fraction, 0 <= f <= 10), every
``perfsuite.engine.model_runner.ModelRunner.execute`` call busy-waits ``f``
times that call's own elapsed time after it returns: every forward pass, and so
every test, gets ``f`` slower, as a slower kernel would make it. It busy-waits
rather than sleeps, like ``SlowedRunner`` in bench/calibrate.py: on this VM a
vCPU that sleeps runs the next step faster, and a sleep hid most of a slowdown.

Unset, empty or 0: nothing is wrapped and torch is not imported here, so the
plugin can be loaded for every session of a calibration alike. A value that is
not a number in range is a usage error (pytest exits 4).

If ``PERFSUITE_SLOWDOWN_REPORT`` names a file, the plugin writes
``{"fraction": f, "calls": n, "added_s": s}`` there at the end of the session,
so a caller can check that the slowdown was really injected.

With ``PERFSUITE_FAKE_COMMIT=<hex>`` the session records that commit instead
of the repository's (bench/calibrate_history.py gives each session of a
series a commit of its own, so change points have commit ranges). A value
that is not 7 to 40 hex digits is a usage error.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

ENV_FRACTION = "PERFSUITE_SLOWDOWN"
ENV_REPORT = "PERFSUITE_SLOWDOWN_REPORT"
MAX_FRACTION = 10.0
ENV_COMMIT = "PERFSUITE_FAKE_COMMIT"
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


class _Slowdown:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.calls = 0
        self.added_s = 0.0
        self.original = None  # the unwrapped ModelRunner.execute while wrapped
        self.original_git_commit = None  # perfsuite's git_commit while a fake commit stands in


_STATE_KEY = pytest.StashKey[_Slowdown]()


def parse_fraction(text: str | None) -> float:
    """The slowdown fraction in ``text`` (the env var's value); None or blank is 0."""
    if text is None or not text.strip():
        return 0.0
    try:
        fraction = float(text)
    except ValueError:
        raise pytest.UsageError(f"{ENV_FRACTION}={text!r} is not a number (e.g. 0.25 for 25% slower)") from None
    if not 0.0 <= fraction <= MAX_FRACTION:  # also rejects nan
        raise pytest.UsageError(f"{ENV_FRACTION}={text!r} is out of range: give a fraction in [0, {MAX_FRACTION:g}]")
    return fraction


def parse_commit(text: str | None) -> str | None:
    """The fake commit in ``text`` (the env var's value); None or blank: the repository's own."""
    if text is None or not text.strip():
        return None
    if not _COMMIT.fullmatch(text.strip()):
        raise pytest.UsageError(f"{ENV_COMMIT}={text!r} is not a commit: give 7 to 40 lowercase hex digits")
    return text.strip()


def install_fake_commit(commit: str):
    """Make perfsuite's ``git_commit`` return ``commit``; returns the original, for ``restore_git_commit``."""
    from perfsuite.measure import environment

    original = environment.git_commit
    environment.git_commit = lambda cwd: commit
    return original


def restore_git_commit(original) -> None:
    from perfsuite.measure import environment

    environment.git_commit = original


def pytest_configure(config: pytest.Config) -> None:
    state = _Slowdown(parse_fraction(os.environ.get(ENV_FRACTION)))
    config.stash[_STATE_KEY] = state
    commit = parse_commit(os.environ.get(ENV_COMMIT))
    if commit is not None:
        state.original_git_commit = install_fake_commit(commit)
    if not state.fraction:
        return
    from perfsuite.engine.model_runner import ModelRunner

    original = ModelRunner.execute

    def execute(self, output, kv_cache):
        start = time.perf_counter()
        tokens = original(self, output, kv_cache)
        now = time.perf_counter()
        deadline = now + state.fraction * (now - start)
        while time.perf_counter() < deadline:
            pass
        state.calls += 1
        state.added_s += time.perf_counter() - now
        return tokens

    execute.__wrapped__ = original
    execute.__doc__ = original.__doc__
    state.original = original
    ModelRunner.execute = execute


def pytest_report_header(config: pytest.Config) -> str:
    state = config.stash[_STATE_KEY]
    if not state.fraction:
        return "slowdown_plugin: off"
    return f"slowdown_plugin: every ModelRunner.execute busy-waits {state.fraction:.0%} of its own time"


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    if state.original_git_commit is not None:
        restore_git_commit(state.original_git_commit)
        state.original_git_commit = None
    if state.original is not None:
        from perfsuite.engine.model_runner import ModelRunner

        ModelRunner.execute = state.original
        state.original = None
    report = os.environ.get(ENV_REPORT)
    if report:
        Path(report).write_text(
            json.dumps({"fraction": state.fraction, "calls": state.calls, "added_s": round(state.added_s, 6)})
        )
