"""Turning a stream of token ids into text pieces, one per token."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Text pieces of a growing token sequence, one per token.

    A token that ends inside a multi-byte character decodes to U+FFFD, so its
    text is held back (an empty piece) until a later token completes it; the
    pieces then concatenate to the text of the whole sequence (TGI's method).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def piece(self, token_id: int, is_last: bool) -> str:
        self._token_ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._token_ids))
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not is_last):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(self._token_ids[start:stop], skip_special_tokens=True)
