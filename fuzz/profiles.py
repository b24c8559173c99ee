"""Hypothesis settings profiles for the property tests and fuzz campaigns.

- ``ci`` (default): few examples, no deadline, no example database; the fuzz property tests
  run in well under a minute.
- ``long``: thousands of examples per property and the campaign database
  (``.hypothesis/enginewire-fuzz``), for nightly or manual campaigns.

Pick one with the environment variable ``ENGINEWIRE_FUZZ_PROFILE`` (``ci`` or ``long``)::

    ENGINEWIRE_FUZZ_PROFILE=long pytest tests/test_fuzz_properties.py

Tests take the profile with ``@settings(parent=profile())`` rather than loading it globally, so
other Hypothesis tests in the same session keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

ENV = "ENGINEWIRE_FUZZ_PROFILE"
PROFILES = ("ci", "long")

_SLOW_DRAWS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
               HealthCheck.filter_too_much]


def register(database_path: str = ".hypothesis/enginewire-fuzz") -> None:
    """Register the ``ci`` and ``long`` profiles (idempotent)."""
    settings.register_profile(
        "ci", max_examples=25, deadline=None, database=None, suppress_health_check=_SLOW_DRAWS,
        print_blob=True,
    )
    settings.register_profile(
        "long", max_examples=2000, deadline=None,
        database=DirectoryBasedExampleDatabase(database_path),
        suppress_health_check=_SLOW_DRAWS, print_blob=True,
    )


def profile(name: str | None = None) -> settings:
    """The settings of profile ``name`` (default: ``$ENGINEWIRE_FUZZ_PROFILE`` or ``ci``)."""
    register()
    chosen = name or os.environ.get(ENV) or "ci"
    if chosen not in PROFILES:
        raise ValueError(f"{ENV}={chosen!r}: use one of {', '.join(PROFILES)}")
    return settings.get_profile(chosen)
