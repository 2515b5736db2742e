"""Test configuration for tests/: hypothesis profiles and shared fixtures."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracles.py, tests/gradcheck.py

import hypothesis_profiles  # noqa: E402,F401  (registers and loads the bounded profile)


@pytest.fixture
def rng():
    """A fresh, seeded generator for each test (never global random state)."""
    return np.random.default_rng(12345)
