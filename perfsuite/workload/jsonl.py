"""JSON Lines files (a user's prompts, a trace): read as numbered lines, each a JSON object, errors naming the line."""

from __future__ import annotations

import json
from pathlib import Path


def numbered_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """The file's lines that are not blank, each with its 1-based line number; ``what`` names the file in errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {what} {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; save the {what} as UTF-8") from None
    # split("\n"), not splitlines(): a JSON string may hold a raw U+2028.
    return [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


def json_object(line: str, where: str, example: str) -> dict:
    """One line's JSON object; ``where`` (file and line) and ``example`` (a valid line) go into the error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        message = f"not valid JSON ({err.msg}, column {err.colno}); write one object per line"
        raise ValueError(f"{where}: {message}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object like {example}, got {json.dumps(obj)}")
    return obj
