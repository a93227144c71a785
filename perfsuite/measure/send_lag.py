"""Does the load generator keep its schedule? The self-check of an open-loop run.

Pure Python. An open-loop request records when the schedule said to send it,
when it could first have gone (``send_ready_time``: later than scheduled
while the engine was mid-step, or while every client connection was busy;
that wait is queueing, which its latencies count) and when it went. What is
left, ``sent - ready``, is the load generator's own lateness: a busy event
loop, a sleep that overslept, a starved CPU. Latencies are counted from the
schedule, so that lateness lands in them as if the engine were slower, and
the engine sees a thinner load than asked for: vLLM's benchmark client has
fallen behind in just this way (its issues #21104, #39963).

A run is *client-bound* when

- its p90 lag exceeds 10% of the schedule's mean gap between requests, but
  never less than 5 ms nor more than 50 ms: a tenth of the gap is the same
  10% as the smallest change a verdict acts on (``--perf-min-effect``); below
  5 ms is timer wake-up jitter (asyncio rounds its waits to the millisecond),
  which no latency perfsuite compares would notice; above 50 ms the lag itself
  is a sizeable share of a TTFT, whatever the rate; or
- the rate at which it offered requests (each at its scheduled time plus its
  lag) is below 90% of the schedule's own rate: a load 10% lighter than asked
  can hide a 10% slowdown.

A client-bound test's comparisons judge nothing (they are marked as a noisy
test's are), and the message says how late the sends were and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.engine.types import RunResult
from perfsuite.measure.metrics import percentile

LAG_SHARE_OF_GAP = 0.10
MIN_LAG_BOUND_S = 0.005
MAX_LAG_BOUND_S = 0.050
MIN_RATE_SHARE = 0.90

CLIENT_BOUND_FIX = (
    "give the load generator CPU of its own (nothing else busy on the machine, fewer pytest-xdist workers; "
    "for openai-http, a client machine or cores apart from the server's) or lower the arrival rate"
)


@dataclass(frozen=True, slots=True)
class SendLag:
    """One open-loop run's sends against its schedule; lags in milliseconds."""

    num_requests: int
    p50_lag_ms: float
    p90_lag_ms: float
    max_lag_ms: float
    lag_bound_ms: float
    target_rate: float | None  # req/s the schedule asks for; None: every request at once
    achieved_rate: float | None  # req/s the generator offered them at

    @property
    def is_lagging(self) -> bool:
        return self.p90_lag_ms > self.lag_bound_ms

    @property
    def misses_rate(self) -> bool:
        if self.target_rate is None or self.achieved_rate is None:
            return False
        return self.achieved_rate < MIN_RATE_SHARE * self.target_rate

    @property
    def is_client_bound(self) -> bool:
        return self.is_lagging or self.misses_rate

    def describe(self) -> str:
        text = f"p90 send lag {self.p90_lag_ms:.1f} ms (bound {self.lag_bound_ms:.1f} ms), max {self.max_lag_ms:.1f} ms"
        if self.target_rate is not None and self.achieved_rate is not None:
            text += f"; offered {self.achieved_rate:.3g} of the {self.target_rate:.3g} req/s scheduled"
        return text


def lag_bound_s(mean_gap_s: float) -> float:
    """The p90 lag a run may show before it is client-bound (see the module docstring)."""
    return max(MIN_LAG_BOUND_S, min(MAX_LAG_BOUND_S, LAG_SHARE_OF_GAP * mean_gap_s))


def request_lags(run: RunResult) -> list[tuple[float, float]]:
    """(scheduled, lag) in seconds, the schedule relative to the run's start, per open-loop request in schedule order."""
    sends = [
        (r.scheduled_time - run.start_time, max(0.0, r.sent_time - r.send_ready_time))
        for r in run.records
        if r.scheduled_time is not None and r.send_ready_time is not None and r.sent_time is not None
    ]
    return sorted(sends)


def send_lag(run: RunResult) -> SendLag | None:
    """The run's sends against its schedule; None when it recorded none (a closed loop, a peer, an older run)."""
    sends = request_lags(run)
    if not sends:
        return None
    scheduled = [s for s, _ in sends]
    lags = [lag for _, lag in sends]
    num = len(sends)
    span = scheduled[-1] - scheduled[0]
    target = achieved = None
    if num > 1 and span > 0:
        offered = sorted(s + lag for s, lag in sends)
        target = (num - 1) / span
        offered_span = offered[-1] - offered[0]
        achieved = (num - 1) / offered_span if offered_span > 0 else target
    bound = lag_bound_s(span / (num - 1) if num > 1 else 0.0)
    return SendLag(
        num_requests=num,
        p50_lag_ms=1e3 * percentile(lags, 50),
        p90_lag_ms=1e3 * percentile(lags, 90),
        max_lag_ms=1e3 * max(lags),
        lag_bound_ms=1e3 * bound,
        target_rate=target,
        achieved_rate=achieved,
    )


def worst_send_lag(runs: Sequence[RunResult]) -> SendLag | None:
    """The repeat whose sends kept the schedule worst (client-bound first, then by p90 lag)."""
    checks = [check for check in map(send_lag, runs) if check is not None]
    return max(checks, key=lambda c: (c.is_client_bound, c.p90_lag_ms), default=None)


def client_bound_reason(runs: Sequence[RunResult]) -> str | None:
    """Why these repeats' latencies cannot support a verdict, naming the lag and the fix; None when sends kept up."""
    checks = [check for check in map(send_lag, runs) if check is not None]
    bound = [check for check in checks if check.is_client_bound]
    if not bound:
        return None
    worst = max(bound, key=lambda c: c.p90_lag_ms)
    return (
        f"client-bound: the load generator fell behind its schedule in {len(bound)} of {len(runs)} repeats "
        f"(worst: {worst.describe()}); the latencies count that lag as the engine's, so they judge nothing. "
        f"Fix: {CLIENT_BOUND_FIX}"
    )


def shards_client_bound_reason(runs_by_shard: Sequence[tuple[str, Sequence[RunResult]]]) -> str | None:
    """``client_bound_reason`` per load-generator shard (``--perf-client-shards``), naming each shard that fell behind.

    ``runs_by_shard``: each shard's name (its number and node) and its own runs,
    one per repeat. Each shard is checked against its own share of the schedule:
    a shard that falls behind is hidden in the merged run when the others
    keep up, since its requests are only some of the merged lags.
    """
    behind = []
    for name, runs in runs_by_shard:
        bound = [check for check in map(send_lag, runs) if check is not None and check.is_client_bound]
        if bound:
            worst = max(bound, key=lambda c: c.p90_lag_ms)
            behind.append(f"{name} in {len(bound)} of {len(runs)} repeats (worst: {worst.describe()})")
    if not behind:
        return None
    return (
        f"client-bound: {len(behind)} of {len(runs_by_shard)} load-generator shards fell behind their schedule: "
        f"{'; '.join(behind)}; the latencies count that lag as the server's, so they judge nothing. "
        f"Fix: {CLIENT_BOUND_FIX}"
    )
