"""The HTML report: one self-contained file a reviewer can open offline.

``render_report`` turns a session's ``Results`` (``perfsuite.judge.results``,
what results.json holds) into HTML through ``templates/report.html.j2``; the
figures come from ``perfsuite.report.plots`` as inline SVG, so the file makes
no network request; the verdict table's rows and cells are
``perfsuite.report.verdict_table``'s, as the terminal and ``perfsuite compare``
print them. ``write_report`` is what the plugin calls after a session, with the
session's ``Results`` in memory.
An A/B session (``--perf-against REF``) is shown as one: its columns and
legends name side A (REF) and side B (the current tree), never a baseline,
and each test adds its pair ratios and A's timed run stacked above B's.
The report reads the judge's typed results and nothing else of perfsuite: it
never imports pytest, scipy or torch.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.engine.names import OWN_ENGINES
from perfsuite.judge.baselines import write_text_atomic
from perfsuite.judge.results import (
    AgainstDescription,
    Results,
    RunSummary,
    RunTimeline,
    TestResult,
    TimelineStep,
)
from perfsuite.report import capacity as capacity_view
from perfsuite.report import determinism as determinism_view
from perfsuite.report import plots
from perfsuite.report import send_lag as send_lag_view
from perfsuite.report import server_metrics as server_metrics_view
from perfsuite.report.trend import history_section
from perfsuite.report.verdict_table import (
    PAIRED_HEADERS,
    STORED_HEADERS,
    VERDICTS,
    VerdictCells,
    VerdictRow,
    format_figure,
    overall_verdict,
    verdict_table,
)

# the verdict table's checkboxes: a row's category (VerdictRow.category), and its label
VERDICT_FILTERS = (*((v, v) for v in VERDICTS), ("changed", "counter changed"), ("none", "not compared"))
PARAMETER_NAMES = ("model", "precision", "input_length", "output_length", "concurrency", "tensor_parallelism")
MAX_HISTORY_RUNS = 30


@dataclass(frozen=True, slots=True)
class CounterRow:
    name: str
    current: int | None  # None: this run's file predates the counter
    baseline: int | None  # None: no baseline to say, or it did not record this counter
    baseline_recorded: bool = True  # False: what it was compared with predates the counter

    @property
    def change(self) -> int | None:
        return None if self.baseline is None or self.current is None else self.current - self.baseline


@dataclass(frozen=True, slots=True)
class TestSection:
    test_id: str
    engine: str
    verdict: str
    baseline_status: str
    facts: tuple[tuple[str, str], ...]  # sizing parameters and the summary, ready to show
    counters: tuple[CounterRow, ...]
    distributions_svg: str
    pair_ratios: Figure | None = None  # an A/B test: each pair's ratio B/A
    timelines: Figure | None = None  # an A/B test: A's and B's timed runs, stacked
    send_lag: Figure | None = None  # an open-loop test: each request's send lag in the last repeat
    capacity: Figure | None = None  # a capacity test: its probes against the rate, the SLO, the capacity
    splits_ttft_by_cache_hit: bool = False  # its distributions draw TTFT of prefix cache hits and misses

    @property
    def anchor(self) -> str:
        return _anchor(self.test_id)


@dataclass(frozen=True, slots=True)
class Figure:
    caption: str
    svg: str


@dataclass(frozen=True, slots=True)
class Sides:
    """What the report calls the two sides of each comparison, and how it explains the verdict table's columns."""

    headers: VerdictCells  # the verdict table's, as the terminal and ``perfsuite compare`` print them
    median_title: str
    change_title: str
    ci_title: str
    p_title: str
    mde_title: str
    compared_with: str  # a test's status line: what it was compared with
    dashed: str  # the latency CDFs' caption: what the dashed line is

    @property
    def baseline(self) -> str:
        return self.headers.baseline

    @property
    def current(self) -> str:
        return self.headers.current


