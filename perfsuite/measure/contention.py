"""Was the machine busy with other work while a repeat ran?

A probe before each repeat cannot see contention that comes and goes during
the run, so the recorder measures the machine's CPU use around every repeat:
the kernel's aggregate counters in /proc/stat say how much CPU time the whole
machine used and how much the hypervisor stole; ``time.process_time()`` says
how much of it was this process (every thread of it). The rest was other
work, and a run that shared the machine with it says nothing about the code:
on the 2-core CI machine one busy-looping process cost an A/A run 85% of its
throughput, and torch's two threads on an oversubscribed machine run up to
16x slower.

Only Linux has /proc/stat; elsewhere the meter reads ``None`` and nothing is
judged noisy.

Under ``--perf-against`` the runs happen in worker processes, so the meter
counts their CPU time (``/proc/PID/stat``) as the session's own
(``read_sample(own_seconds=...)``), and ``threads_for_cores_left`` picks the
workers' thread count from a reading of what other work holds.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Self

PROC_STAT = "/proc/stat"

# Busy share (other processes' CPU time plus steal, over the machine's) from
# which a repeat counts as disturbed. Measured on the 2-core CI VM with
# bench/contention_probe.py: 5 s of F.linear, (8, 512) x (32768, 512), at 2
# threads inside a CpuMeter, on runs where `top` showed nothing else running:
#   idle machine (4 runs):               busy 0.004-0.017 (steal <= 0.001), 85-90 steps/s
#   one process busy-looping (4 runs):   busy 0.39-0.45 (steal <= 0.001), 32-35 steps/s (-60%)
# The busy loop gets less than half the machine because it shares the two
# cores with torch's two threads. Runs that other engineers' jobs disturbed
# read in between, and show why the cut must sit low: busy 0.14 already cost
# 11% of the throughput, 0.31 cost 44%, 0.46 cost 65%, since while a burst
# lasts torch's threads are oversubscribed and each step is many times
# slower. 0.05 is 3x the worst idle reading and 8x below the loaded ones.
DEFAULT_THRESHOLD = 0.05
# A few clock ticks of other work are always there; in a repeat of tens of
# milliseconds (a tiny model) one tick is already a large share of it.
MIN_BUSY_SECONDS = 0.03


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """The aggregate ``cpu`` line of /proc/stat, in clock ticks since boot, and the number of CPUs."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    num_cpus: int

    @property
    def total(self) -> int:
        # guest and guest_nice are already counted in user and nice.
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal

    @property
    def used(self) -> int:
        """Ticks some process (or the kernel on its behalf) ran; idle, iowait and steal are not use."""
        return self.user + self.nice + self.system + self.irq + self.softirq


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One reading: the machine's counters, this process's CPU seconds (all threads) and the wall clock."""

    ticks: CpuTicks
    process_seconds: float  # time.process_time()
    clock_seconds: float  # time.perf_counter()


@dataclass(frozen=True, slots=True)
class CpuUse:
    """How the machine's CPU time was spent over an interval, as shares of what it had (wall x CPUs)."""

    wall_seconds: float
    num_cpus: int
    foreign_share: float  # other processes
    steal_share: float  # the hypervisor gave it to other machines
    own_share: float  # this process

    @property
    def busy_share(self) -> float:
        """The share of the machine this process could not have had."""
        return self.foreign_share + self.steal_share

    @property
    def busy_seconds(self) -> float:
        return self.busy_share * self.wall_seconds * self.num_cpus

    def is_busy(self, threshold: float) -> bool:
        return self.busy_share >= threshold and self.busy_seconds >= MIN_BUSY_SECONDS


def parse_proc_stat(text: str) -> CpuTicks:
    """The aggregate counters of /proc/stat's text; ``ValueError`` when it has no ``cpu`` line."""
    aggregate: list[int] | None = None
    num_cpus = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            fields = [int(field) for field in rest.split()]
            aggregate = (fields + [0] * 8)[:8]  # old kernels have fewer columns
        elif name.startswith("cpu") and name[3:].isdigit():
            num_cpus += 1
    if aggregate is None:
        raise ValueError("no aggregate 'cpu' line in /proc/stat text")
    user, nice, system, idle, iowait, irq, softirq, steal = aggregate
    return CpuTicks(user, nice, system, idle, iowait, irq, softirq, steal, num_cpus=max(1, num_cpus))


