"""What an engine's KV cache will take, checked against what its device has left, before anything is allocated.

One bad sizing (``--perf-kv-blocks 1000000000``) used to grow the process
until the kernel killed it, with no message. Every engine size that can come
from a user (a pool, a batch size, a cache length) is checked here first.
``KVLayout`` is the bytes of one token's keys and values; ``KVSizing`` is a
cache as an engine's knobs size it; ``check_kv_memory`` raises
``KVMemoryError``, one line naming the knob to lower and how far, when the
cache would not fit. Callers that know which option set the knob (the pytest
plugin, the command line) say that option instead (``KVMemoryError.message``).

Pure Python: torch is imported only to ask a CUDA device for its memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.host import format_bytes

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}

# The share of the memory available when an engine is built that its KV cache may take. The rest is left for
# what the cache does not count: each step's activations and attention temporaries (a packed step gathers a
# layer's keys and values per request), index and mask tensors, the allocator's rounding, the Python process's
# own growth and, on the CPU, the page cache that other work needs. vLLM's default gpu_memory_utilization is
# the same 0.9 of a whole GPU; here it is of what is still free, after the weights and any other engine.
KV_MEMORY_SHARE = 0.9

_UNLIMITED = 1 << 60  # a cgroup v1 memory limit this large means none was set


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The cache's per-token cells: keys and values of ``num_kv_heads`` x ``head_dim`` in each layer.

    Both caches hold two such tensors, keys and values: ``[layers, slots,
    kv_heads, max_seq_len, head_dim]`` (``layers.KVCache``) or ``[layers,
    num_blocks, block_size, kv_heads, head_dim]`` (``layers.PagedKVCache``).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes  # 2: K and V

    def cache_bytes(self, num_tokens: int) -> int:
        return num_tokens * self.bytes_per_token

    @classmethod
    def of_model_config(cls, config: Mapping[str, Any], dtype: str) -> KVLayout:
        """A Llama model's layout in ``dtype`` from its config.json values (read as ``Decoder.from_hf`` reads them)."""
        num_heads = config["num_attention_heads"]
        return cls(
            num_layers=config["num_hidden_layers"],
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            dtype_bytes=DTYPE_BYTES[dtype],
        )


@dataclass(frozen=True, slots=True)
class KVSizing:
    """A cache of ``num_tokens`` token cells, as an engine's ``knob`` sizes it, ``tokens_per_unit`` tokens a unit."""

    cache: str  # what it is, for messages: "the paged engine's KV pool of 8 blocks of 16 tokens"
    num_tokens: int
    knob: str  # the engine parameter to lower: "num_kv_blocks", "batch_size", ...
    tokens_per_unit: int


def slot_cache(engine: str, knob: str, num_slots: int, max_seq_len: int) -> KVSizing:
    """A static or in-flight engine's cache: one slot of ``max_seq_len`` tokens per request of the batch."""
    cache = f"the {engine} engine's KV cache of {num_slots} slots of {max_seq_len} tokens"
    return KVSizing(cache, num_slots * max_seq_len, knob, max_seq_len)


def paged_pool(num_blocks: int, block_size: int) -> KVSizing:
    """A paged engine's pool of ``num_blocks`` blocks."""
    cache = f"the paged engine's KV pool of {num_blocks} blocks of {block_size} tokens"
    return KVSizing(cache, num_blocks * block_size, "num_kv_blocks", block_size)


def default_paged_pool(decode_batch_size: int, blocks_per_request: int, block_size: int) -> KVSizing:
    """A paged engine's default pool: ``blocks_per_request`` blocks for each request of the batch."""
    num_blocks = decode_batch_size * blocks_per_request
    cache = (
        f"the paged engine's default KV pool of {num_blocks} blocks of {block_size} tokens "
        f"({blocks_per_request} blocks for each of decode_batch_size {decode_batch_size})"
    )
    return KVSizing(cache, num_blocks * block_size, "decode_batch_size", blocks_per_request * block_size)


def usable_bytes(available: int) -> int:
    return int(available * KV_MEMORY_SHARE)


