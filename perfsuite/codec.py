"""One structural codec between frozen dataclasses and plain JSON data, and the envelope of a typed message.

The A/B wire, the Ray wire and results.json use the codec; both wires put
each message in the same envelope (``Protocol``): one JSON line of its
fields, its type's name and the protocol's version.

A frozen dataclass is written as an object of its fields and rebuilt from
the *reader's* class by that class's type hints, so the reader decides what
each value is (an A/B worker decodes into its own tree's ``Request``, a
session reading results.json into this version's ``TestResult``). Every
field is written, defaults too, except a None where None is the default: the
reader fills its own default, and a reader whose class predates the field
can still decode the value. A field the reader's class does not have, or a
required one that is missing, is an error naming it.

Non-finite floats: JSON has none. By default they are tagged
(``{"float": "nan"}``, ``"inf"``, ``"-inf"``), which gives back every float
exactly (the A/B wire). With ``nan_as_null`` NaN is written as null, which
a ``float`` field reads back as NaN (results.json, where a figure undefined
for a run is null for any JSON reader); infinities stay tagged either way,
and a null in a field that may be None reads as None.

This module imports only the standard library: the A/B worker loads it by
path (through ``ab/wire.py``), before the tree under test is on ``sys.path``.
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
from typing import Any

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class CodecError(ValueError):
    """Data that this side's classes cannot hold: of unknown shape, or a value that cannot be written."""


def encode(value: Any, *, nan_as_null: bool = False) -> Any:
    """``value`` as plain JSON data: dataclasses by field, enums by value, non-finite floats tagged (module doc)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: encode(getattr(value, f.name), nan_as_null=nan_as_null)
            for f in dataclasses.fields(value)
            if f.init and not (f.default is None and getattr(value, f.name) is None)
        }
    if isinstance(value, enum.Enum):
        return encode(value.value, nan_as_null=nan_as_null)
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return None if nan_as_null else {"float": "nan"}
        return {"float": "inf" if value > 0 else "-inf"}
    if isinstance(value, (tuple, list)):
        return [encode(item, nan_as_null=nan_as_null) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise CodecError(f"only str keys travel: {sorted(map(repr, value))[:5]}")
        return {key: encode(item, nan_as_null=nan_as_null) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CodecError(f"a {type(value).__name__} cannot travel: {value!r:.100}")


def decode(annotation: Any, data: Any, *, nan_as_null: bool = False) -> Any:
    """``data`` (from ``encode`` with the same ``nan_as_null``) rebuilt as ``annotation``, this side's type for it."""
    return _Decoder(nan_as_null).decode(annotation, data)


