"""perfsuite's pytest plugin: hooks and fixtures only.

Registered through the ``pytest11`` entry point. The logic lives in
``options``, ``session``, ``recorder``, ``stats`` and ``storage``; torch is
imported inside fixtures, so a run without ``--perf`` never imports it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsuite.plugin.options import add_options, read_options
from perfsuite.report.render import write_report
from perfsuite.plugin.session import PerfSession
from perfsuite.judge.stats import Verdict
from perfsuite.judge.baselines import OutputError
from perfsuite.report.table import format_table

SESSION_KEY = pytest.StashKey[PerfSession]()
REPORT_KEY = pytest.StashKey[Path]()
OUTPUT_ERROR_KEY = pytest.StashKey[str]()
WORKER_OUTPUT_KEY = "perfsuite"
SKIP_REASON = "perf test: run it with `pytest --perf` (see README, 'pytest --perf')"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perf: a performance test, run only with --perf")
    config.stash[SESSION_KEY] = PerfSession(read_options(config), config.rootpath)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash[SESSION_KEY]
    if not session.options.enabled:
        for item in items:
            if item.get_closest_marker("perf"):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Count the comparisons this session will make (after -k/-m deselection) and say if none can fail."""
    perf_session = session.config.stash[SESSION_KEY]
    if not perf_session.options.enabled:
        return
    perf_session.num_planned_tests = sum(1 for item in session.items if _will_run(item))
    advice = perf_session.plan_power().advice()
    if advice is None:
        return
    if perf_session.options.strict:
        raise pytest.UsageError(f"--perf-strict: {advice}")
    perf_session.warnings.append(advice)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"perfsuite warning: {advice}", yellow=True, bold=True)


def _will_run(item: pytest.Item) -> bool:
    if not item.get_closest_marker("perf"):
        return False
    if item.get_closest_marker("skip"):
        return False
    return not any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is None or not perf_session.options.enabled:
        return
    if _is_xdist_worker(config):
        config.workeroutput[WORKER_OUTPUT_KEY] = perf_session.worker_output()
        return
    try:
        perf_session.finish()
        if perf_session.results:
            config.stash[REPORT_KEY] = write_report(perf_session.options.report_dir)
    except OutputError as error:
        config.stash[OUTPUT_ERROR_KEY] = str(error)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    failed_late = perf_session.late_regressions and not perf_session.options.save_baseline
    if failed_late and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker's raw results, judged here with everyone else's."""
    perf_session = node.config.stash.get(SESSION_KEY, None)
    output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    if perf_session is not None and output:
        perf_session.add_worker_output(output)


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is None or not perf_session.options.enabled or _is_xdist_worker(config):
        return
    write = terminalreporter.write_line
    if perf_session.results:
        terminalreporter.section("perfsuite")
        write(format_table(VERDICT_COLUMNS, verdict_rows(perf_session.results)))
    for warning in perf_session.warnings:
        write(f"warning: {warning}", yellow=True)
    for late in perf_session.late_regressions:
        write(f"regression found by the session-wide correction at session end: {late}", red=True, bold=True)
    if OUTPUT_ERROR_KEY in config.stash:
        write(f"perfsuite error: {config.stash[OUTPUT_ERROR_KEY]}", red=True, bold=True)
    if not perf_session.results:
        return
    options = perf_session.options
    write(
        f"profile {options.profile.name}, {options.repeats} repeats, alpha {options.policy.alpha} (Benjamini-Hochberg over "
        f"{perf_session.num_planned_comparisons} comparisons of {len(perf_session.compared_metrics)} metrics), "
        f"min effect {options.policy.min_effect:.0%}; results in {options.report_dir / 'results.json'}"
    )
    if REPORT_KEY in config.stash:
        write(f"report: {config.stash[REPORT_KEY]}")


VERDICT_COLUMNS = ["test", "metric", "baseline", "current", "change", "ratio CI", "p (BH)", "MDE", "verdict"]


def verdict_rows(results) -> list[list]:
    rows = []
    for result in results:
        name = result.test_id.rpartition("::")[2]
        if not result.comparisons:
            rows.append([name, "output_throughput", "-", f"{result.summary['output_throughput']:.4g}",
                         "-", "-", "-", "-", result.baseline_status])
        for c in result.comparisons:
            mde = f"{c.min_detectable_effect:.0%}" if c.min_detectable_effect is not None else "none"
            verdict = "noisy: inconclusive" if c.verdict is Verdict.NOISY else c.verdict.value
            rows.append([name, c.metric, f"{c.baseline_median:.4g}", f"{c.current_median:.4g}",
                         f"{c.change_percent:+.1f}%", f"[{c.ci_low:.3f}, {c.ci_high:.3f}]",
                         f"{c.p_adjusted:.3g}", mde, verdict])
        for change in result.counter_changes:
            rows.append([name, change.name, change.baseline, change.current, "exact", "-", "-", "-",
                         "counter changed"])
    return rows


def perf_options(config: pytest.Config):
    """The parsed ``--perf-*`` options, e.g. to parametrize tests from the profile."""
    return config.stash[SESSION_KEY].options


# -- fixtures ---------------------------------------------------------------


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest) -> PerfSession:
    return request.config.stash[SESSION_KEY]


@pytest.fixture(scope="session")
def perf_model(perf_session):
    """The model under test, loaded once per session on the chosen device."""
    from perfsuite.measure.timing import configure_threads, resolve_device
    from perfsuite.models import load_model

    options = perf_session.options
    device = resolve_device(options.device)
    if device == "cpu":
        configure_threads(None)
    return load_model(options.model, device=device, dtype=options.dtype)


@pytest.fixture(scope="session")
def perf_backend(perf_session, perf_model):
    """Runner, tokenizer, limits and the HF model. Override this fixture to measure another runner."""
    from perfsuite.adapters import Backend

    options = perf_session.options
    return Backend.from_loaded(
        perf_model, endpoint=options.endpoint, decode_mode=options.decode_mode, http_options=options.http_client
    )


@pytest.fixture(scope="session")
def _perf_environment(perf_session, perf_backend):
    from perfsuite.measure.environment import capture_environment, git_commit

    options = perf_session.options
    perf_session.environment = capture_environment(options.model, options.dtype, perf_backend.device)
    perf_session.commit = git_commit(perf_session.rootdir)
    return perf_session.environment


@pytest.fixture(scope="session")
def requests_for(perf_backend):
    """``requests_for(workload)`` -> the workload's requests, tokenized for the model under test."""
    from perfsuite.workload import Vocab

    vocab = None
    if perf_backend.vocab_size:
        vocab = Vocab(perf_backend.vocab_size, perf_backend.special_token_ids)

    def make(workload):
        return workload.requests(perf_backend.tokenize, vocab=vocab)

    return make


