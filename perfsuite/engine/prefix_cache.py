"""Prefix caching: full KV blocks found again by their content and shared between requests.

Pure Python (vLLM v1's automatic prefix caching, nano-vllm's block hashes).
A block is *cached* once every token in it is computed: it is then known by
``block_hash(parent_hash, tokens)``, a digest chained over its own tokens and
its parent block's hash, so a hash names the whole prefix up to the block's
end (the keys and values at a position depend on every token before it, so
two equal blocks under different prefixes hold different KV).

A new request, or a preempted one readmitted, looks its tokens up block by
block (``cached_prefix``) and shares the longest run of cached full blocks;
only the rest is prefilled. Two rules keep every shared block read-only:

- only full, computed blocks are cached, so the block a request is still
  writing (its last, partial one) is never found by another;
- a lookup stops one token short of the request's tokens, so at least one
  token is computed to give the logits to sample from (as vLLM does); a
  prompt of whole blocks recomputes its last block in a fresh block.

Blocks are reference counted. A block whose count drops to 0 and that is
cached stays in the pool, findable, among the *evictable* blocks in least
recently freed order; those count as free. A block is handed out from the
never-cached free blocks first (lowest id first), and only when there are
none is the least recently freed evictable block evicted (its hash
forgotten) and reused. A block with a count above 0 is never handed out.

The hash is ``blake2b`` over the parent digest and the tokens' bytes:
deterministic across processes (Python's ``hash`` of a str is salted per
process), so a run replays block for block. A hash hit is checked against
the block's stored tokens, so even a collision cannot give wrong outputs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfsuite.engine.block_manager import BlockManager

BlockHash = bytes
HashBlock = Callable[[BlockHash | None, tuple[int, ...]], BlockHash]


def block_hash(parent_hash: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """The digest of a full block: its parent's digest (None for a first block) chained with its tokens."""
    digest = hashlib.blake2b(parent_hash or b"", digest_size=16)
    for token in token_ids:
        digest.update(token.to_bytes(8, "little", signed=True))
    return digest.digest()


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """What a cached block holds: its hash and the tokens it was computed for (checked on every hit)."""

    block_hash: BlockHash
    token_ids: tuple[int, ...]


class PrefixCachingBlockManager(BlockManager):
    """A ``BlockManager`` whose full blocks are cached by content and shared by reference count.

    ``hash_block`` is the chained hash (``block_hash``); tests swap it to
    check that the properties catch a hash that forgets the parent.
    """

    has_prefix_cache = True

    def __init__(self, num_blocks: int, block_size: int, *, hash_block: HashBlock = block_hash) -> None:
        super().__init__(num_blocks, block_size)
        self._hash_block = hash_block
        self._ref_counts: dict[int, int] = {}  # every block held by a table: how many tables hold it
        self._block_by_hash: dict[BlockHash, int] = {}
        self._cached: dict[int, CachedBlock] = {}  # block -> what it holds, for every cached block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by no table; least recent first
        self._hashes: dict[str, list[BlockHash]] = {}  # request -> hashes of its leading full computed blocks
        self._num_evicted_blocks = 0

    # -- what the pool holds --------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks no table holds: never cached, or cached and evictable."""
        return super().num_free_blocks + len(self._evictable)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_evicted_blocks(self) -> int:
        return self._num_evicted_blocks

    def ref_count(self, block: int) -> int:
        """How many block tables hold ``block``."""
        return self._ref_counts.get(block, 0)

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def evictable_blocks(self) -> tuple[int, ...]:
        """The cached blocks no table holds, the next to be evicted first."""
        return tuple(self._evictable)

    # -- lookups and caching ------------------------------------------------

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The cached blocks holding ``token_ids``' longest prefix of full blocks, one token short of all."""
        blocks: list[int] = []
        parent: BlockHash | None = None
        for index in range((len(token_ids) - 1) // self.block_size):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            parent = self._hash_block(parent, tokens)
            block = self._block_by_hash.get(parent)
            if block is None or self._cached[block].token_ids != tokens:
                break
            blocks.append(block)
        return tuple(blocks)

    def full_block_hashes(self, token_ids: Sequence[int], first: int, stop: int) -> list[BlockHash]:
        """The chained hashes of ``token_ids``' full blocks ``first`` to ``stop`` (exclusive; fewer if not full)."""
        hashes: list[BlockHash] = []
        parent: BlockHash | None = None
        for index in range(min(stop, len(token_ids) // self.block_size)):
            parent = self._hash_block(parent, tuple(token_ids[index * self.block_size : (index + 1) * self.block_size]))
            if index >= first:
                hashes.append(parent)
        return hashes

    def num_blocks_taken(self, num_tokens: int, cached_blocks: tuple[int, ...] = ()) -> int:
        newly_held = sum(1 for block in cached_blocks if block in self._evictable)
        return self.num_blocks_for(num_tokens) - len(cached_blocks) + newly_held

    def cache_computed_blocks(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Cache ``request_id``'s full blocks whose tokens are all computed (``token_ids[:num_computed_tokens]``).

        A block whose content is cached already (in another block: two
        requests prefilled the same prefix at once) stays uncached; it goes
        back to the free blocks when its request lets it go.
        """
        table = self._table(request_id, "has no block table; allocate blocks for it first")
        hashes = self._hashes[request_id]
        for index in range(len(hashes), num_computed_tokens // self.block_size):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            hashes.append(self._hash_block(hashes[-1] if hashes else None, tokens))
            block = table[index]
            if hashes[-1] not in self._block_by_hash and block not in self._cached:
                self._block_by_hash[hashes[-1]] = block
                self._cached[block] = CachedBlock(hashes[-1], tokens)

    # -- the pool's moves ---------------------------------------------------

    def _share(self, request_id: str, cached_blocks: tuple[int, ...]) -> list[int]:
        for block in cached_blocks:
            self._evictable.pop(block, None)
            self._ref_counts[block] = self._ref_counts.get(block, 0) + 1
        self._hashes[request_id] = [self._cached[block].block_hash for block in cached_blocks]
        return list(cached_blocks)

    def _take_free_block(self) -> int:
        if super().num_free_blocks:
            block = super()._take_free_block()
        else:
            block, _ = self._evictable.popitem(last=False)
            self._evict(block)
        self._ref_counts[block] = 1
        return block

    def _evict(self, block: int) -> None:
        del self._block_by_hash[self._cached.pop(block).block_hash]
        self._num_evicted_blocks += 1

    def _release_block(self, block: int) -> None:
        self._ref_counts[block] -= 1
        if self._ref_counts[block]:
            return
        del self._ref_counts[block]
        if block in self._cached:
            self._evictable[block] = None
        else:
            super()._release_block(block)

    def _forget(self, request_id: str) -> None:
        del self._hashes[request_id]
