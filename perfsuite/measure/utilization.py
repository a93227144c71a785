"""How close a run came to the machine's roofs: prefill MFU, decode MBU and the achieved rates.

From the work the engine counted in each step (``StepTrace.work``,
``perfsuite.engine.work``) and the step's time. A step's time goes to its
kinds by their share of its FLOPs: a mixed step's prefill part takes the
time its prefill FLOPs would, the decode part the rest. Over a run, per kind:

- achieved FLOP/s = FLOPs / seconds, achieved bytes/s = bytes moved / seconds
  (weights read, keys and values read and written);
- prefill MFU = prefill's achieved FLOP/s / peak FLOP/s;
- decode MBU = decode's achieved bytes/s / peak bytes/s (Databricks' MBU, with
  the keys and values written counted too);

the peaks are this machine's, measured (``perfsuite.measure.peaks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsuite.engine.types import RunResult
from perfsuite.measure.peaks import MachinePeaks

KINDS = ("prefill", "decode")
# Per-repeat sample keys (higher is better): the share of the peaks, and the achieved rates. The session judges
# prefill's FLOP/s and decode's bytes/s (perfsuite.judge.catalogue.UTILIZATION_METRICS says why not MFU and MBU).
PREFILL_MFU = "prefill_mfu"
DECODE_MBU = "decode_mbu"
PREFILL_FLOPS_PER_SECOND = "prefill_tflops"
DECODE_BYTES_PER_SECOND = "decode_gbps"
UTILIZATION_KEYS = (
    PREFILL_MFU,
    DECODE_MBU,
    PREFILL_FLOPS_PER_SECOND,
    "prefill_gbps",
    "decode_tflops",
    DECODE_BYTES_PER_SECOND,
)


@dataclass(frozen=True, slots=True)
class KindRates:
    """One kind's work over a run and the seconds it took."""

    flops: int
    bytes_moved: int
    seconds: float

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else float("nan")

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_moved / self.seconds if self.seconds > 0 else float("nan")

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved: where the kind sits on the roofline's x axis."""
        return self.flops / self.bytes_moved if self.bytes_moved else float("nan")


def run_rates(run: RunResult) -> dict[str, KindRates] | None:
    """Each kind's work and seconds over ``run``; None when its engine counted no work (a peer, a fake runner)."""
    if not any(step.work is not None for step in run.steps):
        return None
    totals = {kind: [0, 0, 0.0] for kind in KINDS}
    for step in run.steps:
        if step.work is None:
            continue
        parts = {"prefill": step.work.prefill, "decode": step.work.decode}
        step_flops = step.work.total.flops
        for kind, work in parts.items():
            share = work.flops / step_flops if step_flops else 0.0
            totals[kind][0] += work.flops
            totals[kind][1] += work.bytes_moved
            totals[kind][2] += share * (step.end_time - step.start_time)
    return {kind: KindRates(int(f), int(b), s) for kind, (f, b, s) in totals.items()}


def utilization_samples(run: RunResult, peaks: MachinePeaks | None) -> dict[str, float]:
    """One repeat's achieved rates (TF/s, GB/s per kind) and, with ``peaks``, prefill MFU and decode MBU.

    A kind the run did not do is left out (no NaN is stored).
    """
    rates = run_rates(run)
    if rates is None:
        return {}
    samples: dict[str, float] = {}
    for kind, rate in rates.items():
        if rate.seconds > 0 and rate.flops:
            samples[f"{kind}_tflops"] = rate.flops_per_second / 1e12
            samples[f"{kind}_gbps"] = rate.bytes_per_second / 1e9
    if peaks is not None:
        if "prefill_tflops" in samples:
            samples[PREFILL_MFU] = rates["prefill"].flops_per_second / peaks.flops_per_second
        if "decode_gbps" in samples:
            samples[DECODE_MBU] = rates["decode"].bytes_per_second / peaks.bytes_per_second
    return samples