class _Decoder:
    def __init__(self, nan_as_null: bool) -> None:
        self.nan_as_null = nan_as_null

    def decode(self, annotation: Any, data: Any) -> Any:
        origin = typing.get_origin(annotation)
        if annotation is Any:
            return data
        if origin in (typing.Union, types.UnionType):
            return self._union(typing.get_args(annotation), data)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            return self._dataclass(annotation, data)
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            try:
                return annotation(data)
            except ValueError:
                raise CodecError(f"{data!r} is not a {annotation.__name__}") from None
        if origin in (tuple, list):
            return self._sequence(origin, typing.get_args(annotation), data)
        if origin in (dict, Mapping) or annotation in (dict, Mapping):
            args = typing.get_args(annotation) or (str, Any)
            _expect(data, dict, annotation)
            return {key: self.decode(args[1], item) for key, item in data.items()}
        return self._scalar(annotation, data)

    def _union(self, options: tuple[Any, ...], data: Any) -> Any:
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return self.decode(option, data)
            except CodecError as error:
                errors.append(str(error))
        raise CodecError(f"{data!r:.100} matches none of {options}: {'; '.join(errors)}")

    def _dataclass(self, cls: type, data: Any) -> Any:
        _expect(data, dict, cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise CodecError(
                f"{cls.__module__}.{cls.__qualname__} has no field {', '.join(unknown)}: this side's code predates "
                "what the other side sent"
            )
        hints = typing.get_type_hints(cls)
        values = {name: self.decode(hints[name], item) for name, item in data.items()}
        missing = [name for name, f in fields.items() if name not in values and _has_no_default(f) and f.init]
        if missing:
            raise CodecError(f"{cls.__qualname__} needs {', '.join(missing)}, which the other side did not send")
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            raise CodecError(f"{cls.__qualname__}: {error}") from None

    def _sequence(self, origin: type, args: tuple[Any, ...], data: Any) -> Any:
        _expect(data, list, origin)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise CodecError(f"expected {len(args)} items, got {len(data)}")
            return tuple(self.decode(arg, item) for arg, item in zip(args, data))
        item_type = args[0] if args else Any
        return origin(self.decode(item_type, item) for item in data)

    def _scalar(self, annotation: Any, data: Any) -> Any:
        if annotation is float:
            return self._float(data)
        if annotation is int:
            if isinstance(data, int) and not isinstance(data, bool):
                return data
            raise CodecError(f"expected an integer, got {data!r:.100}")
        if annotation in (str, bool):
            _expect(data, annotation, annotation)
            return data
        if annotation is type(None):
            if data is not None:
                raise CodecError(f"expected null, got {data!r:.100}")
            return None
        raise CodecError(f"no decoding for {annotation!r}")

    def _float(self, data: Any) -> float:
        if isinstance(data, dict) and set(data) == {"float"} and data["float"] in _NON_FINITE:
            return _NON_FINITE[data["float"]]
        if data is None and self.nan_as_null:
            return math.nan
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise CodecError(f"expected a number, got {data!r:.100}")


def _expect(data: Any, kind: type, annotation: Any) -> None:
    if not isinstance(data, kind):
        raise CodecError(f"expected {kind.__name__} for {annotation!r}, got {type(data).__name__}: {data!r:.100}")


def _has_no_default(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# -- the envelope: one message as one JSON line ---------------------------------------------------------------------

TYPE_KEY = "type"
VERSION_KEY = "v"


@dataclass(frozen=True)
class Protocol:
    """A set of message types under one version: how each message travels, as one JSON line.

    A line holds the message's fields (``encode``), its type's name and the
    version; the reader refuses another version, a type it does not expect and
    a shape its class cannot hold, with ``error`` (a ``CodecError``) naming which.
    ``name`` is how those errors name the protocol; ``on_other_version`` what
    they add when the other side speaks another version.
    """

    name: str
    version: int
    messages: Mapping[str, type]
    error: type[CodecError] = CodecError
    on_other_version: str = ""

    def dumps(self, message: Any) -> str:
        """``message`` as one JSON line (no newline)."""
        type_name = type(message).__name__
        if self.messages.get(type_name) is not type(message):
            raise self.error(f"{type_name} is not a message of {self.name} {self.version}")
        try:
            body = encode(message)
        except CodecError as error:
            raise self.error(f"{type_name}: {error}") from None
        envelope = {TYPE_KEY: type_name, VERSION_KEY: self.version, **body}
        return json.dumps(envelope, allow_nan=False, separators=(",", ":"))

    def loads(self, text: Any, expected: tuple[type, ...] | None = None) -> Any:
        """``text`` (from ``dumps``) as this side's message; with ``expected``, only one of those types."""
        data = self._envelope(text)
        type_name = data.pop(TYPE_KEY)
        wanted = self.messages if expected is None else {cls.__name__: cls for cls in expected}
        if not isinstance(type_name, str) or type_name not in wanted:  # a list or dict name would raise TypeError
            if expected is None:
                raise self.error(f"unknown message {type_name!r}")
            raise self.error(f"expected a {' or '.join(wanted)} message, got {type_name!r}")
        try:
            return decode(wanted[type_name], data)
        except CodecError as error:
            raise self.error(str(error)) from None

    def _envelope(self, text: Any) -> dict[str, Any]:
        """The line's JSON object, its version checked and taken out; its type still in it."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise self.error(f"not a JSON line ({error}): {str(text)[:200]!r}") from None
        if not isinstance(data, dict) or TYPE_KEY not in data:
            raise self.error(f"not a message (no {TYPE_KEY!r}): {str(text)[:200]!r}")
        version = data.pop(VERSION_KEY, None)
        if type(version) is not int or version != self.version:  # true and 1.0 equal 1 in Python, not here
            raise self.error(f"{self.name} version {version!r}, this side speaks {self.version}{self.on_other_version}")
        return data
