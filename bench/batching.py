"""Static, slot in-flight and paged batching at one KV memory budget, measured side by side on one machine.

    python bench/batching.py [--model smollm2-135m] [--kv-tokens 2048 | --kv-mib N] [--block-size 16]
                             [--paged-batch-size 32] [--workloads mixed,exponential] [--num-requests 128]
                             [--repeats 2]

Every engine gets the same KV memory: ``--kv-tokens`` token positions (or
``--kv-mib`` of keys and values at the model's size per token). A slot engine
(static, in-flight) must reserve ``max_seq_len`` positions for every request
it holds, so the budget buys ``kv_tokens // max_seq_len`` slots, where
``max_seq_len`` is the longest request of the workload rounded up to 64. The
paged engine gets the budget as ``kv_tokens // block_size`` blocks and holds
a request in as many blocks as its tokens need so far, so more requests run
at once; when a running request needs a block and none is free, the newest
is preempted and recomputed later. Its ``--paged-batch-size`` only caps the
rows of one step: memory is meant to be what limits it.

Workloads (shipped prompts, EOS ignored, all at t0, seeded):

- ``mixed``: max_new_tokens uniform ``--min-new-tokens``..``--max-new-tokens`` (8..128);
- ``exponential``: max_new_tokens exponential with mean 64, capped at ``--exp-cap`` (256).

Each engine gets a throw-away warm-up run; each repeat then runs the three
engines back to back, alternating the order between repeats, and every
ratio is taken within a repeat, so slow drift of a noisy machine cancels.

128 requests by default: a run ends with a drain tail where few requests
are left, and with few requests that tail dominates. On SmolLM2 the
defaults take roughly 40 minutes on 2 CPU cores (an estimate from the
engines' tok/s there: about 9k tokens per run, 12 timed runs);
``--model tiny-random --exp-cap 160`` takes seconds.

Printed per workload: a table of each engine's KV reservation, the most and
the mean requests running at once, KV blocks (peak, pool) and utilisation
(tokens held over the capacity of the blocks holding them), preemptions and
recomputed tokens, and output tok/s; then a line of ratios. The last line is
the first workload's:

    inflight/static=<x> paged/static=<y> paged/inflight=<z> ideal=<i> fraction=<x/i> overhead=<pct>%

- ideal: what a perfect slot in-flight engine would gain over static at the
  same slots if a step cost the same whatever it holds: static pays its slots
  x the longest output of each batch, in-flight only the tokens it produces.
- fraction: inflight/static divided by ideal.
- overhead: share of the slot in-flight run's wall time spent outside the
  model's forward compute (scheduling, building the step's tensors, bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import add_model_arguments, comma_choices, load_bench_model  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.adapters import Backend, EngineConfig, build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.types import Request, RunResult  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.measure.timing import max_seq_len_for, timed_run, warm_up  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import OutputLengths, Workload, mixed_workload  # noqa: E402

ENGINES = ("static", "inflight", "paged")
SLOT_ENGINES = ("static", "inflight")
RATIOS = (("inflight", "static"), ("paged", "static"), ("paged", "inflight"))
DEFAULT_KV_TOKENS = 2048  # 8 slots of 256 positions
DEFAULT_BLOCK_SIZE = 16

WORKLOADS: dict[str, Callable[[argparse.Namespace], Workload]] = {
    "mixed": lambda args: mixed_workload(args.num_requests, args.min_new_tokens, args.max_new_tokens),
    "exponential": lambda args: Workload(args.num_requests, OutputLengths("exponential", 1, args.exp_cap, mean=64)),
}


class ProfiledRunner(ModelRunner):
    """Splits each step into host preparation and model compute (also used by bench/peers.py)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.execute_seconds = 0.0
        self.prepare_seconds = 0.0

    def execute(self, output, kv_cache):
        start = time.perf_counter()
        tokens = super().execute(output, kv_cache)
        self.execute_seconds += time.perf_counter() - start
        return tokens

    def _prepare(self, *args, **kwargs):
        start = time.perf_counter()
        batch = super()._prepare(*args, **kwargs)
        self.prepare_seconds += time.perf_counter() - start
        return batch

    def reset(self) -> None:
        self.execute_seconds = self.prepare_seconds = 0.0

    @property
    def compute_seconds(self) -> float:
        return self.execute_seconds - self.prepare_seconds


