"""Decode attention that reads a paged pool's blocks in place, on the CPU.

The torch path for a paged decode step gathers every row's blocks into a new
tensor, then attends over the copy (``PagedKVCache.keys_of_rows``): on the
2-vCPU development VM that gather moved as many bytes again as attention
read, and was most of a paged step's lead over a slot step. torch has no CPU
kernel that takes a block table, so perfsuite brings one
(``csrc/paged_attention.c``, what vLLM's CPU backend does in C++): each
row's keys and values are read where they lie.

The source is compiled once per machine and CPU kind (``perfsuite.engine.c_library``);
where no compiler works, ``load_paged_attention`` says why and the runner
keeps the gather (``ModelRunner.paged_attention`` reports which).

Both paths compute the same attention up to the order of summation; the
equivalence properties hold the engines on either to unbatched greedy.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from perfsuite.engine.c_library import BUILD_FIX, CSRC, Unavailable, build_kernels, load_kernels

__all__ = ["BUILD_FIX", "PagedAttention", "Unavailable", "build", "load_paged_attention"]

SOURCE = CSRC / "paged_attention.c"
_STATUS = {
    1: "a row's key count is below 1 or past its block table",
    2: "a block id is outside the pool",
    3: "out of memory for a row's scores",
}
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class PagedAttention:
    """The compiled kernel: ``self(q, keys, values, block_tables, lengths)`` -> attended [rows, heads, head_dim]."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = {}
        for dtype, suffix in _DTYPES.items():
            function = getattr(library, f"paged_decode_attention_{suffix}")
            function.restype = ctypes.c_int
            scalar = ctypes.c_float if dtype == torch.float32 else ctypes.c_double
            pointer, size = ctypes.c_void_p, ctypes.c_int64
            # q, its row stride, the pools, tables, lengths, out; rows .. num_blocks; the scale; threads
            function.argtypes = [pointer, size, *[pointer] * 5, *[size] * 7, scalar, ctypes.c_int]
            self._functions[dtype] = function
        self._store = library.store_keys_and_values
        self._store.restype = ctypes.c_int
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._store.argtypes = [
            pointer,
            pointer,
            size,
            pointer,
            pointer,
            size,
            size,
            pointer,
            size,
            size,
            size,
            size,
            size,
        ]

    @staticmethod
    def supports(pool: torch.Tensor) -> bool:
        return pool.device.type == "cpu" and pool.dtype in _DTYPES

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        block_tables: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """Row r's query q[r] [heads, head_dim] over its first ``lengths[r]`` keys through ``block_tables[r]``.

        ``keys`` and ``values`` are one layer's pool [num_blocks, block_size, kv_heads, head_dim], contiguous;
        ``block_tables`` [rows, width] and ``lengths`` [rows] contiguous int64 on the CPU. q's rows may be strided
        (a split of the fused query-key projection); within a row its heads must be contiguous.
        """
        _check_inputs(q, keys, values, block_tables, lengths)
        rows, num_heads, head_dim = q.shape
        num_blocks, block_size, num_kv_heads, _ = keys.shape
        out = torch.empty(rows, num_heads, head_dim, dtype=q.dtype)
        status = self._functions[q.dtype](
            q.data_ptr(),
            q.stride(0),
            keys.data_ptr(),
            values.data_ptr(),
            block_tables.data_ptr(),
            lengths.data_ptr(),
            out.data_ptr(),
            rows,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            block_tables.shape[1],
            num_blocks,
            head_dim**-0.5,
            torch.get_num_threads(),
        )
        if status:
            raise ValueError(_refusal(status, block_tables, lengths, num_blocks))
        return out

    def store(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        offsets: torch.Tensor,
        head_stride: int,
    ) -> None:
        """Token t's keys k[t] [kv_heads, head_dim] (and values) into the caches: head h at element
        ``offsets[t] + h * head_stride`` of each (``csrc/paged_attention.c``'s ``store_keys_and_values`` says
        what the offsets are for a pool and for a slot cache).

        The caches are one layer's, contiguous, of k's dtype; k and v [T, kv_heads, head_dim] may have strided rows
        (splits of the fused query-key-value projection), and within a row their heads are contiguous; ``offsets``
        [T] contiguous int64. A head that would land outside a cache is refused with
        ``ValueError``, and nothing is written.
        """
        _check_store_inputs(k_cache, v_cache, k, v, offsets)
        tokens, kv_heads, head_dim = k.shape
        status = self._store(
            k_cache.data_ptr(), v_cache.data_ptr(), k_cache.numel(), k.data_ptr(), v.data_ptr(), k.stride(0),
            v.stride(0), offsets.data_ptr(), tokens, kv_heads, head_dim, head_stride, k.element_size(),
        )  # fmt: skip
        if status:
            raise ValueError(
                f"storing keys and values refused offsets {offsets.tolist()} (head stride {head_stride}): a head "
                f"would land outside the cache of {k_cache.numel()} elements; nothing was written"
            )


