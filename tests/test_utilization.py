"""Peaks, prefill MFU and decode MBU: from the steps' counted work and times, against this machine's roofs."""

from __future__ import annotations

import json
import math

import pytest

from perfsuite.engine.types import EngineCounters, RunResult, ScheduledChunk, StepTrace
from perfsuite.engine.work import ModelShape, step_work
from perfsuite.judge.catalogue import METRICS, UTILIZATION_METRICS
from perfsuite.measure.peaks import MachinePeaks, datasheet_peaks, peaks_from_timings
from perfsuite.measure.summaries import Repeats, summarise
from perfsuite.measure.utilization import DECODE_MBU, PREFILL_MFU, run_rates, utilization_samples
from perfsuite.models.spec import RANDOM_CONFIGS

SHAPE = ModelShape.from_config(RANDOM_CONFIGS["tiny-random"], 4)
PEAKS = MachinePeaks("cpu", "float32", flops_per_second=1e9, bytes_per_second=1e8)


def chunk(slot: int, start: int, num_tokens: int, prefill: bool) -> ScheduledChunk:
    return ScheduledChunk(f"r{slot}", slot, (5,) * num_tokens, start, True, prefill)


def trace(start: float, seconds: float, *chunks: ScheduledChunk) -> StepTrace:
    return StepTrace(start, start + seconds, 0, chunks, work=step_work(chunks, SHAPE))


def run_of(*steps: StepTrace) -> RunResult:
    return RunResult("inflight", (), 0.0, steps[-1].end_time, EngineCounters(), steps)


PREFILL = trace(0.0, 0.02, chunk(0, 0, 16, True))
DECODE = trace(0.02, 0.01, chunk(0, 16, 1, False))
MIXED = trace(0.03, 0.03, chunk(0, 17, 1, False), chunk(1, 0, 8, True))


def test_a_pure_prefill_step_and_a_pure_decode_step_give_their_own_rates():
    rates = run_rates(run_of(PREFILL, DECODE))
    assert rates["prefill"].flops == PREFILL.work.prefill.flops
    assert rates["prefill"].seconds == pytest.approx(0.02)
    assert rates["decode"].bytes_moved == DECODE.work.decode.bytes_moved
    assert rates["decode"].bytes_per_second == pytest.approx(DECODE.work.decode.bytes_moved / 0.01)


def test_a_mixed_steps_time_is_split_by_its_kinds_flops():
    rates = run_rates(run_of(MIXED))
    prefill_share = MIXED.work.prefill.flops / MIXED.work.total.flops
    assert rates["prefill"].seconds == pytest.approx(0.03 * prefill_share)
    assert rates["prefill"].seconds + rates["decode"].seconds == pytest.approx(0.03)
    assert 0 < rates["decode"].seconds < rates["prefill"].seconds


def test_mfu_and_mbu_are_the_achieved_rates_over_the_peaks():
    samples = utilization_samples(run_of(PREFILL, DECODE), PEAKS)
    assert samples[PREFILL_MFU] == pytest.approx(PREFILL.work.prefill.flops / 0.02 / 1e9)
    assert samples[DECODE_MBU] == pytest.approx(DECODE.work.decode.bytes_moved / 0.01 / 1e8)
    assert samples["decode_gbps"] == pytest.approx(DECODE.work.decode.bytes_moved / 0.01 / 1e9)


def test_a_run_without_counted_work_or_without_peaks_has_no_mfu():
    bare = RunResult("peer", (), 0.0, 1.0, EngineCounters(), (StepTrace(0.0, 1.0, 0, (chunk(0, 0, 4, True),)),))
    assert utilization_samples(bare, PEAKS) == {}
    assert PREFILL_MFU not in utilization_samples(run_of(PREFILL), None)
    assert DECODE_MBU not in utilization_samples(run_of(PREFILL), PEAKS)  # no decode: no MBU, never a NaN


def test_summarise_stores_mfu_and_mbu_per_repeat_and_the_rates_judged_through_them():
    runs = (run_of(PREFILL, DECODE), run_of(trace(0.0, 0.04, chunk(0, 0, 16, True)), DECODE))
    measured = summarise(Repeats(runs), METRICS, peaks=PEAKS)
    assert measured.samples[PREFILL_MFU][0] == pytest.approx(2 * measured.samples[PREFILL_MFU][1])
    assert len(measured.samples["decode_gbps"]) == 2
    assert set(UTILIZATION_METRICS) == {"prefill_tflops", "decode_gbps"}
    assert all(name in measured.samples for name in UTILIZATION_METRICS)


# -- judged: a drop in MBU at one workload is a regression --------------------------------------------------------

STEADY = (1.00, 1.01, 0.99, 1.00, 1.02, 0.98)


