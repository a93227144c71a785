"""The correctness kit's power: what its ready tests catch, what they wrongly fail, and the spread its tolerance covers.

    python bench/correctness_power.py [--examples 200] [--long-examples 10] [--calibration-examples 60]
                                      [--dtypes float64,bfloat16] [--threads 1] [--log PATH]
                                      [--model tiny-random] [--no-mutants]
                                      [--engines inflight,paged,outside] [--mutants NAME,...] [--through runner,engine]

One run, three parts, on tiny-random on the CPU:

1. **Calibration** (in each low-precision dtype of --dtypes): perfsuite's
   in-flight and paged engines, and the Hugging Face model alone in that dtype,
   serve --calibration-examples scenarios of the ready test's strategy; at every
   output position their logits are compared with the teacher-forced reference
   (the same weights one format wider). ``lift`` is how far a correct
   arrangement raises one of the reference's top-5 tokens relative to its argmax,
   in ulps of the dtype at the argmax logit: a flip to a token needs its
   reference gap to be within that token's lift, so the verdict's tolerance
   (``ULPS_BY_DTYPE``) must cover the largest lift seen, with room to spare.
2. **False failures**: ``equivalence_test``'s pieces with its defaults (the
   small scenarios, then the long ones; the per-token verdict at the default
   tolerance) over perfsuite's ``inflight`` and ``paged`` engines and the
   outside example engine (examples/outside-project, ``outside``): every example
   is served and judged, and the failing ones counted.
3. **Mutants** (bench/correctness_mutants.py): the ready tests themselves with
   defaults (``runner_equivalence_test`` for every mutant, over the mutant's
   runner or, for an engine mutant, perfsuite's; and ``equivalence_test`` of an
   engine mutant's registered engine, or of perfsuite's in-flight engine over a
   runner mutant), generated examples only (no
   explicit examples, no shrinking), derandomized as the ci profile is: caught
   or not, and at which example.

Prints one table, and writes it with the calibration and every failure to --log.
A part of it: ``--calibrate ""`` skips the calibration, ``--engines`` picks the
false-failure engines ("" none), ``--mutants`` the mutants by name ("" none)
and ``--through`` the ready tests they go through; give such a run its own --log.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import io
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "examples" / "outside-project" / "src"))

import torch  # noqa: E402
from correctness_mutants import MUTANTS, Mutant  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from perfsuite.engine import inflight_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.reference import reference_dtype  # noqa: E402
from perfsuite.measure.environment import cpu_model  # noqa: E402
from perfsuite.testing import check_engine, equivalence_test, runner_equivalence_test  # noqa: E402
from perfsuite.testing import ready_tests  # noqa: E402
from perfsuite.testing.drive import drive  # noqa: E402
from perfsuite.testing.verdict import FLOAT_FORMATS, ULPS_BY_DTYPE, LogitTolerance, ulp  # noqa: E402

MODEL = "tiny-random"
LOW_PRECISION = ("bfloat16", "float16", "float32")  # calibrated: float64 allows exact ties only
TOP_K = 5

settings.register_profile(
    "power",
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # generated examples only: nothing explicit, nothing shrunk
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("power")


def outside_factory():
    from outside_engine.factories import build

    return build


ENGINES = {"inflight": "inflight", "paged": "paged", "outside": outside_factory}


# -- 1. calibration ----------------------------------------------------------------------------------------------


class RecordingRunner(ModelRunner):
    """perfsuite's runner, keeping the logits of every sampled row by (request, number of tokens before it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: dict[tuple[str, int], torch.Tensor] = {}

    def execute(self, output, kv_cache):
        self._sampling = [c for c in output.chunks if c.samples]
        return super().execute(output, kv_cache)

    def _sample(self, hidden):
        if hidden.shape[0]:
            for chunk, row in zip(self._sampling, self.decoder.logits(hidden).double(), strict=True):
                self.rows[(chunk.request_id, chunk.start_position + chunk.num_tokens)] = row
        return super()._sample(hidden)