def _refusal(status: int, block_tables: torch.Tensor, lengths: torch.Tensor, num_blocks: int) -> str:
    """What the C kernel's nonzero ``status`` says was wrong with its rows."""
    return (
        f"paged decode attention refused its input: {_STATUS.get(status, f'status {status}')} "
        f"(lengths {lengths.tolist()}, tables of width {block_tables.shape[1]} over {num_blocks} blocks); "
        "the scheduler must give each row the blocks its keys fill"
    )


def _check_store_inputs(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor
) -> None:
    """Raise unless the inputs of ``PagedAttention.store`` have the shapes, dtypes and layouts the C copy reads."""
    tokens, _, head_dim = k.shape
    if (
        not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or v_cache.shape != k_cache.shape
        or not (k_cache.dtype == v_cache.dtype == k.dtype == v.dtype)
        or not (k_cache.is_cpu and v_cache.is_cpu and k.is_cpu and v.is_cpu)
        or v.shape != k.shape
        or k.stride()[1:] != (head_dim, 1)
        or v.stride()[1:] != (head_dim, 1)
        or offsets.dtype != torch.int64
        or offsets.shape != (tokens,)
        or not offsets.is_contiguous()
    ):
        raise ValueError(
            "storing keys and values needs contiguous CPU caches of one shape and k's dtype, k and v "
            "[tokens, kv_heads, head_dim] with contiguous heads, and contiguous int64 offsets "
            f"[tokens]; got caches {tuple(k_cache.shape)} {k_cache.dtype}, k {tuple(k.shape)} {k.dtype} strides "
            f"{k.stride()}, v strides {v.stride()}, offsets {tuple(offsets.shape)} {offsets.dtype}"
        )


def _check_inputs(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_tables: torch.Tensor, lengths: torch.Tensor
) -> None:
    """Raise unless the inputs have the shapes, dtypes and layouts the C kernel reads them by."""
    rows, num_heads, head_dim = q.shape
    _, _, num_kv_heads, pool_head_dim = keys.shape
    if (
        q.dtype != keys.dtype
        or q.stride(2) != 1
        or q.stride(1) != head_dim
        or pool_head_dim != head_dim
        or num_heads % num_kv_heads
        or not (keys.is_contiguous() and values.is_contiguous() and values.shape == keys.shape)
        or block_tables.dtype != torch.int64
        or lengths.dtype != torch.int64
        or not (block_tables.is_contiguous() and lengths.is_contiguous())
        or block_tables.shape[0] != rows
        or lengths.shape != (rows,)
    ):
        raise ValueError(
            "paged decode attention needs q [rows, heads, head_dim] with contiguous heads, a contiguous pool "
            "[blocks, block_size, kv_heads, head_dim] of q's dtype and kv_heads dividing heads, and contiguous "
            f"int64 block tables [rows, width] and lengths [rows]; got q {tuple(q.shape)} {q.dtype} strides "
            f"{q.stride()}, pool {tuple(keys.shape)} {keys.dtype}, tables {tuple(block_tables.shape)} "
            f"{block_tables.dtype}, lengths {tuple(lengths.shape)} {lengths.dtype}"
        )


@functools.cache
def load_paged_attention() -> PagedAttention | Unavailable:
    """The kernel, compiled for this process on first use; or why it could not be."""
    return load_kernels(SOURCE, PagedAttention)


def build(compiler: str) -> PagedAttention | Unavailable:
    """``SOURCE`` compiled with ``compiler`` (``c_library.build_library``) and loaded."""
    return build_kernels(compiler, SOURCE, PagedAttention)
