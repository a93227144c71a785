"""Calibrating the change points: does a real run history catch a slow creep, and how often does it cry wolf?

    .venv/bin/python bench/calibrate_history.py [--sessions N] [--every K] [--save runs.json]
    .venv/bin/python bench/calibrate_history.py --load runs.json            # re-print, no measuring
    .venv/bin/python bench/calibrate_history.py --load runs.json --policy max_p_value=0.01,head_runs=3
    .venv/bin/python bench/calibrate_history.py --load runs.json --trend-policy max_p_value=0.01
    .venv/bin/python bench/calibrate_history.py --load runs.json --grid     # other thresholds, same data

What it measures. Two series of real ``pytest --perf`` sessions, run as
subprocesses on this machine, each appended to its own fresh history store
(``--perf-history TMP/<series>.sqlite``) with its own ``--perf-report-dir``:

- ``creep``: session i busy-waits (1.02 ** (i // K) - 1) of every
  ``ModelRunner.execute`` call's own time (bench/slowdown_plugin.py): a 2%
  slowdown lands every K-th session and stays, as ten merges that each cost
  2% would;
- ``aa``: the same number of sessions with no slowdown (any head change
  point is a false one).

The two are interleaved (one of each per round, which goes first alternating)
so that drift of the machine hits both alike. Each session records a commit
of its own (``PERFSUITE_FAKE_COMMIT``, read by the bench plugin), so the
series has commit ranges, and the load averages before it.

Then, from the stores (``HistoryStore.sessions``), the verdict the plugin
gives after every session is replayed: for each prefix of a series,
``perfsuite.history.head.check_head`` over the sessions before it and that
session, under a ``ChangePointPolicy`` (default: the plugin's), the very code
a session runs at its end. Per test and metric:

- creep: which 2% steps a head change point (a regression) was reported for,
  and how many runs after the step; the session at which the cumulative
  slowdown first exceeds 10% and how many runs, counting that one, until
  the first head regression reported from there (target: at most 5);
- aa: false change points per 100 runs per test (target: at most 1),
  counted as distinct steps (each once, at the session that first reports
  it: ``HeadChange.is_new``) and, beside it, per run (every session that
  shows a head change point, as before issue 24 item 5's two rules),
  measured, and resampled: many synthetic A/A series
  drawn from the measured A/A values (a permutation, or a moving-block
  bootstrap when the values are autocorrelated), each searched prefix by
  prefix as above (``perfsuite.history.changes.detect`` on the series).

Repeats run whatever the machine's load (``--perf-busy-threshold 0.99``): at
the default threshold a session during other engineers' tests is noisy and
leaves no point, and a series of a busy machine would have none. The share
of each repeat's CPU that other work used is kept (``cpu_busy_share``) and
summarised in the table.

The model is SmolLM2 by default, the model ``make perf`` gates. On
tiny-random a repeat lasts about 20 ms, and a session's throughput moved by
6-10% from one session to the next on this machine (a 2% step is lost in
that); SmolLM2's repeats last about a second, and sessions moved by 3.5%.

How long. One session of the default selection (SmolLM2, ci profile,
``-k "inflight and B8 and fixed"``, 7 repeats, 1 test) takes about 22 s on
2 cores; 40 sessions of each series: about 30 minutes. The raw data
(every session's results document as the store gave it back, its load and
wall time) goes to ``--save``; ``--load`` re-prints the table from it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from calibrate_e2e import _tail, run_logged  # noqa: E402

from perfsuite.history.changes import ChangePointPolicy, detect, head_step  # noqa: E402
from perfsuite.history.head import check_head  # noqa: E402
from perfsuite.history.series import Series, build_series  # noqa: E402
from perfsuite.history.trend import TrendPolicy, trend_beside_steps  # noqa: E402
from perfsuite.host import cpu_model  # noqa: E402
from perfsuite.judge.results import Results, ResultsFileError, read_results, results_from_json  # noqa: E402

SERIES_NAMES = ("aa", "creep")
STEP = 0.02
CREEP_TARGET = 0.10
MAX_RUNS_TO_FIND = 5  # target: the 10% creep found within this many runs
MAX_FALSE_PER_100 = 1.0  # target: false head change points per 100 A/A runs per test
DEFAULT_SELECT = "inflight and B8 and fixed"
SUITE = "perfsuite.suites.test_throughput"
BUSY_THRESHOLD = "0.99"  # measure whatever the load; the option takes a share strictly below 1
DEFAULT_BUSY_THRESHOLD = 0.05  # perfsuite's: the table says how many sessions it would have left out
HEADLINE = "output_throughput"
TRENDS = TrendPolicy()  # the trend test beside the step search, its defaults
GRID = {
    "max_p_value": (0.001, 0.005, 0.01, 0.05),
    "min_magnitude": (0.01, 0.02, 0.05),
    "head_runs": (3, 5),
    "min_after_runs": (1, 2),
}


class CalibrationAborted(RuntimeError):
    """A session that gave no point of its series; the message says which and shows its output."""


# ---------------------------------------------------------------------------------------------- pure helpers


def slowdown_for(index: int, every: int, step: float = STEP) -> float:
    """The busy-wait fraction of session ``index`` of the creep: a ``step`` more every ``every`` sessions."""
    return (1 + step) ** (index // every) - 1


def first_past(threshold: float, every: int, step: float = STEP) -> int:
    """The first session of the creep whose cumulative slowdown exceeds ``threshold``."""
    steps = math.floor(math.log1p(threshold) / math.log1p(step)) + 1
    while (1 + step) ** (steps - 1) - 1 > threshold:  # a step that lands on the threshold exactly: not past it
        steps -= 1
    return steps * every


def fake_commit(series: str, index: int) -> str:
    """A 40-hex commit of its own for each session, so commit ranges name sessions."""
    return hashlib.sha1(f"{series}-{index}".encode()).hexdigest()


def session_plan(sessions: int) -> list[tuple[str, int]]:
    """(series, index) in run order: one of each series per round, which goes first alternating."""
    order = []
    for index in range(sessions):
        names = SERIES_NAMES if index % 2 == 0 else SERIES_NAMES[::-1]
        order += [(name, index) for name in names]
    return order


def pytest_command(args: argparse.Namespace, history: Path, report_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "pytest", "--pyargs", SUITE, "--perf"]
    command += ["--perf-profile", args.profile, "--perf-model", args.model]
    command += ["--perf-history", str(history), "--perf-report-dir", str(report_dir)]
    command += ["--perf-busy-threshold", BUSY_THRESHOLD]
    if args.repeats:
        command += ["--perf-repeats", str(args.repeats)]
    if args.select:
        command += ["-k", args.select]
    return command + ["-p", "slowdown_plugin", "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]


def session_environment(base: dict[str, str], slowdown: float, commit: str, report: Path) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(BENCH), base.get("PYTHONPATH")]))
    env["PERFSUITE_SLOWDOWN"] = repr(slowdown)
    env["PERFSUITE_SLOWDOWN_REPORT"] = str(report)
    env["PERFSUITE_FAKE_COMMIT"] = commit
    return env


def policy_from_text(text: str | None, base: Any = ChangePointPolicy(), option: str = "--policy") -> Any:
    """``max_p_value=0.01,head_runs=3`` over ``base`` (a ``ChangePointPolicy`` or a ``TrendPolicy``); a usage error
    names ``option`` and the fields there are."""
    if not text:
        return base
    names = {f.name: f.type for f in fields(type(base))}
    changes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in names or not value:
            raise ValueError(f"{option} {part!r}: give name=value, with a name among {', '.join(names)}")
        try:
            changes[name] = int(value) if names[name] in ("int", int) else float(value)
        except ValueError:
            raise ValueError(f"{option} {part!r}: {value!r} is not a number") from None
    return replace(base, **changes)


@dataclass(frozen=True, slots=True)
class HeadReport:
    """One session's head change point for one test and metric, as the plugin would print it."""

    session: int  # index in its series of the session that reported it
    first_after: int  # index of the first session after the step
    relative_change: float
    p_value: float
    is_regression: bool
    is_new: bool = True  # False: an earlier session of the series reported the same step (no verdict again)