class Lifts:
    """The largest lift of a top-5 token over the argmax, and the flips, per arrangement, in ulps."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.lifts: dict[str, list[float]] = {}
        self.flips: dict[str, list[float]] = {}

    def add(self, arrangement: str, engine_row: torch.Tensor, reference_row: torch.Tensor) -> None:
        top = reference_row.topk(TOP_K)
        best = float(top.values[0])
        unit = ulp(best, self.dtype)
        shift = engine_row[top.indices] - top.values  # [TOP_K] the arrangement's error at each
        self.lifts.setdefault(arrangement, []).append(float((shift[1:] - shift[0]).max()) / unit)
        chosen = int(engine_row.argmax())
        if chosen != int(top.indices[0]):
            self.flips.setdefault(arrangement, []).append((best - float(reference_row[chosen])) / unit)

    def lines(self) -> list[str]:
        lines = []
        for arrangement, lifts in self.lifts.items():
            ordered, flips = sorted(lifts), self.flips.get(arrangement, [])
            p999 = ordered[min(len(ordered) - 1, int(0.999 * len(ordered)))]
            lines.append(
                f"  {self.dtype} {arrangement}: {len(lifts)} positions; lift of a top-{TOP_K} token over the argmax: "
                f"median {ordered[len(ordered) // 2]:.2f}, p99.9 {p999:.2f}, max {ordered[-1]:.2f} ulps; "
                f"{len(flips)} flips, the largest {max(flips, default=0):.2f} ulps below the argmax"
            )
        return lines


def calibrate(dtype: str, num_examples: int) -> list[str]:
    model_under_test = ready_tests._ModelUnderTest(MODEL, dtype, "cpu", None)
    loaded = model_under_test.loaded()
    wider = copy.deepcopy(loaded.model).to(reference_dtype(loaded.model.dtype))
    runner = RecordingRunner(loaded.model)
    lifts = Lifts(dtype)

    @settings(max_examples=num_examples)
    @given(scenario=model_under_test.small_scenarios())
    def serve(scenario):
        engines = list(scenario.engines(runner, loaded.eos_token_id, ready_tests.SMALL_MAX_SEQ_LEN))[1:3]
        for engine in engines:  # in-flight and paged
            runner.rows.clear()
            outputs = drive(engine, scenario)
            for request in scenario.requests:
                _compare(engine.name, request.prompt_token_ids, outputs[request.request_id], runner.rows,
                         request.request_id, loaded.model, wider, lifts)  # fmt: skip

    serve()
    return lifts.lines()


@torch.inference_mode()
def _compare(name, prompt, tokens, rows, request_id, model, wider, lifts) -> None:
    ids = torch.tensor([prompt + tokens[:-1]])
    reference = wider(input_ids=ids).logits[0, len(prompt) - 1 :].double()
    alone = model(input_ids=ids).logits[0, len(prompt) - 1 :].double()  # the Hugging Face model alone, in the dtype
    for position in range(len(tokens)):
        lifts.add(name, rows[(request_id, len(prompt) + position)], reference[position])
        if name == "inflight":  # once per sequence
            lifts.add("hf-alone", alone[position], reference[position])


# -- 2. false failures -------------------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.examples = self.failed = self.checked = self.exact = self.within = self.wrong = 0
        self.max_ulps = 0.0
        self.failures: list[str] = []

    def add(self, check, scenario) -> None:
        self.examples += 1
        self.checked, self.exact, self.within = (
            self.checked + check.num_checked, self.exact + check.num_exact, self.within + check.num_within,
        )  # fmt: skip
        self.wrong += check.num_wrong
        self.max_ulps = max(self.max_ulps, check.max_gap_ulps)
        if not check.passed:
            self.failed += 1
            self.failures.append(f"{check.describe()}\nscenario: {scenario.describe()}")

    def cell(self) -> str:
        return f"{self.failed}/{self.examples} failed"

    def detail(self) -> str:
        return (
            f"{self.examples} examples, {self.failed} failed; tokens {self.checked}: {self.exact} exact, "
            f"{self.within} within tolerance (largest {self.max_ulps:.2f} ulps), {self.wrong} wrong"
        )


def false_failures(engine_name: str, dtype: str, num_examples: int, num_long: int) -> Tally:
    model_under_test = ready_tests._ModelUnderTest(MODEL, dtype, "cpu", None)
    engine = ENGINES[engine_name]
    factory = engine() if callable(engine) else ready_tests.load_factory(engine)
    build = functools.partial(ready_tests._build, engine_name, factory, model_under_test.backend())
    tolerance = LogitTolerance.for_dtype(dtype)
    tally = Tally()

    def serve(scenario):
        check = check_engine(build, scenario, model_under_test.reference(), max_seq_len=ready_tests.SMALL_MAX_SEQ_LEN,
                             tolerance=tolerance)  # fmt: skip
        tally.add(check, scenario)

    settings(max_examples=num_examples)(given(scenario=model_under_test.small_scenarios())(serve))()
    settings(max_examples=num_long)(given(scenario=model_under_test.long_scenarios())(serve))()
    return tally


# -- 3. mutants --------------------------------------------------------------------------------------------------


def inflight_over(runner_class: type[ModelRunner], dtype: str):
    """A factory of perfsuite's in-flight engine over one ``runner_class`` runner of the model, for equivalence_test."""
    runner = functools.cache(lambda: runner_class(ready_tests._load(MODEL, dtype, "cpu").model))

    def factory(backend, config):
        return inflight_engine(
            runner(), decode_batch_size=config.batch_size, prefill_batch_size=config.prefill_batch_size,
            max_num_batched_tokens=config.max_num_batched_tokens, max_seq_len=config.max_seq_len,
            eos_token_id=backend.eos_token_id,
        )  # fmt: skip

    factory.__name__ = f"inflight_over_{runner_class.__name__}"
    return factory


