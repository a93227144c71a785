"""Capacity under an SLO: the highest load at which enough requests meet it. Pure Python, no torch.

The question a person sizing a deployment asks: how many requests per second
can one instance serve while TTFT and TPOT stay within their targets? The
answer here is DistServe's goodput rule: the highest load at which at least
``target_share`` (default 90%) of the requests meet every SLO and the engine
keeps up (steady state, below). The load is searched one of two ways
(``CapacitySearch.by``):

- **rate** (open loop): Poisson arrivals at a rate in req/s; the capacity is
  the highest rate that passed;
- **concurrency** (closed loop): a fixed number of requests in flight, the
  next sent as one finishes; the capacity is still req/s: the request
  throughput achieved at the highest concurrency that passed, which is kept
  with it (``Capacity.concurrency``).

``search_capacity`` finds it from a probe function (a rate or a concurrency ->
``ProbeOutcome``), on the search's grid (``RateGrid``, ``ConcurrencyGrid``):

- **bracket**: probe the start; if it passes, grow it (rates by ``growth``,
  concurrencies by 2) until a probe fails (at most the ceiling); if it fails,
  shrink until one passes (at least the floor: ``min_rate``, or concurrency 1);
- **bisect** between the highest point that passed and the lowest that failed
  above it, rates geometrically, concurrencies on integers, until the failing
  end is within ``tolerance`` of the passing end (``high / low <= 1 +
  tolerance``) or, for concurrencies, the next integer (``high - low == 1``).

The capacity is the highest point that passed (the lower end of the final
bracket): a load at which the SLO was seen to hold, never an interpolation.
Every search that starts at a power of two visits points on one grid
(powers of 2 and their geometric midpoints for rates, integers between powers
of 2 for concurrencies), whatever the start, so two searches (a baseline's
and a current run's) report comparable values.

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
over the requests after the ramp. A closed-loop probe cannot build an
unbounded queue (at most its concurrency are ever in flight, and a request's
arrival is when it was sent), so the queue-growth check does not apply to
it; its ramp is still left out.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from perfsuite.engine.types import RunResult
from perfsuite.measure.metrics import SLO, RequestMetrics, percentile, run_metrics

DEFAULT_TARGET_SHARE = 0.90  # DistServe's goodput: 90% of requests within the SLO
BY_RATE, BY_CONCURRENCY = "rate", "concurrency"
SEARCH_KINDS = (BY_RATE, BY_CONCURRENCY)


class CapacityError(RuntimeError):
    """The search found no capacity: the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One probe: requests at ``rate`` (req/s), what share met the SLO, their latencies, and whether it held.

    A closed-loop probe also has its ``concurrency``; its ``rate`` is the request throughput it achieved.
    """

    rate: float
    good_share: float  # of the requests after the ramp, the share that met every SLO
    num_requests: int  # after the ramp
    p50_ttft_ms: float
    p90_ttft_ms: float
    p50_tpot_ms: float
    p90_tpot_ms: float
    steady: bool
    client_kept_up: bool = True
    note: str = ""  # why it was not steady, or not trusted; for a closed loop, why steadiness was not judged
    concurrency: int | None = None  # a closed-loop probe's requests in flight; None: open loop at ``rate``

    def passes(self, target_share: float) -> bool:
        return self.steady and self.client_kept_up and self.good_share >= target_share


@dataclass(frozen=True, slots=True)
class RateGrid:
    """Arrival rates (req/s): geometric steps and midpoints, so searches from powers of two share their points."""

    floor: float
    ceiling: float
    growth: float
    tolerance: float

    def up(self, rate: float) -> float:
        return min(rate * self.growth, self.ceiling)

    def down(self, rate: float) -> float:
        return max(rate / self.growth, self.floor)

    def between(self, low: float, high: float) -> float:
        return math.sqrt(low * high)

    def is_narrow(self, low: float, high: float) -> bool:
        return high / low <= 1 + self.tolerance

    def width(self, low: float, high: float, digits: int = 1) -> str:
        return f"{high / low - 1:.{digits}%} wide"

    def above_ceiling(self, target_share: float, shown: str) -> str:
        return (
            f"the SLO holds for {target_share:.0%} of requests even at the search's ceiling of {self.ceiling:g} "
            f"req/s ({shown}): the capacity is above it; raise max_rate, or use more requests per probe so that a "
            "growing queue shows"
        )

    def below_floor(self, target_share: float, shown: str) -> str:
        return (
            f"capacity below the search floor of {self.floor:g} req/s: fewer than {target_share:.0%} of requests "
            f"met the SLO, or the queue grew, at every rate probed ({shown}); loosen the SLO, or lower min_rate"
        )

    no_bracket_fix = "start nearer the capacity (start_rate), grow faster (growth), or allow more probes (max_probes)"


@dataclass(frozen=True, slots=True)
class ConcurrencyGrid:
    """Requests in flight (1, 2, 3, ...): doubling, then integer midpoints, down to 1 and up to ``ceiling``."""

    ceiling: int
    tolerance: float
    floor: int = 1

    def up(self, concurrency: int) -> int:
        return min(2 * concurrency, self.ceiling)

    def down(self, concurrency: int) -> int:
        return max(concurrency // 2, self.floor)

    def between(self, low: int, high: int) -> int:
        return (low + high) // 2

    def is_narrow(self, low: int, high: int) -> bool:
        return high - low <= 1 or high / low <= 1 + self.tolerance

    def width(self, low: int, high: int, digits: int = 1) -> str:
        return f"concurrency {low}..{high}"

    def above_ceiling(self, target_share: float, shown: str) -> str:
        return (
            f"the SLO holds for {target_share:.0%} of requests even at the search's ceiling of {self.ceiling} "
            f"requests in flight ({shown}): the capacity is above it; use more requests per probe (a probe of n "
            "requests cannot have more than n in flight), or raise max_concurrency"
        )

    def below_floor(self, target_share: float, shown: str) -> str:
        return (
            f"no concurrency passes: even one request at a time, fewer than {target_share:.0%} of requests met "
            f"the SLO ({shown}); loosen the SLO"
        )

    no_bracket_fix = "start nearer the capacity (start_concurrency), or allow more probes (max_probes)"


P = TypeVar("P", int, float)  # a point of a search: a concurrency, or a rate


class Grid(Protocol[P]):
    """The points a search visits (``RateGrid``, ``ConcurrencyGrid``) and what it says when none brackets."""

    @property
    def floor(self) -> P: ...
    @property
    def ceiling(self) -> P: ...
    @property
    def no_bracket_fix(self) -> str: ...
    def up(self, point: P, /) -> P: ...
    def down(self, point: P, /) -> P: ...
    def between(self, low: P, high: P, /) -> P: ...
    def is_narrow(self, low: P, high: P, /) -> bool: ...
    def width(self, low: P, high: P, /, digits: int = 1) -> str: ...
    def above_ceiling(self, target_share: float, shown: str) -> str: ...
    def below_floor(self, target_share: float, shown: str) -> str: ...


@dataclass(frozen=True, slots=True)
class CapacitySearch:
    """How to search: by rate or concurrency, where to start, how far to go, how precise, what share is enough."""

    target_share: float = DEFAULT_TARGET_SHARE
    start_rate: float = 1.0
    growth: float = 2.0
    tolerance: float = 0.10  # stop when the failing rate is within 10% above the passing one
    min_rate: float = 0.01
    max_rate: float = 10_000.0
    max_probes: int = 16
    by: str = BY_RATE  # or BY_CONCURRENCY: a closed loop over requests in flight
    start_concurrency: int = 1
    max_concurrency: int = 1024

    def __post_init__(self) -> None:
        if self.by not in SEARCH_KINDS:
            raise ValueError(f"a capacity search is by {' or '.join(SEARCH_KINDS)}, got {self.by!r}")
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
        if not 1 <= self.start_concurrency <= self.max_concurrency:
            raise ValueError(
                f"need 1 <= start_concurrency <= max_concurrency, got {self.start_concurrency}, {self.max_concurrency}"
            )
        if self.max_probes < 2:
            raise ValueError(f"max_probes must be at least 2 (one passing, one failing), got {self.max_probes}")

    @property
    def label(self) -> str:
        """What a baseline identity records of the search (its start is a power of two and not part of it).

        A rate search's label is the one stored baselines carry; only another kind of search adds its own.
        """
        label = f"share>={self.target_share:g},tolerance={self.tolerance:g}"
        return label if self.by == BY_RATE else f"by={self.by},{label}"

    @property
    def grid(self) -> RateGrid | ConcurrencyGrid:
        if self.by == BY_CONCURRENCY:
            return ConcurrencyGrid(self.max_concurrency, self.tolerance)
        return RateGrid(self.min_rate, self.max_rate, self.growth, self.tolerance)

    @property
    def start(self) -> float:
        return self.start_concurrency if self.by == BY_CONCURRENCY else self.start_rate


@dataclass(frozen=True, slots=True)
class Capacity:
    """A search's answer: requests/s per instance and per device, and how it was found.

    By rate, the highest rate that passed, and ``bracket`` holds rates; by
    concurrency, the throughput achieved at the highest concurrency that
    passed (``concurrency``), and ``bracket`` holds concurrencies.
    """

    requests_per_second: float  # per instance
    bracket: tuple[float, float]  # (highest passing, lowest failing above it), in the search's points
    probes: tuple[ProbeOutcome, ...]  # in the order made
    stopped: str  # why the search stopped
    target_share: float
    tolerance: float
    num_devices: int = 1  # tensor parallelism: the devices one instance spans
    concurrency: int | None = None  # a concurrency search's highest passing concurrency; None: a rate search

    @property
    def by(self) -> str:
        return BY_RATE if self.concurrency is None else BY_CONCURRENCY

    @property
    def found_at(self) -> float:
        """The point the answer was probed at: its rate, or its concurrency."""
        return self.requests_per_second if self.concurrency is None else self.concurrency

    @property
    def requests_per_second_per_device(self) -> float:
        return self.requests_per_second / self.num_devices

    @property
    def within_tolerance(self) -> bool:
        low, high = self.bracket
        adjacent = self.concurrency is not None and high - low <= 1
        return adjacent or high / low <= 1 + self.tolerance * (1 + 1e-9)


def search_capacity(
    probe: Callable[[Any], ProbeOutcome],
    search: CapacitySearch = CapacitySearch(),
    num_devices: int = 1,
    unloaded: Callable[[], ProbeOutcome] | None = None,
) -> Capacity:
    """The highest point whose probe passes, bracketed then bisected (module docstring).

    ``probe`` takes a rate (req/s) or, for a search by concurrency, a number
    of requests in flight. Raises ``CapacityError`` when even the floor fails
    (``min_rate``, or concurrency 1: never a capacity of 0), when the ceiling
    still passes, or when ``max_probes`` run out before a bracket is found.
    Probes running out during the bisection return the bracket reached,
    ``within_tolerance`` False.

    ``unloaded`` (rate searches only: a concurrency search's floor is one
    request at a time): the requests served one at a time, asked for only
    when the start rate fails. Fewer good requests than the target there
    means no rate can pass (no load is lighter), so the search stops at once
    instead of probing ever lower rates, each slower than the last.
    """
    grid = search.grid
    if isinstance(grid, ConcurrencyGrid):
        return _Search(probe, search, grid, num_devices).run(search.start_concurrency, None)
    return _Search(probe, search, grid, num_devices).run(search.start_rate, unloaded)


class _Search(Generic[P]):
    """One search's probes so far, on ``grid``: bracket, then bisect (the module docstring)."""

    def __init__(
        self, probe: Callable[[Any], ProbeOutcome], search: CapacitySearch, grid: Grid[P], num_devices: int
    ) -> None:
        self.probe = probe
        self.search = search
        self.grid: Grid[P] = grid
        self.num_devices = num_devices
        self.outcomes: list[ProbeOutcome] = []  # in the order made
        self.passed: dict[P, ProbeOutcome] = {}

    def run(self, start: P, unloaded: Callable[[], ProbeOutcome] | None) -> Capacity:
        low, high = _bracket(self.passes, self.grid, start, self.search, self.outcomes, unloaded)
        return self.bisect(low, high)

    def passes(self, point: P) -> bool:
        """Probe ``point``: whether enough of its requests met the SLO (and it held steady)."""
        search = self.search
        if len(self.outcomes) >= search.max_probes:
            shown = _shown(self.outcomes)
            raise CapacityError(f"no bracket after {search.max_probes} probes ({shown}): {self.grid.no_bracket_fix}")
        self.outcomes.append(self.probe(point))
        if self.outcomes[-1].passes(search.target_share):
            self.passed[point] = self.outcomes[-1]
        return point in self.passed

    def bisect(self, low: P, high: P) -> Capacity:
        """Narrow the bracket (``low`` passed, ``high`` failed) until it is within tolerance or probes run out."""
        grid, search = self.grid, self.search
        while not grid.is_narrow(low, high):
            if len(self.outcomes) >= search.max_probes:
                bracket = grid.width(low, high, digits=0)
                return self.answer(low, high, f"probe limit ({search.max_probes}) reached with the bracket {bracket}")
            middle = grid.between(low, high)
            low, high = (middle, high) if self.passes(middle) else (low, middle)
        bracket = grid.width(low, high)
        return self.answer(
            low, high, f"bracket within {search.tolerance:.0%} ({bracket}) after {len(self.outcomes)} probes"
        )

    def answer(self, low: P, high: P, stopped: str) -> Capacity:
        by_concurrency = self.search.by == BY_CONCURRENCY
        rate = self.passed[low].rate if by_concurrency else low
        return Capacity(
            rate,
            (low, high),
            tuple(self.outcomes),
            stopped,
            self.search.target_share,
            self.search.tolerance,
            self.num_devices,
            int(low) if by_concurrency else None,
        )


