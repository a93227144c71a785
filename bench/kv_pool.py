"""How long a KV pool takes to build, and an engine to refuse a cache that does not fit, as they grow.

    python bench/kv_pool.py [--sizes 1e3,1e6,1e9,1e12] [--repeats 20]

The speed half of tests/test_kv_memory.py, which asserts only what is
built (no block each for a pool; no cache asked of the runner before an
oversized one is refused), since a wall-clock bound in the suite fails on a
loaded machine. Here each size is timed ``--repeats`` times with
``time.perf_counter`` after one warm-up, and the median and the most are
printed: a pool (``BlockManager``, lazy ``FreeIds``) should cost the same
at every size, and a refusal (``check_kv_memory`` before the runner's
``new_paged_kv_cache``) the same whatever the pool it refused. The engines
run on ``FakeRunner`` (tiny-random's KV layout, no model) with 1 GiB
available, so nothing here depends on the machine's memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.engine import BlockManager, kv_memory, paged_engine  # noqa: E402
from perfsuite.engine.fake_runner import FakeRunner  # noqa: E402
from perfsuite.engine.kv_memory import KVLayout, KVMemoryError  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402

TINY = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=4)  # tiny-random in float32


def timed(action: Callable[[], object], repeats: int) -> tuple[float, float]:
    """The median and the most seconds of ``action`` over ``repeats`` runs, after one thrown away."""
    action()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), max(seconds)


def refuse(num_blocks: int) -> None:
    runner = FakeRunner(kv_layout=TINY, device="cpu")  # a layout: the engine checks its cache before asking
    try:
        paged_engine(runner, decode_batch_size=2, max_seq_len=64, eos_token_id=None, num_kv_blocks=num_blocks)
    except KVMemoryError:
        return
    raise SystemExit(f"{num_blocks} blocks fit in 1 GiB: pick sizes above {2**30 // TINY.cache_bytes(16)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e3,1e6,1e9,1e12", help="pool sizes in blocks, comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(float(text)) for text in args.sizes.split(",")]
    kv_memory.available_memory = lambda device: 2**30  # as the test's fixture does: no machine in the figures
    rows = []
    for size in sizes:
        build = timed(lambda size=size: BlockManager(num_blocks=size, block_size=16), args.repeats)
        refusal = ("-", "-")
        if TINY.cache_bytes(16 * size) > 2**30:
            median, most = timed(lambda size=size: refuse(size), args.repeats)
            refusal = (f"{1e6 * median:.1f}", f"{1e6 * most:.1f}")
        rows.append((f"{size:.0e}", f"{1e6 * build[0]:.1f}", f"{1e6 * build[1]:.1f}", *refusal))
    headers = ("blocks", "build us (median)", "build us (most)", "refuse us (median)", "refuse us (most)")
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
