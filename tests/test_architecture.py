"""Dependencies point one way: the pure-Python core never imports torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PURE_MODULES = [
    "perfsuite",
    "perfsuite.engine",
    "perfsuite.engine.scheduler",
    "perfsuite.engine.kv_cache",
    "perfsuite.engine.kv_memory",
    "perfsuite.engine.fake_runner",
    "perfsuite.engine.prefix_cache",
    "perfsuite.engine.decode_buckets",
    "perfsuite.adapters",
    "perfsuite.adapters.builtin",
    "perfsuite.plugin.recorder",
    "perfsuite.adapters.openai_http",
    "perfsuite.adapters.peer_support",
    "perfsuite.serve",
    "perfsuite.workload.sweep",
    "perfsuite.workload.shaped",
    "perfsuite.workload.trace",
    "perfsuite.workload.jsonl",
    "perfsuite.engine.admission",
    "perfsuite.measure.metrics",
    "perfsuite.measure.capacity",
    "perfsuite.measure.capacity_runs",
    "perfsuite.measure.prefix_cache",
    "perfsuite.testing.greedy",
    "perfsuite.testing",
    "perfsuite.models",
    "perfsuite.workload",
    "perfsuite.judge.stats",
    "perfsuite.measure.contention",
    "perfsuite.judge.power",
    "perfsuite.judge.baselines",
    "perfsuite.plugin.session",
    "perfsuite.plugin.options",
    "perfsuite.plugin.sizing",
    "perfsuite.plugin.hooks",
    "perfsuite.report.render",
    "perfsuite.report.plots",
    "perfsuite.judge.results",
    "perfsuite.judge.compare",
    "perfsuite.judge.paired",
    "perfsuite.judge.tally",
    "perfsuite.ab.wire",
    "perfsuite.codec",
    "perfsuite.ab.pair",
    "perfsuite.plugin.against",
    "perfsuite.history",
    "perfsuite.history.store",
    "perfsuite.cli",
    "perfsuite.history.series",
    "perfsuite.history.changes",
    "perfsuite.history.head",
    "perfsuite.report.trend",
    "perfsuite.plugin.change_points",
    "perfsuite.cluster.wire",
    "perfsuite.cluster.actor",
    "perfsuite.cluster.pool",
    "perfsuite.plugin.cluster",
    "perfsuite.cluster.shards",
    "perfsuite.cluster.client_actor",
    "perfsuite.cluster.client_pool",
    "perfsuite.ab.packing",
    "perfsuite.ab.on_ray",
    "perfsuite.cluster.pairs",
    "perfsuite.plugin.against_on_ray",
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


# -- layering: which package may import which --------------------------------------------------------------------
#
# Read from the source (every import statement, lazy ones inside functions included), so a dependency
# cannot hide behind a function-level import. "<top>" is a module directly under perfsuite/.

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "perfsuite"

ALLOWED = {
    "engine": {"cache_dir", "host"},
    "models": {"cache_dir"},
    "cache_dir": set(),  # where perfsuite keeps what it computed once: the standard library only
    "host": set(),  # the CPU's name and byte counts as people read them: the standard library only
    "workload": {"engine"},
    "measure": {"engine", "host"},
    "adapters": {"engine"},
    "codec": set(),  # the structural codec of the A/B wire and results.json: the standard library only
    "judge": {"codec", "engine", "measure"},
    # the run history: the store (results in, results out), each test's series, their change points
    "history": {"judge"},
    "report": {"engine", "judge", "history", "host"},
    # the correctness kit for users' tests (its token comparison, testing/greedy.py, among it): nothing of perfsuite
    # imports it
    "testing": {"adapters", "engine", "models"},
    "serve": {"adapters", "engine", "measure", "models"},
    "argtypes": set(),
    # ab/worker_main.py imports the *tree under test's* adapters, measure and models, inside its functions;
    # ab/on_ray.py is A/B's end on a cluster node: it speaks cluster/wire.py and names its node as cluster/actor.py does
    "ab": {"__init__", "cluster", "codec", "engine", "adapters", "measure", "models"},
    # --perf-ray: the typed wire (codec), the actor (which builds engines and measures on its node), the pool. Not ab:
    # the A/B pool (cluster/pairs.py) is handed its node actor's class (ab/on_ray.py) by the plugin
    "cluster": {"adapters", "codec", "engine", "measure", "models"},
    "plugin": {"ab", "adapters", "argtypes", "cluster", "codec", "engine", "history", "judge", "measure", "models",
               "report", "workload"},
    "cli": {"adapters", "argtypes", "engine", "history", "judge", "measure", "models", "report", "serve", "workload",
            "scaffold"},
    "scaffold": set(),  # perfsuite init: templates and a writer, nothing else of perfsuite
    "__main__": {"cli"},
    "suites": {"plugin"},  # the shipped perf tests: they read the session's options
    "__init__": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """A module's layer: its sub-package, or its own name for a module directly under perfsuite/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "perfsuite" or name.startswith("perfsuite.")}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE_ROOT.rglob("*.py")}
    return {
        module: {name for name in imported_modules(path) if name in paths and name != module}
        for module, path in paths.items()
    }


