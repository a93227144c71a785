"""The install is pinned, so a new machine gets the fingerprint the shipped baselines were made under."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Libraries whose versions the environment fingerprint holds, or that decide how the model computes.
FINGERPRINTED = ("transformers", "tokenizers", "safetensors", "accelerate", "gguf", "numpy")


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if match:
            found[_normalise(match.group(1))] = match.group(2)
    return found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("package", FINGERPRINTED)
def test_every_fingerprinted_library_is_pinned_exactly(package):
    assert _normalise(package) in pins(), f"constraints.txt does not pin {package}; run `make lock`"


@pytest.mark.parametrize("package", FINGERPRINTED)
def test_this_environment_follows_the_lock(package):
    try:
        installed = version(package)
    except PackageNotFoundError:
        pytest.skip(f"{package} is not installed here")
    assert installed == pins()[_normalise(package)], (
        f"{package} {installed} is installed but constraints.txt pins {pins()[_normalise(package)]}: "
        "install with `make install` (it passes -c constraints.txt), or refresh the lock with `make lock`"
    )


def test_the_install_rule_uses_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    install_lines = _perfsuite_install_lines(makefile)
    main_venv_lines = [line for line in install_lines if "$(BIN)/python" in line and "PEERS" not in line]
    assert main_venv_lines and all("-c constraints.txt" in line for line in main_venv_lines)


def test_every_install_of_perfsuite_is_constrained_except_the_lock_refresh():
    # The peers venv installs perfsuite under vLLM's own pins (vLLM dictates torch there);
    # only `make lock`, which resolves afresh in a temporary venv, may go unconstrained.
    makefile = (ROOT / "Makefile").read_text()
    install_lines = _perfsuite_install_lines(makefile)
    unconstrained = [line.strip() for line in install_lines if " -c " not in line and "$$tmp" not in line]
    assert not unconstrained, f"pip installs perfsuite without a constraints file: {unconstrained}"


def _perfsuite_install_lines(makefile: str) -> list[str]:
    # `-e .` or `-e ".[docs]"` (this checkout with an extra)
    return [line for line in makefile.splitlines() if "pip install" in line and re.search(r' -e "?\.', line)]