def _bracket(
    passes: Callable[[P], bool],
    grid: Grid[P],
    start: P,
    search: CapacitySearch,
    outcomes: list[ProbeOutcome],
    unloaded: Callable[[], ProbeOutcome] | None,
) -> tuple[P, P]:
    """(a passing point, a failing point above it), growing or shrinking on the grid from ``start``."""
    point = start
    if passes(point):
        while True:
            if point >= grid.ceiling:
                raise CapacityError(grid.above_ceiling(search.target_share, _shown(outcomes)))
            low, point = point, grid.up(point)
            if not passes(point):
                return low, point
    alone = unloaded() if unloaded is not None else None
    if alone is not None and alone.good_share < search.target_share:
        raise CapacityError(
            f"capacity below any rate: served one request at a time, only {alone.good_share:.0%} of requests met "
            f"the SLO (p90 TTFT {alone.p90_ttft_ms:.0f} ms, p90 TPOT {alone.p90_tpot_ms:.0f} ms), fewer than the "
            f"{search.target_share:.0%} needed ({_shown(outcomes)}); loosen the SLO"
        )
    while True:
        if point <= grid.floor:
            raise CapacityError(grid.below_floor(search.target_share, _shown(outcomes)))
        high, point = point, grid.down(point)
        if passes(point):
            return point, high


