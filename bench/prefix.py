"""Paged batching with and without prefix caching, at one KV memory budget, side by side on one machine.

    python bench/prefix.py [--model smollm2-135m | --model tiny-random] [--kv-tokens 8192] [--block-size 16]
                           [--batch-size 16] [--max-num-batched-tokens 2048] [--repeats 2]
                           [--groups 8 --prompts-per-group 8 --prefix-len 256 --suffix-len 32 --output-len 32]
                           [--sessions 4 --turns 4 --system-len 128 --user-len 32 --answer-len 32]

Both engines (``paged`` and ``paged-prefix``) get the same pool: ``--kv-tokens
// --block-size`` blocks, ``--batch-size`` rows a step and a token budget of
``--max-num-batched-tokens``. Prompts are seeded random token ids (no
tokenizer needed), outputs ignore EOS.

Workloads (built here, on purpose apart from ``perfsuite.workload``):

- ``shared-prefix``: ``--groups`` groups of ``--prompts-per-group`` prompts;
  the prompts of a group share a ``--prefix-len`` prefix and end in a
  ``--suffix-len`` suffix of their own; ``--output-len`` tokens each. All
  arrive at once, round robin over the groups (the first prompt of every
  group, then the second, ...), as independent users of a few system prompts
  would. A block is cached once the step that computed it has run, so a
  request admitted in the same step as the first of its group misses.
- ``multi-turn``: ``--sessions`` conversations of ``--turns`` turns. Turn 1 is
  a ``--system-len`` system prompt (one per session) and a ``--user-len``
  message; each later turn's prompt is the previous prompt, the previous
  answer (``--answer-len`` tokens) and a new message. The engine serves a
  turn of every session at once, then the next (the answers of one turn make
  the next turn's prompts), over one engine whose cache lives across turns.

Each engine gets a throw-away warm-up run on an engine of its own (a warm-up
must not fill the cache being measured); each repeat builds fresh engines,
runs the two back to back, alternating the order between repeats, and every
ratio is taken within a repeat.

Printed per workload: each engine's median TTFT, output tok/s, prefill
tokens computed, prefix cache hit rate (hit prompt tokens / prompt tokens
looked up) and evicted blocks, the hit rate from the second turn on for
multi-turn; then ``ttft prefix/paged=<x> throughput prefix/paged=<y>``. The
last line is the shared-prefix workload's throughput ratio (the first
workload's when it is not run) and the hit rate (multi-turn from its second
turn when it ran, else shared-prefix overall):

    prefix/paged=<throughput ratio> hit_rate=<y>
"""

from __future__ import annotations

import argparse
import dataclasses
import operator
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine import Engine, build_engine  # noqa: E402
from perfsuite.engine.types import EngineCounters, Request, RunResult, SamplingParams  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402

ENGINES = ("paged", "paged-prefix")
WORKLOADS = ("shared-prefix", "multi-turn")
DEFAULT_KV_TOKENS = 8192
FIRST_TOKEN_ID = 100  # clear of the special tokens at the start of a vocabulary


# -- the workloads ------------------------------------------------------------------------------------------------


def random_tokens(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length))


def shared_prefix_requests(
    groups: int, prompts_per_group: int, prefix_len: int, suffix_len: int, output_len: int, vocab_size: int,
    seed: int = 0,
) -> list[Request]:  # fmt: skip
    """``groups`` x ``prompts_per_group`` requests, round robin over the groups; a group shares its prefix."""
    rng = random.Random(seed)
    prefixes = [random_tokens(rng, prefix_len, vocab_size) for _ in range(groups)]
    params = SamplingParams(output_len, ignore_eos=True)
    return [
        Request(f"g{group}-p{index}", prefixes[group] + random_tokens(rng, suffix_len, vocab_size), params)
        for index in range(prompts_per_group)
        for group in range(groups)
    ]


@dataclass(frozen=True)
class Conversation:
    """One multi-turn session so far: its last prompt and the answer to it (empty before the first turn)."""

    session: int
    prompt: tuple[int, ...]
    answer: tuple[int, ...] = ()


def first_turns(
    sessions: int, system_len: int, user_len: int, vocab_size: int, rng: random.Random
) -> list[Conversation]:
    return [
        Conversation(session, random_tokens(rng, system_len, vocab_size) + random_tokens(rng, user_len, vocab_size))
        for session in range(sessions)
    ]


def next_turns(conversations: Sequence[Conversation], user_len: int, vocab_size: int,
               rng: random.Random) -> list[Conversation]:  # fmt: skip
    """Each session's next prompt: the whole conversation so far and a new user message."""
    return [
        Conversation(c.session, c.prompt + c.answer + random_tokens(rng, user_len, vocab_size)) for c in conversations
    ]


def turn_requests(conversations: Sequence[Conversation], turn: int, answer_len: int) -> list[Request]:
    params = SamplingParams(answer_len, ignore_eos=True)
    return [Request(f"s{c.session}-t{turn}", c.prompt, params) for c in conversations]


# -- measuring ------------------------------------------------------------------------------------------------------


