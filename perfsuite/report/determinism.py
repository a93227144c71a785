"""The report's table of unique completions over N runs: one row per test that measured them.

A row per ``DeterminismResult`` of the session (``perf.measure_determinism``):
the test, its engine, the trials and prompts, the most distinct completions
any prompt got, their mean, and how many prompts got one completion every
time. The figure is recorded, never judged, so no row carries a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.judge.results import DeterminismResult

CAPTION = (
    "Each prompt served once per trial, in seeded shuffled batch compositions (order, companions, batch size and "
    "arrival offsets differ between trials); distinct completions counted per prompt. 1 is deterministic under "
    "batching. Recorded, not judged."
)


@dataclass(frozen=True, slots=True)
class DeterminismRow:
    test_id: str
    engine: str
    num_trials: int
    num_prompts: int
    max_distinct: int
    mean_distinct: str
    deterministic: str  # "3 of 4 (75%)"

    @property
    def is_deterministic(self) -> bool:
        return self.max_distinct == 1


def determinism_rows(results: Sequence[DeterminismResult] | None) -> list[DeterminismRow]:
    """The table's rows, by test id; none for a session that measured no unique completions."""
    rows = []
    for result in sorted(results or (), key=lambda r: r.test_id):
        completions = result.completions
        rows.append(
            DeterminismRow(
                test_id=result.test_id,
                engine=result.engine_name,
                num_trials=completions.num_trials,
                num_prompts=completions.num_prompts,
                max_distinct=completions.max_distinct,
                mean_distinct=f"{completions.mean_distinct:.2f}",
                deterministic=(
                    f"{completions.num_deterministic} of {completions.num_prompts} "
                    f"({completions.fraction_deterministic:.0%})"
                ),
            )
        )
    return rows
