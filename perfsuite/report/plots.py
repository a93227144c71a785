"""The report's figures: matplotlib figures returned as inline SVG strings.

Pure drawing: every function takes plain typed values and returns an ``<svg>``
element with no XML prolog, no doctype and no metadata, so the only URIs
left in it are the SVG and XLink namespace names, which browsers never fetch.
matplotlib is imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.artist import Artist

from perfsuite.engine.names import INFLIGHT, PAGED, PAGED_PREFIX, STATIC

# Namespace names, not addresses: the report's "no external URL" rule allows exactly these.
SVG_NAMESPACE_URIS = ("http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink")

ENGINE_COLOURS = {STATIC: "#d95f02", INFLIGHT: "#1b9e77", PAGED: "#7570b3", PAGED_PREFIX: "#e7298a"}
LINE_STYLES = ("-", "--", ":", "-.")
DISTRIBUTIONS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency"))
# Drawn over a distribution where the test split it: TTFT of the requests that hit the prefix cache and missed it
# (the sample keys are measure.prefix_cache's, which the report reads only through results.json).
CACHE_SPLITS = {
    "ttft_ms": (("ttft_ms_hit", "prefix cache hit", "#2ca02c"), ("ttft_ms_miss", "prefix cache miss", "#d62728"))
}
PADDING_COLOUR = "#b0b0b0"
EMPTY_COLOUR = "#ececec"
KV_COLOUR = "#66a61e"
PREEMPTION_COLOUR = "#e41a1c"
STEP_COLOURS = {True: "#d62728", False: "#1b9e77"}  # a change point: is it a regression?


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a line plot."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    colour: str | None = None
    style: str = "-"


@dataclass(frozen=True, slots=True)
class Step:
    """A change point on a trend: between run ``x - 0.5`` and run ``x + 0.5``."""

    x: float
    label: str  # e.g. "-9.8%"
    is_regression: bool


@dataclass(frozen=True, slots=True)
class SlopeBand:
    """A trend over the newest runs: its fitted line and the band its slope's confidence interval spans."""

    x: tuple[float, ...]
    fitted: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    label: str  # e.g. "-0.62%/run"
    is_regression: bool


