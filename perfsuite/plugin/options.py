"""The ``--perf-*`` options: one group, each also settable in ``[tool.pytest.ini_options]``.

Values are parsed by ``type=`` functions, so a bad value fails while pytest
parses its arguments; bad combinations raise ``pytest.UsageError``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfsuite.adapters.http_options import (
    APIS,
    EOS_CONTROLS,
    PROMPT_FORMATS,
    HttpClientOptions,
    api_key_from_environment,
    check_endpoint,
    endpoint_url,
)
from perfsuite.adapters.registry import UnknownEngineError, check_engine_names
from perfsuite.argtypes import argument_type, engine_names, fraction, integer_at_least, number, one_of, probability
from perfsuite.engine.names import DEFAULT_ENGINES, OWN_ENGINES, SERVER_ENGINES
from perfsuite.engine.types import DECODE_MODES
from perfsuite.history import DEFAULT_LOCATION
from perfsuite.judge.instructions import DEFAULT_THRESHOLD_PERCENT
from perfsuite.judge.stats import PAIRED_MIN_EFFECT, STORED_MIN_EFFECT, Policy
from perfsuite.measure.capacity import BY_RATE, SEARCH_KINDS
from perfsuite.measure.contention import DEFAULT_THRESHOLD
from perfsuite.measure.metrics import SLO
from perfsuite.plugin.rootdir_check import check_rootdir_unmoved
from perfsuite.workload.profiles import PROFILES, Profile
from perfsuite.workload.sweep import Sweep, load_sweep

DTYPES = ("float32", "bfloat16", "float16", "float64")


# Upper bounds where a larger count would exhaust the machine (or the judge) rather than measure anything.
MAX_REPEATS = 200  # the exact tests' null distributions cost the cube of the repeats: 0.5 s a metric at 200
MAX_WORKERS_PER_SIDE = 64  # each worker process holds a copy of the model
MAX_WORKER_THREADS = 1024  # per worker; on Ray a node may have more cores than this machine, so not its CPU count
MAX_CLIENT_SHARDS = 256  # each shard is a Ray actor process; the cluster's CPUs bound it again when they start
MAX_TIMEOUT_S = 86_400.0  # a day: longer is no bound, and inf overflows the clocks the waits are computed on

repeats = integer_at_least(
    2,
    "at least 2 repeats, as a comparison needs them",
    MAX_REPEATS,
    ": the exact tests' cost grows with the cube of the repeats",
)
kv_blocks = integer_at_least(1, "a number of KV blocks")
worker_count = integer_at_least(
    1, "at least 1 worker per side", MAX_WORKERS_PER_SIDE, ": each worker holds a copy of the model"
)
client_shard_count = integer_at_least(
    1,
    "at least 1 client shard (1: the load generator in this process)",
    MAX_CLIENT_SHARDS,
    ": each shard is a Ray actor process",
)
AUTO_THREADS = "auto"


def worker_threads(text: str) -> int | str:
    """``auto``, or a number of intra-op threads (at least 1) for every A/B worker."""
    if text == AUTO_THREADS:
        return AUTO_THREADS
    return integer_at_least(1, "auto or a number of threads", MAX_WORKER_THREADS)(text)


def profile_name(text: str) -> str:
    if text not in PROFILES:
        raise argparse.ArgumentTypeError(f"unknown profile {text!r}; choose {', '.join(PROFILES)}")
    return text


def dtype_name(text: str) -> str:
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
    text = aliases.get(text, text)
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose {', '.join(DTYPES)}")
    return text


def slo_spec(text: str) -> SLO:
    try:
        return SLO.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def sweep_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"sweep config {text!r} does not exist; see examples/sweep.toml")
    return path


def server_label(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a label naming the server, e.g. vllm-0.32-cpu")
    return text.strip()


def decode_mode(text: str) -> str:
    if text not in DECODE_MODES:
        raise argparse.ArgumentTypeError(f"unknown decode mode {text!r}; choose {', '.join(DECODE_MODES)}")
    return text


def timeout_seconds(text: str) -> float:
    """Seconds, finite and positive, at most ``MAX_TIMEOUT_S``."""
    value = number(text)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds > 0 and at most {MAX_TIMEOUT_S:g} (a day), got {text!r}"
        )
    return value


NO_HISTORY = "none"


def history_location(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected a file path, a database URL (sqlite:///..., postgresql+psycopg://...) or none"
        )
    return text.strip()


def instructions_threshold(text: str) -> float:
    """A percent, above 0 and at most 100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a percent such as 0.5") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percent above 0 and at most 100, such as 0.5")
    return value


