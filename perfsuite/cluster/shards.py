"""Client shards' arithmetic: split an open-loop schedule, estimate each shard's clock offset, merge the records.

Pure Python (no Ray, no torch): the controller's ``ClientShards`` uses it,
and the tests feed it fake clocks.

- **Splitting**: the schedule's requests, in arrival order, go to the shards
  round robin by index (request k to shard k mod N). Each keeps its arrival
  offset unchanged, so every shard sends on the same timebase, and together
  they send the whole schedule once.
- **Clock offset**: NTP's estimate. The controller reads its clock
  (``sent``), asks the shard for its clock (``remote``), and reads its own
  again (``received``). The shard read its clock somewhere in between, so
  its offset (shard time minus controller time) lies in
  ``[remote - received, remote - sent]``; the midpoint,
  ``remote - (sent + received) / 2``, is off by at most half the round
  trip. Of several round trips the one with the shortest is kept: its bound
  is the tightest.
- **Start**: the controller picks a start on its own clock, far enough
  ahead for every shard to get the message; each shard starts at that
  moment on its own clock (start + its offset).
- **Merging**: each shard's timestamps, less its offset, are on the
  controller's clock; the records of every shard, so corrected, are one run
  in schedule order, as if one client had sent them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from perfsuite.engine.types import EngineCounters, Request, RequestRecord, RunResult, check_new_request_id

DEFAULT_ROUND_TRIPS = 8


def split_schedule(requests: Sequence[Request], num_shards: int) -> tuple[tuple[Request, ...], ...]:
    """``num_shards`` shares of ``requests``, dealt round robin in arrival order; arrival offsets unchanged."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    ordered = sorted(requests, key=lambda request: request.arrival_time)  # stable: equal arrivals keep their order
    return tuple(tuple(ordered[shard::num_shards]) for shard in range(num_shards))


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """One clock reading of a shard, between two of the controller's (each on its own clock, seconds)."""

    sent: float
    remote: float
    received: float

    @property
    def round_trip_s(self) -> float:
        return self.received - self.sent

    @property
    def offset_s(self) -> float:
        return self.remote - (self.sent + self.received) / 2


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """A shard's clock minus the controller's, and the most the estimate can be off by (half the best round trip)."""

    offset_s: float
    error_bound_s: float
    num_round_trips: int

    def to_controller(self, shard_time: float) -> float:
        return shard_time - self.offset_s

    def to_shard(self, controller_time: float) -> float:
        return controller_time + self.offset_s


def estimate_offset(round_trips: Sequence[RoundTrip]) -> ClockOffset:
    """The offset from the round trip with the shortest time (module docstring)."""
    if not round_trips:
        raise ValueError("no round trip to estimate a clock offset from")
    backwards = [trip for trip in round_trips if trip.round_trip_s < 0]
    if backwards:
        raise ValueError(f"the controller's clock went backwards during a round trip: {backwards[0]}")
    best = min(round_trips, key=lambda trip: trip.round_trip_s)
    return ClockOffset(best.offset_s, best.round_trip_s / 2, len(round_trips))


def measure_offset(
    read_remote: Callable[[], float],
    clock: Callable[[], float] = time.perf_counter,
    num_round_trips: int = DEFAULT_ROUND_TRIPS,
) -> ClockOffset:
    """``num_round_trips`` readings of ``read_remote`` (the shard's clock), each between two of ``clock``."""
    trips = []
    for _ in range(num_round_trips):
        sent = clock()
        remote = read_remote()
        trips.append(RoundTrip(sent, remote, clock()))
    return estimate_offset(trips)


def on_controller_clock(run: RunResult, offset: ClockOffset) -> RunResult:
    """``run`` with every timestamp moved from the shard's clock onto the controller's."""
    return replace(
        run,
        records=tuple(_shifted(record, -offset.offset_s) for record in run.records),
        start_time=offset.to_controller(run.start_time),
        end_time=offset.to_controller(run.end_time),
        steps=(),  # a client has no engine steps; a shard's run would carry none
    )


def merge_runs(shard_runs: Sequence[RunResult], start_time: float) -> RunResult:
    """The shards' runs, already on the controller's clock, as one run from ``start_time`` in schedule order."""
    if not shard_runs:
        raise ValueError("no shard run to merge")
    records = sorted((r for run in shard_runs for r in run.records), key=_schedule_order)
    seen: set[str] = set()
    for record in records:  # a request sent twice (by two shards) would otherwise count twice
        check_new_request_id(record.request_id, seen, "appears twice in the run")
        seen.add(record.request_id)
    return RunResult(
        engine_name=shard_runs[0].engine_name,
        records=tuple(records),
        start_time=start_time,
        end_time=max(run.end_time for run in shard_runs),
        counters=_one_count([run.counters for run in shard_runs]),
        # Every shard read the one server's /metrics over the same window: its figures count every shard's requests.
        server_metrics=next((run.server_metrics for run in shard_runs if run.server_metrics is not None), None),
    )


def _schedule_order(record: RequestRecord) -> tuple[float, float]:
    scheduled = record.scheduled_time if record.scheduled_time is not None else record.arrival_time
    return scheduled, record.arrival_time


def _shifted(record: RequestRecord, by: float) -> RequestRecord:
    def moved(value: float | None) -> float | None:
        return None if value is None else value + by

    return replace(
        record,
        arrival_time=record.arrival_time + by,
        first_scheduled_time=moved(record.first_scheduled_time),
        token_times=tuple(t + by for t in record.token_times),
        finished_time=moved(record.finished_time),
        scheduled_time=moved(record.scheduled_time),
        send_ready_time=moved(record.send_ready_time),
        sent_time=moved(record.sent_time),
    )


def _one_count(counters: Sequence[EngineCounters]) -> EngineCounters:
    """A client counts none of the server's work (openai-http's are all zero): every shard must say the same."""
    if any(one != counters[0] for one in counters):
        raise ValueError(f"client shards counted different engine work: {counters}; a client counts none")
    return counters[0]
