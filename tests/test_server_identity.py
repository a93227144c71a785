"""A server in another process is measured as that server, not as the client that drove it.

Its results are stored under the server's fingerprint (served model, its
maximum length, who serves it, ``--perf-server-label``), name the served model
in the sizing parameters, and are not rescaled by this machine's probe. An
in-process engine in the same session keeps this machine's fingerprint, which
is the one the shipped baselines were recorded under.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfsuite.adapters import Backend
from perfsuite.adapters.server_info import ServedModel
from perfsuite.engine import Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.plugin.options import PerfOptions
from perfsuite.workload.profiles import PROFILES
from perfsuite.plugin.recorder import PerfRecorder
from perfsuite.judge.catalogue import PROBE
from perfsuite.plugin.session import SERVER_DECODE_MODE, SERVER_PRECISION, PerfSession
from perfsuite.judge.stats import Policy
from perfsuite.judge.baselines import read_baseline
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json

pytest_plugins = ["pytester"]

REPEATS = 3
SERVED = ServedModel(model_id="served-model", max_model_len=2048, root="/models/x", owned_by="vllm")
CLIENT = Environment(
    device_name="cpu", torch_version="2.13.0+cpu", transformers_version="4.0", dtype="float32",
    model="smollm2-135m", cpu_model="Some CPU", num_threads=2,
)  # fmt: skip
SHIPPED_BASELINES = Path(__file__).parent.parent / "baselines"


class RemoteEngine:
    """An engine "served by another process": perfsuite's in-flight engine over a fake runner, as a server would."""

    name = "openai-http"
    greedy_equal = True
    runs_in_process = False

    def __init__(self, served: ServedModel | None = SERVED) -> None:
        self._engine = in_process_engine()
        self.served_model = served
        self.base_url = "http://127.0.0.1:9"

    @property
    def batch_size(self) -> int:
        return self._engine.batch_size

    def run(self, requests, on_step=None, max_concurrency=None):
        return self._engine.run(requests, on_step=on_step, max_concurrency=max_concurrency)


class CountingProbe:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device: str) -> float:
        self.calls += 1
        return 0.01 * (1 + self.calls % 3)  # a machine whose speed changes: rescaling would show


class Benchmark:
    """pytest-benchmark's ``pedantic``, reduced to what the recorder uses."""

    def __init__(self) -> None:
        self.extra_info: dict = {}

    def pedantic(self, target, setup, rounds, iterations, warmup_rounds):
        for _ in range(rounds):
            setup()
            target()


def requests() -> list[Request]:
    return [Request(f"r{i}", (3 + i, 5, 7), SamplingParams(4 + i, ignore_eos=True)) for i in range(4)]


def session(tmp_path: Path, *, label: str | None = "vllm-0.32-cpu", save: bool = False, **changes) -> PerfSession:
    profile = PROFILES["smoke"]
    options = PerfOptions(
        enabled=True, save_baseline=save, model="smollm2-135m", device="cpu", dtype="float32", profile=profile,
        repeats=REPEATS, baseline_dir=tmp_path / "baselines", report_dir=tmp_path / "reports", policy=Policy(),
        busy_threshold=0.99, server_label=label,
    )  # fmt: skip
    options = dataclasses.replace(options, **changes)
    perf_session = PerfSession(options, tmp_path, environment=CLIENT)
    perf_session.num_planned_tests = 2
    return perf_session


def measure(perf_session: PerfSession, engine, test_id: str, probe: CountingProbe | None = None):
    backend = Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device="cpu",
                      probe=probe or CountingProbe())  # fmt: skip
    return PerfRecorder(perf_session, test_id, Benchmark(), backend).measure(engine, requests())


def in_process_engine():
    return inflight_engine(FakeRunner(vocab_size=97), decode_batch_size=2, max_seq_len=64, eos_token_id=None)


# -- one session ---------------------------------------------------------------------


def test_a_server_is_recorded_under_its_own_identity_and_never_probed(tmp_path):
    probe = CountingProbe()
    result = measure(session(tmp_path), RemoteEngine(), "tests/perf/t.py::test_remote", probe)
    assert probe.calls == 0, "this machine's probe was taken around a server's repeats"
    assert PROBE not in result.measurement.samples, "a server's figures would be rescaled by this machine's speed"
    assert result.measurement.environment == ServerEnvironment("served-model", 2048, "vllm-0.32-cpu", "vllm")
    assert result.measurement.environment.fingerprint().startswith("server-vllm-0.32-cpu-served-model-len2048-")
    # the model the server serves, not --perf-model / --perf-dtype of the client
    parameters = result.measurement.parameters
    assert (parameters.model, parameters.precision) == ("served-model", SERVER_PRECISION)
    assert result.measurement.configuration.decode_mode == SERVER_DECODE_MODE


