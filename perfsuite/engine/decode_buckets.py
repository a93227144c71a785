"""Batch-size buckets for decode steps captured with static shapes.

A captured step serves one number of rows. A paged engine's decode steps run
any number of requests up to its ``max_num_seqs``, so each step is padded to
the smallest bucket that holds it and one step per bucket is captured when
the engine is built: 1, 2, 4, 8, then every multiple of 8, and
``max_num_seqs`` itself (vLLM's default capture sizes follow the same
pattern). Padding costs at most 7 rows past 8, at most half below.

Pure Python, so the bucketing is tested without torch.
"""

from __future__ import annotations

import bisect

SMALL_BUCKETS = (1, 2, 4)
BUCKET_STEP = 8


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The row counts to capture, ascending, the last being ``max_num_seqs``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = {size for size in SMALL_BUCKETS if size < max_num_seqs}
    sizes.update(range(BUCKET_STEP, max_num_seqs, BUCKET_STEP))
    sizes.add(max_num_seqs)
    return tuple(sorted(sizes))


def bucket_for(buckets: tuple[int, ...], num_rows: int) -> int:
    """The smallest bucket of at least ``num_rows`` rows."""
    if num_rows < 1:
        raise ValueError(f"a decode step needs at least one row, got {num_rows}")
    index = bisect.bisect_left(buckets, num_rows)
    if index == len(buckets):
        raise ValueError(
            f"a decode step of {num_rows} rows is larger than the largest captured bucket, {buckets[-1]} "
            "(the engine's max_num_seqs): build the engine with a decode batch size of at least "
            f"{num_rows}"
        )
    return buckets[index]
