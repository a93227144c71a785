"""A KV cache's bytes, what the device has left, and the check every engine makes before allocating its cache.

The memory available is injected (``available_memory`` patched), so no test
depends on the machine it runs on.
"""

from __future__ import annotations

import tracemalloc

import pytest

from perfsuite.engine import BlockManager, inflight_engine, kv_memory, paged_engine, static_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.free_ids import FreeIds
from perfsuite.host import format_bytes
from perfsuite.engine.kv_memory import (
    KVLayout,
    KVMemoryError,
    cgroup_room,
    check_kv_memory,
    host_available,
    meminfo_available,
    paged_pool,
    slot_cache,
)

pytest_plugins = ["pytester"]

GiB = 2**30
TINY = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=4)  # tiny-random in float32


@pytest.fixture
def available(monkeypatch):
    """Set the bytes every device has available: ``available(GiB)``."""

    def set_to(num_bytes):
        monkeypatch.setattr(kv_memory, "available_memory", lambda device: num_bytes)

    return set_to


def test_a_tiny_pools_bytes_by_hand():
    # blocks x block size x layers x 2 (K and V) x kv heads x head dim x dtype bytes
    assert TINY.bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512
    assert TINY.cache_bytes(paged_pool(10, 16).num_tokens) == 10 * 16 * 2 * 2 * 2 * 16 * 4 == 81920
    assert TINY.cache_bytes(slot_cache("static", "batch_size", 3, 64).num_tokens) == 3 * 64 * 512


def test_the_layout_read_from_a_models_config_is_what_its_runner_allocates():
    from perfsuite.engine.model_runner import ModelRunner
    from perfsuite.models import config_values, load_model

    loaded = load_model("tiny-random", dtype="float32")
    runner = ModelRunner(loaded.model)
    assert runner.kv_layout == KVLayout.of_model_config(config_values("tiny-random"), "float32") == TINY
    assert KVLayout.of_model_config(loaded.model.config.to_dict(), "float32") == TINY
    paged = runner.decoder.new_paged_kv_cache(num_blocks=3, block_size=16)
    assert paged.keys.nbytes + paged.values.nbytes == TINY.cache_bytes(3 * 16)
    slots = runner.decoder.new_kv_cache(num_slots=2, max_seq_len=40)
    assert slots.keys.nbytes + slots.values.nbytes == TINY.cache_bytes(2 * 40)
    assert KVLayout.of_model_config(config_values("tiny-random"), "bfloat16").bytes_per_token == 256


def test_a_cache_that_does_not_fit_is_refused_in_one_line_naming_the_knob_the_bytes_and_the_fix(available):
    available(GiB)
    with pytest.raises(KVMemoryError) as refused:
        check_kv_memory(paged_pool(10**9, 16), TINY, "cpu")
    # usable: int(0.9 GiB) = 966367641 bytes, / (16 tokens x 512 bytes) = 117964 blocks
    assert str(refused.value) == (
        "the paged engine's KV pool of 1000000000 blocks of 16 tokens needs 7.45 TiB (512 B a token) but cpu has "
        "1.00 GiB available, of which 922 MiB (90%) may hold a KV cache: lower num_kv_blocks to 117964 or less"
    )
    assert refused.value.message("--perf-kv-blocks").endswith("lower --perf-kv-blocks to 117964 or less")
    assert "\n" not in str(refused.value)
    check_kv_memory(paged_pool(117964, 16), TINY, "cpu")  # the largest pool it names fits
    with pytest.raises(KVMemoryError):
        check_kv_memory(paged_pool(117965, 16), TINY, "cpu")


def test_when_not_one_unit_fits_the_fix_says_so(available):
    available(1000)
    with pytest.raises(KVMemoryError, match="even batch_size 1 would not fit: free memory on cpu, or use a smaller"):
        check_kv_memory(slot_cache("static", "batch_size", 1, 64), TINY, "cpu")


