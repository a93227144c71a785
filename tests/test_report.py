"""The HTML report: contents, self-containment, the CLI, the plugin hook, and a real browser."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfsuite.cli import main
from perfsuite.judge.catalogue import METRICS, PROBE
from perfsuite.history.store import HistoryStore
from perfsuite.judge.results import Results, read_results, write_results
from perfsuite.measure.utilization import UTILIZATION_KEYS
from perfsuite.report.plots import SVG_NAMESPACE_URIS
from perfsuite.report.render import render_report, write_report
from report_fixtures import ENVIRONMENT, VERDICT_TESTS, earlier_run, fake_results, with_test_samples, with_verdicts
from results_builders import changed, make_result, make_results
from smoke_session import run_shipped_smoke_session

pytest_plugins = ["pytester"]

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Results:
    """A fake session's results (no baselines yet)."""
    return fake_results(tmp_path_factory.mktemp("session"))


@pytest.fixture(scope="module")
def judged(measured) -> Results:
    return with_verdicts(measured)


@pytest.fixture(scope="module")
def html(judged) -> str:
    history = [
        earlier_run(judged, "2025-12-30T00:00:00+00:00", 0.9),
        earlier_run(judged, "2025-12-31T00:00:00+00:00", 1.1),
    ]
    return render_report(judged, history)


def first_tests(results: Results, count: int) -> Results:
    return dataclasses.replace(results, tests=results.tests[:count])


