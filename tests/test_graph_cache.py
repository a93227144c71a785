"""Captured decode steps: captured at engine build, kept by batch shape, shared, and bounded.

No GPU here, so a fake graph stands in for ``torch.cuda.CUDAGraph``: it
"captures" the buffers and cache it is given and replays by running the step
over exactly those, as a real graph replays fixed addresses. Everything but
the capture itself (``StaticDecodeStep._record``) is the real code.
"""

from __future__ import annotations

import gc

import pytest
import torch

from perfsuite.testing.greedy import assert_outputs_equal
from perfsuite.engine import Request, SamplingParams, static_engine
from perfsuite.engine.graph_cache import DecodeShape, GraphCache
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.engine.static_decode import StaticDecodeStep
from perfsuite.models import load_model
from perfsuite.testing import cached_reference

pytest_plugins = ["pytester"]

MAX_SEQ_LEN = 64

# -- the cache alone -------------------------------------------------------------

S2, S3, S4 = (DecodeShape(rows, MAX_SEQ_LEN, "torch.float32") for rows in (2, 3, 4))


def test_the_least_recently_used_shape_is_evicted_beyond_the_limit():
    cache = GraphCache(max_graphs=2)
    assert cache.put(S2, "g2") == [] and cache.put(S3, "g3") == []
    assert cache.get(S2) == "g2"  # S3 is now the least recently used
    assert cache.put(S4, "g4") == ["g3"]
    assert cache.shapes() == [S2, S4] and S3 not in cache
    assert cache.num_evictions == 1


def test_another_step_for_a_cached_shape_displaces_the_old_one():
    cache = GraphCache(max_graphs=2)
    cache.put(S2, "old")
    assert cache.put(S2, "new") == ["old"]
    assert cache.put(S2, "new") == [], "putting the same step again releases nothing"
    assert len(cache) == 1 and cache.num_evictions == 0


def test_dtype_and_length_are_part_of_the_shape():
    cache = GraphCache()
    cache.put(S2, "f32")
    assert cache.get(DecodeShape(2, MAX_SEQ_LEN, "torch.bfloat16")) is None
    assert cache.get(DecodeShape(2, 2 * MAX_SEQ_LEN, "torch.float32")) is None
    assert cache.get(DecodeShape(2, MAX_SEQ_LEN, "torch.float32")) == "f32"


def test_a_cache_needs_room_for_one_graph():
    with pytest.raises(ValueError, match="max_graphs must be >= 1, got 0"):
        GraphCache(max_graphs=0)


# -- the decode step over a fake graph ----------------------------------------------


class FakeGraph:
    """Replays by running the step over the buffers and cache it was captured with."""

    def __init__(self, run) -> None:
        self._run = run
        self.num_resets = 0

    def replay(self) -> None:
        self._run()

    def reset(self) -> None:
        self.num_resets += 1


class FakeGraphStep(StaticDecodeStep):
    """The real step with a fake capture, so its keying and eviction run on CPU."""

    def __init__(self, decoder, max_graphs: int) -> None:
        super().__init__(decoder, use_cuda_graph=True, max_graphs=max_graphs)
        self.recorded: list[FakeGraph] = []

    @staticmethod
    def _can_capture_on(device) -> bool:
        return True

    def _record(self, inputs, kv_cache):
        next_tokens = torch.zeros(kv_cache.num_slots, dtype=torch.long)

        def run() -> None:
            next_tokens.copy_(self.forward(inputs, kv_cache))

        self.recorded.append(FakeGraph(run))
        return self.recorded[-1], next_tokens


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return loaded, cached_reference(loaded)


def graph_runner(loaded, max_graphs: int = 2) -> tuple[ModelRunner, FakeGraphStep]:
    runner = ModelRunner(loaded.model, decode_mode="static")
    runner.static_decode = FakeGraphStep(runner.decoder, max_graphs)
    return runner, runner.static_decode


def requests(num: int, seed: int) -> list[Request]:
    return [
        Request(f"r{i}", tuple((seed * 7 + 13 * i + 5 * j) % 250 + 3 for j in range(4 + i)), SamplingParams(6, True))
        for i in range(num)
    ]


def check_run(engine, loaded, reference, seed: int = 0) -> None:
    batch = requests(engine.batch_size, seed)
    expected, margins = reference.outputs(batch)
    assert_outputs_equal(engine.name, expected, engine.run(batch).outputs(), margins, 0.0)


def build(runner, loaded, batch_size: int):
    return static_engine(runner, batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, eos_token_id=loaded.eos_token_id)


def test_the_step_is_captured_when_the_engine_is_built_not_in_its_first_request(tiny):
    loaded, reference = tiny
    runner, step = graph_runner(loaded)
    engine = build(runner, loaded, 2)
    assert step.num_captures == 1, "captured at build, before any request"
    assert not engine.kv_cache.keys.is_inference(), "an ordinary tensor, writable outside inference mode"
    check_run(engine, loaded, reference)
    check_run(engine, loaded, reference, seed=1)
    assert step.num_captures == 1, "the runs replayed it"


