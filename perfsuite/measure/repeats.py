"""The repeat loop every mode measures with: probes around each repeat, the CPU meter, re-runs, the noisy-save rule.

Pure Python (no pytest, no torch until a CUDA device is read): the
recorder's local measurer, the capacity searches and the Ray actor on its
node all run their repeats through ``RepeatLoop``, so a change of policy
reaches every mode at once. What one repeat is (a timed run here, a run
sent by client shards, a capacity search) is the caller's ``time_one``;
what the loop decides is the same for all of them:

- **Probe bracketing**: the machine probe is read before the first repeat
  and after each one; a repeat's reading is the geometric mean of the two
  around it (``BracketingProbe``).
- **Disturbed repeats are re-run**: a repeat during which other work used
  the machine's CPU (the CPU meter), whose GPU was throttled or shared
  (NVML), or whose load generator fell behind its schedule is re-run once
  the machine is quiet again, at most ``max_rerun_share`` of them; the
  re-run takes the disturbed repeat's place.
- **Busy for good**: when the CPU stays busy after a disturbed repeat, the
  loop stops and the repeats so far are reported noisy: more repeats would
  only measure the other work.
- **The noisy-save rule**: a noisy run is never saved as a baseline, and a
  ``--perf-save-baseline`` test that measured one fails
  (``noisy_save_failure``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from perfsuite.engine import Request, RunResult
from perfsuite.measure.capacity import Capacity
from perfsuite.measure.capacity_runs import CapacityRuns
from perfsuite.measure.contention import CpuMeter, CpuUse, contention_reason
from perfsuite.measure.gpu_telemetry import GpuTelemetry, RepeatTelemetry, disturbance_reason
from perfsuite.measure.send_lag import client_bound_reason
from perfsuite.measure.summaries import Repeats
from perfsuite.measure.timing import DevicePeakMemory, Runs, timed_run

QUIET_CHECK_SECONDS = 0.5
QUIET_WAIT_SECONDS = 5.0
RERUN_SHARE = 0.5  # at most half of the repeats are re-run: past that, the machine is not quiet enough to measure


@dataclass(frozen=True, slots=True)
class Repeat:
    """One repeat and what was read around it.

    ``payload``: what the transport returned besides the run (a capacity
    search's ``Capacity``, client shards' ``ShardedRun``); ``lagging``: why
    its load generator fell behind its schedule, if it did.
    """

    run: RunResult
    cpu: CpuUse | None = None  # the CPU meter around it; None: not read (a fake that sleeps, a server elsewhere)
    peak_bytes: int | None = None  # CUDA: the device's peak allocation during it
    telemetry: RepeatTelemetry | None = None  # NVML around it: throttled or shared
    lagging: str | None = None
    payload: object = None

    def is_busy(self, threshold: float) -> bool:
        return self.cpu is not None and self.cpu.is_busy(threshold)

    def is_disturbed(self, threshold: float) -> bool:
        disturbed_gpu = self.telemetry is not None and self.telemetry.disturbed() is not None
        return self.is_busy(threshold) or disturbed_gpu or self.lagging is not None


class BracketingProbe:
    """The machine probe around each repeat: the geometric mean of the readings just before and just after it.

    bench/probe_drift.py: the machine's speed drifts during a run, and the
    reading after it as well as before cut the drift left in a decode step's
    time by a fifth. A reading serves as the "after" of one run and the
    "before" of the next. Without a probe, there are no readings.
    """

    def __init__(self, probe: Callable[[str], float] | None, device: str) -> None:
        self._probe = probe
        self._device = device
        self._latest: float | None = None
        self._before: list[float] = []  # per run, in run order
        self._around: list[float] = []  # per run whose "after" reading is in

    def take(self) -> None:
        if self._probe is None:
            return
        self._latest = self._probe(self._device)
        if len(self._around) < len(self._before):  # the last run's "after"
            self._around.append(math.sqrt(self._before[len(self._around)] * self._latest))

    def starting_run(self) -> None:
        if self._latest is not None:
            self._before.append(self._latest)

    def move_last_to(self, index: int) -> None:
        """A re-run took the place of the disturbed run ``index``."""
        if self._around:
            self._before[index] = self._before.pop()
            self._around[index] = self._around.pop()

    def per_run(self) -> tuple[float, ...]:
        """One reading per run; a run cut short by a busy machine has only its "before"."""
        return tuple(self._around) + tuple(self._before[len(self._around) :])


Rounds = Callable[[Callable[[], None], Callable[[], None], int], None]
"""Drives ``rounds`` calls of ``one`` each after ``setup``: pytest-benchmark's ``pedantic``, or ``plain_rounds``."""


def plain_rounds(one: Callable[[], None], setup: Callable[[], None], rounds: int) -> None:
    for _ in range(rounds):
        setup()
        one()