@dataclass(frozen=True, slots=True)
class Replay:
    """One test and metric of one series, searched after every session."""

    test_id: str
    metric: str
    num_sessions: int
    num_searched: int  # sessions after which the series had enough runs to be searched
    reports: tuple[HeadReport, ...]

    @property
    def regressions(self) -> tuple[HeadReport, ...]:
        return tuple(r for r in self.reports if r.is_regression)

    @property
    def new_reports(self) -> tuple[HeadReport, ...]:
        """Each step once, at the session that first reported it: the verdicts."""
        return tuple(r for r in self.reports if r.is_new)


def replay(sessions: Sequence[Results], policy: ChangePointPolicy) -> list[Replay]:
    """The plugin's head verdict after each of ``sessions`` (one series, oldest first), per test and metric.

    After session n the plugin reads the newest ``window_len`` sessions before
    it from the store and searches them with session n (``check_head``).
    """
    index_of = {session.commit: index for index, session in enumerate(sessions)}
    found: dict[tuple[str, str], list[HeadReport]] = {}
    searched: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, str], None] = {}
    for index, session in enumerate(sessions):
        earlier = list(sessions[max(0, index - policy.window_len) : index])
        for series in build_series([session]):
            key = (series.key.test_id, series.key.metric)
            seen.setdefault(key, None)
        check = check_head(earlier, session, policy)
        for series in build_series([*earlier, session], {t.test_id for t in session.tests}):
            key = (series.key.test_id, series.key.metric)
            if series.points and series.points[-1].commit == session.commit:
                searched[key] = searched.get(key, 0) + (len(series.points) >= policy.min_points)
        for change in check.changes:
            point = change.change_point
            key = (change.key.test_id, change.key.metric)
            found.setdefault(key, []).append(
                HeadReport(index, index_of[point.first_after.commit], point.relative_change, point.p_value,
                           point.is_regression, change.is_new)  # fmt: skip
            )
    return [Replay(*key, len(sessions), searched.get(key, 0), tuple(found.get(key, ()))) for key in seen]


