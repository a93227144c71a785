"""The local safetensors cache: a plain copy of a model that is slow to read, written atomically.

The cache root is ``$PERFSUITE_CACHE_DIR``, else ``~/.cache/perfsuite``.
SmolLM2's copy is keyed by its GGUF file's sha256. A copy is written into a
temporary directory and renamed into place, so a crash never leaves a
half-written cache that a later load trusts.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfsuite.cache_dir import cache_root
from perfsuite.models.gguf import smollm2_gguf_path
from perfsuite.models.spec import ModelLoadError

if TYPE_CHECKING:
    import transformers

CACHE_FORMAT = 1
CACHE_MARKER = "perfsuite-cache.json"
_STALE_TMP_SECONDS = 3600.0


@functools.lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, hashed once per size and modification time."""
    st = path.stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


def smollm2_cache_dir(gguf_path: Path | None = None) -> Path:
    """Where the safetensors copy of this GGUF file lives (it may not exist yet)."""
    gguf_path = smollm2_gguf_path() if gguf_path is None else Path(gguf_path)
    digest = file_sha256(gguf_path)[:16]
    return cache_root() / f"smollm2-135m-{digest}-v{CACHE_FORMAT}"


def cache_is_valid(cache_dir: Path | str) -> bool:
    """Whether ``cache_dir`` is a complete cache written by ``write_model_cache``.

    The marker file is written last inside the temporary directory, before it
    is renamed into place, so a directory with a readable marker is complete.
    """
    marker = Path(cache_dir) / CACHE_MARKER
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == CACHE_FORMAT


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` and the directory itself to disk."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    with contextlib.suppress(OSError):  # directories cannot be opened on some systems
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_marker(directory: Path, metadata: dict[str, Any]) -> None:
    text = json.dumps(
        metadata, indent=2, sort_keys=True, allow_nan=False
    )  # standard JSON, like every file perfsuite writes
    (directory / CACHE_MARKER).write_text(text + "\n", encoding="utf-8")


def _remove_stale_tmp_dirs(final_dir: Path) -> None:
    """Remove temporary directories that a killed writer left (older than an hour)."""
    now = time.time()
    for leftover in final_dir.parent.glob(f".{final_dir.name}.tmp-*"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)


def _plain_copy(model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """The same weights in a model built from the config without ``quantization_config``.

    ``save_pretrained`` refuses a model loaded from GGUF; this copy it accepts.
    The copy shares the weight tensors (built on the meta device, then assigned).
    """
    import torch

    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(config_dict)
    with torch.device("meta"):
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    return plain


def write_model_cache(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    final_dir: Path | str,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Save ``model`` (safetensors) and ``tokenizer`` to ``final_dir``, atomically.

    Writes into a temporary directory beside ``final_dir`` and renames it into
    place. If another process got there first, its copy is kept and ours is
    discarded. On any error the temporary directory is removed and nothing
    appears at ``final_dir``.
    """
    final_dir = Path(final_dir)
    if cache_is_valid(final_dir):
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(final_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any cache
        _plain_copy(model).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_marker(
            tmp,
            {
                "format": CACHE_FORMAT,
                "written_by": "perfsuite.models",
                "write_id": uuid.uuid4().hex,
                **(metadata or {}),
            },
        )
        _fsync_tree(tmp)
        _move_into_place(tmp, final_dir)
        return final_dir
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, final_dir: Path) -> None:
    """Rename the written ``tmp`` to ``final_dir``; where another process got there first, keep its copy."""
    try:
        os.rename(tmp, final_dir)
    except OSError:
        if cache_is_valid(final_dir):  # another process won the race: use its copy
            return
        if final_dir.exists():
            raise ModelLoadError(
                f"{final_dir} exists but is not a complete model cache (it has no "
                f"{CACHE_MARKER}); delete it (rm -rf '{final_dir}') and load again"
            ) from None
        raise


def read_model_cache(
    cache_dir: Path | str,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Load a model and tokenizer that ``write_model_cache`` wrote (float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache_dir = Path(cache_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(cache_dir, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(cache_dir, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"the model cache at {cache_dir} is unreadable ({exc}); delete it "
            f"(rm -rf '{cache_dir}') and load again to rebuild it"
        ) from exc
    return model, tokenizer
