"""Capacity under an SLO: the highest arrival rate at which enough requests meet it. Pure Python, no torch.

The question a person sizing a deployment asks: how many requests per second
can one instance serve while TTFT and TPOT stay within their targets? The
answer here is DistServe's goodput rule: the highest Poisson arrival rate at
which at least ``target_share`` (default 90%) of the requests meet every SLO
and the engine keeps up (steady state, below).

``search_capacity`` finds it from a probe function (rate -> ``ProbeOutcome``):

- **bracket**: probe ``start_rate``; if it passes, multiply the rate by
  ``growth`` until a probe fails (at most ``max_rate``); if it fails, divide
  until one passes (at least ``min_rate``);
- **bisect** geometrically between the highest rate that passed and the lowest
  that failed above it, until the failing end is within ``tolerance`` of the
  passing end (``high / low <= 1 + tolerance``).

The capacity is the highest rate that passed (the lower end of the final
bracket): a rate at which the SLO was seen to hold, never an interpolation.
Every search that starts at a power of two visits rates on one grid
(powers of 2 and their geometric midpoints), whatever the start, so two
searches (a baseline's and a current run's) report comparable values.

**Steady state** (``probe_outcome``): an open-loop probe whose queue keeps
growing measures the length of the probe, not the engine: with a few
requests and a loose SLO any rate "passes". So the first ``ramp_share`` of
the requests (by arrival) are a ramp and judge nothing, and the rest are
split in two halves by arrival: the probe is steady when the second half's
mean queueing delay (arrival to first scheduled; TTFT where the engine does
not say when it scheduled) is at most ``1 + queue_growth`` times the first
half's plus ``queue_slack_gaps`` mean gaps between arrivals (the absolute
slack keeps a near-empty queue's jitter from reading as growth). A probe that
is not steady, or whose client did not keep up with the schedule, fails
whatever its share of good requests. The share of good requests is counted
over the requests after the ramp.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfsuite.engine.types import RunResult
from perfsuite.measure.metrics import SLO, RequestMetrics, percentile, run_metrics

DEFAULT_TARGET_SHARE = 0.90  # DistServe's goodput: 90% of requests within the SLO


class CapacityError(RuntimeError):
    """The search found no capacity: the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One probe: requests at ``rate`` (req/s), what share met the SLO, their latencies, and whether it held."""

    rate: float
    good_share: float  # of the requests after the ramp, the share that met every SLO
    num_requests: int  # after the ramp
    p50_ttft_ms: float
    p90_ttft_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    steady: bool
    client_kept_up: bool = True
    note: str = ""  # why it was not steady, or not trusted

    def passes(self, target_share: float) -> bool:
        return self.steady and self.client_kept_up and self.good_share >= target_share


@dataclass(frozen=True, slots=True)
class CapacitySearch:
    """How to search: where to start, how far to go, how precise to be, what share of good requests is enough."""

    target_share: float = DEFAULT_TARGET_SHARE
    start_rate: float = 1.0
    growth: float = 2.0
    tolerance: float = 0.10  # stop when the failing rate is within 10% above the passing one
    min_rate: float = 0.01
    max_rate: float = 10_000.0
    max_probes: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.target_share <= 1:
            raise ValueError(f"target_share must be in (0, 1], got {self.target_share}")
        if not self.growth > 1:
            raise ValueError(f"growth must be above 1, got {self.growth}")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be positive (0.10 for 10%), got {self.tolerance}")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(
                f"need 0 < min_rate <= start_rate <= max_rate, got {self.min_rate}, {self.start_rate}, {self.max_rate}"
            )
        if self.max_probes < 2:
            raise ValueError(f"max_probes must be at least 2 (one passing, one failing), got {self.max_probes}")

    @property
    def label(self) -> str:
        """What a baseline identity records of the search (its start is a power of two and not part of it)."""
        return f"share>={self.target_share:g},tolerance={self.tolerance:g}"


@dataclass(frozen=True, slots=True)
class Capacity:
    """A search's answer: the highest rate that passed, per instance and per device, and how it was found."""

    requests_per_second: float  # per instance: the highest rate that passed
    bracket: tuple[float, float]  # (highest passing, lowest failing above it)
    probes: tuple[ProbeOutcome, ...]  # in the order made
    stopped: str  # why the search stopped
    target_share: float
    tolerance: float
    num_devices: int = 1  # tensor parallelism: the devices one instance spans

    @property
    def requests_per_second_per_device(self) -> float:
        return self.requests_per_second / self.num_devices

    @property
    def within_tolerance(self) -> bool:
        low, high = self.bracket
        return high / low <= 1 + self.tolerance * (1 + 1e-9)


