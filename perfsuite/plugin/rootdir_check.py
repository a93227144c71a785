"""A ``--perf-*`` option's value that pytest took for a test path while it chose the rootdir, as a usage error.

pytest chooses its rootdir (and ini file) from the command line's paths
before it loads plugins from entry points, so ``--perf-report-dir DIR``
reaches that choice as an unknown flag followed by the path ``DIR``. Where
``DIR`` exists outside the project, the rootdir moves to an ancestor of both,
the project's ini file is not read, and ``--perf-against`` finds no git
repository (pytest's issue #1435). No installed plugin runs early enough to
change that choice, and remaking it afterwards would leave pytest's own state
(addopts, pythonpath, confcutdir) from the wrong ini file; so the session stops
here, in one line that says to write ``--perf-report-dir=DIR``, which pytest
does not take for a path. Where the path changes nothing, nothing is said.
"""

from __future__ import annotations

import inspect
import itertools
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest


def check_rootdir_unmoved(config: pytest.Config, flags: Sequence[str]) -> None:
    """A usage error when a value of one of ``flags``, given after a space, moved pytest's rootdir or ini file."""
    taken = values_taken_for_paths(_early_args(config), flags, config.invocation_params.dir)
    if not taken:
        return
    given = [str(path) for path in (config.option.file_or_dir or [])]
    chosen, right = _setup(config, given + [value for _, value in taken]), _setup(config, given)
    if chosen is None or right is None or chosen == right:
        return
    flag, value = taken[0]
    raise pytest.UsageError(
        f"{flag} {value}: pytest took {value} for a test path while choosing its rootdir, before perfsuite's options "
        f"were known, and chose {chosen[0]} instead of {right[0]}; write {flag}={value}"
    )


def values_taken_for_paths(args: Sequence[str], flags: Sequence[str], invocation_dir: Path) -> list[tuple[str, str]]:
    """(flag, value) for each of ``flags`` given as two arguments whose value is a path that exists."""
    return [
        (flag, value)
        for flag, value in itertools.pairwise(args)
        if flag in flags and not value.startswith("-") and (invocation_dir / value).exists()
    ]


def _early_args(config: pytest.Config) -> list[str]:
    """What pytest chose its rootdir from: $PYTEST_ADDOPTS, then the command line."""
    return [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, config.invocation_params.args)]


def _setup(config: pytest.Config, args: list[str]) -> tuple[Path, Path | None] | None:
    """The rootdir and ini file pytest chooses from ``args``; None where this pytest's chooser cannot be called."""
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:
        return None
    option = config.option
    wanted = {
        "inifile": option.inifilename,
        "override_ini": option.override_ini,
        "args": args,
        "rootdir_cmd_arg": option.rootdir or None,
        "invocation_dir": config.invocation_params.dir,
    }
    try:
        accepted = inspect.signature(determine_setup).parameters
        rootpath, inipath, *_ = determine_setup(**{name: value for name, value in wanted.items() if name in accepted})
    except (TypeError, ValueError, pytest.UsageError):  # another pytest's signature, or a config it refuses
        return None
    return rootpath, inipath
