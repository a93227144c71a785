"""Where does a step's time go? One decode and one prefill step of each engine's path, broken into parts.

    python bench/step_profile.py [--model smollm2-135m] [--rows 1,8,32] [--thread-settings 2,1,1-bound]
                                 [--context 256] [--prompt 64] [--steps 8]

For each thread setting, each path and each row count, runs ``--steps``
steps under ``torch.profiler`` (CPU) and splits their wall time into:

- projections: the QKV, output and MLP matrix products (``F.linear``);
- attention (kernel): the attention kernel itself, torch's SDPA or, for a
  paged decode step, perfsuite's in-place kernel (``perfsuite.engine.paged_attention``);
- attention (K/V write, gather): storing the step's keys and values and,
  for the paged pool without the in-place kernel, gathering each row's keys
  through its block table;
- norms, rotary: the RMS norms and the rotary embedding;
- lm head + argmax: the last norm, the vocabulary projection and greedy choice;
- other ops: embedding, activations, residual adds, the step's index tensors;
- Python and dispatch: the wall time no operator accounts for (the
  scheduler is not in it: the steps are built once, outside the timing).

The paths: ``slot`` (the static and in-flight engines' slot cache, packed
path), ``paged`` (the paged engine's pool, packed path: keys gathered per
step) and ``paged-static`` (the paged engine's bucketed static-shape decode
step, ``--perf-decode-mode static``; decode only). Thread settings: ``N``
intra-op threads, and ``N-bound`` for N threads with the process bound to
the first N CPUs (``os.sched_setaffinity``), as vLLM binds its threads on
CPU. The rows of each setting are measured in turn, and the paths
interleaved step by step within a row count, so slow drift hits them alike.

Each part is a share of the unprofiled ms per step (measured just before,
median of --steps): operators' self times under the profiler, over that
wall time, and Python and dispatch the rest. The profiler's own cost per
operator therefore never counts as Python; an operator's time measured
under it may read a little high, which makes Python read low, never high.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from bench_common import comma_choices  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine import layers, model_runner, paged_decode  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.paged_attention import PagedAttention  # noqa: E402
from perfsuite.engine.paged_decode import PagedDecodeStep  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402
from perfsuite.models import DEFAULT_MODEL, load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402

PATHS = ("slot", "paged", "paged-static")
BLOCK_SIZE = 16
PARTS = (
    "projections",
    "attention (kernel)",
    "attention (K/V write, gather)",
    "norms",
    "rotary",
    "lm head + argmax",
    "other ops",
    "Python and dispatch",
)
# The labels wrapped around perfsuite's layer functions while profiling, innermost first when nested.
LABELS = {"norms": "norms", "rotary": "rotary", "sdpa": "attention (kernel)", "attend": "attention (K/V write, gather)",
          "lm_head": "lm head + argmax"}  # fmt: skip
# Labels around code that runs no operator the profiler sees (a ctypes call): the label's own time is the part's.
TIMED_LABELS = {"paged_kernel": "attention (kernel)"}
PROJECTION_OPS = {"aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::t", "aten::bmm",
                  "mkldnn::_linear_pointwise"}  # fmt: skip
OPERATOR_NAMESPACES = ("aten::", "mkldnn::")  # the packed projections are oneDNN's (perfsuite.engine.projection)


@contextmanager
def labelled_layers():
    """perfsuite's layer functions wrapped in ``record_function`` labels, for one profiled block."""

    def labelled(label: str, function: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            with record_function(label):
                return function(*args, **kwargs)

        return wrapper

    saved = {
        (layers, "rms_norm"): layers.rms_norm,
        (layers, "apply_rotary"): layers.apply_rotary,
        (model_runner, "grouped_query_attention"): model_runner.grouped_query_attention,
        (paged_decode, "grouped_query_attention"): paged_decode.grouped_query_attention,
        (layers, "decoder_layer"): layers.decoder_layer,
        (layers.Decoder, "greedy_tokens"): layers.Decoder.greedy_tokens,
        (PagedAttention, "__call__"): PagedAttention.__call__,
    }
    layer = layers.decoder_layer

    def decoder_layer(weights, index, hidden, cos, sin, heads, eps, attend):
        return layer(weights, index, hidden, cos, sin, heads, eps, labelled("attend", attend))

    layers.rms_norm = labelled("norms", saved[(layers, "rms_norm")])
    layers.apply_rotary = labelled("rotary", saved[(layers, "apply_rotary")])
    model_runner.grouped_query_attention = labelled("sdpa", saved[(model_runner, "grouped_query_attention")])
    paged_decode.grouped_query_attention = labelled("sdpa", saved[(paged_decode, "grouped_query_attention")])
    layers.decoder_layer = decoder_layer
    layers.Decoder.greedy_tokens = labelled("lm_head", saved[(layers.Decoder, "greedy_tokens")])
    PagedAttention.__call__ = labelled("paged_kernel", saved[(PagedAttention, "__call__")])
    try:
        yield
    finally:
        for (owner, name), function in saved.items():
            setattr(owner, name, function)


def split_by_part(events, wall_us: float) -> dict[str, float]:
    """Each part's share of ``wall_us``, an unprofiled wall time of the same steps: every operator's self time, by
    its innermost label or its name; what no operator accounts for is Python and dispatch."""
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.name in TIMED_LABELS:
            totals[TIMED_LABELS[event.name]] += event.self_cpu_time_total
            continue
        if event.name in LABELS or not event.name.startswith(OPERATOR_NAMESPACES):
            continue
        label = None
        parent = event.cpu_parent
        while parent is not None and label is None:
            label = LABELS.get(parent.name)
            parent = parent.cpu_parent
        if label is None:  # the final norm runs inside lm_head's label, so it counts there
            label = "projections" if event.name in PROJECTION_OPS else "other ops"
        totals[label] += event.self_cpu_time_total
    totals["Python and dispatch"] = max(0.0, wall_us - sum(totals.values()))
    return {part: totals.get(part, 0.0) / wall_us for part in PARTS}


@dataclass(frozen=True, slots=True)
class StepCase:
    path: str
    kind: str  # "decode" or "prefill"
    rows: int
    run: Callable[[], object]


def step_cases(runner: ModelRunner, rows: int, context: int, prompt: int) -> list[StepCase]:
    """Each path's decode step (every row at ``context``) and prefill step (every row a ``prompt``-token prompt)."""
    max_seq_len = context + prompt + 8
    blocks_per_row = -(-max_seq_len // BLOCK_SIZE)
    slot_cache = runner.new_kv_cache(rows, max_seq_len)
    pool = runner.new_paged_kv_cache(rows * blocks_per_row, BLOCK_SIZE)
    tables = [tuple(range(r * blocks_per_row, (r + 1) * blocks_per_row)) for r in range(rows)]
    static_step = PagedDecodeStep(runner.decoder, pool, max_num_seqs=rows, max_blocks_per_seq=blocks_per_row)

    def chunks(paged: bool, prefill: bool) -> tuple[ScheduledChunk, ...]:
        return tuple(
            ScheduledChunk(f"r{r}", r, tuple(3 + (r + j) % 200 for j in range(prompt)) if prefill else (5 + r,),
                           0 if prefill else context, samples=True, is_prefill=prefill,
                           block_table=tables[r] if paged else ())
            for r in range(rows)
        )  # fmt: skip

    outputs = {(paged, prefill): SchedulerOutput(chunks(paged, prefill), num_waiting=0)
               for paged in (False, True) for prefill in (False, True)}  # fmt: skip
    return [
        StepCase("slot", "decode", rows, lambda: runner.execute(outputs[False, False], slot_cache)),
        StepCase("paged", "decode", rows, lambda: runner.execute(outputs[True, False], pool)),
        StepCase("paged-static", "decode", rows, lambda: static_step(outputs[True, False].chunks)),
        StepCase("slot", "prefill", rows, lambda: runner.execute(outputs[False, True], slot_cache)),
        StepCase("paged", "prefill", rows, lambda: runner.execute(outputs[True, True], pool)),
    ]


def ms_per_step(cases: list[StepCase], steps: int) -> dict[int, list[float]]:
    """Unprofiled ms per step of each case, the cases interleaved step by step."""
    times: dict[int, list[float]] = {index: [] for index in range(len(cases))}
    for _ in range(steps):
        for index, case in enumerate(cases):
            start = time.perf_counter()
            case.run()
            times[index].append(1e3 * (time.perf_counter() - start))
    return times


def profiled_shares(case: StepCase, steps: int, unprofiled_ms: float) -> dict[str, float]:
    """Parts of ``steps`` profiled steps as shares of as many steps of ``unprofiled_ms`` (the profiler's own cost
    per operator would otherwise count as Python)."""
    with labelled_layers(), profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            case.run()
    return split_by_part(profiler.events(), 1e3 * unprofiled_ms * steps)


def apply_thread_setting(setting: str) -> str:
    threads = int(setting.removesuffix("-bound"))
    torch.set_num_threads(threads)
    cpus = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    os.sched_setaffinity(0, set(cpus[:threads]) if setting.endswith("-bound") else set(cpus))
    return f"{torch.get_num_threads()} threads, CPUs {sorted(os.sched_getaffinity(0))}"


def thread_setting(text: str) -> str:
    if not text.removesuffix("-bound").isdigit() or int(text.removesuffix("-bound")) < 1:
        raise argparse.ArgumentTypeError(f"a thread setting is N or N-bound (N >= 1), got {text!r}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", default="1,8,32", help="comma-separated rows per step")
    parser.add_argument("--thread-settings", default="2,1,1-bound", help="comma-separated: N or N-bound")
    parser.add_argument("--paths", type=comma_choices(PATHS, "path"), default=PATHS)
    parser.add_argument("--context", type=positive_int, default=256, help="decode rows' position")
    parser.add_argument("--prompt", type=positive_int, default=64, help="prefill rows' prompt length")
    parser.add_argument("--steps", type=positive_int, default=8, help="steps per case, timed and profiled")
    args = parser.parse_args()
    settings = [thread_setting(text) for text in args.thread_settings.split(",")]
    rows_list = [int(text) for text in args.rows.split(",")]
    loaded = load_model(args.model, device="cpu", dtype=args.dtype)
    runner = ModelRunner(loaded.model)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")  # fmt: skip
    print(f"model={args.model} dtype={args.dtype} cpu={cpu} cpus={os.cpu_count()} torch={torch.__version__} "
          f"date={time.strftime('%Y-%m-%d')} context={args.context} prompt={args.prompt} steps={args.steps}")  # fmt: skip
    summary = []
    with torch.inference_mode():
        for setting in settings:
            print(f"\n== {setting}: {apply_thread_setting(setting)}", flush=True)
            rows_out = []
            for rows in rows_list:
                cases = [case for case in step_cases(runner, rows, args.context, args.prompt) if case.path in args.paths]
                for case in cases:
                    case.run()  # warm-up
                times = ms_per_step(cases, args.steps)
                for index, case in enumerate(cases):
                    median = statistics.median(times[index])
                    shares = profiled_shares(case, args.steps, median)
                    rows_out.append([case.kind, case.path, rows, median,
                                     *(f"{100 * shares[part]:.0f}%" for part in PARTS)])  # fmt: skip
                    summary.append((setting, case.kind, case.path, rows, median))
            headers = ["step", "path", "rows", "ms/step", *PARTS]
            print(format_table(headers, rows_out), flush=True)
    if len(settings) > 1:
        print(f"\nms per step against {settings[0]} (below 1: faster), same case:")
        first = {(kind, path, rows): ms for setting, kind, path, rows, ms in summary if setting == settings[0]}
        table = [[kind, path, rows, *(f"{ms_of(summary, s, kind, path, rows) / first[kind, path, rows]:.2f}"
                                      for s in settings[1:])]
                 for kind, path, rows in first]  # fmt: skip
        print(format_table(["step", "path", "rows", *settings[1:]], table))


def ms_of(summary, setting: str, kind: str, path: str, rows: int) -> float:
    return next(ms for s, k, p, r, ms in summary if (s, k, p, r) == (setting, kind, path, rows))


if __name__ == "__main__":
    main()
