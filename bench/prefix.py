"""Paged batching with and without prefix caching, at one KV memory budget, side by side on one machine.

    python bench/prefix.py [--model smollm2-135m | --model tiny-random] [--kv-tokens 8192] [--block-size 16]
                           [--batch-size 64] [--max-num-batched-tokens 2048] [--repeats 2]
                           [--groups 8 --prompts-per-group 8 --prefix-len 256 --suffix-len 32 --output-len 32]
                           [--sessions 4 --turns 4 --system-len 128 --user-len 32 --answer-len 32 --think-time 0]

Both engines (``paged`` and ``paged-prefix``) get the same pool: ``--kv-tokens
// --block-size`` blocks, ``--batch-size`` rows a step and a token budget of
``--max-num-batched-tokens``. Prompts are seeded random token ids (no
tokenizer needed), outputs ignore EOS.

Workloads (``perfsuite.workload``'s, as ``perfsuite run --workload`` and sweeps serve them):

- ``shared-prefix`` (``SharedPrefix``): ``--groups`` groups of
  ``--prompts-per-group`` prompts; the prompts of a group share a
  ``--prefix-len`` prefix and end in a ``--suffix-len`` suffix of their own;
  ``--output-len`` tokens each. All arrive at once, the groups interleaved in
  a seeded order, as independent users of a few system prompts would. A
  block is cached once the step that computed it has run, so a request
  admitted in the same step as the first of its group misses.
- ``multi-turn`` (``MultiTurn``): ``--sessions`` conversations of ``--turns``
  turns, all in one engine run. Turn 1 is a ``--system-len`` system prompt
  (one per session) and a ``--user-len`` message; each later turn follows the
  one before (``Request.follows``): it arrives ``--think-time`` seconds after
  that turn's answer (``--answer-len`` tokens) is complete, and its prompt is
  the previous prompt, that answer and a new message.

Each engine gets a throw-away warm-up run on an engine of its own (a warm-up
must not fill the cache being measured); each repeat builds fresh engines,
runs the two back to back, alternating the order between repeats, and every
ratio is taken within a repeat.

Printed per workload: each engine's median TTFT, output tok/s, prefill
tokens computed, prefix cache hit rate (hit prompt tokens / prompt tokens
looked up) and evicted blocks, the hit rate from the second turn on for
multi-turn (cached prompt tokens / prompt tokens of the turns that follow
another); then ``ttft prefix/paged=<x> throughput prefix/paged=<y>``. The
last line is the shared-prefix workload's throughput ratio (the first
workload's when it is not run) and the hit rate (multi-turn from its second
turn when it ran, else shared-prefix overall):

    prefix/paged=<throughput ratio> hit_rate=<y>
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
from perfsuite.engine import Engine  # noqa: E402
from perfsuite.engine.types import EngineCounters, Request, RunResult, SamplingParams  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import MultiTurn, SharedPrefix, Vocab  # noqa: E402

ENGINES = ("paged", "paged-prefix")
WORKLOADS = ("shared-prefix", "multi-turn")
DEFAULT_KV_TOKENS = 8192
FIRST_TOKEN_ID = 100  # clear of the special tokens at the start of a vocabulary


# -- the workloads ------------------------------------------------------------------------------------------------


def bench_vocab(vocab_size: int, eos_token_id: int | None) -> Vocab:
    return Vocab(vocab_size, special_ids=() if eos_token_id is None else (eos_token_id,), first_id=FIRST_TOKEN_ID)


def shared_prefix_workload(args: argparse.Namespace) -> SharedPrefix:
    return SharedPrefix(args.groups, args.prompts_per_group, args.prefix_len, args.suffix_len, args.output_len)


def multi_turn_workload(args: argparse.Namespace) -> MultiTurn:
    return MultiTurn(args.sessions, args.turns, prompt=args.system_len + args.user_len, message=args.user_len,
                     output=args.answer_len, think_time=args.think_time)  # fmt: skip


def workload_requests(workload: str, args: argparse.Namespace, vocab: Vocab) -> list[Request]:
    """Every request of ``workload``, arriving at once (a multi-turn run: its first turns; the rest follow)."""
    shape = shared_prefix_workload(args) if workload == "shared-prefix" else multi_turn_workload(args)
    num_starts = args.sessions if workload == "multi-turn" else shape.num_requests
    return shape.requests(vocab, args.seed, [0.0] * num_starts)


# -- measuring ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRun:
    """One engine's timed run of a workload (every turn of a multi-turn one)."""

    engine: str
    result: RunResult
    follow_up_ids: frozenset[str] = frozenset()  # the requests that follow another: turns from the second on

    @property
    def counters(self) -> EngineCounters:
        return self.result.counters

    def later_turns_hit_rate(self) -> float | None:
        """Cached prompt tokens over prompt tokens of the turns from the second on; None when there are none."""
        later = [record for record in self.result.records if record.request_id in self.follow_up_ids]
        num_prompt_tokens = sum(record.num_prompt_tokens for record in later)
        if not num_prompt_tokens:
            return None
        return sum(record.num_cached_tokens or 0 for record in later) / num_prompt_tokens

    @property
    def throughput(self) -> float:
        num_output_tokens = sum(len(record.output_token_ids) for record in self.result.records)
        return num_output_tokens / self.result.duration

    @property
    def median_ttft(self) -> float:
        return statistics.median(record.token_times[0] - record.arrival_time for record in self.result.records)

    def outputs(self) -> dict[str, tuple[int, ...]]:
        return self.result.outputs()


