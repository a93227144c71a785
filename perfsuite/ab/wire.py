"""The A/B workers' protocol: typed messages as JSON lines over a worker's stdin and stdout.

Both sides of ``--perf-against`` run a worker over their own tree, so a
worker must decode what it is sent into *its tree's* classes (``Request``
of the reference commit, not of the current one) and the controller must
decode what comes back into its own. The codec is therefore structural: a
frozen dataclass travels as an object of all its fields, and is rebuilt
from the receiver's own class by that class's type hints. Every field is
sent, defaults too (the other tree's default may differ), and a field the
receiver's class does not have, or a required one it did not get, is an
error naming it: two sides that cannot hold the same request must not
measure different workloads.

This module imports only the standard library and ``perfsuite/codec.py``
(the structural codec, which results.json uses too): the worker loads it
by path, before putting the tree under test on ``sys.path``, and then it
loads the codec by path too, from beside its own package, never through
``import perfsuite`` (which would find the tree under test's, or none).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any


def _codec_by_path() -> ModuleType:
    """``perfsuite/codec.py`` of the tree this file is in, under a private name (see the module docstring)."""
    name = "_perfsuite_codec"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "codec.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the codec from {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while a class is made
        spec.loader.exec_module(module)
    return sys.modules[name]


if __package__:  # imported as perfsuite.ab.wire
    from perfsuite import codec
else:  # loaded by path by ab/worker_main.py
    codec = _codec_by_path()

PROTOCOL_VERSION = 1  # the worker and its controller read one wire.py: a change of shape meets no other version


class WireError(codec.CodecError):
    """A message that this side cannot read: malformed, of another protocol version, or of unknown shape."""


# -- messages -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """The worker's first line, once its tree is imported: who it is."""

    protocol_version: int
    tree: str  # the directory its perfsuite was imported from
    perfsuite_file: str  # perfsuite.__file__, to check the import came from ``tree``
    pid: int
    python: str


@dataclass(frozen=True, slots=True)
class Load:
    """Load the model once for the session (the worker answers ``Loaded``)."""

    model: str
    device: str
    dtype: str
    decode_mode: str
    threads: int | None = None


@dataclass(frozen=True, slots=True)
class Loaded:
    device: str  # resolved: "cpu", "cuda:0"
    model_bytes: int  # the weights' size, to check a second copy fits
    free_bytes: int | None  # the device's free memory after loading (None: unknown)
    max_context: int
    eos_token_id: int | None
    vocab_size: int | None
    special_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Tokenize:
    text: str


@dataclass(frozen=True, slots=True)
class Tokens:
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Build:
    """Build (or reuse) an engine by registered name; later ``Run`` messages name it by ``engine_id``.

    ``config``: an encoded ``perfsuite.adapters.EngineConfig``, each knob
    added after ``OLDEST_SUPPORTED`` left out while unset
    (``EngineConfig.identity``), so a worker over an older tree decodes it
    into that tree's ``EngineConfig``, and refuses a set knob it lacks by name.
    """

    engine_id: str
    engine: str
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Built:
    engine_id: str
    name: str
    batch_size: int
    runs_in_process: bool = True


@dataclass(frozen=True, slots=True)
class Run:
    """One run of ``engine_id`` over ``requests`` (each an encoded ``perfsuite.engine.Request``)."""

    engine_id: str
    requests: tuple[Any, ...]
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class RunDone:
    result: Any  # an encoded ``perfsuite.engine.RunResult``


@dataclass(frozen=True, slots=True)
class SetThreads:
    """Run from now on with ``num_threads`` intra-op threads (CPU); the controller sends both sides the same."""

    num_threads: int


@dataclass(frozen=True, slots=True)
class ThreadsSet:
    num_threads: int  # what torch reports after setting it


@dataclass(frozen=True, slots=True)
class Failed:
    """The worker raised while serving the last command; it is still alive and takes the next one."""

    error_type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


MESSAGES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Hello,
        Load,
        Loaded,
        Tokenize,
        Tokens,
        Build,
        Built,
        Run,
        RunDone,
        SetThreads,
        ThreadsSet,
        Failed,
        Shutdown,
    )
}


PROTOCOL = codec.Protocol("protocol", PROTOCOL_VERSION, MESSAGES, WireError)


def write_message(stream: IO[str], message: Any) -> None:
    """One message as one JSON line, flushed (the other side blocks on it)."""
    stream.write(dumps_message(message) + "\n")
    stream.flush()


def dumps_message(message: Any) -> str:
    """``message`` in the envelope (``perfsuite.codec.Protocol``): its fields, its type and the protocol version."""
    return PROTOCOL.dumps(message)


def loads_message(line: str) -> Any:
    """The message in ``line`` as this side's class; ``WireError`` naming what is wrong."""
    return PROTOCOL.loads(line)


# -- the structural codec (perfsuite/codec.py), its errors as this protocol's ---------------------------------------


def encode(value: Any) -> Any:
    """``value`` as plain JSON data (``perfsuite.codec.encode``: non-finite floats tagged, every float exact)."""
    try:
        return codec.encode(value)
    except codec.CodecError as error:
        raise WireError(str(error)) from None


def decode(annotation: Any, data: Any) -> Any:
    """``data`` (from ``encode``) rebuilt as ``annotation``, this side's type for it."""
    try:
        return codec.decode(annotation, data)
    except codec.CodecError as error:
        raise WireError(str(error)) from None


def read_message(stream: IO[str]) -> Any | None:
    """The next message, or None at end of stream."""
    line = stream.readline()
    if not line:
        return None
    return loads_message(line)
