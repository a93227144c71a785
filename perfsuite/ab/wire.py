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

This module imports only the standard library: the worker loads it by
path, before putting the tree under test on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

PROTOCOL_VERSION = 1
_TYPE_KEY = "type"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class WireError(ValueError):
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
    """Build (or reuse) an engine by registered name; later ``Run`` messages name it by ``engine_id``."""

    engine_id: str
    engine: str
    batch_size: int
    max_seq_len: int
    prefill_batch_size: int | None = None
    max_num_batched_tokens: int | None = None
    num_kv_blocks: int | None = None  # an older tree's Build lacks it: decoding fills the default


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
class Failed:
    """The worker raised while serving the last command; it is still alive and takes the next one."""

    error_type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


MESSAGES: dict[str, type] = {
    cls.__name__: cls for cls in (Hello, Load, Loaded, Tokenize, Tokens, Build, Built, Run, RunDone, Failed, Shutdown)
}


def write_message(stream: IO[str], message: Any) -> None:
    """One message as one JSON line, flushed (the other side blocks on it)."""
    stream.write(dumps_message(message) + "\n")
    stream.flush()


def dumps_message(message: Any) -> str:
    name = type(message).__name__
    if MESSAGES.get(name) is not type(message):
        raise WireError(f"{name} is not a message of protocol {PROTOCOL_VERSION}")
    body = encode(message)
    return json.dumps({_TYPE_KEY: name, "v": PROTOCOL_VERSION, **body}, allow_nan=False, separators=(",", ":"))


def loads_message(line: str) -> Any:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise WireError(f"not a JSON line ({error}): {line[:200]!r}") from None
    if not isinstance(data, dict) or _TYPE_KEY not in data:
        raise WireError(f"not a message (no {_TYPE_KEY!r}): {line[:200]!r}")
    version = data.pop("v", None)
    if type(version) is not int or version != PROTOCOL_VERSION:  # true and 1.0 equal 1 in Python, not here
        raise WireError(f"protocol version {version!r}, this side speaks {PROTOCOL_VERSION}")
    name = data.pop(_TYPE_KEY)
    if not isinstance(name, str) or name not in MESSAGES:  # a list or dict name would raise TypeError
        raise WireError(f"unknown message {name!r}")
    return decode(MESSAGES[name], data)


# -- the structural codec ------------------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses by field, enums by value, non-finite floats tagged.

    A field that is None where None is its default is not sent: the receiver
    fills its own default, and a receiver whose code predates the field (an
    older tree under ``--perf-against``) can still decode the value.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: encode(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.init and not (f.default is None and getattr(value, f.name) is None)
        }
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise WireError(f"only str keys travel: {sorted(map(repr, value))[:5]}")
        return {key: encode(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise WireError(f"a {type(value).__name__} cannot travel: {value!r:.100}")


def decode(annotation: Any, data: Any) -> Any:
    """``data`` (from ``encode``) rebuilt as ``annotation``, this side's type for it."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        return _decode_union(typing.get_args(annotation), data)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _decode_dataclass(annotation, data)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(data)
        except ValueError:
            raise WireError(f"{data!r} is not a {annotation.__name__}") from None
    if origin in (tuple, list):
        return _decode_sequence(origin, typing.get_args(annotation), data)
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        args = typing.get_args(annotation) or (str, Any)
        _expect(data, dict, annotation)
        return {key: decode(args[1], item) for key, item in data.items()}
    return _decode_scalar(annotation, data)


def _decode_union(options: tuple[Any, ...], data: Any) -> Any:
    if data is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return decode(option, data)
        except WireError as error:
            errors.append(str(error))
    raise WireError(f"{data!r:.100} matches none of {options}: {'; '.join(errors)}")


def _decode_dataclass(cls: type, data: Any) -> Any:
    _expect(data, dict, cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise WireError(
            f"{cls.__module__}.{cls.__qualname__} has no field {', '.join(unknown)}: this side's code predates "
            "what the other side sent"
        )
    hints = typing.get_type_hints(cls)
    values = {name: decode(hints[name], item) for name, item in data.items()}
    missing = [name for name, f in fields.items() if name not in values and _has_no_default(f) and f.init]
    if missing:
        raise WireError(f"{cls.__qualname__} needs {', '.join(missing)}, which the other side did not send")
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise WireError(f"{cls.__qualname__}: {error}") from None


def _decode_sequence(origin: type, args: tuple[Any, ...], data: Any) -> Any:
    _expect(data, list, origin)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(data):
            raise WireError(f"expected {len(args)} items, got {len(data)}")
        return tuple(decode(arg, item) for arg, item in zip(args, data))
    item_type = args[0] if args else Any
    return origin(decode(item_type, item) for item in data)


def _decode_scalar(annotation: Any, data: Any) -> Any:
    if annotation is float:
        if isinstance(data, dict) and set(data) == {"float"} and data["float"] in _NON_FINITE:
            return _NON_FINITE[data["float"]]
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise WireError(f"expected a number, got {data!r:.100}")
    if annotation is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise WireError(f"expected an integer, got {data!r:.100}")
    if annotation in (str, bool):
        _expect(data, annotation, annotation)
        return data
    if annotation is type(None):
        if data is not None:
            raise WireError(f"expected null, got {data!r:.100}")
        return None
    raise WireError(f"no decoding for {annotation!r}")


def _expect(data: Any, kind: type, annotation: Any) -> None:
    if not isinstance(data, kind):
        raise WireError(f"expected {kind.__name__} for {annotation!r}, got {type(data).__name__}: {data!r:.100}")


def _has_no_default(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def read_message(stream: IO[str]) -> Any | None:
    """The next message, or None at end of stream."""
    line = stream.readline()
    if not line:
        return None
    return loads_message(line)
