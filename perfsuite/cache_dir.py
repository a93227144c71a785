"""Where perfsuite keeps what it computed once and may reuse: ``$PERFSUITE_CACHE_DIR``, else ``~/.cache/perfsuite``.

Model copies (``perfsuite.models.cache``), the projection kernels chosen
on this machine (``perfsuite.engine.projection``) and the C kernels built for
its CPU (``perfsuite.engine.c_library``) live there, each written whole
(``write_whole``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_DIR_ENV = "PERFSUITE_CACHE_DIR"


def cache_root() -> Path:
    """``$PERFSUITE_CACHE_DIR`` if set and not empty, else ``~/.cache/perfsuite``."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "perfsuite"


def write_whole(path: Path, data: bytes) -> None:
    """``data`` written to ``path`` through a temporary file beside it, renamed over it: a reader (another
    process) finds the old file or the new one, never half of one. ``OSError`` where it cannot be written, the
    temporary file removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    try:
        with os.fdopen(descriptor, "wb") as f:
            f.write(data)
        os.chmod(temporary, 0o644)  # a file like any other in the cache: mkstemp makes it 0600
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
