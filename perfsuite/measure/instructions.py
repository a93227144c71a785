"""Host instructions per engine step, counted under Valgrind: a figure that does not move with the machine's load.

Wall time on a shared machine moves by several percent between sessions, so
a 1% host-side regression (the scheduler, the block manager, the loop) is
lost in it. Valgrind's cachegrind runs the code on a simulated CPU and
counts the instructions it executes, a figure the machine's load does not
enter (it moves only with where the objects lie in memory: up to about 0.36%
between sessions, docs/benchmarks.md).

Python cannot issue Valgrind's client requests (they are inline machine
code), and cachegrind 3.19 has no start/stop requests at all, so the region
is isolated by difference: the workload's process
(``perfsuite.measure.instructions_child``) runs twice under cachegrind, once
with no measured run and once with ``runs`` of them, after the same start,
imports, build and warm-up run. The difference is the measured runs' alone;
divided by their engine steps it is the instructions per step. This needs
neither a C compiler nor Valgrind's headers, and works on every Valgrind
version with cachegrind.

``PYTHONHASHSEED=0`` fixes the order of sets and dicts of strings, so both
processes take the same paths; the environment is fixed too
(``child_environment``), since its size moves the objects' addresses; and the process runs once natively first so
that neither counted one compiles bytecode the other loads (``prime``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from perfsuite.measure.instruction_workload import InstructionWorkload

CHILD_MODULE = "perfsuite.measure.instructions_child"
DEFAULT_RUNS = 2
CHILD_TIMEOUT_SECONDS = 900.0
PASSED_PREFIX = "PERFSUITE_"  # the caller's variables the counted process sees (child_environment)
NO_VALGRIND = (
    "valgrind is not installed (no 'valgrind' on PATH): the instruction lane counts instructions under it; "
    "install it (Debian/Ubuntu: apt-get install valgrind) or leave --perf-instructions off"
)


class InstructionCountError(RuntimeError):
    """The workload's process failed under Valgrind, or its counts make no sense."""


@dataclass(frozen=True, slots=True)
class EventCounts:
    """Cachegrind's totals for one process: instructions, and with the cache simulation its simulated misses."""

    instructions: int
    l1_misses: int | None = None  # I1 + D1 read and write misses
    last_level_misses: int | None = None  # LL misses, instruction and data


@dataclass(frozen=True, slots=True)
class InstructionCount:
    """One measurement of a workload: its host instructions per engine step, and what it cost to count them."""

    workload: InstructionWorkload
    instructions_per_step: float
    steps_per_run: int
    measured_runs: int
    l1_misses_per_step: float | None
    last_level_misses_per_step: float | None
    seconds: float  # wall time of both processes under Valgrind
    valgrind: str  # its version line


def valgrind_unavailable() -> str | None:
    """Why the lane cannot run here, with the fix; None when ``valgrind`` is on PATH."""
    return None if shutil.which("valgrind") else NO_VALGRIND


def valgrind_version() -> str:
    completed = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False, timeout=60)
    return completed.stdout.strip()


def count_instructions(
    workload: InstructionWorkload,
    *,
    runs: int = DEFAULT_RUNS,
    cache_sim: bool = False,
    cwd: Path | None = None,
) -> InstructionCount:
    """The workload's instructions per engine step: its ``runs`` measured runs' count over their steps.

    ``cache_sim`` also simulates the caches (about twice as slow) and
    reports the misses per step. ``cwd`` is where a user's engine module is
    imported from (the test's rootdir). Raises ``InstructionCountError``
    when Valgrind is missing or the process fails.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    missing = valgrind_unavailable()
    if missing is not None:
        raise InstructionCountError(missing)
    started = time.perf_counter()
    prime(workload, cwd)
    with tempfile.TemporaryDirectory(prefix="perfsuite-cachegrind-") as scratch:
        setup, _ = count_process(workload, 0, cache_sim, Path(scratch) / "setup.out", cwd)
        measured, steps = count_process(workload, runs, cache_sim, Path(scratch) / "measured.out", cwd)
    return per_step(workload, setup, measured, steps, time.perf_counter() - started, valgrind_version())


def per_step(
    workload: InstructionWorkload,
    setup: EventCounts,
    measured: EventCounts,
    steps_per_run: list[int],
    seconds: float,
    valgrind: str,
) -> InstructionCount:
    """The measured runs' share of the counts (``measured`` less ``setup``), per engine step."""
    if not steps_per_run or min(steps_per_run) < 1 or len(set(steps_per_run)) != 1:
        raise InstructionCountError(
            f"{workload.engine}: the measured runs took {steps_per_run} engine steps; each run must take the same "
            "number, at least one (an engine whose steps vary from run to run cannot be counted per step)"
        )
    total_steps = sum(steps_per_run)
    difference = measured.instructions - setup.instructions
    if difference <= 0:
        raise InstructionCountError(
            f"{workload.engine}: {len(steps_per_run)} runs counted {difference} instructions more than none; "
            "the runs did no work, or the two processes took different paths"
        )
    return InstructionCount(
        workload,
        difference / total_steps,
        steps_per_run[0],
        len(steps_per_run),
        _missing_or_per_step(setup.l1_misses, measured.l1_misses, total_steps),
        _missing_or_per_step(setup.last_level_misses, measured.last_level_misses, total_steps),
        seconds,
        valgrind,
    )


