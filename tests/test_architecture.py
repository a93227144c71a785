"""Dependencies point one way: the pure-Python core never imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE_MODULES = [
    "perfsuite",
    "perfsuite.engine",
    "perfsuite.engine.scheduler",
    "perfsuite.engine.kv_cache",
    "perfsuite.engine.fake_runner",
    "perfsuite.adapters",
    "perfsuite.adapters.builtin",
    "perfsuite.plugin.recorder",
    "perfsuite.adapters.openai_http",
    "perfsuite.adapters.peer_support",
    "perfsuite.serve",
    "perfsuite.workload.sweep",
    "perfsuite.measure.metrics",
    "perfsuite.correctness",
    "perfsuite.models",
    "perfsuite.workload",
    "perfsuite.judge.stats",
    "perfsuite.measure.contention",
    "perfsuite.judge.power",
    "perfsuite.judge.baselines",
    "perfsuite.plugin.session",
    "perfsuite.plugin.options",
    "perfsuite.plugin.hooks",
    "perfsuite.report.render",
    "perfsuite.report.plots",
    "perfsuite.judge.results",
    "perfsuite.judge.compare",
    "perfsuite.cli",
]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_module_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"], f"{module} imports torch or transformers at import time"


def test_the_engine_core_does_not_depend_on_adapters_or_the_plugin():
    code = (
        "import sys, perfsuite.engine, perfsuite.engine.engine, perfsuite.engine.scheduler; "
        "print(sorted(m for m in sys.modules if m.startswith(('perfsuite.adapters', 'perfsuite.plugin.hooks', "
        "'perfsuite.plugin.session', 'pytest'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the engine core reaches outward: {out}"
