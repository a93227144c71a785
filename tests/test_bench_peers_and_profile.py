"""The pure parts of bench/peers.py (its ratio lines) and bench/step_profile.py (how a step's time is split)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench_modules import load_bench

peers = load_bench("peers")
step_profile = load_bench("step_profile")


def cell(**throughput) -> object:
    return peers.CellResult("mixed", 8, {name.replace("_", "-"): values for name, values in throughput.items()}, [0.01])


def test_the_vllm_line_gives_paged_and_inflight_over_vllm_as_medians_of_per_repeat_ratios():
    measured = cell(inflight=[100.0, 60.0, 90.0], paged=[80.0, 50.0, 120.0], vllm=[200.0, 100.0, 100.0])
    # per repeat: paged 0.4, 0.5, 1.2 -> 0.5; inflight 0.5, 0.6, 0.9 -> 0.6 (a ratio of medians would be 0.8, 0.9)
    assert peers.vllm_line(measured) == "mixed B=8: paged/vllm=0.50 inflight/vllm=0.60"
    assert peers.vllm_line(cell(inflight=[1.0], paged=[1.0])) is None, "no vLLM, no line"
    assert peers.vllm_line(cell(inflight=[50.0], vllm=[100.0])) == "mixed B=8: inflight/vllm=0.50"


def test_a_full_step_is_timed_from_the_step_before_it_and_only_when_it_gave_the_whole_batch():
    # (time, outputs): gaps into full steps of 4 are 0.5 s, 2 s and 1 s -> median 1 s; the 3-output steps do not count.
    steps = [(0.0, 4), (0.5, 4), (10.0, 3), (12.0, 4), (13.0, 4), (20.0, 2)]
    assert peers.full_step_ms(steps, batch_size=4) == pytest.approx(1000.0)
    assert peers.full_step_ms(steps, batch_size=8) is None, "no full step, no figure"
    assert peers.full_step_ms([(0.0, 4)], batch_size=4) is None, "one step has nothing before it"


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
