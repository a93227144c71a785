"""Plain-text tables for the terminal: the KV cache and device memory table of a session's tests, their
prefix cache table, and how close each came to the machine's roofs (MFU, MBU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from perfsuite.host import format_bytes

if TYPE_CHECKING:  # the CLI and the benchmarks import this module for format_table alone: keep it free
    from perfsuite.judge.results import TestResult

PREFIX_CACHE_COLUMNS = [
    "test",
    "prefix cache hit rate",
    "cached / looked-up tokens",
    "evicted blocks",
    "TTFT p50 ms hit / miss (requests)",
    "from",
]
MEMORY_COLUMNS = [
    "test",
    "KV blocks peak/mean/pool",
    "block",
    "KV util",
    "preempted (recomputed tok)",
    "max running",
    "CUDA peak",
]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if index else c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return str(value)


UTILIZATION_COLUMNS = ["test", "prefill MFU", "prefill TF/s", "decode MBU", "decode GB/s"]
# measure.utilization's sample keys, read only through results.json: (key, as a share?)
UTILIZATION_CELLS = (("prefill_mfu", True), ("prefill_tflops", False), ("decode_mbu", True), ("decode_gbps", False))


def utilization_table(results: Sequence[TestResult], source: str = "") -> str | None:
    """Each test's prefill MFU, decode MBU and achieved rates (medians over repeats); None when no test counted
    its work. Stored, never compared (``perfsuite.measure.utilization``); ``source`` names the file shown."""
    rows = []
    for result in results:
        samples = result.measurement.samples
        if not any(key in samples for key, _ in UTILIZATION_CELLS):
            continue
        rows.append(
            [
                result.test_id.rpartition("::")[2],
                *(_median_cell(samples.get(key), share) for key, share in UTILIZATION_CELLS),
            ]
        )
    if not rows:
        return None
    where = f" in {source}" if source else ""
    return f"How close to the machine's measured roofs{where} (medians over repeats; not compared):\n" + format_table(
        UTILIZATION_COLUMNS, rows
    )


def _median_cell(values: Sequence[float] | None, share: bool) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"{median:.1%}" if share else f"{median:.3g}"


def memory_table(results: Sequence[TestResult]) -> str | None:
    """Each test's KV cache (its last repeat) and CUDA peak, under a title; None when no test recorded either."""
    rows = memory_rows(results)
    if not rows:
        return None
    return "KV cache (last repeat) and device memory:\n" + format_table(MEMORY_COLUMNS, rows)


def memory_rows(results: Sequence[TestResult]) -> list[list[str]]:
    rows = []
    for result in results:
        memory = result.memory
        if memory is None:
            continue
        pool = "-" if memory.num_kv_blocks is None else str(memory.num_kv_blocks)
        rows.append(
            [
                result.test_id.rpartition("::")[2],
                f"{memory.peak_kv_blocks_used}/{memory.mean_kv_blocks_used:.1f}/{pool}",
                "-" if memory.kv_block_size is None else str(memory.kv_block_size),
                f"{memory.kv_utilisation:.0%}",
                f"{memory.num_preemptions} ({memory.num_recomputed_tokens})",
                str(memory.peak_num_running),
                format_bytes(memory.max_memory_allocated_bytes),
            ]
        )
    return rows


def prefix_cache_table(results: Sequence[TestResult]) -> str | None:
    """Each test's prefix cache hit rate, evictions and TTFT of hits and misses, under a title; None when no test
    looked anything up (``measure.prefix_cache`` says whose figures are shown)."""
    rows = prefix_cache_rows(results)
    if not rows:
        return None
    return "Prefix cache:\n" + format_table(PREFIX_CACHE_COLUMNS, rows)


def prefix_cache_rows(results: Sequence[TestResult]) -> list[list[str]]:
    rows = []
    for result in results:
        figures = result.prefix_cache
        if figures is None:
            continue
        split = result.ttft_by_cache_hit
        rows.append(
            [
                result.test_id.rpartition("::")[2],
                f"{figures.hit_rate:.1%}",
                f"{figures.num_hit_tokens:,} / {figures.num_queried_tokens:,}",
                "-" if figures.num_evicted_blocks is None else str(figures.num_evicted_blocks),
                "-"
                if split is None
                else f"{_ms(split.hit_p50_ms)} / {_ms(split.miss_p50_ms)} ({split.num_hits} / {split.num_misses})",
                figures.source.value,
            ]
        )
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else _cell(float(value))