def _missing_or_per_step(setup: int | None, measured: int | None, steps: int) -> float | None:
    return None if setup is None or measured is None else (measured - setup) / steps


def prime(workload: InstructionWorkload, cwd: Path | None) -> None:
    """Run the workload's process once, natively, before the counted two.

    Python compiles a module whose bytecode cache is missing or stale and
    writes the cache: left to the counted processes, the first would compile
    and the second load, and the difference would be off by the compilation
    (measured: 0.03% to 0.3% of a step after an edit). A workload that fails
    fails here too, in a second rather than under Valgrind.
    """
    command = [sys.executable, "-m", CHILD_MODULE, json.dumps(workload.to_json()), "0"]
    completed = subprocess.run(
        command, capture_output=True, text=True, env=child_environment(cwd), cwd=cwd, timeout=CHILD_TIMEOUT_SECONDS
    )
    if completed.returncode != 0:
        raise InstructionCountError(
            f"{workload.label}: the workload's process exited {completed.returncode}:\n"
            f"{completed.stderr.strip()[-2000:]}"
        )


def count_process(
    workload: InstructionWorkload, runs: int, cache_sim: bool, out_file: Path, cwd: Path | None
) -> tuple[EventCounts, list[int]]:
    """One process under cachegrind: its totals (written to ``out_file``) and the steps of its ``runs`` runs."""
    command = [
        "valgrind",
        "--tool=cachegrind",
        f"--cache-sim={'yes' if cache_sim else 'no'}",
        f"--cachegrind-out-file={out_file}",
        "-q",
        sys.executable,
        "-m",
        CHILD_MODULE,
        json.dumps(workload.to_json()),
        str(runs),
    ]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, env=child_environment(cwd), cwd=cwd, timeout=CHILD_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired as error:
        raise InstructionCountError(
            f"{workload.label}: not done under Valgrind after {CHILD_TIMEOUT_SECONDS:.0f} s; make the workload smaller"
        ) from error
    if completed.returncode != 0:
        raise InstructionCountError(
            f"{workload.label}: the counted process exited {completed.returncode}:\n{completed.stderr.strip()[-2000:]}"
        )
    return read_cachegrind_totals(out_file.read_text()), steps_from_output(completed.stdout)


def child_environment(cwd: Path | None) -> dict[str, str]:
    """A fixed environment: PATH, this perfsuite (and the rootdir) first on the path, hash randomisation off,
    UTF-8, and the caller's ``PERFSUITE_*`` variables (a user's engine may read its settings from them).

    Nothing else of the caller's: the environment is copied into the process's memory at its start, so what
    it holds moves where later objects lie, and a step's count with them (alignment, and dicts and sets keyed
    by objects, hashed by address): a variable 40 characters longer moved it by up to 0.3%, and pytest's own
    variables moved it between two sessions by as much. Fixed, the count repeats to the instruction.
    """
    here = str(Path(__file__).resolve().parents[2])  # the directory this perfsuite package lies in
    paths = [str(cwd)] if cwd is not None else []
    paths += [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    passed = {name: value for name, value in os.environ.items() if name.startswith(PASSED_PREFIX)}
    return {
        **passed,
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONHASHSEED": "0",
        "PYTHONUTF8": "1",
    }


def steps_from_output(stdout: str) -> list[int]:
    """The child's last line, ``{"steps_per_run": [...]}``, checked."""
    lines = stdout.strip().splitlines()
    try:
        steps = json.loads(lines[-1])["steps_per_run"]
    except (IndexError, ValueError, KeyError, TypeError) as error:
        raise InstructionCountError(f"the counted process printed no step counts: {stdout[-500:]!r}") from error
    if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise InstructionCountError(f"the counted process printed step counts {steps!r}, not a list of ints")
    return steps


_EVENTS = re.compile(r"^events:\s*(.+)$", re.MULTILINE)
_SUMMARY = re.compile(r"^summary:\s*(.+)$", re.MULTILINE)


def read_cachegrind_totals(text: str) -> EventCounts:
    """The totals of a cachegrind output file: its ``events:`` names and ``summary:`` numbers."""
    events, summary = _EVENTS.search(text), _SUMMARY.search(text)
    if events is None or summary is None:
        raise InstructionCountError("the cachegrind output has no 'events:' or 'summary:' line; is it cachegrind's?")
    names, values = events.group(1).split(), summary.group(1).split()
    if len(names) != len(values) or "Ir" not in names:
        raise InstructionCountError(f"cachegrind's summary {values} does not match its events {names}")
    totals = dict(zip(names, map(int, values), strict=True))
    l1 = ("I1mr", "D1mr", "D1mw")
    last_level = ("ILmr", "DLmr", "DLmw")
    return EventCounts(
        totals["Ir"],
        sum(totals[n] for n in l1) if all(n in totals for n in l1) else None,
        sum(totals[n] for n in last_level) if all(n in totals for n in last_level) else None,
    )
