"""The report's view of a capacity test: what every probe saw against its rate, the SLO, and the capacity found.

One figure per capacity test (``TestResult.capacity``): three panels over the
load searched (log scale): the arrival rate, or for a search by concurrency
the requests in flight; every probe of every search as a point: the share
of good requests with the target share, p50 and p90 TTFT with the TTFT SLO,
p50 and p90 TPOT with the TPOT SLO. A probe whose queue grew or whose client
fell behind (it fails whatever its share) is drawn hollow. Where the
capacity was found (the median over the searches: its rate, or its
concurrency) is a vertical line, the searches' range a band.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from perfsuite.judge.results import CapacityRecord, TestResult
from perfsuite.report import plots

P50_COLOUR = "#1f77b4"
P90_COLOUR = "#d62728"
SHARE_COLOUR = "#1b9e77"
SLO_COLOUR = "#7f7f7f"
CAPACITY_COLOUR = "#222222"

CAPTION = (
    "Capacity under the SLO: every probe of every search against its arrival rate, or its concurrency for a search "
    "by concurrency (hollow: the queue grew or the client fell behind, so it failed whatever its share). Dashed: "
    "the target share and the SLO; the vertical line is where the capacity was found (median over the searches), "
    "the band their range."
)
X_LABELS = {"rate": "arrival rate (req/s)", "concurrency": "concurrency (requests in flight)"}


def capacity_facts(test: TestResult) -> list[tuple[str, str]]:
    """Rows for the test's facts; none for a test that searched no capacity."""
    record = test.capacity
    if record is None:
        return []
    values = [s.requests_per_second for s in record.searches]
    first = record.searches[0]
    capacity = (
        f"{record.requests_per_second:.3g} req/s per instance, {record.requests_per_second_per_device:.3g} per device"
    )
    searches = f"{len(values)}: {', '.join(f'{v:.3g}' for v in values)} req/s"
    rule = f">= {first.target_share:.0%} of requests within the SLO, bracket within {first.tolerance:.0%}"
    if record.concurrency is not None:
        capacity += f", at concurrency {record.concurrency}"
        searches += f" at concurrency {', '.join(str(s.concurrency) for s in record.searches)}"
        rule = f"by concurrency (closed loop): {rule} or adjacent"
    facts = [
        ("capacity under SLO", capacity),
        ("searches", searches),
        ("search rule", rule),
        ("probes", str(sum(len(s.probes) for s in record.searches))),
    ]
    return facts + [("not converged", note) for note in record.notes]


def capacity_svg(test: TestResult) -> str | None:
    """The three panels (module docstring); None for a test that searched no capacity."""
    record = test.capacity
    if record is None or not record.searches:
        return None
    probes = [p for s in record.searches for p in s.probes]
    figure = plots._figure(10, 2.8, layout=None)
    figure.subplots_adjust(left=0.07, right=0.99, bottom=0.2, top=0.88, wspace=0.3)
    share = figure.add_subplot(1, 3, 1)
    _points(share, probes, [p.good_share for p in probes], SHARE_COLOUR, "share good", log=False)
    share.axhline(record.searches[0].target_share, color=SLO_COLOUR, linestyle="--", label="target")
    share.set_ylim(-0.05, 1.05)
    share.set_ylabel("share of requests within SLO")
    panels = (
        (share, None, "goodput share"),
        (figure.add_subplot(1, 3, 2), record.slo_ttft_ms, "TTFT ms"),
        (figure.add_subplot(1, 3, 3), record.slo_tpot_ms, "TPOT ms"),
    )
    for axes, slo, title in panels[1:]:
        key = "ttft" if title.startswith("TTFT") else "tpot"
        for percentile, colour in (("p50", P50_COLOUR), ("p90", P90_COLOUR)):
            _points(axes, probes, [getattr(p, f"{percentile}_{key}_ms") for p in probes], colour, percentile)
        if slo is not None:
            axes.axhline(slo, color=SLO_COLOUR, linestyle="--", label="SLO")
        axes.set_yscale("log")
    for axes, _, title in panels:
        _capacity_marks(axes, record)
        axes.set_xscale("log")
        axes.set_xlabel(X_LABELS[record.by])
        axes.set_title(title, fontsize=10)
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:  # a search with no probe drawn has nothing to name
            axes.legend(fontsize=7)
    return plots.figure_to_svg(figure)


def _points(axes, probes: Sequence, values: Sequence[float], colour: str, label: str, log: bool = True) -> None:
    """Held probes filled, failed ones hollow; on a log axis only positive values can be drawn."""
    shown = [(p, v) for p, v in zip(probes, values) if v is not None and math.isfinite(v) and (v > 0 or not log)]
    steady = [(_load(p), v) for p, v in shown if p.steady and p.client_kept_up]
    failed = [(_load(p), v) for p, v in shown if not (p.steady and p.client_kept_up)]
    if steady:
        axes.scatter(*zip(*steady), s=16, color=colour, label=label)
    if failed:
        axes.scatter(*zip(*failed), s=16, facecolors="none", edgecolors=colour)


def _load(probe) -> float:
    """Where a probe is drawn: its concurrency for a closed-loop probe, else its rate."""
    return probe.rate if probe.concurrency is None else probe.concurrency


def _capacity_marks(axes, record: CapacityRecord) -> None:
    values = [s.found_at for s in record.searches]
    axes.axvline(statistics.median(values), color=CAPACITY_COLOUR, linewidth=1.2)
    if max(values) > min(values):
        axes.axvspan(min(values), max(values), color=CAPACITY_COLOUR, alpha=0.08)
