"""The shipped perf suite (perfsuite/suites) as a package: the ids its tests are stored under, the shipped
baselines kept under those ids, and a run from a project that is not perfsuite's checkout."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfsuite.judge.baselines import baseline_relative_path, read_baseline
from perfsuite.plugin.ids import SUITES_DIR, perf_test_id

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
SHIPPED_BASELINES = sorted((REPO / "baselines").rglob("*.json"))


@dataclass(frozen=True)
class FakeModule:
    path: Path
    nodeid: str


@dataclass(frozen=True)
class FakeItem:
    """The two things ``perf_test_id`` reads of a pytest item: its nodeid and its module."""

    nodeid: str
    module: FakeModule

    def getparent(self, cls):
        return self.module


def item_in(path: Path, module_nodeid: str, name: str) -> FakeItem:
    return FakeItem(f"{module_nodeid}::{name}", FakeModule(path, module_nodeid))


def test_a_shipped_test_run_from_outside_the_rootdir_is_stored_under_its_path_in_the_package():
    # `pytest --pyargs perfsuite.suites` from a project: pytest's nodeid is relative to the package directory
    item = item_in(SUITES_DIR / "test_throughput.py", "test_throughput.py", "test_throughput[static-B2-fixed]")
    assert perf_test_id(item) == "perfsuite/suites/test_throughput.py::test_throughput[static-B2-fixed]"


def test_a_shipped_test_in_a_class_keeps_the_class_in_its_id():
    item = item_in(SUITES_DIR / "test_x.py", "test_x.py", "TestX::test_y[a::b]")
    assert perf_test_id(item) == "perfsuite/suites/test_x.py::TestX::test_y[a::b]"


def test_a_projects_own_test_keeps_its_nodeid(tmp_path):
    item = item_in(tmp_path / "tests" / "test_speed.py", "tests/test_speed.py", "test_speed[2]")
    assert perf_test_id(item) == "tests/test_speed.py::test_speed[2]"


def test_a_copy_of_the_suite_elsewhere_is_the_projects_own_test(tmp_path):
    copy = tmp_path / "perfsuite" / "suites" / "test_throughput.py"
    item = item_in(copy, "perfsuite/suites/test_throughput.py", "test_throughput[mine]")
    assert perf_test_id(item) == "perfsuite/suites/test_throughput.py::test_throughput[mine]"
    elsewhere = item_in(copy, "vendored/perfsuite/suites/test_throughput.py", "test_throughput[mine]")
    assert perf_test_id(elsewhere) == "vendored/perfsuite/suites/test_throughput.py::test_throughput[mine]"


@pytest.mark.parametrize("path", SHIPPED_BASELINES, ids=lambda p: p.stem)
def test_every_shipped_baseline_lies_where_its_shipped_tests_id_is_looked_up(path):
    baseline = read_baseline(path)
    fingerprint_dir = REPO / "baselines" / path.relative_to(REPO / "baselines").parts[0]
    assert path == fingerprint_dir / baseline_relative_path(baseline.test_id)
    file_part, _, name = baseline.test_id.partition("::")
    assert file_part.startswith("perfsuite/suites/") and (REPO / file_part).is_file()
    function = re.sub(r"\[.*", "", name)
    assert f"def {function}(" in (REPO / file_part).read_text(), f"{baseline.test_id}: no such test in the suite"


MY_ENGINE_CONFTEST = textwrap.dedent(
    """
    import dataclasses

    from perfsuite.adapters import register_engine
    from perfsuite.adapters.builtin import build_inflight


    class MyEngine:
        name = "my-engine"
        greedy_equal = True

        def __init__(self, backend, config):
            self.inner = build_inflight(backend, config)

        @property
        def batch_size(self):
            return self.inner.batch_size

        def run(self, requests, on_step=None, max_concurrency=None):
            return dataclasses.replace(self.inner.run(requests, on_step, max_concurrency), engine_name=self.name)


    register_engine("my-engine", MyEngine)
    """
)
THROUGHPUT_FIXED = "perfsuite/suites/test_throughput.py::test_throughput[my-engine-B2-fixed]"
LATENCY_FIXED = "perfsuite/suites/test_latency.py::test_latency_fixed_concurrency[my-engine]"


def test_a_project_runs_the_shipped_suite_on_its_own_engine_into_its_own_reports_and_baselines(pytester):
    """README: `pytest --pyargs perfsuite.suites --perf --perf-engines my-engine` from a project that is not
    perfsuite's checkout; a second session finds the first one's baselines under the same ids."""
    from smoke_session import run_shipped_smoke_session

    assert REPO not in pytester.path.parents
    engine = ("--perf-engines", "my-engine", "--perf-repeats", "2")
    saved = run_shipped_smoke_session(pytester, *engine, "--perf-save-baseline",
                                      "-k", "test_throughput and fixed or test_latency_fixed_concurrency",
                                      conftest_addition=MY_ENGINE_CONFTEST)  # fmt: skip
    saved.assert_outcomes(passed=2)
    saved.stdout.fnmatch_lines([f"*results in {pytester.path / 'reports' / 'results.json'}"])
    first = json.loads((pytester.path / "reports" / "results.json").read_text())["tests"]
    assert sorted(t["test_id"] for t in first) == sorted([THROUGHPUT_FIXED, LATENCY_FIXED])
    assert {t["measurement"]["engine_name"] for t in first} == {"my-engine"}
    [fingerprint] = [path.name for path in (pytester.path / "baselines").iterdir()]
    stored = sorted(p.relative_to(pytester.path / "baselines" / fingerprint).as_posix()
                    for p in (pytester.path / "baselines").rglob("*.json"))  # fmt: skip
    assert stored == sorted(str(baseline_relative_path(test_id)) for test_id in (THROUGHPUT_FIXED, LATENCY_FIXED))
    assert not (SUITES_DIR / "reports").exists() and not (SUITES_DIR / "baselines").exists()

    compared = run_shipped_smoke_session(pytester, *engine, "-k", "test_throughput and fixed")
    # compared with its baseline, but 2 repeats a side are too few for a verdict: skipped for judging nothing
    compared.assert_outcomes(skipped=1)
    [test] = json.loads((pytester.path / "reports" / "results.json").read_text())["tests"]
    assert (test["test_id"], test["judgement"]["baseline_status"]) == (THROUGHPUT_FIXED, "compared")
