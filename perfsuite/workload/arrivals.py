"""Arrival processes: when each request reaches the engine."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from perfsuite.workload.checks import check_int, check_positive, is_number, reject_unknown_keys


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When requests arrive.

    - offline (the default): all at t0;
    - ``rate`` req/s: gaps drawn from a gamma distribution with shape
      ``burstiness`` and mean ``1/rate``, as vLLM's ``--request-rate`` and
      ``--burstiness``: 1 is a Poisson process, below 1 burstier, above 1 smoother;
    - ``concurrency=N``: a closed loop; all requests are there at t0 and the run
      keeps at most N in flight (pass ``max_concurrency`` to ``Engine.run``).
    """

    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.rate is not None:
            check_positive(self.rate, "arrivals.rate")
        check_positive(self.burstiness, "arrivals.burstiness")
        if self.concurrency is not None:
            check_int(self.concurrency, "arrivals.concurrency")
        if self.rate is not None and self.concurrency is not None:
            raise ValueError(
                "arrivals.rate and arrivals.concurrency are mutually exclusive: a rate sends requests open-loop, "
                "a concurrency keeps N in flight; set one of them"
            )
        if self.burstiness != 1 and self.rate is None:
            raise ValueError(
                f"arrivals.burstiness={self.burstiness} needs arrivals.rate; it shapes the gaps between arrivals"
            )

    @property
    def is_offline(self) -> bool:
        return self.rate is None and self.concurrency is None

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        if self.rate is None:
            return "offline"
        if self.burstiness == 1:
            return f"{self.rate:g}rps"
        return f"{self.rate:g}rps_burst{self.burstiness:g}"

    def times(self, rng: random.Random, count: int) -> list[float]:
        rate = self.rate
        if rate is None:
            return [0.0] * count
        now, times = 0.0, []
        for _ in range(count):
            times.append(now)
            now += self._gap(rng, rate)
        return times

    def _gap(self, rng: random.Random, rate: float) -> float:
        if self.burstiness == 1:
            # expovariate, not gammavariate(1, ...): the same draws as before burstiness
            # existed, so stored baselines keep their arrival times.
            return rng.expovariate(rate)
        return rng.gammavariate(self.burstiness, 1 / (rate * self.burstiness))


def parse_arrivals(value: object) -> Arrivals:
    """``"offline"``; ``4.0`` (Poisson, req/s); a table: ``{rate = 4.0, burstiness = 0.5}``, ``{concurrency = 4}``."""
    if value == "offline":
        return Arrivals()
    if is_number(value):
        return Arrivals(rate=float(value))
    if not isinstance(value, Mapping):
        raise ValueError(
            'arrivals must be "offline", a rate in requests/s, or a table of rate, burstiness, concurrency; '
            f"got {value!r}"
        )
    reject_unknown_keys(value, ("burstiness", "concurrency", "rate"), "arrivals key")
    return Arrivals(**value)