@dataclass
class WorkloadResult:
    """Both engines' runs of one workload, per repeat."""

    workload: str
    runs: dict[str, list[EngineRun]] = field(default_factory=lambda: {engine: [] for engine in ENGINES})

    def _ratios(self, value: Callable[[EngineRun], float]) -> float:
        return statistics.median(value(a) / value(b) for a, b in zip(self.runs["paged-prefix"], self.runs["paged"]))

    @property
    def ttft_ratio(self) -> float:
        """Median over repeats of paged-prefix's median TTFT over paged's, in the same repeat."""
        return self._ratios(lambda run: run.median_ttft)

    @property
    def throughput_ratio(self) -> float:
        return self._ratios(lambda run: run.throughput)

    def hit_rate(self, later_turns: bool = False) -> float:
        """paged-prefix's hit rate over its last repeat (every repeat starts cold and sees the same prompts)."""
        run = self.runs["paged-prefix"][-1]
        rate = run.later_turns_hit_rate() if later_turns else run.counters.prefix_cache_hit_rate
        return 0.0 if rate is None else rate

    def rows(self) -> list[list]:
        rows = []
        for engine, runs in self.runs.items():
            counters = runs[-1].counters
            rate = counters.prefix_cache_hit_rate
            rows.append([
                engine, f"{1e3 * statistics.median(run.median_ttft for run in runs):.0f}",
                f"{statistics.median(run.throughput for run in runs):.1f}", counters.num_prefill_tokens,
                "-" if rate is None else f"{rate:.0%}", counters.num_evicted_blocks, counters.num_preemptions,
            ])  # fmt: skip
        return rows

    def ratio_line(self) -> str:
        return f"ttft prefix/paged={self.ttft_ratio:.2f} throughput prefix/paged={self.throughput_ratio:.2f}"


TABLE_COLUMNS = ["engine", "median TTFT ms", "tok/s", "prefill tokens", "hit rate", "evicted", "preempted"]


def build_engines(runner, args: argparse.Namespace, max_seq_len: int, eos_token_id: int | None) -> dict[str, Engine]:
    """Both engines over the same pool, token budget and batch size."""
    backend = Backend(runner, list, eos_token_id, max_seq_len, str(runner.device))
    config = EngineConfig(
        args.batch_size, max_seq_len, max_num_batched_tokens=args.max_num_batched_tokens,
        num_kv_blocks=args.kv_tokens // args.block_size, kv_block_size=args.block_size,
    )  # fmt: skip
    return {kind: build_engine(kind, backend, config) for kind in ENGINES}


def serve(engine: Engine, requests: Sequence[Request]) -> EngineRun:
    follow_up_ids = frozenset(request.request_id for request in requests if request.follows is not None)
    return EngineRun(engine.name, engine.run(requests), follow_up_ids)


def measure(workload: str, runner, args: argparse.Namespace, vocab: Vocab, eos_token_id: int | None,
            max_context: int) -> WorkloadResult:  # fmt: skip
    requests = workload_requests(workload, args, vocab)
    max_seq_len = max(request.max_total_tokens for request in requests)
    if max_seq_len > max_context:
        raise ValueError(f"{workload} needs {max_seq_len} tokens of context, the model has {max_context}; "
                         "shorten the prompts or outputs")  # fmt: skip
    for engine in build_engines(runner, args, max_seq_len, eos_token_id).values():  # warm-up, then thrown away
        warmup_prompt = tuple(range(FIRST_TOKEN_ID, FIRST_TOKEN_ID + min(32, max_seq_len - 4)))
        engine.run([Request("warmup", warmup_prompt, SamplingParams(4, ignore_eos=True))])
    result = WorkloadResult(workload)
    for repeat in range(args.repeats):
        engines = build_engines(runner, args, max_seq_len, eos_token_id)
        order = list(ENGINES) if repeat % 2 == 0 else list(reversed(ENGINES))
        for kind in order:
            run = serve(engines[kind], requests)
            result.runs[kind].append(run)
            print(f"  {workload} repeat {repeat}: {kind:12s} {run.throughput:8.1f} tok/s, median TTFT "
                  f"{1e3 * run.median_ttft:.0f} ms", flush=True)  # fmt: skip
        check_same_outputs(workload, result.runs["paged"][-1], result.runs["paged-prefix"][-1])
    return result


