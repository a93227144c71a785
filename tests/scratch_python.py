"""A scratch Python for perfsuite as a user installs it: a venv outside this tree, and a copy of perfsuite's sources.

The venv borrows this venv's third-party packages (torch, transformers,
pytest, pip, ...) through a path file, whose own path files (this tree's
editable install among them) Python then does not read; so nothing is
downloaded, and perfsuite is what the test installs into it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# The scratch venv may not see this tree, nor a PYTHONPATH pointing at it.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "HYPOTHESIS_PROFILE")
ROOT = Path(__file__).resolve().parents[1]
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".hypothesis", "reports")


def scratch_env() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in DROPPED_ENV}
    # tiny-random's matrices are too small to split between threads, and on a busy 2-core machine a second
    # thread waits for a core: a token of the reference took 84 ms with 2 threads, 5.6 ms with 1.
    env["OMP_NUM_THREADS"] = "1"
    return env


def scratch_venv(tmp_path: Path, env: dict[str, str]) -> Path:
    """A venv without pip whose site-packages reach this venv's by a path file (read as a path, not a site)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], env=env, check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             env=env, check=True, capture_output=True, text=True)  # fmt: skip
    (Path(purelib.stdout.strip()) / "borrowed-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def copy_perfsuite_source(tmp_path: Path) -> Path:
    """perfsuite's packaging inputs, copied: a build writes into its source tree."""
    source = tmp_path / "perfsuite-source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "perfsuite", source / "perfsuite", ignore=COPY_IGNORE)
    return source
