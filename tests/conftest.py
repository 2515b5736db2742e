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


@pytest.fixture
def fast_loss_declines(monkeypatch):
    """A list that records, per minibatch loss computed from now on, whether the compiled fast
    path of ``ppo_ref.update.minibatch_loss`` declined it (``True``) or took it (``False``)."""
    from ppo_ref import update
    fast = update._fast_minibatch_loss
    declined = []

    def recording(*args):
        out = fast(*args)
        declined.append(out is None)
        return out
    monkeypatch.setattr(update, "_fast_minibatch_loss", recording)
    return declined
