"""Write a starter conftest, perf test, equivalence test and CI workflow into a project; never overwrite.

Every file is checked before any is written, so a refusal leaves the project
as it was (no half-initialised tree). The templates live beside this module
in ``templates/`` and are filled with ``string.Template``: ``$engine`` (the
registered name), ``$ident`` (that name as a Python identifier), ``$source``
(where the CI runner installs perfsuite from, quoted for YAML).
"""

from __future__ import annotations

import json
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


def check_source(source: str) -> str:
    """The workflow's install source as given, or ``InitError``: a bare name would install what an index serves."""
    if source.startswith("-") or "\n" in source:
        raise InitError(f"--perfsuite-source {source!r}: give the source itself, not pip options")
    if "/" not in source and not source.lower().endswith(".whl"):
        raise InitError(
            f"--perfsuite-source {source!r}: name where the runner gets perfsuite, a git URL "
            "(git+https://github.com/you/perfsuite@<commit>) or a wheel's or a checkout's path; "
            "a bare name installs whatever a package index serves under it"
        )
    return source


@dataclass(frozen=True, slots=True)
class PlannedFile:
    path: Path
    text: str


def planned_files(root: Path, engine: str, source: str) -> list[PlannedFile]:
    """The files ``perfsuite init`` writes for ``engine`` under ``root``; the CI installs perfsuite from ``source``."""
    if not ENGINE_NAME.fullmatch(engine):
        raise InitError(
            f"engine name {engine!r}: use letters, digits, '-', '_' or '.', starting with a letter (e.g. my-engine)"
        )
    # A JSON string is a YAML double-quoted scalar: any path or URL survives the workflow file as it is.
    values = {"engine": engine, "ident": re.sub(r"\W", "_", engine), "source": json.dumps(check_source(source))}
    templates = resources.files("perfsuite.scaffold") / "templates"
    return [
        PlannedFile(root / target, Template((templates / name).read_text(encoding="utf-8")).substitute(values))
        for name, target in TEMPLATES.items()
    ]


def write_project(root: Path, engine: str, source: str) -> list[Path]:
    """Write every planned file, or none: an existing one is refused, naming all that exist."""
    if root.exists() and not root.is_dir():
        raise InitError(f"{root} is not a directory; give the root of your project")
    files = planned_files(root, engine, source)
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
        raise InitError(
            f"cannot write {error.filename or root}: {error.strerror or error}; nothing was written"
        ) from None
    return written