STORED_SIDES = Sides(
    headers=STORED_HEADERS,
    median_title="median over the repeats",
    change_title="current median over baseline median, minus 1",
    ci_title="bootstrap confidence interval of the ratio of the medians, current over baseline",
    p_title="one-sided Mann-Whitney U, Benjamini-Hochberg-adjusted over the session",
    mde_title=(
        "minimum detectable effect: the smallest slowdown a lone regression of this session could be flagged for, "
        "from the baseline's own spread"
    ),
    compared_with="baseline",
    dashed="dashed: baseline",
)

PAIRED_SIDES = Sides(
    headers=PAIRED_HEADERS,
    median_title="median over the pairs",
    change_title="median over the pairs of the ratio B/A, minus 1: +5% means B's figure is 5% higher in the median",
    ci_title="distribution-free (Walsh averages) confidence interval of the median pair ratio B/A",
    p_title="one-sided exact Wilcoxon signed-rank on the pairs' log ratios, Benjamini-Hochberg-adjusted",
    mde_title=(
        "minimum detectable effect: the smallest slowdown of every pair a lone regression of this session could "
        "be flagged for, from the spread of the pair ratios"
    ),
    compared_with="compared with",
    dashed="dashed: A, the REF side",
)


def render_report(results: Results, history: Sequence[Results] = ()) -> str:
    """The report as one HTML string; ``history`` holds earlier runs' results, in any order."""
    tests = results.tests
    rows = verdict_table(tests, paired=results.against is not None).rows
    return _template().render(
        verdict=overall_verdict(rows),
        created_at=results.created_at or "unknown date",
        warnings=results.warnings,
        environment=_environment_facts(results),
        sizing=_sizing_facts(tests),
        run=_run_facts(results),
        against=_against_summary(results.against) if results.against else None,
        sides=sides_of(results),
        rows=rows,
        determinism=determinism_view.determinism_rows(results.determinism),
        determinism_caption=determinism_view.CAPTION,
        verdicts=VERDICTS,
        verdict_filters=VERDICT_FILTERS,
        throughput_figures=_throughput_figures(tests),
        roofline=_roofline(results),
        timeline=_timeline_figure(tests, results.against),
        history=history_section(results, history, MAX_HISTORY_RUNS),
        sections=[_section(test, rows, results) for test in tests],
    )


def sides_of(results: Results) -> Sides:
    """A/B (``--perf-against``): A is REF, B the current tree, and no stored baseline is involved."""
    return STORED_SIDES if results.against is None else PAIRED_SIDES


def write_report(results: Results, report_dir: Path, history: Sequence[Results] = ()) -> Path:
    """Render ``results`` (the session the plugin just finished) into ``report_dir/report.html``; its path.

    ``history``: the earlier sessions its trends draw, read from the run
    history store (``perfsuite.history.store``); none when the session keeps
    no history (``--perf-history none``).
    """
    path = Path(report_dir) / "report.html"
    write_text_atomic(path, render_report(results, history))
    return path


# -- header ----------------------------------------------------------------


def _environment_facts(results: Results) -> list[tuple[str, str]]:
    environment = results.environment
    labels = (
        ("device_name", "device"),
        ("driver_version", "driver"),
        ("cuda_version", "CUDA"),
        ("torch_version", "torch"),
        ("transformers_version", "transformers"),
        ("cpu_model", "CPU"),
        ("num_threads", "threads"),
        # a server in another process (measure.environment.ServerEnvironment)
        ("label", "server"),
        ("served_model", "served model"),
        ("max_model_len", "max model length"),
        ("owned_by", "served by"),
    )
    values = [(label, getattr(environment, key, None)) for key, label in labels]
    facts = [(label, str(value)) for label, value in values if value is not None]
    facts.append(("fingerprint", results.fingerprint or "-"))
    return facts + _server_facts(results)


def _server_facts(results: Results) -> list[tuple[str, str]]:
    """Servers measured in another process: their own fingerprints, and figures not rescaled by the probe."""
    servers = [s.fingerprint() for s in results.servers]
    if not servers:
        return []
    others = [s for s in servers if s != results.fingerprint]
    facts = [("server fingerprints", ", ".join(others))] if others else []
    return [*facts, ("machine probe", "not applied to servers in another process: their figures are as measured")]


