"""Parsers for argparse ``type=``: a bad value fails while arguments are parsed.

Shared by the CLI and the pytest options (pytest's parser is argparse). Only
the standard library is imported here, so ``perfsuite run`` starts without pytest.
"""

from __future__ import annotations

import argparse
import math
import os


def integer_at_least(minimum: int, what: str = "an integer", maximum: int | None = None, why: str = ""):
    """An integer of at least ``minimum`` (and at most ``maximum``; ``why`` says where that limit comes from)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} (at least {minimum}), got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"expected {what} (at most {maximum}{why}), got {value}")
        return value

    return parse


positive_int = integer_at_least(1, "a positive integer")


def num_cpus() -> int:
    """The CPUs this process may run on: more threads than that only wait for one."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def thread_count(text: str) -> int:
    """A number of threads, 1 up to this machine's CPUs (a million threads would exhaust it, not speed it up)."""
    return integer_at_least(1, "a number of threads", num_cpus(), ", the CPUs this machine gives this process")(text)


def number(text: str) -> float:
    """A finite number: nan compares false with every bound, so it would slip past each check after this one."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_number(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def probability(text: str) -> float:
    value = number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number strictly between 0 and 1, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a fraction >= 0 (0.1 means 10%), got {text!r}")
    return value


def engine_names(text: str) -> tuple[str, ...]:
    """Comma-separated names; whether they exist is the caller's check.

    The plugin makes it once conftest files have registered their engines.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated engine names, e.g. static,inflight,hf-static")
    return names


def one_of(choices: tuple[str, ...]):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown value {text!r}; choose {', '.join(choices)}")
        return text

    return parse


def argument_type(parse):
    """``parse``, whose ValueError says what is wrong, as a ``type=``: argparse shows that message.

    (argparse itself answers a ValueError from ``type=`` with a generic
    "invalid value", losing the message.)
    """

    def parse_argument(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse_argument