@dataclass(frozen=True)
class KVBudget:
    """One KV memory budget, in token positions, and how each kind of engine spends it."""

    kv_tokens: int
    block_size: int

    def __post_init__(self) -> None:
        if self.kv_tokens < self.block_size:
            raise ValueError(f"a KV budget of {self.kv_tokens} tokens holds no block of {self.block_size}")

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    def slots(self, max_seq_len: int) -> int:
        """What a slot engine can hold: one request per ``max_seq_len`` positions."""
        slots = self.kv_tokens // max_seq_len
        if slots < 1:
            raise ValueError(
                f"a KV budget of {self.kv_tokens} tokens holds no slot of max_seq_len {max_seq_len} (the workload's "
                "longest request, rounded up to 64): raise --kv-tokens or lower the workload's lengths"
            )
        return slots


def kv_bytes_per_token(model_config, element_size: int) -> int:
    """Keys and values of one token over every layer."""
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return 2 * model_config.num_hidden_layers * heads * head_dim * element_size


def ideal_ratio(lengths: list[int], batch_size: int) -> float:
    static_slot_steps = sum(
        len(batch) * max(batch) for batch in (lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size))
    )
    return static_slot_steps / sum(lengths)


def build_engines(runner, budget: KVBudget, max_seq_len: int, paged_batch_size: int, eos_token_id) -> dict:
    """The three engines at the same KV memory (see the module docstring)."""
    slots = budget.slots(max_seq_len)
    backend = Backend(runner, list, eos_token_id, max_seq_len, str(runner.device))
    engines = {kind: build_engine(kind, backend, EngineConfig(slots, max_seq_len)) for kind in SLOT_ENGINES}
    paged = EngineConfig(paged_batch_size, max_seq_len, num_kv_blocks=budget.num_blocks, kv_block_size=budget.block_size)
    engines["paged"] = build_engine("paged", backend, paged)
    return engines


def mean_running(run: RunResult) -> float:
    """Requests computed per step, over the run's steps (padding rows of a static batch are not requests)."""
    counts = [len({c.request_id for c in step.chunks if not c.is_padding}) for step in run.steps]
    return statistics.fmean(counts) if counts else 0.0


@dataclass
class CellResult:
    """One workload at one budget: every engine's runs, tok/s per repeat, and slot in-flight's host overhead."""

    workload: str
    max_seq_len: int
    slots: int
    throughput: dict[str, list[float]] = field(default_factory=dict)
    runs: dict[str, RunResult] = field(default_factory=dict)  # the last repeat of each engine
    reserved_tokens: dict[str, int] = field(default_factory=dict)
    overheads: list[float] = field(default_factory=list)
    ideal: float = 1.0

    def ratio(self, engine: str, other: str) -> float:
        """Median over repeats of ``engine``'s tok/s over ``other``'s in the same repeat."""
        return statistics.median(a / b for a, b in zip(self.throughput[engine], self.throughput[other]))

    def ratio_line(self) -> str:
        ratios = " ".join(f"{a}/{b}={self.ratio(a, b):.2f}" for a, b in RATIOS)
        fraction = self.ratio("inflight", "static") / self.ideal
        overhead = statistics.median(self.overheads) if self.overheads else float("nan")
        return f"{ratios} ideal={self.ideal:.2f} fraction={fraction:.2f} overhead={overhead * 100:.1f}%"

    def rows(self) -> list[list]:
        rows = []
        for kind, run in self.runs.items():
            counters, values = run.counters, self.throughput[kind]
            rows.append([
                kind, self.reserved_tokens[kind], counters.peak_num_running, f"{mean_running(run):.1f}",
                f"{counters.peak_kv_blocks_used}/{run.num_kv_blocks}", f"{counters.kv_utilisation:.0%}",
                f"{counters.num_preemptions} ({counters.num_recomputed_tokens})",
                *(f"{value:.1f}" for value in (statistics.median(values), min(values), max(values))),
                f"{1e3 * run.duration / max(1, counters.num_forward_passes):.2f}",
            ])  # fmt: skip
        return rows


TABLE_COLUMNS = ["engine", "KV tokens", "max run", "mean run", "blocks peak/pool", "KV util", "preempt (recomp)",
                 "tok/s", "min", "max", "ms/step"]  # fmt: skip


