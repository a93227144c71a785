"""Loading a ``ModelSpec``: its config alone, or the model and tokenizer ready for inference.

Each kind has its loader: ``smollm2-135m`` reads the cache, else the GGUF
file once (then writes the cache); random models are built from their config;
a local directory is read with ``from_pretrained``. Nothing downloads: every
transformers call passes ``local_files_only``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfsuite.cache_dir import CACHE_DIR_ENV
from perfsuite.models.cache import (
    cache_is_valid,
    file_sha256,
    read_model_cache,
    smollm2_cache_dir,
    write_model_cache,
)
from perfsuite.models.gguf import load_gguf_model, read_gguf_config, smollm2_gguf_path
from perfsuite.models.random_weights import build_random_model, random_config
from perfsuite.models.spec import (
    KIND_GGUF_PACKAGE,
    KIND_LOCAL,
    KIND_RANDOM,
    RANDOM_CONFIGS,
    ModelLoadError,
    ModelSpec,
    resolve_model_spec,
)

if TYPE_CHECKING:
    import torch
    import transformers

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")  # the first one set is the context

_DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "float64": "float64",
    "fp64": "float64",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference: eval mode, no grads, on its device and dtype."""

    spec: ModelSpec
    model: transformers.PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase

    @property
    def eos_token_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
            if isinstance(eos, (list, tuple)):
                eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    @property
    def max_context(self) -> int:
        config = self.model.config
        context = context_of({key: getattr(config, key, None) for key in CONTEXT_KEYS})
        if context is not None:
            return context
        raise ValueError(
            f"model {self.spec.name!r} has no max_position_embeddings in its config; "
            "set it in the model directory's config.json"
        )


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"fp32"``, ``"float64"``/``"fp64"``, ``"bfloat16"``/``"bf16"``,
    ``"float16"``/``"fp16"`` (case-insensitive, ``torch.`` prefix allowed), or one
    of those torch dtypes."""
    import torch

    allowed = "float32 (fp32), float64 (fp64), bfloat16 (bf16), float16 (fp16)"
    if isinstance(name, torch.dtype):
        canonical = str(name).removeprefix("torch.")
        if canonical not in _DTYPE_ALIASES:
            raise ValueError(f"unsupported dtype {name}; use one of: {allowed}")
        return name
    if not isinstance(name, str):
        raise TypeError(f"dtype must be a string or torch.dtype, got {name!r}; use one of: {allowed}")
    key = name.strip().lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {name!r}; use one of: {allowed}")
    return getattr(torch, _DTYPE_ALIASES[key])


def _parse_device(device: str | torch.device) -> torch.device:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r} ({exc}); use e.g. 'cpu', 'cuda' or 'cuda:0'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; "
            "use device 'cpu', or run on a machine with a GPU and a CUDA build of torch"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(
            f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist; "
            "use 'cuda' or a smaller index"
        )
    return dev


def model_config(spec: ModelSpec | str) -> transformers.PretrainedConfig:
    """The model's config, without building or loading its weights.

    For ``smollm2-135m`` this reads the cached copy's config.json when there is
    one, else the GGUF file's metadata (a few seconds).
    """
    spec = resolve_model_spec(spec)
    if spec.kind == KIND_RANDOM:
        return random_config(spec.name)

    from transformers import AutoConfig

    if spec.kind == KIND_LOCAL:
        path = spec.local_path
        try:
            return AutoConfig.from_pretrained(path, local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot read the config of model directory {path}: {exc}; "
                "its config.json must be one save_pretrained wrote"
            ) from exc
    gguf = smollm2_gguf_path()
    cached = smollm2_cache_dir(gguf)
    if cache_is_valid(cached):
        return AutoConfig.from_pretrained(cached, local_files_only=True)
    return read_gguf_config(gguf)


def context_of(values: dict[str, Any]) -> int | None:
    """The context length a model config's values give (``max_position_embeddings`` or its aliases); None without."""
    for key in CONTEXT_KEYS:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def config_values(spec: ModelSpec | str) -> dict[str, Any] | None:
    """The model's config.json values, read without transformers, for checks made before a model loads.

    A random model's own values; a local directory's config.json; for
    ``smollm2-135m`` its cache's config.json, and None before the first load
    wrote that cache (only the GGUF file holds the config then, read slowly).
    """
    spec = resolve_model_spec(spec)
    if spec.kind == KIND_RANDOM:
        return dict(RANDOM_CONFIGS[spec.name])
    if spec.kind == KIND_LOCAL:
        folder = Path(spec.local_path)
    else:
        folder = smollm2_cache_dir(smollm2_gguf_path())
        if not cache_is_valid(folder):
            return None
    try:
        values = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def _load_smollm2() -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    gguf = smollm2_gguf_path()
    cached = smollm2_cache_dir(gguf)
    if cache_is_valid(cached):
        return read_model_cache(cached)
    model, tokenizer = load_gguf_model(gguf)
    try:
        write_model_cache(
            model,
            tokenizer,
            cached,
            metadata={"gguf_file": gguf.name, "gguf_sha256": file_sha256(gguf)},
        )
    except OSError as exc:
        warnings.warn(
            f"could not write the smollm2-135m cache to {cached} ({exc}); every load will read "
            f"the GGUF file again (slow). Set {CACHE_DIR_ENV} to a writable directory",
            RuntimeWarning,
            stacklevel=3,
        )
        return model, tokenizer
    # Load the copy just written, so the first load returns the same kind of
    # model as every later one (no GGUF quantization config attached).
    return read_model_cache(cached)