def replay_series(series: Series, policy: ChangePointPolicy) -> Replay:
    """``replay`` for one series already built over all sessions: each prefix searched as one session's head.

    The same search as ``replay``, without rebuilding the sessions' series
    after each one (much faster, for the grid and the resampling); the one
    difference is that each point stays rescaled by the whole series' median
    probe rather than by that of the sessions up to it.
    """
    index_of = {point.commit: index for index, point in enumerate(series.points)}
    reports = []
    for end in range(policy.min_points, len(series.points) + 1):
        prefix = replace(series, points=series.points[max(0, end - policy.window_len - 1) : end])
        step = head_step(detect(prefix, policy))
        if step is not None:
            head = step.change_point
            reports.append(
                HeadReport(end - 1, index_of[head.first_after.commit], head.relative_change, head.p_value,
                           head.is_regression, step.is_new)  # fmt: skip
            )
    num_searched = max(0, len(series.points) - policy.min_points + 1)
    return Replay(series.key.test_id, series.key.metric, len(series.points), num_searched, tuple(reports))


def replay_values(values: Sequence[float], series: Series, policy: ChangePointPolicy) -> Replay:
    """``replay_series`` with ``values`` in place of ``series``' own."""
    points = tuple(replace(point, value=value) for point, value in zip(series.points, values, strict=True))
    return replay_series(replace(series, points=points), policy)


def lag1_autocorrelation(values: Sequence[float]) -> float:
    n = len(values)
    if n < 3:
        return 0.0
    mean = sum(values) / n
    denominator = sum((v - mean) ** 2 for v in values)
    if denominator == 0:
        return 0.0
    return sum((values[i] - mean) * (values[i + 1] - mean) for i in range(n - 1)) / denominator


def resampler(values: Sequence[float], rng: random.Random) -> tuple[str, Callable[[], list[float]]]:
    """How synthetic A/A series are drawn from ``values``, and the drawing function.

    Independent values (lag-1 autocorrelation within 2/sqrt(n)): a random
    permutation. Else a moving-block bootstrap with blocks of about n^(1/3),
    which keeps the short-range dependence.
    """
    n = len(values)
    r1 = lag1_autocorrelation(values)
    if abs(r1) <= 2 / math.sqrt(n):
        return f"permutation (lag-1 autocorrelation {r1:+.2f})", lambda: rng.sample(list(values), n)
    block = max(2, round(n ** (1 / 3)))

    def draw() -> list[float]:
        out: list[float] = []
        while len(out) < n:
            start = rng.randrange(n - block + 1)
            out += values[start : start + block]
        return out[:n]

    return f"block bootstrap, blocks of {block} (lag-1 autocorrelation {r1:+.2f})", draw


@dataclass(frozen=True, slots=True)
class Resampled:
    test_id: str
    metric: str
    method: str
    num_series: int
    flagged: int  # runs with a head change point
    searched: int
    flagged_new: int = 0  # distinct steps: each once, when new

    @property
    def per_100(self) -> float:
        return 100 * self.flagged / self.searched if self.searched else math.nan


