"""Parsers for argparse ``type=``: a bad value fails while arguments are parsed.

Shared by the CLI and the pytest options (pytest's parser is argparse).
"""

from __future__ import annotations

import argparse


def integer_at_least(minimum: int, what: str = "an integer"):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} (at least {minimum}), got {value}")
        return value

    return parse


positive_int = integer_at_least(1, "a positive integer")


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