@dataclass(frozen=True, slots=True)
class Trend:
    """One panel of the history figure: a series over runs, its change points, and whether its last run is this one."""

    line: Series
    steps: tuple[Step, ...] = ()
    last_is_this_run: bool = True
    slope: SlopeBand | None = None


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of time one batch slot spends on one thing."""

    slot: int
    start: float
    end: float
    kind: str  # "prefill", "decode", "padding" or "empty"
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Timeline:
    """One run as lanes (slots) over time, with its queue, KV cache, preemptions and finished requests."""

    title: str
    duration: float
    num_slots: int
    spans: tuple[Span, ...]
    queue: tuple[tuple[float, int], ...]  # (step start, requests waiting)
    first_tokens: tuple[tuple[float, float], ...]  # (time, TTFT), both in seconds
    finishes: tuple[tuple[float, float], ...]  # (time, E2E latency), both in seconds
    request_order: tuple[str, ...]  # arrival order, for stable colours
    kv_blocks: tuple[tuple[float, int], ...] = ()  # (step start, KV blocks held once it ran); none: not recorded
    kv_pool: int | None = None  # blocks in the pool
    preemptions: tuple[tuple[float, int], ...] = ()  # (step start, requests preempted to make room for it)

    @property
    def has_kv(self) -> bool:
        return self.kv_pool is not None and bool(self.kv_blocks)


@dataclass(frozen=True, slots=True)
class PairRatios:
    """One metric of an A/B test: B's repeat over A's, pair by pair."""

    metric: str
    ratios: tuple[float, ...]  # B / A, in pair order
    orders: tuple[str, ...]  # "AB" or "BA": which side ran first in each pair


def throughput_figure(series: Sequence[Series], title: str) -> str:
    """Output throughput against concurrency, one line per engine and length distribution."""
    figure = _figure(7.5, 3.6)
    axes = figure.add_subplot()
    for line in series:
        axes.plot(line.x, line.y, line.style, marker="o", color=line.colour, label=line.label)
    concurrencies = sorted({x for line in series for x in line.x})
    axes.set_xscale("log", base=2)
    axes.set_xticks(concurrencies, [f"{c:g}" for c in concurrencies])
    axes.minorticks_off()
    axes.set_xlabel("concurrency (batch slots)")
    axes.set_ylabel("output tokens / s")
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return figure_to_svg(figure)


def distribution_figure(
    current: Mapping[str, Sequence[float]],
    baseline: Mapping[str, Sequence[float]],
    current_label: str = "current",
    baseline_label: str = "baseline",
) -> str:
    """Empirical CDFs of TTFT, TPOT and E2E, the baseline's (or side A's) drawn dashed under the current run's;
    where the run split TTFT by prefix cache hit and miss, those two thin over its TTFT."""
    # Fixed margins: this figure is drawn once per test, and constrained layout would double its cost.
    figure = _figure(10, 2.6, layout=None)
    figure.subplots_adjust(left=0.07, right=0.99, bottom=0.18, top=0.9, wspace=0.22)
    for index, (key, name) in enumerate(DISTRIBUTIONS):
        axes = figure.add_subplot(1, len(DISTRIBUTIONS), index + 1)
        if baseline.get(key):
            axes.ecdf(baseline[key], color="#7f7f7f", linestyle="--", label=baseline_label)
        if current.get(key):
            axes.ecdf(current[key], color="#1f77b4", label=current_label)
        for split_key, label, colour in CACHE_SPLITS.get(key, ()):
            if current.get(split_key):
                axes.ecdf(current[split_key], color=colour, linewidth=1, label=f"{current_label}, {label}")
        if not current.get(key) and not baseline.get(key):
            axes.text(0.5, 0.5, "no samples", ha="center", va="center", transform=axes.transAxes)
        axes.set_title(name, fontsize=10)
        axes.set_xlabel("ms")
        axes.grid(alpha=0.3)
        if index == 0:
            axes.set_ylabel("fraction of requests")
            if axes.get_legend_handles_labels()[0]:  # a test without request samples draws no line to name
                axes.legend(fontsize=8, loc="lower right")
    return figure_to_svg(figure)


def history_figure(trends: Sequence[Trend], y_label: str = "median output tokens / s") -> str:
    """Small multiples: one series per panel, a point per stored run; a dashed line at each change point."""
    columns = min(3, len(trends))
    rows = -(-len(trends) // columns)
    figure = _figure(3.6 * columns, 2.0 * rows)
    for index, trend in enumerate(trends):
        line = trend.line
        axes = figure.add_subplot(rows, columns, index + 1)
        axes.plot(line.x, line.y, "-o", markersize=3, color=line.colour or "#1f77b4")
        if trend.last_is_this_run:
            axes.plot(line.x[-1:], line.y[-1:], "o", color="#d62728", markersize=5)
        for number, step in enumerate(trend.steps):
            colour = STEP_COLOURS[step.is_regression]
            axes.axvline(step.x, color=colour, linestyle="--", linewidth=1, gid=f"change-point-{index}-{number}")
            axes.annotate(
                step.label,
                (step.x, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                color=colour,
                ha="left",
                va="top",
                xytext=(2, -2),
                textcoords="offset points",
            )
        if trend.slope is not None:
            _draw_slope(axes, trend.slope, index)
        axes.set_title(line.label, fontsize=8)
        axes.set_xticks(line.x)
        axes.tick_params(labelsize=7)
        axes.grid(alpha=0.3)
    figure.supxlabel("run (oldest first; red: this run; dashed: change points; band: a trend)", fontsize=8)
    figure.supylabel(y_label, fontsize=8)
    return figure_to_svg(figure)


def _draw_slope(axes, slope: SlopeBand, index: int) -> None:
    """The trend's fitted line, its confidence band, and its slope per run as a label at the newest run."""
    colour = STEP_COLOURS[slope.is_regression]
    axes.fill_between(slope.x, slope.low, slope.high, color=colour, alpha=0.15, linewidth=0, gid=f"trend-band-{index}")
    axes.plot(slope.x, slope.fitted, color=colour, linewidth=1.2, gid=f"trend-line-{index}")
    axes.annotate(slope.label, (slope.x[-1], slope.fitted[-1]), fontsize=6, color=colour, ha="right", va="bottom")