def _run_facts(results: Results) -> list[tuple[str, str]]:
    policy = results.policy
    return [
        ("commit", results.commit or "unknown"),
        ("date", results.created_at or "unknown"),
        ("profile", f"{results.profile}, {results.repeats} repeats"),
        *(_against_facts(results.against) if results.against else []),
        (
            "policy",
            f"{policy.test}; alpha {policy.alpha} after {policy.correction}; min effect {100 * policy.min_effect:.0f}%",
        ),
    ]


def _against_facts(against: AgainstDescription) -> list[tuple[str, str]]:
    return [
        ("mode", _against_summary(against)),
        ("baselines", "none: nothing was compared with stored baselines, and none were read or written"),
        ("order", against.order),
    ]


def _against_summary(against: AgainstDescription) -> str:
    current = f"current tree at {against.current_commit[:12]}" if against.current_commit else "the current tree"
    return f"A/B against REF {_reference_label(against)}, {current}"


def _reference_label(against: AgainstDescription) -> str:
    return f"{against.ref} ({against.commit[:12]})" if against.commit else against.ref


def _sizing_facts(tests: Sequence[TestResult]) -> list[tuple[str, str]]:
    """Each sizing parameter once: its value when every test shares it, else its distinct values."""
    facts = []
    for name in PARAMETER_NAMES:
        values = sorted({_format_value(getattr(t.measurement.parameters, name)) for t in tests}, key=_natural_key)
        facts.append((name.replace("_", " "), ", ".join(values) if values else "-"))
    return facts


# -- figures across tests ----------------------------------------------------


# measure.utilization's sample keys (prefill_mfu, decode_gbps...), which the report reads only through results.json.
UTILIZATION_SUFFIXES = ("_mfu", "_mbu", "_tflops", "_gbps")


def _roofline(results: Results) -> dict[str, Any] | None:
    """The roofline figure and each test's MFU, MBU and rates (medians over repeats); None: nothing measured them."""
    rows, points = [], []
    for test in results.tests:
        medians = {
            key: statistics.median(values)
            for key, values in test.measurement.samples.items()
            if key.endswith(UTILIZATION_SUFFIXES) and values
        }
        if not medians:
            continue
        engine = test.measurement.engine_name
        rows.append({"test_id": test.test_id, "engine": engine, **medians})
        for kind in ("prefill", "decode"):
            tflops, gbps = medians.get(f"{kind}_tflops"), medians.get(f"{kind}_gbps")
            if tflops and gbps:
                points.append(plots.RooflinePoint(engine, kind, 1e3 * tflops / gbps, 1e12 * tflops))
    if not rows:
        return None
    peaks, svg = results.peaks, None
    if peaks is not None and points:
        title = f"{peaks.device}, {peaks.dtype}: each test's prefill and decode under this machine's measured roofs"
        svg = plots.roofline_figure(points, peaks.flops_per_second, peaks.bytes_per_second, title)
    return {"rows": rows, "svg": svg, "peaks": peaks}


def _throughput_figures(tests: Sequence[TestResult]) -> list[Figure]:
    """Offline throughput against concurrency, per test function that varies the concurrency."""
    by_function = defaultdict(list)
    for test in tests:
        if test.measurement.arrival_rate is None:
            by_function[_node_of(test.test_id)].append(test)
    figures = []
    for node, group in by_function.items():
        function = _function_of(node)
        if len({t.measurement.parameters.concurrency for t in group}) < 2 and "throughput" not in function:
            continue
        points = defaultdict(list)
        for test in group:
            points[(test.measurement.engine_name, _other_parameters(test))].append(
                (test.measurement.parameters.concurrency, test.measurement.summary.output_throughput)
            )
        variants = sorted({rest for _, rest in points})
        series = [
            plots.Series(
                label=f"{engine} {rest}".strip(),
                x=tuple(x for x, _ in sorted(values)),
                y=tuple(y for _, y in sorted(values)),
                colour=plots.ENGINE_COLOURS.get(engine),
                style=plots.LINE_STYLES[variants.index(rest) % len(plots.LINE_STYLES)],
            )
            for (engine, rest), values in sorted(points.items())
        ]
        svg = plots.throughput_figure(series, title=f"{function}: static vs in-flight")
        figures.append(Figure(f"{function}: output tokens/s against concurrency", svg))
    return figures


