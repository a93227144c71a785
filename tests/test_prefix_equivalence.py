"""Prefix caching computes what unbatched greedy decoding computes, on prompts that share prefixes on purpose.

Over perfsuite's fake runner, whose paged cells hold a state of the whole
prefix (so a block reused under another prefix, or overwritten while shared,
gives wrong tokens or fails the read), and whose reference is pure Python:
cheap enough for many examples. ``shared_prefix_scenarios`` draws identical
prompts, prompts sharing 1..n full blocks then diverging mid-block, prompts
that are a prefix of another, arrivals while the sharer is still prefilling
(small token budgets) and a pool tight enough to evict cached blocks and
preempt sharers.

Mutants the property kills (each a seam below; ``test_each_mutant_is_killed``
checks it on every CI run, with no ``@example`` to help, generation only;
the count is the generated example that first failed, under the
derandomized ``ci`` profile, as the test prints it):

- **hash without the parent** (a block is found by its own tokens wherever
  it sits): killed at example 18 (the fake runner reads a block computed
  under another prefix);
- **eviction of a referenced block** (a hit leaves the block among the
  evictable ones, so it is handed out while a table holds it): killed at
  example 6 (a cell overwritten under its reader);
- **reuse of a partially filled block** (the last, partial block is cached
  and shared, so two requests write into it): killed at example 41 (outputs
  differ from the reference);
- **refcount not decremented on preemption** (the preempted request's table
  is dropped, its blocks still counted as held): killed at example 6 (the
  leaked blocks stall the engine).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings

import perfsuite.engine.engine as engine_module
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.engine.paged_scheduler import PagedScheduler
from perfsuite.engine.prefix_cache import CachedBlock, PrefixCachingBlockManager, block_hash
from perfsuite.engine.sequence import SequenceStatus
from perfsuite.testing import CachedReference, check_runner, shared_prefix_scenarios

VOCAB_SIZE = 31  # few token ids, so drawn suffixes collide with stems now and then
MAX_EXAMPLES = 120


@dataclass(frozen=True)
class _FakeOutput:
    token_ids: tuple[int, ...]
    top2_margins: tuple[float, ...]


class _FakeDecoder:
    """Unbatched greedy decoding of the fake model; every margin 1.0, so no flip is a near-tie."""

    def generate(self, request):
        tokens = fake_reference(request.prompt_token_ids, request.sampling_params, None, VOCAB_SIZE)
        return _FakeOutput(tokens, (1.0,) * len(tokens))


@functools.lru_cache(maxsize=None)
def _reference() -> CachedReference:
    return CachedReference(_FakeDecoder())


class _Tally:
    """Counts the examples a property ran, and what the prefix engine did in them."""

    def __init__(self) -> None:
        self.num_examples = 0
        self.num_with_hits = 0
        self.num_with_evictions = 0
        self.num_with_preemptions = 0
        self.first_failure: int | None = None  # the example that first failed


def _prefix_property(tally: _Tally, shrink: bool = True):
    phases = tuple(Phase) if shrink else (Phase.generate,)  # a mutant's test needs the failure, not its shrinking
    @settings(max_examples=MAX_EXAMPLES, phases=phases, report_multiple_bugs=False,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(scenario=shared_prefix_scenarios(vocab_size=VOCAB_SIZE))
    def prefix_engine_equals_reference(scenario):
        tally.num_examples += 1
        try:
            check = check_runner(FakeRunner(VOCAB_SIZE), scenario, _reference(), eos_token_id=None)
            check.assert_passed()
        except Exception:
            tally.first_failure = tally.first_failure or tally.num_examples
            raise
        counters = check.counters("paged-prefix")
        tally.num_with_hits += counters.num_prefix_cache_hit_tokens > 0
        tally.num_with_evictions += counters.num_evicted_blocks > 0
        tally.num_with_preemptions += counters.num_preemptions > 0
        event(f"prefix cache hit: {'yes' if counters.num_prefix_cache_hit_tokens else 'no'}")

    return prefix_engine_equals_reference


def test_the_prefix_engine_equals_the_reference_on_shared_prefixes():
    tally = _Tally()
    _prefix_property(tally)()
    print(f"{tally.num_examples} examples: {tally.num_with_hits} hit, {tally.num_with_evictions} evicted, "
          f"{tally.num_with_preemptions} preempted")  # fmt: skip
    # the strategy must exercise what it is for, or a passing property proves little
    assert tally.num_with_hits >= tally.num_examples // 2
    assert tally.num_with_evictions >= tally.num_examples // 10
    assert tally.num_with_preemptions >= tally.num_examples // 10


# -- mutants -------------------------------------------------------------------------------------------------------


def _hash_without_parent(parent, tokens):
    return block_hash(None, tokens)


class _HitStaysEvictable(PrefixCachingBlockManager):
    """A hit takes a reference but leaves the block evictable: it can be handed out while a table holds it."""

    def _share(self, request_id, cached_blocks):
        evictable = [block for block in cached_blocks if block in self._evictable]
        table = super()._share(request_id, cached_blocks)
        for block in evictable:
            self._evictable[block] = None
        return table

    def _release_block(self, block):
        if block in self._evictable:  # already counted free; keep the mutant from crashing on its own books
            self._ref_counts.pop(block, None)
            return
        super()._release_block(block)


class _PartialBlockReuse(PrefixCachingBlockManager):
    """Caches a request's last, partially filled block too, and shares it with a request whose tokens continue it."""

    def cache_computed_blocks(self, request_id, token_ids, num_computed_tokens):
        super().cache_computed_blocks(request_id, token_ids, num_computed_tokens)
        hashes, table = self._hashes[request_id], self._tables[request_id]
        num_full, rest = divmod(num_computed_tokens, self.block_size)
        if rest and len(hashes) == num_full:
            tokens = tuple(token_ids[num_full * self.block_size : num_computed_tokens])
            partial_hash = self._hash_block(hashes[-1] if hashes else None, tokens)
            if partial_hash not in self._block_by_hash and table[num_full] not in self._cached:
                self._block_by_hash[partial_hash] = table[num_full]
                self._cached[table[num_full]] = CachedBlock(partial_hash, tokens)

    def cached_prefix(self, token_ids):
        blocks = list(super().cached_prefix(token_ids))
        start = len(blocks) * self.block_size
        parent = self._cached[blocks[-1]].block_hash if blocks else None
        for size in range(min(self.block_size, len(token_ids) - 1 - start), 0, -1):
            tokens = tuple(token_ids[start : start + size])
            block = self._block_by_hash.get(self._hash_block(parent, tokens))
            if block is not None and self._cached[block].token_ids == tokens:
                return (*blocks, block)
        return tuple(blocks)


