"""The report's view of an open-loop test's load generator: how late it sent requests against its schedule.

Facts for every test that recorded its sends (``TestResult.send_lag``: the
repeat that kept the schedule worst), and, for a test with a rate to keep
(Poisson arrivals), a small figure of each request's lag in the last repeat
against its scheduled time, with the bound above which the run is
client-bound (``perfsuite.measure.send_lag`` says why it is where it is).
"""

from __future__ import annotations

from perfsuite.judge.results import RunTimeline, TestResult
from perfsuite.report import plots

KEPT_UP_COLOUR = "#1b9e77"
LATE_COLOUR = "#d62728"


def send_lag_facts(test: TestResult) -> list[tuple[str, str]]:
    """Rows for the test's facts; none for a closed loop or a file that did not record its sends."""
    lag = test.measurement.send_lag
    if lag is None:
        return []
    facts = [
        (
            "send lag p50 / p90 / max",
            f"{lag.p50_lag_ms:.2g} / {lag.p90_lag_ms:.2g} / {lag.max_lag_ms:.2g} ms "
            f"(client-bound above {lag.lag_bound_ms:.3g} ms at p90; worst repeat)",
        )
    ]
    if lag.target_rate is not None and lag.achieved_rate is not None:
        facts.append(("offered rate", f"{lag.achieved_rate:.3g} of the {lag.target_rate:.3g} req/s scheduled"))
    verdict = "client-bound: its latencies judge nothing" if lag.is_client_bound else "kept its schedule"
    return [*facts, ("load generator", verdict)]


def send_lag_svg(test: TestResult) -> str | None:
    """Each request's send lag in the last repeat against its scheduled time; None without a rate to keep."""
    lag, timeline = test.measurement.send_lag, test.measurement.timeline
    if lag is None or lag.target_rate is None or timeline is None:
        return None
    points = _lags_ms(timeline)
    if not points:
        return None
    return _lag_figure(points, lag.lag_bound_ms, lag.is_client_bound)


def _lags_ms(timeline: RunTimeline) -> list[tuple[float, float]]:
    """(scheduled s, lag ms) of each request that recorded its send; an open-loop arrival is its schedule."""
    return sorted((r.arrival, 1e3 * r.send_lag) for r in timeline.requests if r.send_lag is not None)


def _lag_figure(points: list[tuple[float, float]], bound_ms: float, client_bound: bool) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 2.2), layout="constrained")
    axes = figure.add_subplot()
    colour = LATE_COLOUR if client_bound else KEPT_UP_COLOUR
    axes.plot([x for x, _ in points], [y for _, y in points], "o", markersize=3, color=colour, label="request")
    axes.axhline(bound_ms, color="#7f7f7f", linestyle="--", label=f"p90 bound {bound_ms:.3g} ms")
    axes.set_xlabel("scheduled send (s since the run started)")
    axes.set_ylabel("send lag (ms)")
    axes.set_ylim(bottom=0, top=max(2 * bound_ms, 1.1 * max(y for _, y in points)))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left")
    return plots.figure_to_svg(figure)