def test_a_device_whose_memory_cannot_be_told_is_not_checked(available):
    available(None)
    check_kv_memory(paged_pool(10**12, 16), TINY, "mps")


class RecordingRunner(FakeRunner):
    """A fake standing in for tiny-random, recording every cache it is asked for."""

    def __init__(self):
        super().__init__(kv_layout=TINY, device="cpu")
        self.caches = []

    def new_kv_cache(self, num_slots, max_seq_len):
        self.caches.append(("slots", num_slots, max_seq_len))
        return super().new_kv_cache(num_slots, max_seq_len)

    def new_paged_kv_cache(self, num_blocks, block_size):
        self.caches.append(("blocks", num_blocks, block_size))
        return super().new_paged_kv_cache(num_blocks, block_size)


@pytest.mark.parametrize(("build", "knob"), [
    (lambda runner: paged_engine(runner, decode_batch_size=2, max_seq_len=64, eos_token_id=None,
                                 num_kv_blocks=10**9), "num_kv_blocks"),
    (lambda runner: paged_engine(runner, decode_batch_size=10**7, max_seq_len=64, eos_token_id=None),
     "decode_batch_size"),
    (lambda runner: static_engine(runner, batch_size=10**7, max_seq_len=64, eos_token_id=None), "batch_size"),
    (lambda runner: inflight_engine(runner, decode_batch_size=10**7, max_seq_len=64, eos_token_id=None),
     "decode_batch_size"),
])  # fmt: skip
def test_every_engine_checks_its_cache_before_asking_the_runner_for_it(available, build, knob):
    available(GiB)
    runner = RecordingRunner()
    with pytest.raises(KVMemoryError) as refused:
        build(runner)
    assert runner.caches == [], "refused before building anything the size of the cache"
    assert refused.value.sizing.knob == knob
    assert f"lower {knob} to " in str(refused.value)


def test_a_cache_that_fits_is_built(available):
    available(GiB)
    runner = RecordingRunner()
    paged_engine(runner, decode_batch_size=2, max_seq_len=64, eos_token_id=None, num_kv_blocks=100)
    static_engine(runner, batch_size=4, max_seq_len=64, eos_token_id=None)
    assert runner.caches == [("blocks", 100, 16), ("slots", 4, 64)]


