"""The docs stay true to the code: the options page is made from the plugin's option table, the defaults
have one source, and the README's links lead somewhere. `make docs` (mkdocs build --strict) checks the rest."""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.judge.stats import Policy
from perfsuite.plugin.options import PerfOptions, option_default, option_specs


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