def _timeline_figure(tests: Sequence[TestResult], against: AgainstDescription | None) -> Figure | None:
    group = _engine_group(tests)
    if group is None:
        return None
    timelines = [
        _timeline_of(timeline, f"{test.measurement.engine_name}: {_test_name(test.test_id)}")
        for test in group
        if (timeline := test.measurement.timeline) is not None  # each has one: _engine_group chose them by it
    ]
    names = [_test_name(t.test_id) for t in group]
    caption = f"One timed run of {', '.join(names[:-1])} and {names[-1]}: same parameters, only the engine differs."
    if any(t.has_kv for t in timelines):
        caption += (
            " KV blocks: held after each step, against the pool (dashed; a slot engine's slots count as blocks of "
            "max_seq_len tokens); red markers: steps that preempted requests to make room."
        )
    if against is not None:
        caption += (
            f" {'Both' if len(group) == 2 else 'All'} are runs of side B, the current tree; "
            "each test's own section stacks A's run above B's."
        )
    return Figure(caption, plots.timeline_figure(timelines, stacked=len(timelines) > 2))


# The engines the timeline sets side by side, in this order, when tests of the same parameters measured them.
TIMELINE_ENGINES = OWN_ENGINES


def _engine_group(tests: Sequence[TestResult]) -> tuple[TestResult, ...] | None:
    """Tests of perfsuite's engines that differ only by engine: the group that shows a queue and most padding."""
    groups: dict[tuple, dict[str, TestResult]] = defaultdict(dict)
    for test in tests:
        measured = test.measurement
        if measured.timeline is not None and measured.timeline.steps:
            groups[(_without_engine(test), measured.parameters, measured.arrival_rate)][measured.engine_name] = test
    found = [tuple(g[e] for e in TIMELINE_ENGINES if e in g) for g in groups.values()]
    found = [group for group in found if len(group) >= 2]
    if not found:
        return None

    def clarity(group: tuple[TestResult, ...]) -> tuple:
        first = group[0].measurement  # static, where the group has it
        # A closed loop keeps its clients' requests outside the engine, so its queue stays empty.
        has_queue = first.timeline is not None and any(step.num_waiting for step in first.timeline.steps)
        padding = first.counters.num_padding_tokens
        preemptions = sum(t.measurement.counters.num_preemptions for t in group)
        return first.arrival_rate is None, has_queue, len(group), preemptions, padding, first.parameters.concurrency

    return max(found, key=clarity)


def _timeline_of(timeline: RunTimeline, title: str) -> plots.Timeline:
    requests = timeline.requests
    return plots.Timeline(
        title=title,
        duration=timeline.duration,
        num_slots=timeline.num_slots,
        spans=tuple(_slot_spans(timeline.steps, timeline.num_slots)),
        queue=tuple((step.start, step.num_waiting) for step in timeline.steps),
        first_tokens=tuple((r.first_token, r.first_token - r.arrival) for r in requests if r.first_token is not None),
        finishes=tuple((r.finished, r.finished - r.arrival) for r in requests if r.finished is not None),
        request_order=tuple(r.request_id for r in requests),
        kv_blocks=tuple((step.start, step.num_kv_blocks_used) for step in timeline.steps),
        kv_pool=timeline.num_kv_blocks,
        preemptions=tuple(
            (step.start, len(step.preempted_request_ids)) for step in timeline.steps if step.preempted_request_ids
        ),
    )


