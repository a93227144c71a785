"""A/B against a reference (``--perf-against``) versus stored baselines: false alarms and detection, measured.

    .venv/bin/python bench/calibrate_ab.py [--rounds N] [--save runs.json]
    .venv/bin/python bench/calibrate_ab.py --load runs.json            # re-print the table, no measuring
    .venv/bin/python bench/calibrate_ab.py --model tiny-random --profile smoke --rounds 1 \
        -- --perf-busy-threshold 0.99                                   # plumbing only; its numbers mean nothing

What it runs. Whole ``pytest perfsuite/suites --perf`` sessions, as subprocesses,
each in a tree laid out from this repository's HEAD (``git archive``), in
three modes:

- ``ab``: ``--perf-against=<another copy of HEAD>``: every test's R repeats
  are R pairs, ABBA, in two workers (2R timed runs a test);
- ``stored``: against baselines recorded once, at the start, from HEAD, with
  the same R repeats (R timed runs a test: half the A/B session's cost);
- ``stored-2x``: the same with 2R repeats (and 2R-repeat baselines): as many
  timed runs as ``ab``, so the same wall-clock budget.

- ``ab-allcores``: as ``ab``, with every worker held to one intra-op thread
  per usable core (``--perf-against-threads N``), as before the workers'
  threads were chosen for the cores other work leaves free: the before of
  the busy-runner table;

and these conditions of the measured tree (side B in ``ab``):

- ``aa``: HEAD as it is (any regressed verdict is a false alarm);
- ``slow5`` / ``slow10`` / ``slow25``: HEAD with every ``ModelRunner.execute``
  busy-waiting 5% / 10% / 25% of its own time after it returns (appended to
  the tree's ``perfsuite/engine/model_runner.py``; the reference side of
  ``ab`` and the recorded baselines stay unslowed), as a uniformly slower
  kernel would. It busy-waits rather than sleeps, like bench/slowdown_plugin.py;
- ``loaded-aa`` / ``loaded-slow10``: ``aa`` / ``slow10`` while a second
  process busy-loops on one core for the whole session (a busy runner; not
  on ``--modes stored``, whose repeats would be noisy by design).

Sessions run in rounds; each round runs every (mode, condition) once, the
order rotated from round to round so that a drift of the machine hits every
cell alike. Run it on a quiet machine: stored-mode repeats taken while other
work kept the CPU busy are *noisy* (judged inconclusive), which this table
counts separately.

A session *flags* when pytest exits 1 or results.json holds a ``regressed``
verdict; a test *flags* when any of its comparisons is ``regressed``. Any
other exit code, a missing results.json, or a slowed tree whose busy-wait
never ran aborts the calibration with the session's output: a crash is never
counted as a pass.

Output: progress on stderr, a session a line; then one row per mode and
condition (sessions flagged, tests flagged / judged, tests noisy, mean wall
seconds a session, the busy-wait injected), and the last line

    ab_false_alarm=<pct>% ab_detect5=<pct>% ab_detect10=<pct>% stored_detect10=<pct>%

with per-test rates: ab_false_alarm is the share of ``ab``/``aa`` tests
flagged, ab_detect5 and ab_detect10 of ``ab``/``slow5`` and ``slow10`` tests,
stored_detect10 of ``stored-2x``/``slow10`` tests (the same cost as ``ab``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from perfsuite.ab.trees import extract_commit  # noqa: E402
from calibrate_e2e import (  # noqa: E402 - bench/ is not a package
    CalibrationAborted,
    _read_results,
    _tail,
    condition_rates,
    format_table,
    percent,
    run_logged,
    busy_neighbour,
    session_order,
    session_outcome,
)

REPO = BENCH.parent
MODES = ("ab", "stored", "stored-2x", "ab-allcores")
SLOWDOWNS = {"aa": 0.0, "slow5": 0.05, "slow10": 0.10, "slow25": 0.25}
LOADED = {"loaded-aa": "aa", "loaded-slow10": "slow10"}  # a condition under a busy neighbour: its tree
SELECT = "test_throughput and inflight and B8"
INJECTION_REPORT_ENV = "PERFSUITE_CALIBRATE_INJECTED"
SUMMARY = (  # (name on the last line, mode, condition)
    ("ab_false_alarm", "ab", "aa"),
    ("ab_detect5", "ab", "slow5"),
    ("ab_detect10", "ab", "slow10"),
    ("stored_detect10", "stored-2x", "slow10"),
)

SLOWDOWN_CODE = '''

# --- bench/calibrate_ab.py: every forward pass {fraction:.0%} slower (busy-wait), and how much was added ---
def _calibration_slowdown(execute, fraction):
    import atexit
    import json
    import os
    import time

    added = [0.0, 0]

    def report():
        path = os.environ.get("{env}")
        if path and added[1]:
            with open(path, "a") as out:
                out.write(json.dumps({{"pid": os.getpid(), "added_s": added[0], "calls": added[1]}}) + "\\n")

    atexit.register(report)

    def slowed(self, output, kv_cache):
        start = time.perf_counter()
        tokens = execute(self, output, kv_cache)
        now = time.perf_counter()
        deadline = now + fraction * (now - start)
        while time.perf_counter() < deadline:
            pass
        added[0] += time.perf_counter() - now
        added[1] += 1
        return tokens

    return slowed


ModelRunner.execute = _calibration_slowdown(ModelRunner.execute, {fraction!r})
'''


# ---------------------------------------------------------------------------------------------- trees


def lay_out(work: Path) -> dict[str, Path]:
    """HEAD's tree for each condition (slowed where asked) and one more as the A/B reference."""
    trees = {"reference": work / "reference"}
    trees.update({condition: work / condition for condition in SLOWDOWNS})
    for name, path in trees.items():
        _archive_head(path)
        fraction = SLOWDOWNS.get(name, 0.0)
        if fraction:
            runner = path / "perfsuite" / "engine" / "model_runner.py"
            runner.write_text(runner.read_text() + SLOWDOWN_CODE.format(fraction=fraction, env=INJECTION_REPORT_ENV))
    return trees


