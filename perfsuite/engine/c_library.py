"""perfsuite's C kernels: compiled once per process with the system's C compiler, loaded with ctypes.

Each source in ``csrc/`` is compiled on first use (0.2-0.7 s each) with
``$CC`` if set, else ``cc``, and the library is kept under the cache root
(``<cache root>/kernels``, ``perfsuite.cache_dir``), so that the next process
loads it instead: a perf session's workers and a test suite's subprocesses
each paid about 1.5 s for the three. A kept library is named by a hash of
everything it was built from: the source, the compiler's command line and its
program's size and time, the macros, the flag sets, and this CPU's model and
instruction-set flags (``/proc/cpuinfo``), so that a library built with
``-march=native`` never runs on another kind of CPU. It is written to a
temporary file and renamed, so a reader never loads half of one; one that
does not load is built again, and a cache that cannot be written leaves each
process to build its own. Where no compiler works, ``build_library`` says why
(``Unavailable``), and the caller keeps its torch path.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from perfsuite.cache_dir import cache_root, write_whole
from perfsuite.host import cpu_features, cpu_model

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
    ``FLAG_SETS``, and loaded; ``defines``: macros set for it (``-D``), as a benchmark builds a variant.
    A library this machine built before from the same inputs is loaded from the cache instead."""
    try:
        command_line = shlex.split(compiler)
    except ValueError as error:  # CC="gcc -DFOO'": an unclosed quote
        return Unavailable(f"CC={compiler!r} is not a command line: {error}", BUILD_FIX)
    if not command_line:
        return Unavailable("CC is blank", BUILD_FIX)
    kept = kept_library_path(command_line, source, defines)
    if kept.is_file():
        with contextlib.suppress(OSError):  # unreadable or not a library: built again below
            return ctypes.CDLL(str(kept))
    return _compile(command_line, source, defines, kept)


def _compile(command_line: list[str], source: Path, defines: tuple[str, ...], kept: Path) -> ctypes.CDLL | Unavailable:
    """``source`` compiled in a temporary directory, loaded, and copied to ``kept`` for later processes."""
    compiler, errors = " ".join(command_line), []
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
                    loaded = ctypes.CDLL(str(library))  # the mapping outlives the file
                except OSError as error:
                    errors.append(f"{flags}: {error}")
                    continue
                with contextlib.suppress(OSError):  # unwritable: each process builds its own
                    write_whole(kept, library.read_bytes())
                return loaded
            errors.append(f"{flags}: {(result.stderr.strip().splitlines() or [f'exit {result.returncode}'])[-1]}")
    return Unavailable(f"{compiler} could not build {source.name}: " + "; ".join(errors), BUILD_FIX)


def kept_library_path(command_line: list[str], source: Path, defines: tuple[str, ...] = ()) -> Path:
    """Where the library built from these inputs on this kind of CPU is kept (``<cache root>/kernels``)."""
    program = shutil.which(command_line[0]) or command_line[0]
    try:
        status = os.stat(program)
        program_identity = f"{os.path.realpath(program)} {status.st_size} {status.st_mtime_ns}"
    except OSError:
        program_identity = program
    digest = hashlib.sha256(source.read_bytes())
    for part in (repr(command_line), program_identity, repr(defines), repr(FLAG_SETS), cpu_identity()):
        digest.update(b"\0" + part.encode())
    return cache_root() / "kernels" / f"{source.stem}-{digest.hexdigest()[:20]}.so"


@functools.cache
def cpu_identity() -> str:
    """This CPU's model and instruction-set flags, what ``-march=native`` compiles for."""
    return f"{cpu_model()} | {cpu_features()}"


def build_kernels(compiler: str, source: Path, wrap: Callable[[ctypes.CDLL], Kernels]) -> Kernels | Unavailable:
    """``source`` built with ``compiler`` and wrapped (``wrap``: the Python face of its functions), or why not."""
    library = build_library(compiler, source)
    return library if isinstance(library, Unavailable) else wrap(library)


def load_kernels(source: Path, wrap: Callable[[ctypes.CDLL], Kernels]) -> Kernels | Unavailable:
    """``build_kernels`` with the system's compiler (``system_compiler``)."""
    compiler = system_compiler()
    return compiler if isinstance(compiler, Unavailable) else build_kernels(compiler, source, wrap)
