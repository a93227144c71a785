"""Repo-local pytest defaults: Hypothesis profiles.

``ci`` (the default, and what CI uses) is derandomized with no deadline, so a
run is reproducible and slow CPU steps never count as failures. ``dev``
explores more examples: ``HYPOTHESIS_PROFILE=dev make test``. A failure found
with ``dev`` becomes an ``@example`` on its test so it stays fixed.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
