"""The id a perf test's results and baseline are stored under.

A test of the running project is known by its pytest nodeid, which is relative
to the rootdir. The shipped suite (``perfsuite.suites``) runs from wherever
perfsuite is installed, often outside the rootdir, where pytest makes its
nodeids relative to the package directory (``test_throughput.py::...``), the
same as a project's own ``test_throughput.py`` would have. Its tests are known
instead by their path inside the package,
``perfsuite/suites/test_throughput.py::test_throughput[static-B4-uniform]``:
the same id in perfsuite's checkout (where it is also the nodeid, and the
shipped baselines are stored under it) and in any project that runs the suite.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

SUITES_ID_PREFIX = PurePosixPath("perfsuite", "suites")
SUITES_DIR = Path(__file__).resolve().parents[1] / "suites"


def perf_test_id(item: pytest.Item) -> str:
    """``item``'s package-relative id if it is one of the shipped suite's tests, else its nodeid."""
    module = item.getparent(pytest.Module)
    if module is None:
        return item.nodeid
    path_in_suites = _path_in_suites(module.path)
    if path_in_suites is None:
        return item.nodeid
    name_in_module = item.nodeid[len(module.nodeid) :]  # "::test_x[params]", or "::Class::test_x[params]"
    return f"{SUITES_ID_PREFIX / path_in_suites}{name_in_module}"


def _path_in_suites(path: Path) -> PurePosixPath | None:
    try:
        return PurePosixPath(path.resolve().relative_to(SUITES_DIR).as_posix())
    except ValueError:
        return None
