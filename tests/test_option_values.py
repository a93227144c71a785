"""Every option's value is checked while arguments are parsed, and every option's help survives ``--help``.

The sweeps run over the option table and the CLI's parser themselves, so an
option added later is covered without a new case: each odd value is either
accepted as something sensible (a finite number) or refused in one line.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest

from perfsuite.cli import build_parser
from perfsuite.plugin.options import MAX_TIMEOUT_S, argparse_help, option_specs

pytest_plugins = ["pytester"]

ODD_VALUES = ("0", "-1", "nan", "inf", "-inf", "1e400", "99999999999999999999999", "eleven", "")
VALUE_OPTIONS = [spec for spec in option_specs() if spec.takes_value]


def accepted_or_refused_in_one_line(parse, text: str):
    """``parse(text)``'s value, or None where it refused ``text`` the way argparse shows as one line."""
    try:
        value = parse(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as error:  # argparse's "invalid ... value" for both
        assert "\n" not in str(error), f"{text!r}: {error}"
        return None
    if isinstance(value, float):
        assert math.isfinite(value), f"{text!r} was accepted as {value}"
    return value


@pytest.mark.parametrize("text", ODD_VALUES)
@pytest.mark.parametrize("spec", VALUE_OPTIONS, ids=lambda spec: spec.flag)
def test_every_perf_option_accepts_an_odd_value_as_a_finite_one_or_refuses_it_in_one_line(spec, text):
    accepted_or_refused_in_one_line(spec.parse, text)


def cli_typed_arguments(parser: argparse.ArgumentParser, path: str = "perfsuite"):
    for action in parser._actions:  # argparse keeps no public list of a parser's arguments
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from cli_typed_arguments(subparser, f"{path} {name}")
        elif action.type is not None and action.option_strings:
            yield f"{path} {action.option_strings[-1]}", action.type


CLI_ARGUMENTS = list(cli_typed_arguments(build_parser()))


@pytest.mark.parametrize("text", ODD_VALUES)
@pytest.mark.parametrize(("flag", "parse"), CLI_ARGUMENTS, ids=[flag for flag, _ in CLI_ARGUMENTS])
def test_every_cli_flag_accepts_an_odd_value_as_a_finite_one_or_refuses_it_in_one_line(flag, parse, text):
    accepted_or_refused_in_one_line(parse, text)


def parse_of(flag: str):
    return next(spec.parse for spec in VALUE_OPTIONS if spec.flag == flag)


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e400"])
def test_a_min_effect_that_is_not_a_finite_fraction_is_refused(text):
    assert accepted_or_refused_in_one_line(parse_of("--perf-min-effect"), text) is None


@pytest.mark.parametrize("text", ["inf", "1e400", "nan", "0", "-5", str(MAX_TIMEOUT_S * 2)])
def test_a_worker_timeout_that_is_not_finite_positive_and_at_most_a_day_is_refused(text):
    assert accepted_or_refused_in_one_line(parse_of("--perf-worker-timeout"), text) is None


@pytest.mark.parametrize("flag", ["--perf-repeats", "--perf-against-workers", "--perf-against-threads",
                                  "--perf-client-shards"])  # fmt: skip
def test_counts_that_would_exhaust_the_machine_are_refused(flag):
    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        parse_of(flag)("1000000")


@pytest.mark.parametrize("argv", [["run", "--threads", "100000"], ["serve", "--threads", "100000"],
                                  ["run", "--num-requests", "1000000000"], ["serve", "--port", "70000"]])  # fmt: skip
def test_cli_counts_that_would_exhaust_the_machine_or_cannot_work_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "at most" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("spec", option_specs(), ids=lambda spec: spec.flag)
def test_every_help_text_survives_argparse_percent_formatting(spec):
    help_text = argparse_help(f"{spec.help} (default: {spec.default})")
    assert help_text % {"prog": "pytest", "default": None, "dest": spec.name} == f"{spec.help} (default: {spec.default})"


def run(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_compare_with_a_nan_min_effect_is_a_one_line_usage_error(tmp_path):
    result = run("-m", "perfsuite", "compare", "old.json", "new.json", "--min-effect", "nan", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "argument --min-effect: expected a finite number, got 'nan'" in result.stderr.splitlines()[-1]


def test_every_perfsuite_command_has_a_help_that_exits_0():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for argv in [[], *([name] for name in commands), ["history", "import"], ["history", "show"]]:
        parser = build_parser()
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*argv, "--help"])
        assert exited.value.code == 0, argv


def test_pytest_help_lists_every_perf_option_in_a_session_with_the_plugin(pytester):
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0, result.stderr.str()
    shown = result.stdout.str()
    assert not [spec.flag for spec in option_specs() if spec.flag not in shown]
    assert "in 90% of the device's available memory" in " ".join(shown.split())


def test_a_nan_min_effect_on_the_command_line_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--perf-min-effect=nan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --perf-min-effect: expected a finite number, got 'nan'"])


@pytest.fixture
def project_and_elsewhere(pytester):
    """A project with its ini file, and an existing directory outside it."""
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\nperf_profile = 'smoke'\n")
    pytester.makepyfile(test_one="def test_one(): pass")
    elsewhere = pytester.path.parent / f"{pytester.path.name}-reports"
    elsewhere.mkdir()
    (pytester.path / "reports").mkdir()
    return pytester, elsewhere


def test_a_report_dir_outside_the_project_gives_the_same_rootdir_with_an_equals_sign(project_and_elsewhere):
    pytester, elsewhere = project_and_elsewhere
    for args in (["--perf-report-dir", "reports"], [f"--perf-report-dir={elsewhere}"]):
        result = pytester.runpytest_inprocess("--co", *args)
        assert result.ret == 0, result.stderr.str()
        result.stdout.fnmatch_lines([f"rootdir: {pytester.path}", "configfile: pyproject.toml"])


def test_a_report_dir_outside_the_project_after_a_space_says_to_write_an_equals_sign(project_and_elsewhere):
    pytester, elsewhere = project_and_elsewhere
    result = pytester.runpytest_inprocess("--co", "--perf-report-dir", str(elsewhere))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --perf-report-dir {elsewhere}: pytest took * for a test path while choosing "
                                 f"its rootdir*instead of {pytester.path}; write --perf-report-dir={elsewhere}"])
