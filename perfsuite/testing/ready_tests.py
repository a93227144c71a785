"""Ready equivalence tests, one line each: ``test_mine = equivalence_test("my-engine")``.

Each returns a Hypothesis test function (no arguments, no fixtures) that
pytest collects from the variable it is assigned to, as Hypothesis' own ready
tests are made (``TestMyMachine = MyMachine.TestCase``). It draws scenarios
(``max_examples`` small ones, then ``NUM_LONG_EXAMPLES`` long ones with more
requests than the pool holds), serves each with the engine and checks every
token against unbatched greedy decoding of the same model given the engine's
own prefix (``perfsuite.testing.verdict``), failing with each wrong token
(request, position, both tokens and logits, the tolerance) and the scenario,
once shrunk.

The model and its reference are loaded on the first example and kept for
the process (keyed by model, dtype and device), not in a fixture: Hypothesis
would not reset a function-scoped fixture between examples, and reloading
per test would cost more than the check.

Settings: ``deadline=None`` (a model step on a CPU is slower than the
200 ms default) and ``max_examples``; in the deadline's place each example
has a wall-clock limit, ``max_seconds_per_example`` (default 300 s, or
``$PERFSUITE_MAX_SECONDS_PER_EXAMPLE``): an engine that never answers fails
with the scenario and "no answer in N s", its call abandoned in a daemon
thread (``perfsuite.testing.time_limit``); the rest comes from the Hypothesis
profile loaded when the test is made. Under CI (the ``CI`` variable)
Hypothesis loads its ``ci`` profile itself, derandomized and without an
example database, so a CI run is reproducible; a developer's run explores
new examples and replays past failures from ``.hypothesis/``. A project
that wants other settings registers its own profile in ``conftest.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig, EngineFactory
from perfsuite.adapters.registry import checked_engine, load_factory
from perfsuite.testing import bitwise as bitwise_lane
from perfsuite.testing.checks import check_engine, check_runner
from perfsuite.testing.reference import CachedReference, cached_reference
from perfsuite.testing.scenarios import Scenario, ScenarioSize, long_scenarios, scenarios
from perfsuite.testing.time_limit import NoAnswer, call_within, resolve_max_seconds
from perfsuite.testing.verdict import LogitTolerance

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from perfsuite.engine.engine import Runner
    from perfsuite.models import LoadedModel

DEFAULT_MAX_EXAMPLES = 25
_REMOVED = object()  # near_tie_tolerance and max_near_ties: refused, with the per-token verdict named
# Smaller than perfsuite's own property's scenarios: an engine of unknown speed serves every example.
SMALL: ScenarioSize = {"max_requests": 6, "max_prompt_len": 24, "max_new_tokens": 12, "max_batch_size": 4}
SMALL_MAX_SEQ_LEN = SMALL["max_prompt_len"] + SMALL["max_new_tokens"]
# With the default strategy, each run also serves this many long scenarios (``long_scenarios``: more requests than
# the pool holds). Two, since Hypothesis' first example is its simplest (every request in order, one token each).
NUM_LONG_EXAMPLES = 2


def equivalence_test(
    engine: str | EngineFactory,
    *,
    model: str = "tiny-random",
    dtype: str = "float64",
    device: str = "cpu",
    endpoint: str | None = None,
    strategy: SearchStrategy[Any] | None = None,  # of Scenario; of bitwise.Composition with bitwise=True
    max_seq_len: int | None = None,
    seconds_per_step: float = 0.0,
    ulps: float | None = None,
    max_examples: int | None = None,
    max_seconds_per_example: float | None = None,
    near_tie_tolerance: object = _REMOVED,
    max_near_ties: object = _REMOVED,
    bitwise: bool = False,
    batch_invariant: bool = False,
) -> Callable[[], None]:
    """A test that ``engine`` serves drawn scenarios exactly as unbatched greedy decoding of ``model`` would.

    ``engine``: a registered engine name (an entry point of the
    ``perfsuite.engines`` group, ``register_engine``, or perfsuite's own,
    ``openai-http`` included) or a factory ``(backend, config) -> engine``.
    It is built over ``model`` in ``dtype`` on ``device`` for every scenario,
    from the scenario's knobs, and served through ``BatchingEngine.run``.

    A request arriving at step k is sent k x ``seconds_per_step`` into the
    run. The default, 0, sends every request at once: requests still join a
    running batch as others finish, and a failure replays exactly. With
    wall-clock arrivals which batch a request joins depends on the machine's
    speed, so a failure may not replay and Hypothesis can hardly shrink it
    (on a busy 2-core machine, a slot bug at 2 ms a step still had five
    requests of up to 24 prompt tokens after five minutes of shrinking;
    served at once, it shrank to three to six one-token prompts in one to
    two minutes).

    For ``openai-http``, ``endpoint`` is the server's base URL; the server
    must serve ``model`` in ``dtype``.

    ``strategy`` defaults to small ``scenarios`` over the model's vocabulary
    (special tokens left out) and ``max_seq_len`` to their longest possible
    request; with a strategy of yours, to each scenario's longest request.
    With the default strategy each run then serves ``NUM_LONG_EXAMPLES``
    ``long_scenarios`` (16-24 requests over a batch of at most 3), where
    slots, blocks and request ids are reused after the pool wraps; with a
    strategy of yours, only yours.

    The verdict is per token (``perfsuite.testing.verdict``): every token the
    engine produced is checked against the reference given the engine's own
    prefix, computed one format wider than ``dtype``. It passes when it is the
    reference's argmax or its reference logit is within ``ulps`` units in the
    last place of ``dtype`` (at the argmax logit's magnitude) of the argmax's;
    default ``ULPS_BY_DTYPE[dtype]`` (0 for float64: exact ties only). An
    output longer or shorter than its own stop tokens and ``max_new_tokens``
    call for fails whatever the tolerance. ``near_tie_tolerance`` and
    ``max_near_ties`` (the rule this verdict replaced) are refused with a
    ``TypeError`` saying so.

    What ``run`` returns is checked before any token is compared
    (``perfsuite.testing.greedy.validate_run_result``: a ``RunResult``, one
    record for each request sent and no other, int token ids); a result that
    is not fails naming each problem.

    ``max_seconds_per_example`` (default ``$PERFSUITE_MAX_SECONDS_PER_EXAMPLE``,
    else 300) bounds one scenario, the model's loading aside. Past it the
    test fails at once, with the scenario and "no answer in N s", without
    shrinking; the hung call cannot be stopped and is abandoned, still
    running, in a daemon thread (with the engine it holds) until the process exits.

    ``bitwise=True`` is the bitwise lane (``perfsuite.testing.bitwise``):
    drawn ``compositions`` (a needle among companions), every request's
    tokens and log-probabilities (``RequestRecord.output_logprobs``) the same
    bits as the request served alone by the same engine; ``max_examples``
    defaults to ``bitwise.DEFAULT_MAX_EXAMPLES`` there, ``ulps``,
    ``max_seq_len`` and ``seconds_per_step`` are refused. The backend the
    factory gets then holds ``ModelRunner(logprobs=True)``, batch invariant
    with ``batch_invariant=True`` (which the lane alone takes), and the
    ``EngineConfig`` says so.

    Long: the docstring is the public reference of the kit's main entry (mkdocstrings); the body is ten lines.
    """
    _refuse_near_tie_arguments(near_tie_tolerance, max_near_ties)
    limit = resolve_max_seconds(max_seconds_per_example)
    model_under_test = _ModelUnderTest(model, dtype, device, endpoint)
    if bitwise:
        _refuse_per_token_arguments(ulps=ulps, max_seq_len=max_seq_len, seconds_per_step=seconds_per_step or None)
        return _bitwise_engine_test(engine, model_under_test, batch_invariant, strategy, max_examples, limit)
    if batch_invariant:
        raise ValueError("batch_invariant=True builds the runner the bitwise lane checks: pass bitwise=True with it")
    per_token = _PerToken.of(model_under_test, strategy, max_seq_len, ulps, max_examples, limit)
    return _per_token_engine_test(engine, model_under_test, per_token, seconds_per_step)


@dataclasses.dataclass(frozen=True, slots=True)
class _PerToken:
    """A per-token ready test's settings, the defaults filled in: the strategies, the limits and the tolerance."""

    strategy: SearchStrategy[Scenario]
    long_strategy: SearchStrategy[Scenario] | None  # the default strategy's long scenarios; None with the user's
    max_seq_len: int | None
    tolerance: LogitTolerance
    max_examples: int
    limit: float

    @classmethod
    def of(
        cls,
        model_under_test: _ModelUnderTest,
        strategy: SearchStrategy[Scenario] | None,
        max_seq_len: int | None,
        ulps: float | None,
        max_examples: int | None,
        limit: float,
    ) -> _PerToken:
        tolerance = LogitTolerance.for_dtype(model_under_test.dtype, ulps)
        max_examples = DEFAULT_MAX_EXAMPLES if max_examples is None else max_examples
        if strategy is not None:
            return cls(strategy, None, max_seq_len, tolerance, max_examples, limit)
        small, long = model_under_test.small_scenarios(), model_under_test.long_scenarios()
        return cls(small, long, max_seq_len or SMALL_MAX_SEQ_LEN, tolerance, max_examples, limit)


def _per_token_engine_test(
    engine: str | EngineFactory, model_under_test: _ModelUnderTest, per_token: _PerToken, seconds_per_step: float
) -> Callable[[], None]:
    factory = functools.cache(lambda: load_factory(engine) if isinstance(engine, str) else engine)

    def check_one(scenario: Scenario) -> None:
        backend = model_under_test.backend()
        build = functools.partial(_build, _engine_name(engine), factory(), backend)
        check = check_engine(
            build,
            scenario,
            model_under_test.reference(),
            max_seq_len=per_token.max_seq_len,
            seconds_per_step=seconds_per_step,
            tolerance=per_token.tolerance,
        )
        check.assert_passed()

    prepare = lambda: (model_under_test.reference(), factory())  # noqa: E731
    return _ready_test(check_one, per_token, _engine_name(engine), prepare)


def runner_equivalence_test(
    make_runner: Callable[[LoadedModel], Runner],
    *,
    model: str = "tiny-random",
    dtype: str = "float64",
    device: str = "cpu",
    strategy: SearchStrategy[Any] | None = None,  # of Scenario; of bitwise.Composition with bitwise=True
    max_seq_len: int | None = None,
    ulps: float | None = None,
    max_examples: int | None = None,
    max_seconds_per_example: float | None = None,
    near_tie_tolerance: object = _REMOVED,
    max_near_ties: object = _REMOVED,
    bitwise: bool = False,
) -> Callable[[], None]:
    """A test that a model runner, under perfsuite's static, in-flight and paged schedulers, decodes greedily.

    ``make_runner(loaded)`` builds the runner over the loaded ``model`` once
    (``loaded.model`` is the Hugging Face model); each scenario is driven step
    by step (arrivals by step), through every scheduler. The other arguments
    are ``equivalence_test``'s; past ``max_seconds_per_example`` the runner,
    shared by every scenario, is left to the abandoned call, and the test ends.

    ``bitwise=True``: the bitwise lane over the runner under the same
    schedulers (each request's bits in a batch against its bits served alone
    by the same scheduler); the runner must keep ``last_logprobs``
    (``ModelRunner(logprobs=True)``), or the test is refused.
    """
    _refuse_near_tie_arguments(near_tie_tolerance, max_near_ties)
    limit = resolve_max_seconds(max_seconds_per_example)
    model_under_test = _ModelUnderTest(model, dtype, device, None)
    if bitwise:
        _refuse_per_token_arguments(ulps=ulps, max_seq_len=max_seq_len)
        return _bitwise_runner_test(make_runner, model_under_test, strategy, max_examples, limit)
    per_token = _PerToken.of(model_under_test, strategy, max_seq_len, ulps, max_examples, limit)
    return _per_token_runner_test(make_runner, model_under_test, per_token)


def _per_token_runner_test(
    make_runner: Callable[[LoadedModel], Runner], model_under_test: _ModelUnderTest, per_token: _PerToken
) -> Callable[[], None]:
    runner_of = functools.cache(lambda: make_runner(model_under_test.loaded()))

    def check_one(scenario: Scenario) -> None:
        check = check_runner(
            runner_of(),
            scenario,
            model_under_test.reference(),
            eos_token_id=model_under_test.loaded().eos_token_id,
            max_seq_len=per_token.max_seq_len,
            tolerance=per_token.tolerance,
        )
        check.assert_passed()

    label = getattr(make_runner, "__name__", "runner")
    prepare = lambda: (model_under_test.reference(), runner_of())  # noqa: E731
    return _ready_test(check_one, per_token, label, prepare)


def _refuse_near_tie_arguments(near_tie_tolerance: object, max_near_ties: object) -> None:
    given = [
        name
        for name, value in (("near_tie_tolerance", near_tie_tolerance), ("max_near_ties", max_near_ties))
        if value is not _REMOVED
    ]
    if given:
        raise TypeError(
            f"{' and '.join(given)}: the near-tie rule is gone; the verdict is now per token, each output token "
            "against the reference given the engine's own prefix, within ulps of the dtype (pass ulps=... to "
            "change the tolerance; see docs/correctness.md#the-per-token-verdict)"
        )


def _refuse_per_token_arguments(**given: object) -> None:
    names = [name for name, value in given.items() if value is not None]
    if names:
        raise TypeError(
            f"{', '.join(names)}: not taken by the bitwise lane (bitwise=True), which compares exact bits "
            "at its strategy's max_seq_len (a composition's), every request arriving by step"
        )


def _bitwise_engine_test(
    engine: str | EngineFactory,
    model_under_test: _ModelUnderTest,
    batch_invariant: bool,
    strategy: SearchStrategy[bitwise_lane.Composition] | None,
    max_examples: int | None,
    limit: float,
) -> Callable[[], None]:
    name = _engine_name(engine)
    factory = functools.cache(lambda: load_factory(engine) if isinstance(engine, str) else engine)
    lane = functools.cache(
        lambda: bitwise_lane.EngineLane(
            name,
            functools.partial(_build, name, factory(), model_under_test.logprobs_backend(batch_invariant)),
            batch_invariant,
        )
    )
    strategy = model_under_test.compositions() if strategy is None else strategy
    return _bitwise_test(lane, strategy, max_examples, name, limit)


def _bitwise_runner_test(
    make_runner: Callable[[LoadedModel], Runner],
    model_under_test: _ModelUnderTest,
    strategy: SearchStrategy[bitwise_lane.Composition] | None,
    max_examples: int | None,
    limit: float,
) -> Callable[[], None]:
    loaded = model_under_test.loaded
    lane = functools.cache(lambda: bitwise_lane.RunnerLane(make_runner(loaded()), loaded().eos_token_id))
    label = getattr(make_runner, "__name__", "runner")
    strategy = model_under_test.compositions() if strategy is None else strategy
    return _bitwise_test(lane, strategy, max_examples, label, limit)


def _bitwise_test(lane, strategy, max_examples: int | None, label: str, limit: float) -> Callable[[], None]:
    name = re.sub(r"\W", "_", f"{label}_same_bits_in_a_batch_as_alone")
    max_examples = bitwise_lane.DEFAULT_MAX_EXAMPLES if max_examples is None else max_examples
    check_one = lambda composition: lane().check(composition)  # noqa: E731
    return _hypothesis_test(check_one, strategy, max_examples, name, label, limit, lane)


class _ModelUnderTest:
    """The model a ready test compares against, loaded on first use and shared by every test of the process."""

    def __init__(self, model: str, dtype: str, device: str, endpoint: str | None) -> None:
        self._key = (model, dtype, device)
        self._endpoint = endpoint

    @property
    def dtype(self) -> str:
        return self._key[1]

    def loaded(self) -> LoadedModel:
        return _load(*self._key)

    def backend(self) -> Backend:
        return _backend(*self._key, self._endpoint)

    def reference(self) -> CachedReference:
        return _reference(*self._key)

    def small_scenarios(self) -> SearchStrategy[Scenario]:
        """Small ``scenarios`` over the model's vocabulary, less its special tokens (the model loads on first draw)."""
        return st.deferred(lambda: _small_scenarios(self.backend()))

    def long_scenarios(self) -> SearchStrategy[Scenario]:
        """``long_scenarios`` over the same tokens: more requests than the pool holds."""
        return st.deferred(lambda: long_scenarios(_vocab_size(self.backend()), self.backend().special_token_ids))

    def compositions(self) -> SearchStrategy[bitwise_lane.Composition]:
        """The bitwise lane's ``compositions`` over the same tokens."""
        return st.deferred(
            lambda: bitwise_lane.compositions(_vocab_size(self.backend()), self.backend().special_token_ids)
        )

    def logprobs_backend(self, batch_invariant: bool) -> Backend:
        """The backend with a runner that keeps log-probabilities (batch invariant if asked), for the bitwise lane."""
        return _logprobs_backend(*self._key, self._endpoint, batch_invariant)


@functools.cache
def _load(model: str, dtype: str, device: str) -> LoadedModel:
    from perfsuite.models import load_model

    return load_model(model, device=device, dtype=dtype)


@functools.cache
def _backend(model: str, dtype: str, device: str, endpoint: str | None) -> Backend:
    return Backend.from_loaded(_load(model, dtype, device), endpoint=endpoint)


@functools.cache
def _logprobs_backend(model: str, dtype: str, device: str, endpoint: str | None, batch_invariant: bool) -> Backend:
    from perfsuite.engine.model_runner import ModelRunner

    runner = ModelRunner(_load(model, dtype, device).model, batch_invariant=batch_invariant, logprobs=True)
    return dataclasses.replace(_backend(model, dtype, device, endpoint), runner=runner)


@functools.cache
def _reference(model: str, dtype: str, device: str) -> CachedReference:
    return cached_reference(_load(model, dtype, device))


def _small_scenarios(backend: Backend) -> SearchStrategy[Scenario]:
    return scenarios(vocab_size=_vocab_size(backend), avoid_token_ids=backend.special_token_ids, **SMALL)


def _vocab_size(backend: Backend) -> int:
    if backend.vocab_size is None:
        raise ValueError("the backend does not say its vocabulary size; pass strategy=scenarios(vocab_size=...)")
    return backend.vocab_size


def _build(name: str, factory: EngineFactory, backend: Backend, config: EngineConfig) -> BatchingEngine:
    return checked_engine(name, factory(backend, config))


def _check_within(check_one: Callable[[Scenario], None], scenario: Scenario, max_seconds: float, label: str) -> None:
    """``check_one(scenario)`` within ``max_seconds``; a failure, or no answer, names the scenario."""
    try:
        call_within(max_seconds, functools.partial(check_one, scenario), label)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\nscenario: {scenario.describe()}") from None
    except NoAnswer as hung:
        raise NoAnswer(f"{hung}\nscenario: {scenario.describe()}") from None


def _ready_test(
    check_one: Callable[[Scenario], None], per_token: _PerToken, label: str, prepare: Callable[[], object]
) -> Callable[[], None]:
    """The Hypothesis test over the settings' strategy; with a long strategy too, a test that runs it, then long examples."""
    name = re.sub(r"\W", "_", f"{label}_equals_unbatched_greedy_decoding")
    max_seconds = per_token.limit
    small = _hypothesis_test(check_one, per_token.strategy, per_token.max_examples, name, label, max_seconds, prepare)
    if per_token.long_strategy is None:
        return small
    long_name = f"{name}_long"
    long = _hypothesis_test(
        check_one, per_token.long_strategy, NUM_LONG_EXAMPLES, long_name, label, max_seconds, prepare
    )

    def test() -> None:
        small()
        long()  # more requests than the pool holds: a resource reused after the pool wraps

    test.__name__ = test.__qualname__ = name
    return test


def _hypothesis_test(
    check_one: Callable[[Scenario], None],
    strategy: SearchStrategy[Scenario],
    max_examples: int,
    name: str,
    label: str,
    max_seconds: float,
    prepare: Callable[[], object],
) -> Callable[[], None]:
    def test(scenario: Scenario) -> None:
        prepare()  # the model, its reference and the runner or factory, once and outside the limit (a download is slow)
        _check_within(check_one, scenario, max_seconds, label)

    # Hypothesis names the test in its report and keys its example database by this name.
    test.__name__ = test.__qualname__ = name
    suppressed = {*settings().suppress_health_check, HealthCheck.too_slow}  # the active profile's, and slow draws
    run_settings = settings(max_examples=max_examples, deadline=None, suppress_health_check=list(suppressed))
    return run_settings(given(scenario=strategy)(test))


def _engine_name(engine: str | EngineFactory) -> str:
    return engine if isinstance(engine, str) else getattr(engine, "__name__", "engine")
