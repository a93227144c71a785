"""The KV cache and device memory table (terminal summary, perfsuite compare): a compact row per test with them."""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.engine.types import EngineCounters
from perfsuite.measure.summaries import DEVICE_MEMORY, RunTimeline
from perfsuite.host import format_bytes
from perfsuite.report.table import MEMORY_COLUMNS, format_table, memory_rows, memory_table
from results_builders import make_result

POOL = RunTimeline(duration=1.0, num_slots=4, steps=(), requests=(), num_kv_blocks=64, kv_block_size=16)
COUNTERS = EngineCounters(
    num_forward_passes=4, num_preemptions=2, num_recomputed_tokens=96, peak_kv_blocks_used=37, peak_num_running=8,
    kv_blocks_used_step_sum=85, kv_tokens_used_step_sum=1088, kv_token_capacity_step_sum=1360,
)  # fmt: skip


def test_a_paged_test_gets_one_compact_row():
    samples = {"output_throughput": (1.0,), DEVICE_MEMORY: (int(1.21 * 2**30), 2**20)}
    result = make_result("t.py::test_x[paged-B8]", timeline=POOL, counters=COUNTERS, samples=samples)
    assert memory_rows([result]) == [["test_x[paged-B8]", "37/21.2/64", "16", "80%", "2 (96)", "8", "1.21 GiB"]]


def test_tests_that_recorded_no_memory_get_no_row_and_a_session_of_them_no_table():
    old = make_result("t.py::test_old", timeline=POOL, counters=COUNTERS, unrecorded_counters=("num_preemptions",))
    server = make_result("t.py::test_server", timeline=dataclasses.replace(POOL, num_kv_blocks=None))
    assert memory_rows([old, server]) == [] and memory_table([old, server]) is None
    on_cpu = make_result("t.py::test_cpu", timeline=POOL, counters=COUNTERS)
    table = memory_table([old, on_cpu])
    assert table.splitlines()[0] == "KV cache (last repeat) and device memory:"
    assert table.endswith(format_table(MEMORY_COLUMNS, memory_rows([on_cpu])))
    assert memory_rows([on_cpu])[0][-1] == "-", "no CUDA peak on CPU"


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (150 * 2**20, "150 MiB"),
     (int(12.34 * 2**30), "12.3 GiB"), (2**50, "1.00 PiB")],
)  # fmt: skip
def test_bytes_are_shown_in_binary_units(value, text):
    assert format_bytes(value) == text


def test_perfsuite_compare_prints_the_table_under_its_verdicts_when_the_new_run_recorded_memory(tmp_path, capsys):
    from perfsuite.cli import main
    from perfsuite.judge.results import write_results
    from results_builders import make_results

    with_kv = make_result("t.py::test_x[paged-B8]", timeline=POOL, counters=COUNTERS)
    without = make_result("t.py::test_x[paged-B8]")
    for name, test in (("kv", with_kv), ("plain", without)):
        write_results(tmp_path / f"{name}.json", make_results(test))
    main(["compare", str(tmp_path / "plain.json"), str(tmp_path / "kv.json")])
    out = capsys.readouterr().out
    assert "KV cache (last repeat) and device memory:\n" in out and "37/21.2/64" in out
    assert out.index("KV cache") < out.index("overall:")
    main(["compare", str(tmp_path / "kv.json"), str(tmp_path / "plain.json")])
    assert "KV cache" not in capsys.readouterr().out
