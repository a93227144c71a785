"""``--perf-against-if-no-baseline REF``: stored baselines where this environment has them, else A/B against REF.

``make perf`` passes ``HEAD``. On the machine class whose baselines are
shipped (``baselines/<fingerprint>/``) the session gates against them, as
plain ``--perf`` does; on any other machine, where every comparison would
be "no baseline for this environment" and the session would judge nothing,
it measures the working tree against REF side by side instead (``--perf-against
REF``), so the first command gives a verdict anywhere.

The choice is made when the options are read, before any model loads, so
this environment's fingerprint is predicted: the model, dtype and device of
the options, torch's and transformers' versions, the CPU, and the threads
the default ``perf_model`` fixture sets on a CPU (``configure_threads``:
one per CPU this process may run on). Nothing switches where A/B cannot
run: with ``--perf-save-baseline``, ``--perf-against`` given, ``--perf-ray``,
a server engine (``openai-http``), ``-n``, or a REF that names nothing (a
tree outside git with ``HEAD``): then the session gates against baselines/
as before, and the line says why it did not switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfsuite.engine.names import SERVER_ENGINES


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """What the options ask of the session, as far as the choice goes."""

    model: str
    dtype: str
    device: str  # as given: auto, cpu, cuda, cuda:N
    baseline_dir: Path
    engines: tuple[str, ...]
    against: str | None = None  # --perf-against given
    ray: str | None = None
    save_baseline: bool = False
    xdist: bool = False  # -n / --dist


@dataclass(frozen=True, slots=True)
class BaselineChoice:
    """What the session compares with: ``against`` (A/B against that REF) or None (baselines/), and why, in a line."""

    against: str | None
    line: str


def choose_comparison(ref: str, plan: SessionPlan, rootdir: Path, invocation_dir: Path) -> BaselineChoice:
    """Baselines/ when they hold this environment, else A/B against ``ref`` where it can run."""
    cannot = _why_no_switch(plan)
    if cannot is not None:
        return BaselineChoice(None, f"--perf-against-if-no-baseline {ref}: {cannot}")
    fingerprint = predicted_fingerprint(plan.model, plan.dtype, plan.device)
    from perfsuite.judge.baselines import BaselineStore

    if BaselineStore(plan.baseline_dir).holds_fingerprint(fingerprint):
        return BaselineChoice(
            None, f"baselines for this environment ({fingerprint}) in {plan.baseline_dir}: gating on them"
        )
    missing = f"no baseline for this environment ({fingerprint}) in {plan.baseline_dir}"
    from perfsuite.ab.trees import names_a_reference

    if not names_a_reference(ref, rootdir, invocation_dir):
        return BaselineChoice(
            None,
            f"{missing}, and {ref!r} names no commit or checkout here (no git?): comparing with baselines/ as "
            "--perf does, which judges nothing; record baselines with --perf-save-baseline (make baselines)",
        )
    return BaselineChoice(
        ref, f"{missing}: comparing the current tree against {ref} side by side (--perf-against {ref})"
    )


def predicted_fingerprint(model: str, dtype: str, device_option: str) -> str:
    """This environment's fingerprint as the session will capture it with the default ``perf_model`` fixture."""
    from perfsuite.measure.environment import capture_environment
    from perfsuite.measure.timing import default_num_threads, resolve_device

    device = resolve_device(device_option)
    num_threads = default_num_threads() if device == "cpu" else None  # what perf_model's configure_threads sets
    return capture_environment(model, dtype, device, num_threads).fingerprint()


def _why_no_switch(plan: SessionPlan) -> str | None:
    if plan.save_baseline:
        return "recording baselines (--perf-save-baseline): no A/B"
    if plan.against is not None:
        return f"--perf-against {plan.against} given: A/B against it"
    if plan.ray is not None:
        return "--perf-ray: comparing with baselines/ (A/B on a cluster needs --perf-against)"
    servers = [name for name in plan.engines if name in SERVER_ENGINES]
    if servers:
        return f"{', '.join(servers)} measures a server, the same for both sides: comparing with baselines/"
    if plan.xdist:
        return "-n: A/B runs one pair of workers per session: comparing with baselines/"
    return None
