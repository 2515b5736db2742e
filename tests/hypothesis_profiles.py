"""Bounded hypothesis profiles, shared by tests/ and validation/ (loaded by both conftest files).

Select with the environment variable HYPOTHESIS_PROFILE:
  ci   (default): max_examples=40, deadline=None, derandomized. The deadline is off on purpose:
       the first example of a property may include numba compilation (seconds) and CI machines
       are shared, so a per-example deadline would fail on timing, not on correctness. The
       number of examples is what bounds the run time; slow properties lower it per test.
  dev : max_examples=300, random, for a deeper local search.
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dev", max_examples=300, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