def test_an_in_process_engine_keeps_this_machines_fingerprint_probe_and_sizing(tmp_path):
    probe = CountingProbe()
    result = measure(session(tmp_path), in_process_engine(), "tests/perf/t.py::test_local", probe)
    assert probe.calls == REPEATS + 1 and len(result.measurement.samples[PROBE]) == REPEATS
    assert result.measurement.environment == CLIENT
    parameters = result.measurement.parameters
    assert (parameters.model, parameters.precision) == ("smollm2-135m", "float32")
    assert result.measurement.configuration.decode_mode == "packed"


def test_a_mixed_session_stores_each_engine_under_its_own_fingerprint(tmp_path):
    saving = session(tmp_path, save=True)
    measure(saving, in_process_engine(), "tests/perf/t.py::test_local")
    measure(saving, RemoteEngine(), "tests/perf/t.py::test_remote")
    saving.finish()
    server = ServerEnvironment("served-model", 2048, "vllm-0.32-cpu", "vllm")
    baselines = tmp_path / "baselines"
    assert sorted(p.relative_to(baselines).parts[0] for p in baselines.rglob("*.json")) == sorted(
        [CLIENT.fingerprint(), server.fingerprint()]
    )
    remote = read_baseline(baselines / server.fingerprint() / "tests/perf/t.py/test_remote.json")
    assert remote.environment == server and PROBE not in remote.samples

    data = json.loads((tmp_path / "reports" / "results.json").read_text())
    assert data["fingerprint"] == CLIENT.fingerprint()  # the session's machine, as before
    assert [s["fingerprint"] for s in data["servers"]] == [server.fingerprint()]
    by_test = {t["test_id"].rpartition("::")[2]: t for t in data["tests"]}
    assert by_test["test_remote"]["fingerprint"] == server.fingerprint()
    assert by_test["test_local"]["fingerprint"] == CLIENT.fingerprint()
    assert by_test["test_remote"]["normalization"].startswith("none")
    assert by_test["test_local"]["normalization"].startswith("each repeat rescaled")
    assert "not rescaled" in data["probe"]["applies_to"]


def test_a_session_of_servers_alone_names_the_server_at_the_top_of_results(tmp_path):
    only_remote = session(tmp_path)
    measure(only_remote, RemoteEngine(), "tests/perf/t.py::test_remote")
    only_remote.finish()
    data = json.loads((tmp_path / "reports" / "results.json").read_text())
    assert data["environment"]["served_model"] == "served-model" and data["environment"]["label"] == "vllm-0.32-cpu"
    assert data["fingerprint"].startswith("server-vllm-0.32-cpu-")


# -- across sessions ----------------------------------------------------------------------


def test_a_servers_baseline_follows_the_server_not_the_client(tmp_path):
    saving = session(tmp_path, save=True)
    measure(saving, RemoteEngine(), "tests/perf/t.py::test_remote")

    # Another client machine, torch, dtype, model name and decode mode: the same server is still compared.
    other_client = session(tmp_path, dtype="bfloat16", model="elsewhere", decode_mode="static")
    other_client.environment = dataclasses.replace(CLIENT, torch_version="9.9", cpu_model="Other CPU", num_threads=8)
    assert measure(other_client, RemoteEngine(), "tests/perf/t.py::test_remote").judgement.baseline_status == "compared"

    # Another server build (label) or another max_model_len is another environment.
    relabelled = session(tmp_path, label="vllm-0.33-cpu")
    assert measure(relabelled, RemoteEngine(), "tests/perf/t.py::test_remote").judgement.baseline_status == (
        "other environment only"
    )
    assert any("--perf-server-label" in w for w in relabelled.warnings)
    shorter = RemoteEngine(dataclasses.replace(SERVED, max_model_len=1024))
    assert measure(session(tmp_path), shorter, "tests/perf/t.py::test_remote").judgement.baseline_status == (
        "other environment only"
    )


def test_a_server_without_a_label_is_warned_about_once(tmp_path):
    unlabelled = session(tmp_path, label=None)
    first = measure(unlabelled, RemoteEngine(), "tests/perf/t.py::test_a")
    measure(unlabelled, RemoteEngine(), "tests/perf/t.py::test_b")
    assert first.fingerprint.startswith("server-unlabelled-served-model-len2048-")
    assert sum("--perf-server-label" in w for w in unlabelled.warnings) == 1