def external_references(html: str) -> list[str]:
    """Everything in the page that would make a browser fetch something, or name an address."""
    urls = [u for u in re.findall(r"(?:https?:)?//[^\s\"'<>)]+", html) if u not in SVG_NAMESPACE_URIS]
    tags = re.findall(r"<script[^>]*\bsrc\s*=|<link\b[^>]*\bhref|<img\b|<iframe\b|@import", html, flags=re.I)
    outside = [u for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", html) if not u.startswith("#")]
    links = [h for h in re.findall(r"\bhref\s*=\s*['\"]([^'\"]*)", html) if not h.startswith("#")]
    return urls + tags + outside + links


def verdict_cells(html: str) -> dict[str, str]:
    """Test name -> the class of its first verdict-table row."""
    body = html.split('<table id="verdict-table">')[1].split("</table>")[0]
    rows = re.findall(r'<tr class="([^"]+)"[^>]*>\s*<td[^>]*><a href="#[^"]*">([^<]+)</a>', body)
    found: dict[str, str] = {}
    for css, name in rows:
        found.setdefault(name, css)
    return found


# -- contents --------------------------------------------------------------------


def test_each_verdict_appears_in_its_colour(html):
    rows = verdict_cells(html)
    for verdict, test_id in VERDICT_TESTS.items():
        name = test_id.rpartition("::")[2]
        assert rows[name] == f"verdict-{verdict}", (name, rows[name])
        assert f'<span class="badge verdict-{verdict}">{verdict}</span>' in html
    for css in ("regressed", "improved", "inconclusive"):
        assert re.search(rf"\.verdict-{css} \{{ background: var\(--{css}-bg\)", html), "each verdict has its colour"
    assert rows["test_throughput[inflight-B2-fixed]"] == "verdict-none", "tests without a baseline say so"


def test_header_carries_the_environment_sizing_parameters_commit_and_overall_verdict(html):
    header = html.split("</header>")[0]
    assert 'id="overall-verdict">regressed<' in header, "any regressed row makes the run regressed"
    for fact in ("cpu", "2.13.0+cpu", "5.0.0", "Test CPU @ 2.0GHz", "4f1de97c0ffee", "2026-01-02T03:04:05+00:00"):
        assert fact in header
    for name in ("model", "precision", "input length", "output length", "concurrency", "tensor parallelism"):
        assert f"<dt>{name}</dt>" in header
    assert "<dt>concurrency</dt><dd>2, 4</dd>" in header


def test_overall_verdict_without_baselines_says_so(measured):
    page = render_report(first_tests(measured, 1))
    assert 'id="overall-verdict">no baseline<' in page


def test_figures_cover_throughput_distributions_timeline_and_history(html, judged):
    lags = [t.measurement.send_lag for t in judged.tests]
    num_open_loop = sum(1 for lag in lags if lag is not None and lag.target_rate is not None)
    assert num_open_loop == 2, "the Poisson tests' send lag figures"
    assert html.count("<svg") == 1 + len(judged.tests) + 1 + 1 + num_open_loop, (
        "throughput, one per test, timeline, history, one send lag per Poisson test"
    )
    timeline = html.split('id="timeline-figure"')[1].split("</figure>")[0]
    for text in (
        "static: test_throughput[static-B4-uniform]",
        "inflight: test_throughput[inflight-B4-uniform]",
        "padding row (static batch)",
        "empty slot",
        "prefill",
        "queue",
        "TTFT",
        "E2E",
    ):
        assert text in timeline, text
    assert "test_throughput: static vs in-flight" in html
    assert "3 runs on this machine" in html, "history counts the earlier runs and this one"


def test_a_report_against_stored_baselines_names_no_ab_sides(html):
    """The A/B wording (tests/test_report_ab.py) is for --perf-against sessions only."""
    header = html.split('<table id="verdict-table">')[1].split("</thead>")[0]
    assert ">baseline<" in header and ">current<" in header and ">change<" in header and ">ratio CI<" in header
    assert "Mann-Whitney" in header
    for ab_only in ("A: REF", "B: current", "pair ratio", 'id="ab-session"', "pair-ratios-", "ab-timelines"):
        assert ab_only not in html, ab_only
    assert "<th>baseline</th><th>current</th>" in html and "dashed: baseline." in html


def test_counters_show_the_exact_change(html, judged):
    passes = judged.test(VERDICT_TESTS["regressed"]).measurement.counters.num_forward_passes
    assert re.search(
        rf'<tr class="changed">\s*<td class="text">num_forward_passes</td>\s*<td>{passes - 2}</td>'
        rf"\s*<td>{passes}</td>\s*<td>\+2</td>",
        html,
    )


def test_history_needs_two_runs_of_this_machine(judged):
    assert "Fewer than two stored runs" in render_report(judged)
    elsewhere = dataclasses.replace(ENVIRONMENT, cpu_model="elsewhere")
    earlier = earlier_run(judged, "2025-12-30T00:00:00+00:00", 0.9)
    tests = tuple(changed(test, environment=elsewhere) for test in earlier.tests)
    other_machine = dataclasses.replace(earlier, environment=elsewhere, tests=tests)
    assert "Fewer than two stored runs" in render_report(judged, [other_machine])


def test_the_page_makes_no_network_request(html):
    assert external_references(html) == []
    assert "<?xml" not in html and "<!DOCTYPE svg" not in html
    assert html.count("<script>") == 1


def test_the_url_check_catches_external_references():
    page = '<svg xmlns="http://www.w3.org/2000/svg"></svg><script src="x.js"></script><link href="//cdn.x/a.css">'
    page += "<style>@import 'a.css'; b { background: url(https://x/y.png) }</style><a href='#ok'></a>"
    assert len(external_references(page)) == 7


def test_report_modules_import_neither_torch_nor_plotting_libraries():
    code = (
        "import sys, perfsuite.report.render, perfsuite.report.plots, perfsuite.judge.compare, perfsuite.judge.results; "
        "print(*[m in sys.modules for m in ('torch', 'transformers', 'matplotlib', 'jinja2')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"] * 4


# -- write_report, the plugin's call ------------------------------------------------


def test_write_report_renders_the_results_it_is_handed_and_the_history_it_is_given(tmp_path, judged):
    small = first_tests(judged, 2)
    earlier = earlier_run(small, "2026-01-01T00:00:00+00:00", 0.9)
    path = write_report(dataclasses.replace(small, created_at="2026-01-02T00:00:00+00:00"), tmp_path, [earlier])
    assert path == tmp_path / "report.html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"], "no results.json read, no copy kept"
    assert "2 runs on this machine" in path.read_text()


