"""What ``--perf-ray`` costs, and what a sweep gains from a cluster: issue 26's "Done when" measurement.

    .venv/bin/python bench/ray_overhead.py [--rounds 3] [--sweep-rounds 2] [--only overhead|sweep]
    .venv/bin/python bench/ray_overhead.py --rounds 1 --sweep-rounds 1 -k "test_throughput and fixed"  # plumbing

1. Overhead. The same smoke session,

       pytest --pyargs perfsuite.suites --perf --perf-model tiny-random --perf-profile smoke \\
              -p no:cacheprovider --perf-history none

   without Ray (A) and with ``--perf-ray local`` (B, a one-node cluster
   started inside the pytest process), as subprocesses, each in a fresh
   temporary directory (no baselines: every test is measured, then judged
   nothing), alternated A B A B ... for ``--rounds`` rounds so that drift of
   the machine hits both alike. Printed: each session's wall time (start-up,
   collection, the model's load or the cluster's start included) and exit
   code, the medians, and B/A.

2. A sweep over a 2-node cluster. There is no ``perfsuite sweep`` command: a
   sweep is ``pytest --pyargs perfsuite.suites.test_sweep --perf --perf-config
   SWEEP`` (docs/capacity-and-sweeps.md), and one controller measures one test
   at a time, so the cluster measures tests in parallel only with several
   controllers (pytest-xdist, docs/ray.md). So: a local cluster
   (``ray.cluster_utils.Cluster``: a head with no CPU and two nodes of 1 CPU,
   its files under a private ``RAY_TMPDIR``, as tests/test_ray_cluster.py
   starts it), and the sweep run in one process without Ray (A) against
   ``-n 2 --perf-ray ADDRESS`` (B: two controllers, each measuring on a node
   of its own), alternated for ``--sweep-rounds`` rounds. Printed: wall
   times and the speed-up A/B. On a machine of 2 cores this shows the
   mechanism, not a speed-up: both nodes share the same two cores (and the
   controllers and Ray's own processes use them too), so two tests measured
   at once each run about half as fast; on a real cluster each node brings
   its own cores or GPU.

Run it on a quiet machine: other work lands on whichever session is running.
Progress goes to stderr; the tables to stdout. ``-k`` narrows both sessions'
tests (default: all of the smoke profile's; the sweep's are its config's).
Needs Ray (``pip install 'perfsuite[ray]'``) and pytest-xdist.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SMOKE_SESSION = (
    "--pyargs", "perfsuite.suites", "--perf", "--perf-model", "tiny-random", "--perf-profile", "smoke",
    "-p", "no:cacheprovider", "--perf-history", "none",
)  # fmt: skip
SWEEP_SESSION = (
    "--pyargs", "perfsuite.suites.test_sweep", "--perf", "--perf-model", "tiny-random", "--perf-profile", "smoke",
    "-p", "no:cacheprovider", "--perf-history", "none", "--perf-config", "sweep.toml",
)  # fmt: skip
# 2 engines x 2 batch sizes x 2 arrival patterns = 8 cases, 8 requests each: enough tests for two controllers to share
SWEEP_CONFIG = """
[sweep]
engines = ["static", "inflight"]
batch_sizes = [2, 4]
prompts = [16]
output_lengths = [8]
arrivals = ["offline", {concurrency = 2}]
num_requests = 8
seed = 0
"""
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; the messages are a few kB
TAIL_CHARS = 3000
TWO_CORES_NOTE = (
    "note: on a machine of {cores} cores this shows the mechanism, not a speed-up: the two nodes share the same "
    "cores (with the controllers and Ray's own processes), so two tests measured at once each run about half as "
    "fast; on a real cluster each node brings its own cores or GPU"
)


@dataclass(frozen=True, slots=True)
class Session:
    """One timed pytest session: which side of the comparison, its wall time and its exit code."""

    side: str  # "A" or "B"
    seconds: float
    exit_code: int
    num_nodes: int = 0  # the Ray nodes its results.json names (0: measured without Ray)


def alternated(rounds: int) -> list[str]:
    """A B A B ...: each round runs both sides, A first, so drift of the machine hits both alike."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    return ["A", "B"] * rounds


def pytest_command(base: Sequence[str], extra: Sequence[str], keyword: str | None) -> list[str]:
    selection = ["-k", keyword] if keyword else []
    return [sys.executable, "-m", "pytest", *base, *selection, *extra]


def ratio_of_medians(sessions: Sequence[Session], numerator: str, denominator: str) -> float:
    """median(numerator's wall times) / median(denominator's)."""
    medians = {side: statistics.median(s.seconds for s in sessions if s.side == side) for side in "AB"}
    return medians[numerator] / medians[denominator]