def test_an_engine_in_another_process_that_names_no_model_is_known_by_its_name(tmp_path):
    result = measure(session(tmp_path), RemoteEngine(served=None), "tests/perf/t.py::test_remote")
    assert result.measurement.environment == ServerEnvironment("openai-http", None, "vllm-0.32-cpu")


def test_xdist_workers_hand_each_results_environment_and_the_unrecorded_tests_to_the_controller(tmp_path):
    worker = session(tmp_path)
    measure(worker, RemoteEngine(), "tests/perf/t.py::test_remote")
    measure(worker, in_process_engine(), "tests/perf/t.py::test_local")
    worker.note_unrecorded("tests/perf/t.py::test_broken", "baseline b.json is corrupt")
    controller = session(tmp_path)
    controller.environment = None
    controller.add_worker_output(worker.worker_output())
    assert [r.measurement.environment for r in controller.results] == [
        r.measurement.environment for r in worker.results
    ][::-1]
    assert controller.unrecorded == ["tests/perf/t.py::test_broken: no result recorded: baseline b.json is corrupt"]


# -- compatibility ------------------------------------------------------------------------


def test_the_shipped_baselines_keep_their_fingerprint():
    """In-process runs are stored as before, so `make perf` still compares with the shipped baselines."""
    files = sorted(SHIPPED_BASELINES.rglob("*.json"))
    assert files, "the repository ships baselines"
    for path in files[:3]:
        baseline = read_baseline(path)
        fingerprint_dir = path.relative_to(SHIPPED_BASELINES).parts[0]
        assert isinstance(baseline.environment, Environment)
        assert baseline.environment.fingerprint() == fingerprint_dir
        assert environment_from_json(dataclasses.asdict(baseline.environment)) == baseline.environment


# -- the option, end to end ---------------------------------------------------------------

CONFTEST = """
import pytest
from perfsuite.adapters import Backend, register_engine
from perfsuite.adapters.server_info import ServedModel
from perfsuite.engine import inflight_engine
from perfsuite.engine.fake_runner import FakeRunner


class Remote:
    name = "fake-remote"
    greedy_equal = True
    runs_in_process = False
    served_model = ServedModel("served-model", 2048, None, "vllm")

    def __init__(self, config):
        self._engine = inflight_engine(FakeRunner(vocab_size=97), decode_batch_size=config.batch_size,
                                       max_seq_len=config.max_seq_len, eos_token_id=None)
        self.batch_size = config.batch_size

    def run(self, requests, on_step=None, max_concurrency=None):
        return self._engine.run(requests, on_step=on_step, max_concurrency=max_concurrency)


register_engine("fake-remote", lambda backend, config: Remote(config))


@pytest.fixture(scope="session")
def perf_backend():
    runner = FakeRunner(vocab_size=97)
    tokenize = lambda text: [3 + b % 90 for b in text.encode()][:12]
    return Backend(runner=runner, tokenize=tokenize, eos_token_id=None, max_context=512, device="cpu",
                   probe=lambda device: 0.01)
"""

PERF_TEST = """
import pytest
from perfsuite.plugin.stash import perf_options


def pytest_generate_tests(metafunc):
    metafunc.parametrize("engine_kind", perf_options(metafunc.config).engines)


@pytest.mark.perf
def test_speed(perf, perf_engine_factory, perf_workload, engine_kind):
    perf.measure(perf_engine_factory(engine_kind, batch_size=2), perf_workload)
"""


def test_perf_server_label_names_the_servers_baselines_beside_this_machines(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TEST)
    args = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "3", "-p", "no:randomly",
            "--perf-busy-threshold", "0.99", "--perf-engines", "inflight,fake-remote"]  # fmt: skip
    result = pytester.runpytest_subprocess(*args, "--perf-server-label", "vllm-0.32-cpu", "--perf-save-baseline")
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "reports" / "results.json").read_text())
    fingerprints = {t["test_id"]: t["fingerprint"] for t in data["tests"]}
    assert fingerprints["test_speed.py::test_speed[fake-remote]"].startswith("server-vllm-0.32-cpu-served-model-")
    assert fingerprints["test_speed.py::test_speed[inflight]"] == data["fingerprint"]
    baselines = pytester.path / "baselines"
    stored = {path.relative_to(baselines).parts[0] for path in baselines.rglob("*.json")}
    assert stored == set(fingerprints.values())

    blank = pytester.runpytest_subprocess(*args, "--perf-server-label", " ")
    assert blank.ret == pytest.ExitCode.USAGE_ERROR
    blank.stderr.fnmatch_lines(["*--perf-server-label*vllm-0.32-cpu*"])
