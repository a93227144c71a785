"""Series of a run history: one point per session, only among runs of one fingerprint and run configuration."""

from __future__ import annotations

import dataclasses
import math

import pytest

from history_builders import CONFIGURATION, TEST_ID, commit_of, session, sessions, stamp_of
from perfsuite.history.series import NOT_PROBED, SERIES_NORMALISED, build_series
from perfsuite.judge.catalogue import PROBE, RAW_SERVER_FIGURES
from perfsuite.judge.stats import Direction
from perfsuite.measure.environment import ServerEnvironment
from results_builders import ENVIRONMENT


def test_one_point_per_session_oldest_first_with_its_commit_date_and_median():
    found = build_series(sessions([100.0, 90.0, 110.0]))
    assert len(found) == 1
    series = found[0]
    assert (series.key.test_id, series.key.metric, series.direction) == (TEST_ID, "output_throughput",
                                                                         Direction.HIGHER_IS_BETTER)  # fmt: skip
    assert [(p.commit, p.created_at) for p in series.points] == [(commit_of(i), stamp_of(i)) for i in range(3)]
    assert series.values == pytest.approx((100.0, 90.0, 110.0)), "the median of each session's repeats"
    assert series.points[0].short_commit == commit_of(0)[:7]
    assert series.normalization == NOT_PROBED


def test_runs_of_another_fingerprint_or_configuration_make_series_of_their_own():
    elsewhere = dataclasses.replace(ENVIRONMENT, cpu_model="Another CPU")
    other_configuration = dataclasses.replace(CONFIGURATION, repeats=5)
    history = [
        session(0, 100.0),
        session(1, 50.0, environment=elsewhere),
        session(2, 101.0),
        session(3, 70.0, configuration=other_configuration),
        session(4, 102.0),
    ]
    by_key = {(s.key.fingerprint, s.key.configuration): s.values for s in build_series(history)}
    assert by_key == {
        (ENVIRONMENT.fingerprint(), CONFIGURATION): pytest.approx((100.0, 101.0, 102.0)),
        (elsewhere.fingerprint(), CONFIGURATION): pytest.approx((50.0,)),
        (ENVIRONMENT.fingerprint(), other_configuration): pytest.approx((70.0,)),
    }


def test_short_forms_name_the_fingerprints_hash_and_the_configuration():
    key = build_series(sessions([1.0]))[0].key
    assert key.fingerprint_label == ENVIRONMENT.fingerprint().rsplit("-", 1)[1]
    assert key.configuration_label.startswith("ci static packed x3 (")
    assert dataclasses.replace(key, configuration=None).configuration_label == "configuration not recorded"


def test_each_repeat_is_rescaled_by_its_probe_over_the_series_median_probe():
    """Session 2 ran on a machine twice as slow (probe 2 s against 1 s): its raw throughput halves, its latency
    doubles; rescaled, both sessions read the same, on the series' median probe (1.5 s)."""
    fast = {"output_throughput": (100.0, 100.0), "median_tpot_ms": (10.0, 10.0), PROBE: (1.0, 1.0)}
    slow = {"output_throughput": (50.0, 50.0), "median_tpot_ms": (20.0, 20.0), PROBE: (2.0, 2.0)}
    found = {s.key.metric: s for s in build_series([session(0, 0, samples=fast), session(1, 0, samples=slow)])}
    assert found["output_throughput"].values == pytest.approx((100.0 / 1.5, 100.0 / 1.5))
    assert found["median_tpot_ms"].values == pytest.approx((15.0, 15.0))
    assert found["median_tpot_ms"].direction is Direction.LOWER_IS_BETTER
    assert found["output_throughput"].normalization == SERIES_NORMALISED
    assert PROBE not in found, "the probe is a divisor, not a series"


def test_a_run_without_probes_among_probed_ones_stays_as_measured_and_the_series_says_so():
    probed = {"output_throughput": (100.0,), PROBE: (2.0,)}
    series = build_series([session(0, 0, samples=probed), session(1, 80.0)])[0]
    assert series.values == pytest.approx((100.0, 80.0))
    assert "1 of 2 runs recorded no probe" in series.normalization


def test_a_server_in_another_process_is_never_rescaled():
    server = ServerEnvironment(served_model="smollm2", max_model_len=2048, owned_by="vllm", label="vllm-cpu")
    samples = {"output_throughput": (100.0,), PROBE: (2.0,)}
    history = [session(0, 0, samples=samples, environment=server),
               session(1, 0, samples={**samples, PROBE: (1.0,)}, environment=server)]  # fmt: skip
    series = build_series(history)[0]
    assert series.values == (100.0, 100.0)
    assert series.normalization == RAW_SERVER_FIGURES
    assert series.key.fingerprint == server.fingerprint()


def test_ab_sessions_and_noisy_tests_belong_to_no_series():
    history = [
        session(0, 100.0),
        session(1, 60.0, pair_order=("AB", "BA", "AB"), reference_samples={"output_throughput": (100.0,) * 3}),
        session(2, 40.0, noisy="another process held 60% of the CPU"),
        session(3, 101.0),
    ]
    (series,) = build_series(history)
    assert series.values == pytest.approx((100.0, 101.0))


def test_a_session_without_a_finite_value_makes_no_point():
    history = [session(0, 100.0), session(1, 0, samples={"output_throughput": (math.nan,)}), session(2, 101.0)]
    assert build_series(history)[0].values == pytest.approx((100.0, 101.0))


def test_only_the_tests_and_metrics_asked_for():
    history = [session(0, 100.0), session(1, 90.0, test_id="t.py::test_other")]
    assert [s.key.test_id for s in build_series(history, {"t.py::test_other"})] == ["t.py::test_other"]
    assert build_series(history, metrics={"median_ttft_ms": Direction.LOWER_IS_BETTER}) == []
