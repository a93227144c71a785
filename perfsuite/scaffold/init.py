"""Write a starter conftest, perf test, equivalence test and CI workflow into a project; never overwrite.

Every file is checked before any is written, so a refusal leaves the project
as it was (no half-initialised tree). The templates live beside this module
in ``templates/`` and are filled with ``string.Template``: ``$engine`` (the
registered name), ``$ident`` (that name as a Python identifier).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

ENGINE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")

# Where each template goes, relative to the project's root.
TEMPLATES = {
    "conftest.py.tmpl": "conftest.py",
    "test_perf.py.tmpl": "tests/test_perf.py",
    "test_equivalence.py.tmpl": "tests/test_equivalence.py",
    "perf.yml.tmpl": ".github/workflows/perf.yml",
}


class InitError(ValueError):
    """The project cannot be initialised as asked (a file exists, a bad engine name, an unwritable place)."""


@dataclass(frozen=True, slots=True)
class PlannedFile:
    path: Path
    text: str


def planned_files(root: Path, engine: str) -> list[PlannedFile]:
    """The files ``perfsuite init`` writes for ``engine`` under ``root``, filled in."""
    if not ENGINE_NAME.fullmatch(engine):
        raise InitError(
            f"engine name {engine!r}: use letters, digits, '-', '_' or '.', starting with a letter (e.g. my-engine)"
        )
    values = {"engine": engine, "ident": re.sub(r"\W", "_", engine)}
    templates = resources.files("perfsuite.scaffold") / "templates"
    return [
        PlannedFile(root / target, Template((templates / name).read_text(encoding="utf-8")).substitute(values))
        for name, target in TEMPLATES.items()
    ]


def write_project(root: Path, engine: str) -> list[Path]:
    """Write every planned file, or none: an existing one is refused, naming all that exist."""
    if root.exists() and not root.is_dir():
        raise InitError(f"{root} is not a directory; give the root of your project")
    files = planned_files(root, engine)
    existing = [str(planned.path) for planned in files if planned.path.exists()]
    if existing:
        raise InitError(
            f"refusing to overwrite {', '.join(existing)}; move them aside (or merge the templates by hand) "
            "and run perfsuite init again: nothing was written"
        )
    written: list[Path] = []
    try:
        for planned in files:
            planned.path.parent.mkdir(parents=True, exist_ok=True)
            with planned.path.open("x", encoding="utf-8") as handle:  # "x": never over a file made meanwhile
                handle.write(planned.text)
            written.append(planned.path)
    except OSError as error:
        for path in written:  # all or nothing
            path.unlink(missing_ok=True)
        raise InitError(f"cannot write {error.filename or root}: {error.strerror or error}; nothing was written") from None
    return written
