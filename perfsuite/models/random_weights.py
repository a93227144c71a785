"""Llama models with seeded random weights, built from a config in ``spec.RANDOM_CONFIGS``.

Building restores torch's RNG state afterwards, so loading a model never
changes what a caller's own seeded draws produce.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING

from perfsuite.models.spec import RANDOM_CONFIGS, ModelSpec
from perfsuite.models.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_byte_tokenizer

if TYPE_CHECKING:
    import torch
    import transformers


def random_config(name: str) -> transformers.LlamaConfig:
    """The config of the random model ``name``, with the byte tokenizer's special ids."""
    from transformers import LlamaConfig

    kwargs = copy.deepcopy(RANDOM_CONFIGS[name])
    return LlamaConfig(
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        **kwargs,
    )


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for ``device`` and restore the previous state afterwards."""
    import torch

    if device.type == "cpu":
        fork = torch.random.fork_rng(devices=[])
    else:
        index = device.index if device.index is not None else 0
        fork = torch.random.fork_rng(devices=[index], device_type=device.type)
    with fork:
        torch.manual_seed(seed)
        yield


def build_random_model(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """The random model ``spec`` names, seeded by ``spec.seed``, and its byte tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    config = random_config(spec.name)
    vocab_for_tokenizer = config.vocab_size if config.vocab_size <= 1024 else None
    tokenizer = build_byte_tokenizer(vocab_size=vocab_for_tokenizer, model_max_length=config.max_position_embeddings)
    if spec.name == "tiny-random":
        # Tiny: build on CPU in float32 so the weights are the same for every device and dtype.
        build_device, build_dtype = torch.device("cpu"), torch.float32
    else:
        # Large: build straight on the target device in the target dtype (fast, no host copy).
        build_device, build_dtype = device, dtype
    with _seeded(spec.seed, build_device), build_device:
        model = AutoModelForCausalLM.from_config(config, dtype=build_dtype)
    return model, tokenizer
