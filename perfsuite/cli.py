"""``perfsuite`` command line: ``run`` measures engines on a workload; ``report``, ``summary`` and ``compare``
read results; ``history`` keeps the run history (``history import`` brings earlier results files into it)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perfsuite.adapters import UnknownEngineError, check_engine_names
from perfsuite.adapters.http_options import (
    APIS,
    EOS_CONTROLS,
    PROMPT_FORMATS,
    HttpClientOptions,
    api_key_from_environment,
    check_endpoint,
    endpoint_url,
)
from perfsuite.argtypes import (
    argument_type,
    engine_names,
    fraction,
    integer_at_least,
    positive_int,
    positive_number,
    probability,
    thread_count,
)
from perfsuite.engine import RunResult
from perfsuite.engine.names import DEFAULT_ENGINES, INFLIGHT, OPENAI_HTTP
from perfsuite.history import DEFAULT_LOCATION
from perfsuite.history.series import SERIES_METRICS
from perfsuite.measure.metrics import RunMetrics, run_metrics
from perfsuite.measure.quantiles import DEFAULT_CONFIDENCE, PercentileInterval, percentile_interval
from perfsuite.models import DEFAULT_MODEL
from perfsuite.report.server_metrics import server_metrics_line
from perfsuite.report.table import format_table, memory_table, prefix_cache_table, utilization_table
from perfsuite.workload import (
    Arrivals,
    ShapedWorkload,
    ShippedPrompts,
    SyntheticPrompts,
    Trace,
    Vocab,
    Workload,
    mixed_workload,
    parse_prompts,
    parse_workload_option,
)

if TYPE_CHECKING:
    from perfsuite.adapters import Backend, EngineConfig
    from perfsuite.engine import Request
    from perfsuite.judge.results import Results
    from perfsuite.models import LoadedModel
    from perfsuite.workload import PromptSource


MAX_NUM_REQUESTS = 100_000
MAX_PORT = 65_535


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's parser; each ``_add_*`` adds one command's."""
    parser = argparse.ArgumentParser(prog="perfsuite", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run_command(commands)
    _add_report_commands(commands)
    _add_history_command(commands)
    _add_serve_command(commands)
    _add_init_command(commands)
    return parser


def _add_run_command(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="run the default mixed workload on static and in-flight engines and print a table",
        description="Shipped prompts (or --prompt-len synthetic ones), max_new_tokens uniform in [min, max] (seeded), "
        "EOS ignored, all at t0 (or --request-rate, --concurrency); or --workload: shared-prefix groups, "
        "multi-turn chat or a replayed trace (docs/workloads.md).",
    )
    run.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or local directory (default {DEFAULT_MODEL})")
    run.add_argument(
        "--engines",
        type=_known_engines,
        default=DEFAULT_ENGINES,
        help="comma-separated engines, e.g. static,inflight,hf-static,hf-cb, or openai-http with --endpoint "
        "(default: static,inflight)",
    )
    run.add_argument("--batch-size", type=positive_int, default=8, help="static batch / in-flight decode batch (8)")
    run.add_argument("--prefill-batch-size", type=positive_int, help="in-flight: new requests per step (default: B)")
    run.add_argument("--token-budget", type=positive_int, help="in-flight: max tokens per step (default: no limit)")
    _add_workload_arguments(run)
    run.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    run.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or float64")
    run.add_argument("--threads", type=thread_count, help="torch intra-op threads (default: one per core)")
    run.add_argument("--no-progress", action="store_true", help="do not print progress to stderr")
    _add_server_client_arguments(run)
    run.set_defaults(command_parser=run)  # for errors of combinations, with run's usage line


def _add_workload_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--num-requests",
        type=integer_at_least(1, "a positive integer", MAX_NUM_REQUESTS, ": the workload is built before it runs"),
        help="requests in the default workload (32)",
    )
    run.add_argument("--min-new-tokens", type=positive_int, help="shortest output of the default workload (8)")
    run.add_argument("--max-new-tokens", type=positive_int, help="longest output of the default workload (128)")
    run.add_argument(
        "--workload",
        type=argument_type(parse_workload_option),
        metavar="KIND:KEY=VALUE,...",
        help="instead of the default workload: shared_prefix:groups=8,prompts=8,prefix=256,suffix=32,output=32; "
        "multi_turn:sessions=4,turns=3,prompt=64,message=32,output=32,think_time=0; "
        "trace:FILE[,block_size=512,time_scale=1,max_requests=N] (docs/workloads.md)",
    )
    run.add_argument(
        "--prompt-len",
        type=argument_type(prompt_lengths),
        metavar="N|LOW:HIGH",
        help="prompt tokens of the default workload: N, or uniform in LOW..HIGH (synthetic; default: shipped prompts)",
    )
    run.add_argument("--seed", type=int, default=0, help="workload seed: prompts, lengths and arrivals (0)")
    _add_arrival_arguments(run)


