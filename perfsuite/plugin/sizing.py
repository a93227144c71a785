"""Engine sizes and workloads from the command line against the memory and context they need, as usage errors,
before a model loads.

``--perf-kv-blocks`` sizes a pool the model under test decides the bytes of:
``check_kv_blocks`` reads ``--perf-model``'s config.json (not its weights) and
the memory the session's device has now, and fails the session at configure
time in one line. The engines check every cache again when they are built
(``perfsuite.engine.kv_memory``), against the runner actually loaded; a test
whose cache would not fit then fails, saying which option or knob to lower
(``kv_memory_failure``). ``check_workload_context`` holds a sweep's workloads
against the model's context the same way.
"""

from __future__ import annotations

import pytest

from perfsuite.plugin.options import PerfOptions


def check_kv_blocks(options: PerfOptions, loads_a_model_here: bool) -> None:
    """A usage error when ``--perf-kv-blocks``'s pool would not fit the device this session runs on.

    ``loads_a_model_here`` is false in a process that will not load the model
    (an xdist controller, an A/B session): there a CUDA device is not asked,
    as asking would make this process hold a CUDA context all session long;
    the engines' own check in the processes that build them catches it.
    """
    from perfsuite.engine.engine import DEFAULT_KV_BLOCK_SIZE
    from perfsuite.engine.kv_memory import KVMemoryError, check_kv_memory, paged_pool

    if not options.enabled or options.kv_blocks is None:
        return
    device = _device(options.device)
    layout = _kv_layout(options)
    if device is None or layout is None or (device.startswith("cuda") and not loads_a_model_here):
        return
    try:
        check_kv_memory(paged_pool(options.kv_blocks, DEFAULT_KV_BLOCK_SIZE), layout, device)
    except KVMemoryError as error:
        raise pytest.UsageError(
            f"--perf-kv-blocks {options.kv_blocks} with {options.model} in {options.dtype}: "
            + error.message("--perf-kv-blocks")
        ) from None


def check_workload_context(options: PerfOptions) -> None:
    """A usage error when a ``--perf-config`` workload's longest request cannot fit ``--perf-model``'s context.

    The context is read from the model's config (no weights) and each
    workload's longest request is arithmetic on its parameters, so the session
    fails once here instead of each of its tests after building its prompts.
    Where the config cannot be read yet, each test checks its requests.
    """
    from perfsuite.models import context_of

    if not options.enabled or options.sweep is None:
        return
    config = _config_values(options.model)
    context = None if config is None else context_of(config)
    if context is None:
        return
    workloads = {case.workload.label: case.workload for case in options.sweep.cases()}
    for label, workload in workloads.items():
        try:
            workload.check_context(context)
        except ValueError as error:
            raise pytest.UsageError(
                f"--perf-config, workload {label} with --perf-model {options.model}: {error}"
            ) from None


def _config_values(model: str) -> dict | None:
    from perfsuite.models import ModelLoadError, config_values

    try:
        return config_values(model)
    except (ModelLoadError, ValueError):  # reported once the model loads
        return None


def _device(name: str) -> str | None:
    """The device the session will run on; None when it cannot (loading the model says why)."""
    if name == "cpu":
        return name
    from perfsuite.measure.timing import resolve_device

    try:
        return resolve_device(name)
    except ValueError:
        return None


def _kv_layout(options: PerfOptions):
    """``--perf-model``'s KV layout from its config alone (no torch, no transformers); None where it cannot be read.

    A model that cannot be read is reported when it loads, and its engines
    check their caches then.
    """
    from perfsuite.engine.kv_memory import KVLayout
    from perfsuite.models import ModelLoadError, config_values

    try:
        config = config_values(options.model)
        return None if config is None else KVLayout.of_model_config(config, options.dtype)
    except (ModelLoadError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def kv_memory_failure(error, name: str, batch_size: int, options: PerfOptions, pool_from_option: bool) -> str:
    """The line a test built by ``perf_engine_factory`` fails with when its engine's KV cache would not fit."""
    if error.sizing.knob == "num_kv_blocks":
        option = "--perf-kv-blocks" if pool_from_option else "num_kv_blocks"
    elif options.sweep is not None and batch_size in options.sweep.batch_sizes:
        option = "the batch size (sweep.batch_sizes in --perf-config)"
    else:
        option = "batch_size"
    return f"perf_engine_factory({name!r}, batch_size={batch_size}): {error.message(option)}"
