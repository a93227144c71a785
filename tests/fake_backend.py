"""The conftest of a pytester project whose perf tests run perfsuite's engines over a fake model runner.

No model and no torch: each step of ``FakeRunner`` sleeps ``FAKE_STEP_SECONDS``
(default 0.004), so a test sets the engine's speed through the environment.
Sleeping steps do not follow the machine's speed, so the backend has no
machine probe.
"""

FAKE_BACKEND_CONFTEST = """
import os, time, pytest
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.adapters import Backend

@pytest.fixture(scope="session")
def perf_backend():
    delay = float(os.environ.get("FAKE_STEP_SECONDS", "0.004"))
    runner = FakeRunner(vocab_size=97, on_execute=lambda output: time.sleep(delay))
    tokenize = lambda text: [3 + b % 90 for b in text.encode()][:12]
    return Backend(runner=runner, tokenize=tokenize, eos_token_id=None, max_context=512, device="cpu", probe=None)
"""
