"""The docs stay true to the code: the options page is made from the plugin's option table, the defaults
have one source, and the README's links lead somewhere. `make docs` (mkdocs build --strict) checks the rest."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.judge.stats import Policy
from perfsuite.plugin.options import PerfOptions, option_default, option_specs

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "options_page.py"


def _hook():
    spec = importlib.util.spec_from_file_location("options_page", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def options_rows() -> dict[str, str]:
    table = _hook().options_table()
    rows = {}
    for line in table.splitlines()[2:]:
        flag = re.match(r"\| `(--[a-z-]+)` \|", line)
        assert flag, f"not an option row: {line}"
        rows[flag.group(1)] = line
    return rows


def test_every_option_is_on_the_generated_page_once_with_its_default_and_help(options_rows):
    escape = _hook()._escape
    specs = option_specs()
    assert sorted(options_rows) == sorted(spec.flag for spec in specs)
    for spec in specs:
        row = options_rows[spec.flag]
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        default = "off" if not spec.takes_value else ("unset" if spec.default is None else f"`{spec.default}`")
        assert cells[2] == default, row
        assert cells[3] == escape(spec.help), row


def test_an_option_that_takes_a_value_names_its_ini_key(options_rows):
    for spec in option_specs():
        assert spec.has_ini_key or not spec.takes_value, spec.name
        expected = f"`{spec.name}`" if spec.has_ini_key else "(command line only)"
        assert f"| {expected} |" in options_rows[spec.flag]
    assert {spec.name for spec in option_specs() if spec.has_ini_key and not spec.takes_value} == {
        "perf_strict", "perf_fail_on_change_point"
    }


def test_a_switch_with_an_ini_key_names_it_and_reads_off(options_rows):
    row = options_rows["--perf-fail-on-change-point"]
    assert "| `perf_fail_on_change_point` | off |" in row


def test_the_options_page_keeps_the_markers_the_hook_fills():
    hook = _hook()
    page = (ROOT / "docs" / hook.PAGE).read_text()
    assert hook.OPTIONS_MARKER in page and hook.PROFILES_MARKER in page


def test_the_profiles_table_has_a_row_per_profile():
    from perfsuite.workload.profiles import PROFILES

    table = _hook().profiles_table()
    for profile in PROFILES.values():
        assert f"| `{profile.name}` | {profile.repeats} |" in table


def test_perf_options_defaults_are_the_option_tables():
    by_field = {spec.name.removeprefix("perf_"): spec.name for spec in option_specs() if spec.takes_value}
    checked = []
    for field in dataclasses.fields(PerfOptions):
        if field.name in by_field and field.default is not dataclasses.MISSING:
            assert field.default == option_default(by_field[field.name]), field.name
            checked.append(field.name)
    assert {"engines", "decode_mode", "worker_timeout", "against_workers", "busy_threshold"} <= set(checked)


def test_the_openai_http_and_policy_defaults_are_the_option_tables():
    http = HttpClientOptions()
    assert http.prompt_format == option_default("perf_prompt_format")
    assert http.eos_control == option_default("perf_eos_control")
    assert http.api == option_default("perf_api")
    assert http.server_model == option_default("perf_server_model")
    assert Policy().alpha == option_default("perf_alpha")


def test_option_default_refuses_a_name_the_table_does_not_hold():
    with pytest.raises(KeyError, match="perf_nonsense"):
        option_default("perf_nonsense")



def test_the_readme_links_lead_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into docs/"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
