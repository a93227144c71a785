"""The static decode step's attention before and after folding GQA, side by side in one run, on CPU.

    python bench/static_decode_formulation.py [--model random-smollm2-135m] [--slots 8] [--max-seq-len 256]
                                              [--repeats 9] [--clock cpu|wall]

``StaticDecodeStep`` attends one query per slot over the slot's whole
``max_seq_len``. It used to call ``scaled_dot_product_attention(...,
attn_mask=mask, enable_gqa=True)``, which on CUDA falls back to the math
kernel and materialises K/V repeated per query head; it now calls
``layers.grouped_query_attention`` (query heads folded per KV head, no
``enable_gqa``), which keeps a fused kernel there. The GPU gain cannot be
measured on this machine; this checks that CPU did not get slower:

- ``attention``: the attention call alone at the static decode shape;
- ``step``: the whole ``StaticDecodeStep.forward`` (every layer, both
  formulations over the same weights and cache, the old one a subclass that
  attends as the step did before).

Old and new alternate within each repeat (ABBA), and the ratio printed is
the median of the per-repeat ratios new / old (below 1: new is faster).
``--clock cpu`` (the default; one torch thread, this process's CPU time) does
not count time spent waiting for a core on a VM others load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import step_formulation  # noqa: E402
from perfsuite.engine.layers import grouped_query_attention  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.static_decode import StaticDecodeStep  # noqa: E402
from perfsuite.models import load_model  # noqa: E402


class OldStaticDecodeStep(StaticDecodeStep):
    """The step as it attended before: enable_gqa with a mask."""

    def forward(self, inputs: torch.Tensor, kv_cache) -> torch.Tensor:
        token_ids, positions, is_scheduled = inputs[0], inputs[1], inputs[2] != 0
        rows = torch.arange(kv_cache.num_slots, device=inputs.device)
        mask = self._mask(positions, kv_cache.max_seq_len)

        def attend(layer_index, q, k, v):
            k_cache, v_cache = kv_cache.keys[layer_index], kv_cache.values[layer_index]
            self._store(k_cache, rows, positions, is_scheduled, k)
            self._store(v_cache, rows, positions, is_scheduled, v)
            attended = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, attn_mask=mask, enable_gqa=True)
            return attended.squeeze(2)

        hidden = self.decoder.forward(token_ids, positions, attend)
        return self.decoder.greedy_tokens(hidden)


def attention_case(heads, slots: int, max_seq_len: int, repeats: int):
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(slots, heads.num_heads, heads.head_dim, generator=generator)  # [slots, heads, d]
    keys = torch.randn(slots, heads.num_kv_heads, max_seq_len, heads.head_dim, generator=generator)
    values = torch.randn_like(keys)
    positions = torch.arange(slots) * (max_seq_len - 1) // max(slots - 1, 1)
    mask = StaticDecodeStep._mask(positions, max_seq_len)  # [slots, 1, 1, max_seq_len]

    def old_once():
        return F.scaled_dot_product_attention(queries.unsqueeze(2), keys, values, attn_mask=mask, enable_gqa=True)

    def new_once():
        return grouped_query_attention(queries.unsqueeze(1), keys, values, mask)

    torch.testing.assert_close(new_once().squeeze(1), old_once().squeeze(2))
    old_s, new_s, ratio = step_formulation.paired_medians(
        lambda: [old_once() for _ in range(50)], lambda: [new_once() for _ in range(50)], repeats
    )
    return old_s / 50, new_s / 50, ratio


def step_case(decoder, slots: int, max_seq_len: int, repeats: int):
    old_step, new_step = OldStaticDecodeStep(decoder), StaticDecodeStep(decoder)
    kv_cache = decoder.new_kv_cache(slots, max_seq_len)
    generator = torch.Generator().manual_seed(0)
    for cache in (*kv_cache.keys, *kv_cache.values):
        cache.copy_(torch.randn(cache.shape, generator=generator, dtype=cache.dtype))
    positions = torch.arange(slots) * (max_seq_len - 1) // max(slots - 1, 1)
    # is_scheduled all 0: every row computes but writes back what is there, so repeats see one cache
    inputs = torch.stack((torch.full((slots,), 5), positions, torch.zeros(slots, dtype=torch.long)))
    assert torch.equal(old_step.forward(inputs, kv_cache), new_step.forward(inputs, kv_cache))
    return step_formulation.paired_medians(
        lambda: old_step.forward(inputs, kv_cache), lambda: new_step.forward(inputs, kv_cache), repeats
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="random-smollm2-135m")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=sorted(step_formulation.CLOCKS), default="cpu")
    args = parser.parse_args()
    step_formulation.clock = step_formulation.CLOCKS[args.clock]
    torch.set_num_threads(1 if args.clock == "cpu" else torch.get_num_threads())
    decoder = ModelRunner(load_model(args.model, dtype="float32").model).decoder
    heads = decoder.heads
    print(f"model {args.model}: {heads.num_heads} query heads, {heads.num_kv_heads} KV heads, head_dim "
          f"{heads.head_dim}; {args.slots} slots x {args.max_seq_len}; {torch.get_num_threads()} threads; "
          f"{args.clock} clock; {args.repeats} repeats")  # fmt: skip
    print(f"{'case':<12} {'old ms':>9} {'new ms':>9} {'new/old (median of pairs)':>26}")
    with torch.inference_mode():
        for label, case in (("attention", attention_case), ("step", None)):
            if case is None:
                old, new, ratio = step_case(decoder, args.slots, args.max_seq_len, args.repeats)
            else:
                old, new, ratio = case(heads, args.slots, args.max_seq_len, args.repeats)
            print(f"{label:<12} {old * 1e3:>9.3f} {new * 1e3:>9.3f} {ratio:>26.3f}")


if __name__ == "__main__":
    main()
