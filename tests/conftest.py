"""Test configuration: bounded hypothesis profiles and shared fixtures.

Profiles (select with the environment variable HYPOTHESIS_PROFILE):
  ci   (default): max_examples=40, deadline=None. deadline is off on purpose: the first example
       of a property may include numba compilation (seconds) and CI machines are shared, so a
       per-example deadline would fail on timing, not on correctness. The number of examples is
       what bounds the run time.
  dev : max_examples=300, for a deeper local search.
"""
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracles.py, tests/gradcheck.py

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dev", max_examples=300, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    """A fresh, seeded generator for each test (never global random state)."""
    return np.random.default_rng(12345)
