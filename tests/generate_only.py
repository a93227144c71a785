"""A Hypothesis profile that generates examples but shrinks no failure, for tests that need a failure, not its shrinking."""

from __future__ import annotations

import contextlib

from hypothesis import Phase, settings


@contextlib.contextmanager
def not_shrunk():
    """Ready tests made inside run the active profile's generated examples but shrink no failure (an inverse or a
    mutant's test needs the failure, not its shrinking); a ready test reads the profile when it is made."""
    previous = settings.get_current_profile_name()
    settings.register_profile("generate-only", parent=settings.get_profile(previous), phases=[Phase.generate])
    settings.load_profile("generate-only")
    try:
        yield
    finally:
        settings.load_profile(previous)
