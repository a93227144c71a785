"""Installing perfsuite costs every pytest run of the environment its plugin's import: keep that near nothing.

The plugin is loaded by its ``pytest11`` entry point whether or not ``--perf``
is given, so whatever it imports at module level (scipy alone took about 1 s)
is paid by every project that shares the environment. What only ``--perf``
needs is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

# Each takes from tenths of a second (jinja2, matplotlib's first import) to seconds (torch, transformers).
# The run history's SQLAlchemy and Otava too: only a --perf session's end needs them.
HEAVY_MODULES = ("scipy", "numpy", "torch", "transformers", "matplotlib", "jinja2", "aiohttp", "sqlalchemy", "otava")


def _run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(set(sys.modules) & {set(modules)!r})))"
    return json.loads(_run_python(code))


def test_importing_the_plugin_imports_no_heavy_module():
    assert _loaded_after("import perfsuite.plugin.hooks", HEAVY_MODULES) == []


def test_a_pytest_run_without_perf_imports_no_heavy_module(pytester: pytest.Pytester):
    """Configure, collect, run and summarise without --perf: the whole idle path of the plugin."""
    pytester.makeconftest(
        f"""
        import json, sys

        def pytest_unconfigure(config):
            heavy = sorted(set(sys.modules) & {set(HEAVY_MODULES)!r})
            (config.rootpath / "heavy.json").write_text(json.dumps(heavy))
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.perf
        def test_speed(perf):
            pass

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert json.loads((pytester.path / "heavy.json").read_text()) == []



def test_importing_the_cli_imports_neither_pytest_nor_a_heavy_module():
    assert _loaded_after("import perfsuite.cli", ("pytest", *HEAVY_MODULES)) == []
