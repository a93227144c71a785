"""End-to-end calibration: how often does a real ``pytest --perf`` session cry wolf, and catch a slowdown?

    .venv/bin/python bench/calibrate_e2e.py [--setting small|full] [--sessions N] [--save runs.json]
    .venv/bin/python bench/calibrate_e2e.py --load runs.json          # re-print the table, no measuring
    .venv/bin/python bench/calibrate_e2e.py --conditions aa,slow25 -k test_throughput -- --perf-engines inflight

What it measures. bench/calibrate.py simulates sessions from measured blocks;
this script runs the real thing: whole ``pytest perfsuite/suites --perf`` sessions,
as subprocesses, on this machine, with whatever the plugin does today (probe
normalisation, the session-wide correction, noisy-repeat detection, ...).

How. It first records baselines into a fresh temporary directory
(``--perf-save-baseline --perf-baseline-dir TMP/baselines``), then runs
``--sessions`` sessions of each condition against them, in a rotating order
(round r starts at the r-th condition) so that drift of the machine hits every
condition alike:

- ``aa``: the unchanged code (any flag is a false alarm);
- ``loaded-aa``: the unchanged code while a second process busy-loops on one
  core for the whole session (a noisy neighbour: any flag is a false alarm);
- ``slow10`` / ``slow25``: every ``ModelRunner.execute`` busy-waits 10% / 25%
  of its own time (bench/slowdown_plugin.py, loaded with ``-p`` in every
  session, off for the others), as a uniformly slower kernel would;
- ``loaded-slow25``: the 25% slowdown under the busy loop (is it still caught?).

Run it on a quiet machine: the recording must pass (perfsuite does not save a
baseline whose repeats ran while other work kept the machine busy, and the
calibration then aborts), and other work during the sessions lands on
whichever condition is running. Each session's 1-minute load average is kept.

A session *flags* when pytest exits 1 (a failed test, or a regression found by
the final adjustment at session end) or its results.json holds any
``regressed`` verdict. A test *flags* when any of its comparisons in
results.json (the final, session-end verdicts) is ``regressed``; it is
*noisy* when results.json marks it so (its ``noisy`` field, or a ``noisy``
verdict: repeats taken while the machine was busy, never a regression), and
*judged* when it has comparisons (it had a baseline) or is noisy. Any
other pytest exit code (2 interrupted, 3 internal error, 4 usage error, 5 no
tests), a missing results.json, a session that judged no test or a slowdown
that was never injected aborts the calibration with the session's output
tail: a crash is never counted as a pass.

How long. The small setting (default: SmolLM2-135M, ci profile,
``-k "test_throughput and inflight and B8"``, 3 tests a session, 3 sessions
of each of the 5 conditions) runs 15 sessions plus the recording, each about
1.5-2 minutes on 2 cores: about 30-35 minutes. ``--setting full`` runs the
whole ci selection (about 10 minutes a session) 5 times per condition: about
4-5 hours. ``--model tiny-random --profile smoke --repeats 6 --sessions 1
-k test_throughput`` checks the plumbing in a couple of minutes (its numbers
mean nothing). Ctrl-C (or SIGTERM) stops the running session and the busy
loop, and prints the table of the sessions done; ``--save`` keeps them too.

Reading the output. Progress goes to stderr, one line a session. Then a
table, one row per condition: sessions, sessions flagged (%), tests flagged /
tests judged (%), tests noisy / tests judged (%), mean wall time a session
(start-up and model load included; slowed sessions take longer, loaded ones
may too) and the mean busy-wait the slowdown added to a session (0 for the
unslowed conditions: the check that the injection ran). The last line is

    sessions=<n> false_alarm=<pct>% loaded_false_alarm=<pct>% detect10=<pct>% detect25=<pct>% test_detect25=<pct>%

n: sessions run (not counting the recording); false_alarm and
loaded_false_alarm: the flagged share of aa and loaded-aa sessions (lower is
better); detect10 and detect25: of slow10 and slow25 sessions (higher is
better); test_detect25: the share of slow25's judged tests that flagged (what
one test alone catches). A condition not run shows ``n/a``. Few sessions give
coarse rates: 3 sessions can only say 0%, 33%, 67% or 100%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent

# name: (slowdown fraction, busy neighbour)
CONDITIONS: dict[str, tuple[float, bool]] = {
    "aa": (0.0, False),
    "loaded-aa": (0.0, True),
    "slow10": (0.10, False),
    "slow25": (0.25, False),
    "loaded-slow25": (0.25, True),
}
SMALL_SELECT = "test_throughput and inflight and B8"
SETTINGS = {"small": {"select": SMALL_SELECT, "sessions": 3}, "full": {"select": None, "sessions": 5}}
SUMMARY_RATES = (  # (name on the last line, condition, rate)
    ("false_alarm", "aa", "sessions"),
    ("loaded_false_alarm", "loaded-aa", "sessions"),
    ("detect10", "slow10", "sessions"),
    ("detect25", "slow25", "sessions"),
    ("test_detect25", "slow25", "tests"),
)
BUSY_LOOP = "while True: pass"
COMPARISON_FIELDS = ("metric", "verdict", "change", "p_adjusted", "baseline_median", "current_median",
                     "min_detectable_effect")  # fmt: skip
TAIL_LINES = 40


class CalibrationAborted(RuntimeError):
    """A session that did not produce a verdict; the message says which and shows its output."""


# ---------------------------------------------------------------------------------------------- pure helpers


def session_order(conditions: Sequence[str], sessions: int) -> list[tuple[str, int]]:
    """(condition, session index) in run order: round r runs every condition, starting at the r-th."""
    order = []
    for round_index in range(sessions):
        shift = round_index % len(conditions) if conditions else 0
        order += [(name, round_index) for name in [*conditions[shift:], *conditions[:shift]]]
    return order


def outcome_of_test(test: dict[str, Any]) -> dict[str, Any]:
    """One results.json ``tests[]`` entry: judged, flagged, noisy, and its comparisons' verdicts.

    Schema version 5 keeps comparisons under ``judgement`` and ``noisy`` under ``measurement``; older
    versions kept both on the test itself.
    """
    judged, measured = test.get("judgement") or test, test.get("measurement") or test
    comparisons = judged.get("comparisons") or []
    verdicts = [c.get("verdict") for c in comparisons]
    noisy = bool(measured.get("noisy")) or "noisy" in verdicts
    return {
        "test_id": test.get("test_id"),
        "judged": bool(comparisons) or noisy,  # noisy: judged inconclusive, whether or not comparisons are kept
        "flagged": "regressed" in verdicts,
        "noisy": noisy,
        "noisy_reason": measured.get("noisy") if isinstance(measured.get("noisy"), str) else None,
        "comparisons": [{key: c.get(key) for key in COMPARISON_FIELDS} for c in comparisons],
        "num_threads": (test.get("reference") or {}).get("num_threads"),  # an A/B test's workers' threads
        "busy_shares": list((measured.get("samples") or {}).get("cpu_busy_share") or []),
    }


def session_outcome(results: dict[str, Any] | None, exit_code: int) -> dict[str, Any]:
    """What one session says: flagged (pytest exit 1 or a regressed verdict) and its tests' outcomes.

    Only exit codes 0 and 1 carry a verdict; any other raises CalibrationAborted,
    as do a missing results.json and a session where no test had a baseline.
    """
    if exit_code not in (0, 1):
        raise CalibrationAborted(f"pytest exited {exit_code} ({_EXIT_NAMES.get(exit_code, 'unknown')})")
    if not isinstance(results, dict) or not isinstance(results.get("tests"), list):
        raise CalibrationAborted(f"pytest exited {exit_code} but wrote no usable results.json")
    tests = [outcome_of_test(test) for test in results["tests"] if isinstance(test, dict)]
    if not any(test["judged"] for test in tests):
        raise CalibrationAborted(
            f"no test was compared with a baseline ({len(tests)} tests in results.json): "
            "were the baselines recorded for this model, profile and machine?"
        )
    regressed = any(test["flagged"] for test in tests)
    return {
        "exit_code": exit_code,
        "flagged": exit_code == 1 or regressed,
        "regressed_in_results": regressed,
        "tests": tests,
    }


_EXIT_NAMES = {
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected: does -k select any test of this profile?",
}


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def condition_rates(sessions: Iterable[dict[str, Any]], conditions: Sequence[str] | None = None) -> dict[str, dict]:
    """Per condition (in ``conditions`` order, default first seen): counts, rates and mean wall time."""
    sessions = list(sessions)
    names = list(conditions) if conditions is not None else list(dict.fromkeys(s["condition"] for s in sessions))
    rates = {}
    for name in names:
        mine = [s for s in sessions if s["condition"] == name]
        judged = [t for s in mine for t in s["tests"] if t["judged"]]
        flagged = sum(s["flagged"] for s in mine)
        tests_flagged = sum(t["flagged"] for t in judged)
        tests_noisy = sum(t["noisy"] for t in judged)
        rates[name] = {
            "sessions": len(mine),
            "sessions_flagged": flagged,
            "session_rate": _rate(flagged, len(mine)),
            "tests_judged": len(judged),
            "tests_flagged": tests_flagged,
            "test_rate": _rate(tests_flagged, len(judged)),
            "tests_noisy": tests_noisy,
            "noisy_rate": _rate(tests_noisy, len(judged)),
            "mean_wall_s": sum(s["wall_s"] for s in mine) / len(mine) if mine else None,
            "mean_injected_s": sum((s.get("injected") or {}).get("added_s", 0.0) for s in mine) / len(mine)
            if mine
            else None,
            "exit1_without_regression": sum(s["exit_code"] == 1 and not s["regressed_in_results"] for s in mine),
        }
    return rates


def percent(rate: float | None) -> str:
    return "n/a" if rate is None or math.isnan(rate) else f"{100 * rate:.0f}%"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def rate_table(rates: dict[str, dict]) -> str:
    rows = []
    for name, r in rates.items():
        rows.append(
            [
                name,
                r["sessions"],
                f"{r['sessions_flagged']}/{r['sessions']} ({percent(r['session_rate'])})",
                f"{r['tests_flagged']}/{r['tests_judged']} ({percent(r['test_rate'])})",
                f"{r['tests_noisy']}/{r['tests_judged']} ({percent(r['noisy_rate'])})",
                "n/a" if r["mean_wall_s"] is None else f"{r['mean_wall_s']:.1f}",
                "n/a" if r["mean_injected_s"] is None else f"{r['mean_injected_s']:.1f}",
            ]
        )
    headers = ["condition", "sessions", "sessions flagged", "tests flagged/judged", "tests noisy/judged"]
    headers += ["mean wall s", "busy-wait s"]
    return format_table(headers, rows)


def summary_line(rates: dict[str, dict], total_sessions: int) -> str:
    """The last line: ``sessions=<n> false_alarm=<pct>% ... test_detect25=<pct>%`` (n/a for a condition not run)."""
    parts = [f"sessions={total_sessions}"]
    for label, condition, kind in SUMMARY_RATES:
        r = rates.get(condition)
        rate = None if r is None else r["session_rate" if kind == "sessions" else "test_rate"]
        parts.append(f"{label}={percent(rate)}")
    return " ".join(parts)


def report(data: dict[str, Any]) -> str:
    """The table, notes and the last line for saved (or just measured) calibration data."""
    sessions = data["sessions"]
    conditions = [c for c in data.get("conditions") or CONDITIONS if any(s["condition"] == c for s in sessions)]
    rates = condition_rates(sessions, conditions)
    lines = [
        f"model={data.get('model')} profile={data.get('profile')} repeats={data.get('repeats') or 'profile'} "
        f"select={data.get('select')!r} sessions/condition={data.get('sessions_per_condition')} "
        f"recording={_seconds(data.get('record_wall_s'))}",
        rate_table(rates),
    ]
    odd = sum(r["exit1_without_regression"] for r in rates.values())
    if odd:
        lines.append(
            f"note: {odd} session(s) exited 1 with no regressed verdict in results.json (counted as flagged); "
            "their output tails are in the saved data"
        )
    lines.append(summary_line(rates, len(sessions)))
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}s"


# ------------------------------------------------------------------------------------------------ processes


def _die_with_parent(sig: int):
    """A preexec_fn: the child gets ``sig`` when this process dies, even by SIGKILL (Linux; else a no-op)."""

    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    except (ImportError, OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG

    return preexec


def _stop(process: subprocess.Popen | None, grace_s: float = 5.0) -> None:
    """Terminate a child started in its own session, and its process group; kill it if it lingers."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_logged(command: list[str], cwd: Path, env: dict[str, str], out_dir: Path) -> tuple[int, float]:
    """Run ``command`` to its end: its exit code and wall seconds; the command and its output kept in ``out_dir``.

    It runs in a session of its own, so Ctrl-C reaches only this script, which
    stops it; it dies with this script too.
    """
    (out_dir / "command.txt").write_text(" ".join(command) + "\n")
    process = None
    with open(out_dir / "stdout.txt", "wb") as stdout, open(out_dir / "stderr.txt", "wb") as stderr:
        start = time.perf_counter()
        try:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                start_new_session=True, preexec_fn=_die_with_parent(signal.SIGTERM),
            )  # fmt: skip
            exit_code = process.wait()
        finally:
            _stop(process)
    return exit_code, time.perf_counter() - start


