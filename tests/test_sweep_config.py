"""Sweep configs: TOML grids expand into cases with readable, unique ids; bad files are named."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.engine.names import OWN_ENGINES
from perfsuite.workload.sweep import Sweep, SweepCase, load_sweep, parse_sweep
from perfsuite.workload import Arrivals, JsonlPrompts, OutputLengths, PromptLengths, SyntheticPrompts, Vocab, Workload

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sweep.toml"

GRID = """
[sweep]
engines = ["static", "inflight"]
batch_sizes = [4, 8]
prompts = [32, "shipped"]
output_lengths = [{kind = "uniform", low = 4, high = 24}, 16, {kind = "exponential", mean = 8, high = 32}]
arrivals = ["offline", 4.0, {rate = 4.0, burstiness = 0.5}, {concurrency = 4}]
num_requests = 8
seed = 3
repeats = 5
"""


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_expands_to_the_product_of_its_lists(tmp_path):
    sweep = load_sweep(write(tmp_path, GRID))
    cases = sweep.cases()
    assert len(cases) == sweep.num_cases == 2 * 2 * 2 * 3 * 4
    assert len({case.id for case in cases}) == len(cases)
    assert cases[0] == SweepCase(
        "static",
        4,
        Workload(8, OutputLengths("uniform", 4, 24), Arrivals(), 3, SyntheticPrompts(PromptLengths("fixed", 32, 32))),
        repeats=5,
    )
    ids = [case.id for case in cases]
    assert "inflight-B8-in32-out_uniform4_24-4rps" in ids
    assert "static-B4-in_shipped-out16-c4" in ids
    assert "inflight-B4-in32-out_exp8_1_32-4rps_burst0.5" in ids
    assert {case.workload.max_concurrency for case in cases} == {None, 4}


def test_cases_are_stable_and_share_one_seed(tmp_path):
    path = write(tmp_path, GRID)
    first, second = load_sweep(path).cases(), load_sweep(path).cases()
    assert first == second
    vocab = Vocab(97, special_ids=(0,))
    same_workload = [c for c in first if c.id.endswith("in32-out16-4rps")]
    assert len(same_workload) == 4  # 2 engines x 2 batch sizes
    assert len({tuple(c.workload.requests(vocab=vocab)) for c in same_workload}) == 1


def test_optional_keys_take_their_defaults(tmp_path):
    text = '[sweep]\nengines = ["inflight"]\nbatch_sizes = [2]\noutput_lengths = [8]\nnum_requests = 4\n'
    sweep = load_sweep(write(tmp_path, text))
    (case,) = sweep.cases()
    assert case.id == "inflight-B2-in_shipped-out8-offline"
    assert case.repeats is None and case.workload.seed == 0


def test_example_config_loads_with_known_engines():
    sweep = load_sweep(EXAMPLE)
    cases = sweep.cases()
    assert 2 <= len(cases) <= 8, "the example should stay small enough for a CPU"
    assert {case.engine for case in cases} <= set(OWN_ENGINES)
    assert len({case.id for case in cases}) == len(cases)
    assert all(case.workload.num_requests <= 16 for case in cases)


def test_jsonl_prompts_are_relative_to_the_config_and_read_at_load(tmp_path):
    (tmp_path / "data").mkdir()
    lines = [{"prompt": "a", "output_len": 3}, {"prompt": "b", "output_len": 5}]
    (tmp_path / "data" / "chat.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    text = GRID.replace('prompts = [32, "shipped"]', 'prompts = [{kind = "jsonl", path = "data/chat.jsonl"}]')
    text = text.replace("output_lengths = [", 'output_lengths = [{kind = "from_file"}, ')
    sweep = load_sweep(write(tmp_path, text))
    assert sweep.prompts == (JsonlPrompts(tmp_path / "data" / "chat.jsonl"),)
    from_file = [c for c in sweep.cases() if c.workload.lengths.kind == "from_file"]
    assert from_file[0].id == "static-B4-in_chat-out_file-offline"
    assert from_file[0].workload.output_lengths() == [3, 5] * 4


def test_a_bad_jsonl_line_fails_at_load(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "output_len": "ten"}\n')
    text = GRID.replace('prompts = [32, "shipped"]', 'prompts = [32, {kind = "jsonl", path = "p.jsonl"}]')
    with pytest.raises(ValueError, match=r'sweep.toml: sweep.prompts\[1\]: .*p.jsonl line 2: "output_len" must be'):
        load_sweep(write(tmp_path, text))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("engines = ", "engine = "), r"unknown sweep key 'engine' \(did you mean 'engines'\?\); known keys: "),
        (("batch_sizes = [4, 8]", "batch_sizes = []"), r"sweep.batch_sizes is empty"),
        (("batch_sizes = [4, 8]", "batch_sizes = 4"), r"sweep.batch_sizes must be a list in brackets, got 4"),
        (("batch_sizes = [4, 8]", 'batch_sizes = [4, "8"]'), r"sweep.batch_sizes\[1\]: a batch size is an integer"),
        (("batch_sizes = [4, 8]", "batch_sizes = [4, 4]"), r"sweep.batch_sizes\[1\] repeats an earlier entry"),
        (('engines = ["static", "inflight"]', 'engines = ["static", 3]'), r"sweep.engines\[1\]: an engine is a name"),
        (('engines = ["static", "inflight"]', 'engines = ["in flight"]'), r"sweep.engines\[0\]: an engine is a name"),
        (("num_requests = 8", "num_requests = 0"), r"sweep.num_requests must be an integer >= 1, got 0"),
        (("num_requests = 8", ""), r"\[sweep\] needs num_requests"),
        (("repeats = 5", "repeats = 2.5"), r"sweep.repeats must be an integer >= 1, got 2.5"),
        (("seed = 3", 'seed = "3"'), r"sweep.seed must be an integer, got '3'"),
        (("4.0, {rate", "-4.0, {rate"), r"sweep.arrivals\[1\]: arrivals.rate must be > 0, got -4.0"),
        (("burstiness = 0.5", "burstiness = -1"), r"sweep.arrivals\[2\]: arrivals.burstiness must be > 0, got -1"),
        (("{concurrency = 4}", "{concurrency = 4, rate = 2}"), r"sweep.arrivals\[3\]: arrivals.rate and arrivals"),
        (("{concurrency = 4}", "{arival = 4}"), r"sweep.arrivals\[3\]: unknown arrivals key 'arival'"),
        (("low = 4, high = 24", "low = 24, high = 4"), r"sweep.output_lengths\[0\]: output_lengths needs low <= high"),
        (("16, {kind", '{kind = "from_file"}, {kind'), r"'from_file' reads output_len from a JSONL prompt file"),
        (("prompts = [32", "prompts = [0"), r"sweep.prompts\[0\]: prompts.tokens must be an integer >= 1, got 0"),
        (("[sweep]", "name = 'x'\n[sweep]"), r"unknown top-level key 'name'; put every setting under \[sweep\]"),
        (("[sweep]", "[sweeps]"), r"unknown top-level key 'sweeps'"),
        (("seed = 3", "seed = = 3"), r"not valid TOML"),
    ],
)
def test_bad_configs_name_the_file_and_the_key(tmp_path, change, message):
    old, new = change
    assert old in GRID
    path = write(tmp_path, GRID.replace(old, new, 1))
    with pytest.raises(ValueError, match=message) as error:
        load_sweep(path)
    assert str(error.value).startswith(str(path))


def test_missing_sweep_table_and_missing_file_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"empty.toml: no \[sweep\] table"):
        load_sweep(write(tmp_path, "", "empty.toml"))
    with pytest.raises(ValueError, match=r"cannot read sweep config .*absent.toml"):
        load_sweep(tmp_path / "absent.toml")


def test_ids_that_would_collide_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "chat.jsonl").write_text('{"prompt": "hi"}\n')
    text = GRID.replace(
        'prompts = [32, "shipped"]',
        'prompts = [{kind = "jsonl", path = "a/chat.jsonl"}, {kind = "jsonl", path = "b/chat.jsonl"}]',
    )
    with pytest.raises(ValueError, match=r"two cases share the id 'static-B4-in_chat-out_uniform4_24-offline'"):
        load_sweep(write(tmp_path, text))


axis_sizes = st.tuples(*[st.integers(1, 3)] * 5)


@settings(max_examples=40, deadline=None)
@given(sizes=axis_sizes)
def test_any_grid_has_product_many_cases_with_unique_ids(sizes):
    num_engines, num_batches, num_prompts, num_lengths, num_arrivals = sizes
    data = {
        "sweep": {
            "engines": ["static", "inflight", "other"][:num_engines],
            "batch_sizes": [1, 2, 3][:num_batches],
            "prompts": ["shipped", 8, {"kind": "uniform", "low": 2, "high": 9}][:num_prompts],
            "output_lengths": [
                4,
                {"kind": "uniform", "low": 1, "high": 4},
                {"kind": "exponential", "mean": 2, "high": 8},
            ][:num_lengths],
            "arrivals": ["offline", 2.5, {"concurrency": 2}][:num_arrivals],
            "num_requests": 3,
        }
    }
    sweep = parse_sweep(data)
    cases = sweep.cases()
    assert isinstance(sweep, Sweep)
    assert len(cases) == math.prod(sizes)
    assert len({case.id for case in cases}) == len(cases)
    assert all(" " not in case.id for case in cases)


def test_sweep_does_not_import_torch():
    code = "import sys, perfsuite.workload.sweep; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
