"""A sweep config's ``[capacity]`` section (perfsuite.workload.sweep): capacity cases per engine x batch size x
prompts x output lengths, arrivals ignored; bad keys and values named with their fix."""

from __future__ import annotations

import pytest

from perfsuite.workload import Arrivals
from perfsuite.workload.sweep import CapacitySettings, parse_sweep

SWEEP = {
    "engines": ["static", "inflight"],
    "batch_sizes": [4, 8],
    "prompts": [32],
    "output_lengths": [16, {"kind": "uniform", "low": 4, "high": 24}],
    "arrivals": ["offline", 4.0, {"concurrency": 2}],
    "num_requests": 8,
    "repeats": 3,
}


def sweep_with(capacity: object):
    return parse_sweep({"sweep": SWEEP, "capacity": capacity}, source="s.toml")


def test_a_capacity_section_adds_one_case_per_engine_batch_size_prompts_and_lengths_ignoring_arrivals():
    sweep = sweep_with({"by": "concurrency", "target_share": 0.95, "tolerance": 0.05})
    cases = sweep.capacity_cases()
    assert len(cases) == 2 * 2 * 1 * 2 and len(sweep.cases()) == 2 * 2 * 1 * 2 * 3
    assert [c.id for c in cases[:2]] == ["static-B4-in32-out16", "static-B4-in32-out_uniform4_24"]
    assert len({c.id for c in cases}) == len(cases)
    assert all(c.settings == CapacitySettings("concurrency", 0.95, 0.05) and c.repeats == 3 for c in cases)
    probe = cases[0].workload_at(8.0, 32)
    assert probe.arrivals == Arrivals(rate=8.0) and probe.num_requests == 32 and probe.seed == sweep.seed


def test_every_capacity_key_is_optional_and_without_the_section_there_are_no_capacity_cases():
    assert sweep_with({}).capacity == CapacitySettings(None, None, None)
    assert sweep_with({"by": "rate"}).capacity.by == "rate"
    assert parse_sweep({"sweep": SWEEP}).capacity is None and parse_sweep({"sweep": SWEEP}).capacity_cases() == []


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        ({"by": "load"}, r"s.toml: capacity.by must be 'rate' or 'concurrency', got 'load'"),
        ({"target_share": 90}, r"capacity.target_share is the share .* in \(0, 1\] \(0.9 for 90%\), got 90"),
        ({"target_share": 0}, r"capacity.target_share .* got 0"),
        ({"target_share": True}, r"capacity.target_share .* got True"),
        ({"tolerance": -0.1}, r"capacity.tolerance must be a number > 0 \(0.1 for 10%\), got -0.1"),
        ({"tolerance": "10%"}, r"capacity.tolerance must be a number > 0"),
        ({"tolerence": 0.1}, r"s.toml: unknown capacity key 'tolerence' \(did you mean 'tolerance'\?\); known keys"),
        ("concurrency", r"s.toml: capacity must be a table: a \[capacity\] section, got 'concurrency'"),
    ],
)
def test_bad_capacity_keys_and_values_are_named_with_their_fix(capacity, message):
    with pytest.raises(ValueError, match=message):
        sweep_with(capacity)


def test_other_top_level_sections_are_still_refused():
    with pytest.raises(ValueError, match=r"unknown top-level key 'capacty'; put every setting under \[sweep\]"):
        parse_sweep({"sweep": SWEEP, "capacty": {}}, source="s.toml")