def check_same_outputs(workload: str, paged: EngineRun, prefix: EngineRun) -> None:
    """Greedy decoding: both engines must produce the same tokens (a cache bug would show here first)."""
    different = [rid for rid, tokens in paged.outputs().items() if prefix.outputs().get(rid) != tokens]
    if different:
        raise RuntimeError(f"{workload}: paged-prefix's outputs differ from paged's for {different[:5]}")


def summary_line(results: dict[str, WorkloadResult]) -> str:
    """The last line: the shared-prefix throughput ratio and the hit rate (multi-turn's from turn 2)."""
    main = results.get("shared-prefix") or next(iter(results.values()))
    if "multi-turn" in results:
        hit_rate = results["multi-turn"].hit_rate(later_turns=True)
    else:
        hit_rate = main.hit_rate()
    return f"prefix/paged={main.throughput_ratio:.2f} hit_rate={hit_rate:.2f}"


workload_names = comma_choices(WORKLOADS)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, model_help="a model name (tiny-random for a quick check)")
    parser.add_argument("--kv-tokens", type=positive_int, default=DEFAULT_KV_TOKENS,
                        help="the KV pool of both engines, in token positions")  # fmt: skip
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--batch-size", type=positive_int, default=64,
                        help="the most requests running at once (default 64: the KV pool, not a row cap, is the limit)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=2048, help="tokens per step")
    parser.add_argument("--workloads", type=workload_names, default=WORKLOADS)
    parser.add_argument("--groups", type=positive_int, default=8)
    parser.add_argument("--prompts-per-group", type=positive_int, default=8)
    parser.add_argument("--prefix-len", type=positive_int, default=256)
    parser.add_argument("--suffix-len", type=positive_int, default=32)
    parser.add_argument("--output-len", type=positive_int, default=32)
    parser.add_argument("--sessions", type=positive_int, default=4)
    parser.add_argument("--turns", type=positive_int, default=4)
    parser.add_argument("--system-len", type=positive_int, default=128)
    parser.add_argument("--user-len", type=positive_int, default=32)
    parser.add_argument("--answer-len", type=positive_int, default=32)
    parser.add_argument("--think-time", type=float, default=0.0, help="seconds between an answer and the next turn")
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kv_tokens < args.block_size:
        parser.error(f"--kv-tokens {args.kv_tokens} holds no block of {args.block_size} tokens; raise it")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from perfsuite.engine.model_runner import ModelRunner

    args = parse_args(argv)
    bench_model = load_bench_model(args)
    loaded, device, threads = bench_model.loaded, bench_model.device, bench_model.threads
    runner = ModelRunner(loaded.model)
    vocab = bench_vocab(loaded.model.config.vocab_size, loaded.eos_token_id)
    print(f"model={loaded.spec.name} dtype={args.dtype} device={device} threads={threads} kv_tokens={args.kv_tokens} "
          f"({args.kv_tokens // args.block_size} blocks of {args.block_size}) batch_size={args.batch_size} "
          f"max_num_batched_tokens={args.max_num_batched_tokens} repeats={args.repeats}", flush=True)  # fmt: skip
    results = {}
    for workload in args.workloads:
        started = time.perf_counter()
        try:
            result = measure(workload, runner, args, vocab, loaded.eos_token_id, runner.max_context)
        except ValueError as error:
            raise SystemExit(f"bench/prefix.py: {workload}: {error}") from None
        results[workload] = result
        print(f"{workload} ({time.perf_counter() - started:.0f} s)")
        print(format_table(TABLE_COLUMNS, result.rows()))
        later = f" hit rate from turn 2: {result.hit_rate(later_turns=True):.0%}" if workload == "multi-turn" else ""
        print(f"{workload}: {result.ratio_line()} hit rate: {result.hit_rate():.0%}{later}", flush=True)
    print(summary_line(results))


if __name__ == "__main__":
    main()