def _add_arrival_arguments(run: argparse.ArgumentParser) -> None:
    """When requests are sent: all at t0 (the default), open-loop at a rate, or a closed loop of N clients."""
    run.add_argument(
        "--request-rate",
        type=positive_number,
        metavar="REQ_PER_S",
        help="open loop: Poisson arrivals at this many requests/s (default: every request at t0)",
    )
    run.add_argument(
        "--burstiness",
        type=positive_number,
        help="with --request-rate: gamma-shaped gaps, 1 Poisson, below 1 burstier, above 1 smoother (1)",
    )
    run.add_argument(
        "--concurrency",
        type=positive_int,
        metavar="N",
        help="closed loop: N clients, each sending its next request when its last one finishes",
    )


def _add_server_client_arguments(run: argparse.ArgumentParser) -> None:
    """How ``--engines openai-http`` reaches its server: the pytest options ``--perf-endpoint`` and neighbours."""
    group = run.add_argument_group("openai-http", "for --engines openai-http: the server to measure")
    group.add_argument(
        "--endpoint",
        type=argument_type(endpoint_url),
        help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000 (required by openai-http)",
    )
    group.add_argument("--server-model", help="the served model to ask for (default: the only one served)")
    group.add_argument(
        "--api-key", help="sent as Authorization: Bearer (default: $PERFSUITE_API_KEY, else $OPENAI_API_KEY)"
    )
    group.add_argument(
        "--prompt-format",
        choices=PROMPT_FORMATS,
        default="auto",
        help="prompts as token_ids, text, or auto: ids unless the server refuses them (auto)",
    )
    group.add_argument(
        "--eos-control",
        choices=EOS_CONTROLS,
        default="both",
        help="how a request is asked to run to its length: ignore_eos, min_tokens or both (both)",
    )
    group.add_argument("--api", choices=APIS, default="completions", help="completions or chat (completions)")
    group.add_argument(
        "--send-request-ids",
        action="store_true",
        help="send perfsuite's request ids as X-Request-Id (llama.cpp rejects the header)",
    )


def _check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations that cannot work fail here, before a model is loaded."""
    try:
        check_endpoint(args.engines, args.endpoint)
    except ValueError as error:
        parser.error(_in_run_flags(str(error)))
    if args.endpoint and OPENAI_HTTP not in args.engines:
        parser.error(f"--endpoint is used only by --engines openai-http; add it to --engines {','.join(args.engines)}")
    default_workload_flags = [
        flag
        for flag, value in (
            ("--num-requests", args.num_requests),
            ("--min-new-tokens", args.min_new_tokens),
            ("--max-new-tokens", args.max_new_tokens),
            ("--prompt-len", args.prompt_len),
        )
        if value is not None
    ]
    if args.workload is not None and default_workload_flags:
        parser.error(
            f"{', '.join(default_workload_flags)} size the default workload, which --workload replaces; "
            "set those sizes in --workload's KEY=VALUE list"
        )
    problem = _arrival_problem(args)
    if problem is not None:
        parser.error(problem)


def _arrival_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arrival flags together (each alone is checked as it is parsed), or None."""
    if args.request_rate is not None and args.concurrency is not None:
        return (
            "--request-rate and --concurrency are two ways to send: open loop at a rate, or a closed loop of N "
            "clients; give one of them"
        )
    if args.burstiness is not None and args.request_rate is None:
        return "--burstiness shapes the gaps between arrivals at a rate; add --request-rate, or drop --burstiness"
    if isinstance(args.workload, Trace) and (args.request_rate is not None or args.concurrency is not None):
        return "a trace's timestamps are its arrivals: drop --request-rate and --concurrency (scale with time_scale)"
    if args.concurrency is not None and OPENAI_HTTP in args.engines and args.concurrency > args.batch_size:
        return (
            f"--concurrency {args.concurrency} needs as many connections, and openai-http opens at most "
            f"--batch-size ({args.batch_size}); raise --batch-size to {args.concurrency} or lower --concurrency"
        )
    return None