def utilization_result(decode_gbps: tuple[float, ...], throughput: tuple[float, ...] = (100.0, 101.0, 99.0) * 2):
    from results_builders import make_result

    samples = {"output_throughput": throughput, "decode_gbps": decode_gbps, DECODE_MBU: decode_gbps}
    return make_result("t.py::test_a[paged]", samples=samples)


def test_a_drop_in_decode_bandwidth_at_one_workload_is_a_regression_judged_in_its_own_family():
    from perfsuite.judge.judge import FamilyPlan, Reference, judge
    from perfsuite.judge.stats import Policy, Verdict

    baseline = Reference(utilization_result(STEADY).measurement.samples, EngineCounters(), {}, None)
    slower = utilization_result(tuple(0.8 * x for x in STEADY))
    plan = FamilyPlan(headline=400, utilization=2)  # a big headline family leaves MBU's bar where it was
    comparisons = judge(slower, baseline, status="compared", slo=None, policy=Policy(), plan=plan).result
    by_metric = {c.metric: c for c in comparisons.judgement.comparisons}
    assert by_metric["decode_gbps"].verdict is Verdict.REGRESSED
    assert by_metric["decode_gbps"].change == pytest.approx(-0.2)
    assert by_metric["output_throughput"].verdict is Verdict.UNCHANGED
    assert DECODE_MBU not in by_metric  # MBU itself divides by a peak measured once per session


def test_a_baseline_older_than_the_rates_or_an_engine_that_counts_no_work_plans_only_the_headline_metrics():
    from perfsuite.judge.judge import FamilyPlan, Reference, judge
    from perfsuite.judge.stats import Policy
    from perfsuite.judge.tally import tally

    older = Reference({"output_throughput": (100.0, 101.0, 99.0) * 2}, EngineCounters(), {}, None)
    judged = judge(utilization_result(STEADY), older, status="compared", slo=None, policy=Policy(), plan=FamilyPlan(4))
    assert [c.metric for c in judged.result.judgement.comparisons] == ["output_throughput"]
    assert tally([judged.result], 1).all_judged


def test_the_session_end_adjustment_keeps_the_two_families_apart():
    """Thirty flat headline comparisons would raise a lone MBU regression's adjusted p thirty-one-fold in one family."""
    from perfsuite.judge.judge import FamilyPlan, Reference, adjust_family, judge
    from perfsuite.judge.stats import Policy, Verdict
    from results_builders import make_result

    baseline = Reference(utilization_result(STEADY).measurement.samples, EngineCounters(), {}, None)
    flat = [make_result(f"t.py::test_{i}", samples={"output_throughput": (100.0, 101.0, 99.0) * 2}) for i in range(29)]
    slower = utilization_result(tuple(0.8 * x for x in STEADY))
    plan = FamilyPlan(headline=30, utilization=60)
    results = [judge(r, baseline, status="compared", slo=None, policy=Policy(), plan=plan).result for r in flat]
    results.append(judge(slower, baseline, status="compared", slo=None, policy=Policy(), plan=plan).result)
    final, _ = adjust_family(results, Policy())
    verdicts = {c.metric: c.verdict for c in final[-1].judgement.comparisons}
    assert verdicts["decode_gbps"] is Verdict.REGRESSED
    assert verdicts["output_throughput"] is Verdict.UNCHANGED


def test_peaks_from_timings_count_a_square_matmul_and_a_copys_read_and_write():
    peaks = peaks_from_timings("cpu", "float32", matmul_seconds=0.5, matmul_size=1000, copy_seconds=0.25,
                               copy_bytes=10**9)  # fmt: skip
    assert peaks.flops_per_second == pytest.approx(4e9)
    assert peaks.bytes_per_second == pytest.approx(8e9)
    assert peaks.ridge_point == pytest.approx(0.5)
    assert peaks.datasheet_flops_per_second is None


def test_the_bandwidth_roof_is_the_faster_of_a_copy_and_a_read_only_sum():
    """A CPU copy's stores read each target line first (write-allocate): a decode step mostly reads."""
    timings = {"matmul_seconds": 0.5, "matmul_size": 1000, "copy_seconds": 0.25, "copy_bytes": 10**9}
    assert peaks_from_timings("cpu", "float32", **timings, read_seconds=0.05).bytes_per_second == pytest.approx(2e10)
    assert peaks_from_timings("cpu", "float32", **timings, read_seconds=0.5).bytes_per_second == pytest.approx(8e9)