@dataclass(frozen=True, slots=True)
class Timed:
    """A test's repeats in order, the probe around each, and why they are noisy (None: quiet)."""

    repeats: tuple[Repeat, ...]
    probes: tuple[float, ...]
    noisy: str | None

    @property
    def runs(self) -> tuple[RunResult, ...]:
        return tuple(repeat.run for repeat in self.repeats)

    def summarised(self) -> Repeats:
        """What ``measure.summaries`` summarises: runs, probes, busy shares, device peaks, energy per token."""
        return Repeats(
            self.runs,
            self.probes,
            busy_shares([repeat.cpu for repeat in self.repeats]),
            self.noisy,
            device_memory=_all_or_none([repeat.peak_bytes for repeat in self.repeats]),
            energy_per_token=_energy(self.repeats),
        )


def busy_shares(uses: Sequence[CpuUse | None]) -> tuple[float, ...]:
    """Other work's share of the machine's CPU during each repeat that read it."""
    return tuple(use.busy_share for use in uses if use is not None)


def noisy_reason(repeats: Sequence[Repeat], threshold: float) -> str | None:
    """Every reason the repeats are noisy, joined: the CPU, the GPU, a load generator behind its schedule."""
    reasons = (
        contention_reason([repeat.cpu for repeat in repeats], threshold),
        disturbance_reason([repeat.telemetry for repeat in repeats]),
        client_bound_reason([repeat.run for repeat in repeats]),
    )
    return "; ".join(filter(None, reasons)) or None


def noisy_save_failure(test_id: str, noisy: str | None, save_baseline: bool) -> str | None:
    """The noisy-save rule: a ``--perf-save-baseline`` test that measured noise fails, saying why (None: it passes)."""
    if not save_baseline or not noisy:
        return None
    return f"{test_id}: baseline not saved: {noisy}; record it on a quiet machine"


def wait_until_quiet(threshold: float) -> bool:
    """Whether the machine's CPU fell quiet within ``QUIET_WAIT_SECONDS``."""
    deadline = time.monotonic() + QUIET_WAIT_SECONDS
    while time.monotonic() < deadline:
        with CpuMeter() as meter:
            time.sleep(QUIET_CHECK_SECONDS)
        if meter.use is None or not meter.use.is_busy(threshold):
            return True
    return False


class _BusyForGood(Exception):
    """The machine stayed busy after a disturbed repeat: more repeats would measure the other work."""


@dataclass
class RepeatLoop:
    """``num_repeats`` of ``time_one``, each between two probes, with the re-run policy (module docstring).

    ``reason``: why the repeats are noisy (default ``noisy_reason``); a
    transport that knows more (client shards' send lag) adds to it.
    ``max_rerun_share``: 0 for repeats too long to re-run (a capacity search).
    """

    time_one: Callable[[], Repeat]
    probes: BracketingProbe
    busy_threshold: float
    max_rerun_share: float = RERUN_SHARE
    reason: Callable[[Sequence[Repeat], float], str | None] = noisy_reason
    quiet: Callable[[float], bool] = field(default=lambda threshold: wait_until_quiet(threshold))
    _repeats: list[Repeat] = field(default_factory=list, init=False)

    def run(self, num_repeats: int, rounds: Rounds = plain_rounds) -> Timed:
        try:
            rounds(self._one, self.probes.take, num_repeats)
            while len(self._repeats) < num_repeats:  # --benchmark-disable runs the target only once
                self.probes.take()
                self._one()
            self.probes.take()  # after the last run
            self._rerun_disturbed(num_repeats)
        except _BusyForGood:
            noisy = self.reason(self._repeats, self.busy_threshold)
            return self._timed(f"{noisy}; the other repeats were not run")
        return self._timed(self.reason(self._repeats, self.busy_threshold))

    def _one(self) -> None:
        self.probes.starting_run()
        repeat = self.time_one()
        self._repeats.append(repeat)
        may_rerun = self.max_rerun_share > 0
        if may_rerun and repeat.is_busy(self.busy_threshold) and not self.quiet(self.busy_threshold):
            raise _BusyForGood

    def _rerun_disturbed(self, num_repeats: int) -> None:
        disturbed = [i for i, repeat in enumerate(self._repeats) if repeat.is_disturbed(self.busy_threshold)]
        for index in disturbed[: int(num_repeats * self.max_rerun_share)]:
            self.probes.take()
            self._one()  # the machine is quiet again: this repeat takes the disturbed one's place
            self.probes.take()
            self._repeats[index] = self._repeats.pop()
            self.probes.move_last_to(index)

    def _timed(self, noisy: str | None) -> Timed:
        return Timed(tuple(self._repeats), self.probes.per_run(), noisy)