def device_name(text: str) -> str:
    if text not in ("auto", "cpu") and not text.startswith("cuda"):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")
    return text


# The one source of every --perf-* option's name, default and help: pytest's --help, the ini keys,
# PerfOptions' defaults and the docs' options page (docs/hooks/options_page.py) are all made from these.

# name, help: on/off switches, off unless given; command line only, except those in _SWITCHES_IN_INI
_SWITCHES = (
    ("perf", "run the tests marked perf"),
    (
        "perf_save_baseline",
        "store this run's samples as the baselines (a normal run never writes a baseline); "
        "the comparison with the old ones is shown but fails nothing",
    ),
    (
        "perf_send_request_ids",
        "openai-http sends perfsuite's request ids as X-Request-Id (llama.cpp rejects the header)",
    ),
    (
        "perf_strict",
        "fail the session (exit status 1) when fewer than all planned comparisons were judged (no baseline, "
        "noisy, inconclusive), and make it a usage error, instead of a warning, when the session is too large for a "
        "lone regression to be flagged; a --perf-save-baseline session records and is not failed for judging nothing",
    ),
    (
        "perf_fail_on_change_point",
        "fail the session when a new change point at the head of a test's run history (--perf-history) is a "
        "regression (one an earlier session reported fails nothing again); shown either way. Off by default: "
        "a false rate per series adds up over a session's tests and metrics (docs/change-points.md)",
    ),
    (
        "perf_batch_invariant",
        "run perfsuite's engines (static, inflight, paged, paged-prefix) batch invariant: a request's tokens are the "
        "same bits whatever else is in its batch (float32 on a CPU; docs/correctness.md). Slower; recorded among the "
        "engine knobs, so its runs are compared only with each other",
    ),
    (
        "perf_instructions",
        "run the instruction lane: perf.measure_instructions counts host instructions per engine step under Valgrind's "
        "cachegrind (engines over the fake runner, no torch) and judges them by --perf-instructions-threshold alone; "
        "off, a test that counts instructions is skipped (docs/writing-perf-tests.md)",
    ),
)
# Switches an ini file may turn on too (true/false): a CI's configuration can make every perf session strict.
_SWITCHES_IN_INI = ("perf_strict", "perf_fail_on_change_point")

# openai-http's defaults are its client's, --perf-alpha's the judge's Policy's (neither layer imports the plugin).
_HTTP_DEFAULTS = HttpClientOptions()

