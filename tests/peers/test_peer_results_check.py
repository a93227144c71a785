"""The peers tier's own check of a results.json: every request of every repeat that ran, in full."""

from __future__ import annotations

from peer_servers import incomplete_tests

NUM_REQUESTS = 8


def a_test(completed: int, tokens: int, repeats: int, output_length: float = 16.0) -> dict:
    return {
        "test_id": "t",
        "parameters": {"output_length": output_length},
        "completed": completed,
        "total_output_tokens": tokens,
        "samples": {"output_throughput": [1.0] * repeats},
    }


def test_a_test_stopped_early_by_a_busy_machine_is_checked_over_the_repeats_it_ran():
    results = {"repeats": 3, "tests": [a_test(completed=8, tokens=128, repeats=1)]}
    assert incomplete_tests(results, NUM_REQUESTS) == []


def test_a_lost_request_or_token_is_reported():
    lost_request = a_test(completed=23, tokens=368, repeats=3)
    lost_token = a_test(completed=24, tokens=383, repeats=3)
    no_repeat = a_test(completed=0, tokens=0, repeats=0)
    for test in (lost_request, lost_token, no_repeat):
        assert incomplete_tests({"repeats": 3, "tests": [test]}, NUM_REQUESTS), test
