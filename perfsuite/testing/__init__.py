"""perfsuite's correctness kit: does a batching engine compute what unbatched greedy decoding computes?

The ready test, one line in a test module of yours::

    from perfsuite.testing import equivalence_test

    test_my_engine = equivalence_test("my-engine")             # a registered engine, on tiny-random
    test_my_server = equivalence_test("openai-http", endpoint="http://127.0.0.1:8000",
                                      model="smollm2-135m", dtype="float32")
    test_my_runner = runner_equivalence_test(lambda loaded: MyRunner(loaded.model))  # under our schedulers

Each draws scenarios (requests of mixed prompt and output lengths that
arrive while others decode, batch and token-budget knobs, a tight paged KV
pool; then two long scenarios with more requests than the pool holds),
serves them and checks every output token against the reference given the
engine's own prefix (``perfsuite.testing.verdict``: the argmax, or within a
few ulps of the dtype of it; exact lengths), failing with each wrong token
after Hypothesis has shrunk the scenario.

The pieces, for tests of your own::

    from hypothesis import given
    from perfsuite.models import load_model
    from perfsuite.testing import cached_reference, check_engine, scenarios

    loaded = load_model("tiny-random", dtype="float64")
    reference = cached_reference(loaded)           # module level: built once, not per example

    @given(scenario=scenarios(vocab_size=320, max_requests=4))
    def test_mine(scenario):
        check_engine(my_engine, scenario, reference, seconds_per_step=0.002).assert_passed()

- ``scenarios(vocab_size, ...)``: the Hypothesis strategy of ``Scenario``;
  ``shared_prefix_scenarios(vocab_size, ...)``: scenarios whose prompts share
  prefixes on purpose, also served by the paged engine with prefix caching;
- ``check_engine(engine_or_builder, scenario, reference)`` through
  ``BatchingEngine.run`` (any engine, a server through ``openai-http``) and
  ``check_runner(runner, scenario, reference, eos_token_id=...)`` through
  perfsuite's static, in-flight and paged schedulers, step by step; they
  return ``GreedyCheck`` and ``RunnerCheck`` (``passed``, ``near_ties``,
  ``describe()``, ``assert_passed(max_near_ties)``), or with ``tolerance=``
  (a ``LogitTolerance``) the per-token ``TokenCheck``; ``check_tokens`` and
  ``ulp`` are the verdict's pure pieces, ``long_scenarios`` the long strategy;
- ``CachedReference`` / ``cached_reference(loaded)``: the unbatched oracle,
  memoised; ``drive(engine, scenario)``: a step-driven run;
  ``near_tie_tolerance(dtype)`` and ``FLOAT32_NEAR_TIE``;
- the bitwise lane (``bitwise=True`` on either ready test;
  ``perfsuite.testing.bitwise``): ``compositions(vocab_size, ...)``, a needle
  among companions, each request's tokens and log-probabilities the same bits
  as alone; ``NoLogprobs`` when an engine gives none.

Importing this package imports Hypothesis but not torch; the model is
loaded when a test first needs it.
"""

from perfsuite.testing.bitwise import Composition, NoLogprobs, compositions
from perfsuite.testing.checks import EngineBuilder, RunnerCheck, ScheduledRun, check_engine, check_runner
from perfsuite.testing.drive import drive
from perfsuite.testing.greedy import Divergence, GreedyCheck
from perfsuite.testing.ready_tests import equivalence_test, runner_equivalence_test
from perfsuite.testing.reference import (
    FLOAT32_NEAR_TIE,
    NEAR_TIE_BY_DTYPE,
    CachedReference,
    cached_reference,
    near_tie_tolerance,
)
from perfsuite.testing.scenarios import Scenario, long_scenarios, scenarios, shared_prefix_scenarios
from perfsuite.testing.verdict import ULPS_BY_DTYPE, LogitTolerance, TokenCheck, WrongToken, check_tokens, ulp

__all__ = [
    "FLOAT32_NEAR_TIE",
    "NEAR_TIE_BY_DTYPE",
    "ULPS_BY_DTYPE",
    "CachedReference",
    "Composition",
    "Divergence",
    "EngineBuilder",
    "GreedyCheck",
    "LogitTolerance",
    "NoLogprobs",
    "RunnerCheck",
    "Scenario",
    "ScheduledRun",
    "TokenCheck",
    "WrongToken",
    "cached_reference",
    "check_engine",
    "check_runner",
    "check_tokens",
    "compositions",
    "drive",
    "equivalence_test",
    "long_scenarios",
    "near_tie_tolerance",
    "runner_equivalence_test",
    "scenarios",
    "shared_prefix_scenarios",
    "ulp",
]