def _shown(outcomes: Sequence[ProbeOutcome]) -> str:
    return ", ".join(
        _point(o)
        + f": {o.good_share:.0%} good"
        + ("" if o.steady else ", queue growing")
        + ("" if o.client_kept_up else ", client behind")
        for o in outcomes
    )


def _point(outcome: ProbeOutcome) -> str:
    if outcome.concurrency is None:
        return f"{outcome.rate:.3g} req/s"
    return f"concurrency {outcome.concurrency} ({outcome.rate:.3g} req/s)"


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


def closed_loop_outcome(
    run: RunResult, concurrency: int, slo: SLO, steady_state: SteadyState = SteadyState()
) -> ProbeOutcome:
    """A closed-loop probe at ``concurrency``: its rate is the request throughput it achieved.

    Its ramp is left out as an open-loop probe's is, but its steadiness is not
    judged: with at most ``concurrency`` requests in flight, each arriving
    when it is sent, no queue can grow (module docstring).
    """
    outcome = probe_outcome(run, run_metrics(run).request_throughput, slo, steady_state)
    note = f"closed loop: at most {concurrency} requests in flight, so no queue can grow; steadiness not judged"
    return dataclasses.replace(outcome, steady=True, concurrency=concurrency, note=note)


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

    @property
    def by(self) -> str:
        return self.searches[0].by if self.searches else BY_RATE

    @property
    def concurrency(self) -> int | None:
        """A concurrency search's median highest passing concurrency (the lower middle one); None by rate."""
        found = [s.concurrency for s in self.searches if s.concurrency is not None]
        return statistics.median_low(found) if found else None

    @classmethod
    def of(cls, searches: Sequence[Capacity], slo: SLO, notes: Sequence[str] = ()) -> CapacityRecord:
        ms = {
            name: None if getattr(slo, name) is None else 1e3 * getattr(slo, name) for name in ("ttft", "tpot", "e2el")
        }
        return cls(tuple(searches), ms["ttft"], ms["tpot"], ms["e2el"], tuple(notes))

    def to_json(self) -> dict[str, Any]:
        """results.json version 4's layout (version 5 writes through ``perfsuite.codec``; its converter reads this).

        A rate search's JSON is as it was before concurrency searches; theirs adds ``by`` and ``concurrency``.
        """
        by_concurrency = {"by": BY_CONCURRENCY, "concurrency": self.concurrency} if self.concurrency else {}
        return {
            **by_concurrency,
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
                    **({} if s.concurrency is None else {"concurrency": s.concurrency}),
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
                concurrency=s.get("concurrency"),  # absent before concurrency searches, and for a rate search
            )
            for s in data["searches"]
        )
        return cls(
            searches, data["slo_ttft_ms"], data["slo_tpot_ms"], data.get("slo_e2el_ms"), tuple(data.get("notes", ()))
        )


def _probe_json(probe: ProbeOutcome) -> dict[str, Any]:
    """NaN (no TPOT when every request made one token) is written as null: JSON has no NaN.

    An open-loop probe has no concurrency, and its JSON no key for it, as before concurrency searches.
    """
    values = dataclasses.asdict(probe)
    if probe.concurrency is None:
        del values["concurrency"]
    return {name: None if isinstance(v, float) and math.isnan(v) else v for name, v in values.items()}


def _float(value: Any) -> Any:
    return math.nan if value is None else value
