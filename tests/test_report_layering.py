"""The report sits above the judge's typed results only: rendering HTML needs neither pytest, scipy nor torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfsuite"
REPORT_MODULES = (
    "perfsuite.report.render", "perfsuite.report.plots", "perfsuite.report.table", "perfsuite.report.verdict_table",
    "perfsuite.report.trend",
)


def test_importing_the_report_loads_neither_pytest_scipy_torch_nor_the_plugin():
    code = (
        f"import sys, {', '.join(REPORT_MODULES)}; "
        "print(sorted(m for m in ('pytest', 'scipy', 'torch', 'numpy', 'perfsuite.plugin') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the report pulls in {out.strip()}"


def test_the_report_reads_perfsuite_only_through_the_judges_results_and_the_history():
    imported = set()
    for path in (PACKAGE / "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perfsuite"):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("perfsuite"))
    outside = {name for name in imported if name != "perfsuite.report" and not name.startswith("perfsuite.report.")}
    outside = {name for name in outside if not name.startswith("perfsuite.history.")}  # series of those results
    # besides: the engines' names (constants) and how bytes read (host.py), both standard library only;
    # judge.stats only under TYPE_CHECKING, for the comparison type the results hold; judge.tally, the one wording
    # of why a comparison was not judged (terminal, report and summary alike); engine.server_metrics, the typed
    # server figures a result holds (standard library only)
    names = {"perfsuite.engine.names", "perfsuite.host", "perfsuite.judge.stats", "perfsuite.judge.tally"}
    names |= {"perfsuite.engine.server_metrics"}
    assert outside <= {"perfsuite.judge.results", "perfsuite.judge.baselines", *names}, outside


@pytest.mark.parametrize(
    "module",
    ["report/render.py", "report/verdict_table.py", "judge/compare.py", "judge/results.py", "judge/judge.py",
     "plugin/session.py"],
)  # fmt: skip
def test_no_untyped_document_crosses_between_the_session_the_judge_and_the_report(module):
    """Public functions take and return typed values; only ``to_json``/``from_json`` see JSON objects."""
    untyped = []
    for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name in ("to_json", "from_json"):
            continue
        annotations = [a.annotation for a in node.args.args + node.args.kwonlyargs] + [node.returns]
        shown = [ast.unparse(a) for a in annotations if a is not None]
        untyped += [f"{node.name}: {a}" for a in shown if "Any]" in a]
    assert not untyped, untyped
