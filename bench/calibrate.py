"""How often does the ci profile cry wolf, and how often does it catch a slowdown?

    python bench/calibrate.py [--model smollm2-135m] [--rounds 6]

One representative perf test of the ci profile (in-flight engine, largest
batch, uniform lengths) is measured in blocks of R repeats, as a test run
measures it. Each round measures one block of the unchanged runner and one of
the runner slowed by 10%, 25% and 50% (each step busy-waits that fraction of
its own compute time), in a rotating order so drift hits every condition alike.

Blocks are then compared exactly as ``pytest --perf`` judges a test: every
metric's one-sided Mann-Whitney U test, bounded for the whole ci session's
comparisons, plus the minimum effect. A comparison "fails" when any metric
regresses. Rates are given on raw samples and on samples normalised by the
machine probe timed before each repeat (what the plugin does).

- false alarm: unchanged block vs another unchanged block (every pair);
- detectN: unchanged block as baseline vs an N%-slowed block (every pair).

The last line reads
``false_alarm=<pct>% detect10=<pct>% detect25=<pct>% detect50=<pct>%``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.engine import build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.measure import configure_threads, machine_probe, max_seq_len_for, timed_run  # noqa: E402
from perfsuite.metrics import run_metrics  # noqa: E402
from perfsuite.models import DEFAULT_MODEL, load_model  # noqa: E402
from perfsuite.profiles import PROFILES  # noqa: E402
from perfsuite.session import METRICS, PROBE, normalize_to_machine_speed, repeat_samples  # noqa: E402
from perfsuite.stats import Policy, Verdict, compare, with_bonferroni_bound  # noqa: E402
from perfsuite.table import format_table  # noqa: E402
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


def fails(baseline, current, policy, num_comparisons, normalize):
    if normalize:
        baseline, current = normalize_to_machine_speed(baseline, current)
    comparisons = [compare(name, baseline[name], current[name], direction, policy) for name, direction in METRICS.items()]
    bounded = with_bonferroni_bound(comparisons, num_comparisons, policy)
    return any(c.verdict is Verdict.REGRESSED for c in bounded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=PROFILES["ci"].repeats)
    parser.add_argument("--alpha", type=float, nargs="+", default=[0.05])
    parser.add_argument("--min-effect", type=float, nargs="+", default=[0.05, 0.10, 0.15, 0.20, 0.25])
    parser.add_argument("--save", type=Path, help="write the measured blocks to this JSON file")
    parser.add_argument("--load", type=Path, help="re-analyse blocks saved by --save instead of measuring")
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
    engine = build_engine(
        "inflight",
        runner,
        batch_size=max(profile.batch_sizes),
        max_seq_len=max_seq_len_for(requests, loaded.max_context),
        eos_token_id=loaded.eos_token_id,
    )
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
    num_comparisons = CI_SESSION_TESTS * len(METRICS)
    rows, chosen = [], None
    for normalize, alpha, min_effect in itertools.product((False, True), args.alpha, args.min_effect):
        policy = Policy(alpha=alpha, min_effect=min_effect)
        aa_pairs = list(itertools.permutations(blocks[0.0], 2))
        rates = {
            "false_alarm": sum(fails(a, b, policy, num_comparisons, normalize) for a, b in aa_pairs) / len(aa_pairs)
        }
        for slowdown in SLOWDOWNS[1:]:
            pairs = [(a, b) for a in blocks[0.0] for b in blocks[slowdown]]
            detected = sum(fails(a, b, policy, num_comparisons, normalize) for a, b in pairs)
            rates[f"detect{round(slowdown * 100)}"] = detected / len(pairs)
        label = "probe" if normalize else "raw"
        rows.append([label, alpha, min_effect, *(f"{100 * r:.0f}%" for r in rates.values())])
        if normalize and alpha == 0.05 and min_effect == 0.10:
            chosen = rates
    headers = ["samples", "alpha", "min effect", "false alarm", "detect 10%", "detect 25%", "detect 50%"]
    print(format_table(headers, rows))
    chosen = chosen or rates
    print(" ".join(f"{name}={100 * rate:.0f}%" for name, rate in chosen.items()))


if __name__ == "__main__":
    main()