def _slot_spans(steps: Sequence[TimelineStep], num_slots: int) -> list[plots.Span]:
    """Consecutive steps that keep a slot on the same thing merge into one span."""
    done: list[plots.Span] = []
    open_spans: dict[int, plots.Span] = {}
    for step in steps:
        occupied: dict[int, tuple[str, str | None]] = {}
        for chunk in step.chunks:
            kind = "padding" if chunk.is_padding else "prefill" if chunk.is_prefill else "decode"
            occupied[chunk.slot] = (kind, None if chunk.is_padding else chunk.request_id)
        for slot in range(num_slots):
            kind, request_id = occupied.get(slot, ("empty", None))
            span = open_spans.get(slot)
            if span is not None and (span.kind, span.request_id) == (kind, request_id):
                open_spans[slot] = plots.Span(slot, span.start, step.end, kind, request_id)
                continue
            if span is not None:
                done.append(span)
            open_spans[slot] = plots.Span(slot, step.start, step.end, kind, request_id)
    return done + list(open_spans.values())


# -- one test ----------------------------------------------------------------


def _section(test: TestResult, rows: Sequence[VerdictRow], results: Results) -> TestSection:
    own = [row for row in rows if row.test_id == test.test_id]
    sides = sides_of(results)
    paired = results.against is not None and test.is_paired
    return TestSection(
        test_id=test.test_id,
        engine=test.measurement.engine_name,
        verdict=overall_verdict(own) if test.judgement.comparisons else test.judgement.baseline_status,
        baseline_status=test.judgement.baseline_status,
        facts=tuple(_test_facts(test)),
        counters=tuple(_counter_rows(test)),
        distributions_svg=plots.distribution_figure(
            test.measurement.request_samples, test.judgement.baseline_request_samples, sides.current, sides.baseline
        ),
        pair_ratios=_pair_ratio_figure(test, results.policy.min_effect) if paired else None,
        timelines=_paired_timelines(test, results.against) if paired else None,
        send_lag=_send_lag_figure(test),
        capacity=_capacity_figure(test),
        splits_ttft_by_cache_hit=test.ttft_by_cache_hit is not None,
    )


def pair_ratios(test: TestResult) -> list[plots.PairRatios]:
    """Each compared metric's ratios B/A, pair by pair (``samples[m][i] / reference_samples[m][i]``)."""
    reference = test.reference
    found: list[plots.PairRatios] = []
    if reference is None:
        return found
    for comparison in test.judgement.comparisons:
        a, b = reference.samples.get(comparison.metric, ()), test.measurement.samples.get(comparison.metric, ())
        if a and len(a) == len(b) and all(value > 0 for value in a):
            ratios = tuple(y / x for x, y in zip(a, b))
            found.append(plots.PairRatios(comparison.metric, ratios, reference.pair_order[: len(ratios)]))
    return found


def _pair_ratio_figure(test: TestResult, min_effect: float) -> Figure | None:
    pairs = pair_ratios(test)
    if not pairs:
        return None
    caption = (
        "Each pair's ratio B/A (current tree over REF), per compared metric; the band is the minimum effect "
        "worth flagging. Pairs that agree sit on one side of 1; the change shown is their median."
    )
    return Figure(caption, plots.pair_ratio_figure(pairs, min_effect))


def _paired_timelines(test: TestResult, against: AgainstDescription | None) -> Figure | None:
    if against is None or test.measurement.timeline is None or test.reference is None:
        return None
    if test.reference.timeline is None:
        return None
    current = f"B: current tree at {against.current_commit[:12]}" if against.current_commit else "B: current tree"
    runs = [
        _timeline_of(test.reference.timeline, f"A: REF {_reference_label(against)}"),
        _timeline_of(test.measurement.timeline, current),
    ]
    caption = "One timed run of each side, on one time axis: A (REF) above, B (the current tree) below."
    return Figure(caption, plots.timeline_figure(runs, stacked=True))