def resample_aa(
    sessions: Sequence[Results], policy: ChangePointPolicy, count: int, seed: int, metrics: Sequence[str] = (HEADLINE,)
) -> list[Resampled]:
    """Synthetic A/A series drawn from each measured A/A series' values (of ``metrics``), each replayed prefix by
    prefix."""
    out = []
    for series in build_series(sessions):
        if len(series.points) < policy.min_points or series.key.metric not in metrics:
            continue
        rng = random.Random(f"{seed}-{series.key.test_id}-{series.key.metric}")
        method, draw = resampler(list(series.values), rng)
        flagged = flagged_new = searched = 0
        for _ in range(count):
            run = replay_values(draw(), series, policy)
            flagged, flagged_new = flagged + len(run.reports), flagged_new + len(run.new_reports)
            searched += run.num_searched
        out.append(Resampled(series.key.test_id, series.key.metric, method, count, flagged, searched, flagged_new))
    return out


@dataclass(frozen=True, slots=True)
class CreepFigures:
    """What the creep series' replay says for one test and metric."""

    steps_found: tuple[tuple[int, int], ...]  # (step number, runs from the step to its first head report)
    num_steps: int  # steps in the series with at least one run after them
    past_target: int  # the session whose cumulative slowdown first exceeds the target
    runs_to_find: int | None  # counting that session as 1: runs until the first head regression from there on
    first_regression: HeadReport | None  # the first head regression at all
    runs_to_find_new: int | None = None  # the same, counting only new head regressions (verdicts)