def _arrivals(args: argparse.Namespace) -> Arrivals:
    if args.request_rate is not None:
        return Arrivals(rate=args.request_rate, burstiness=args.burstiness or 1.0)
    return Arrivals(concurrency=args.concurrency)


def _http_client_options(args: argparse.Namespace) -> HttpClientOptions:
    return HttpClientOptions(
        server_model=args.server_model,
        api_key=args.api_key or api_key_from_environment(),
        prompt_format=args.prompt_format,
        eos_control=args.eos_control,
        api=args.api,
        send_request_ids=args.send_request_ids,
    )


# Errors of the openai-http client name the pytest options; `perfsuite run` has its own names for them.
_RUN_FLAGS = {
    "--perf-engines": "--engines",
    "--perf-endpoint": "--endpoint",
    "--perf-server-model": "--server-model",
    "--perf-api-key": "--api-key",
    "--perf-prompt-format": "--prompt-format",
    "--perf-eos-control": "--eos-control",
    "--perf-send-request-ids": "--send-request-ids",
    "--perf-api": "--api",
}


def prompt_lengths(text: str) -> PromptSource:
    """``--prompt-len``: ``N`` tokens, or ``LOW:HIGH`` uniform; the workload's own checks judge the numbers."""
    low, colon, high = text.partition(":")
    try:
        table = (
            {"kind": "uniform", "low": int(low), "high": int(high)} if colon else {"kind": "fixed", "tokens": int(low)}
        )
    except ValueError:
        raise ValueError(
            f"expected N or LOW:HIGH, whole numbers of prompt tokens (e.g. 128 or 64:256), got {text!r}"
        ) from None
    return parse_prompts(table)


# The default workload's fields, as its checks name them, and the flags that set them.
_DEFAULT_WORKLOAD_FLAGS = {
    "prompts.high": "--prompt-len",
    "prompts.low": "--prompt-len",
    "output_lengths.high": "--max-new-tokens",
    "output_lengths.low": "--min-new-tokens",
    "arrivals.rate": "--request-rate",
    "num_requests": "--num-requests",
}


def _in_run_flags(message: str, default_workload: bool = False) -> str:
    """``message`` in ``run``'s flags: the pytest options', and (``default_workload``) the workload fields'."""
    flags = {**_RUN_FLAGS, **(_DEFAULT_WORKLOAD_FLAGS if default_workload else {})}
    for name, run_flag in flags.items():
        message = message.replace(name, run_flag)
    return message


def _known_engines(text: str) -> tuple[str, ...]:
    try:
        return check_engine_names(engine_names(text))
    except UnknownEngineError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_report_commands(commands) -> None:
    report = commands.add_parser(
        "report",
        help="render the HTML report from a results.json",
        description="Re-render the self-contained HTML report that `pytest --perf` writes, from its results.json.",
    )
    report.add_argument("results", type=Path, help="a results.json written by `pytest --perf`")
    report.add_argument("-o", "--output", type=Path, help="HTML file to write (default: report.html beside RESULTS)")
    report.add_argument(
        "--history",
        metavar="LOCATION",
        help="draw each test's trend from this run history store, a SQLite file or a database URL, as "
        f"--perf-history takes (e.g. {DEFAULT_LOCATION}; default: no trend)",
    )
    _add_summary_command(commands)
    compare = commands.add_parser(
        "compare",
        help="judge NEW against OLD and print the verdict table",
        description="Compare every test present in both files per metric (one-sided Mann-Whitney U on the "
        "per-repeat samples, Benjamini-Hochberg-adjusted over all comparisons). Exit status 1 when a metric regressed "
        "(with --strict, also when not every comparison was judged). The last line says how many were.",
    )
    compare.add_argument("old", type=Path, help="results.json of the baseline run")
    compare.add_argument("new", type=Path, help="results.json of the run to judge")
    compare.add_argument("-o", "--output", type=Path, help="also write the HTML report of NEW against OLD")
    compare.add_argument(
        "--alpha", type=probability, help="significance level after Benjamini-Hochberg (default: NEW's policy)"
    )
    compare.add_argument("--min-effect", type=fraction, help="smallest change that counts, 0.1 = 10%% (default: NEW's)")
    compare.add_argument(
        "--strict",
        action="store_true",
        help="exit status 1 when fewer than all comparisons were judged (a test not in OLD or of another "
        "configuration, noisy, inconclusive), as pytest's --perf-strict",
    )