def _load_local(
    spec: ModelSpec, dtype: torch.dtype
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = spec.path
    if path is None or not (Path(path) / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json; pass a Hugging Face model directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load a causal LM from {path}: {exc}; the directory must hold what "
            "save_pretrained writes (config.json and model.safetensors or pytorch_model.bin) "
            "for an architecture AutoModelForCausalLM knows"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load a tokenizer from {path}: {exc}; save one into the directory with "
            "tokenizer.save_pretrained(path) (tokenizer.json and tokenizer_config.json)"
        ) from exc
    return model, tokenizer


def _check_tied(model: transformers.PreTrainedModel, name: str) -> None:
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is None or out is None:
        return
    if _weight_pointer(out) != _weight_pointer(inp):
        model.tie_weights()
    if _weight_pointer(out) != _weight_pointer(inp):
        raise ModelLoadError(
            f"model {name!r} should tie lm_head to the input embeddings but they are separate "
            "tensors; its weights are inconsistent: delete its cache directory and load again"
        )


def _weight_pointer(module: torch.nn.Module) -> int:
    """Where ``module.weight``'s storage starts: two modules that share one tensor give the same."""
    import torch

    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise ModelLoadError(f"{type(module).__name__}.weight is a {type(weight).__name__}, not a tensor")
    return weight.data_ptr()


def _to_device_dtype(
    model: transformers.PreTrainedModel, device: torch.device, dtype: torch.dtype
) -> transformers.PreTrainedModel:
    """Move to ``device`` and cast to ``dtype``, keeping derived float32 constants precise.

    ``model.to(bfloat16)`` would also round the non-persistent buffers such as
    RoPE's ``inv_freq``, which ``from_pretrained(dtype=bfloat16)`` leaves in
    float32; those are kept in their own dtype when ``dtype`` is narrower.
    """
    kept = []
    for module in model.modules():
        for name, buf in module._buffers.items():
            if (
                buf is not None
                and name in module._non_persistent_buffers_set
                and buf.is_floating_point()
                and buf.element_size() > dtype.itemsize
            ):
                kept.append((module, name, buf))
    model = model.to(device=device, dtype=dtype)  # type: ignore[call-arg]  # transformers' wrapper of .to misleads mypy
    for module, name, buf in kept:
        module._buffers[name] = buf.to(device=device)
    return model


def load_model(
    spec: ModelSpec | str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> LoadedModel:
    """Load a model for inference: eval mode, ``requires_grad`` off, on ``device`` in ``dtype``."""
    spec = resolve_model_spec(spec)
    torch_dtype = parse_dtype(dtype)
    dev = _parse_device(device)

    if spec.kind == KIND_GGUF_PACKAGE:
        model, tokenizer = _load_smollm2()
    elif spec.kind == KIND_RANDOM:
        model, tokenizer = build_random_model(spec, dev, torch_dtype)
    else:
        model, tokenizer = _load_local(spec, torch_dtype)

    model = _to_device_dtype(model, dev, torch_dtype)
    model.eval()
    model.requires_grad_(False)
    _check_tied(model, spec.name)
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer)
