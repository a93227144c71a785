"""perfsuite's engines against Hugging Face's, measured side by side on one machine.

    python bench/peers.py [--model smollm2-135m] [--num-requests 20] [--repeats 2]
                          [--batch-sizes 8,32] [--workloads mixed,exponential]
                          [--engines static,inflight,paged,hf-static,hf-cb[,vllm]]

Every engine is built by name through ``perfsuite.adapters.build_engine`` over
one loaded model and serves the same seeded requests, all at t0. Where vLLM is
importable (``.venv-peers``, see ``make peers``) its in-process engine ``vllm``
is a column too, by default:

- ``mixed``: the default workload, max_new_tokens uniform 8..128;
- ``exponential``: max_new_tokens exponential with mean 64, in 1..256.

Both ignore EOS, so every engine produces the same tokens. Each engine gets a
throw-away warm-up run first. Each repeat then runs every engine once,
alternating the order between repeats, and a ratio is taken per repeat, so
slow drift of a noisy machine hits the engines alike. What is timed is
``engine.run``: for ``hf-cb`` the manager's set-up (building its paged cache)
and shut-down are outside it, as perfsuite's engines allocate their caches
when built.

The defaults take about 12-15 minutes on a quiet 2-core CPU (perfsuite's
engines make ~40-55 tok/s there at B=8, about twice that at B=32); the time
grows with --num-requests x --repeats. With 20 requests, B=32 holds them all
in one batch, so that cell measures one batch draining, not a steady state.
For each workload and batch size it prints
output tok/s per engine and the median per-repeat ratios inflight/hf-static,
inflight/hf-cb and inflight/static (and inflight/vllm when vllm ran). Where
vLLM ran, one line per workload and batch size gives
``paged/vllm=<x> inflight/vllm=<y>``. The last line is the first workload at
the first batch size (the default workload at B=8 by default):

    inflight/hf-static=<x> inflight/hf-cb=<y> inflight/static=<z> [inflight/vllm=<v>] overhead=<pct>%

where overhead is the in-flight engine's host overhead: the share of its run's
wall time spent outside the model's forward compute (as in bench/batching.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batching import ProfiledRunner  # noqa: E402
from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402
from time_split import SPLIT_HEADER, ForwardHooks, StepKind, StepRecorder, StepTime, split_rows, vllm_modules  # noqa: E402

from perfsuite.adapters import Backend, EngineConfig, available_engines, build_engine, check_engine_names  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.measure.timing import max_seq_len_for, timed_run, warm_up  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import OutputLengths, Workload, mixed_workload  # noqa: E402

WORKLOADS: dict[str, Callable[[int], Workload]] = {
    "mixed": mixed_workload,
    "exponential": lambda num_requests: Workload(num_requests, OutputLengths("exponential", 1, 256, mean=64)),
}
ENGINES = ("static", "inflight", "paged", "hf-static", "hf-cb")
OPTIONAL_ENGINES = ("vllm",)  # columns by default where they are installed
RATIOS = ("hf-static", "hf-cb", "static")  # always shown, n/a when not measured
BASELINE = "inflight"


def default_engines() -> tuple[str, ...]:
    installed = available_engines()
    return ENGINES + tuple(name for name in OPTIONAL_ENGINES if name in installed)


@dataclass(frozen=True)
class CellResult:
    """One workload at one batch size: output tok/s per engine and repeat, in-flight overheads."""

    workload: str
    batch_size: int
    throughput: dict[str, list[float]]
    overheads: list[float]
    # Per engine and repeat, the median ms between a step and the one before it, over steps that gave batch_size
    # outputs: a full decode batch's step time, free of how the engines schedule (None: no such step).
    full_step_ms: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    # Per engine and repeat: the run's seconds and its steps by kind (bench/time_split.py).
    splits: dict[str, list[tuple[float, list[StepTime]]]] = dataclasses.field(default_factory=dict)

    def step_ms(self, engine: str) -> float | None:
        """The median over repeats of ``engine``'s full-batch step time, None where no repeat had one."""
        values = [ms for ms in self.full_step_ms.get(engine, ()) if ms is not None]
        return statistics.median(values) if values else None

    def ratio(self, other: str, ours: str = BASELINE) -> float | None:
        """Median over repeats of ``ours``'s tok/s (in-flight's by default) over ``other``'s in the same repeat."""
        if ours not in self.throughput or other not in self.throughput:
            return None
        pairs = zip(self.throughput[ours], self.throughput[other])
        return statistics.median(ours / theirs for ours, theirs in pairs)

    @property
    def overhead(self) -> float | None:
        return statistics.median(self.overheads) if self.overheads else None


