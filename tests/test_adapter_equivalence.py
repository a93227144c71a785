"""Every registered engine that claims ``greedy_equal`` computes unbatched greedy decoding, token for token.

The engines are driven the way the harness drives them: built by name through
the registry and served with ``engine.run`` (all requests at t0). perfsuite's
own engines are also covered step by step in test_equivalence.py; running them
here checks the protocol path. An engine that cannot be built over a local
model (``openai-http`` needs a server) is skipped.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings

from perfsuite.adapters import Backend, EngineConfig, available_engines, build_engine
from perfsuite.engine.names import DEFAULT_ENGINES
from perfsuite.models import load_model
from perfsuite.testing import FLOAT32_NEAR_TIE, cached_reference, check_engine, scenarios
from smollm2 import load_smollm2_or_skip

MAX_SEQ_LEN = 64
# Smaller than test_equivalence.py's scenarios: a Hugging Face step costs
# milliseconds of Python, and a scenario with B=1 runs every request alone.
SMALL_SCENARIOS = scenarios(vocab_size=320, max_requests=6, max_prompt_len=24, max_new_tokens=12, max_batch_size=4)


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return Backend.from_loaded(loaded), cached_reference(loaded)


@pytest.fixture(scope="module", params=sorted(available_engines()))
def engine_name(request, tiny):
    try:
        engine = build_engine(request.param, tiny[0], EngineConfig(2, MAX_SEQ_LEN))
    except Exception as error:  # noqa: BLE001 - any engine that needs more than a local model
        pytest.skip(f"{request.param} cannot be built over a local model: {error}")
    if not engine.greedy_equal:
        pytest.skip(f"{request.param} does not claim greedy_equal")
    return request.param


@settings(max_examples=15)
@given(scenario=SMALL_SCENARIOS)
def test_greedy_equal_engines_reproduce_the_reference(tiny, engine_name, scenario):
    backend, reference = tiny
    build = functools.partial(build_engine, engine_name, backend)
    check_engine(build, scenario, reference, max_seq_len=MAX_SEQ_LEN).assert_passed()


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_smollm2_or_skip()
    return Backend.from_loaded(loaded), cached_reference(loaded)


@pytest.mark.slow
@settings(max_examples=4)
@given(scenario=scenarios(vocab_size=49152, max_requests=5, max_prompt_len=24, max_new_tokens=10, max_batch_size=4))
def test_greedy_equal_engines_reproduce_smollm2_float32(smollm2, engine_name, scenario):
    if engine_name in DEFAULT_ENGINES:
        pytest.skip("perfsuite's engines meet SmolLM2 in test_equivalence.py")
    backend, reference = smollm2
    build = functools.partial(build_engine, engine_name, backend)
    check = check_engine(build, scenario, reference, max_seq_len=MAX_SEQ_LEN, near_tie_tolerance=FLOAT32_NEAR_TIE)
    check.assert_passed(max_near_ties=1)