def _test_facts(test: TestResult) -> list[tuple[str, str]]:
    measured = test.measurement
    facts = [(name.replace("_", " "), _format_value(getattr(measured.parameters, name))) for name in PARAMETER_NAMES]
    if measured.arrival_rate is not None:
        facts.append(("arrival rate", f"{measured.arrival_rate:g} req/s (Poisson)"))
    summary = measured.summary
    shown = (
        ("output tok/s", summary.output_throughput),
        ("req/s", summary.request_throughput),
        ("TTFT p50 ms", _tail(summary, "ttft", "median")),
        ("TTFT p99 ms", _tail(summary, "ttft", "p99")),
        ("TPOT p50 ms", _tail(summary, "tpot", "median")),
        ("TPOT p99 ms", _tail(summary, "tpot", "p99")),
        ("E2E p50 ms", _tail(summary, "e2el", "median")),
        ("E2E p99 ms", _tail(summary, "e2el", "p99")),
        ("requests completed", summary.completed),
    )
    shown_facts = [(label, _format_value(value)) for label, value in shown]
    return (
        facts
        + shown_facts
        + _memory_facts(test)
        + _prefix_cache_facts(test)
        + _machine_facts(test)
        + _node_facts(test)
        + send_lag_view.send_lag_facts(test)
        + server_metrics_view.server_metrics_facts(test)
        + capacity_view.capacity_facts(test)
    )


def _node_facts(test: TestResult) -> list[tuple[str, str]]:
    """``--perf-ray``: the cluster node whose actor measured every repeat (nodes may differ from test to test)."""
    return [] if test.node is None else [("measured on node", test.node)]


def _machine_facts(test: TestResult) -> list[tuple[str, str]]:
    """The CPU other work used during each repeat (or each side's runs), and an A/B test's worker threads."""
    facts = []
    current = test.measurement.busy_shares
    if test.reference is None:
        if current:
            facts.append(("CPU used by other work", _busy_text(current, "repeat")))
        return facts
    reference = test.reference.busy_shares
    if current and reference:
        facts.append(("CPU used by other work", f"A: {_busy_text(reference, 'run')}; B: {_busy_text(current, 'run')}"))
    if test.reference.num_threads is not None:
        facts.append(("worker threads", f"{test.reference.num_threads} intra-op a worker, both sides"))
    return facts


def _busy_text(shares: Sequence[float], run: str) -> str:
    runs = run if len(shares) == 1 else f"{run}s"
    return f"median {statistics.median(shares):.0%}, most {max(shares):.0%} of the machine, over {len(shares)} {runs}"


def _capacity_figure(test: TestResult) -> Figure | None:
    svg = capacity_view.capacity_svg(test)
    return None if svg is None else Figure(capacity_view.CAPTION, svg)


def _send_lag_figure(test: TestResult) -> Figure | None:
    svg = send_lag_view.send_lag_svg(test)
    if svg is None:
        return None
    caption = (
        "The load generator's lateness: each request of the last repeat, how long after it could have gone "
        "(its schedule, or when the engine or a connection freed) it was sent. Above the dashed bound at p90, "
        "the run is client-bound and its latencies judge nothing."
    )
    return Figure(caption, svg)


def _tail(summary: RunSummary, latency: str, statistic: str) -> float | str:
    """A percentile's figure, or what its sample does say when it cannot support it; an older file: the figure."""
    interval = getattr(summary, latency).interval(statistic)
    text = interval.unsupported_text() if interval is not None else None
    return text or getattr(getattr(summary, latency), f"{statistic}_ms")


def _memory_facts(test: TestResult) -> list[tuple[str, str]]:
    """The KV cache of the last repeat and the CUDA peak, where the test recorded them."""
    memory = test.memory
    if memory is None:
        return []
    facts = []
    if memory.num_kv_blocks is not None:
        facts += [
            ("KV pool", f"{memory.num_kv_blocks} blocks of {memory.kv_block_size} tokens"),
            ("KV blocks peak / mean", f"{memory.peak_kv_blocks_used} / {memory.mean_kv_blocks_used:.1f}"),
            ("KV utilisation", f"{memory.kv_utilisation:.1%} of the held blocks' tokens"),
            ("preemptions", f"{memory.num_preemptions} ({memory.num_recomputed_tokens} tokens recomputed)"),
            ("max concurrent requests", str(memory.peak_num_running)),
        ]
    if memory.max_memory_allocated_bytes is not None:
        facts.append(("CUDA peak allocated", f"{memory.max_memory_allocated_bytes / 2**20:,.1f} MiB"))
    return facts