def try_mutant(mutant: Mutant, dtype: str, through: str) -> tuple[str, str]:
    """(the table's cell, the failure's first lines) of a ready test with defaults on ``mutant``.

    ``through``: "runner" (``runner_equivalence_test``: perfsuite's static, in-flight and paged schedulers with each
    scenario's own pool, over the mutant's runner or, for an engine mutant, perfsuite's) or "engine"
    (``equivalence_test``: of the engine mutant's registered engine, or of perfsuite's in-flight engine over the
    runner mutant, built from the scenario's ``EngineConfig``).
    """
    calls = []
    original = ready_tests._check_within

    def counted(check_one, scenario, max_seconds, label):
        calls.append(len(scenario.requests))
        return original(check_one, scenario, max_seconds, label)

    ready_tests._check_within = counted
    try:
        runner = mutant.runner or ModelRunner
        if through == "runner":
            test = runner_equivalence_test(lambda loaded: runner(loaded.model), dtype=dtype)
        elif mutant.runner is not None:
            test = equivalence_test(inflight_over(mutant.runner, dtype), dtype=dtype)
        else:
            test = equivalence_test(mutant.engine, dtype=dtype)
        with mutant.patch() if mutant.patch else contextlib.nullcontext():
            test()
    except BaseException as failure:  # noqa: BLE001 - a crash is reported as one, not as a catch
        text = "\n".join(str(failure).splitlines()[:3])
        where = "long" if calls and calls[-1] >= 16 else "small"
        if not isinstance(failure, AssertionError):
            return f"CRASHED at example {len(calls)} ({type(failure).__name__})", text
        return f"caught at example {len(calls)} ({where})", text
    finally:
        ready_tests._check_within = original
    return f"MISSED ({len(calls)} examples)", ""


