"""The byte-level tokenizer of the random models, built in code (nothing is downloaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import transformers

# Token ids of the byte-level tokenizer, shared by every random model's config.
PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
_BYTE_TOKEN_OFFSET = 3  # byte b is token 3 + b


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel pre-tokenizing uses)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def build_byte_tokenizer(
    vocab_size: int | None = None, model_max_length: int = 256
) -> transformers.PreTrainedTokenizerFast:
    """A byte-level tokenizer: ``<pad>``=0, ``<s>``=1, ``</s>``=2, byte b = 3 + b.

    No merges, so every UTF-8 string round-trips. Adds no BOS (as SmolLM2's
    tokenizer). With ``vocab_size`` above 259, ``<|reserved_N|>`` special tokens
    fill the rest, so every id the model can emit decodes to something.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_TOKEN_ID, "<s>": BOS_TOKEN_ID, "</s>": EOS_TOKEN_ID}
    for byte, char in _bytes_to_unicode().items():
        vocab[char] = _BYTE_TOKEN_OFFSET + byte
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )
    if vocab_size is not None and vocab_size > len(tokenizer):
        reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - len(tokenizer))]
        tokenizer.add_special_tokens({"additional_special_tokens": reserved})
    return tokenizer
