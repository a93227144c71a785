"""KV cache accounting: which request owns which fixed-shape cache slot.

Pure Python. The tensors live in ``perfsuite.engine.layers.KVCache``; this
module only decides who may write where, with nano-vllm's check/act pairs.
"""

from __future__ import annotations

from perfsuite.engine.free_ids import FreeIds


class KVCacheManager:
    """Hands out ``num_slots`` slots of ``max_seq_len`` tokens each.

    The lowest free slot is always handed out first, so slot use is
    deterministic and a timeline of slots reads top to bottom.
    """

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {max_seq_len}")
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self._free_slots = FreeIds(num_slots)
        self._slot_of: dict[str, int] = {}

    # A slot is a block of ``max_seq_len`` tokens: the names the paged
    # ``BlockManager`` shares, so KV use is counted alike for every engine.
    @property
    def num_blocks(self) -> int:
        return self.num_slots

    @property
    def block_size(self) -> int:
        return self.max_seq_len

    @property
    def num_used_blocks(self) -> int:
        return self.num_used_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def num_used_slots(self) -> int:
        return len(self._slot_of)

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def owners(self) -> dict[str, int]:
        return dict(self._slot_of)

    def fits(self, num_tokens: int) -> bool:
        """Whether a request of ``num_tokens`` could ever fit one slot."""
        return num_tokens <= self.max_seq_len

    def can_allocate(self, num_tokens: int) -> bool:
        return bool(self._free_slots) and self.fits(num_tokens)

    def allocate(self, request_id: str, num_tokens: int) -> int:
        if request_id in self._slot_of:
            raise RuntimeError(f"request {request_id!r} already owns slot {self._slot_of[request_id]}")
        if not self.can_allocate(num_tokens):
            raise RuntimeError(
                f"cannot allocate {num_tokens} tokens for {request_id!r}: "
                f"{self.num_free_slots} free slots of {self.max_seq_len} tokens; call can_allocate first"
            )
        slot = self._free_slots.pop()
        self._slot_of[request_id] = slot
        return slot

    def free(self, request_id: str) -> None:
        slot = self._slot_of.pop(request_id)
        self._free_slots.push(slot)