def _add_summary_command(commands) -> None:
    summary = commands.add_parser(
        "summary",
        help="print a results.json's verdicts as Markdown, as reports/summary.md has them",
        description="Print the Markdown summary `pytest --perf` writes to reports/summary.md (and to "
        "$GITHUB_STEP_SUMMARY when set): the overall verdict, the judged line, a row per compared metric.",
    )
    summary.add_argument("results", type=Path, help="a results.json written by `pytest --perf`")


def _add_serve_command(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve perfsuite's in-flight or paged engine over an OpenAI-compatible HTTP API",
        description="POST /v1/completions and /v1/chat/completions (streamed or not, greedy), GET /v1/models, "
        "GET /health and GET /metrics (Prometheus, vLLM's metric names). "
        "Measure it with `pytest --perf --perf-engines openai-http --perf-endpoint http://HOST:PORT`.",
    )
    serve.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or local directory ({DEFAULT_MODEL})")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument(
        "--port", type=integer_at_least(0, "a TCP port", MAX_PORT), default=8000, help="0 for any free (8000)"
    )
    serve.add_argument(
        "--engine",
        default=INFLIGHT,
        help="inflight, paged, or paged-prefix: paged with prefix "
        "caching, whose hits usage.prompt_tokens_details.cached_tokens and /metrics show (inflight)",
    )
    serve.add_argument("--batch-size", type=positive_int, default=8, help="decode batch (8)")
    serve.add_argument("--max-seq-len", type=positive_int, help="prompt + output tokens (min(2048, context))")
    serve.add_argument("--max-open-requests", type=positive_int, default=256, help="more get HTTP 429 (256)")
    serve.add_argument(
        "--served-model-name",
        help="the model name in /v1/models and requests; requests naming "
        "another get 404 (default: the model's short name)",
    )
    serve.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    serve.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or float64")
    serve.add_argument("--threads", type=thread_count, help="torch intra-op threads (default: one per core)")
    serve.add_argument(
        "--no-request-log",
        dest="request_log",
        action="store_false",
        help="log no line per request (default: one line per request to stderr: method, path, status, ids, "
        "tokens, TTFT, duration, finish reason)",
    )


def _add_init_command(commands) -> None:
    init = commands.add_parser(
        "init",
        help="write a starter conftest.py, perf test, equivalence test and CI workflow into your project",
        description="Write conftest.py (how to register your engine), tests/test_perf.py, tests/test_equivalence.py "
        "and .github/workflows/perf.yml (A/B against the base branch on pull requests) into DIR. Refuses, writing "
        "nothing, when any of them exists.",
    )
    init.add_argument("directory", type=Path, nargs="?", default=Path("."), help="your project's root (.)")
    init.add_argument("--engine", default="my-engine", help="the name your engine is registered under (my-engine)")
    init.add_argument(
        "--perfsuite-source",
        required=True,
        metavar="SOURCE",
        help="where the workflow's runner installs perfsuite from: a git URL pinned to a commit "
        "(git+https://github.com/you/perfsuite@<commit>), or a wheel's or a checkout's path on the runner; "
        "required, since a bare name installs whatever a package index serves under it",
    )


