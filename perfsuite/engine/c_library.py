"""perfsuite's C kernels: compiled once per process with the system's C compiler, loaded with ctypes.

Each source in ``csrc/`` is compiled on first use (about a third of a
second) into a temporary directory, with ``$CC`` if set, else ``cc``; nothing
is cached on disk, so a library built with ``-march=native`` never runs on
another machine. Where no compiler works, ``build_library`` says why
(``Unavailable``), and the caller keeps its torch path.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

Kernels = TypeVar("Kernels")

CSRC = Path(__file__).with_name("csrc")
# Tried in order: with glibc's vector exp (libmvec), then without it, then for a compiler without -march=native.
FAST = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
FLAG_SETS = (  # (compile flags, libraries)
    ((*FAST, "-DPERFSUITE_LIBMVEC"), ("-lmvec", "-lm")),
    (FAST, ("-lm",)),
    (("-O3", "-fopenmp"), ("-lm",)),
)
BUILD_FIX = "install a C compiler (gcc or clang) or set CC to one that works"


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Why a C kernel is not used: its caller keeps the torch path.

    ``fix`` is what would give it the kernel, where the kernel was wanted and
    could not be built (no working C compiler); None where the torch path was
    chosen or the kernel does not apply.
    """

    reason: str
    fix: str | None = None


def system_compiler() -> str | Unavailable:
    """``$CC``, else ``cc`` or ``gcc`` on PATH; or why there is none."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return Unavailable("no C compiler: CC is unset and neither cc nor gcc is on PATH", BUILD_FIX)
    return compiler


def build_library(compiler: str, source: Path, defines: tuple[str, ...] = ()) -> ctypes.CDLL | Unavailable:
    """``source`` compiled with ``compiler`` (a command line: ``CC="ccache gcc"`` works), trying each of
    ``FLAG_SETS``, and loaded; ``defines``: macros set for it (``-D``), as a benchmark builds a variant."""
    try:
        command_line = shlex.split(compiler)
    except ValueError as error:  # CC="gcc -DFOO'": an unclosed quote
        return Unavailable(f"CC={compiler!r} is not a command line: {error}", BUILD_FIX)
    if not command_line:
        return Unavailable("CC is blank", BUILD_FIX)
    errors = []
    with tempfile.TemporaryDirectory(prefix=f"perfsuite-{source.stem.replace('_', '-')}-") as directory:
        library = Path(directory) / f"{source.stem}.so"
        for compile_flags, libraries in FLAG_SETS:
            flags = " ".join(compile_flags)
            command = [*command_line, *compile_flags, *(f"-D{name}" for name in defines), "-shared", "-fPIC",
                       str(source), "-o", str(library), *libraries]  # fmt: skip
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
            except OSError as error:
                return Unavailable(f"{compiler} could not run: {error}", BUILD_FIX)
            except subprocess.TimeoutExpired:
                errors.append(f"{flags}: timed out")
                continue
            if result.returncode == 0:
                try:
                    return ctypes.CDLL(str(library))  # the mapping outlives the file
                except OSError as error:
                    errors.append(f"{flags}: {error}")
                    continue
            errors.append(f"{flags}: {(result.stderr.strip().splitlines() or [f'exit {result.returncode}'])[-1]}")
    return Unavailable(f"{compiler} could not build {source.name}: " + "; ".join(errors), BUILD_FIX)


def build_kernels(compiler: str, source: Path, wrap: Callable[[ctypes.CDLL], Kernels]) -> Kernels | Unavailable:
    """``source`` built with ``compiler`` and wrapped (``wrap``: the Python face of its functions), or why not."""
    library = build_library(compiler, source)
    return library if isinstance(library, Unavailable) else wrap(library)


def load_kernels(source: Path, wrap: Callable[[ctypes.CDLL], Kernels]) -> Kernels | Unavailable:
    """``build_kernels`` with the system's compiler (``system_compiler``)."""
    compiler = system_compiler()
    return compiler if isinstance(compiler, Unavailable) else build_kernels(compiler, source, wrap)
