"""Shared-prefix groups, multi-turn chat and trace replay: their sharing structure, seeds and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench_modules import load_bench
from perfsuite.workload import (
    MultiTurn,
    ShapedWorkload,
    SharedPrefix,
    Trace,
    Vocab,
    parse_shape,
    parse_workload_option,
)
from perfsuite.workload.arrivals import Arrivals
from perfsuite.workload.sweep import parse_sweep

VOCAB = Vocab(1000, special_ids=(0, 1, 2))


def common_prefix(a, b) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


@settings(max_examples=25)
@given(
    groups=st.integers(1, 4),
    prompts=st.integers(1, 4),
    prefix=st.integers(1, 20),
    suffix=st.integers(0, 6),
    seed=st.integers(0, 5),
)
def test_prompts_of_a_group_share_exactly_the_prefix_and_groups_share_nothing(groups, prompts, prefix, suffix, seed):
    requests = ShapedWorkload(SharedPrefix(groups, prompts, prefix, suffix, output=3), seed=seed).requests(vocab=VOCAB)
    assert len(requests) == groups * prompts
    for a in requests:
        assert a.num_prompt_tokens == prefix + suffix and a.sampling_params.max_new_tokens == 3
        assert not set(a.prompt_token_ids) & set(VOCAB.special_ids)
        for b in requests:
            if a is b:
                continue
            same_group = a.request_id.split("-")[0] == b.request_id.split("-")[0]
            expected = (prefix + suffix if suffix == 0 else prefix) if same_group else 0
            assert common_prefix(a.prompt_token_ids, b.prompt_token_ids) == expected, (a, b)


def test_a_seed_gives_the_same_requests_token_for_token_and_another_seed_others():
    shapes = [SharedPrefix(3, 4, 16, 4, 8), MultiTurn(3, 3, 8, 4, 5, think_time=0.5)]
    for shape in shapes:
        first = ShapedWorkload(shape, Arrivals(rate=4.0), seed=7).requests(vocab=VOCAB)
        assert first == ShapedWorkload(shape, Arrivals(rate=4.0), seed=7).requests(vocab=VOCAB)
        other = ShapedWorkload(shape, Arrivals(rate=4.0), seed=8).requests(vocab=VOCAB)
        assert [r.prompt_token_ids for r in first] != [r.prompt_token_ids for r in other]


def test_a_multi_turn_workload_chains_each_sessions_turns_and_spreads_sessions_by_the_arrivals():
    shape = MultiTurn(sessions=3, turns=4, prompt=10, message=5, output=6, think_time=0.25)
    requests = ShapedWorkload(shape, Arrivals(rate=2.0), seed=1).requests(vocab=VOCAB)
    by_id = {r.request_id: r for r in requests}
    assert sorted(by_id) == sorted(f"s{s}-t{t}" for s in range(3) for t in range(4))
    firsts = [by_id[f"s{s}-t0"] for s in range(3)]
    assert [r.arrival_time for r in firsts] == sorted(r.arrival_time for r in firsts) and firsts[1].arrival_time > 0
    assert len({r.prompt_token_ids[0] for r in firsts}) == 3, "sessions differ from their first token"
    for session in range(3):
        for turn in range(1, 4):
            request = by_id[f"s{session}-t{turn}"]
            parent = by_id[f"s{session}-t{turn - 1}"]
            assert request.follows.parent_id == parent.request_id and request.follows.think_time == 0.25
            assert request.num_prompt_tokens == 5 and request.arrival_time == 0
            # ignore_eos: the bound is the prompt it will get, 10 + turn x (6 + 5)
            assert request.max_prompt_tokens == 10 + turn * 11


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: SharedPrefix(0, 2, 4), "shared_prefix.groups must be an integer >= 1"),
        (lambda: SharedPrefix(2, 2, 4, suffix=-1), "shared_prefix.suffix must be an integer >= 0"),
        (lambda: SharedPrefix(2, 2, 0), "shared_prefix.prefix"),
        (lambda: MultiTurn(2, 0), "multi_turn.turns"),
        (lambda: MultiTurn(2, 2, think_time=-1), "multi_turn.think_time must be seconds >= 0"),
        (lambda: Trace("t.jsonl", time_scale=0), "trace.time_scale must be > 0"),
        (lambda: Trace("t.jsonl", max_requests=0), "trace.max_requests"),
        (lambda: ShapedWorkload(SharedPrefix(2000, 1, 4)).requests(vocab=VOCAB), "2000 shared_prefix.groups need"),
        (lambda: ShapedWorkload(Trace("t.jsonl"), Arrivals(rate=2.0)), "a trace's timestamps are its arrivals"),
        (lambda: ShapedWorkload(SharedPrefix(1, 1, 4)).requests(), "pass vocab="),
        (lambda: parse_shape({"kind": "shared_prefix", "groups": 2}), "needs prompts, prefix"),
        (lambda: parse_shape({"kind": "multi_turns"}), "workload kind must be one of 'shared_prefix'"),
        (lambda: parse_shape({"kind": "multi_turn", "sessions": 2, "turns": 2, "think": 1}), "did you mean"),
        (lambda: parse_workload_option("shared_prefix"), "KIND:KEY=VALUE"),
        (lambda: parse_workload_option("multi_turn:sessions=2,turns"), "'turns' is not KEY=VALUE"),
        (lambda: parse_workload_option("multi_turn:sessions=two,turns=2"), "sessions='two' is not a number"),
        (lambda: parse_workload_option("multi_turn:sessions=2,sessions=3,turns=2"), "sessions is given twice"),
        (lambda: parse_workload_option("multi_turn:sessions=2.5,turns=2"), "multi_turn.sessions must be an integer"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_the_command_line_form_takes_every_key_and_a_trace_path_first():
    assert parse_workload_option("shared_prefix:groups=8,prompts=8,prefix=256,suffix=32,output=16") == SharedPrefix(
        8, 8, 256, 32, 16
    )
    assert parse_workload_option("multi_turn:sessions=4,turns=3,think_time=0.5") == MultiTurn(4, 3, think_time=0.5)
    assert parse_workload_option("trace:a/b.jsonl,time_scale=0.5,max_requests=10,block_size=16") == Trace(
        Path("a/b.jsonl"), 16, 0.5, 10
    )


def write_trace(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def line(timestamp=0, input_length=20, output_length=4, hash_ids=(1, 2)):
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
            "hash_ids": list(hash_ids)}  # fmt: skip


def test_a_trace_shares_prompt_tokens_block_by_block_and_replays_its_scaled_times(tmp_path):
    path = write_trace(
        tmp_path,
        line(1000, 20, 4, (1, 2)),
        "",
        line(1500, 30, 3, (1, 2)),
        line(3000, 40, 5, (1, 9, 10)),
        line(4000, 16, 2, (9,)),
        line(9000, 5, 2, (3,)),
    )
    requests = ShapedWorkload(Trace(path, block_size=16, time_scale=0.5, max_requests=4), seed=3).requests(vocab=VOCAB)
    assert [r.request_id for r in requests] == ["req-0", "req-1", "req-2", "req-3"]
    assert [r.arrival_time for r in requests] == [0.0, 0.25, 1.0, 1.5]
    assert [r.num_prompt_tokens for r in requests] == [20, 30, 40, 16]
    assert [r.sampling_params.max_new_tokens for r in requests] == [4, 3, 5, 2]
    first, second, third, fourth = (r.prompt_token_ids for r in requests)
    assert second[:20] == first, "blocks 1 and 2 (the second partial in the first request) are the same tokens"
    assert third[:16] == first[:16] and third[16:32] != first[16:32], "hash id 1 shared, then 9, not 2"
    assert fourth == third[16:32], "a hash id is the same tokens wherever it appears"
    again = ShapedWorkload(Trace(path, block_size=16, max_requests=4), seed=3).requests(vocab=VOCAB)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in requests]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("{not json", r"line 2: not valid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object"),
        ({"timestamp": 5, "input_length": 20, "hash_ids": [1, 2]}, r"line 2: 'output_length' missing"),
        (line(timestamp="5"), r'line 2: "timestamp" must be milliseconds >= 0, got "5"'),
        (line(timestamp=-1), r'line 2: "timestamp" must be milliseconds >= 0'),
        (line(input_length=2.5), r'line 2: "input_length" must be an integer >= 1'),
        (line(output_length=0), r'line 2: "output_length" must be an integer >= 1'),
        (line(output_length=True), r'line 2: "output_length" must be an integer >= 1'),
        ({**line(), "hash_ids": "1,2"}, r'line 2: "hash_ids" must be a list of integers >= 0, got "1,2"'),
        (line(hash_ids=(1, "2")), r'line 2: "hash_ids" must be a list of integers'),
        (line(input_length=40), r'line 2: "input_length" 40 fills 3 block\(s\) of 16 tokens but "hash_ids" has 2'),
        (line(input_length=16), r'line 2: "input_length" 16 fills 1 block\(s\) of 16 tokens but "hash_ids" has 2'),
    ],
)
def test_a_bad_trace_line_is_refused_with_its_line_number_and_field(tmp_path, bad, words):
    path = write_trace(tmp_path, line(10), bad, line(20))
    with pytest.raises(ValueError, match=f"{path} {words}"):
        Trace(path, block_size=16).lines()


def test_a_trace_must_be_in_timestamp_order_and_hold_a_request(tmp_path):
    path = write_trace(tmp_path, line(10), line(30), line(20))
    with pytest.raises(ValueError, match=r"line 3: \"timestamp\" 20 is earlier than line 2's 30; sort the trace"):
        Trace(path, block_size=16).lines()
    assert len(Trace(path, block_size=16, max_requests=2).lines()) == 2, "the cap stops before the bad line"
    with pytest.raises(ValueError, match="has no requests"):
        Trace(write_trace(tmp_path, ""), block_size=16).lines()
    with pytest.raises(ValueError, match="cannot read trace"):
        Trace(tmp_path / "none.jsonl").lines()
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0], "x": "\xe9"}\n')
    with pytest.raises(ValueError, match="latin1.jsonl is not UTF-8 text; save the trace as UTF-8"):
        Trace(latin1).lines()


def test_the_shipped_trace_is_what_make_trace_writes_and_replays_with_mooncake_blocks():
    make_trace = load_bench("make_trace")
    shipped = make_trace.SHIPPED
    assert shipped.read_text(encoding="utf-8") == "\n".join(make_trace.trace_lines()) + "\n"
    trace = Trace(shipped)
    requests = ShapedWorkload(trace).requests(vocab=VOCAB)
    assert len(requests) == 40 and requests[0].arrival_time == 0.0
    prefixes = [common_prefix(a.prompt_token_ids, b.prompt_token_ids) for a in requests for b in requests if a is not b]
    assert max(prefixes) >= 512, "some requests share at least one whole block"


SHAPED_SWEEP = {
    "sweep": {"engines": ["inflight", "paged"], "batch_sizes": [2], "arrivals": ["offline", {"concurrency": 2}]},
    "workload": [
        {"kind": "shared_prefix", "groups": 2, "prompts": 2, "prefix": 16},
        {"kind": "multi_turn", "sessions": 2, "turns": 2, "prompt": 8},
    ],
}


def test_a_sweeps_workload_tables_are_an_axis_crossed_with_engines_batches_and_arrivals():
    sweep = parse_sweep(SHAPED_SWEEP)
    cases = sweep.cases()
    assert sweep.num_cases == len(cases) == 2 * 1 * 2 * 2
    assert [case.id for case in cases[:4]] == [
        "inflight-B2-sp2x2-prefix16-suffix32-out32-offline",
        "inflight-B2-sp2x2-prefix16-suffix32-out32-c2",
        "inflight-B2-mt2x2-in8-msg32-out32-think0-offline",
        "inflight-B2-mt2x2-in8-msg32-out32-think0-c2",
    ]
    assert cases[1].workload.max_concurrency == 2
    one = parse_sweep({"sweep": {"engines": ["paged"], "batch_sizes": [4]}, "workload": SHAPED_SWEEP["workload"][1]})
    assert [case.workload.shape for case in one.cases()] == [MultiTurn(2, 2, prompt=8)]


def test_a_sweeps_trace_is_read_at_load_relative_to_the_config(tmp_path):
    from perfsuite.workload.sweep import load_sweep

    write_trace(tmp_path, line(0, 20, 4, (1, 2)), line(5, 200, 4, (1, 2)))
    config = tmp_path / "sweep.toml"
    config.write_text('[sweep]\nengines = ["paged"]\nbatch_sizes = [2]\n\n'
                      '[workload]\nkind = "trace"\npath = "trace.jsonl"\nblock_size = 16\n')  # fmt: skip
    bad_line = rf"{config}: workload\[0\]: {tmp_path / 'trace.jsonl'} line 2: \"input_length\""
    with pytest.raises(ValueError, match=bad_line):
        load_sweep(config)
    write_trace(tmp_path, line(0, 20, 4, (1, 2)))
    [case] = load_sweep(config).cases()
    assert case.id == "paged-B2-trace_trace" and case.workload.shape.path == tmp_path / "trace.jsonl"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"sweep": {**SHAPED_SWEEP["sweep"], "num_requests": 4}},
            r"\[workload\] sets the requests, so sweep.num_requests",
        ),
        ({"capacity": {}}, r"\[capacity\] searches the load"),
        ({"workload": [{"kind": "shared_prefix", "groups": 2}]}, r"workload\[0\]: workload kind 'shared_prefix' needs"),
        ({"workload": {"kind": "trace", "path": "t.jsonl"}, "sweep": {**SHAPED_SWEEP["sweep"], "arrivals": [2.0]}},
         r"workload x sweep.arrivals: a trace's timestamps"),
        ({"sweep": {"engines": ["paged"]}}, r"\[sweep\] needs batch_sizes"),
    ],
)
def test_a_bad_workload_section_is_refused_naming_the_key(change, words):
    with pytest.raises(ValueError, match=words):
        parse_sweep({**SHAPED_SWEEP, **change}, source="s.toml")


def test_the_example_workloads_config_loads_and_stays_cpu_sized():
    from perfsuite.engine.names import OWN_ENGINES
    from perfsuite.workload.sweep import load_sweep

    cases = load_sweep(Path(__file__).resolve().parents[1] / "examples" / "workloads.toml").cases()
    assert len(cases) == 8 and {case.engine for case in cases} <= set(OWN_ENGINES)
    assert all(case.workload.num_requests <= 8 for case in cases)
