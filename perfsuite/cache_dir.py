"""Where perfsuite keeps what it computed once and may reuse: ``$PERFSUITE_CACHE_DIR``, else ``~/.cache/perfsuite``.

Model copies (``perfsuite.models.cache``) and the projection kernels chosen
on this machine (``perfsuite.engine.projection``) live there.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "PERFSUITE_CACHE_DIR"


def cache_root() -> Path:
    """``$PERFSUITE_CACHE_DIR`` if set and not empty, else ``~/.cache/perfsuite``."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "perfsuite"