def _add_history_command(commands) -> None:
    history = commands.add_parser(
        "history",
        help="the run history that `pytest --perf` appends each session to: import, and each test's series and "
        "change points (docs/history.md)",
        description="The run history: a SQLite file or a database URL (--perf-history) holding every session's "
        "results; one series per test, metric, environment fingerprint and run configuration, with the change "
        "points Apache Otava finds in each (docs/change-points.md).",
    )
    actions = history.add_subparsers(dest="history_command", required=True, metavar="ACTION")
    importing = actions.add_parser(
        "import",
        help="append results.json files (written before the store, or on another machine) to the store",
        description="Append each results file (a directory: its *.json files) to the store, any schema version. A "
        "session the store holds already is not added twice; a file that cannot be read is named and the rest "
        "imported (exit status 2).",
    )
    importing.add_argument("paths", nargs="+", type=Path, metavar="FILE_OR_DIR", help="results files or folders")
    importing.add_argument(
        "--store",
        default=DEFAULT_LOCATION,
        metavar="LOCATION",
        help=f"a SQLite file or a database URL, as --perf-history takes ({DEFAULT_LOCATION})",
    )
    show = actions.add_parser(
        "show",
        help="list each series (or those of tests matching -k): its runs and its change points",
        description="Each series: its fingerprint and configuration in short form, its runs (commit, date, the "
        "median over the repeats, probe-normalised) and its change points (commit range, size, p, regression or "
        "improvement).",
    )
    show.add_argument(
        "--store",
        default=DEFAULT_LOCATION,
        metavar="LOCATION",
        help=f"the history store, a SQLite file or a database URL, as --perf-history takes ({DEFAULT_LOCATION})",
    )
    show.add_argument("-k", dest="keyword", metavar="SUBSTRING", help="only tests whose id contains SUBSTRING")
    show.add_argument("--metric", choices=sorted(SERIES_METRICS), help="only this metric (default: every one)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        _check_run_arguments(args.command_parser, args)
    commands = {
        "run": _run,
        "report": _report,
        "summary": _summary,
        "compare": _compare,
        "serve": _serve,
        "init": _init,
        "history": _history,
    }
    try:
        return commands[args.command](args)
    except (ValueError, RuntimeError) as error:
        message = _in_run_flags(str(error), args.workload is None) if args.command == "run" else str(error)
        print(f"perfsuite: error: {message}", file=sys.stderr)
        return 2


def _history_import(args: argparse.Namespace) -> int:
    from perfsuite.history.store import HistoryStore

    with HistoryStore.open(args.store) as store:
        report = store.import_files(args.paths)
    for problem in report.problems:
        print(f"perfsuite: error: {problem}", file=sys.stderr)
    print(f"imported {report.num_imported} session(s) into {store.location} ({report.num_duplicates} already there)")
    return 2 if report.problems else 0


def _init(args: argparse.Namespace) -> int:
    from perfsuite.scaffold import write_project

    for path in write_project(args.directory, args.engine, args.perfsuite_source):
        print(f"wrote {path}")
    print(
        f"next: register {args.engine!r} (conftest.py says how), then `pytest --perf --perf-model tiny-random "
        "--perf-profile smoke` and `pytest tests/test_equivalence.py`"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from perfsuite.serve import ServeOptions, serve

    options = ServeOptions(
        model=args.model,
        host=args.host,
        port=args.port,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        dtype=args.dtype,
        device=args.device,
        threads=args.threads,
        max_open_requests=args.max_open_requests,
        served_model_name=args.served_model_name,
        engine=args.engine,
        request_log=args.request_log,
    )
    return serve(options)


def _report(args: argparse.Namespace) -> int:
    from perfsuite.judge.results import read_results
    from perfsuite.report.render import MAX_HISTORY_RUNS, render_report

    results = read_results(args.results)
    history: list[Results] = []
    if args.history is not None:
        from perfsuite.history.store import read_sessions

        history = read_sessions(args.history, fingerprint=results.fingerprint, newest=MAX_HISTORY_RUNS)
    _write_output(args.output or args.results.with_name("report.html"), render_report(results, history))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from perfsuite.judge.compare import judged_tally
    from perfsuite.judge.results import read_results
    from perfsuite.report.summary import summary_markdown

    results = read_results(args.results)
    print(summary_markdown(results, judged_tally(results)), end="")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from perfsuite.judge.compare import judged_tally, policy_of, rejudge
    from perfsuite.judge.results import read_results
    from perfsuite.report.render import render_report
    from perfsuite.report.verdict_table import overall_verdict, verdict_table

    old, new = read_results(args.old), read_results(args.new)
    judged = rejudge(old, new, policy_of(new, args.alpha, args.min_effect), old_name=str(args.old))
    verdicts = verdict_table(judged.tests, paired=judged.against is not None)
    print(verdicts.text())
    utilization = (utilization_table(old.tests, str(args.old)), utilization_table(judged.tests, str(args.new)))
    for table in (memory_table(judged.tests), prefix_cache_table(judged.tests), *utilization):
        if table is not None:
            print(table)
    for warning in judged.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    verdict = overall_verdict(verdicts.rows)
    print(f"overall: {verdict}")
    if args.output is not None:
        _write_output(args.output, render_report(judged))
    tally = judged_tally(judged)
    if args.strict and not tally.all_judged:
        print(
            f"perfsuite compare --strict: {tally.num_planned - tally.num_judged} of {tally.num_planned} "
            "comparisons were not judged: exit status 1"
        )
    print(tally.line())
    return 1 if verdict == "regressed" or (args.strict and not tally.all_judged) else 0


def _history(args: argparse.Namespace) -> int:
    actions = {"import": _history_import, "show": _history_show}
    return actions[args.history_command](args)


def _history_show(args: argparse.Namespace) -> int:
    from perfsuite.history.changes import detect
    from perfsuite.history.series import build_series
    from perfsuite.report.history_listing import history_listing

    sessions = load_sessions(args)
    metrics = {args.metric: SERIES_METRICS[args.metric]} if args.metric else SERIES_METRICS
    series = [s for s in build_series(sessions, metrics=metrics) if not args.keyword or args.keyword in s.key.test_id]
    if not series:
        wanted = f"of tests matching -k {args.keyword!r}" if args.keyword else "of any test"
        raise ValueError(
            f"no series {wanted} in the {len(sessions)} sessions of {args.store}; "
            "`perfsuite history show` without -k lists every one"
        )
    print(history_listing([detect(s) for s in series]))
    return 0


def load_sessions(args: argparse.Namespace) -> list[Results]:
    """The sessions ``history show`` reads from the store ``--store`` names, oldest first."""
    from perfsuite.history.location import resolve
    from perfsuite.history.store import HistoryError, read_sessions

    sessions = read_sessions(args.store)
    if not sessions:
        shown = resolve(args.store).shown  # a URL without its password
        raise HistoryError(f"{shown}: the history store holds no session yet; run `pytest --perf` first")
    return sessions


def _write_output(path: Path, text: str) -> None:
    """The file ``-o`` names; OutputError, one line saying why, where it cannot be written.

    Not ``write_text_atomic``: that clears stale temporary files from the
    directory it writes into, which is right for perfsuite's own directories
    but not for any folder a user names.
    """
    from perfsuite.judge.baselines import OutputError, cannot_write_message

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise OutputError(cannot_write_message(path, error, "pass -o a file in a writable directory")) from None
    print(f"wrote {path}")


def _run(args: argparse.Namespace) -> int:
    from perfsuite.adapters import Backend, EngineConfig
    from perfsuite.measure.timing import configure_threads, max_seq_len_for, resolve_device
    from perfsuite.models import load_model

    workload = _workload(args)
    _check_context_before_load(args.model, workload)
    http_options = _http_client_options(args)
    if args.endpoint:
        _check_server(args.endpoint, http_options)  # seconds, where loading the model takes tens of them
    device = resolve_device(args.device)
    threads = configure_threads(args.threads) if device == "cpu" else None
    started = time.perf_counter()
    loaded = load_model(args.model, device=device, dtype=args.dtype)
    _say_loaded(args, loaded, device, threads, time.perf_counter() - started, workload)
    workload.check_context(loaded.max_context)  # before any prompt is built
    backend = Backend.from_loaded(loaded, endpoint=args.endpoint, http_options=http_options)
    requests = _run_requests(workload, loaded, backend)
    config = EngineConfig(
        args.batch_size, max_seq_len_for(requests, loaded.max_context), args.prefill_batch_size, args.token_budget
    )
    rows, cache_lines = [], []
    for kind in args.engines:
        result = _timed_engine_run(args, kind, backend, config, requests, device)
        metrics = run_metrics(result)
        rows.append(_row(result, metrics))
        cache_lines.append(prefix_cache_line(result, metrics))
        if kind == OPENAI_HTTP:
            cache_lines.append(server_metrics_line(result.engine_name, 1e3 * metrics.ttft.mean, result.server_metrics))
    print(format_table(HEADERS, rows))
    for line in filter(None, cache_lines):
        print(line)
    return 0


def _say_loaded(
    args: argparse.Namespace,
    loaded: LoadedModel,
    device: str,
    threads: int | None,
    load_s: float,
    workload: Workload | ShapedWorkload,
) -> None:
    print(
        f"perfsuite run: {loaded.spec.name} {args.dtype} on {device}"
        + (f" ({threads} threads)" if threads else "")
        + f", loaded in {load_s:.1f}s; {workload.num_requests} requests, "
        + _described(workload)
        + f" (seed {workload.seed}), B={args.batch_size}",
        file=sys.stderr,
    )


def _run_requests(workload: Workload | ShapedWorkload, loaded: LoadedModel, backend: Backend) -> list[Request]:
    """The workload's requests: synthetic ids over the backend's vocabulary, or text through the tokenizer."""
    assert backend.vocab_size is not None  # Backend.from_loaded reads it from the model and its tokenizer
    vocab = Vocab(backend.vocab_size, backend.special_token_ids)
    if isinstance(workload, ShapedWorkload):
        return workload.requests(vocab=vocab)
    if isinstance(workload.prompts, SyntheticPrompts):
        return workload.requests(vocab=vocab)
    return workload.requests(lambda text: loaded.tokenizer(text)["input_ids"])


def _timed_engine_run(
    args: argparse.Namespace, kind: str, backend: Backend, config: EngineConfig, requests: list[Request], device: str
) -> RunResult:
    """One engine of ``--engines``: built, checked for follow-ups, warmed up, then timed with a progress bar."""
    from perfsuite.adapters.protocol import check_serves_follow_ups
    from perfsuite.measure.timing import timed_run, warm_up

    engine = _built(kind, backend, config)
    check_serves_follow_ups(engine, requests)
    warm_up(engine, requests)
    progress = None if args.no_progress else Progress(kind, len(requests))
    result = timed_run(engine, requests, device, on_step=progress, max_concurrency=args.concurrency)
    if progress:
        progress.close()
    return result


def prefix_cache_line(result: RunResult, metrics: RunMetrics) -> str | None:
    """``prefix cache (paged): hit rate 62.5% of ...; 3 blocks evicted``; None when the run looked nothing up."""
    from perfsuite.measure.prefix_cache import cached_prompts, prefix_cache_figures

    figures = prefix_cache_figures(result.counters, cached_prompts(metrics.requests))
    if figures is None:
        return None
    evicted = "" if figures.num_evicted_blocks is None else f"; {figures.num_evicted_blocks} blocks evicted"
    return f"prefix cache ({result.engine_name}): hit rate {figures.describe()}{evicted}"


def _workload(args: argparse.Namespace) -> Workload | ShapedWorkload:
    """``--workload``'s, its trace read now (a bad line fails before the model loads); else the default, with the
    flags' prompt lengths and arrivals."""
    if args.workload is None:
        default = mixed_workload(
            args.num_requests or 32, args.min_new_tokens or 8, args.max_new_tokens or 128, args.seed
        )
        return Workload(
            default.num_requests,
            default.lengths,
            _arrivals(args),
            default.seed,
            args.prompt_len if args.prompt_len is not None else default.prompts,
        )
    if isinstance(args.workload, Trace):
        for warning in args.workload.long_gaps():  # reads every line: a bad one fails before the model loads
            print(f"perfsuite: warning: {warning}", file=sys.stderr)
    return ShapedWorkload(args.workload, seed=args.seed, arrivals=_arrivals(args))


def _check_context_before_load(model: str, workload: Workload | ShapedWorkload) -> None:
    """The workload's longest request against the context in the model's config, read without loading the model.

    An unknown model name fails here, in one line. Where the config cannot be
    read yet (smollm2-135m before its first load), the check waits for the load.
    """
    from perfsuite.models import config_values, context_of

    values = config_values(model)
    context = None if values is None else context_of(values)
    if context is not None:
        workload.check_context(context)


def _described(workload: Workload | ShapedWorkload) -> str:
    if isinstance(workload, ShapedWorkload):
        return f"workload {workload.label}"
    prompts = "" if isinstance(workload.prompts, ShippedPrompts) else f"prompts {workload.prompts.label}, "
    return (
        f"{prompts}max_new_tokens uniform {workload.lengths.low}..{workload.lengths.high}, "
        f"arrivals {workload.arrivals.label}"
    )


def _built(kind: str, backend, config):
    """``build_engine``, with a KV cache too large for the device said in ``run``'s own flag."""
    from perfsuite.adapters import build_engine
    from perfsuite.engine.kv_memory import KVMemoryError

    try:
        return build_engine(kind, backend, config)
    except KVMemoryError as error:  # every perfsuite engine's cache grows with the batch (the pool by default)
        raise ValueError(error.message("--batch-size")) from None


def _check_server(endpoint: str, options: HttpClientOptions) -> None:
    """The server answers ``/v1/models`` and serves the model asked for; else a ``RuntimeError`` saying so."""
    from perfsuite.adapters.openai_http import base_url
    from perfsuite.adapters.server_info import fetch_server_info

    fetch_server_info(base_url(endpoint), api_key=options.api_key).select(options.server_model)


HEADERS = (
    "engine",
    "tok/s",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "TPOT p99 ms",
    "E2E p50 s",
    "E2E p99 s",
    "forward passes",
    "padded slot-tokens",
)


def _row(result: RunResult, metrics: RunMetrics) -> list[object]:
    # A percentile the run's requests cannot support is shown as such, not as a figure.
    ttft = [m.ttft for m in metrics.requests if m.ttft is not None]
    tpot = [m.tpot for m in metrics.requests if m.tpot is not None]
    e2el = [m.e2e for m in metrics.requests if m.e2e is not None]
    return [
        result.engine_name,
        metrics.output_throughput,
        metrics.request_throughput,
        shown_percentile(metrics.ttft.median * 1e3, ttft, 50, 1e3),
        shown_percentile(metrics.ttft.p99 * 1e3, ttft, 99, 1e3),
        shown_percentile(metrics.tpot.median * 1e3, tpot, 50, 1e3),
        shown_percentile(metrics.tpot.p99 * 1e3, tpot, 99, 1e3),
        shown_percentile(metrics.e2el.median, e2el, 50),
        shown_percentile(metrics.e2el.p99, e2el, 99),
        result.counters.num_forward_passes,
        result.counters.num_padding_tokens,
    ]


def shown_percentile(value: float, values: Sequence[float], q: float, scale: float = 1.0) -> float | str:
    """``value`` (the q-th percentile of ``values``, times ``scale``), or what ``values`` say when they cannot support it."""
    interval = percentile_interval(values, q) if values else PercentileInterval(q, None, None, DEFAULT_CONFIDENCE, 0)
    return interval.unsupported_text(scale) or value


class Progress:
    """Requests finished so far, on stderr: in place on a terminal, else every 10%."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.tokens = 0
        self.started = time.perf_counter()
        self._interactive = sys.stderr.isatty()
        self._next_report = 0.1

    def __call__(self, step_outputs) -> None:
        self.tokens += len(step_outputs)
        self.done += sum(1 for o in step_outputs if o.finished)
        fraction = self.done / self.total
        if self._interactive:
            print(f"\r{self._line()}", end="", file=sys.stderr, flush=True)
        elif fraction >= self._next_report:
            print(self._line(), file=sys.stderr, flush=True)
            while self._next_report <= fraction:
                self._next_report += 0.1

    def _line(self) -> str:
        elapsed = time.perf_counter() - self.started
        return f"[{self.label}] {self.done}/{self.total} requests, {self.tokens} tokens, {elapsed:.1f}s"

    def close(self) -> None:
        if self._interactive:
            print(file=sys.stderr)