def _preempt_keeping_references(self, sequence):
    """As ``PagedScheduler._preempt``, but the table is dropped without giving its references back."""
    del self.kv_cache._tables[sequence.request_id]
    self.kv_cache._forget(sequence.request_id)
    self._free_rows.push(sequence.slot)
    sequence.slot = None
    self.running.remove(sequence)
    sequence.num_previously_computed_tokens = max(sequence.num_previously_computed_tokens, sequence.num_computed_tokens)
    sequence.num_computed_tokens = 0
    sequence.status = SequenceStatus.WAITING
    self.waiting.appendleft(sequence)


def _apply_mutant(monkeypatch, name):
    if name == "hash-without-parent":
        manager = functools.partial(PrefixCachingBlockManager, hash_block=_hash_without_parent)
        monkeypatch.setattr(engine_module, "PrefixCachingBlockManager", manager)
    elif name == "evicts-a-referenced-block":
        monkeypatch.setattr(engine_module, "PrefixCachingBlockManager", _HitStaysEvictable)
    elif name == "reuses-a-partial-block":
        monkeypatch.setattr(engine_module, "PrefixCachingBlockManager", _PartialBlockReuse)
    elif name == "preemption-keeps-references":
        monkeypatch.setattr(PagedScheduler, "_preempt", _preempt_keeping_references)


MUTANTS = ("hash-without-parent", "evicts-a-referenced-block", "reuses-a-partial-block", "preemption-keeps-references")


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_is_killed(monkeypatch, mutant):
    _apply_mutant(monkeypatch, mutant)
    tally = _Tally()
    with pytest.raises((AssertionError, KeyError, RuntimeError, IndexError)) as failure:
        _prefix_property(tally, shrink=False)()
    print(f"{mutant}: killed at example {tally.first_failure}: {str(failure.value).splitlines()[0][:300]}")
    assert tally.first_failure is not None