def layer_imports() -> dict[str, set[str]]:
    """Each layer's imports of other layers, read from the source."""
    found: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        found.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return found


def test_every_layer_is_listed():
    assert {unit_of(module) for module in import_graph()} <= set(ALLOWED)


def test_every_listed_layer_exists():
    missing = sorted(set(ALLOWED) - {unit_of(module) for module in import_graph()})
    assert not missing, f"ALLOWED lists layers perfsuite/ no longer has: {missing}"


def test_every_allowed_dependency_is_used():
    """An allowance nothing uses is a door left open: drop it, and a new import has to argue for it."""
    used = layer_imports()
    unused = sorted(
        f"{layer} -> {target}" for layer, targets in ALLOWED.items() for target in targets - used.get(layer, set())
    )
    assert not unused, "ALLOWED permits imports no module makes: " + "; ".join(unused)


def test_every_pure_module_exists():
    modules = set(import_graph())
    missing = sorted(set(PURE_MODULES) - modules)
    assert not missing, f"PURE_MODULES lists modules perfsuite/ no longer has: {missing}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if unit_of(module) == layer
        for target in targets
        if unit_of(target) != layer and unit_of(target) not in ALLOWED[layer]
    )
    assert not wrong, f"{layer} may import only {sorted(ALLOWED[layer])}: " + "; ".join(wrong)


def test_no_import_circles_between_modules():
    graph = import_graph()
    # a package's __init__ re-exporting its own modules is not a circle of ideas
    edges = {m: {t for t in ts if not (m == t.rsplit(".", 1)[0] or t == m.rsplit(".", 1)[0])} for m, ts in graph.items()}
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles: " + "; ".join(circles)


def top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is loaded (not inside its functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


@pytest.mark.parametrize("name", ["wire.py", "worker_main.py"])
def test_the_ab_worker_loads_nothing_of_the_controllers_perfsuite(name):
    """A worker must import perfsuite from its own tree, so these two load only the standard library."""
    imported = top_level_imports(PACKAGE_ROOT / "ab" / name) - {"__future__"}
    not_stdlib = sorted(m for m in imported if m not in sys.stdlib_module_names)
    assert not not_stdlib, f"perfsuite/ab/{name} imports {not_stdlib} when loaded"



# -- function length -----------------------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 40


def has_long_reason(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function may be longer when its docstring has a line `Long: <why splitting it would hurt>`."""
    docstring = ast.get_docstring(function) or ""
    return any(line.strip().startswith("Long: ") and line.strip()[len("Long: "):].strip()
               for line in docstring.splitlines())


def long_functions() -> list[str]:
    """Every def and async def (methods and nested ones included) over the limit, as path:line (N lines)."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not has_long_reason(node):
                where = path.relative_to(PACKAGE_ROOT.parent)
                found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_40_lines_without_a_reason():
    offenders = long_functions()
    assert not offenders, (
        f"{len(offenders)} functions over {MAX_FUNCTION_LINES} lines without a `Long: <reason>` docstring line:\n"
        + "\n".join(offenders)
    )