def pair_ratio_figure(pairs: Sequence[PairRatios], min_effect: float) -> str:
    """Small multiples, one per metric: each pair's ratio B/A as a dot, a line at 1 and the min-effect band."""
    # One row with fixed margins: drawn once per A/B test, where constrained layout would double its cost.
    figure = _figure(2.5 * len(pairs), 2.2, layout=None)
    figure.subplots_adjust(left=0.35 / len(pairs), right=0.99, bottom=0.2, top=0.88, wspace=0.3)
    for index, pair in enumerate(pairs):
        axes = figure.add_subplot(1, len(pairs), index + 1)
        _draw_pair_ratios(axes, pair, min_effect)
        if index == 0:
            axes.set_ylabel("B / A", fontsize=8)
            axes.legend(fontsize=6, loc="best")
    return figure_to_svg(figure)


def _draw_pair_ratios(axes: Any, pair: PairRatios, min_effect: float) -> None:
    axes.axhspan(1 - min_effect, 1 + min_effect, color="#e8eef7", label=f"within min effect ±{min_effect:.0%}")
    axes.axhline(1.0, color="#7f7f7f", linewidth=0.8)
    for order, marker, colour in (("AB", "o", "#1f77b4"), ("BA", "s", "#d95f02")):
        points = [(i + 1, r) for i, (r, o) in enumerate(zip(pair.ratios, pair.orders)) if o == order]
        if points:
            x, y = zip(*points)
            axes.plot(
                x,
                y,
                marker,
                markersize=4,
                color=colour,
                label=f"{order[0]} ran first",
                gid=f"pair-ratios-{pair.metric}-{order}",
            )
    axes.set_xticks(range(1, len(pair.ratios) + 1))
    axes.set_xlabel("pair", fontsize=8)
    axes.set_title(pair.metric, fontsize=9)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)


def timeline_figure(timelines: Sequence[Timeline], stacked: bool = False) -> str:
    """Slots as lanes over time, queue depth, KV use and latency marks, runs side by side (or stacked) on one axis.

    The KV lane (blocks held against the pool) is drawn under the queue when
    any run recorded its KV cache; each step that preempted requests gets a
    marker there and a line across the slot lanes.
    """
    shared = _SharedAxes.of(timelines)
    lane_height = max(1.6, 0.32 * shared.max_slots)
    heights = [lane_height, 1.2, 1.2, 1.2] if shared.with_kv else [lane_height, 1.2, 1.2]
    per_run = len(heights)
    columns, rows = (1, len(timelines)) if stacked else (len(timelines), 1)
    figure = _figure(9 if stacked else 7 * columns, (sum(heights) + 0.8) * rows)
    grid = figure.add_gridspec(per_run * rows, columns, height_ratios=heights * rows, hspace=0.12)
    for index, timeline in enumerate(timelines):
        row, column = (index, 0) if stacked else (0, index)
        cells = [grid[per_run * row + i, column] for i in range(per_run)]
        _draw_run(figure, cells, timeline, shared)
    legend = _timeline_legend(shared.with_kv)
    figure.legend(handles=legend, loc="outside upper center", ncol=len(legend), fontsize=8, frameon=False)
    return figure_to_svg(figure)


@dataclass(frozen=True, slots=True)
class _SharedAxes:
    """What every run of one timeline figure shares, so runs read against each other: the time axis and ranges."""

    seconds: float
    scale: float  # seconds to the axis' unit
    unit: str
    max_slots: int
    max_waiting: int
    max_blocks: int
    with_kv: bool

    @classmethod
    def of(cls, timelines: Sequence[Timeline]) -> _SharedAxes:
        seconds = max(t.duration for t in timelines) or 1.0
        scale, unit = (1e3, "ms") if seconds < 2 else (1.0, "s")
        return cls(
            seconds,
            scale,
            unit,
            max_slots=max(t.num_slots for t in timelines),
            max_waiting=max((w for t in timelines for _, w in t.queue), default=0),
            max_blocks=max((t.kv_pool or 0 for t in timelines if t.has_kv), default=0),
            with_kv=any(t.has_kv for t in timelines),
        )