def test_the_shipped_perf_suite_in_smoke_mode_and_its_report(pytester):
    """What CI exercises on every submission: the real fixtures, model runner and perf tests on tiny-random.

    One session for two checks (each costs a whole session): what the plugin records, and that it writes
    report.html, which renders again from results.json.
    """
    result = run_shipped_smoke_session(pytester)
    # the sweep test waits for --perf-config, capacity for --perf-slo, and the 8 measured tests judged nothing (no
    # baselines): skipped after recording their results
    result.assert_outcomes(skipped=11)
    stored = json.loads((pytester.path / "reports" / "results.json").read_text())["tests"]
    assert len(stored) == 8 and all(t["output_throughput"] > 0 for t in stored), "vLLM's figures for any reader"
    tests = [test.measurement for test in read_results(pytester.path / "reports" / "results.json").tests]
    assert {t.engine_name for t in tests} == {"static", "inflight"}
    assert all(t.parameters.model == "tiny-random" for t in tests)
    assert all(len(t.samples[PROBE]) == 3 for t in tests), "one machine probe per repeat"
    poisson = [t for t in tests if t.arrival_rate]
    assert poisson and all(t.arrival_rate == 50.0 for t in poisson)
    static_padding = [t.counters.num_padding_tokens for t in tests if t.engine_name == "static"]
    assert any(static_padding), "uneven lengths leave static slots idle"
    for test in tests:  # every engine test's MFU, MBU and rates, per repeat, over this session's measured peaks
        assert all(len(test.samples[key]) == 3 and min(test.samples[key]) > 0 for key in UTILIZATION_KEYS)
        assert test.counters.weight_bytes_read > 0 and test.counters.decode_flops > 0
    peaks = read_results(pytester.path / "reports" / "results.json").peaks
    assert peaks.flops_per_second > 0 and peaks.bytes_per_second > 0

    result.stdout.fnmatch_lines(["How close to the machine's measured roofs*", "test *prefill MFU*decode MBU*"])
    result.stdout.fnmatch_lines(["*; results in */reports/results.json", "report: */reports/report.html"])
    reports = pytester.path / "reports"
    written = (reports / "report.html").read_text()
    assert 'id="verdict-table"' in written and 'id="timeline-figure"' in written
    assert "<svg" in written.split('id="roofline"')[1].split("</section>")[0], "the roofline is drawn"
    with HistoryStore.open(reports / "history.sqlite") as store:  # kept in the run history, not in history/
        assert [len(session.tests) for session in store.sessions()] == [8]
    assert not (reports / "history").exists()
    page = render_report(read_results(reports / "results.json"))
    assert external_references(page) == []
    assert 'id="overall-verdict">no baseline<' in page
    assert "tiny-random" in page and "static vs in-flight" in page


# -- CLI ------------------------------------------------------------------------------


@pytest.fixture
def results_file(tmp_path, judged) -> Path:
    path = tmp_path / "results.json"
    write_results(path, first_tests(judged, 3))
    return path


def test_cli_report_renders_a_results_file(results_file, tmp_path, capsys):
    output = tmp_path / "out.html"
    assert main(["report", str(results_file), "-o", str(output)]) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    assert 'id="verdict-table"' in output.read_text()


def test_cli_report_draws_the_trend_from_a_history_store(results_file, tmp_path, judged):
    store = tmp_path / "history.sqlite"
    with HistoryStore.open(store) as history:
        history.append(earlier_run(first_tests(judged, 3), "2025-12-30T00:00:00+00:00", 0.9))
    assert main(["report", str(results_file), "--history", str(store)]) == 0
    assert "2 runs on this machine" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), ("{not json", "not a readable JSON file"), ('{"schema_version": 99}', "schema_version")],
)
def test_cli_names_the_bad_file_and_the_fix(command, content, message, tmp_path, results_file, capsys):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    argv = ["report", str(bad)] if command == "report" else ["compare", str(results_file), str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err and "pytest --perf" in err


@pytest.mark.parametrize(
    ("setup", "what"), [("missing", "no history store there"), ("folder", "is a directory; give the store's file path")]
)
def test_cli_report_names_a_missing_history_store_or_a_folder_given_for_it(results_file, tmp_path, capsys, setup, what):
    history = tmp_path / "history"
    if setup == "folder":
        history.mkdir()
    assert main(["report", str(results_file), "--history", str(history)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfsuite: error: {history}") and what in err
    assert setup != "missing" or not history.exists(), "reading a history must not create a store"


def test_cli_compare_prints_the_verdict_table_and_fails_on_a_regression(tmp_path, measured, capsys):
    old = with_test_samples(first_tests(measured, 3), 0, "output_throughput", [100.0, 101, 102, 103, 104, 105, 106])
    new = with_test_samples(first_tests(measured, 3), 0, "output_throughput", [70.0, 71, 72, 73, 74, 75, 76])
    write_results(tmp_path / "old.json", old)
    write_results(tmp_path / "new.json", new)
    output = tmp_path / "compare.html"
    code = main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "-o", str(output)])
    out = capsys.readouterr().out
    assert code == 1, out
    header, _, first, *rest = out.splitlines()
    assert header.split()[:4] == ["test", "metric", "baseline", "current"]
    assert first.split()[:2] == [new.tests[0].test_id.rpartition("::")[2], "output_throughput"]
    assert first.split()[-1] == "regressed"
    assert "overall: regressed" in out
    assert sum(line.split()[-1] == "unchanged" for line in rest if "test_throughput[" in line) == 3 * len(METRICS) - 1
    page = output.read_text()
    assert 'class="verdict-regressed"' in page and external_references(page) == []


def test_cli_compare_of_a_run_with_itself_is_unchanged(results_file, capsys):
    assert main(["compare", str(results_file), str(results_file)]) == 0
    assert "overall: unchanged" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("samples", "shown"),
    [
        ((-1.0, -2.0, -3.0), "holds -1.0, but output_throughput cannot be negative"),  # was judged: -583.5% unchanged
        ((), "is an empty list"),  # was left out: overall unchanged, exit 0
        ((100.0, "x", 99.0), "holds 'x', which is not a number"),  # was: could not convert string to float: 'x'
    ],
    ids=["negative", "empty", "not-a-number"],
)
@pytest.mark.parametrize("side", ["old", "new"])
def test_cli_compare_refuses_unusable_samples_naming_the_file_the_test_and_the_field(tmp_path, capsys, samples, shown,
                                                                                     side):
    good = {name: (100.0, 101.0, 99.0) for name in METRICS}
    files = {name: tmp_path / f"{name}.json" for name in ("old", "new")}
    for name, path in files.items():
        bad = {"output_throughput": samples} if name == side else {}
        write_results(path, make_results(make_result("t.py::test_a", samples={**good, **bad})))
    assert main(["compare", str(files["old"]), str(files["new"])]) == 2
    out, err = capsys.readouterr()
    assert "overall" not in out
    assert f"{files[side]}: tests[0] ('t.py::test_a'): samples['output_throughput'] {shown}" in err
    assert "re-create it with `pytest --perf`" in err