@contextlib.contextmanager
def busy_neighbour(enabled: bool):
    """A second process busy-looping on one core for the duration; always killed on the way out."""
    if not enabled:
        yield None
        return
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY_LOOP],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGKILL),
    )
    try:
        yield busy
    finally:
        with contextlib.suppress(ProcessLookupError):
            busy.kill()
        busy.wait()


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pytest_command(args, baseline_dir: Path, report_dir: Path, *, save_baseline: bool = False) -> list[str]:
    command = [sys.executable, "-m", "pytest", "perfsuite/suites", "--perf"]
    if save_baseline:
        command.append("--perf-save-baseline")
    command += ["--perf-baseline-dir", str(baseline_dir), "--perf-report-dir", str(report_dir)]
    command += ["--perf-model", args.model, "--perf-profile", args.profile]
    if args.repeats:
        command += ["--perf-repeats", str(args.repeats)]
    if args.select:
        command += ["-k", args.select]
    return command + ["-p", "slowdown_plugin", "-p", "no:randomly", "-q", *args.pytest_args]


def run_session(command: list[str], out_dir: Path, slowdown: float, loaded: bool) -> dict[str, Any]:
    """Run one pytest session (its output to out_dir); its exit code, wall time and what the plugin injected."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), env.get("PYTHONPATH")]))
    env["PERFSUITE_SLOWDOWN"] = repr(slowdown)
    env["PERFSUITE_SLOWDOWN_REPORT"] = str(out_dir / "slowdown.json")
    load_before = os.getloadavg()[0]
    with busy_neighbour(loaded):
        exit_code, wall_s = run_logged(command, REPO, env, out_dir)
    injected = None
    with contextlib.suppress(OSError, ValueError):
        injected = json.loads((out_dir / "slowdown.json").read_text())
    return {"exit_code": exit_code, "wall_s": wall_s, "load_before": load_before, "injected": injected}


def _read_results(report_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((report_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None


def _abort_message(what: str, error: str, out_dir: Path) -> str:
    return (
        f"{what}: {error}\n--- stderr tail ({out_dir / 'stderr.txt'}) ---\n{_tail(out_dir / 'stderr.txt')}\n"
        f"--- stdout tail ({out_dir / 'stdout.txt'}) ---\n{_tail(out_dir / 'stdout.txt')}"
    )


def record_baselines(args, work: Path) -> float:
    out_dir = work / "record"
    command = pytest_command(args, work / "baselines", out_dir, save_baseline=True)
    print(f"recording baselines: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    run = run_session(command, out_dir, 0.0, False)
    if run["exit_code"] != 0:
        error = f"pytest exited {run['exit_code']} ({_EXIT_NAMES.get(run['exit_code'], 'failed tests')})"
        raise CalibrationAborted(_abort_message("recording the baselines failed", error, out_dir))
    if not any(path.is_file() for path in (work / "baselines").rglob("*")):
        raise CalibrationAborted(_abort_message("recording the baselines failed", "no baseline file written", out_dir))
    print(f"recorded in {run['wall_s']:.1f}s", file=sys.stderr, flush=True)
    return run["wall_s"]


def measure_session(args, work: Path, condition: str, index: int) -> dict[str, Any]:
    slowdown, loaded = CONDITIONS[condition]
    out_dir = work / f"{condition}-{index}"
    run = run_session(pytest_command(args, work / "baselines", out_dir), out_dir, slowdown, loaded)
    what = f"session {condition}-{index}"
    try:
        outcome = session_outcome(_read_results(out_dir), run["exit_code"])
    except CalibrationAborted as error:
        raise CalibrationAborted(_abort_message(what, str(error), out_dir)) from None
    injected = run["injected"] or {}
    if slowdown and not injected.get("calls"):
        raise CalibrationAborted(
            _abort_message(what, f"the {slowdown:.0%} slowdown was never injected (plugin report: {injected})", out_dir)
        )
    session = {"condition": condition, "index": index, **run, **outcome}
    if outcome["exit_code"] == 1 and not outcome["regressed_in_results"]:
        session["output_tail"] = _tail(out_dir / "stdout.txt")
        print(f"warning: {what} exited 1 with no regressed verdict:\n{session['output_tail']}", file=sys.stderr)
    return session


# ---------------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="--perf-model (smollm2-135m)")
    parser.add_argument("--profile", default="ci", help="--perf-profile (ci)")
    parser.add_argument("--repeats", type=int, help="--perf-repeats (default: the profile's)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="small", help="small (default) or full")
    parser.add_argument("-k", "--select", help=f"pytest -k selection (small: {SMALL_SELECT!r}; full: none)")
    parser.add_argument("--sessions", type=int, help="sessions per condition (small: 3, full: 5)")
    parser.add_argument("--conditions", default=",".join(CONDITIONS), help="comma list (default: all five)")
    parser.add_argument("--save", type=Path, help="write every session's raw outcome to this JSON file")
    parser.add_argument("--load", type=Path, help="re-print the table of a --save file, without measuring")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (baselines, reports)")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for every session")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    if args.select is None:
        args.select = setting["select"]
    elif not args.select.strip():
        args.select = None  # -k "" : the whole selection
    if args.sessions is None:
        args.sessions = setting["sessions"]
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = [c for c in args.conditions if c not in CONDITIONS]
    if unknown or not args.conditions:
        unknown_text = ", ".join(unknown) or "(none given)"
        parser.error(f"--conditions: unknown {unknown_text}; choose from {', '.join(CONDITIONS)}")
    if args.sessions < 1:
        parser.error("--sessions must be at least 1")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        print(report(json.loads(args.load.read_text())))
        return 0
    # Ctrl-C, kill and a closed terminal all unwind through the finally blocks that stop the children
    # (SIGINT too: a shell starts a background job with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    work = Path(tempfile.mkdtemp(prefix="calibrate-e2e-"))
    data = {
        "model": args.model,
        "profile": args.profile,
        "repeats": args.repeats,
        "select": args.select,
        "pytest_args": args.pytest_args,
        "conditions": args.conditions,
        "sessions_per_condition": args.sessions,
        "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "record_wall_s": None,
        "sessions": [],
    }
    status, keep = 0, args.keep
    order = session_order(args.conditions, args.sessions)
    try:
        print(f"work dir {work}", file=sys.stderr, flush=True)
        data["record_wall_s"] = record_baselines(args, work)
        for number, (condition, index) in enumerate(order, 1):
            session = measure_session(args, work, condition, index)
            data["sessions"].append(session)
            tests = [t for t in session["tests"] if t["judged"]]
            print(
                f"[{number}/{len(order)}] {condition} #{index}: exit {session['exit_code']}, "
                f"{'FLAGGED' if session['flagged'] else 'passed'}, tests flagged "
                f"{sum(t['flagged'] for t in tests)}/{len(tests)}, noisy {sum(t['noisy'] for t in tests)}, "
                f"{session['wall_s']:.1f}s (load {session['load_before']:.2f})",
                file=sys.stderr,
                flush=True,
            )
    except CalibrationAborted as error:
        print(f"calibration aborted, {len(data['sessions'])} sessions done: {error}", file=sys.stderr)
        print(f"(kept {work})", file=sys.stderr)
        status, keep = 2, True
    except KeyboardInterrupt:
        print(f"\ninterrupted after {len(data['sessions'])} of {len(order)} sessions", file=sys.stderr)
        status = 130
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        elif status != 2:
            print(f"kept {work}", file=sys.stderr)
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.save and (data["sessions"] or status == 0):
        args.save.write_text(json.dumps(data, indent=1))
    if status == 2:
        return status
    if data["sessions"]:
        print(report(data))
    return status


if __name__ == "__main__":
    sys.exit(main())