def search_capacity(
    probe: Callable[[float], ProbeOutcome],
    search: CapacitySearch = CapacitySearch(),
    num_devices: int = 1,
    unloaded: Callable[[], ProbeOutcome] | None = None,
) -> Capacity:
    """The highest rate whose probe passes, bracketed then bisected (module docstring).

    Raises ``CapacityError`` when even ``min_rate`` fails (the capacity is
    below the search's floor: never 0), when ``max_rate`` still passes, or
    when ``max_probes`` run out before a bracket is found. Probes running out
    during the bisection return the bracket reached, ``within_tolerance`` False.

    ``unloaded``: the requests served one at a time, asked for only when the
    start rate fails. Fewer good requests than the target there means no rate
    can pass (no load is lighter), so the search stops at once instead of
    probing ever lower rates, each slower than the last.
    """
    outcomes: list[ProbeOutcome] = []

    def passes(rate: float) -> bool:
        if len(outcomes) >= search.max_probes:
            raise CapacityError(
                f"no bracket after {search.max_probes} probes ({_shown(outcomes, search)}): start nearer the "
                "capacity (start_rate), grow faster (growth), or allow more probes (max_probes)"
            )
        outcomes.append(probe(rate))
        return outcomes[-1].passes(search.target_share)

    low, high = _bracket(passes, search, outcomes, unloaded)
    while high / low > 1 + search.tolerance:
        if len(outcomes) >= search.max_probes:
            stopped = f"probe limit ({search.max_probes}) reached with the bracket {high / low - 1:.0%} wide"
            return Capacity(low, (low, high), tuple(outcomes), stopped, search.target_share, search.tolerance,
                            num_devices)  # fmt: skip
        middle = math.sqrt(low * high)
        low, high = (middle, high) if passes(middle) else (low, middle)
    stopped = f"bracket within {search.tolerance:.0%} ({high / low - 1:.1%} wide) after {len(outcomes)} probes"
    return Capacity(low, (low, high), tuple(outcomes), stopped, search.target_share, search.tolerance, num_devices)


def _bracket(
    passes: Callable[[float], bool],
    search: CapacitySearch,
    outcomes: list[ProbeOutcome],
    unloaded: Callable[[], ProbeOutcome] | None,
) -> tuple[float, float]:
    """(a passing rate, a failing rate above it), growing or shrinking geometrically from ``start_rate``."""
    rate = search.start_rate
    if passes(rate):
        while True:
            if rate >= search.max_rate:
                raise CapacityError(
                    f"the SLO holds for {search.target_share:.0%} of requests even at the search's ceiling of "
                    f"{search.max_rate:g} req/s ({_shown(outcomes, search)}): the capacity is above it; raise "
                    "max_rate, or use more requests per probe so that a growing queue shows"
                )
            low, rate = rate, min(rate * search.growth, search.max_rate)
            if not passes(rate):
                return low, rate
    alone = unloaded() if unloaded is not None else None
    if alone is not None and alone.good_share < search.target_share:
        raise CapacityError(
            f"capacity below any rate: served one request at a time, only {alone.good_share:.0%} of requests met "
            f"the SLO (p90 TTFT {alone.p90_ttft_ms:.0f} ms, p90 TPOT {alone.p90_tpot_ms:.0f} ms), fewer than the "
            f"{search.target_share:.0%} needed ({_shown(outcomes, search)}); loosen the SLO"
        )
    while True:
        if rate <= search.min_rate:
            raise CapacityError(
                f"capacity below the search floor of {search.min_rate:g} req/s: fewer than "
                f"{search.target_share:.0%} of requests met the SLO, or the queue grew, at every rate probed "
                f"({_shown(outcomes, search)}); loosen the SLO, or lower min_rate"
            )
        high, rate = rate, max(rate / search.growth, search.min_rate)
        if passes(rate):
            return rate, high


def _shown(outcomes: Sequence[ProbeOutcome], search: CapacitySearch) -> str:
    return ", ".join(
        f"{o.rate:.3g} req/s: {o.good_share:.0%} good" + ("" if o.steady else ", queue growing")
        + ("" if o.client_kept_up else ", client behind") for o in outcomes
    )  # fmt: skip


# -- one probe from one run ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SteadyState:
    """How a probe's steady state is judged (module docstring)."""

    ramp_share: float = 0.2
    queue_growth: float = 0.5
    queue_slack_gaps: float = 1.0
    min_requests: int = 8  # after the ramp: fewer cannot show a queue growing

    def judge(self, delays: Sequence[float], rate: float) -> tuple[bool, str]:
        """Steady, and if not why, for the queueing delays (seconds) of the requests after the ramp, in arrival order."""
        if len(delays) < self.min_requests:
            return False, f"{len(delays)} requests after the ramp; a steady state needs at least {self.min_requests}"
        half = len(delays) // 2
        first, second = statistics.fmean(delays[:half]), statistics.fmean(delays[half:])
        allowed = (1 + self.queue_growth) * first + self.queue_slack_gaps / rate
        if second > allowed:
            return False, (
                f"the queue grew: mean queueing delay {1e3 * first:.1f} ms in the first half, "
                f"{1e3 * second:.1f} ms in the second (at most {1e3 * allowed:.1f} ms is steady)"
            )
        return True, ""