def test_an_engine_of_a_shape_whose_last_engine_is_gone_takes_its_graph_and_cache(tiny):
    loaded, reference = tiny
    runner, step = graph_runner(loaded)
    first = build(runner, loaded, 2)
    keys = first.kv_cache.keys
    check_run(first, loaded, reference)
    del first
    second = build(runner, loaded, 2)  # as a function-scoped fixture builds one engine per test
    assert step.num_captures == 1
    assert second.kv_cache.keys is keys, "no second cache of the same shape"
    check_run(second, loaded, reference, seed=2)  # stale entries of the first engine stay masked


def test_two_live_engines_of_one_shape_each_get_their_own_cache_and_stay_correct(tiny):
    loaded, reference = tiny
    runner, step = graph_runner(loaded)
    first, second = build(runner, loaded, 2), build(runner, loaded, 2)
    assert step.num_captures == 2 and first.kv_cache.keys is not second.kv_cache.keys
    assert step.recorded[0].num_resets == 1, "one graph per shape: the first engine's was released"
    check_run(second, loaded, reference)
    check_run(first, loaded, reference, seed=1)  # its graph is gone: captured again over its own cache
    check_run(second, loaded, reference, seed=2)
    assert step.num_captures == 4 and len(step.graphs) == 1


def test_beyond_the_limit_the_least_recently_used_graph_and_its_cache_are_released(tiny):
    loaded, reference = tiny
    runner, step = graph_runner(loaded, max_graphs=2)
    for batch_size in (2, 3, 2, 4):  # 2 is used again before 4 arrives: 3 is the one to go
        engine = build(runner, loaded, batch_size)
        del engine
    gc.collect()
    assert step.num_captures == 3
    assert step.graphs.shapes() == [step.shape_of(2, MAX_SEQ_LEN), step.shape_of(4, MAX_SEQ_LEN)]
    assert [graph.num_resets for graph in step.recorded] == [0, 1, 0]
    # A live engine whose graph was evicted captures again at its next decode step, and is still right.
    survivor = build(runner, loaded, 3)
    build(runner, loaded, 5), build(runner, loaded, 6)
    assert step.shape_of(3, MAX_SEQ_LEN) not in step.graphs
    check_run(survivor, loaded, reference)
    assert step.shape_of(3, MAX_SEQ_LEN) in step.graphs and len(step.graphs) == 2


def test_a_released_step_drops_its_buffers(tiny):
    loaded, _ = tiny
    runner, step = graph_runner(loaded, max_graphs=1)
    build(runner, loaded, 2)
    gc.collect()
    captured = step.graphs.get(step.shape_of(2, MAX_SEQ_LEN))
    build(runner, loaded, 3)
    assert captured.graph is None and captured.keys is None and captured.next_tokens is None


def test_without_graphs_every_engine_gets_a_cache_of_its_own(tiny):
    loaded, _ = tiny
    runner = ModelRunner(loaded.model, decode_mode="static")
    first = build(runner, loaded, 2)
    first_keys = first.kv_cache.keys
    del first
    assert build(runner, loaded, 2).kv_cache.keys is not first_keys
    assert runner.static_decode.num_captures == 0 and len(runner.static_decode.graphs) == 0


# -- a perf session: one engine per test, one capture per shape ----------------------

FAKE_GRAPH_BACKEND = '''
import pathlib, pytest, torch
from perfsuite.adapters import Backend
from perfsuite.engine.static_decode import StaticDecodeStep

class FakeGraph:
    def __init__(self, run):
        self.replay = run
    def reset(self):
        pass

class FakeGraphStep(StaticDecodeStep):
    @staticmethod
    def _can_capture_on(device):
        return True
    def _record(self, inputs, kv_cache):
        next_tokens = torch.zeros(kv_cache.num_slots, dtype=torch.long)
        return FakeGraph(lambda: next_tokens.copy_(self.forward(inputs, kv_cache))), next_tokens

@pytest.fixture(scope="session")
def perf_backend(perf_model):
    backend = Backend.from_loaded(perf_model, decode_mode="static")
    backend.runner.static_decode = FakeGraphStep(backend.runner.decoder, use_cuda_graph=True)
    yield backend
    pathlib.Path("captures.txt").write_text(str(backend.runner.static_decode.num_captures))
'''


def test_a_perf_session_that_builds_an_engine_per_test_captures_once_per_shape(pytester):
    """The function-scoped engine factory's engines are gone by the next test, so each takes the last one's graph."""
    from smoke_session import run_shipped_smoke_session

    result = run_shipped_smoke_session(
        pytester, "--perf-repeats", "2", "-k", "throughput", conftest_addition=FAKE_GRAPH_BACKEND
    )
    # static and inflight, B2, every request within 64 tokens: one shape. Each test measured, then judged
    # nothing (no baselines here): skipped
    result.assert_outcomes(skipped=4)
    assert (pytester.path / "captures.txt").read_text() == "1"
