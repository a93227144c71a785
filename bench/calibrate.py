"""How often does the ci profile cry wolf, and how often does it catch a slowdown?

    python bench/calibrate.py [--model smollm2-135m] [--rounds 5]

One representative perf test of the ci profile (in-flight engine, largest
batch, uniform lengths) is measured in blocks of R repeats, as a test run
measures it. Each round measures one block of the unchanged runner and one of
the runner slowed by 10%, 25% and 50% (each step busy-waits that fraction of
its own compute time), in a rotating order so drift hits every condition alike.

Blocks are then judged exactly as ``pytest --perf`` judges them: each repeat
put on the machine speed by its probe, every metric's one-sided Mann-Whitney
U test, the session-wide correction and the minimum effect. Two rates:

- one test: a baseline block against a current block, judged as the first
  test of a ci session (the other comparisons not measured yet count as p=1);
  every pair of blocks;
- session: what CI sees. A simulated ci session draws each of its tests'
  (baseline, current) block pairs at random from the measured blocks, judges
  them in order as the plugin does (the bound at test time, the exact
  adjustment at the end) and fails if any test regresses. A/A sessions use
  unchanged blocks on both sides; a slowed session slows every test, as a
  slower kernel would. Benjamini-Hochberg (what the plugin uses) and Holm are
  both shown. The draws reuse few blocks, so read these as estimates.

The last line gives the session rates with Benjamini-Hochberg:
``false_alarm=<pct>% detect10=<pct>% detect25=<pct>% detect50=<pct>%``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.adapters import Backend, EngineConfig, build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.measure.probe import machine_probe  # noqa: E402
from perfsuite.measure.timing import configure_threads, max_seq_len_for, timed_run  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.models import DEFAULT_MODEL, load_model  # noqa: E402
from perfsuite.workload.profiles import PROFILES  # noqa: E402
from perfsuite.judge.catalogue import METRICS, PROBE, normalize_to_machine_speed  # noqa: E402
from perfsuite.measure.summaries import repeat_samples  # noqa: E402
from perfsuite.judge.stats import Policy, Verdict, adjust, adjust_interim, benjamini_hochberg, compare, holm  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import Workload  # noqa: E402

SLOWDOWNS = (0.0, 0.10, 0.25, 0.50)
CI_SESSION_TESTS = 18  # the ci profile's perf tests: 12 throughput + 4 Poisson + 2 concurrency


class SlowedRunner(ModelRunner):
    """Each step spins for ``slowdown`` times its own compute time: a uniformly slower model.

    It busy-waits rather than sleeps: on this VM a vCPU that sleeps runs the
    next step faster, so a 25% sleep made steps only about 5% slower.
    """

    slowdown = 0.0

    def execute(self, output, kv_cache):
        start = time.perf_counter()
        tokens = super().execute(output, kv_cache)
        if self.slowdown:
            deadline = time.perf_counter() + self.slowdown * (time.perf_counter() - start)
            while time.perf_counter() < deadline:
                pass
        return tokens


def measure_block(engine, runner, requests, slowdown, repeats):
    runner.slowdown = slowdown
    samples, probes = [], []
    for _ in range(repeats):
        probes.append(machine_probe("cpu"))
        samples.append(repeat_samples(run_metrics(timed_run(engine, requests, "cpu"))))
    return {**{name: [s[name] for s in samples] for name in METRICS}, PROBE: probes}


_COMPARED: dict[tuple[int, int, Policy], list] = {}


def comparisons_of(baseline, current, policy):
    """Raw comparisons of two blocks; simulated sessions draw the same pairs again and again."""
    key = (id(baseline), id(current), policy)
    if key not in _COMPARED:
        base, cur = normalize_to_machine_speed(baseline, current)
        _COMPARED[key] = [compare(name, base[name], cur[name], direction, policy) for name, direction in METRICS.items()]
    return _COMPARED[key]


def regressed(comparisons) -> bool:
    return any(c.verdict is Verdict.REGRESSED for c in comparisons)


def first_test_fails(baseline, current, policy, num_comparisons) -> bool:
    return regressed(adjust_interim(comparisons_of(baseline, current, policy), [], num_comparisons, policy))


def session_fails(pairs, policy, correction) -> bool:
    """Judge a simulated session's tests in order, as PerfSession does; True if anything regressed."""
    num_comparisons = len(pairs) * len(METRICS)
    earlier = []
    for baseline, current in pairs:
        raw = comparisons_of(baseline, current, policy)
        if regressed(adjust_interim(raw, earlier, num_comparisons, policy, correction)):
            return True
        earlier += raw
    return regressed(adjust(earlier, policy, correction))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=PROFILES["ci"].repeats)
    parser.add_argument("--alpha", type=float, nargs="+", default=[0.05])
    parser.add_argument("--min-effect", type=float, nargs="+", default=[0.05, 0.10, 0.20])
    parser.add_argument("--sessions", type=int, default=200, help="simulated ci sessions per condition (200)")
    parser.add_argument("--save", type=Path, help="write the measured blocks to this JSON file")
    parser.add_argument("--load", type=Path, help="re-analyse blocks saved by --save instead of measuring")
    parser.add_argument(
        "--analyse-repeats", type=int, help="judge only the first N repeats of each block (what R=N would give)"
    )
    args = parser.parse_args()
    if args.load:
        saved = json.loads(args.load.read_text())
        report({float(k): v for k, v in saved["blocks"].items()}, args)
        return

    threads = configure_threads(None)
    profile = PROFILES["ci"]
    loaded = load_model(args.model)
    runner = SlowedRunner(loaded.model)
    requests = Workload(profile.num_requests, profile.lengths["uniform"]).requests(
        lambda text: loaded.tokenizer(text)["input_ids"]
    )
    max_seq_len = max_seq_len_for(requests, loaded.max_context)
    backend = Backend(runner, list, loaded.eos_token_id, max_seq_len, str(runner.device))
    engine = build_engine("inflight", backend, EngineConfig(max(profile.batch_sizes), max_seq_len))
    engine.run(requests)  # warm-up, discarded
    print(f"model={loaded.spec.name} threads={threads} repeats={args.repeats} rounds={args.rounds}", flush=True)

    blocks = {slowdown: [] for slowdown in SLOWDOWNS}
    for round_index in range(args.rounds):
        shift = round_index % len(SLOWDOWNS)
        for slowdown in SLOWDOWNS[shift:] + SLOWDOWNS[:shift]:
            blocks[slowdown].append(measure_block(engine, runner, requests, slowdown, args.repeats))
        medians = {s: sorted(b[-1]["output_throughput"])[args.repeats // 2] for s, b in blocks.items()}
        probe = sorted(blocks[0.0][-1][PROBE])[args.repeats // 2]
        print(
            f"  round {round_index}: " + " ".join(f"{s:.0%}={m:.1f}tok/s" for s, m in medians.items())
            + f" probe={1e3 * probe:.1f}ms",
            flush=True,
        )

    if args.save:
        args.save.write_text(json.dumps({"repeats": args.repeats, "blocks": blocks}))
    report(blocks, args)


def report(blocks, args) -> None:
    if args.analyse_repeats:
        n = args.analyse_repeats
        blocks = {s: [{name: values[:n] for name, values in b.items()} for b in bs] for s, bs in blocks.items()}
        print(f"judging the first {n} repeats of each block")
    num_comparisons = CI_SESSION_TESTS * len(METRICS)
    rng = random.Random(0)
    unchanged = blocks[0.0]
    aa_pairs = list(itertools.permutations(unchanged, 2))
    slowed_pairs = {s: [(a, b) for a in unchanged for b in blocks[s]] for s in SLOWDOWNS[1:]}
    sessions = {"false_alarm": [[rng.choice(aa_pairs) for _ in range(CI_SESSION_TESTS)] for _ in range(args.sessions)]}
    for slowdown, pairs in slowed_pairs.items():
        sessions[f"detect{round(slowdown * 100)}"] = [
            [rng.choice(pairs) for _ in range(CI_SESSION_TESTS)] for _ in range(args.sessions)
        ]
    rows, chosen = [], None
    for alpha, min_effect in itertools.product(args.alpha, args.min_effect):
        policy = Policy(alpha=alpha, min_effect=min_effect)
        one_test = {"false_alarm": aa_pairs, **{f"detect{round(s * 100)}": p for s, p in slowed_pairs.items()}}
        rates = {k: sum(first_test_fails(a, b, policy, num_comparisons) for a, b in v) / len(v) for k, v in one_test.items()}
        rows.append(["one test", alpha, min_effect, *(f"{100 * r:.0f}%" for r in rates.values())])
        for label, correction in (("session, BH", benjamini_hochberg), ("session, Holm", holm)):
            rates = {k: sum(session_fails(s, policy, correction) for s in v) / len(v) for k, v in sessions.items()}
            rows.append([label, alpha, min_effect, *(f"{100 * r:.0f}%" for r in rates.values())])
            if correction is benjamini_hochberg and (chosen is None or min_effect == 0.10):
                chosen = rates
    headers = ["judged as", "alpha", "min effect", "false alarm", "detect 10%", "detect 25%", "detect 50%"]
    print(f"{CI_SESSION_TESTS} tests x {len(METRICS)} metrics a session; {args.sessions} simulated sessions each")
    print(format_table(headers, rows))
    print(" ".join(f"{name}={100 * rate:.0f}%" for name, rate in chosen.items()))


if __name__ == "__main__":
    main()
