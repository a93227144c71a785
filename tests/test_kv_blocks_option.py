"""``--perf-kv-blocks``: the paged engine's pool from the command line, and a pool too small for a test.

Through pytester on a fake backend (no model loads): the option reaches
every ``paged`` engine ``perf_engine_factory`` builds (and so the A/B wire,
which sends the engine's config), leaves the other engines as they were, and
a pool smaller than a test's largest request fails that test, before
anything runs, naming the numbers and the fix.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from perfsuite.adapters import Backend
from perfsuite.engine.fake_runner import FakeRunner


@pytest.fixture(scope="session")
def perf_backend():
    return Backend(runner=FakeRunner(vocab_size=97), tokenize=lambda text: [3] * len(text), eos_token_id=None,
                   max_context=512, device="cpu", probe=None)
"""

TESTS = """
import pytest
from perfsuite.engine import Request, SamplingParams


def _request(request_id, num_prompt_tokens, max_new_tokens):
    return Request(request_id, (5,) * num_prompt_tokens, SamplingParams(max_new_tokens, ignore_eos=True))


@pytest.mark.perf
def test_pools(perf_engine_factory, perf_built_engines):
    requests = [_request("a", 30, 10), _request("b", 60, 20)]  # 80 tokens: 5 blocks of 16
    paged = perf_engine_factory("paged", batch_size=2, requests=requests)
    explicit = perf_engine_factory("paged", batch_size=2, num_kv_blocks=9)
    inflight = perf_engine_factory("inflight", batch_size=2, requests=requests)
    pools = {built.name + str(i): built.config.num_kv_blocks for i, built in enumerate(perf_built_engines)}
    print("POOLS", pools, paged.scheduler.kv_cache.num_blocks, explicit.scheduler.kv_cache.num_blocks)
    result = paged.run(requests)
    assert sorted(len(record.output_token_ids) for record in result.records) == [10, 20]


@pytest.mark.perf
def test_too_small(perf_engine_factory):
    requests = [_request("short", 4, 4), _request("long", 100, 40)]  # "long": 140 tokens, 9 blocks
    perf_engine_factory("paged", batch_size=2, requests=requests)
"""

# --perf-kv-blocks is checked against the model's KV bytes and the device's memory at configure time: the
# fake backend runs on the CPU, and in process the device is named, as resolving "auto" imports torch, which
# cannot be imported again once a pytester run has dropped it from sys.modules.
ARGS = ("--perf", "--perf-profile", "smoke", "--perf-device", "cpu", "-p", "no:randomly", "-p", "no:cacheprovider",
        "-s")  # fmt: skip


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_pool=TESTS)
    return pytester


def test_the_option_sizes_every_paged_pool_and_no_other(project):
    result = project.runpytest_inprocess(*ARGS, "--perf-kv-blocks", "7", "-k", "pools")
    result.assert_outcomes(passed=1, deselected=1)
    # paged from the option, an explicit num_kv_blocks wins, inflight has no pool (its identity unchanged)
    result.stdout.fnmatch_lines(["*POOLS {'paged0': 7, 'paged1': 9, 'inflight2': None} 7 9"])


def test_unset_the_paged_engine_keeps_its_default_pool(project):
    result = project.runpytest_inprocess(*ARGS, "-k", "pools")
    result.assert_outcomes(passed=1, deselected=1)
    # the default: batch size 2 x the requests' max_seq_len (128) = 256 tokens = 16 blocks
    result.stdout.fnmatch_lines(["*POOLS {'paged0': None, 'paged1': 9, 'inflight2': None} 16 9"])


def test_a_pool_too_small_for_the_largest_request_fails_that_test_saying_the_numbers_and_the_fix(project):
    result = project.runpytest_inprocess(*ARGS, "--perf-kv-blocks", "8")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*the paged engine's KV pool of 8 blocks of 16 tokens (128 tokens) cannot hold this test's largest request, "
        "'long': prompt + max_new_tokens = 140 tokens need 9 blocks, so it could never run. "
        "Give --perf-kv-blocks 9 or more (or leave it unset for the default pool)",
    ])  # fmt: skip
    assert "Traceback" not in result.stdout.str(), "a usage failure, not a stack trace"
    project.runpytest_inprocess(*ARGS, "--perf-kv-blocks", "9").assert_outcomes(passed=2)


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_block_count_is_a_usage_error(project, value):
    result = project.runpytest_inprocess(*ARGS, "--perf-kv-blocks", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-kv-blocks: expected a number of KV blocks*"])


def test_a_pool_larger_than_the_devices_memory_is_a_usage_error_before_any_model_loads(project, monkeypatch):
    from perfsuite.engine import kv_memory

    monkeypatch.setattr(kv_memory, "available_memory", lambda device: 16 * 2**30)
    result = project.runpytest_inprocess(*ARGS, "--perf-model", "tiny-random", "--perf-kv-blocks", "1000000000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # tiny-random in float32: 2 layers x 2 (K and V) x 2 KV heads x 16 head dim x 4 bytes = 512 B a token;
    # 90% of 16 GiB over 16 tokens x 512 B = 1887436 blocks fit
    result.stderr.fnmatch_lines([(
        "ERROR: --perf-kv-blocks 1000000000 with tiny-random in float32: the paged engine's KV pool of 1000000000 "
        "blocks of 16 tokens needs 7.45 TiB (512 B a token) but cpu has 16.0 GiB available, of which 14.4 GiB (90%) "
        "may hold a KV cache: lower --perf-kv-blocks to 1887436 or less"
    )])  # fmt: skip
    assert len([line for line in result.stderr.lines if line]) == 1, "one line, no stack trace"
    fits = project.runpytest_inprocess(*ARGS, "--perf-model", "tiny-random", "--perf-kv-blocks", "1887436", "--co")
    assert fits.ret == pytest.ExitCode.OK, "the largest pool it names is no usage error"
