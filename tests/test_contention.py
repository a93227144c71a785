"""perfsuite.measure.contention: reading /proc/stat, turning two readings into shares, and the verdict's reason."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.measure.contention import (
    DEFAULT_THRESHOLD,
    MIN_BUSY_SECONDS,
    CpuMeter,
    CpuSample,
    CpuTicks,
    CpuUse,
    contention_reason,
    cpu_use,
    parse_proc_stat,
    read_sample,
)

pytestmark = pytest.mark.timing  # reads the machine's load or must see a slowdown: run alone (conftest.py)

PROC_STAT_TEXT = """\
cpu  4705 150 1120 16250 520 30 45 12 0 0
cpu0 2350 75 560 8125 260 15 22 6 0 0
cpu1 2355 75 560 8125 260 15 23 6 0 0
intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]
ctxt 1990473
btime 1062191376
processes 2915
procs_running 1
procs_blocked 0
"""

TICKS_PER_SECOND = 100


def ticks(user=0, nice=0, system=0, idle=0, iowait=0, irq=0, softirq=0, steal=0, num_cpus=2) -> CpuTicks:
    return CpuTicks(user, nice, system, idle, iowait, irq, softirq, steal, num_cpus)


def sample(process_seconds=0.0, clock_seconds=0.0, **counters) -> CpuSample:
    return CpuSample(ticks(**counters), process_seconds=process_seconds, clock_seconds=clock_seconds)


def use(foreign=0.0, steal=0.0) -> CpuUse:
    return CpuUse(wall_seconds=1.0, num_cpus=2, foreign_share=foreign, steal_share=steal, own_share=0.5)


# -- /proc/stat ---------------------------------------------------------------------


def test_parse_proc_stat_reads_the_aggregate_line_and_counts_cpus():
    assert parse_proc_stat(PROC_STAT_TEXT) == CpuTicks(
        user=4705, nice=150, system=1120, idle=16250, iowait=520, irq=30, softirq=45, steal=12, num_cpus=2
    )


def test_parse_proc_stat_accepts_an_old_kernel_without_steal():
    parsed = parse_proc_stat("cpu  10 0 5 100 1 0 0\ncpu0 10 0 5 100 1 0 0\n")
    assert parsed.steal == 0 and parsed.total == 116 and parsed.num_cpus == 1


def test_parse_proc_stat_rejects_text_without_a_cpu_line():
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2 3\nctxt 4\n")


def test_guest_time_is_not_counted_twice():
    with_guest = parse_proc_stat("cpu  10 0 0 10 0 0 0 0 7 3\n")
    assert with_guest.total == 20 and with_guest.used == 10


def test_read_sample_is_none_without_proc_stat(tmp_path: Path):
    assert read_sample(str(tmp_path / "missing")) is None


# -- two samples make a CpuUse ----------------------------------------------------------


def test_other_processes_are_what_the_machine_used_beyond_this_one():
    # 2 CPUs for 1 s = 200 ticks: 120 used, of which this process ran 0.8 s = 80 ticks; 10 stolen.
    before = sample(process_seconds=5.0, clock_seconds=10.0, user=1000, idle=1000)
    after = sample(process_seconds=5.8, clock_seconds=11.0, user=1100, system=1020 - 1000, idle=1070, steal=10)
    measured = cpu_use(before, after, TICKS_PER_SECOND)
    assert measured.wall_seconds == pytest.approx(1.0)
    assert measured.num_cpus == 2
    assert measured.own_share == pytest.approx(0.4)
    assert measured.foreign_share == pytest.approx(0.2)
    assert measured.steal_share == pytest.approx(0.05)
    assert measured.busy_share == pytest.approx(0.25)


def test_this_process_alone_is_not_foreign():
    before = sample(process_seconds=0.0, user=0, idle=0)
    after = sample(process_seconds=1.0, clock_seconds=1.0, user=100, idle=100)
    measured = cpu_use(before, after, TICKS_PER_SECOND)
    assert measured.foreign_share == 0.0 and measured.own_share == pytest.approx(0.5)


def test_shares_are_clamped_when_ticks_and_process_time_disagree():
    # Tick accounting is sampled; process_time is exact: own time can exceed the machine's ticks.
    before = sample()
    after = sample(process_seconds=3.0, clock_seconds=1.0, user=150, idle=50)
    measured = cpu_use(before, after, TICKS_PER_SECOND)
    assert measured.foreign_share == 0.0 and measured.own_share == 1.0


def test_an_interval_shorter_than_a_tick_shows_no_use():
    measured = cpu_use(sample(user=7, idle=9), sample(process_seconds=0.001, clock_seconds=0.002, user=7, idle=9), 100)
    assert measured.busy_share == 0.0 and measured.wall_seconds == pytest.approx(0.002)


@given(
    st.lists(st.integers(0, 10_000), min_size=8, max_size=8),
    st.lists(st.integers(0, 10_000), min_size=8, max_size=8),
    st.floats(0, 100),
)
def test_every_share_lies_in_zero_to_one(start, growth, own_seconds):
    before = CpuSample(CpuTicks(*start, num_cpus=2), process_seconds=0.0, clock_seconds=0.0)
    after = CpuSample(CpuTicks(*(a + b for a, b in zip(start, growth)), num_cpus=2), own_seconds, 1.0)
    measured = cpu_use(before, after, TICKS_PER_SECOND)
    for share in (measured.foreign_share, measured.steal_share, measured.own_share):
        assert 0.0 <= share <= 1.0


# -- the meter ----------------------------------------------------------------------------


def test_the_meter_measures_between_start_and_stop():
    readings = iter([sample(user=0, idle=0), sample(process_seconds=0.5, clock_seconds=1.0, user=150, idle=50)])
    meter = CpuMeter(read=lambda: next(readings))
    with meter:
        pass
    assert meter.use is not None and meter.use.foreign_share == pytest.approx(0.5)


def test_the_meter_reads_none_where_proc_stat_is_unreadable():
    with CpuMeter(read=lambda: None) as meter:
        pass
    assert meter.use is None


def test_stop_before_start_is_an_error():
    with pytest.raises(RuntimeError):
        CpuMeter().stop()


# -- the reason ------------------------------------------------------------------------------


def test_no_reason_when_every_interval_is_below_the_threshold():
    assert contention_reason([use(0.01), use(0.02, 0.01), None], threshold=0.05) is None


def test_no_reason_when_nothing_was_measured():
    assert contention_reason([None, None], threshold=0.05) is None


def test_the_reason_counts_the_busy_repeats_and_names_the_worst_shares():
    uses = [use(0.01), use(0.48), use(0.0), use(0.30, 0.02), use(0.01), use(0.04, 0.01), use(0.10)]
    assert contention_reason(uses, threshold=0.05) == (
        "the machine was busy with other work during 4 of 7 repeats "
        "(up to 48% of its CPU time used by other processes, 2% stolen)"
    )


def test_steal_alone_makes_a_repeat_busy():
    reason = contention_reason([use(0.0, 0.2)], threshold=0.05)
    assert reason == (
        "the machine was busy with other work during 1 of 1 repeat "
        "(up to 0% of its CPU time used by other processes, 20% stolen)"
    )


def test_the_threshold_itself_counts_as_busy():
    assert contention_reason([use(0.025, 0.025)], threshold=0.05) is not None
    assert contention_reason([use(0.025, 0.0249)], threshold=0.05) is None


def test_a_few_clock_ticks_in_a_very_short_repeat_are_not_busy():
    # 20 ms on 2 CPUs, half of it other work: 0.02 CPU seconds, below MIN_BUSY_SECONDS.
    short = CpuUse(wall_seconds=0.02, num_cpus=2, foreign_share=0.5, steal_share=0.0, own_share=0.5)
    assert short.busy_seconds < MIN_BUSY_SECONDS
    assert contention_reason([short], threshold=0.05) is None


def test_the_threshold_must_be_a_share():
    with pytest.raises(ValueError):
        contention_reason([use()], threshold=0.0)


# -- on a real machine ---------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_child_processes_show_as_foreign_use():
    # Enough spinning children for twice the threshold: one on a 2-core machine (half of it).
    num_children = math.ceil(2 * DEFAULT_THRESHOLD * (os.cpu_count() or 1))
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(num_children)]
    try:
        time.sleep(0.2)  # let them start spinning
        with CpuMeter() as meter:
            time.sleep(1.0)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert meter.use is not None
    assert meter.use.own_share < 0.05  # this process slept
    assert meter.use.busy_share > DEFAULT_THRESHOLD
    assert contention_reason([meter.use], DEFAULT_THRESHOLD) is not None
