"""The plugin's fixtures are registered in every project that installs perfsuite: none may take a common name.

A fixture named ``workload`` or ``engine_factory`` would shadow, or be
shadowed by, a project's own fixture of that name; ``perf`` and ``perf_*``
(``_perf_*`` for private ones) belong to perfsuite.
"""

from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]

# `pytest --fixtures -v` lists each fixture as "name [scope] -- path:line".
FIXTURE_LINE = re.compile(r"^(?P<name>\w+)(?: \[[\w ]+\])? -- (?P<where>\S+)$")


def plugin_fixture_names(pytester: pytest.Pytester) -> list[str]:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("--fixtures", "-v", "-p", "no:cacheprovider")
    names = []
    for line in result.outlines:
        match = FIXTURE_LINE.match(line)
        if match and re.search(r"perfsuite[/\\]plugin[/\\]", match["where"]):
            names.append(match["name"])
    return names


def is_perfsuites_name(name: str) -> bool:
    return name == "perf" or name.removeprefix("_").startswith("perf_")


def test_every_fixture_of_the_plugin_is_named_perf_or_perf_something(pytester):
    names = plugin_fixture_names(pytester)
    assert "perf" in names and "perf_engine_factory" in names, f"the listing was not read: {names}"
    assert [name for name in names if not is_perfsuites_name(name)] == []