@dataclass
class EngineRun:
    """One engine's timed run of a workload (every turn of a multi-turn one)."""

    engine: str
    results: list[RunResult] = field(default_factory=list)  # one per turn; one in all for shared-prefix

    @property
    def counters(self) -> EngineCounters:
        return _sum_counters(result.counters for result in self.results)

    @property
    def later_turns_counters(self) -> EngineCounters:
        """The counters from the second turn on (a shared-prefix run has none)."""
        return _sum_counters(result.counters for result in self.results[1:])

    @property
    def duration(self) -> float:
        return sum(result.duration for result in self.results)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(record.output_token_ids) for result in self.results for record in result.records)

    @property
    def throughput(self) -> float:
        return self.num_output_tokens / self.duration

    @property
    def ttfts(self) -> list[float]:
        return [record.token_times[0] - record.arrival_time for result in self.results for record in result.records]

    @property
    def median_ttft(self) -> float:
        return statistics.median(self.ttfts)

    def outputs(self) -> dict[str, tuple[int, ...]]:
        return {rid: tokens for result in self.results for rid, tokens in result.outputs().items()}


def _sum_counters(counters) -> EngineCounters:
    """Several runs' counters as one run's: sums, and the largest of each peak."""
    total = EngineCounters()
    for each in counters:
        total = EngineCounters(**{
            f.name: (max if f.name.startswith("peak_") else operator.add)(getattr(total, f.name), getattr(each, f.name))
            for f in dataclasses.fields(EngineCounters)
        })  # fmt: skip
    return total


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
        rate = (run.later_turns_counters if later_turns else run.counters).prefix_cache_hit_rate
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
    return {
        kind: build_engine(
            kind, runner, batch_size=args.batch_size, max_seq_len=max_seq_len, eos_token_id=eos_token_id,
            max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.kv_tokens // args.block_size,
            kv_block_size=args.block_size,
        )  # fmt: skip
        for kind in ENGINES
    }


def run_shared_prefix(engine: Engine, requests: Sequence[Request]) -> EngineRun:
    return EngineRun(engine.name, [engine.run(requests)])


def run_multi_turn(engine: Engine, args: argparse.Namespace, vocab_size: int) -> EngineRun:
    """Every session's turns, turn by turn; each turn's prompts carry this engine's answers to the last."""
    rng = random.Random(args.seed)
    conversations = first_turns(args.sessions, args.system_len, args.user_len, vocab_size, rng)
    run = EngineRun(engine.name)
    for turn in range(args.turns):
        if turn:
            conversations = next_turns(conversations, args.user_len, vocab_size, rng)
        result = engine.run(turn_requests(conversations, turn, args.answer_len))
        run.results.append(result)
        outputs = result.outputs()
        conversations = [
            Conversation(c.session, c.prompt, outputs[f"s{c.session}-t{turn}"]) for c in conversations
        ]
    return run


def multi_turn_max_seq_len(args: argparse.Namespace) -> int:
    return args.system_len + args.turns * (args.user_len + args.answer_len)


def measure(workload: str, runner, args: argparse.Namespace, vocab_size: int, eos_token_id: int | None,
            max_context: int) -> WorkloadResult:  # fmt: skip
    if workload == "shared-prefix":
        requests = shared_prefix_requests(args.groups, args.prompts_per_group, args.prefix_len, args.suffix_len,
                                          args.output_len, vocab_size, args.seed)  # fmt: skip
        max_seq_len = args.prefix_len + args.suffix_len + args.output_len
        serve = lambda engine: run_shared_prefix(engine, requests)  # noqa: E731
    else:
        max_seq_len = multi_turn_max_seq_len(args)
        serve = lambda engine: run_multi_turn(engine, args, vocab_size)  # noqa: E731
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
            run = serve(engines[kind])
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


def workload_names(text: str) -> tuple[str, ...]:
    names = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown or text!r}; choose from {', '.join(WORKLOADS)}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from perfsuite.models import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model name (tiny-random for a quick check)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kv-tokens", type=positive_int, default=DEFAULT_KV_TOKENS,
                        help="the KV pool of both engines, in token positions")  # fmt: skip
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--batch-size", type=positive_int, default=16, help="the most requests running at once")
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
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.kv_tokens < args.block_size:
        parser.error(f"--kv-tokens {args.kv_tokens} holds no block of {args.block_size} tokens; raise it")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from perfsuite.engine.model_runner import ModelRunner
    from perfsuite.measure.timing import configure_threads, resolve_device
    from perfsuite.models import load_model

    args = parse_args(argv)
    device = resolve_device(args.device)
    threads = configure_threads(args.threads) if device == "cpu" else None
    loaded = load_model(args.model, device=device, dtype=args.dtype)
    runner = ModelRunner(loaded.model)
    vocab_size = loaded.model.config.vocab_size
    print(f"model={loaded.spec.name} dtype={args.dtype} device={device} threads={threads} kv_tokens={args.kv_tokens} "
          f"({args.kv_tokens // args.block_size} blocks of {args.block_size}) batch_size={args.batch_size} "
          f"max_num_batched_tokens={args.max_num_batched_tokens} repeats={args.repeats}", flush=True)  # fmt: skip
    results = {}
    for workload in args.workloads:
        started = time.perf_counter()
        try:
            result = measure(workload, runner, args, vocab_size, loaded.eos_token_id, runner.max_context)
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