def _archive_head(into: Path) -> None:
    into.mkdir(parents=True)
    extract_commit(REPO, "HEAD", into)


# ---------------------------------------------------------------------------------------------- sessions


def pytest_command(args, mode: str, trees: dict[str, Path], work: Path, report_dir: Path, *, save=False) -> list[str]:
    repeats = args.repeats * (2 if mode == "stored-2x" else 1)
    all_cores = ["--perf-against-threads", str(len(os.sched_getaffinity(0)))] if mode == "ab-allcores" else []
    command = [sys.executable, "-m", "pytest", "perfsuite/suites", "--perf", "--perf-model", args.model,
               "--perf-profile", args.profile, "--perf-repeats", str(repeats), "--perf-report-dir", str(report_dir),
               "-k", args.select, "-p", "no:randomly", "-p", "no:cacheprovider", "-q", *args.pytest_args]  # fmt: skip
    if mode.startswith("ab"):
        return command + [f"--perf-against={trees['reference']}", *all_cores]
    command += ["--perf-baseline-dir", str(work / f"baselines-{repeats}")]
    return command + (["--perf-save-baseline"] if save else [])


def run_session(command: list[str], tree: Path, out_dir: Path) -> dict[str, Any]:
    """One pytest session in ``tree`` (so it imports that tree's perfsuite); its exit code, time, and injection."""
    out_dir.mkdir(parents=True, exist_ok=True)
    injected_path = out_dir / "injected.jsonl"
    env = {**os.environ, INJECTION_REPORT_ENV: str(injected_path)}
    exit_code, wall_s = run_logged(command, tree, env, out_dir)
    added = 0.0
    with contextlib.suppress(OSError):
        added = sum(json.loads(line)["added_s"] for line in injected_path.read_text().splitlines() if line.strip())
    return {"exit_code": exit_code, "wall_s": wall_s, "injected": {"added_s": added}}


def record_baselines(args, trees: dict[str, Path], work: Path, modes: Sequence[str]) -> None:
    for mode in [m for m in modes if not m.startswith("ab")]:
        out_dir = work / f"record-{mode}"
        command = pytest_command(args, mode, trees, work, out_dir, save=True)
        print(f"recording {mode} baselines ...", file=sys.stderr, flush=True)
        run = run_session(command, trees["aa"], out_dir)
        if run["exit_code"] != 0:
            raise CalibrationAborted(f"recording {mode} baselines exited {run['exit_code']}\n{_tail(out_dir / 'stdout.txt')}")


def measure(args, work: Path) -> dict[str, Any]:
    trees = lay_out(work)
    modes, conditions = args.modes, args.conditions
    record_baselines(args, trees, work, modes)
    cells = [f"{mode}:{condition}" for mode in modes for condition in conditions]
    sessions = []
    for index, (cell, round_index) in enumerate(session_order(cells, args.rounds)):
        mode, condition = cell.split(":")
        out_dir = work / "sessions" / f"{index:03d}-{mode}-{condition}"
        tree = LOADED.get(condition, condition)
        with busy_neighbour(condition in LOADED):
            run = run_session(pytest_command(args, mode, trees, work, out_dir), trees[tree], out_dir)
        try:
            outcome = session_outcome(_read_results(out_dir), run["exit_code"])
            if SLOWDOWNS[tree] and not run["injected"]["added_s"]:
                raise CalibrationAborted(f"{condition}: the slowed tree's busy-wait never ran")
        except CalibrationAborted as error:
            raise CalibrationAborted(f"{cell} (round {round_index}): {error}\n{_tail(out_dir / 'stdout.txt')}") from None
        session = {"condition": cell, "mode": mode, "round": round_index, **run, **outcome}
        sessions.append(session)
        flagged = sum(t["flagged"] for t in outcome["tests"])
        print(f"[{index + 1}/{len(cells) * args.rounds}] {cell:<18} exit {run['exit_code']} "
              f"tests flagged {flagged}/{len(outcome['tests'])} {run['wall_s']:.0f}s", file=sys.stderr, flush=True)  # fmt: skip
    return {"model": args.model, "profile": args.profile, "repeats": args.repeats, "select": args.select,
            "rounds": args.rounds, "cells": cells, "sessions": sessions}  # fmt: skip


