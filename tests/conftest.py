"""Test configuration for tests/: hypothesis profiles and shared fixtures."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracles.py, tests/gradcheck.py

import hypothesis_profiles  # noqa: E402,F401  (registers and loads the bounded profile)
from early_commands import (early_command, pytest_collection_finish,  # noqa: E402,F401
                            pytest_configure, pytest_pyfunc_call, pytest_sessionfinish)


@pytest.fixture
def rng():
    """A fresh, seeded generator for each test (never global random state)."""
    return np.random.default_rng(12345)


@pytest.fixture
def resumed_half_way(tmp_path):
    """``make(cfg) -> (full, part, resumed)``: PPOTrainer("Pendulum-v1", cfg, seed=3) trained
    for 1024 steps (``full``), the same run stopped at 512 steps and saved (``part``), and that
    checkpoint loaded (``resumed``, not yet continued): the exact-resume tests' setup."""
    from ppo_ref import PPOTrainer

    def make(cfg):
        full = PPOTrainer("Pendulum-v1", cfg, seed=3)
        full.learn(1024)
        part = PPOTrainer("Pendulum-v1", cfg, seed=3)
        part.learn(1024, lambda t, s: t.num_timesteps < 512)
        path = tmp_path / "ckpt.npz"
        part.save(path)
        return full, part, PPOTrainer.load(path)
    return make