@dataclass(frozen=True, slots=True)
class MachineMeter:
    """What is read around a repeat on the machine that runs it: its CPU, the device's peak memory, NVML.

    ``reads_cpu``: False for a backend without the machine probe (a fake
    that sleeps follows no machine); ``in_process``: False for an engine
    served from another process, whose device is not this one's and whose
    CPU use shows up as other work (only steal is counted).
    """

    device: str
    reads_cpu: bool = True
    in_process: bool = True
    gpu: GpuTelemetry | None = None  # NVML on CUDA with nvidia-ml-py, opened by ``opened``

    @classmethod
    def opened(cls, device: str, reads_cpu: bool, in_process: bool) -> MachineMeter:
        from perfsuite.measure.gpu_telemetry import open_gpu_telemetry

        memory_device = device if in_process else "cpu"  # a server's memory is not this device's
        return cls(memory_device, reads_cpu, in_process, open_gpu_telemetry(memory_device))

    def time(self, run: Callable[[], RunResult]) -> Repeat:
        gpu = self.gpu
        before = gpu.sample() if gpu is not None else None
        with CpuMeter() as meter, DevicePeakMemory(self.device) as memory:
            result = run()
        telemetry = RepeatTelemetry(before, gpu.sample()) if gpu is not None and before is not None else None
        return Repeat(result, self._counted(meter.use), memory.peak_bytes, telemetry)

    def _counted(self, use: CpuUse | None) -> CpuUse | None:
        """An engine served from another process shows up as other work: count only steal."""
        if not self.reads_cpu:
            return None
        if use is None or self.in_process:
            return use
        return replace(use, foreign_share=0.0)


def runs_in_process(engine: object) -> bool:
    """False for an engine whose work a server in another process does (``openai-http``)."""
    return getattr(engine, "runs_in_process", True)


@dataclass(frozen=True, slots=True)
class EngineRepeats:
    """A test's engine, its requests and how many repeats: what ``measure_engine`` times."""

    engine: Runs
    requests: Sequence[Request]
    max_concurrency: int | None
    warmup_runs: int
    num_repeats: int


def measure_engine(
    job: EngineRepeats,
    device: str,
    probe: Callable[[str], float] | None,
    busy_threshold: float,
    rounds: Rounds = plain_rounds,
) -> Timed:
    """Warm-ups (discarded), then the repeat loop over timed runs of the engine: locally and on a Ray actor alike.

    A server in another process may run on another machine: this one's
    probe would only add its noise. A backend without a probe (a fake that
    sleeps) does not follow the machine: no CPU reading either.
    """
    engine, requests, max_concurrency = job.engine, job.requests, job.max_concurrency
    in_process = runs_in_process(engine)
    warm_up(engine, requests, max_concurrency, job.warmup_runs)
    probes = BracketingProbe(probe if in_process else None, device)
    meter = MachineMeter.opened(device, probe is not None, in_process)

    def one() -> Repeat:
        repeat = meter.time(lambda: timed_run(engine, requests, device, max_concurrency=max_concurrency))
        return replace(repeat, lagging=client_bound_reason([repeat.run]))  # an open loop's sends fell behind

    return RepeatLoop(one, probes, busy_threshold).run(job.num_repeats, rounds)


def warm_up(engine: Runs, requests: Sequence[Request], max_concurrency: int | None, num_runs: int) -> None:
    """The warm-up runs, discarded: compilation, caches and allocators settle before anything is timed."""
    for _ in range(num_runs):
        engine.run(requests, max_concurrency=max_concurrency)


def _all_or_none(peaks: Sequence[int | None]) -> tuple[int, ...]:
    """One peak per run, or none at all (off CUDA)."""
    return tuple(p for p in peaks if p is not None) if peaks and all(p is not None for p in peaks) else ()


def _energy(repeats: Sequence[Repeat]) -> tuple[float, ...]:
    """Joules per output token of each repeat, from NVML's energy counter; none unless every repeat has one."""
    energies = [
        None
        if repeat.telemetry is None
        else repeat.telemetry.energy_per_token(sum(r.num_output_tokens for r in repeat.run.records))
        for repeat in repeats
    ]
    return tuple(e for e in energies if e is not None) if energies and all(e is not None for e in energies) else ()


def search_capacity(
    runs: CapacityRuns,
    num_repeats: int,
    probes: BracketingProbe,
    meter: MachineMeter,
    busy_threshold: float,
    rounds: Rounds = plain_rounds,
) -> tuple[tuple[Capacity, ...], Timed]:
    """The capacity loop: ``num_repeats`` searches (``measure.capacity_runs``), each between two probes, metered.

    A search is long, so a disturbed one is not re-run: the test is noisy.
    Each repeat's run is the run at its search's capacity. Raises
    ``CapacityError`` when a search finds no capacity (the test keeps none).
    """

    def one() -> Repeat:
        found: list[Capacity] = []

        def search() -> RunResult:
            capacity, at = runs.one_search()
            found.append(capacity)
            return at

        return replace(meter.time(search), payload=found[0])

    timed = RepeatLoop(one, probes, busy_threshold, max_rerun_share=0.0).run(num_repeats, rounds)
    return tuple(repeat.payload for repeat in timed.repeats if isinstance(repeat.payload, Capacity)), timed