def measure_cell(
    loaded, backend: Backend, workload: str, batch_size: int, args: argparse.Namespace, device: str
) -> CellResult:
    requests = WORKLOADS[workload](args.num_requests).requests(backend.tokenize)
    config = EngineConfig(batch_size, max_seq_len_for(requests, loaded.max_context))
    engines = {name: build_engine(name, backend, config) for name in args.engines}
    try:
        return _measure_engines(engines, requests, backend.runner, workload, batch_size, args, device)
    finally:
        for engine in engines.values():
            getattr(engine, "close", lambda: None)()  # vllm: its engine-core process goes with it


PERFSUITE_ENGINES = ("static", "inflight", "paged")  # their forward pass is the shared ProfiledRunner's


def _measure_engines(engines, requests, runner, workload: str, batch_size: int, args, device: str) -> CellResult:
    for engine in engines.values():
        warm_up(engine, requests)
    throughput: dict[str, list[float]] = {name: [] for name in engines}
    step_ms: dict[str, list[float | None]] = {name: [] for name in engines}
    splits: dict[str, list[tuple[float, list[StepTime]]]] = {name: [] for name in engines}
    overheads: list[float] = []
    for repeat in range(args.repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for name in order:
            runner.reset()
            hooks = ForwardHooks()
            timed = hooks.installed(vllm_modules(engines[name].llm_engine)) if name == "vllm" else None
            with timed or contextlib.nullcontext():
                recorder = StepRecorder(batch_size, forward_clock(name, hooks, runner))
                result = timed_run(engines[name], requests, device, on_step=recorder)
            throughput[name].append(run_metrics(result).output_throughput)
            step_ms[name].append(full_step_ms(recorder.steps, batch_size))
            splits[name].append((result.duration, recorder.steps))
            if name == BASELINE:
                overheads.append(1 - runner.compute_seconds / result.duration)
            tokens_per_second = throughput[name][-1]
            full_step = _format(step_ms[name][-1], " ms", digits=1)
            print(f"  {workload} B={batch_size} repeat {repeat}: {name:9s} {tokens_per_second:8.1f} tok/s, "
                  f"{len(recorder.steps)} steps, {full_step} a full step", flush=True)  # fmt: skip
    return CellResult(workload, batch_size, throughput, overheads, step_ms, splits)


def forward_clock(name: str, hooks: ForwardHooks, runner) -> Callable[[], float] | None:
    """What reads ``name``'s cumulative forward seconds: vLLM's hooks, perfsuite's runner, or nothing (hf-*)."""
    if name == "vllm":
        return lambda: hooks.seconds
    if name in PERFSUITE_ENGINES:
        return lambda: runner.compute_seconds
    return None


def full_step_ms(steps: list[StepTime], batch_size: int) -> float | None:
    """The median ms of the full decode steps: from the step before each to it, over the steps that decoded every
    one of the ``batch_size`` slots and prefilled nothing (bench/time_split.py).

    This compares the engines' forward passes where the workload gives them
    the same work: ``batch_size`` rows, one token each.
    """
    gaps = [step.wall_s for step in steps if step.kind is StepKind.FULL_DECODE]
    return 1e3 * statistics.median(gaps) if gaps else None


def _format(value: float | None, suffix: str = "", scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}{suffix}"


def ratio_line(cell: CellResult) -> str:
    others = RATIOS + tuple(name for name in OPTIONAL_ENGINES if name in cell.throughput)
    ratios = " ".join(f"{BASELINE}/{other}={_format(cell.ratio(other))}" for other in others)
    return f"{ratios} overhead={_format(cell.overhead, '%', 100, 1)}"


def vllm_line(cell: CellResult) -> str | None:
    """``paged/vllm=<x> inflight/vllm=<y>`` where vLLM ran: perfsuite's engines against it, same repeats."""
    if "vllm" not in cell.throughput:
        return None
    ours = [name for name in ("paged", BASELINE) if name in cell.throughput]
    ratios = " ".join(f"{name}/vllm={_format(cell.ratio('vllm', ours=name))}" for name in ours)
    steps = [(name, cell.step_ms(name)) for name in ours]
    vllm_ms = cell.step_ms("vllm")
    if vllm_ms is None or any(ms is None for _, ms in steps):
        return f"{cell.workload} B={cell.batch_size}: {ratios}"
    step_ratios = " ".join(f"{name}={vllm_ms / ms:.2f}" for name, ms in steps)
    return f"{cell.workload} B={cell.batch_size}: {ratios} (a full step's speed over vllm's: {step_ratios})"


def report(cell: CellResult) -> None:
    rows = [
        [name, statistics.median(values), min(values), max(values), _format(cell.ratio(name)),
         _format(cell.step_ms(name), digits=1)]
        for name, values in cell.throughput.items()
    ]  # fmt: skip
    print(f"{cell.workload} B={cell.batch_size}:")
    print(format_table(["engine", "tok/s median", "min", "max", f"{BASELINE}/engine", "ms a full step"], rows))
    print(ratio_line(cell), flush=True)
    split = [row for name, runs in cell.splits.items() for repeat, (seconds, steps) in enumerate(runs)
             for row in split_rows(f"{name} #{repeat}", seconds, steps)]  # fmt: skip
    if split:
        print(f"where the time goes, {cell.workload} B={cell.batch_size} (bench/time_split.py):")
        print(format_table(SPLIT_HEADER, split), flush=True)


def workload_name(text: str) -> str:
    if text not in WORKLOADS:
        raise argparse.ArgumentTypeError(f"unknown workload {text!r}; choose from {', '.join(WORKLOADS)}")
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--num-requests", type=positive_int, default=20)
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--batch-sizes", type=comma_list(positive_int), default=(8, 32))
    parser.add_argument("--workloads", type=comma_list(workload_name), default=tuple(WORKLOADS))
    parser.add_argument("--engines", type=comma_list(str), default=default_engines())
    args = parser.parse_args(argv)
    if not args.batch_sizes or not args.workloads or not args.engines:
        parser.error("--batch-sizes, --workloads and --engines each need at least one value")
    try:
        check_engine_names(args.engines)
    except ValueError as error:
        parser.error(str(error))
    return args


def machine_line() -> str:
    """The CPU model, its CPUs and the date: what a table of these figures must name."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    bench_model = load_bench_model(args)
    loaded, device, threads = bench_model.loaded, bench_model.device, bench_model.threads
    backend = dataclasses.replace(Backend.from_loaded(loaded), runner=ProfiledRunner(loaded.model))
    print(
        f"model={loaded.spec.name} dtype={args.dtype} device={device} threads={threads} "
        f"requests={args.num_requests} repeats={args.repeats} engines={','.join(args.engines)}",
        flush=True,
    )
    print(f"machine: {machine_line()}; command: {' '.join(sys.argv)}", flush=True)
    runner = backend.runner
    print(f"projections: {runner.decoder.projection_kernels}, rows {runner.decoder.projection_rows}, small_gemm "
          f"rows 1..{runner.decoder.projection_panel_rows}; "
          f"decode attention: {runner.paged_attention}; layer ops: {runner.layer_ops}", flush=True)  # fmt: skip
    cells = []
    for workload in args.workloads:
        for batch_size in args.batch_sizes:
            started = time.perf_counter()
            cells.append(measure_cell(loaded, backend, workload, batch_size, args, device))
            report(cells[-1])
            print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    for line in filter(None, map(vllm_line, cells)):
        print(line)
    print(f"headline: {cells[0].workload} B={cells[0].batch_size}")
    print(ratio_line(cells[0]))


if __name__ == "__main__":
    main()