def probe_outcome(
    run: RunResult,
    rate: float,
    slo: SLO,
    steady_state: SteadyState = SteadyState(),
    client_kept_up: bool = True,
    client_note: str = "",
) -> ProbeOutcome:
    """What a probe run at ``rate`` says: the share of good requests after the ramp, latencies, steady or not."""
    arrivals = {r.request_id: r.arrival_time for r in run.records}
    by_id = {m.request_id: m for m in run_metrics(run).requests}  # completed requests only
    after_ramp = sorted(arrivals, key=arrivals.__getitem__)[int(len(arrivals) * steady_state.ramp_share) :]
    measured = [by_id[i] for i in after_ramp if i in by_id]  # an aborted or unfinished request is not good
    steady, note = steady_state.judge([_queueing(m) for m in measured], rate)
    good = sum(1 for m in measured if slo.is_met_by(m))
    ttfts = [1e3 * m.ttft for m in measured if m.ttft is not None]
    tpots = [1e3 * m.tpot for m in measured if m.tpot is not None]
    return ProbeOutcome(
        rate=rate,
        good_share=good / len(after_ramp) if after_ramp else 0.0,
        num_requests=len(measured),
        p50_ttft_ms=percentile(ttfts, 50) if ttfts else math.nan,
        p90_ttft_ms=percentile(ttfts, 90) if ttfts else math.nan,
        p50_tpot_ms=percentile(tpots, 50) if tpots else math.nan,
        p90_tpot_ms=percentile(tpots, 90) if tpots else math.nan,
        steady=steady,
        client_kept_up=client_kept_up,
        note=note if client_kept_up else f"the client fell behind its schedule: latencies not trusted; {client_note}",
    )


def _queueing(metrics: RequestMetrics) -> float:
    """Arrival to first scheduled; TTFT where the engine does not say when it scheduled (a server)."""
    if metrics.queue_time is not None:
        return metrics.queue_time
    return metrics.ttft if metrics.ttft is not None else math.inf


# -- what results.json stores -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapacityRecord:
    """A capacity test's searches and what they were searched against, for results.json and the report."""

    searches: tuple[Capacity, ...]  # one per repeat
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_e2el_ms: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # searches that did not converge, and why

    @property
    def requests_per_second(self) -> float:
        """The median capacity over the searches (per instance)."""
        return statistics.median(s.requests_per_second for s in self.searches)

    @property
    def requests_per_second_per_device(self) -> float:
        return statistics.median(s.requests_per_second_per_device for s in self.searches)

    @classmethod
    def of(cls, searches: Sequence[Capacity], slo: SLO, notes: Sequence[str] = ()) -> CapacityRecord:
        ms = {name: None if getattr(slo, name) is None else 1e3 * getattr(slo, name) for name in ("ttft", "tpot", "e2el")}
        return cls(tuple(searches), ms["ttft"], ms["tpot"], ms["e2el"], tuple(notes))

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_per_second": self.requests_per_second,
            "requests_per_second_per_device": self.requests_per_second_per_device,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "slo_e2el_ms": self.slo_e2el_ms,
            "notes": list(self.notes),
            "searches": [
                {
                    "requests_per_second": s.requests_per_second,
                    "requests_per_second_per_device": s.requests_per_second_per_device,
                    "bracket": list(s.bracket),
                    "stopped": s.stopped,
                    "target_share": s.target_share,
                    "tolerance": s.tolerance,
                    "num_devices": s.num_devices,
                    "probes": [_probe_json(p) for p in s.probes],
                }
                for s in self.searches
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapacityRecord:
        searches = tuple(
            Capacity(
                requests_per_second=s["requests_per_second"],
                bracket=(s["bracket"][0], s["bracket"][1]),
                probes=tuple(ProbeOutcome(**{k: _float(v) for k, v in p.items()}) for p in s["probes"]),
                stopped=s["stopped"],
                target_share=s["target_share"],
                tolerance=s["tolerance"],
                num_devices=s["num_devices"],
            )
            for s in data["searches"]
        )
        return cls(searches, data["slo_ttft_ms"], data["slo_tpot_ms"], data.get("slo_e2el_ms"),
                   tuple(data.get("notes", ())))  # fmt: skip


def _probe_json(probe: ProbeOutcome) -> dict[str, Any]:
    """NaN (no TPOT when every request made one token) is written as null: JSON has no NaN."""
    values = dataclasses.asdict(probe)
    return {name: None if isinstance(v, float) and math.isnan(v) else v for name, v in values.items()}


def _float(value: Any) -> Any:
    return math.nan if value is None else value
