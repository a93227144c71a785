"""A tokenizer's files as both transformers 4.x and 5.x load them, for the clients of ``perfsuite serve``.

transformers 5 saves a fast tokenizer with ``"tokenizer_class": "TokenizersBackend"``, a class 4.x does not have:
4.x's ``AutoTokenizer.from_pretrained`` then fails ("Tokenizer class TokenizersBackend does not exist"), and many
benchmark clients pin 4.x. Both versions have ``PreTrainedTokenizerFast`` (5.x as another name of
``TokenizersBackend``) and build it from ``tokenizer.json`` alone, so the copy written here is that file and a
``tokenizer_config.json`` naming that class, with the special tokens, the length limit and the chat template as
fields both read. The folder is named after a digest of its files, so a folder already written is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from perfsuite.cache_dir import cache_root

PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # a class transformers 4.x and 5.x both resolve
SPECIAL_TOKEN_FIELDS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
SERVED_TOKENIZERS_DIR = "tokenizers"  # under the cache root
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
_DIGEST_CHARS = 16


def portable_tokenizer_config(tokenizer: Any) -> dict[str, Any]:
    """The ``tokenizer_config.json`` fields that rebuild ``tokenizer`` from its ``tokenizer.json`` in 4.x and 5.x."""
    config: dict[str, Any] = {"tokenizer_class": PORTABLE_TOKENIZER_CLASS}
    for name in SPECIAL_TOKEN_FIELDS:
        token = getattr(tokenizer, name, None)
        if token is not None:
            config[name] = str(token)
    named = set(config.values())
    # the other special tokens (4.x's name for them; 5.x reads it too): tokenizer.json marks them special, and this
    # list makes them all_special_ids in both versions
    additional = [str(token) for token in getattr(tokenizer, "all_special_tokens", ()) if str(token) not in named]
    if additional:
        config["additional_special_tokens"] = additional
    config["model_max_length"] = int(tokenizer.model_max_length)
    config["clean_up_tokenization_spaces"] = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        config["chat_template"] = tokenizer.chat_template
    return config


def served_tokenizer_folder(tokenizer: Any, name: str) -> Path:
    """``tokenizer``'s portable copy under the cache root (``tokenizers/NAME-DIGEST``), written once."""
    return write_portable_tokenizer(tokenizer, cache_root() / SERVED_TOKENIZERS_DIR, name)


def write_portable_tokenizer(tokenizer: Any, parent: Path, name: str) -> Path:
    """``parent/NAME-DIGEST``: ``tokenizer``'s files as transformers 4.x and 5.x load them (written once).

    ``tokenizer`` must be a fast tokenizer (one with a ``backend_tokenizer``), as every model perfsuite loads has.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"the tokenizer of {name!r} ({type(tokenizer).__name__}) is not a fast tokenizer, so it has no "
            "tokenizer.json to serve; save the model with a fast tokenizer (tokenizer.json)"
        )
    files = {
        TOKENIZER_FILE: backend.to_str(),
        CONFIG_FILE: json.dumps(portable_tokenizer_config(tokenizer), indent=2, ensure_ascii=False) + "\n",
    }
    digest = hashlib.sha256("\0".join(files[f] for f in sorted(files)).encode()).hexdigest()[:_DIGEST_CHARS]
    folder = parent / f"{_safe_name(name)}-{digest}"
    if not all((folder / file).is_file() for file in files):
        _write_atomically(folder, files)
    return folder


def _write_atomically(folder: Path, files: dict[str, str]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for file, text in files.items():
            (staging / file).write_text(text, encoding="utf-8")
        try:
            os.replace(staging, folder)
        except OSError:  # another server wrote the same folder first: its files are these
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "tokenizer"
