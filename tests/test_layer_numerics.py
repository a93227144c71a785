"""perfsuite's layer math gives Hugging Face Llama's bits, not just close values: greedy choices stay equal.

Mutants they kill: the sine table's sign on the wrong half (or none), a roll
by the wrong amount, the norm left in the input's dtype for float64, an
epsilon outside the square root.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, rotate_half

from perfsuite.engine.layers import Decoder, apply_rotary, rms_norm
from perfsuite.models import load_model


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    loaded = load_model("tiny-random", dtype="float32")
    return Decoder.from_hf(loaded.model, torch.device("cpu"), torch.float32, pack_weights=False)


def test_rotary_is_hugging_faces_formula_bit_for_bit(decoder: Decoder) -> None:
    generator = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 100, decoder.max_context - 1])
    x = torch.randn(len(positions), 6, decoder.heads.head_dim, generator=generator)
    cos = decoder.cos_table[positions].unsqueeze(1)
    sin = decoder.signed_sin_table[positions].unsqueeze(1)
    half = decoder.heads.head_dim // 2
    hf_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # the table's sign undone
    assert torch.equal(apply_rotary(x, cos, sin), x * cos + rotate_half(x) * hf_sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rms_norm_is_llama_rms_norm_bit_for_bit(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    hf_norm = LlamaRMSNorm(24, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf_norm.weight.copy_(torch.randn(24, generator=generator))
    hidden = (torch.randn(5, 24, generator=generator) * 3).to(dtype)
    with torch.no_grad():
        assert torch.equal(rms_norm(hidden, hf_norm.weight, 1e-5), hf_norm(hidden))
