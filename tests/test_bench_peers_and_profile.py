"""The pure parts of bench/peers.py (its ratio lines) and bench/step_profile.py (how a step's time is split)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from bench_modules import load_bench

peers = load_bench("peers")
step_profile = load_bench("step_profile")
time_split = sys.modules[peers.StepKind.__module__]  # the module peers.py imported, so its kinds are the same
Kind = time_split.StepKind


def cell(**throughput) -> object:
    return peers.CellResult("mixed", 8, {name.replace("_", "-"): values for name, values in throughput.items()}, [0.01])


def test_the_vllm_line_gives_paged_and_inflight_over_vllm_as_medians_of_per_repeat_ratios():
    measured = cell(inflight=[100.0, 60.0, 90.0], paged=[80.0, 50.0, 120.0], vllm=[200.0, 100.0, 100.0])
    # per repeat: paged 0.4, 0.5, 1.2 -> 0.5; inflight 0.5, 0.6, 0.9 -> 0.6 (a ratio of medians would be 0.8, 0.9)
    assert peers.vllm_line(measured) == "mixed B=8: paged/vllm=0.50 inflight/vllm=0.60"
    assert peers.vllm_line(cell(inflight=[1.0], paged=[1.0])) is None, "no vLLM, no line"
    assert peers.vllm_line(cell(inflight=[50.0], vllm=[100.0])) == "mixed B=8: inflight/vllm=0.50"


def test_a_full_step_is_timed_from_the_step_before_it_and_only_when_it_decoded_the_whole_batch():
    # full decode steps of 0.5 s, 2 s and 1 s -> median 1 s; the partial and mixed steps do not count
    steps = [time_split.StepTime(kind, wall, None) for kind, wall in [
        (Kind.PREFILL, 3.0), (Kind.FULL_DECODE, 0.5), (Kind.PARTIAL_DECODE, 9.5), (Kind.FULL_DECODE, 2.0),
        (Kind.MIXED, 7.0), (Kind.FULL_DECODE, 1.0),
    ]]  # fmt: skip
    assert peers.full_step_ms(steps, batch_size=4) == pytest.approx(1000.0)
    assert peers.full_step_ms(steps[:1], batch_size=4) is None, "no full step, no figure"


@pytest.mark.parametrize(
    ("first", "outputs", "kind"),
    [(4, 4, Kind.PREFILL), (1, 4, Kind.MIXED), (0, 4, Kind.FULL_DECODE), (0, 3, Kind.PARTIAL_DECODE),
     (3, 3, Kind.PREFILL), (0, 5, Kind.FULL_DECODE)],
)  # fmt: skip
def test_a_step_is_of_the_kind_its_first_tokens_and_outputs_say(first, outputs, kind):
    assert time_split.classify(first, outputs, batch_size=4) is kind


@pytest.mark.parametrize(("first", "outputs"), [(0, 0), (5, 4), (-1, 2)])
def test_a_step_that_cannot_be_is_refused(first, outputs):
    with pytest.raises(ValueError, match="cannot hold"):
        time_split.classify(first, outputs, batch_size=4)


def test_the_recorder_tells_first_tokens_from_decodes_and_takes_the_forward_time_step_by_step(monkeypatch):
    clock = iter([10.0, 11.0, 13.0, 13.5, 14.0])  # construction, then each step's end
    monkeypatch.setattr(time_split.time, "perf_counter", lambda: next(clock))
    forward = iter([0.0, 0.6, 1.6, 2.0, 2.25])
    recorder = time_split.StepRecorder(2, forward_seconds=lambda: next(forward))
    out = [SimpleNamespace(request_id=i) for i in "abc"]
    recorder([out[0], out[1]])  # both first: a prefill
    recorder([out[0], out[1]])  # a full decode of B=2
    recorder([])  # no output: not a step seen from outside
    recorder([out[0], out[2]])  # a decode and c's first token
    recorder([out[2]])  # a partial decode
    kinds = [step.kind for step in recorder.steps]
    assert kinds == [Kind.PREFILL, Kind.FULL_DECODE, Kind.MIXED, Kind.PARTIAL_DECODE]
    assert [step.wall_s for step in recorder.steps] == pytest.approx([1.0, 2.0, 0.5, 0.5])
    assert [step.forward_s for step in recorder.steps] == pytest.approx([0.6, 1.0, 0.4, 0.25])
    totals = time_split.totals(recorder.steps)
    assert totals[Kind.FULL_DECODE].host_s == pytest.approx(1.0) and totals[Kind.FULL_DECODE].ms_per_step == 2000


def test_the_split_adds_up_to_the_run_and_says_what_came_after_the_last_step():
    steps = [time_split.StepTime(Kind.PREFILL, 1.0, 0.5), time_split.StepTime(Kind.FULL_DECODE, 2.0, 1.5)]
    rows = time_split.split_rows("paged #0", 3.25, steps)
    assert [row[1] for row in rows] == ["prefill", "full decode", "whole run"]
    whole = rows[-1]
    assert whole[2:7] == [2, 3.25, "100%", 2.0, 1.25] and whole[7] == "after the last step: 250 ms"
    assert rows[0][4] == "31%", "1 s of 3.25"
    unmeasured = time_split.split_rows("hf-cb #0", 3.0, [time_split.StepTime(Kind.PREFILL, 3.0, None)])
    assert unmeasured[0][5:7] == ["n/a", "n/a"] and unmeasured[-1][5:7] == ["n/a", "n/a"]


def test_vllms_compute_is_timed_on_vllms_model_and_sampler_only():
    vllm_model = type("LlamaForCausalLM", (), {"__module__": "vllm.model_executor.models.llama"})()
    vllm_sampler = type("Sampler", (), {"__module__": "vllm.v1.sample.sampler"})()
    hf_model = type("LlamaForCausalLM", (), {"__module__": "transformers.models.llama"})()
    ours = type("Decoder", (), {"__module__": "perfsuite.engine.layers"})()
    assert time_split.ForwardHooks.is_timed(vllm_model) and time_split.ForwardHooks.is_timed(vllm_sampler)
    assert not time_split.ForwardHooks.is_timed(hf_model) and not time_split.ForwardHooks.is_timed(ours)


def test_the_vllm_line_adds_the_full_step_speed_where_every_engine_has_one():
    measured = peers.CellResult(
        "mixed", 8, {"paged": [80.0, 90.0], "vllm": [100.0, 100.0]}, [],
        full_step_ms={"paged": [50.0, 70.0], "vllm": [40.0, None]},
    )  # fmt: skip
    # paged's median 60 ms against vllm's 40 (its repeat without a full step left out): 40 / 60 = 0.67
    assert peers.vllm_line(measured) == "mixed B=8: paged/vllm=0.85 (a full step's speed over vllm's: paged=0.67)"
    measured.full_step_ms["vllm"] = [None, None]
    assert peers.vllm_line(measured) == "mixed B=8: paged/vllm=0.85"


def test_the_machine_line_names_the_cpu_its_count_and_the_date():
    line = peers.machine_line()
    assert "CPUs" in line and line.count(",") >= 2 and line[-10:-6].isdigit()


def event(name: str, self_us: float, parent=None) -> SimpleNamespace:
    return SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_parent=parent)


def test_each_operator_counts_under_its_innermost_label_and_python_is_the_rest():
    layer = event("aten::something", 0.0)  # no label: a plain parent
    attend = event("attend", 0.0, layer)
    sdpa = event("sdpa", 0.0, attend)
    events = [
        event("aten::linear", 0.0, layer), event("aten::addmm", 300.0, layer),  # projections
        event("aten::_scaled_dot_product_flash_attention_for_cpu", 100.0, sdpa),  # innermost: sdpa, not attend
        event("aten::index", 50.0, attend), event("aten::index_put_", 30.0, attend),  # the gather and the write
        event("aten::mul", 20.0, event("norms", 0.0, layer)),
        event("aten::silu", 10.0, layer),  # other ops
        event("paged_kernel", 40.0, attend),  # the in-place kernel: no operator inside, its label's own time
        attend, sdpa,  # labels are not operators
    ]  # fmt: skip
    shares = step_profile.split_by_part(events, wall_us=1000.0)
    assert shares["projections"] == pytest.approx(0.3)
    assert shares["attention (kernel)"] == pytest.approx(0.14)
    assert shares["attention (K/V write, gather)"] == pytest.approx(0.08)
    assert shares["norms"] == pytest.approx(0.02) and shares["other ops"] == pytest.approx(0.01)
    assert shares["Python and dispatch"] == pytest.approx(0.45)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_thread_settings_are_checked():
    assert step_profile.thread_setting("1-bound") == "1-bound"
    for bad in ("0", "x", "2-pinned", "-1"):
        with pytest.raises(Exception, match="N or N-bound"):
            step_profile.thread_setting(bad)