# name, parse, default, help: each also an ini key of the same name; default as it would be written there
_OPTIONS = (
    (
        "perf_model",
        str,
        "smollm2-135m",
        "model name or local Hugging Face directory (an unknown name, or a path that is no model directory, is a "
        "usage error)",
    ),
    ("perf_device", device_name, "auto", "auto (CUDA when available), cpu, cuda or cuda:N"),
    ("perf_dtype", dtype_name, "float32", "float32, bfloat16, float16 or float64"),
    (
        "perf_engines",
        engine_names,
        ",".join(DEFAULT_ENGINES),
        "comma-separated engines to measure: static, inflight, paged, paged-prefix (paged with prefix caching), "
        "hf-static, hf-cb, openai-http, vllm (where vLLM is installed) or one registered by a conftest.py or an "
        "entry point",
    ),
    (
        "perf_endpoint",
        argument_type(endpoint_url),
        None,
        "base URL (http://HOST:PORT) of an OpenAI-compatible server, needed by --perf-engines openai-http",
    ),
    (
        "perf_server_label",
        server_label,
        None,
        "what the server is, e.g. vllm-0.32-cpu: part of the fingerprint its baselines are stored under",
    ),
    ("perf_server_model", str, None, "the served model openai-http asks for (default: the only one served)"),
    (
        "perf_api_key",
        str,
        None,
        "API key openai-http sends as Authorization: Bearer; unset: $PERFSUITE_API_KEY, else $OPENAI_API_KEY",
    ),
    (
        "perf_prompt_format",
        one_of(PROMPT_FORMATS),
        _HTTP_DEFAULTS.prompt_format,
        "openai-http prompts as token_ids, text (detokenized; the server re-tokenizes) or auto (ids unless refused)",
    ),
    (
        "perf_eos_control",
        one_of(EOS_CONTROLS),
        _HTTP_DEFAULTS.eos_control,
        "how openai-http asks an ignore_eos request to run to max_tokens: ignore_eos, min_tokens or both",
    ),
    ("perf_api", one_of(APIS), _HTTP_DEFAULTS.api, "openai-http endpoint: completions or chat (never greedy-equal)"),
    ("perf_decode_mode", decode_mode, "packed", "runner decode path: packed, static or cuda-graph (CUDA only)"),
    (
        "perf_kv_blocks",
        kv_blocks,
        None,
        "KV blocks of 16 tokens in the pool of every paged engine perf_engine_factory builds (paged and paged-prefix "
        "only; the others have no pool and ignore it). Unset: the engine's default pool, batch size x max_seq_len tokens. "
        "A pool that --perf-model's KV cache would not fit in 90% of the device's available memory is a usage error",
    ),
    ("perf_profile", profile_name, "ci", "workload sizes and repeats: smoke, ci or full"),
    (
        "perf_repeats",
        repeats,
        None,
        "timed repeats per test (default: the profile's; with --perf-against at least enough pairs that a regression "
        "can still be flagged in a session this size when pairs against it hold a rank sum of half the pairs)",
    ),
    ("perf_baseline_dir", str, "baselines", "where baselines are stored"),
    ("perf_config", sweep_file, None, "a TOML sweep config to expand into perf tests (examples/sweep.toml)"),
    ("perf_slo", slo_spec, None, "SLOs for goodput, e.g. ttft=500ms,tpot=50ms,e2el=2s (positive, finite)"),
    (
        "perf_capacity_by",
        one_of(SEARCH_KINDS),
        BY_RATE,
        "what the capacity tests search: rate (open-loop Poisson arrivals, req/s) or concurrency (closed loop, "
        "requests in flight); either way the capacity is requests/s",
    ),
    ("perf_alpha", probability, str(Policy().alpha), "significance level, after the Benjamini-Hochberg correction"),
    (
        "perf_min_effect",
        fraction,
        None,
        f"smallest change of a median that can fail a test (default: {STORED_MIN_EFFECT:g} against stored baselines, "
        f"{PAIRED_MIN_EFFECT:g} with --perf-against)",
    ),
    (
        "perf_against",
        str,
        None,
        "a git ref (origin/main, HEAD~1, a tag) or a path to another checkout: measure it and the current tree "
        "side by side, repeats interleaved ABBA, instead of comparing with baselines/; with --perf-ray, both sides of "
        "each test on one node of the cluster (docs/ray.md)",
    ),
    (
        "perf_against_if_no_baseline",
        str,
        None,
        "a git ref or checkout as --perf-against takes: compare with baselines/ where they hold this environment, "
        "else measure the current tree against it side by side, so a machine without baselines still gets a verdict "
        "(make perf passes HEAD)",
    ),
    (
        "perf_against_workers",
        worker_count,
        "2",
        "worker processes per side under --perf-against (each holds a copy of the model); pairs rotate over them "
        "two at a time, so no one process's own speed shifts every pair",
    ),
    (
        "perf_against_threads",
        worker_threads,
        AUTO_THREADS,
        "intra-op threads of every --perf-against worker, both sides alike: auto picks, before each test, one per CPU "
        "core that other work leaves free (on a busy runner, fewer threads than cores beats oversubscribing them), "
        "or a number",
    ),
    (
        "perf_worker_timeout",
        timeout_seconds,
        "600",
        "seconds a --perf-against worker may take to answer one run, or a --perf-ray actor one test's measurement, "
        "before it is killed as hung",
    ),
    (
        "perf_ray",
        str,
        None,
        "run the measurements on Ray actors (docs/ray.md): local starts a cluster in this process, auto joins the "
        "one `ray start` runs here, or a cluster's address (ray://host:10001, host:6379); needs perfsuite[ray]",
    ),
    (
        "perf_client_shards",
        client_shard_count,
        "1",
        "with --perf-ray and --perf-engines openai-http: split each open-loop schedule over this many client actors "
        "on the cluster's nodes, round robin by request, each on the schedule's times (docs/ray.md, Client shards); "
        "1: the client runs in the pytest process, without Ray",
    ),
    ("perf_report_dir", str, "reports", "where results.json (and the report) are written"),
    (
        "perf_history",
        history_location,
        DEFAULT_LOCATION,
        "the run history every --perf session (baseline recordings too) is appended to: a SQLite file (relative to the "
        "rootdir) or a database URL such as postgresql+psycopg://user@host/db (docs/history.md); none: keep none",
    ),
    (
        "perf_instructions_threshold",
        instructions_threshold,
        str(DEFAULT_THRESHOLD_PERCENT),
        "percent by which a test's instructions per engine step may rise over its stored figure before it is a "
        "regression (--perf-instructions; a count repeats to the instruction, so no significance test)",
    ),
    (
        "perf_busy_threshold",
        probability,
        str(DEFAULT_THRESHOLD),
        "share of the machine's CPU that other work may use during a repeat before the test is noisy: inconclusive",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf", "perfsuite: LLM inference performance regression tests")
    for name, help_text in _SWITCHES:
        group.addoption(_flag(name), dest=name, action="store_true", default=False, help=argparse_help(help_text))
        if name in _SWITCHES_IN_INI:
            parser.addini(name, type="bool", default=False, help=f"{help_text} (default: false)")
    for name, parse, default, help_text in _OPTIONS:
        shown = argparse_help(f"{help_text} (default: {default})")
        group.addoption(_flag(name), dest=name, type=parse, default=None, help=shown)
        parser.addini(name, help=f"{help_text} (default: {default})", default=default)


def argparse_help(help_text: str) -> str:
    """``help_text`` as argparse expects it: argparse %-formats help, so a bare % must be %%.

    The ini keys' help (and the docs' table) take the text as it is: pytest prints those without formatting.
    """
    return help_text.replace("%", "%%")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One ``--perf-*`` option as ``pytest --help`` shows it; the docs' options page is made from these."""

    name: str  # the argparse dest, and for an option that takes a value its ini key
    help: str
    default: str | None  # as written on the command line; None: unset (a switch: off)
    takes_value: bool  # False: an on/off switch
    has_ini_key: bool  # its name is also an ini key: every option that takes a value, and a few switches
    parse: Callable[[str], Any] | None = None  # its argparse type=; None for a switch

    @property
    def flag(self) -> str:
        return _flag(self.name)


def option_specs() -> tuple[OptionSpec, ...]:
    """Every ``--perf-*`` option, the switches first, in the order ``pytest --help`` lists them."""
    switches = tuple(
        OptionSpec(name, help_text, None, False, name in _SWITCHES_IN_INI) for name, help_text in _SWITCHES
    )
    values = tuple(
        OptionSpec(name, help_text, default, True, True, parse) for name, parse, default, help_text in _OPTIONS
    )
    return switches + values


def option_default(name: str):
    """What an unset ``name`` reads as: its table default, parsed as the command line would parse it."""
    for option, parse, default, _ in _OPTIONS:
        if option == name:
            return None if default is None else parse(default)
    raise KeyError(f"no --perf-* option named {name!r}")


@dataclass(frozen=True, slots=True)
class PerfOptions:
    enabled: bool
    save_baseline: bool
    model: str
    device: str
    dtype: str
    profile: Profile
    repeats: int
    baseline_dir: Path
    report_dir: Path
    policy: Policy
    # Defaults of fields that an option sets are that option's, from _OPTIONS (tests/test_docs.py checks).
    engines: tuple[str, ...] = option_default("perf_engines")
    endpoint: str | None = option_default("perf_endpoint")
    http_client: HttpClientOptions = HttpClientOptions()
    server_label: str | None = option_default("perf_server_label")
    sweep: Sweep | None = None
    slo: SLO | None = option_default("perf_slo")
    capacity_by: str = option_default("perf_capacity_by")  # the capacity search's load, rate or concurrency
    decode_mode: str = option_default("perf_decode_mode")
    strict: bool = False
    busy_threshold: float = option_default("perf_busy_threshold")
    against: str | None = option_default("perf_against")  # --perf-against REF: A/B side by side, no baselines
    # --perf-against-if-no-baseline: whether the session gates on baselines/ or went A/B, and why (the report header)
    comparison_note: str | None = None
    worker_timeout: float = option_default("perf_worker_timeout")
    against_workers: int = option_default("perf_against_workers")  # worker processes per side
    against_threads: int | str = option_default("perf_against_threads")  # a count, or auto: chosen before each test
    ray: str | None = option_default("perf_ray")  # --perf-ray ADDRESS: measure on Ray actors
    client_shards: int = option_default("perf_client_shards")  # openai-http's load generator over N Ray actors
    repeats_given: bool = False  # --perf-repeats (or its ini key) was set: A/B mode keeps it as it is
    kv_blocks: int | None = option_default("perf_kv_blocks")  # the paged engine's pool; None: its default
    # --perf-history, resolved like report_dir: a path under the rootdir, or a URL. None (--perf-history none, and
    # options built by hand, which have no rootdir to resolve the option's default against): no history is kept.
    history_store: Path | str | None = None
    fail_on_change_point: bool = False  # a new regression at the head of a test's run history fails the session
    batch_invariant: bool = False  # --perf-batch-invariant: perfsuite's engines over a batch-invariant runner
    instructions: bool = False  # --perf-instructions: perf.measure_instructions counts under Valgrind
    instructions_threshold: float = option_default("perf_instructions_threshold")  # percent per step


def read_options(config: pytest.Config) -> PerfOptions:
    check_rootdir_unmoved(config, [_flag(name) for name, *_ in _OPTIONS])
    values = _option_values(config)
    enabled = config.getoption("perf")
    save_baseline = config.getoption("perf_save_baseline")
    if save_baseline and not enabled:
        raise pytest.UsageError("--perf-save-baseline measures perf tests, so it needs --perf as well")
    note = _against_if_no_baseline(config, values, save_baseline) if enabled else None
    instructions = config.getoption("perf_instructions")
    if instructions and not enabled:
        raise pytest.UsageError("--perf-instructions counts in perf tests, so it needs --perf as well")
    _check_modes(config, values, save_baseline)
    batch_invariant = config.getoption("perf_batch_invariant")
    if batch_invariant:
        _check_batch_invariant(values)
    sweep = _load_sweep(values["perf_config"]) if values["perf_config"] else None
    if enabled:
        _check_what_the_tests_need(values, sweep)
    options = _perf_options(config, values, enabled, save_baseline, batch_invariant, sweep)
    return dataclasses.replace(options, comparison_note=note, instructions=instructions)


def _against_if_no_baseline(config: pytest.Config, values: dict[str, Any], save_baseline: bool) -> str | None:
    """--perf-against-if-no-baseline REF: sets ``values["perf_against"]`` to REF where the session goes A/B; its line."""
    ref = values["perf_against_if_no_baseline"]
    if ref is None:
        return None
    if not ref.strip():
        raise pytest.UsageError("--perf-against-if-no-baseline needs a git ref or a checkout's path, e.g. HEAD")
    from perfsuite.plugin.no_baseline import SessionPlan, choose_comparison

    plan = SessionPlan(
        model=values["perf_model"],
        dtype=values["perf_dtype"],
        device=values["perf_device"],
        baseline_dir=Path(config.rootpath) / values["perf_baseline_dir"],
        engines=values["perf_engines"],
        against=values["perf_against"],
        ray=values["perf_ray"],
        save_baseline=save_baseline,
        xdist=hasattr(config, "workerinput")  # an xdist worker: its controller chose
        or bool(getattr(config.option, "numprocesses", None))
        or getattr(config.option, "dist", "no") != "no",
    )
    try:
        choice = choose_comparison(ref, plan, Path(config.rootpath), Path(config.invocation_params.dir))
    except ValueError as error:  # a device this machine does not have
        raise pytest.UsageError(f"--perf-device: {error}") from None
    if choice.against is not None:
        values["perf_against"] = choice.against
    return choice.line


def _option_values(config: pytest.Config) -> dict[str, Any]:
    """Each option's value: the command line's, else the ini key's, else its default; parsed."""
    values = {}
    for name, parse, default, _ in _OPTIONS:
        value = config.getoption(name)
        if value is None:
            raw = config.getini(name)
            try:
                value = parse(raw) if raw not in (None, "") else (parse(default) if default is not None else None)
            except argparse.ArgumentTypeError as error:
                raise pytest.UsageError(f"[tool.pytest.ini_options] {name} = {raw!r}: {error}") from None
        values[name] = value
    return values


def _check_modes(config: pytest.Config, values: dict[str, Any], save_baseline: bool) -> None:
    """The engines named, and the combinations of --perf-against, --perf-ray and --perf-client-shards."""
    try:
        check_engine_names(values["perf_engines"])
    except UnknownEngineError as error:
        raise pytest.UsageError(f"--perf-engines: {error}") from None
    if values["perf_against"] is not None:
        _check_against(config, values["perf_against"], save_baseline, values["perf_engines"])
    if values["perf_ray"] is not None:
        _check_ray(config, values["perf_ray"], values["perf_engines"], values["perf_client_shards"])
    if values["perf_client_shards"] > 1:
        _check_client_shards(values)


def _min_effect(values: dict[str, Any]) -> float:
    """--perf-min-effect, else the mode's default (A/B pairs see smaller changes than stored baselines)."""
    if values["perf_min_effect"] is not None:
        return values["perf_min_effect"]
    return PAIRED_MIN_EFFECT if values["perf_against"] is not None else STORED_MIN_EFFECT


def _perf_options(
    config: pytest.Config,
    values: dict[str, Any],
    enabled: bool,
    save_baseline: bool,
    batch_invariant: bool,
    sweep: Sweep | None,
) -> PerfOptions:
    """The session's options from the checked values.

    Long: one keyword per field of PerfOptions, a table read top to bottom; halves of it would be read side by side.
    """
    profile = PROFILES[values["perf_profile"]]
    rootdir = Path(config.rootpath)
    return PerfOptions(
        enabled=enabled,
        save_baseline=save_baseline,
        model=values["perf_model"],
        device=values["perf_device"],
        dtype=values["perf_dtype"],
        engines=values["perf_engines"],
        endpoint=values["perf_endpoint"],
        http_client=_http_client_options(config, values),
        server_label=values["perf_server_label"],
        sweep=sweep,
        slo=values["perf_slo"],
        capacity_by=values["perf_capacity_by"],
        decode_mode=values["perf_decode_mode"],
        profile=profile,
        repeats=values["perf_repeats"] or profile.repeats,
        baseline_dir=rootdir / values["perf_baseline_dir"],
        report_dir=rootdir / values["perf_report_dir"],
        policy=Policy(alpha=values["perf_alpha"], min_effect=_min_effect(values)),
        strict=_ini_switch(config, "perf_strict"),
        busy_threshold=values["perf_busy_threshold"],
        against=values["perf_against"],
        worker_timeout=values["perf_worker_timeout"],
        against_workers=values["perf_against_workers"],
        against_threads=values["perf_against_threads"],
        ray=values["perf_ray"],
        client_shards=values["perf_client_shards"],
        repeats_given=values["perf_repeats"] is not None,
        kv_blocks=values["perf_kv_blocks"],
        history_store=_history_store(values["perf_history"], rootdir),
        fail_on_change_point=_ini_switch(config, "perf_fail_on_change_point"),
        batch_invariant=batch_invariant,
        instructions_threshold=values["perf_instructions_threshold"],
    )


def _history_store(location: str, rootdir: Path) -> Path | str | None:
    """A URL as given; a path relative to the rootdir (as --perf-report-dir is); None for none."""
    if location.lower() == NO_HISTORY:
        return None
    if "://" in location:
        return location
    return rootdir / Path(location).expanduser()


def _ini_switch(config: pytest.Config, name: str) -> bool:
    """On when given on the command line, else as its ini key says (true/false, yes/no, 1/0)."""
    if config.getoption(name):
        return True
    try:
        return bool(config.getini(name))
    except ValueError as error:
        raise pytest.UsageError(f"[tool.pytest.ini_options] {name}: {error}; write true or false") from None


# Engines whose work another process does: both sides of an A/B comparison would measure the same server.


def _check_ray(config: pytest.Config, address: str, engines: tuple[str, ...], client_shards: int = 1) -> None:
    if not address.strip():
        raise pytest.UsageError("--perf-ray needs local, auto or a cluster's address, e.g. --perf-ray auto")
    servers = [name for name in engines if name in SERVER_ENGINES]
    if servers and client_shards == 1:
        raise pytest.UsageError(
            f"--perf-ray {address}: {', '.join(servers)} measures a server in another process, which one actor "
            "would only add a hop to; split its load over the cluster with --perf-client-shards N (N >= 2), or "
            "measure it without --perf-ray"
        )
    if address == "local" and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(
            "--perf-ray local with -n: each xdist worker would start a cluster of its own; start one with "
            "`ray start --head` and give --perf-ray auto"
        )


def _check_client_shards(values: dict) -> None:
    """Client shards split openai-http's schedule over Ray actors: they need both, and token-id prompts."""
    shards = values["perf_client_shards"]
    if values["perf_ray"] is None:
        raise pytest.UsageError(
            f"--perf-client-shards {shards} runs the load generator on Ray actors: give --perf-ray (local, auto or "
            "the cluster's address) as well, or drop --perf-client-shards"
        )
    others = [name for name in values["perf_engines"] if name not in SERVER_ENGINES]
    if others:
        raise pytest.UsageError(
            f"--perf-client-shards {shards} splits the load sent to a server, and {', '.join(others)} runs in-process "
            f"with no client to split; give --perf-engines {','.join(SERVER_ENGINES)} (or drop --perf-client-shards)"
        )
    if values["perf_api"] == "chat" or values["perf_prompt_format"] == "text":
        raise pytest.UsageError(
            f"--perf-client-shards {shards}: a client shard loads no tokenizer, so it sends token-id prompts to "
            "/v1/completions; drop --perf-api chat / --perf-prompt-format text, or measure with one client"
        )


def _check_against(config: pytest.Config, ref: str, save_baseline: bool, engines: tuple[str, ...]) -> None:
    if not ref.strip():
        raise pytest.UsageError("--perf-against needs a git ref or a checkout's path, e.g. --perf-against origin/main")
    if save_baseline:
        raise pytest.UsageError(
            f"--perf-against {ref} compares two trees side by side and neither reads nor writes baselines/: "
            "drop --perf-save-baseline (or --perf-against to record baselines)"
        )
    servers = [name for name in engines if name in SERVER_ENGINES]
    if servers:
        raise pytest.UsageError(
            f"--perf-against {ref}: {', '.join(servers)} measures a server in another process, which is the same "
            "for both sides; measure in-process engines side by side, or the server against stored baselines"
        )
    if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") != "no":
        raise pytest.UsageError(
            f"--perf-against {ref}: one pair of workers per session (two model copies); drop -n/--dist"
        )


BATCH_INVARIANT_ENGINES = OWN_ENGINES  # perfsuite's own, over its runner


def _check_batch_invariant(values: dict) -> None:
    """--perf-batch-invariant is a mode of perfsuite's runner in this process: refused where it would not apply."""
    others = [name for name in values["perf_engines"] if name not in BATCH_INVARIANT_ENGINES]
    if others:
        raise pytest.UsageError(
            f"--perf-batch-invariant is a mode of perfsuite's engines ({', '.join(BATCH_INVARIANT_ENGINES)}); "
            f"{', '.join(others)} would run as they always do: drop them from --perf-engines"
        )
    for option, value, where in (
        ("perf_against", values["perf_against"], "the --perf-against workers build their runners without it"),
        ("perf_ray", values["perf_ray"], "the --perf-ray actors build their runners without it"),
    ):
        if value is not None:
            raise pytest.UsageError(
                f"--perf-batch-invariant with --{option.replace('_', '-')}: {where} (not yet "
                "supported); measure batch-invariant runs in a session of their own"
            )
    if values["perf_decode_mode"] != "packed":
        raise pytest.UsageError(
            f"--perf-batch-invariant runs the packed decode path, not --perf-decode-mode {values['perf_decode_mode']}"
        )
    if values["perf_dtype"] != "float32" or values["perf_device"].startswith("cuda"):
        raise pytest.UsageError(
            f"--perf-batch-invariant needs float32 on a CPU (--perf-dtype float32 --perf-device cpu), not "
            f"{values['perf_dtype']} on {values['perf_device']}: on CUDA torch has no batch-invariant eager "
            "operators (docs/correctness.md)"
        )


def _check_what_the_tests_need(values: dict, sweep: Sweep | None) -> None:
    """The model (a known name or a directory) and the server's URL, checked once here rather than failing every
    test that needs them.

    Only for ``--perf``: a plain run measures nothing, so an ini file may name
    a model directory or server engine that only the perf job has.
    """
    from perfsuite.models import check_model_path

    try:
        check_model_path(values["perf_model"])
    except ValueError as error:
        raise pytest.UsageError(f"--perf-model: {error}") from None
    try:
        check_endpoint((*values["perf_engines"], *(sweep.engines if sweep else ())), values["perf_endpoint"])
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def _http_client_options(config: pytest.Config, values: dict) -> HttpClientOptions:
    return HttpClientOptions(
        server_model=values["perf_server_model"],
        api_key=values["perf_api_key"] or api_key_from_environment(),
        prompt_format=values["perf_prompt_format"],
        eos_control=values["perf_eos_control"],
        api=values["perf_api"],
        send_request_ids=config.getoption("perf_send_request_ids"),
    )


def _load_sweep(path: Path) -> Sweep:
    try:
        sweep = load_sweep(path)
        check_engine_names(tuple(sweep.engines))
    except ValueError as error:  # UnknownEngineError is one
        raise pytest.UsageError(f"--perf-config: {error}") from None
    return sweep
