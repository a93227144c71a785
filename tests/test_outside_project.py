"""perfsuite in someone else's project: examples/outside-project, against perfsuite's wheel, outside this tree.

perfsuite is built into a wheel and installed, with the outside project, into
a scratch venv that borrows this venv's third-party packages (torch,
transformers, pytest, ...) through a path file, whose own path files (this
tree's editable install among them) Python then does not read. So the
project sees perfsuite as a user does: the wheel's modules and entry
points, no tests/, no source tree. From a copy of the project, outside this
tree, one pytest run (``CI`` set: Hypothesis' derandomized ``ci`` profile)
runs its tests, the perf test in the smoke profile on tiny-random included,
and the one-line equivalence test of its broken variant, which must fail
with a shrunk counterexample.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from scratch_python import COPY_IGNORE, ROOT, copy_perfsuite_source, scratch_env, scratch_venv

pytestmark = [pytest.mark.outside_project, pytest.mark.timing]  # its A/B must see a slowdown: run alone

OUTSIDE_PROJECT = ROOT / "examples" / "outside-project"


def run(command: list, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0 and command[1:3] != ["-m", "pytest"]:
        raise AssertionError(f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}")
    return result


def copy_sources(tmp_path: Path) -> tuple[Path, Path]:
    """perfsuite's packaging inputs and the outside project, copied: builds write into their source trees."""
    return copy_perfsuite_source(tmp_path), project_copy(tmp_path)


def project_copy(tmp_path: Path) -> Path:
    project = tmp_path / "outside-project"
    shutil.copytree(OUTSIDE_PROJECT, project, ignore=COPY_IGNORE)
    return project


def outcomes(junit_xml: Path) -> dict[str, str]:
    """Each test's name and how it ended: passed, failed, error or skipped."""
    found = {}
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        ended = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name")] = ended[0] if ended else "passed"
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The scratch venv's python, with perfsuite's wheel and the outside project's installed (built once)."""
    pytest.importorskip("setuptools", minversion="68", reason="builds the wheels offline with this venv's setuptools")
    tmp_path, env = tmp_path_factory.mktemp("wheels"), scratch_env()
    perfsuite_source, project = copy_sources(tmp_path)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, perfsuite_source, project],
        tmp_path, env)  # fmt: skip
    python = scratch_venv(tmp_path, env)
    run([*pip, "--python", python, "install", "--no-deps", "--no-index", *sorted(wheels.glob("*.whl"))], tmp_path, env)
    return python


def test_the_outside_project_passes_on_the_wheel_and_its_broken_engine_is_caught_and_shrunk(installed, tmp_path):
    python, project, env = installed, project_copy(tmp_path), scratch_env()
    env["CI"] = "1"

    where = run([python, "-c", "import sys, perfsuite, outside_engine; print(perfsuite.__file__); print(*sys.path)"],
                project, env).stdout.splitlines()  # fmt: skip
    assert Path(where[0]).is_relative_to(python.parents[1]), f"perfsuite came from {where[0]}, not the wheel"
    borrowed = sysconfig.get_paths()["purelib"]  # this venv's third-party packages: it may lie inside this tree
    on_path = [entry for entry in where[1].split(" ") if entry and entry != borrowed]
    assert not [entry for entry in on_path if Path(entry).resolve().is_relative_to(ROOT)], where[1]
    helped = run([python, "-m", "pytest", "--help"], project, env)  # argparse %-formats every option's help
    assert helped.returncode == 0 and "--perf-kv-blocks" in helped.stdout, helped.stdout + helped.stderr

    result = run(
        # broken/ first: the perf fixtures set torch's threads to one per core for the rest of the process.
        # The shipped suite's throughput tests too, against the project's engine (its own ids: not the project's).
        [python, "-m", "pytest", "broken", "tests", "--pyargs", "perfsuite.suites.test_throughput",
         "--perf", "--perf-engines", "outside", "--perf-busy-threshold", "0.99",
         "-p", "no:cacheprovider", f"--junitxml={tmp_path / 'junit.xml'}"],
        project, env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    ended = outcomes(tmp_path / "junit.xml")
    # The project has no baselines: each perf test measured, recorded its result, then judged nothing and was
    # skipped saying so (docs/verdicts.md); the correctness checks pass or fail as they are.
    shipped = {name: how for name, how in ended.items() if name.startswith("test_throughput[outside-")}
    assert shipped and set(shipped.values()) == {"skipped"}, output
    assert {name: how for name, how in ended.items() if name not in shipped} == {
        "test_outside_engine_equals_unbatched_greedy_decoding": "passed",
        "test_throughput[outside]": "skipped",
        "test_throughput[inflight]": "skipped",
        "test_broken_engine_equals_unbatched_greedy_decoding": "failure",
    }, output
    assert "perfsuite: judged 0 of " in output and "without a baseline for this environment" in output, output
    stored = (project / "reports" / "results.json").read_text()
    assert '"perfsuite/suites/test_throughput.py::test_throughput[outside-' in stored, "the suite's package ids"
    # how Hypothesis introduces the shrunk example (older versions: "Falsifying example")
    assert re.search(r"(Failing test case|Falsifying example): outside_broken_equals_unbatched_greedy_decoding\(",
                     output), output  # fmt: skip
    assert re.search(r"outside-broken: request 'r\d+', output position \d+: engine token", output), output
    shrunk = re.search(r"scenario: (\d+) requests?;.*?\n((?:  r\d+: .*\n)+)", output)
    assert shrunk, output
    num_requests, request_lines = int(shrunk.group(1)), shrunk.group(2).splitlines()
    prompts = [re.search(r"prompt \[([^]]*)\]", line).group(1).split(", ") for line in request_lines]
    # Drawn: up to 6 requests of up to 24 prompt tokens. The bug needs 3: one leaves, one stays, one joins. Under the
    # per-token verdict Hypothesis' shrinker stops at 5 or 6 one-token prompts (3 to 5 under the first-divergence
    # check it replaced), though the 3-request scenario fails too; why it stops there is not known.
    assert 3 <= num_requests <= 6 and all(len(prompt) <= 2 for prompt in prompts), shrunk.group(0)
    print(shrunk.group(0))