def measure_cell(
    workload: str, requests: Sequence[Request], runner: ProfiledRunner, budget: KVBudget, args, device: str, eos
) -> CellResult:
    max_seq_len = max_seq_len_for(requests, runner.max_context)
    engines = build_engines(runner, budget, max_seq_len, args.paged_batch_size, eos)
    slots = budget.slots(max_seq_len)
    cell = CellResult(workload, max_seq_len, slots, throughput={kind: [] for kind in engines})
    cell.reserved_tokens = {kind: slots * max_seq_len for kind in SLOT_ENGINES}
    cell.reserved_tokens["paged"] = budget.num_blocks * budget.block_size
    lengths = [r.sampling_params.max_new_tokens for r in requests]
    cell.ideal = ideal_ratio(lengths, slots)
    for engine in engines.values():
        warm_up(engine, requests)
    for repeat in range(args.repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for kind in order:
            runner.reset()
            result = timed_run(engines[kind], requests, device)
            check_complete(kind, result, requests)
            cell.throughput[kind].append(run_metrics(result).output_throughput)
            cell.runs[kind] = result
            if kind == "inflight":
                cell.overheads.append(1 - runner.compute_seconds / result.duration)
            print(f"  {workload} repeat {repeat}: {kind:8s} {cell.throughput[kind][-1]:8.1f} tok/s", flush=True)
    cell.runs = {kind: cell.runs[kind] for kind in engines}
    return cell


def check_complete(kind: str, result: RunResult, requests: Sequence[Request]) -> None:
    """Every request made exactly its max_new_tokens (EOS is ignored): a short run would look fast."""
    made = {r.request_id: len(r.output_token_ids) for r in result.records}
    short = [r.request_id for r in requests if made.get(r.request_id) != r.sampling_params.max_new_tokens]
    if short:
        raise RuntimeError(f"{kind}: {len(short)} requests did not make their max_new_tokens: {short[:5]}")


workload_names = comma_choices(tuple(WORKLOADS))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--kv-tokens", type=positive_int, default=None,
                        help=f"the KV budget in token positions (default {DEFAULT_KV_TOKENS})")
    budget.add_argument("--kv-mib", type=float, default=None,
                        help="the KV budget in MiB of keys and values at the model's size per token")
    parser.add_argument("--block-size", type=positive_int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--paged-batch-size", type=positive_int, default=32,
                        help="the most rows of one paged step; memory, not this, should limit it")
    parser.add_argument("--workloads", type=workload_names, default=tuple(WORKLOADS))
    parser.add_argument("--num-requests", type=positive_int, default=128)
    parser.add_argument("--min-new-tokens", type=positive_int, default=8)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--exp-cap", type=positive_int, default=256, help="the exponential workload's longest output")
    parser.add_argument("--repeats", type=positive_int, default=2)
    args = parser.parse_args(argv)
    if args.kv_mib is not None and args.kv_mib <= 0:
        parser.error("--kv-mib must be positive")
    return args


def resolve_budget(args: argparse.Namespace, bytes_per_token: int) -> KVBudget:
    if args.kv_mib is not None:
        kv_tokens = int(args.kv_mib * 2**20) // bytes_per_token
    else:
        kv_tokens = args.kv_tokens or DEFAULT_KV_TOKENS
    return KVBudget(kv_tokens, args.block_size)


def main(argv: Sequence[str] | None = None) -> None:
    import torch

    args = parse_args(argv)
    bench_model = load_bench_model(args)
    loaded, device, threads = bench_model.loaded, bench_model.device, bench_model.threads
    bytes_per_token = kv_bytes_per_token(loaded.model.config, torch.empty((), dtype=getattr(torch, args.dtype))
                                         .element_size())  # fmt: skip
    try:
        budget = resolve_budget(args, bytes_per_token)
    except ValueError as error:
        raise SystemExit(f"bench/batching.py: {error}") from None
    runner = ProfiledRunner(loaded.model)
    print(
        f"model={loaded.spec.name} dtype={args.dtype} device={device} threads={threads} requests={args.num_requests} "
        f"repeats={args.repeats} kv_budget={budget.kv_tokens} tokens ({budget.kv_tokens * bytes_per_token / 2**20:.1f} "
        f"MiB) block_size={budget.block_size} paged_batch_size={args.paged_batch_size}",
        flush=True,
    )
    cells = []
    for workload in args.workloads:
        requests = WORKLOADS[workload](args).requests(lambda text: loaded.tokenizer(text)["input_ids"])
        started = time.perf_counter()
        try:
            cell = measure_cell(workload, requests, runner, budget, args, device, loaded.eos_token_id)
        except ValueError as error:
            raise SystemExit(f"bench/batching.py: {workload}: {error}") from None
        cells.append(cell)
        print(f"{workload}: max_seq_len={cell.max_seq_len}, so {cell.slots} slots for static and in-flight; "
              f"paged: {budget.num_blocks} blocks of {budget.block_size} ({time.perf_counter() - started:.0f} s)")
        print(format_table(TABLE_COLUMNS, cell.rows()))
        print(f"{workload}: {cell.ratio_line()}", flush=True)
    print(cells[0].ratio_line())


if __name__ == "__main__":
    main()