@pytest.mark.parametrize(("name", "dtype", "flops", "bandwidth"), [
    ("NVIDIA H200", "bfloat16", 989e12, 4.8e12),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12, 3.35e12),
    ("NVIDIA A100-SXM4-80GB", "float16", 312e12, 2.039e12),
    ("NVIDIA L4", "float32", None, 300e9),  # the datasheet quotes tensor-core FLOP/s at 16 bits only
    ("cpu", "float32", None, None),
])  # fmt: skip
def test_known_gpus_have_their_datasheet_peaks_beside_the_measured_ones(name, dtype, flops, bandwidth):
    assert datasheet_peaks(name, dtype) == (flops, bandwidth)
    measured = peaks_from_timings("cuda", dtype, 1.0, 1000, 1.0, 1000, device_name=name)
    assert measured.datasheet_bytes_per_second == bandwidth
    assert not math.isnan(measured.flops_per_second)


# A whole --perf session's MFU, MBU, rates, peaks, terminal table and roofline are checked on the shipped suite's
# smoke session (tests/test_report.py), which runs anyway: each session costs minutes on 2 cores.


def test_the_report_draws_the_roofline_and_each_tests_mfu_and_mbu_and_the_file_keeps_the_peaks(tmp_path):
    from perfsuite.judge.results import read_results, write_results
    from perfsuite.report.render import render_report
    from results_builders import make_result, make_results

    samples = {"output_throughput": (100.0,), PREFILL_MFU: (0.125,), "prefill_tflops": (0.125e-3,),
               "prefill_gbps": (0.01,), DECODE_MBU: (0.5,), "decode_tflops": (1e-5,), "decode_gbps": (0.05,)}  # fmt: skip
    results = make_results(make_result("t.py::test_a[paged]", samples=samples, engine_name="paged"), peaks=PEAKS)
    path = tmp_path / "results.json"
    write_results(path, results)
    assert read_results(path).peaks == PEAKS
    html = render_report(read_results(path))
    assert "12.5%" in html and "50.0%" in html and "Roofline" in html and "<svg" in html.split('id="roofline"')[1]
    bare = render_report(make_results(make_result("t.py::test_a[paged]")))
    assert "No test in this run counted its work" in bare
    write_results(path, make_results(make_result("t.py::b")))
    assert "peaks" not in json.loads(path.read_text())  # a session that measured none writes the file as before


def test_perfsuite_compare_shows_both_files_mfu_and_mbu(tmp_path, capsys):
    from perfsuite.cli import main
    from perfsuite.judge.results import write_results
    from results_builders import make_result, make_results

    def written(name: str, mbu: float):
        samples = {"output_throughput": (100.0, 101.0, 99.0), DECODE_MBU: (mbu,) * 3, "decode_gbps": (1.0,) * 3}
        path = tmp_path / name
        write_results(path, make_results(make_result("t.py::test_a[paged]", samples=samples), peaks=PEAKS))
        return str(path)

    main(["compare", written("old.json", 0.4), written("new.json", 0.2)])
    out = capsys.readouterr().out
    assert "roofs in " + str(tmp_path / "old.json") in out and "40.0%" in out and "20.0%" in out


def test_the_bench_yardstick_for_a_full_decode_step_is_the_engines_own_count_and_the_gap_between_full_steps():
    """bench/roofline.py divides perfsuite's count of a full decode step by each engine's step time, vLLM's too."""
    from bench_modules import load_bench

    roofline = load_bench("roofline")
    rows = [chunk(i, 20, 1, False) for i in range(3)]
    assert roofline.full_decode_step(3, 20, SHAPE) == step_work(rows, SHAPE)
    ends = [(0.0, 1), (0.5, 3), (0.7, 3), (1.0, 2), (1.4, 3)]
    assert roofline.full_step_seconds(ends, 3) == pytest.approx(0.4)  # gaps 0.5, 0.2, 0.4 before full steps
    assert roofline.full_step_seconds(ends[:1], 3) is None


def test_while_the_session_runs_each_family_counts_only_its_own_planned_comparisons():
    from perfsuite.judge.judge import FamilyPlan, Reference, adjust_interim_by_family, judge
    from perfsuite.judge.stats import Policy, Verdict

    baseline = Reference(utilization_result(STEADY).measurement.samples, EngineCounters(), {}, None)
    plan = FamilyPlan(headline=31, utilization=2)
    flat = judge(utilization_result(STEADY), baseline, status="compared", slo=None, policy=Policy(), plan=plan)
    earlier = [c for c in flat.result.judgement.comparisons if c.metric == "output_throughput"] * 30
    slower = judge(utilization_result(tuple(0.8 * x for x in STEADY)), baseline, status="compared", slo=None,
                   policy=Policy(), plan=plan).result.judgement.comparisons  # fmt: skip
    bounded = {c.metric: c.verdict for c in adjust_interim_by_family(slower, earlier, plan, Policy())}
    assert bounded["decode_gbps"] is Verdict.REGRESSED  # 2 planned in its family, not 33
    assert bounded["output_throughput"] is Verdict.UNCHANGED