def test_a_pool_costs_nothing_until_its_blocks_are_used():
    """Memory, not time, is the claim here: how fast a pool is built is bench/kv_pool.py's to say."""
    tracemalloc.start()
    try:
        blocks = BlockManager(num_blocks=10**12, block_size=16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**10, f"a pool of 10**12 blocks took {peak} bytes to build: it must not hold a block each"
    assert blocks.num_free_blocks == 10**12 and blocks.allocate("a", 40) == (0, 1, 2)


def test_free_ids_hand_out_the_lowest_free_id_as_a_heap_of_them_all_would():
    ids = FreeIds(5)
    assert [ids.pop() for _ in range(3)] == [0, 1, 2] and len(ids) == 2
    ids.push(1)
    ids.push(0)
    assert [ids.pop() for _ in range(4)] == [0, 1, 3, 4] and len(ids) == 0
    with pytest.raises(IndexError, match="all 5 ids are in use"):
        ids.pop()


MEMINFO = "MemTotal:       24684096 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def reader(files):
    return lambda path: files.get(path)


def test_host_memory_is_memavailable_capped_by_the_cgroup_limit_less_its_working_set():
    assert meminfo_available(MEMINFO) == 20000000 * 1024
    assert host_available(reader({"/proc/meminfo": MEMINFO})) == 20000000 * 1024
    v2 = {
        "/proc/meminfo": MEMINFO,
        "/sys/fs/cgroup/memory.max": "8589934592\n",  # 8 GiB
        "/sys/fs/cgroup/memory.current": "3221225472\n",  # 3 GiB, 1 GiB of it inactive file cache
        "/sys/fs/cgroup/memory.stat": "anon 2147483648\ninactive_file 1073741824\n",
    }
    assert cgroup_room(reader(v2)) == 6 * GiB
    assert host_available(reader(v2)) == 6 * GiB


def test_a_cgroup_without_a_limit_leaves_memavailable():
    unlimited = {
        "/proc/meminfo": MEMINFO,
        "/sys/fs/cgroup/memory.max": "max\n",
        "/sys/fs/cgroup/memory.current": "3221225472\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # cgroup v1's "no limit"
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": "3221225472\n",
    }
    assert cgroup_room(reader(unlimited)) is None
    assert host_available(reader(unlimited)) == 20000000 * 1024


def test_cgroup_v1_limits_count_too():
    v1 = {
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(4 * GiB),
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": str(1 * GiB),
        "/sys/fs/cgroup/memory/memory.stat": "cache 0\ntotal_inactive_file 0\n",
    }
    assert cgroup_room(reader(v1)) == 3 * GiB


def test_this_machine_has_some_memory_available():
    assert kv_memory.available_memory("cpu") > 0
    assert kv_memory.available_memory("mps") is None


@pytest.mark.parametrize(("num_bytes", "text"), [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (8192, "8.00 KiB"),
    (int(0.9 * GiB), "922 MiB"), (GiB, "1.00 GiB"), (21.4 * GiB, "21.4 GiB"), (8.192e12, "7.45 TiB"),
])  # fmt: skip
def test_sizes_are_read_in_binary_units(num_bytes, text):
    assert format_bytes(num_bytes) == text


# -- a sweep config's batch size, through the shipped sweep test on a fake backend --------------------------------

SWEEP = """
[sweep]
engines = ["static"]
batch_sizes = [100000]
prompts = [32]
output_lengths = [4]
num_requests = 2
"""

# A fake runner in tiny-random's shape on a CPU with 1 GiB available (patched here: the run is a subprocess).
FAKE_TINY_BACKEND = """
import pytest
from perfsuite.adapters import Backend
from perfsuite.engine import kv_memory
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.kv_memory import KVLayout

kv_memory.available_memory = lambda device: 2**30


@pytest.fixture(scope="session")
def perf_backend():
    runner = FakeRunner(vocab_size=97, kv_layout=KVLayout(2, 2, 16, 4), device="cpu")
    return Backend(runner=runner, tokenize=lambda text: [3] * len(text), eos_token_id=None, max_context=512,
                   device="cpu", probe=None, vocab_size=97)
"""


def test_a_sweep_batch_size_too_large_for_memory_fails_its_case_in_one_line_naming_the_sweep_key(pytester):
    pytester.makeconftest(FAKE_TINY_BACKEND)  # the project's own: the shipped sweep test, over a fake backend
    pytester.path.joinpath("sweep.toml").write_text(SWEEP)
    result = pytester.runpytest_subprocess("--pyargs", "perfsuite.suites.test_sweep", "--perf", "--perf-profile",
                                           "smoke", "--perf-device", "cpu", "--perf-config", "sweep.toml",
                                           "-p", "no:randomly", "-k", "test_sweep")  # fmt: skip
    result.assert_outcomes(failed=1, deselected=1)
    # 32 + 4 tokens: a 64-token slot of 512 B a token; int(0.9 GiB) / 32 KiB = 29491 slots fit
    result.stdout.fnmatch_lines([(
        "*perf_engine_factory('static', batch_size=100000): the static engine's KV cache of 100000 slots of 64 "
        "tokens needs 3.05 GiB (512 B a token) but cpu has 1.00 GiB available, of which 922 MiB (90%) may hold a "
        "KV cache: lower the batch size (sweep.batch_sizes in --perf-config) to 29491 or less"
    )])  # fmt: skip
    assert "Traceback" not in result.stdout.str(), "a usage failure, not a stack trace"
