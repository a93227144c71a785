"""The instruction lane's verdict: instructions per engine step against the stored figure, by a threshold alone.

A count under Valgrind does not depend on the machine's load: it repeats to
the instruction in one environment and moves by up to about 0.36% between
sessions, where the objects lie elsewhere in memory (measured:
docs/benchmarks.md). There is no sampling noise for a significance test to
model: a rise above ``threshold_percent`` is a regression, and the threshold
only has to sit above that spread and below the smallest change worth
flagging. These figures sit beside the exact engine counters
(``catalogue.exact_counter_changes``), which are compared without
statistics too.

The stored figure belongs to the interpreter that counted it (another
Python build executes other instructions), so it is kept per Python
version, implementation and architecture, under the baseline directory's
``instructions/`` folder, written atomically.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.codec import CodecError, decode, encode
from perfsuite.judge.baselines import BaselineError, baseline_relative_path, write_json_atomic
from perfsuite.measure.instruction_workload import InstructionWorkload
from perfsuite.measure.instructions import InstructionCount

DEFAULT_THRESHOLD_PERCENT = 0.5
INSTRUCTIONS_FOLDER = "instructions"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class InstructionBaseline:
    """A test's stored instructions per step, and what counted them."""

    test_id: str
    workload: InstructionWorkload
    instructions_per_step: float
    steps_per_run: int
    interpreter: str
    valgrind: str


@dataclass(frozen=True, slots=True)
class InstructionResult:
    """A test's count, and its verdict against the stored one (``baseline_per_step`` None: not compared, see ``note``)."""

    test_id: str
    count: InstructionCount
    threshold_percent: float
    baseline_per_step: float | None = None
    note: str | None = None  # why nothing was compared, or what changed beside the figure

    @property
    def change_percent(self) -> float | None:
        if self.baseline_per_step is None:
            return None
        return 100.0 * (self.count.instructions_per_step / self.baseline_per_step - 1.0)

    @property
    def regressed(self) -> bool:
        change = self.change_percent
        return change is not None and change > self.threshold_percent

    def to_json(self) -> dict[str, Any]:
        """The codec's fields, and the verdict beside them for readers outside perfsuite (never read back)."""
        return {**encode(self), "change_percent": self.change_percent, "regressed": self.regressed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InstructionResult:
        return decode(cls, {k: v for k, v in data.items() if k not in ("change_percent", "regressed")})

    def describe(self) -> str:
        """One line: the figure per step, the baseline's, the change and the verdict."""
        figure = f"{self.count.instructions_per_step:,.0f} instructions/step ({self.count.workload.label})"
        change = self.change_percent
        if change is None:
            return f"{self.test_id}: {figure}; not compared: {self.note}"
        verdict = "REGRESSION" if self.regressed else "ok"
        suffix = f"; {self.note}" if self.note else ""
        return (
            f"{self.test_id}: {figure} vs {self.baseline_per_step:,.0f} stored: {change:+.3f}% "
            f"(threshold +{self.threshold_percent:g}%) {verdict}{suffix}"
        )


def judge_instructions(
    test_id: str, count: InstructionCount, baseline: InstructionBaseline | None, threshold_percent: float
) -> InstructionResult:
    """``count`` against ``baseline``; a baseline of another workload is not compared (the figure means another thing)."""
    if baseline is None:
        return InstructionResult(test_id, count, threshold_percent, note="no stored figure for this interpreter")
    if baseline.workload != count.workload:
        other = f"the stored figure counted another workload ({baseline.workload.label}); save a new one"
        return InstructionResult(test_id, count, threshold_percent, note=other)
    note = None
    if baseline.steps_per_run != count.steps_per_run:
        note = f"steps per run changed: {baseline.steps_per_run} -> {count.steps_per_run} (the schedule changed)"
    return InstructionResult(test_id, count, threshold_percent, baseline.instructions_per_step, note)


def interpreter_key() -> str:
    """The folder a figure is stored under: the Python that executed the counted instructions."""
    return f"{platform.python_implementation().lower()}-{platform.python_version()}-{platform.machine()}"


class InstructionBaselineStore:
    """Stored figures, one JSON file per test under ``root/instructions/<interpreter>/``."""

    def __init__(self, root: str | Path, interpreter: str | None = None) -> None:
        self.root = Path(root)
        self.interpreter = interpreter or interpreter_key()

    def path_for(self, test_id: str) -> Path:
        return self.root / INSTRUCTIONS_FOLDER / self.interpreter / baseline_relative_path(test_id)

    def load(self, test_id: str) -> InstructionBaseline | None:
        path = self.path_for(test_id)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("schema_version") != SCHEMA_VERSION:
                raise BaselineError(f"{path}: schema_version {data.get('schema_version')!r}, not {SCHEMA_VERSION}")
            baseline: InstructionBaseline = decode(
                InstructionBaseline, {k: v for k, v in data.items() if k != "schema_version"}
            )
        except (OSError, ValueError, CodecError, AttributeError) as error:
            raise BaselineError(
                f"{path}: not a readable instruction baseline ({error}); delete it and save a new one with "
                "--perf-instructions --perf-save-baseline"
            ) from error
        return baseline

    def figure(self, test_id: str, count: InstructionCount) -> InstructionBaseline:
        """What ``save`` stores for ``count``."""
        return InstructionBaseline(
            test_id, count.workload, count.instructions_per_step, count.steps_per_run, self.interpreter, count.valgrind
        )

    def save(self, test_id: str, count: InstructionCount) -> Path:
        """Write the figure atomically (a reader never sees half a file)."""
        baseline = self.figure(test_id, count)
        path = self.path_for(test_id)
        write_json_atomic(path, {"schema_version": SCHEMA_VERSION, **encode(baseline)})
        return path