def unwritable_output(place: str, tmp_path: Path, monkeypatch) -> tuple[Path, str]:
    """An ``-o`` path that cannot be written, and the words that must say why.

    The tests run as root, whom a chmod'ed directory does not stop, and no
    read-only mount is at hand: the read-only case makes writing the file
    fail as a read-only file system does (EROFS).
    """
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    if place == "under a file":
        return blocker / "report.html", f"{blocker} is not a directory"
    if place == "two levels under a file":
        return blocker / "sub" / "report.html", f"{blocker} is not a directory"
    if place == "a directory":
        (tmp_path / "out").mkdir()
        return tmp_path / "out", f"{tmp_path / 'out'} is a directory"
    output = tmp_path / "mounted" / "report.html"
    write_text = Path.write_text

    def read_only(self, *args, **kwargs):
        if self == output:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", read_only)
    return output, f"{output.parent} is on a read-only file system"


@pytest.mark.parametrize("command", ["report", "compare"])
@pytest.mark.parametrize("place", ["under a file", "two levels under a file", "a directory", "read-only"])
def test_cli_output_that_cannot_be_written_is_one_line_naming_the_path_and_why(
    command, place, results_file, tmp_path, monkeypatch, capsys
):
    output, why = unwritable_output(place, tmp_path, monkeypatch)
    inputs = [str(results_file)] if command == "report" else [str(results_file), str(results_file)]
    assert main([command, *inputs, "-o", str(output)]) == 2
    fix = "pass -o a file in a writable directory"
    # compare also prints the compared runs' own warnings (a run the session judged noisy, say): not errors
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert errors == [f"perfsuite: error: cannot write {output}: {why}; {fix}"]


# -- a real browser -------------------------------------------------------------------


def chromium_binary() -> str:
    """Headless Chromium from PATH. The suite installs nothing: ``make test-browser`` installs it, then runs this tier,
    where a missing browser fails; anywhere else (a plain ``pytest``) it skips, saying how to get it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    message = "headless Chromium is not on PATH (chromium or chromium-browser): `make test-browser` installs it"
    if os.environ.get("PERFSUITE_TEST_PHASE") == "browser":
        pytest.fail(f"{message}, and the browser tier is running without it: its install step failed")
    pytest.skip(message)


def run_chromium(binary: str, profile: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.browser
def test_a_real_browser_renders_the_report(html, tmp_path):
    binary = chromium_binary()
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    dumped = run_chromium(
        binary, tmp_path / "profile-dom", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()
    )
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    assert 'data-ready="1"' in dom, "the inline script ran to its end"
    assert "Uncaught" not in dumped.stderr, dumped.stderr[-2000:]
    assert 'id="verdict-table"' in dom and 'id="timeline-figure"' in dom and "<svg" in dom
    screenshot = tmp_path / "report.png"
    shot = run_chromium(
        binary,
        tmp_path / "profile-shot",
        f"--screenshot={screenshot}",
        "--window-size=1400,3000",
        "--hide-scrollbars",
        page.as_uri(),
    )
    assert shot.returncode == 0 and screenshot.is_file(), shot.stderr[-2000:]
    assert screenshot.stat().st_size > 50_000
    from matplotlib.image import imread

    pixels = imread(screenshot)[..., :3]
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    assert pixels.std() > 0.05, "the screenshot is blank"
    if os.environ.get("PERFSUITE_KEEP_SCREENSHOT"):
        shutil.copy(screenshot, os.environ["PERFSUITE_KEEP_SCREENSHOT"])