def table(sessions: Sequence[Session], labels: dict[str, str]) -> str:
    lines = [f"{'round':>5}  {'side':<4}  {'what':<40}  {'wall s':>8}  exit  nodes"]
    for index, session in enumerate(sessions):
        lines.append(f"{index // 2 + 1:>5}  {session.side:<4}  {labels[session.side]:<40}  {session.seconds:>8.1f}  "
                     f"{session.exit_code:>4}  {session.num_nodes:>5}")  # fmt: skip
    for side in "AB":
        times = [s.seconds for s in sessions if s.side == side]
        lines.append(f"median {side} ({labels[side]}): {statistics.median(times):.1f} s over {len(times)} sessions")
    return "\n".join(lines)


def run_session(command: Sequence[str], side: str, setup: str = "") -> Session:
    """``command`` in a fresh temporary directory (with ``sweep.toml`` when ``setup`` holds one), timed."""
    with tempfile.TemporaryDirectory(prefix="ray-overhead-") as directory:
        if setup:
            Path(directory, "sweep.toml").write_text(setup)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=directory, capture_output=True, text=True, env=_private_ray_env(directory))
        seconds = time.perf_counter() - started
        num_nodes = nodes_named(Path(directory, "reports", "results.json"))
    if done.returncode not in (0, 5):  # 0: every test measured (and skipped: no baseline), 5: -k selected none
        print(f"{side}: exit {done.returncode}:\n{(done.stdout + done.stderr)[-TAIL_CHARS:]}", file=sys.stderr)
    print(f"{side}: {seconds:.1f} s, exit {done.returncode}", file=sys.stderr)
    return Session(side, seconds, done.returncode, num_nodes)


def nodes_named(results_json: Path) -> int:
    """The distinct Ray nodes a session's results.json names (did the tests spread?); 0 without one."""
    try:
        tests = json.loads(results_json.read_text())["tests"]
    except (OSError, ValueError, KeyError):
        return 0
    return len({test["node"] for test in tests if test.get("node")})


def _private_ray_env(directory: str) -> dict[str, str]:
    """``--perf-ray local`` keeps its files in a temporary directory of its own; RAY_TMPDIR keeps Ray's
    "current cluster" address there too, so no other job's ``ray.init("auto")`` finds this one."""
    env = dict(os.environ)
    env.setdefault("RAY_TMPDIR", directory)
    return env


def measure_commands(keyword: str | None) -> tuple[list[str], list[str]]:
    """The overhead's two sessions: A without Ray, B the same with ``--perf-ray local``."""
    return pytest_command(SMOKE_SESSION, (), keyword), pytest_command(SMOKE_SESSION, ("--perf-ray", "local"), keyword)


def measure_overhead(rounds: int, keyword: str | None) -> list[Session]:
    commands = dict(zip("AB", measure_commands(keyword)))
    return [run_session(commands[side], side) for side in alternated(rounds)]


def measure_sweep(rounds: int, keyword: str | None) -> list[Session]:
    from ray.cluster_utils import Cluster

    ray_dir = Path(tempfile.mkdtemp(prefix="psbench-"))  # short: a socket path must stay under 108 characters
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(ray_dir)
    head = {"num_cpus": 0, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
        cluster.wait_for_nodes()
        on_cluster = ("-n", "2", "--perf-ray", cluster.address)
        commands = {"A": pytest_command(SWEEP_SESSION, (), keyword),
                    "B": pytest_command(SWEEP_SESSION, on_cluster, keyword)}  # fmt: skip
        return [run_session(commands[side], side, SWEEP_CONFIG) for side in alternated(rounds)]
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(ray_dir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds of the smoke session (default 3)")
    parser.add_argument("--sweep-rounds", type=int, default=2, help="A/B rounds of the sweep (default 2)")
    parser.add_argument("--only", choices=("overhead", "sweep"), help="run one of the two measurements")
    parser.add_argument("-k", dest="keyword", help="pytest's -k for both sessions (default: all their tests)")
    args = parser.parse_args(argv)
    for name in ("rounds", "sweep_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start", file=sys.stderr)
    if args.only in (None, "overhead"):
        sessions = measure_overhead(args.rounds, args.keyword)
        print("overhead: the smoke session without and with --perf-ray local")
        print(table(sessions, {"A": "without Ray", "B": "--perf-ray local"}))
        print(f"ratio B/A (median with Ray over median without): {ratio_of_medians(sessions, 'B', 'A'):.2f}")
    if args.only in (None, "sweep"):
        sessions = measure_sweep(args.sweep_rounds, args.keyword)
        print("sweep: one process without Ray against -n 2 --perf-ray over a local cluster of 2 nodes of 1 CPU")
        print(table(sessions, {"A": "one process, no Ray", "B": "-n 2 --perf-ray, 2 nodes"}))
        print(f"speed-up A/B (median one process over median on the cluster): "
              f"{ratio_of_medians(sessions, 'A', 'B'):.2f}")  # fmt: skip
        print(TWO_CORES_NOTE.format(cores=os.cpu_count()))
    print(f"load average {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