def cpu_use(before: CpuSample, after: CpuSample, ticks_per_second: float) -> CpuUse:
    """The machine's CPU use between two samples; shares are clamped to [0, 1]."""
    available_ticks = after.ticks.total - before.ticks.total
    wall_seconds = after.clock_seconds - before.clock_seconds
    if available_ticks <= 0:  # shorter than a clock tick: nothing to see
        return CpuUse(wall_seconds, after.ticks.num_cpus, foreign_share=0.0, steal_share=0.0, own_share=0.0)
    available_seconds = available_ticks / ticks_per_second
    used_seconds = (after.ticks.used - before.ticks.used) / ticks_per_second
    own_seconds = after.process_seconds - before.process_seconds
    stolen_seconds = (after.ticks.steal - before.ticks.steal) / ticks_per_second
    return CpuUse(
        wall_seconds=wall_seconds,
        num_cpus=after.ticks.num_cpus,
        foreign_share=_clamp((used_seconds - own_seconds) / available_seconds),
        steal_share=_clamp(stolen_seconds / available_seconds),
        own_share=_clamp(own_seconds / available_seconds),
    )


def read_sample(path: str = PROC_STAT, own_seconds: Callable[[], float] = time.process_time) -> CpuSample | None:
    """A sample now, or ``None`` where /proc/stat cannot be read (macOS, Windows).

    ``own_seconds``: the CPU seconds that count as the session's own; by
    default this process's (all its threads).
    """
    try:
        with open(path, encoding="ascii") as file:
            text = file.read()
        ticks = parse_proc_stat(text)
    except (OSError, ValueError):
        return None
    return CpuSample(ticks, process_seconds=own_seconds(), clock_seconds=time.perf_counter())


def process_cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """User plus system CPU seconds process ``pid`` has used (all its threads); None once it is gone, or off Linux."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as file:
            text = file.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; utime and stime are fields 14 and 15.
    fields = text.rpartition(")")[2].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _ticks_per_second()
    except (IndexError, ValueError):
        return None


# Other work on more than this share of one core takes that core from the workers' threads: on the 2-core CI
# VM a neighbour using 0.28 of a core already cost 2-thread torch 11% of its throughput (DEFAULT_THRESHOLD's
# readings), while one thread instead of two costs about 20% (``timing.configure_threads``), and a neighbour
# that holds a whole core cost 2-thread torch up to 85% (spinning threads wait on the one that is descheduled).
CORE_TAKEN_FROM = 0.3


def cores_taken(use: CpuUse) -> int:
    """Whole cores other work holds, from a reading taken while the session itself was idle."""
    busy_cores = use.busy_share * use.num_cpus
    return max(0, math.ceil(busy_cores - CORE_TAKEN_FROM))


def threads_for_cores_left(use: CpuUse | None, num_cpus: int) -> int:
    """Intra-op threads for a run: one per core of ``num_cpus`` (the ones it may use) that other work leaves free.

    At least one; all ``num_cpus`` when nothing could be read. Fewer threads
    than cores is slower on a quiet machine, but more threads than free cores
    is far slower on a busy one, and in a way that varies from run to run.
    """
    if num_cpus < 1:
        raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
    if use is None:
        return num_cpus
    free = use.num_cpus - cores_taken(use)
    return max(1, min(num_cpus, free))


class CpuMeter:
    """Measures the machine's CPU use over an interval: ``start()``/``stop()``, or ``with CpuMeter() as meter``.

    After the ``with`` block, ``meter.use`` holds what ``stop()`` returned.
    """

    def __init__(self, read: Callable[[], CpuSample | None] = read_sample) -> None:
        self._read = read
        self._start: CpuSample | None = None
        self._started = False
        self.use: CpuUse | None = None

    def start(self) -> None:
        self._start = self._read()
        self._started = True

    def stop(self) -> CpuUse | None:
        if not self._started:
            raise RuntimeError("CpuMeter.stop() before start()")
        end = self._read()
        if self._start is None or end is None:
            return None
        return cpu_use(self._start, end, _ticks_per_second())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.use = self.stop()


def contention_reason(uses: Sequence[CpuUse | None], threshold: float) -> str | None:
    """Why these intervals cannot support a verdict, in one line; ``None`` when none was busy.

    An interval is busy when its busy share reaches ``threshold`` (and is more than
    a few clock ticks); unmeasured ones (``None``) are left out.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    measured = [use for use in uses if use is not None]
    busy = [use for use in measured if use.is_busy(threshold)]
    if not busy:
        return None
    worst_foreign = max(use.foreign_share for use in busy)
    worst_steal = max(use.steal_share for use in busy)
    repeats = "repeat" if len(measured) == 1 else "repeats"
    return (
        f"the machine was busy with other work during {len(busy)} of {len(measured)} {repeats} "
        f"(up to {worst_foreign:.0%} of its CPU time used by other processes, {worst_steal:.0%} stolen)"
    )


def _ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


def _clamp(share: float) -> float:
    return min(1.0, max(0.0, share))