def _prefix_cache_facts(test: TestResult) -> list[tuple[str, str]]:
    """The hit rate (cached prompt tokens over those looked up) and evictions, where the run looked anything up;
    TTFT of the requests that hit and of those that missed, where some hit."""
    figures, split = test.prefix_cache, test.ttft_by_cache_hit
    facts = []
    if figures is not None:
        facts.append(("prefix cache hit rate", figures.describe()))
        if figures.num_evicted_blocks is not None:
            facts.append(("prefix cache evicted blocks", str(figures.num_evicted_blocks)))
    if split is not None:
        facts += [
            ("TTFT p50 / p90 ms, cache hit", _split_tails(split.hit_p50_ms, split.hit_p90_ms, split.num_hits)),
            ("TTFT p50 / p90 ms, cache miss", _split_tails(split.miss_p50_ms, split.miss_p90_ms, split.num_misses)),
        ]
    return facts


def _split_tails(p50: float | None, p90: float | None, count: int) -> str:
    if p50 is None or p90 is None:
        return "no requests"
    return f"{_format_value(p50)} / {_format_value(p90)} ({count} request{'' if count == 1 else 's'})"


def _counter_rows(test: TestResult) -> list[CounterRow]:
    """Counters are exact: a compared test lists only the ones that changed, so the rest equal the baseline.

    A counter either side's file did not record (older than the counter) was not compared: its cell says so.
    """
    changed = {c.name: c.baseline for c in test.judgement.counter_changes}
    compared = bool(test.judgement.comparisons) or bool(changed)
    rows = []
    for name, current in sorted(dataclasses.asdict(test.measurement.counters).items()):
        recorded = name not in test.measurement.unrecorded_counters
        baseline_recorded = name not in test.judgement.baseline_unrecorded_counters
        baseline = changed.get(name, current if compared and recorded and baseline_recorded else None)
        rows.append(CounterRow(name, current if recorded else None, baseline, baseline_recorded))
    return rows


# -- helpers -------------------------------------------------------------------


def _template() -> Any:
    import jinja2
    from markupsafe import Markup

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("perfsuite.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["anchor"] = _anchor
    environment.filters["svg"] = Markup  # drawn by matplotlib, which escapes its own text
    return environment.get_template("report.html.j2")


def _format_value(value: Any) -> str:
    return format_figure(value) if value is None or isinstance(value, float) else str(value)


def _natural_key(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _node_of(test_id: str) -> str:
    """The test function's node id, without its parameters."""
    return test_id.partition("[")[0]


def _function_of(test_id: str) -> str:
    return _node_of(test_id).rpartition("::")[2]


def _parameter_ids(test_id: str) -> list[str]:
    inside = test_id.partition("[")[2].rstrip("]")
    return inside.split("-") if inside else []


def _test_name(test_id: str) -> str:
    return test_id.rpartition("::")[2]


def _without_engine(test: TestResult) -> tuple[str, ...]:
    return (_node_of(test.test_id), *(p for p in _parameter_ids(test.test_id) if p != test.measurement.engine_name))


def _other_parameters(test: TestResult) -> str:
    """A test id's parameters besides the engine and the batch size, e.g. the length distribution."""
    parts = _parameter_ids(test.test_id)
    return "-".join(p for p in parts if p != test.measurement.engine_name and not re.fullmatch(r"B\d+", p))


def _anchor(test_id: str) -> str:
    return "test-" + re.sub(r"[^A-Za-z0-9]+", "-", test_id).strip("-")
