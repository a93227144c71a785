"""SmolLM2 for the slow tests, or a skip that says how to install it."""

from __future__ import annotations

import pytest

from perfsuite.models import load_model


def load_smollm2_or_skip():
    """SmolLM2 in float32, or a skip that says how to install it."""
    pytest.importorskip("gguf", reason="SmolLM2 needs gguf: make install")
    try:
        return load_model("smollm2-135m", dtype="float32")
    except Exception as error:  # the wheel is installed by `make`; say how when it is not
        pytest.skip(f"SmolLM2 unavailable ({error})")