# -- the run -----------------------------------------------------------------------------------------------------


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="small examples per engine and dtype (default 200)")
    parser.add_argument("--long-examples", type=int, default=10, help="long examples per engine and dtype (default 10)")
    parser.add_argument("--calibration-examples", type=int, default=60, help="scenarios per low dtype (default 60)")
    parser.add_argument("--dtypes", default="float64,bfloat16", help="comma-separated (default float64,bfloat16)")
    parser.add_argument("--calibrate", default="bfloat16,float16,float32",
                        help="dtypes to calibrate, comma-separated (default bfloat16,float16,float32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--model", default=MODEL, help=f"the model (default {MODEL})")
    parser.add_argument("--no-mutants", action="store_true", help="calibration and false failures only")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"false-failure engines, comma-separated, '' for none (default {','.join(ENGINES)})")
    parser.add_argument("--mutants", default=None,
                        help="mutants by name, comma-separated, '' for none (default all: "
                             f"{','.join(m.name for m in MUTANTS)})")
    parser.add_argument("--through", default="runner,engine",
                        help="the ready tests a mutant goes through: runner, engine or both (default runner,engine)")
    parser.add_argument("--log", type=Path, default=None, help="where to write the log (default bench/results/...)")
    args = parser.parse_args()
    MODEL = args.model
    engines = [name for name in args.engines.split(",") if name]
    for name in engines:
        if name not in ENGINES:
            parser.error(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
    mutants = list(MUTANTS)
    if args.mutants is not None:
        by_name = {m.name: m for m in MUTANTS}
        unknown = [name for name in args.mutants.split(",") if name and name not in by_name]
        if unknown:
            parser.error(f"unknown mutant(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
        mutants = [by_name[name] for name in args.mutants.split(",") if name]
    if args.no_mutants:
        mutants = []
    throughs = [t for t in args.through.split(",") if t]
    if not set(throughs) <= {"runner", "engine"}:
        parser.error(f"--through takes runner, engine or both, not {args.through!r}")
    torch.set_num_threads(args.threads)
    dtypes = [d for d in args.dtypes.split(",") if d]
    for dtype in dtypes + args.calibrate.split(","):
        if dtype and dtype not in FLOAT_FORMATS:
            parser.error(f"unknown dtype {dtype!r}; choose from {', '.join(FLOAT_FORMATS)}")
    log = args.log or ROOT / "bench" / "results" / f"correctness_power_{datetime.date.today()}.log"
    out = io.StringIO()

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.write(line + "\n")

    started = time.perf_counter()
    say(f"# bench/correctness_power.py {' '.join(sys.argv[1:])}")
    say(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {cpu_model()}, {platform.python_version()}, "
        f"torch {torch.__version__}, {args.threads} thread(s), model {MODEL}")  # fmt: skip
    say(f"# tolerances: {', '.join(f'{d} {u:g} ulps' for d, u in ULPS_BY_DTYPE.items())}")
    say("calibration (correct arrangements against the reference one format wider):")
    for dtype in [d for d in args.calibrate.split(",") if d]:
        if dtype in LOW_PRECISION:
            for line in calibrate(dtype, args.calibration_examples):
                say(line)
            say(f"  tolerance in use: {LogitTolerance.for_dtype(dtype).describe()}")
    rows: list[tuple[str, dict[str, str]]] = []
    details: list[str] = []
    for name in engines:
        cells = {}
        for dtype in dtypes:
            tally = false_failures(name, dtype, args.examples, args.long_examples)
            cells[dtype] = tally.cell()
            details.append(f"{name} {dtype}: {tally.detail()}")
            details += tally.failures[:3]
            say(f"  {name} {dtype}: {tally.detail()}  [{time.perf_counter() - started:.0f} s]")
        rows.append((f"false failures: {name}", cells))
    for mutant in mutants:
        for through in throughs:
            cells = {}
            for dtype in dtypes:
                cell, first = try_mutant(mutant, dtype, through)
                cells[dtype] = cell
                details.append(f"{mutant.name} through the {through} test, {dtype}: {cell}\n{first}")
                say(f"  {mutant.name} ({through} test) {dtype}: {cell}  [{time.perf_counter() - started:.0f} s]")
            engine = f'"{mutant.engine}"' if mutant.engine else "in-flight over it"
            test = "runner_equivalence_test" if through == "runner" else f"equivalence_test({engine})"
            rows.append((f"mutant ({mutant.level}): {mutant.name}: {mutant.bug}; {test}", cells))
    say("")
    width = max((len(label) for label, _ in rows), default=0)
    say(f"| {'':{width}} | " + " | ".join(f"{d:28}" for d in dtypes) + " |")
    say(f"|{'-' * (width + 2)}|" + "|".join("-" * 30 for _ in dtypes) + "|")
    for label, cells in rows:
        say(f"| {label:{width}} | " + " | ".join(f"{cells[d]:28}" for d in dtypes) + " |")
    mutant_rows = [(label, cells) for label, cells in rows if label.startswith("mutant")]
    for dtype in dtypes if mutant_rows else ():
        caught = {label.split(":")[1] for label, cells in mutant_rows if cells[dtype].startswith("caught")}
        by_runner = sum(cells[dtype].startswith("caught") for label, cells in mutant_rows if "runner_eq" in label)
        by_engine = sum(cells[dtype].startswith("caught") for label, cells in mutant_rows if "runner_eq" not in label)
        tried = len(mutants)
        say(f"mutants caught in {dtype}: {len(caught)} of {tried} by a ready test, {by_runner} of "
            f"{tried if 'runner' in throughs else 0} by runner_equivalence_test, {by_engine} of "
            f"{tried if 'engine' in throughs else 0} by equivalence_test")
    say(f"took {time.perf_counter() - started:.0f} s")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(out.getvalue() + "\n# details\n" + "\n\n".join(details) + "\n")
    print(f"log: {log}")


if __name__ == "__main__":
    main()
