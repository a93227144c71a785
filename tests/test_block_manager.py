"""The paged KV accounting: blocks handed out lowest first, tables that grow, and clear refusals."""

from __future__ import annotations

import pytest

from perfsuite.engine.block_manager import BlockManager


def test_tables_grow_block_by_block_from_the_lowest_free_block():
    blocks = BlockManager(num_blocks=5, block_size=4)
    assert blocks.allocate("a", 5) == (0, 1)  # 5 tokens need 2 blocks of 4
    assert blocks.allocate("b", 1) == (2,)
    assert blocks.append_slots("a", 8) == (0, 1)  # still fits its two blocks
    assert blocks.append_slots("a", 9) == (0, 1, 3)
    assert (blocks.num_used_blocks, blocks.num_free_blocks) == (4, 1)
    blocks.free("a")
    assert blocks.allocate("c", 12) == (0, 1, 3)  # the lowest free blocks again
    assert blocks.owners() == {"b": (2,), "c": (0, 1, 3)}


def test_checks_say_whether_the_act_would_succeed():
    blocks = BlockManager(num_blocks=3, block_size=2)
    assert blocks.can_allocate(6) and not blocks.can_allocate(7)
    blocks.allocate("a", 3)
    assert blocks.can_append("a", 6) and not blocks.can_append("a", 7)
    assert not blocks.can_allocate(3) and blocks.can_allocate(2)
    assert blocks.fits(6) and not blocks.fits(7)
    assert blocks.num_blocks_for(0) == 0 and blocks.num_blocks_for(2) == 1 and blocks.num_blocks_for(3) == 2


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        (lambda b: b.allocate("a", 1), r"'a' already holds blocks \[0\]; grow its table with append_slots"),
        (lambda b: b.allocate("b", 13), r"cannot allocate 13 tokens \(4 blocks of 4\).*3 blocks free; call can_alloc"),
        (lambda b: b.append_slots("a", 17), r"cannot grow 'a' to 17 tokens: it needs 4 more blocks.*preempt"),
        (lambda b: b.append_slots("x", 1), r"'x' holds no blocks to grow; give it its first blocks with allocate"),
        (lambda b: b.can_append("x", 1), r"'x' holds no blocks to grow"),
        (lambda b: b.free("x"), r"'x' holds no blocks: it was never allocated or is freed already; free each"),
        (lambda b: b.block_table("x"), r"'x' has no block table; allocate blocks for it first"),
    ],
)
def test_misuse_names_the_problem_and_the_fix(misuse, message):
    blocks = BlockManager(num_blocks=4, block_size=4)
    blocks.allocate("a", 1)
    with pytest.raises(RuntimeError, match=message):
        misuse(blocks)
    assert blocks.owners() == {"a": (0,)} and blocks.num_free_blocks == 3, "a refused act changed nothing"


def test_a_request_freed_twice_is_refused_the_second_time():
    blocks = BlockManager(num_blocks=2, block_size=4)
    blocks.allocate("a", 4)
    blocks.free("a")
    with pytest.raises(RuntimeError, match="freed already"):
        blocks.free("a")
    assert blocks.num_free_blocks == 2


@pytest.mark.parametrize(("num_blocks", "block_size", "message"), [
    (0, 16, "num_blocks must be an integer >= 1, got 0"),
    (4, 0, r"block_size must be an integer >= 1 \(tokens per block\), got 0"),
    (2.5, 16, "num_blocks must be an integer >= 1, got 2.5"),
])
def test_a_pool_needs_positive_sizes(num_blocks, block_size, message):
    with pytest.raises(ValueError, match=message):
        BlockManager(num_blocks, block_size)
