"""perfsuite's pytest plugin: hooks and fixtures only.

Registered through the ``pytest11`` entry point, so every pytest run in an
environment that installs perfsuite imports this module: what only ``--perf``
needs (torch, scipy, the HTML report) is imported inside the hooks and
fixtures that use it. The logic lives in ``options``, ``session``,
``recorder``, ``terminal`` and ``perfsuite.judge``. Every fixture is named
``perf`` or ``perf_*``, so none shadows, or is shadowed by, a project's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfsuite.engine.names import INFLIGHT, PAGED_ENGINES, STATIC
from perfsuite.judge.baselines import OutputError
from perfsuite.plugin.gpu_workers import WORKER_GPU_KEY, GpuAssignment, GpuAssignmentError, gpus_for_workers, pin_worker
from perfsuite.plugin.ids import perf_test_id
from perfsuite.plugin.options import add_options, read_options
from perfsuite.plugin.session import PerfSession
from perfsuite.plugin.sizing import check_kv_blocks, check_workload_context, kv_memory_failure
from perfsuite.plugin.stash import (
    GPU_ASSIGNMENT_KEY,
    HISTORY_ERROR_KEY,
    HISTORY_KEY,
    OUTPUT_ERROR_KEY,
    REPORT_KEY,
    RESULTS_KEY,
    SESSION_KEY,
    SUMMARY_KEY,
)
from perfsuite.plugin.terminal import WrittenFiles, write_summary

WORKER_OUTPUT_KEY = "perfsuite"
SKIP_REASON = "perf test: run it with `pytest --perf` (see docs/writing-perf-tests.md)"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)  # a worker is pinned to its GPU before other plugins may touch CUDA
def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_worker(config):
        _as_usage_error(pin_worker, getattr(config, "workerinput"), os.environ, _cuda_initialized)  # noqa: B009
    config.addinivalue_line("markers", "perf: a performance test, run only with --perf")
    options = read_options(config)
    config.stash[SESSION_KEY] = PerfSession(options, config.rootpath)
    num_workers = _num_xdist_workers(config)
    check_kv_blocks(options, loads_a_model_here=not num_workers and options.against is None and options.ray is None)
    check_workload_context(options)
    if num_workers and options.ray is None:  # under --perf-ray the actors hold the GPUs, on the cluster's nodes
        gpus = _as_usage_error(
            gpus_for_workers, options.enabled, options.device, num_workers, os.environ, _count_cuda_devices
        )
        if gpus:
            config.stash[GPU_ASSIGNMENT_KEY] = GpuAssignment(gpus)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """--perf-against-if-no-baseline: what the session compares with, and why, before anything runs."""
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is None or perf_session.options.comparison_note is None:
        return []
    return [f"perfsuite: {perf_session.options.comparison_note}"]


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
    if perf_session.num_planned_tests and not session.config.option.collectonly:
        from perfsuite.plugin.measurers import measurer_for, start_transports

        start_transports(perf_session, session.config.invocation_params.dir)
        perf_session.measurer = measurer_for(perf_session)  # the mode, chosen once: nothing asks it again
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A perf test that judged none of its comparisons is reported skipped, saying why and what to do.

    Decided where the test ran (a pytest-xdist worker too), once its result
    is recorded: results.json and the report keep it. The session-end
    adjustment cannot undo the decision (``perfsuite.judge.tally`` says why).
    A planned test that skipped itself before recording anything (a capacity
    test without --perf-slo) is counted, so the session's judged line leaves
    its comparisons out of those planned.
    """
    report = yield
    perf_session = item.config.stash.get(SESSION_KEY, None)
    if perf_session is None or not perf_session.options.enabled or report.when == "teardown":
        return report
    if report.when == "call":
        _note_node(item, perf_session)
    if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
        reason = perf_session.judged_nothing(perf_test_id(item))
        if reason is not None:
            path, lineno, _ = item.reportinfo()
            report.outcome = "skipped"
            report.longrepr = (str(path), (lineno or 0) + 1, f"Skipped: {reason}")  # as pytest.skip writes it
    elif report.skipped and _will_run(item) and not perf_session.has_recorded(perf_test_id(item)):
        perf_session.num_self_skipped_tests += 1
    return report


