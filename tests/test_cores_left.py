"""perfsuite.measure.contention's pure parts for a busy runner: whole cores other work holds, threads for the rest,
and a process's CPU time from /proc/PID/stat."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.measure.contention import (
    CORE_TAKEN_FROM,
    CpuUse,
    cores_taken,
    process_cpu_seconds,
    threads_for_cores_left,
)


def use(busy_cores: float, num_cpus: int = 2) -> CpuUse:
    return CpuUse(wall_seconds=1.0, num_cpus=num_cpus, foreign_share=busy_cores / num_cpus, steal_share=0.0,
                  own_share=0.0)  # fmt: skip


@pytest.mark.parametrize(
    ("busy_cores", "taken", "threads"),
    [(0.0, 0, 2), (0.2, 0, 2), (0.5, 1, 1), (1.0, 1, 1), (1.25, 1, 1), (1.5, 2, 1), (2.0, 2, 1)],
)
def test_a_core_counts_as_taken_once_other_work_uses_more_than_a_share_of_it(busy_cores, taken, threads):
    assert cores_taken(use(busy_cores)) == taken
    assert threads_for_cores_left(use(busy_cores), num_cpus=2) == threads


def test_steal_takes_cores_as_other_processes_do():
    stolen = CpuUse(wall_seconds=1.0, num_cpus=4, foreign_share=0.0, steal_share=0.5, own_share=0.0)
    assert cores_taken(stolen) == 2 and threads_for_cores_left(stolen, num_cpus=4) == 2


def test_no_reading_keeps_a_thread_per_usable_core_and_no_usable_core_is_an_error():
    assert threads_for_cores_left(None, num_cpus=3) == 3
    with pytest.raises(ValueError, match="num_cpus must be >= 1"):
        threads_for_cores_left(None, num_cpus=0)


def test_the_threads_never_exceed_the_cores_this_process_may_use():
    assert threads_for_cores_left(use(0.0, num_cpus=8), num_cpus=2) == 2, "pinned to 2 of 8 CPUs"


@given(st.floats(min_value=0.0, max_value=1.0), st.integers(min_value=1, max_value=64), st.integers(1, 64))
def test_threads_lie_between_one_and_the_usable_cores_and_fall_as_other_work_grows(share, machine_cpus, usable):
    reading = CpuUse(1.0, machine_cpus, foreign_share=share, steal_share=0.0, own_share=0.0)
    more = CpuUse(1.0, machine_cpus, foreign_share=min(1.0, share + 0.1), steal_share=0.0, own_share=0.0)
    threads = threads_for_cores_left(reading, usable)
    assert 1 <= threads <= usable
    assert threads_for_cores_left(more, usable) <= threads
    assert cores_taken(reading) <= machine_cpus
    if share * machine_cpus <= CORE_TAKEN_FROM:
        assert threads == min(usable, machine_cpus)


def test_a_process_cpu_time_is_read_from_its_stat_file_even_with_spaces_in_its_name(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    (tmp_path / "42").mkdir()
    fields = ["S", "1", "42", "42", "0", "-1", "4194560", "100", "0", "0", "0", str(3 * hz), str(hz), "0", "0"]
    (tmp_path / "42" / "stat").write_text(f"42 (python worker (a) b) {' '.join(fields)} 20 0 3 0\n")
    assert process_cpu_seconds(42, proc=str(tmp_path)) == pytest.approx(4.0)
    assert process_cpu_seconds(43, proc=str(tmp_path)) is None, "a process gone is not an error"
    (tmp_path / "42" / "stat").write_text("42 (x) S 1\n")
    assert process_cpu_seconds(42, proc=str(tmp_path)) is None, "a truncated line is not a reading"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux only: /proc/PID/stat")
def test_a_running_process_reads_the_cpu_time_it_spends():
    import time

    before = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_cpu_seconds(os.getpid()) - before >= 0.15, "0.2 s of CPU, read in clock ticks"