def creep_figures(run: Replay, every: int, target: float = CREEP_TARGET) -> CreepFigures:
    boundaries = {step * every: step for step in range(1, (run.num_sessions - 1) // every + 1)}
    found: dict[int, int] = {}
    for report in run.regressions:
        step = boundaries.get(report.first_after)
        if step is not None and step not in found:
            found[step] = report.session - report.first_after + 1
    past = first_past(target, every)
    first = run.regressions[0] if run.regressions else None
    return CreepFigures(
        tuple(sorted(found.items())),
        len(boundaries),
        past,
        _runs_from(past, run.regressions, run.num_sessions),
        first,
        _runs_from(past, [r for r in run.regressions if r.is_new], run.num_sessions),
    )


def _runs_from(past: int, reports: Sequence[HeadReport], num_sessions: int) -> int | None:
    later = [r.session for r in reports if r.session >= past]
    return later[0] - past + 1 if later and past < num_sessions else None


# -------------------------------------------------------------------------------------------------- the table


def _percent(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:+.1%}"


def _per_100(flagged: int, searched: int) -> str:
    return f"{flagged}/{searched} runs = {100 * flagged / searched:.1f}" if searched else "n/a"


def _steps_and_runs(steps: int, runs: int, searched: int) -> str:
    """False steps (each once, when new) per 100 runs, and beside it runs with a head change point per 100."""
    if not searched:
        return "n/a"
    return f"{_per_100(steps, searched)} (per run: {runs} = {100 * runs / searched:.1f})"


def _found(runs: int | None) -> str:
    return "not found" if runs is None else str(runs)


def _busy_summary(meta: Sequence[dict[str, Any]]) -> str:
    shares = sorted(s.get("max_busy_share", 0.0) for s in meta)
    if not shares:
        return "n/a"
    quiet = sum(share <= DEFAULT_BUSY_THRESHOLD for share in shares)
    return (
        f"median {shares[len(shares) // 2]:.0%}, max {shares[-1]:.0%}; {quiet} of {len(shares)} sessions "
        f"under the default --perf-busy-threshold {DEFAULT_BUSY_THRESHOLD}"
    )


def _loads(meta: Sequence[dict[str, Any]]) -> str:
    loads = sorted(s["load_before"][0] for s in meta if s.get("load_before"))
    if not loads:
        return "n/a"
    return f"1-min load before a session: min {loads[0]:.2f}, median {loads[len(loads) // 2]:.2f}, max {loads[-1]:.2f}"


def analyse(data: dict[str, Any], policy: ChangePointPolicy, resamples: int, seed: int = 0) -> dict[str, Any]:
    """Replays and figures per test and metric: the table's rows, for one policy."""
    every = data["every"]
    runs = {name: documents_of(data, name) for name in SERIES_NAMES}
    creep = {(r.test_id, r.metric): r for r in replay(runs["creep"], policy)}
    aa = {(r.test_id, r.metric): r for r in replay(runs["aa"], policy)}
    resampled = {}
    if resamples:
        resampled = {(r.test_id, r.metric): r for r in resample_aa(runs["aa"], policy, resamples, seed)}
    rows = []
    for key in sorted(set(creep) | set(aa), key=lambda k: (k[0], k[1] != HEADLINE, k[1])):
        rows.append({"key": key, "creep": creep.get(key), "aa": aa.get(key), "resampled": resampled.get(key)})
    return {"rows": rows, "every": every}


def _short(test_id: str) -> str:
    return test_id.rsplit("::", 1)[-1]


def figures_table(analysis: dict[str, Any]) -> str:
    every = analysis["every"]
    rows = []
    for row in analysis["rows"]:
        test_id, metric = row["key"]
        creep, aa, resampled = row["creep"], row["aa"], row["resampled"]
        if creep is not None:
            figures = creep_figures(creep, every)
            steps = ", ".join(f"#{step} ({runs})" for step, runs in figures.steps_found) or "none"
            steps = f"{len(figures.steps_found)}/{figures.num_steps}: {steps}"
            first = figures.first_regression
            first_text = (
                f"session {first.session} ({slowdown_for(first.session, every):.0%} slower), "
                f"{_percent(first.relative_change)}"
                if first
                else "none"
            )
            found = f"session {figures.past_target}: {_found(figures.runs_to_find_new)} (any report: " \
                    f"{_found(figures.runs_to_find)})"  # fmt: skip
        else:
            steps = first_text = found = "n/a"
        measured = _steps_and_runs(len(aa.new_reports), len(aa.reports), aa.num_searched) if aa else "n/a"
        synthetic = (
            f"{_steps_and_runs(resampled.flagged_new, resampled.flagged, resampled.searched)} "
            f"({resampled.num_series} series, {resampled.method})"
            if resampled
            else "n/a"
        )
        rows.append([_short(test_id), metric, steps, first_text, found, measured, synthetic])
    headers = [
        "test",
        "metric",
        "creep: steps found (runs after the step)",
        "creep: first head regression",
        "creep: >10% from session: runs to a new head regression (target <= 5)",
        "A/A measured: false steps per 100 runs (per run)",
        "A/A resampled from measured values: false steps per 100 runs (per run)",
    ]
    return _markdown(headers, rows)


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict_line(analysis: dict[str, Any], metric: str = HEADLINE) -> str:
    """Whether the targets are met for ``metric``: found within 5 runs and at most 1 false per 100."""
    every = analysis["every"]
    rows = [row for row in analysis["rows"] if row["key"][1] == metric]
    finds = [creep_figures(r["creep"], every).runs_to_find_new for r in rows if r["creep"] is not None]
    aa = [r["aa"] for r in rows if r["aa"] is not None]
    resampled = [r["resampled"] for r in rows if r["resampled"] is not None]
    found_ok = bool(finds) and all(f is not None and f <= MAX_RUNS_TO_FIND for f in finds)
    searched = max(1, sum(a.num_searched for a in aa))
    measured = 100 * sum(len(a.new_reports) for a in aa) / searched
    measured_runs = 100 * sum(len(a.reports) for a in aa) / searched
    resampled_searched = max(1, sum(r.searched for r in resampled))
    synthetic = 100 * sum(r.flagged_new for r in resampled) / resampled_searched
    synthetic_runs = 100 * sum(r.flagged for r in resampled) / resampled_searched
    aa_ok = bool(aa) and measured <= MAX_FALSE_PER_100 and (not resampled or synthetic <= MAX_FALSE_PER_100)
    return (
        f"{metric}: creep found within {MAX_RUNS_TO_FIND} runs: {'yes' if found_ok else 'no'} ({finds}); "
        f"A/A <= {MAX_FALSE_PER_100:g} false step per 100 runs: {'yes' if aa_ok else 'no'} (measured "
        f"{measured:.1f}, per run {measured_runs:.1f}"
        + (f"; resampled {synthetic:.2f}, per run {synthetic_runs:.2f}" if resampled else "")
        + f"); both targets: {'met' if found_ok and aa_ok else 'missed'}"
    )


def spread(values: Sequence[float]) -> str:
    """How far a series' points scatter: median, median absolute deviation over the median, range."""
    if not values:
        return "n/a"
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    deviations = sorted(abs(v - median) for v in values)
    mad = deviations[len(deviations) // 2]
    return f"median {median:.4g}, MAD {mad / median:.1%} of it, range {ordered[0]:.4g}..{ordered[-1]:.4g}"


def _aa_spread(data: dict[str, Any]) -> list[list[str]]:
    runs = documents_of(data, "aa")
    return [
        [f"A/A {HEADLINE} per session, {_short(series.key.test_id)}", spread(series.values)]
        for series in build_series(runs)
        if series.key.metric == HEADLINE
    ]


def setup_table(data: dict[str, Any], policy: ChangePointPolicy) -> str:
    meta = data["sessions"]
    walls = [s["wall_s"] for s in meta]
    every = data["every"]
    rows = [
        ["machine", f"{data.get('cpu_model') or 'unknown CPU'}, {data.get('cpu_count')} cores"],
        ["workload", f"{data['model']}, {data['profile']} profile, -k {data['select']!r}, "
                     f"repeats {data.get('repeats') or 'of the profile'}"],  # fmt: skip
        ["sessions", f"{data['sessions_per_series']} per series, interleaved; wall {sum(walls) / 60:.1f} min in all, "
                     f"{(sum(walls) / len(walls)) if walls else 0:.1f} s a session"],  # fmt: skip
        ["creep", f"+{STEP:.0%} every {every} sessions, cumulative; the slowdown first exceeds "
                  f"{CREEP_TARGET:.0%} at session {first_past(CREEP_TARGET, every)} "
                  f"({slowdown_for(first_past(CREEP_TARGET, every), every):.1%}), ends at "
                  f"{slowdown_for(data['sessions_per_series'] - 1, every):.1%}"],  # fmt: skip
        ["load", _loads(meta)],
        ["other work's CPU share in a repeat", _busy_summary(meta)],
        *_aa_spread(data),
        ["policy", ", ".join(f"{f.name}={getattr(policy, f.name)}" for f in fields(policy))],
    ]
    return _markdown(["setup", ""], rows)


def report(
    data: dict[str, Any], policy: ChangePointPolicy, resamples: int, seed: int = 0, trend_policy: TrendPolicy = TRENDS
) -> str:
    analysis = analyse(data, policy, resamples, seed)
    trends = trends_report(data, policy, resamples, seed, trend_policy)
    return "\n\n".join([setup_table(data, policy), figures_table(analysis), verdict_line(analysis), trends])


@dataclass(frozen=True, slots=True)
class Verdicts:
    """A series replayed session by session with the step search and the trend test beside it."""

    new_steps: tuple[int, ...]  # sessions (indices) that reported a new step
    new_trends: tuple[int, ...]
    new_regressions: tuple[int, ...]  # of either kind
    num_searched: int

    @property
    def num_false(self) -> int:
        """In an A/A series: every new step and every new trend is a false change."""
        return len(self.new_steps) + len(self.new_trends)


def steps_and_trends(series: Series, policy: ChangePointPolicy, trends: TrendPolicy = TRENDS) -> Verdicts:
    """After each session from ``min_points`` on, over the newest ``window_len`` (as ``replay_series``): the new
    steps and new trends a session would report."""
    steps, found, regressions = [], [], []
    for end in range(policy.min_points, len(series.points) + 1):
        detection = detect(replace(series, points=series.points[max(0, end - policy.window_len) : end]), policy)
        step, trend = head_step(detection), trend_beside_steps(detection, trends)
        new_step = step is not None and step.is_new
        new_trend = trend is not None and trend.is_new
        if new_step:
            steps.append(end - 1)
        if new_trend:
            found.append(end - 1)
        if (new_step and step.change_point.is_regression) or (new_trend and trend.trend.is_regression):
            regressions.append(end - 1)
    searched = max(0, len(series.points) - policy.min_points + 1)
    return Verdicts(tuple(steps), tuple(found), tuple(regressions), searched)


def trends_report(
    data: dict[str, Any], policy: ChangePointPolicy, resamples: int, seed: int = 0, trends: TrendPolicy = TRENDS
) -> str:
    """Per metric: the creep found by a new regression, step or trend (runs after it passes 10%, 0 or less: before),
    and the A/A false changes, steps and trends together, measured and resampled."""
    past = first_past(CREEP_TARGET, data["every"])
    creep = {(s.key.test_id, s.key.metric): s for s in build_series(documents_of(data, "creep"))}
    lines = [f"steps and trends together ({trends}):"]
    for aa in build_series(documents_of(data, "aa")):
        key = (aa.key.test_id, aa.key.metric)
        found = steps_and_trends(creep[key], policy, trends).new_regressions if key in creep else ()
        runs = next((index - past + 1 for index in found), None)
        measured = steps_and_trends(aa, policy, trends)
        rng = random.Random(f"{seed}-{key[0]}-{key[1]}-trends")
        _, draw = resampler(list(aa.values), rng)
        num_steps = num_trends = searched = 0
        for _ in range(resamples):
            points = tuple(replace(p, value=v) for p, v in zip(aa.points, draw(), strict=True))
            run = steps_and_trends(replace(aa, points=points), policy, trends)
            num_steps, num_trends = num_steps + len(run.new_steps), num_trends + len(run.new_trends)
            searched += run.num_searched
        false = num_steps + num_trends
        synthetic = (
            f"{100 * false / searched:.2f} per 100 ({false} of {searched}: {num_steps} steps + {num_trends} trends)"
            if searched
            else "not resampled"
        )
        creep_found = "not found" if runs is None else f"found at run {runs} after it passes {CREEP_TARGET:.0%}"
        lines.append(
            f"  {_short(key[0])} {key[1]}: creep {creep_found} (that run is 1; 0 or less: before); A/A measured "
            f"{len(measured.new_steps)} new steps + {len(measured.new_trends)} new trends in {measured.num_searched} "
            f"runs; resampled {synthetic}"
        )
    return "\n".join(lines)


def grid_report(data: dict[str, Any], resamples: int = 0, seed: int = 0) -> str:
    """The verdict line for every combination of GRID's thresholds, on the same recorded data (output throughput,
    replayed with ``replay_series``)."""
    runs = {name: documents_of(data, name) for name in SERIES_NAMES}
    series = {name: [s for s in build_series(runs[name]) if s.key.metric == HEADLINE] for name in SERIES_NAMES}
    lines = []
    for values in itertools.product(*GRID.values()):
        thresholds = dict(zip(GRID, values, strict=True))
        policy = replace(ChangePointPolicy(), **thresholds)
        creep = {(s.key.test_id, s.key.metric): replay_series(s, policy) for s in series["creep"]}
        aa = {(s.key.test_id, s.key.metric): replay_series(s, policy) for s in series["aa"]}
        resampled = {}
        if resamples:
            resampled = {(r.test_id, r.metric): r for r in resample_aa(runs["aa"], policy, resamples, seed)}
        rows = [
            {"key": key, "creep": creep.get(key), "aa": aa.get(key), "resampled": resampled.get(key)}
            for key in sorted(set(creep) | set(aa))
        ]
        analysis = {"rows": rows, "every": data["every"]}
        label = " ".join(f"{name}={value}" for name, value in thresholds.items())
        lines.append(f"{label}: {verdict_line(analysis)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ processes


def run_session(args: argparse.Namespace, work: Path, series: str, index: int) -> dict[str, Any]:
    """One pytest session of ``series``; what it injected, its load and wall time. Aborts unless it gave a point."""
    out_dir = work / f"{series}-{index:03d}"
    out_dir.mkdir(parents=True)
    slowdown = slowdown_for(index, args.every) if series == "creep" else 0.0
    commit = fake_commit(series, index)
    command = pytest_command(args, work / f"{series}.sqlite", out_dir)
    env = session_environment(dict(os.environ), slowdown, commit, out_dir / "slowdown.json")
    load_before = os.getloadavg()
    exit_code, wall_s = run_logged(command, work, env, out_dir)
    injected: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        injected = json.loads((out_dir / "slowdown.json").read_text())
    problem = None
    results = None
    if exit_code not in (0, 1):
        problem = f"pytest exited {exit_code}"
    else:
        with contextlib.suppress(ResultsFileError):
            results = read_results(out_dir / "results.json")
        if results is None or not any(t.measurement.samples.get(HEADLINE) for t in results.tests):
            problem = "no results.json with a measured test"
        elif slowdown and not injected.get("calls"):
            problem = f"the {slowdown:.1%} slowdown was never injected ({injected})"
        elif results.commit != commit:
            problem = f"results.json records commit {results.commit!r}, not the fake {commit}"
    if problem:
        raise CalibrationAborted(
            f"session {series}-{index}: {problem}\n--- stdout tail ---\n{_tail(out_dir / 'stdout.txt')}\n"
            f"--- stderr tail ---\n{_tail(out_dir / 'stderr.txt')}"
        )
    busy = [share for t in results.tests for share in t.measurement.samples.get("cpu_busy_share", ())]
    return {
        "series": series, "index": index, "commit": commit, "slowdown": slowdown, "exit_code": exit_code,
        "wall_s": wall_s, "load_before": list(load_before), "injected": injected,
        "max_busy_share": max(busy, default=0.0),
    }  # fmt: skip


def read_stores(work: Path) -> dict[str, list[dict[str, Any]]]:
    """Every session of each series' store, oldest first, as results documents."""
    from perfsuite.history.store import HistoryStore

    stores = {}
    for name in SERIES_NAMES:
        path = work / f"{name}.sqlite"
        if path.exists():
            with HistoryStore.open(path) as store:
                stores[name] = [lean(session.to_json()) for session in store.sessions()]
    return stores


def lean(document: dict[str, Any]) -> dict[str, Any]:
    """A results document without its tests' step timelines: most of its size, and no series reads them.

    Version 5 keeps a test's timeline in its measurement; the saved data of
    earlier runs (version 4) at the test's top level.
    """
    def without_timeline(test: dict[str, Any]) -> dict[str, Any]:
        if "measurement" in test:
            return {**test, "measurement": {**test["measurement"], "timeline": None}}
        return {**test, "timeline": None}

    return {**document, "tests": [without_timeline(test) for test in document["tests"]]}


def documents_of(data: dict[str, Any], name: str) -> list[Results]:
    """A series' saved sessions, of whichever results.json version they were saved in."""
    return [results_from_json(doc, f"{name} session {index}") for index, doc in enumerate(data["stores"].get(name, []))]


# ---------------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="--perf-model (smollm2-135m)")
    parser.add_argument("--profile", default="ci", help="--perf-profile (ci)")
    parser.add_argument("--repeats", type=int, help="--perf-repeats (default: the profile's)")
    parser.add_argument("-k", "--select", default=DEFAULT_SELECT, help=f"pytest -k ({DEFAULT_SELECT!r})")
    parser.add_argument("--sessions", type=int, default=40, help="sessions per series (40)")
    parser.add_argument("--every", type=int, default=3, help="a 2%% step every this many creep sessions (3)")
    parser.add_argument("--save", type=Path, help="write the raw data (every session) to this JSON file")
    parser.add_argument("--load", type=Path, help="re-print the table of a --save file, without measuring")
    parser.add_argument("--policy", help="thresholds other than the defaults: max_p_value=0.01,head_runs=3")
    parser.add_argument(
        "--trend-policy", help="the trend test's thresholds other than the defaults: max_p_value=0.01,window_runs=30"
    )
    parser.add_argument("--grid", action="store_true", help="with --load: the verdict for a grid of thresholds")
    parser.add_argument(
        "--resamples", type=int, help="synthetic A/A series per test, of output throughput (100; with --grid: 0)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (0)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (stores, reports)")
    args = parser.parse_args(argv)
    if args.sessions < 2 or args.every < 1:
        parser.error("--sessions must be at least 2 and --every at least 1")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.resamples is None:
        args.resamples = 0 if args.grid else 100
    if args.resamples < 0:
        parser.error("--resamples must be 0 or more")
    if args.grid and not args.load:
        parser.error("--grid replays saved data: give --load FILE")
    try:
        args.policy = policy_from_text(args.policy)
        args.trend_policy = policy_from_text(args.trend_policy, TRENDS, "--trend-policy")
    except ValueError as error:
        parser.error(str(error))
    return args


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        data = json.loads(args.load.read_text())
        if args.grid:
            print(grid_report(data, args.resamples, args.seed))
        else:
            print(report(data, args.policy, args.resamples, args.seed, args.trend_policy))
        return 0
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    work = Path(tempfile.mkdtemp(prefix="calibrate-history-"))
    data: dict[str, Any] = {
        "model": args.model, "profile": args.profile, "repeats": args.repeats, "select": args.select,
        "sessions_per_series": args.sessions, "every": args.every, "step": STEP, "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sessions": [], "stores": {},
    }  # fmt: skip
    status, keep = 0, args.keep
    plan = session_plan(args.sessions)
    print(f"work dir {work}", file=sys.stderr, flush=True)
    try:
        for number, (series, index) in enumerate(plan, 1):
            session = run_session(args, work, series, index)
            data["sessions"].append(session)
            print(
                f"[{number}/{len(plan)}] {series} #{index}: slowdown {session['slowdown']:.1%}, "
                f"{session['wall_s']:.1f}s, load {session['load_before'][0]:.2f}, "
                f"busy share up to {session['max_busy_share']:.0%}",
                file=sys.stderr,
                flush=True,
            )
    except CalibrationAborted as error:
        print(f"calibration aborted after {len(data['sessions'])} sessions: {error}", file=sys.stderr)
        status, keep = 2, True
    except KeyboardInterrupt:
        print(f"\ninterrupted after {len(data['sessions'])} of {len(plan)} sessions", file=sys.stderr)
        status = 130
    finally:
        data["stores"] = read_stores(work)
        data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if args.save and data["sessions"]:
            args.save.write_text(json.dumps(data))
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if data["sessions"] and status != 2:
        done = {s["series"] for s in data["sessions"]}
        if done == set(SERIES_NAMES):
            data["sessions_per_series"] = min(sum(s["series"] == n for s in data["sessions"]) for n in SERIES_NAMES)
            print(report(data, args.policy, args.resamples, args.seed, args.trend_policy))
    return status


if __name__ == "__main__":
    sys.exit(main())
