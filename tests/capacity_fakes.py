"""A fake engine whose latency grows with load in a known way, in virtual time: no model, no sleeping.

``LoadLatencyEngine`` serves a run's requests instantly and stamps them as
an engine with these rules would have: at an offered rate lambda (the run's
arrivals per second) below ``service_rate`` mu, no request waits and each
request's TTFT is ``base_ttft / (1 - lambda / mu)`` (the M/M/1 shape:
latency grows without bound as the load nears saturation), its tokens
``tpot`` apart; every ``OUTLIER_EVERY``-th request takes ``OUTLIER_FACTOR``
times as long, so the goodput target (90%) matters. At lambda >= mu the
queue grows: request i waits i * (1/mu - 1/lambda).

So under a TTFT SLO the capacity is known: the highest lambda with
``base_ttft / (1 - lambda / mu) <= slo``, that is ``mu * (1 - base_ttft / slo)``
(the outliers are fewer than 10%), and never above mu. Its arrivals are the
requests' own, so ``known_capacity`` converts it to the nominal rate of a
seeded Poisson workload (whose offsets scale as 1 / rate).
"""

from __future__ import annotations

from collections.abc import Sequence

from perfsuite.engine.types import EngineCounters, FinishReason, Request, RequestRecord, RunResult

OUTLIER_EVERY = 20
OUTLIER_FACTOR = 10.0
T0 = 1000.0


def offered_rate(requests: Sequence[Request]) -> float:
    """Arrivals per second over the run: (n - 1) gaps over the span from first to last arrival."""
    times = sorted(r.arrival_time for r in requests)
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else float("inf")


def known_capacity(service_rate: float, base_ttft: float, slo_ttft: float, requests_at_one: Sequence[Request]) -> float:
    """The capacity under a TTFT SLO, as a nominal Poisson rate of the workload whose 1-req/s requests are given."""
    offered = min(service_rate * (1 - base_ttft / slo_ttft), service_rate)
    return offered / offered_rate(requests_at_one)


class LoadLatencyEngine:
    name = "load-latency"
    greedy_equal = False
    runs_in_process = True

    def __init__(self, service_rate: float, base_ttft: float = 0.010, tpot: float = 0.002, batch_size: int = 4) -> None:
        self.service_rate = service_rate
        self.base_ttft = base_ttft
        self.tpot = tpot
        self.batch_size = batch_size

    def run(self, requests, on_step=None, max_concurrency=None) -> RunResult:
        ordered = sorted(requests, key=lambda r: r.arrival_time)
        rate = 0.0 if max_concurrency is not None else offered_rate(ordered)
        load = rate / self.service_rate
        records, end = [], T0
        for index, request in enumerate(ordered):
            arrival = T0 + (0.0 if max_concurrency is not None else request.arrival_time)
            if max_concurrency is not None:  # one at a time, unloaded
                arrival = max(arrival, end)
            wait = index * (1 / self.service_rate - 1 / rate) if load >= 1 else 0.0
            stretch = OUTLIER_FACTOR if index % OUTLIER_EVERY == OUTLIER_EVERY - 1 else 1.0
            ttft = self.base_ttft * stretch / (1 - min(load, 0.999))
            first = arrival + wait + ttft
            n = request.sampling_params.max_new_tokens
            times = tuple(first + k * self.tpot for k in range(n))
            records.append(
                RequestRecord(
                    request_id=request.request_id,
                    num_prompt_tokens=request.num_prompt_tokens,
                    output_token_ids=tuple(7 for _ in range(n)),
                    arrival_time=arrival,
                    first_scheduled_time=arrival + wait,
                    token_times=times,
                    finished_time=times[-1],
                    finish_reason=FinishReason.LENGTH,
                )
            )
            end = max(end, times[-1])
        return RunResult(self.name, tuple(records), T0, end, EngineCounters())


class ConcurrencyLatencyEngine(LoadLatencyEngine):
    """``LoadLatencyEngine`` in an open loop; in a closed loop of c, latency grows with c in a known way.

    With c requests in flight (at most the run's), each request's TTFT is
    ``base_ttft + ttft_per_request * (c - 1)`` (every other request in flight
    delays its first token by a fixed amount), every ``OUTLIER_EVERY``-th
    again ``OUTLIER_FACTOR`` times as long; a request is sent when one of the
    c slots frees, and that is its arrival. So under a TTFT SLO the highest
    passing concurrency is known (``known_concurrency``), and at c = 1 it is
    ``LoadLatencyEngine``'s one request at a time.
    """

    name = "concurrency-latency"

    def __init__(self, service_rate: float, base_ttft: float = 0.010, tpot: float = 0.002, batch_size: int = 4,
                 ttft_per_request: float = 0.005) -> None:  # fmt: skip
        super().__init__(service_rate, base_ttft, tpot, batch_size)
        self.ttft_per_request = ttft_per_request

    def ttft_at(self, concurrency: int) -> float:
        return self.base_ttft + self.ttft_per_request * (concurrency - 1)

    def known_concurrency(self, slo_ttft: float, ceiling: int) -> int:
        """The highest concurrency (at most ``ceiling``) whose TTFT meets the SLO; 0 when even 1 misses it."""
        return max((c for c in range(1, ceiling + 1) if self.ttft_at(c) <= slo_ttft), default=0)

    def run(self, requests, on_step=None, max_concurrency=None) -> RunResult:
        if max_concurrency is None:
            return super().run(requests, on_step)
        ordered = sorted(requests, key=lambda r: r.arrival_time)
        concurrency = min(max_concurrency, len(ordered))
        slots_free_at = [T0] * concurrency
        records = []
        for index, request in enumerate(ordered):
            slot = min(range(concurrency), key=slots_free_at.__getitem__)
            arrival = slots_free_at[slot]
            stretch = OUTLIER_FACTOR if index % OUTLIER_EVERY == OUTLIER_EVERY - 1 else 1.0
            first = arrival + self.ttft_at(concurrency) * stretch
            n = request.sampling_params.max_new_tokens
            times = tuple(first + k * self.tpot for k in range(n))
            records.append(RequestRecord(request.request_id, request.num_prompt_tokens, tuple(7 for _ in range(n)),
                                         arrival, arrival, times, times[-1], FinishReason.LENGTH))  # fmt: skip
            slots_free_at[slot] = times[-1]
        return RunResult(self.name, tuple(records), T0, max(slots_free_at), EngineCounters())