# ---------------------------------------------------------------------------------------------- the table


def throughput_figures(sessions: Sequence[dict[str, Any]], cell: str, key: str = "change") -> list[float]:
    """A field of every throughput comparison of a cell's tests (``change``, ``min_detectable_effect``) where set."""
    return [
        c[key]
        for s in sessions
        if s["condition"] == cell
        for t in s["tests"]
        for c in t["comparisons"]
        if c["metric"] == "output_throughput" and c.get(key) is not None
    ]


def cell_threads(sessions: Sequence[dict[str, Any]], cell: str) -> str:
    """The workers' thread counts an A/B cell's tests ran with, e.g. "1" or "1-2"; "-" for stored mode."""
    counts = sorted({t.get("num_threads") for s in sessions if s["condition"] == cell for t in s["tests"]} - {None})
    return "-" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def cell_busy(sessions: Sequence[dict[str, Any]], cell: str) -> str:
    """The median share of the machine other work used during B's runs (the current tree's) in a cell."""
    shares = sorted(share for s in sessions if s["condition"] == cell for t in s["tests"]
                    for share in t.get("busy_shares") or ())  # fmt: skip
    return f"{100 * shares[len(shares) // 2]:.0f}%" if shares else "n/a"


def _median_text(values: Sequence[float], signed: bool) -> str:
    if not values:
        return "n/a"
    middle = sorted(values)[len(values) // 2]
    return f"{100 * middle:+.1f}%" if signed else f"{100 * middle:.1f}%"


def report(data: dict[str, Any]) -> str:
    sessions = data["sessions"]
    rates = condition_rates(sessions, [c for c in data["cells"] if any(s["condition"] == c for s in sessions)])
    rows = []
    for cell, r in rates.items():
        mdes = throughput_figures(sessions, cell, "min_detectable_effect")
        rows.append([cell, f"{r['sessions_flagged']}/{r['sessions']} ({percent(r['session_rate'])})",
                     f"{r['tests_flagged']}/{r['tests_judged']} ({percent(r['test_rate'])})",
                     f"{r['tests_noisy']}/{r['tests_judged']}", _median_text(throughput_figures(sessions, cell), True),
                     _median_text(mdes, False), f"{100 * max(mdes):.1f}%" if mdes else "n/a",
                     cell_threads(sessions, cell), cell_busy(sessions, cell),
                     f"{r['mean_wall_s']:.0f}", f"{r['mean_injected_s']:.1f}"])  # fmt: skip
    headers = ["mode:condition", "sessions flagged", "tests flagged", "tests noisy", "median tok/s change",
               "median tok/s MDE", "max tok/s MDE", "threads", "other work (B's runs)", "mean wall s",
               "busy-wait s"]  # fmt: skip
    header = (f"model={data['model']} profile={data['profile']} repeats={data['repeats']} (pairs in ab; x2 in "
              f"stored-2x) select={data['select']!r} rounds={data['rounds']}")  # fmt: skip
    return "\n".join([header, format_table(headers, rows), summary_line(rates)])


def summary_line(rates: dict[str, dict]) -> str:
    parts = []
    for name, mode, condition in SUMMARY:
        r = rates.get(f"{mode}:{condition}")
        parts.append(f"{name}={percent(None if r is None else r['test_rate'])}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="sessions per mode and condition (default 3)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--repeats", type=int, default=7, help="per test: pairs in ab, repeats in stored (default 7)")
    parser.add_argument("-k", dest="select", default=SELECT, help=f"tests to run (default {SELECT!r})")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--conditions", type=lambda s: s.split(","), default=list(SLOWDOWNS))
    parser.add_argument("--save", type=Path, help="write the sessions to this JSON file")
    parser.add_argument("--load", type=Path, help="print the table of saved sessions; measure nothing")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (trees, outputs)")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest options for every session")
    args = parser.parse_args(argv)
    if args.load:
        print(report(json.loads(args.load.read_text())))
        return 0
    unknown = [m for m in args.modes if m not in MODES] + [
        c for c in args.conditions if c not in SLOWDOWNS and c not in LOADED
    ]
    if unknown:
        parser.error(f"unknown mode or condition: {', '.join(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="perfsuite-calibrate-ab-"))
    try:
        data = measure(args, work)
    except CalibrationAborted as error:
        print(f"calibration aborted: {error}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.save:
        args.save.write_text(json.dumps(data, indent=1))
    print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
