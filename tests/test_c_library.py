"""A C kernel built once is kept and loaded by later processes, and only where every input it was built from agrees.

Mutants it kills: a cache keyed without the CPU's flags (a ``-march=native``
library loaded on another kind of CPU), or without the source or the
compiler; a kept file that does not load taken as a failure instead of built
again; a cache that cannot be written failing the build; a half-written
library left where a reader would load it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perfsuite.cache_dir import CACHE_DIR_ENV
from perfsuite.engine import c_library
from perfsuite.engine.c_library import Unavailable, build_library, kept_library_path

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

SOURCE = "int add(int a, int b) { return a + b; }\n"


@pytest.fixture
def counting_compiler(tmp_path, monkeypatch) -> tuple[str, Path]:
    """A compiler that logs each run and hands it to the real one; the cache root in ``tmp_path``."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    log = tmp_path / "runs.log"
    wrapper = tmp_path / "counting-cc"
    real = shutil.which("cc") or shutil.which("gcc")
    wrapper.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


def runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def source_file(tmp_path: Path, text: str = SOURCE) -> Path:
    source = tmp_path / "adder.c"
    source.write_text(text)
    return source


def add(library) -> int:
    assert not isinstance(library, Unavailable), library
    return library.add(2, 3)


def test_a_library_built_once_is_loaded_by_the_next_build_without_compiling(counting_compiler, tmp_path):
    compiler, log = counting_compiler
    source = source_file(tmp_path)
    assert add(build_library(compiler, source)) == 5
    compiled = runs(log)
    assert compiled >= 1
    assert kept_library_path([compiler], source).is_file()
    assert add(build_library(compiler, source)) == 5
    assert runs(log) == compiled, "the kept library was loaded, not built again"
    assert not [p for p in kept_library_path([compiler], source).parent.iterdir() if p.name.startswith(".")], (
        "no temporary file is left beside it"
    )


@pytest.mark.parametrize("change", ["another CPU", "another source", "another macro"])
def test_a_library_is_built_again_when_anything_it_was_built_from_differs(
    counting_compiler, tmp_path, change, monkeypatch
):
    compiler, log = counting_compiler
    source = source_file(tmp_path)
    build_library(compiler, source)
    compiled = runs(log)
    defines: tuple[str, ...] = ()
    if change == "another CPU":
        c_library.cpu_identity.cache_clear()
        monkeypatch.setattr(c_library, "cpu_identity", lambda: "another CPU | avx2 fma")
    elif change == "another source":
        source_file(tmp_path, SOURCE + "int sub(int a, int b) { return a - b; }\n")
    else:
        defines = ("PERFSUITE_SOMETHING",)
    assert add(build_library(compiler, source, defines)) == 5
    assert runs(log) > compiled


def test_a_kept_file_that_does_not_load_is_built_again_and_replaced(counting_compiler, tmp_path):
    compiler, log = counting_compiler
    source = source_file(tmp_path)
    kept = kept_library_path([compiler], source)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"half a library")
    assert add(build_library(compiler, source)) == 5
    assert runs(log) >= 1
    assert kept.read_bytes() != b"half a library"


def test_a_cache_that_cannot_be_written_costs_a_build_per_process_not_an_error(
    counting_compiler, tmp_path, monkeypatch
):
    compiler, log = counting_compiler
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocked))
    source = source_file(tmp_path)
    assert add(build_library(compiler, source)) == 5
    first = runs(log)
    assert add(build_library(compiler, source)) == 5
    assert runs(log) == 2 * first, "nothing kept: built again"


def test_the_cpu_identity_names_the_instruction_set_where_linux_lists_it():
    identity = c_library.cpu_identity()
    if Path("/proc/cpuinfo").exists() and "flags" in Path("/proc/cpuinfo").read_text():
        assert len(identity.split(" | ", 1)[1].split()) > 5, identity
