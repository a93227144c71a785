"""The tokenizer folder ``perfsuite serve`` names as ``root``: transformers 4.x and 5.x both load it.

transformers 5 saves ``"tokenizer_class": "TokenizersBackend"``, which 4.x's
``AutoTokenizer`` cannot resolve (``ValueError: Tokenizer class
TokenizersBackend does not exist``). In the default suite the folder is loaded
with this venv's transformers (5.x) and checked against what 4.x's
``AutoTokenizer`` resolves (a vendored list, read from transformers 4.57's
``tokenizer_class_from_name``). The ``transformers4`` tier (``make
test-transformers4``) loads it with a real transformers 4.57 in a venv of its
own, whose python ``$PERFSUITE_TRANSFORMERS4_PYTHON`` names.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from perfsuite.models import build_byte_tokenizer, write_portable_tokenizer
from perfsuite.models.portable_tokenizer import CONFIG_FILE, SPECIAL_TOKEN_FIELDS, TOKENIZER_FILE

VOCAB = 300  # past the 259 byte tokens: reserved special tokens fill the rest
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXTS = ["Hello there, how are you?", "  spaced  out\n\nlines é中文 🙂", "<s>a</s><|reserved_3|>b"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
# The classes transformers 4.x's AutoTokenizer resolves from tokenizer_config.json whatever the model type
# (tokenization_auto.tokenizer_class_from_name, 4.57): the fast base class is returned by name.
TRANSFORMERS_4_GENERIC_CLASSES = {"PreTrainedTokenizerFast"}
TRANSFORMERS4_PYTHON = "PERFSUITE_TRANSFORMERS4_PYTHON"
# Run by the 4.x venv's python: what that transformers makes of the folder, as JSON.
LOAD_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
import transformers
folder, texts, messages = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
print(json.dumps({"version": transformers.__version__, **{key: value for key, value in (
    ("ids", [tokenizer(text)["input_ids"] for text in texts]),
    ("decoded", [tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) for text in texts]),
    ("chat", tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)),
    ("eos_token_id", tokenizer.eos_token_id),
    ("special_ids", sorted(tokenizer.all_special_ids)),
    ("size", len(tokenizer)),
)}}))
"""


def what_it_makes(tokenizer) -> dict:
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    return {
        "ids": ids,
        "decoded": [tokenizer.decode(i, skip_special_tokens=True) for i in ids],
        "chat": tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        "eos_token_id": tokenizer.eos_token_id,
        "special_ids": sorted(tokenizer.all_special_ids),
        "size": len(tokenizer),
    }


@pytest.fixture(scope="module")
def served_tokenizer():
    tokenizer = build_byte_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def folder(served_tokenizer, tmp_path) -> Path:
    return write_portable_tokenizer(served_tokenizer, tmp_path, "tiny-served")


def test_transformers_5_loads_the_folder_as_the_servers_tokenizer(served_tokenizer, folder):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert what_it_makes(loaded) == what_it_makes(served_tokenizer)


def transformers_4_refusal(folder: Path) -> str | None:
    """Why transformers 4.x's AutoTokenizer would not load ``folder`` as a fast tokenizer; None when it would."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("tokenizer_class") not in TRANSFORMERS_4_GENERIC_CLASSES:
        return f"Tokenizer class {config.get('tokenizer_class')} does not exist"
    if not (folder / TOKENIZER_FILE).is_file():
        return f"no {TOKENIZER_FILE} to build PreTrainedTokenizerFast from"
    tokens = {name: config[name] for name in SPECIAL_TOKEN_FIELDS if name in config}
    tokens |= {"additional_special_tokens": config.get("additional_special_tokens", [])}
    if not all(isinstance(t, str) for t in [*tokens.values()][:-1] + tokens["additional_special_tokens"]):
        return f"special tokens must be strings: {tokens}"
    if not isinstance(config.get("chat_template", ""), str):
        return "chat_template must be one template's text"
    return None


def test_the_folder_names_a_class_transformers_4_resolves(folder, served_tokenizer, tmp_path):
    assert transformers_4_refusal(folder) is None
    saved = tmp_path / "saved-by-transformers-5"
    served_tokenizer.save_pretrained(saved)
    assert transformers_4_refusal(saved) == "Tokenizer class TokenizersBackend does not exist", (
        "what issue 41 met: the check must catch a folder that transformers 5 saved"
    )


def test_the_folder_is_written_once_under_a_digest_of_its_files(served_tokenizer, folder, tmp_path):
    assert folder.parent == tmp_path and folder.name.startswith("tiny-served-")
    assert sorted(p.name for p in folder.iterdir()) == [TOKENIZER_FILE, CONFIG_FILE]
    assert write_portable_tokenizer(served_tokenizer, tmp_path, "tiny-served") == folder
    other = build_byte_tokenizer(VOCAB + 1)
    assert write_portable_tokenizer(other, tmp_path, "tiny-served") != folder, "other files, another folder"
    assert write_portable_tokenizer(served_tokenizer, tmp_path, "../odd name").parent == tmp_path


def test_a_tokenizer_without_tokenizer_json_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'slow' .*not a fast tokenizer"):
        write_portable_tokenizer(object(), tmp_path, "slow")


def transformers4_python() -> str:
    """The python of the tier's venv: in the ``transformers4`` phase a missing one fails; anywhere else (a plain
    ``pytest``) it skips, saying how to get it."""
    python = os.environ.get(TRANSFORMERS4_PYTHON)
    if python:
        return python
    message = f"${TRANSFORMERS4_PYTHON} names no python with transformers 4.x: `make test-transformers4` makes one"
    if os.environ.get("PERFSUITE_TEST_PHASE") == "transformers4":
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.transformers4
def test_transformers_4_loads_the_folder_as_the_servers_tokenizer(served_tokenizer, folder):
    python = transformers4_python()
    arguments = [str(folder), json.dumps(TEXTS), json.dumps(MESSAGES)]
    done = subprocess.run([python, "-c", LOAD_SCRIPT, *arguments], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout.strip().splitlines()[-1])
    assert made.pop("version").startswith("4."), "the tier's venv must hold transformers 4.x"
    assert made == what_it_makes(served_tokenizer)