def _draw_run(figure: Any, cells: Sequence[Any], timeline: Timeline, shared: _SharedAxes) -> None:
    """One run's lanes, queue, KV use (when the figure has a KV row) and latency marks, in its grid ``cells``."""
    scale = shared.scale
    lanes = figure.add_subplot(cells[0])
    queue = figure.add_subplot(cells[1], sharex=lanes)
    kv = figure.add_subplot(cells[2], sharex=lanes) if shared.with_kv else None
    marks = figure.add_subplot(cells[-1], sharex=lanes)
    _draw_lanes(lanes, timeline, scale)
    lanes.set_xlim(0, shared.seconds * scale)
    lanes.set_ylim(shared.max_slots - 0.5, -0.5)
    lanes.set_title(timeline.title, fontsize=10)
    _draw_queue(queue, timeline, scale, shared.max_waiting)
    if kv is not None:
        _draw_kv(kv, timeline, scale, shared.max_blocks)
        _draw_preemptions(lanes, kv, timeline, scale)
    _draw_latency_marks(marks, timeline, scale)
    marks.set_xlabel(f"time since the run started ({shared.unit})")
    for axes in (lanes, queue, kv):
        if axes is not None:
            axes.tick_params(labelbottom=False)


def _timeline_legend(with_kv: bool) -> list[Artist]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    legend: list[Artist] = [
        Patch(facecolor="#8da0cb", hatch="////", edgecolor="#333333", label="prefill"),
        Patch(facecolor="#8da0cb", label="decode (colour = request)"),
        Patch(facecolor=PADDING_COLOUR, hatch="xx", edgecolor="#777777", label="padding row (static batch)"),
        Patch(facecolor=EMPTY_COLOUR, edgecolor="#cccccc", label="empty slot"),
    ]
    if with_kv:
        legend.append(Line2D([], [], color=PREEMPTION_COLOUR, marker="v", linestyle=":", label="preemption"))
    return legend


def _draw_kv(axes: Any, timeline: Timeline, scale: float, max_blocks: int) -> None:
    """Blocks held after each step, against the pool (dashed)."""
    if timeline.has_kv:
        times = [t * scale for t, _ in timeline.kv_blocks] + [timeline.duration * scale]
        blocks = [b for _, b in timeline.kv_blocks] + [timeline.kv_blocks[-1][1]]
        axes.step(times, blocks, where="post", color=KV_COLOUR, gid="kv-blocks")
        axes.fill_between(times, blocks, step="post", color=KV_COLOUR, alpha=0.25)
        axes.axhline(timeline.kv_pool, color="#555555", linestyle="--", linewidth=0.8, gid="kv-pool")
    else:
        axes.text(0.5, 0.5, "KV cache not recorded", ha="center", va="center", fontsize=7, transform=axes.transAxes)
    axes.set_ylim(0, max(1, max_blocks) * 1.15)
    axes.set_ylabel("KV blocks", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)


def _draw_preemptions(lanes: Any, kv: Any, timeline: Timeline, scale: float) -> None:
    """A marker on the KV lane at each preempting step (with its count when over one), a line across the slots."""
    if not timeline.preemptions:
        return
    top = kv.get_ylim()[1]
    for time, count in timeline.preemptions:
        lanes.axvline(time * scale, color=PREEMPTION_COLOUR, linestyle=":", linewidth=0.8)
        if count > 1:
            kv.annotate(
                str(count), (time * scale, 0.97 * top), fontsize=6, color=PREEMPTION_COLOUR, ha="center", va="bottom"
            )
    times = [time * scale for time, _ in timeline.preemptions]
    kv.plot(
        times,
        [0.92 * top] * len(times),
        "v",
        color=PREEMPTION_COLOUR,
        markersize=5,
        linestyle="none",
        gid="preemptions",
    )


def _draw_lanes(axes: Any, timeline: Timeline, scale: float) -> None:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    colour_of: dict[str | None, Any] = {rid: palette(i % 20) for i, rid in enumerate(timeline.request_order)}
    label_width = 0.06 * timeline.duration
    for span in timeline.spans:
        extent = [(span.start * scale, (span.end - span.start) * scale)]
        lane = (span.slot - 0.4, 0.8)
        if span.kind == "empty":
            axes.broken_barh(extent, lane, facecolors=EMPTY_COLOUR, edgecolor="none")
        elif span.kind == "padding":
            axes.broken_barh(extent, lane, facecolors=PADDING_COLOUR, hatch="xx", edgecolor="#777777", linewidth=0)
        else:
            colour = colour_of.get(span.request_id, "#8da0cb")
            hatch = "////" if span.kind == "prefill" else None
            axes.broken_barh(extent, lane, facecolors=colour, hatch=hatch, edgecolor="#333333", linewidth=0.3)
            if span.kind == "decode" and span.end - span.start >= label_width and timeline.num_slots <= 16:
                middle = (span.start + span.end) / 2 * scale
                axes.text(middle, span.slot, span.request_id, ha="center", va="center", fontsize=7)
    axes.set_yticks(range(timeline.num_slots), [f"slot {s}" for s in range(timeline.num_slots)])
    axes.tick_params(axis="y", labelsize=7)


