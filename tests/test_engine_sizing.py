"""Each engine's cache is sized for its own requests, so a long sweep case costs no other test anything.

The static decode step attends over its cache's whole ``max_seq_len``: when
every engine took the session's longest request, adding one long sweep case
made every static test's decode steps wider (and changed every test's
baseline identity). The shipped perf tests run here with the static decode
path, recording the width of every decode mask each test builds.
"""

from __future__ import annotations

import json
import textwrap

pytest_plugins = ["pytester"]

# 120-token prompts: 123 tokens a request, a 128-token cache; the smoke
# profile's own requests fit 64 with tiny-random's byte tokenizer.
LONG_SWEEP = """
[sweep]
engines = ["static"]
batch_sizes = [2]
prompts = [120]
output_lengths = [3]
arrivals = ["offline"]
num_requests = 2
repeats = 2
"""

RECORD_MASK_WIDTHS = textwrap.dedent(
    """
    import json, os
    from perfsuite.engine.static_decode import StaticDecodeStep

    MASK_WIDTHS = {}
    _mask = StaticDecodeStep._mask

    def _recorded_mask(positions, max_seq_len):
        mask = _mask(positions, max_seq_len)
        test = os.environ["PYTEST_CURRENT_TEST"].split(" ")[0].split("::")[-1]
        MASK_WIDTHS.setdefault(test, set()).add(mask.shape[-1])
        return mask

    StaticDecodeStep._mask = staticmethod(_recorded_mask)

    def pytest_sessionfinish(session):
        widths = {test: sorted(found) for test, found in MASK_WIDTHS.items()}
        (session.config.rootpath / "mask_widths.json").write_text(json.dumps(widths))
    """
)


def test_a_static_engine_decodes_over_its_own_max_seq_len_not_the_sessions_longest(pytester):
    from smoke_session import run_shipped_smoke_session

    pytester.path.joinpath("sweep.toml").write_text(LONG_SWEEP)
    result = run_shipped_smoke_session(
        pytester, "--perf-decode-mode", "static", "--perf-config", "sweep.toml", "--perf-repeats", "2",
        "-k", "throughput and static or sweep", conftest_addition=RECORD_MASK_WIDTHS,
    )  # fmt: skip
    result.assert_outcomes(skipped=3)  # each ran its static decode steps, then judged nothing: no baselines here
    widths = json.loads((pytester.path / "mask_widths.json").read_text())
    assert set(widths) == {"test_throughput[static-B2-fixed]", "test_throughput[static-B2-uniform]",
                           "test_sweep[static-B2-in120-out3-offline]"}, "every test ran static decode steps"
    assert widths["test_sweep[static-B2-in120-out3-offline]"] == [128]
    assert widths["test_throughput[static-B2-fixed]"] == widths["test_throughput[static-B2-uniform]"] == [64]
    tests = json.loads((pytester.path / "reports" / "results.json").read_text())["tests"]
    sizes = {t["test_id"].split("::")[-1]: t["measurement"]["configuration"]["max_seq_len"] for t in tests}
    assert sizes == {"test_throughput[static-B2-fixed]": 64, "test_throughput[static-B2-uniform]": 64,
                     "test_sweep[static-B2-in120-out3-offline]": 128}, "the baseline identity follows the engine"