def _note_node(item: pytest.Item, perf_session: PerfSession) -> None:
    """``--perf-ray``: the node that measured the test, as a property its report (and JUnit XML) carries."""
    test_id = perf_test_id(item)
    nodes = [result.node for result in perf_session.results if result.test_id == test_id and result.node]
    if nodes and ("perf_node", nodes[-1]) not in item.user_properties:
        item.user_properties.append(("perf_node", nodes[-1]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is None or not perf_session.options.enabled:
        return
    if _is_xdist_worker(config):
        getattr(config, "workeroutput")[WORKER_OUTPUT_KEY] = perf_session.worker_output()  # noqa: B009 - xdist's
        return
    try:
        results_path = perf_session.finish()
        if results_path is not None and perf_session.finished is not None:
            config.stash[RESULTS_KEY] = results_path
            from perfsuite.report.render import write_report  # jinja2 and matplotlib: only a --perf run pays

            report_dir, earlier = perf_session.options.report_dir, perf_session.earlier_sessions
            config.stash[REPORT_KEY] = write_report(perf_session.finished, report_dir, earlier)
            config.stash[SUMMARY_KEY] = _write_markdown_summary(perf_session)
    except OutputError as error:
        config.stash[OUTPUT_ERROR_KEY] = str(error)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _append_to_history(session, perf_session)
    failed_late = perf_session.late_regressions and not perf_session.options.save_baseline
    failed = failed_late or perf_session.failing_change_points or perf_session.fails_strict
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_markdown_summary(perf_session: PerfSession) -> Path:
    """``summary.md`` beside the report, and GitHub's job summary when ``$GITHUB_STEP_SUMMARY`` is set."""
    from perfsuite.report.summary import summary_markdown, write_summary_files

    assert perf_session.finished is not None  # the caller wrote the results first
    markdown = summary_markdown(perf_session.finished, perf_session.tally())
    return write_summary_files(markdown, perf_session.options.report_dir).summary


def _append_to_history(session: pytest.Session, perf_session: PerfSession) -> None:
    """The finished session into --perf-history; a store that cannot take it fails the session as results.json would."""
    if perf_session.options.history_store is None or perf_session.finished is None:
        return
    from perfsuite.history.store import HistoryError  # SQLAlchemy: only a session that keeps a history pays

    try:
        kept_at = perf_session.append_to_history()
    except HistoryError as error:
        session.config.stash[HISTORY_ERROR_KEY] = (
            f"{error} (this session is not in the history; --perf-history none keeps no history)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    if kept_at is not None:
        session.config.stash[HISTORY_KEY] = kept_at


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the A/B workers and remove the reference's snapshot, and the Ray actors, however the session ended."""
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is not None and perf_session.against is not None:
        perf_session.against.close()
        perf_session.against = None
    if perf_session is not None and perf_session.client_shards is not None:
        perf_session.client_shards.close()  # before the pool, which disconnects from Ray
        perf_session.client_shards = None
    if perf_session is not None and perf_session.cluster is not None:
        perf_session.cluster.close()
        perf_session.cluster = None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker's raw results, judged here with everyone else's."""
    perf_session = node.config.stash.get(SESSION_KEY, None)
    output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    if perf_session is not None and output:
        perf_session.add_worker_output(output)
    assignment = node.config.stash.get(GPU_ASSIGNMENT_KEY, None)
    if assignment is not None:  # a worker started in its place takes its GPU
        assignment.release(node.workerinput["workerid"])


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own, which counts CPUs
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` in a --perf session on GPUs: one worker per visible GPU (else xdist's own count)."""
    options = read_options(config)
    if options.ray is not None:  # the cluster's GPUs are not this host's: xdist's own count
        return None
    gpus = _as_usage_error(gpus_for_workers, options.enabled, options.device, 1, os.environ, _count_cuda_devices)
    return len(gpus) or None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist's controller, setting a worker up: the GPU it is to see (``pin_worker`` sets it there)."""
    assignment = node.config.stash.get(GPU_ASSIGNMENT_KEY, None)
    if assignment is not None:
        node.workerinput[WORKER_GPU_KEY] = assignment.assign(node.workerinput["workerid"])


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _num_xdist_workers(config: pytest.Config) -> int:
    """How many workers ``-n`` starts from this process: 0 on a worker, without -n, or with --tx alone."""
    if _is_xdist_worker(config) or not getattr(config.option, "numprocesses", None):
        return 0
    return len(getattr(config.option, "tx", None) or ())


def _count_cuda_devices() -> int:
    import torch  # only when CUDA_VISIBLE_DEVICES is unset; NVML counts where it can (the controller runs no test)

    return torch.cuda.device_count()


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # not imported: certainly not initialised
    return torch is not None and torch.cuda.is_initialized()


def _as_usage_error(function, *args):
    try:
        return function(*args)
    except GpuAssignmentError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is None or not perf_session.options.enabled or _is_xdist_worker(config):
        return
    ran = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    if (
        perf_session.results
        or perf_session.determinism
        or perf_session.instructions
        or (ran and perf_session.tally().num_planned)
    ):
        terminalreporter.section("perfsuite")
    written = WrittenFiles(
        config.stash.get(RESULTS_KEY, None),
        config.stash.get(REPORT_KEY, None),
        config.stash.get(HISTORY_KEY, None),
        config.stash.get(SUMMARY_KEY, None),
    )
    errors = (config.stash.get(OUTPUT_ERROR_KEY, None), config.stash.get(HISTORY_ERROR_KEY, None))
    write_summary(terminalreporter.write_line, perf_session, written, *errors, ran)
    nodes = [result.node for result in perf_session.results if result.node]
    if nodes:
        counts = ", ".join(f"{node}: {nodes.count(node)}" for node in dict.fromkeys(nodes))
        terminalreporter.write_line(f"measured on Ray nodes (tests each; results.json names each test's): {counts}")


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
def perf_backend(request, perf_session):
    """Runner, tokenizer, limits and the HF model. Override this fixture to measure another runner.

    Under ``--perf-against`` the models live in the two workers, under
    ``--perf-ray`` in the actors: this backend has no runner, and tokenizes
    through the current tree's worker or the first node's actor (the
    session's measurer says which, ``plugin.measurers``).
    """
    from perfsuite.adapters import Backend
    from perfsuite.measure.probe import machine_probe

    options = perf_session.options

    def load_here() -> Backend:
        return Backend.from_loaded(
            request.getfixturevalue("perf_model"),
            endpoint=options.endpoint,
            decode_mode=options.decode_mode,
            http_options=options.http_client,
            probe=machine_probe,
            batch_invariant=options.batch_invariant,
        )

    return perf_session.measurer.backend(load_here)


@pytest.fixture(scope="session")
def _perf_environment(perf_session, perf_backend):
    from perfsuite.measure.environment import capture_environment, git_commit

    options = perf_session.options
    perf_session.environment = perf_session.measurer.environment()  # where the models live elsewhere: theirs
    if perf_session.environment is None:
        perf_session.environment = capture_environment(options.model, options.dtype, perf_backend.device)
        # A backend without the machine probe (a fake that sleeps) follows no machine: nothing to divide by.
        if perf_backend.probe is not None:
            perf_session.peaks = _measured_peaks(perf_backend.device, options.dtype)
    perf_session.commit = git_commit(perf_session.rootdir)
    return perf_session.environment


def _measured_peaks(device: str, dtype: str):
    """This machine's roofs for MFU and MBU; None where the dtype is no torch dtype (nothing to divide by)."""
    from perfsuite.measure.peaks import measure_peaks

    try:
        return measure_peaks(device, dtype)
    except (AttributeError, TypeError, RuntimeError):
        return None


@pytest.fixture(scope="session")
def perf_requests_for(perf_backend):
    """``perf_requests_for(workload)`` -> the workload's requests, tokenized for the model under test."""
    from perfsuite.workload import Vocab

    vocab = None
    if perf_backend.vocab_size:
        vocab = Vocab(perf_backend.vocab_size, perf_backend.special_token_ids)

    def make(workload):
        return workload.requests(perf_backend.tokenize, vocab=vocab)

    return make


@pytest.fixture(scope="session")
def perf_workload_factory(perf_session, perf_requests_for):
    """``perf_workload_factory(lengths="uniform", rate=None, num_requests=None)`` -> requests of the profile."""
    from perfsuite.workload import Arrivals, Workload

    profile = perf_session.options.profile

    def make(lengths: str = "uniform", rate: float | None = None, num_requests: int | None = None, seed: int = 0):
        if lengths not in profile.lengths:
            raise ValueError(f"profile {profile.name!r} has no {lengths!r} lengths; choose {sorted(profile.lengths)}")
        workload = Workload(num_requests or profile.num_requests, profile.lengths[lengths], Arrivals(rate), seed)
        return perf_requests_for(workload)

    return make


@pytest.fixture
def perf_workload(perf_workload_factory):
    """The profile's uniform-lengths requests, all at t0."""
    return perf_workload_factory()


@pytest.fixture(scope="session")
def perf_max_seq_len(perf_session, perf_backend, perf_workload_factory) -> int:
    """The cache length of an engine built without ``requests``: one that fits every workload of the profile.

    Not the sweep config's: a sweep case sizes its engine for its own requests,
    so adding a long case costs no other test anything.
    """
    from perfsuite.measure.timing import max_seq_len_for

    requests = [r for kind in perf_session.options.profile.lengths for r in perf_workload_factory(kind)]
    return max_seq_len_for(requests, perf_backend.max_context)


@pytest.fixture
def perf_built_engines() -> list:
    """The engines ``perf_engine_factory`` built for this test: the baseline identity records their knobs."""
    return []


@pytest.fixture
def perf_engine_factory(perf_session, perf_backend, perf_max_seq_len, perf_built_engines):
    """``perf_engine_factory(name, batch_size=..., prefill_batch_size=..., token_budget=..., requests=...)``.

    ``name`` is any registered engine (``perfsuite.adapters.available_engines()``).
    ``requests``, the requests the engine will serve, size its cache (``max_seq_len``)
    for the longest of them, so a static decode step attends over what this
    test needs; without them it is ``perf_max_seq_len``. ``num_kv_blocks=...``
    sizes the paged engines' KV pool; unset, a ``paged`` or ``paged-prefix`` engine gets
    ``--perf-kv-blocks`` (the others ignore both). A pool too small for the
    largest of ``requests`` fails the test here, before anything runs, and so
    does a KV cache the device's memory cannot hold (naming the option or
    knob to lower). The session's measurer builds it (``plugin.measurers``).
    Override this fixture to hand the shipped tests an engine of your own.
    """
    return _EngineFactory(perf_session, perf_backend, perf_max_seq_len, perf_built_engines)


@dataclass(frozen=True, slots=True)
class _EngineFactory:
    """``perf_engine_factory``'s callable: the knobs from its arguments and the session, the engine from its measurer."""

    perf_session: PerfSession
    backend: Any
    max_seq_len: int
    built_engines: list

    def __call__(
        self,
        name: str,
        batch_size: int | None = None,
        prefill_batch_size=None,
        token_budget=None,
        requests=None,
        num_kv_blocks=None,
    ):
        from perfsuite.engine.kv_memory import KVMemoryError
        from perfsuite.measure.timing import max_seq_len_for
        from perfsuite.plugin.recorder import BuiltEngine

        options = self.perf_session.options
        batch_size = max(options.profile.batch_sizes) if batch_size is None else batch_size
        max_seq_len = self.max_seq_len if requests is None else max_seq_len_for(requests, self.backend.max_context)
        pool_from_option = name in PAGED_ENGINES and num_kv_blocks is None
        knobs = (batch_size, max_seq_len, prefill_batch_size, token_budget)
        config = _engine_config(options, name, *knobs, num_kv_blocks, requests)
        try:
            engine = self.perf_session.measurer.engine(name, config, self.backend)
        except KVMemoryError as error:
            pytest.fail(kv_memory_failure(error, name, batch_size, options, pool_from_option), pytrace=False)
        self.built_engines.append(BuiltEngine(engine, name, config))
        return engine


def _engine_config(options, name, batch_size, max_seq_len, prefill_batch_size, token_budget, num_kv_blocks, requests):
    """The knobs ``perf_engine_factory`` builds ``name`` from; a paged engine's pool unset is ``--perf-kv-blocks``."""
    from perfsuite.adapters import EngineConfig

    if name in PAGED_ENGINES:
        num_kv_blocks = options.kv_blocks if num_kv_blocks is None else num_kv_blocks
        _check_pool_fits(num_kv_blocks, requests)
    return EngineConfig(
        batch_size,
        max_seq_len,
        prefill_batch_size,
        token_budget,
        num_kv_blocks,
        batch_invariant=options.batch_invariant,
    )


def _check_pool_fits(num_kv_blocks: int | None, requests) -> None:
    """Fail the test when the paged pool cannot hold its largest request (it would be refused mid-run)."""
    from perfsuite.engine.engine import DEFAULT_KV_BLOCK_SIZE

    if num_kv_blocks is None or not requests:
        return
    largest = max(requests, key=lambda request: request.max_total_tokens)
    num_needed = -(-largest.max_total_tokens // DEFAULT_KV_BLOCK_SIZE)
    if num_needed > num_kv_blocks:
        pytest.fail(
            f"the paged engine's KV pool of {num_kv_blocks} blocks of {DEFAULT_KV_BLOCK_SIZE} tokens "
            f"({num_kv_blocks * DEFAULT_KV_BLOCK_SIZE} tokens) cannot hold this test's largest request, "
            f"{largest.request_id!r}: prompt + max_new_tokens = {largest.max_total_tokens} tokens need "
            f"{num_needed} blocks, so it could never run. Give --perf-kv-blocks {num_needed} or more "
            "(or leave it unset for the default pool)",
            pytrace=False,
        )


@pytest.fixture
def perf_static_engine(perf_engine_factory):
    """The static-batching engine at the profile's largest batch size."""
    return perf_engine_factory(STATIC)


@pytest.fixture
def perf_inflight_engine(perf_engine_factory):
    """The in-flight (continuous batching) engine at the profile's largest batch size."""
    return perf_engine_factory(INFLIGHT)


@pytest.fixture
def perf(request, perf_session, perf_backend, _perf_environment, perf_built_engines):
    """Record a run and assert no regression: ``perf.measure(engine, requests)``, ``perf.assert_no_regression()``.

    Repeats are timed through pytest-benchmark's ``benchmark`` fixture, except
    under ``--perf-against``, where the two workers time them, and under
    ``--perf-ray``, where a Ray actor times them on its node.
    """
    from perfsuite.plugin.recorder import BenchmarkWhenUsed, PerfRecorder

    benchmark = BenchmarkWhenUsed(request) if perf_session.measurer.runs_here else None
    return PerfRecorder(perf_session, perf_test_id(request.node), benchmark, perf_backend, perf_built_engines)