class KVMemoryError(ValueError):
    """A KV cache that would not fit its device's memory; raised before any of it is allocated."""

    def __init__(self, sizing: KVSizing, layout: KVLayout, device: str, available: int) -> None:
        self.sizing = sizing
        self.layout = layout
        self.device = device
        self.available = available
        super().__init__(self.message())

    @property
    def needed(self) -> int:
        return self.layout.cache_bytes(self.sizing.num_tokens)

    @property
    def max_units(self) -> int:
        """The largest value of the knob whose cache fits (0: not even one unit)."""
        return usable_bytes(self.available) // (self.layout.bytes_per_token * self.sizing.tokens_per_unit)

    def message(self, option: str | None = None) -> str:
        """One line: the cache, bytes needed and available, and the fix, naming ``option`` (default: the knob)."""
        knob = option or self.sizing.knob
        if self.max_units:
            fix = f"lower {knob} to {self.max_units} or less"
        else:
            fix = f"even {knob} 1 would not fit: free memory on {self.device}, or use a smaller model or dtype"
        return (
            f"{self.sizing.cache} needs {format_bytes(self.needed)} ({format_bytes(self.layout.bytes_per_token)} "
            f"a token) but {self.device} has {format_bytes(self.available)} available, of which "
            f"{format_bytes(usable_bytes(self.available))} ({KV_MEMORY_SHARE:.0%}) may hold a KV cache: {fix}"
        )


def check_kv_memory(sizing: KVSizing, layout: KVLayout, device: Any) -> None:
    """Raise ``KVMemoryError`` if ``sizing``'s cache would not fit ``device`` now; pass where that is unknown."""
    device = str(device)
    available = available_memory(device)
    if available is not None and layout.cache_bytes(sizing.num_tokens) > usable_bytes(available):
        raise KVMemoryError(sizing, layout, device, available)


# -- what a device has left ---------------------------------------------------


def available_memory(device: str) -> int | None:
    """Bytes a new allocation on ``device`` can still take; None where that cannot be told (then nothing is checked)."""
    if device.startswith("cuda"):
        return _cuda_available(device)
    if device == "cpu":
        return host_available()
    return None


def _cuda_available(device: str) -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    # Memory this process's caching allocator holds but no tensor uses (an engine built and dropped before):
    # the driver counts it as taken, yet the next allocation gets it first.
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + cached


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except (OSError, ValueError):
        return None


def host_available(read: Callable[[str], str | None] = _read_text) -> int | None:
    """The host memory a new allocation can take: the kernel's MemAvailable, capped by this container's cgroup.

    The cgroup's limit is what gets the process killed in a container, where
    /proc/meminfo shows the whole machine. Without /proc/meminfo (not Linux),
    the free pages. ``read(path)`` reads a file, None when there is none.
    """
    found = [meminfo_available(read("/proc/meminfo") or ""), cgroup_room(read)]
    known = [value for value in found if value is not None]
    if known:
        return min(known)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def meminfo_available(text: str) -> int | None:
    """``MemAvailable`` of a /proc/meminfo text, in bytes."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024  # kB
    return None


# (limit, usage, stat, the stat's reclaimable file cache): cgroup v2, then v1, as a container sees its own.
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        "/sys/fs/cgroup/memory/memory.stat",
        "total_inactive_file",
    ),
)


def cgroup_room(read: Callable[[str], str | None] = _read_text) -> int | None:
    """Bytes left under this process's cgroup memory limit; None without a limit.

    Its usage counts the file cache too; the inactive part of it is given
    back before the limit kills anything, so it counts as room (as the
    "working set" of docker stats and Kubernetes does).
    """
    for limit_path, usage_path, stat_path, inactive_key in _CGROUP_FILES:
        limit, usage = (read(limit_path) or "").strip(), (read(usage_path) or "").strip()
        if not limit.isdigit() or not usage.isdigit():
            continue  # "max" (cgroup v2's no limit), or no such files
        if int(limit) >= _UNLIMITED:
            continue
        inactive = _stat_value(read(stat_path) or "", inactive_key)
        return max(0, int(limit) - max(0, int(usage) - inactive))
    return None


def _stat_value(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0