@pytest.fixture(scope="session")
def workload_factory(perf_session, requests_for):
    """``workload_factory(lengths="uniform", rate=None, num_requests=None)`` -> requests of the profile."""
    from perfsuite.workload import Arrivals, Workload

    profile = perf_session.options.profile

    def make(lengths: str = "uniform", rate: float | None = None, num_requests: int | None = None, seed: int = 0):
        if lengths not in profile.lengths:
            raise ValueError(f"profile {profile.name!r} has no {lengths!r} lengths; choose {sorted(profile.lengths)}")
        workload = Workload(num_requests or profile.num_requests, profile.lengths[lengths], Arrivals(rate), seed)
        return requests_for(workload)

    return make


@pytest.fixture
def workload(workload_factory):
    return workload_factory()


@pytest.fixture(scope="session")
def perf_max_seq_len(perf_session, perf_backend, workload_factory, requests_for) -> int:
    """One cache length that fits every workload of the profile and of the sweep config."""
    from perfsuite.measure.timing import max_seq_len_for

    options = perf_session.options
    requests = [r for kind in options.profile.lengths for r in workload_factory(kind)]
    if options.sweep is not None:
        requests += [r for case in options.sweep.cases() for r in requests_for(case.workload)]
    return max_seq_len_for(requests, perf_backend.max_context)


@pytest.fixture
def perf_built_engines() -> list:
    """The engines ``engine_factory`` built for this test: the baseline identity records their knobs."""
    return []


@pytest.fixture
def engine_factory(perf_session, perf_backend, perf_max_seq_len, perf_built_engines):
    """``engine_factory(name, batch_size=..., prefill_batch_size=..., token_budget=...)`` -> a BatchingEngine.

    ``name`` is any registered engine (``perfsuite.adapters.available_engines()``).
    Override this fixture to hand the shipped tests an engine of your own.
    """
    from perfsuite.adapters import EngineConfig, build_engine

    default_batch = max(perf_session.options.profile.batch_sizes)

    def make(name: str, batch_size: int = default_batch, prefill_batch_size=None, token_budget=None):
        from perfsuite.plugin.recorder import BuiltEngine

        config = EngineConfig(batch_size, perf_max_seq_len, prefill_batch_size, token_budget)
        engine = build_engine(name, perf_backend, config)
        perf_built_engines.append(BuiltEngine(engine, name, config))
        return engine

    return make


@pytest.fixture
def static_engine(engine_factory):
    return engine_factory("static")


@pytest.fixture
def inflight_engine(engine_factory):
    return engine_factory("inflight")


@pytest.fixture
def perf(request, benchmark, perf_session, perf_backend, _perf_environment, perf_built_engines):
    """Record a run and assert no regression: ``perf.measure(engine, requests)``, ``perf.assert_no_regression()``."""
    from perfsuite.plugin.recorder import PerfRecorder

    return PerfRecorder(perf_session, request.node.nodeid, benchmark, perf_backend, perf_built_engines)