def _draw_queue(axes: Any, timeline: Timeline, scale: float, max_waiting: int) -> None:
    if timeline.queue:
        times = [t * scale for t, _ in timeline.queue] + [timeline.duration * scale]
        waiting = [w for _, w in timeline.queue] + [timeline.queue[-1][1]]
        axes.step(times, waiting, where="post", color="#7570b3")
        axes.fill_between(times, waiting, step="post", color="#7570b3", alpha=0.25)
    axes.set_ylim(0, max(1, max_waiting) * 1.15)
    axes.set_ylabel("queue", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)


def _draw_latency_marks(axes: Any, timeline: Timeline, scale: float) -> None:
    if timeline.first_tokens:
        x, y = zip(*timeline.first_tokens)
        axes.scatter([t * scale for t in x], [v * 1e3 for v in y], marker="^", s=14, color="#e7298a", label="TTFT")
    if timeline.finishes:
        x, y = zip(*timeline.finishes)
        axes.scatter([t * scale for t in x], [v * 1e3 for v in y], marker="o", s=14, color="#1f78b4", label="E2E")
    axes.set_ylabel("latency ms", fontsize=8)
    axes.set_ylim(bottom=0)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left")


def _figure(width: float, height: float, layout: Literal["constrained"] | None = "constrained") -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout=layout)


def figure_to_svg(figure: Any) -> str:
    """The figure as an inline ``<svg>`` element; text stays text so the report is searchable."""
    import matplotlib

    buffer = io.StringIO()
    no_metadata = {"Date": None, "Creator": None, "Format": None, "Type": None}
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", metadata=no_metadata)
    return inline_svg(buffer.getvalue())


def inline_svg(document: str) -> str:
    """Strip what only a standalone SVG file needs (the doctype names a DTD by URL)."""
    start = document.find("<svg")
    if start < 0:
        raise ValueError("not an SVG document: no <svg> element")
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", document[start:], flags=re.S)
    leftover = set(re.findall(r"https?://[^\s\"'<>)]+", svg)) - set(SVG_NAMESPACE_URIS)
    if leftover:
        raise ValueError(f"the SVG refers to external addresses {sorted(leftover)}")
    return svg.strip()


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    """One step kind of one test: its FLOPs per byte moved and its achieved FLOP/s."""

    engine: str
    kind: str  # "prefill" or "decode"
    intensity: float
    flops_per_second: float


ROOFLINE_MARKERS = {"prefill": "s", "decode": "o"}


def roofline_figure(points: Sequence[RooflinePoint], peak_flops: float, peak_bytes: float, title: str) -> str:
    """Achieved FLOP/s against arithmetic intensity, log-log, under the two roofs: bandwidth x intensity, and the
    peak FLOP/s; the ridge where they meet splits memory-bound (left) from compute-bound (right)."""
    figure = _figure(7.5, 4.2)
    axes = figure.add_subplot()
    intensities = [p.intensity for p in points] + [peak_flops / peak_bytes]
    low, high = min(intensities) / 4, max(intensities) * 4
    ridge = peak_flops / peak_bytes
    axes.plot(
        [low, ridge, high],
        [peak_bytes * low, peak_flops, peak_flops],
        "-",
        color="#444444",
        label=f"roofs: {peak_bytes / 1e9:.3g} GB/s, {peak_flops / 1e9:.3g} GFLOP/s",
    )
    seen: set[tuple[str, str]] = set()
    for point in points:
        key = (point.engine, point.kind)
        axes.plot(
            [point.intensity],
            [point.flops_per_second],
            ROOFLINE_MARKERS.get(point.kind, "^"),
            color=ENGINE_COLOURS.get(point.engine),
            label=None if key in seen else f"{point.engine} {point.kind}",
        )
        seen.add(key)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("arithmetic intensity (FLOPs / byte moved)")
    axes.set_ylabel("achieved FLOP/s")
    axes.set_title(title)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    return figure_to_svg(figure)
