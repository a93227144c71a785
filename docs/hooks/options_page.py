"""mkdocs hook: the options reference (docs/options.md) is made from the plugin's own tables.

``perfsuite.plugin.options`` holds every ``--perf-*`` option's name, default and help once; ``pytest --help``,
the ini keys and ``PerfOptions``' defaults come from it, and so does the options table here. The profiles table
is made from ``perfsuite.workload.profiles.PROFILES``. docs/options.md carries a marker where each table goes;
the build fails if one is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

PAGE = "options.md"
OPTIONS_MARKER = "<!-- generated: options table -->"
PROFILES_MARKER = "<!-- generated: profiles table -->"
ROOT = Path(__file__).resolve().parents[2]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    for marker, table in ((OPTIONS_MARKER, options_table), (PROFILES_MARKER, profiles_table)):
        if marker not in markdown:
            raise ValueError(f"docs/{PAGE} lost its marker {marker!r}: a generated table has nowhere to go")
        markdown = markdown.replace(marker, table())
    return markdown


def options_table() -> str:
    """Every ``--perf-*`` option: flag, ini key, default, help."""
    _this_checkout_first()
    from perfsuite.plugin.options import option_specs

    rows = ["| option | ini key | default | what it does |", "|---|---|---|---|"]
    for spec in option_specs():
        ini = f"`{spec.name}`" if spec.has_ini_key else "(command line only)"
        rows.append(f"| `{spec.flag}` | {ini} | {_default(spec)} | {_escape(spec.help)} |")
    return "\n".join(rows)


def profiles_table() -> str:
    """Every ``--perf-profile``: its repeats, warm-ups, requests, batch sizes, output lengths, rates, concurrency."""
    _this_checkout_first()
    from perfsuite.workload.profiles import PROFILES

    rows = [
        "| profile | repeats | warm-up runs | requests | batch sizes | output lengths (tokens) "
        "| Poisson rates (req/s) | concurrency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile in PROFILES.values():
        lengths = "; ".join(f"`{name}` {_lengths(spec)}" for name, spec in profile.lengths.items())
        rows.append(
            f"| `{profile.name}` | {profile.repeats} | {profile.warmup_runs} | {profile.num_requests} "
            f"| {', '.join(map(str, profile.batch_sizes))} | {lengths} "
            f"| {', '.join(f'{rate:g}' for rate in profile.arrival_rates)} | {profile.concurrency} |"
        )
    return "\n".join(rows)


def _lengths(spec) -> str:
    if spec.kind == "fixed":
        return f"{spec.high}"
    if spec.kind == "exponential":
        return f"mean {spec.mean:g}, {spec.low}..{spec.high}"
    return f"{spec.low}..{spec.high}"


def _this_checkout_first() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's perfsuite, whatever the venv has installed


def _default(spec) -> str:
    if not spec.takes_value:
        return "off"
    return "unset" if spec.default is None else f"`{spec.default}`"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
