"""The zoo rows learn with their defaults: ``ppo-ref train --env Pendulum-v1`` over three seeds
(the rl-baselines3-zoo settings, ppo_ref.zoo; the zoo publishes -172 with gSDE). The run starts
at the end of collection and trains while the other tests run (conftest.py, ``early_command``)."""
import json
import os
import sys

import pytest


@pytest.mark.slow
@pytest.mark.early_command([sys.executable, "-m", "ppo_ref", "train", "--env", "Pendulum-v1",
                            "--seeds", "0-2", "--run-dir", "{dir}/pendulum"])
def test_pendulum_default_cli_learns_over_three_seeds(early_command):
    done, directory = early_command
    assert done.returncode == 0, done.stdout + done.stderr
    with open(os.path.join(directory, "pendulum", "summary.json")) as f:
        summary = json.load(f)
    assert [r["exit_code"] for r in summary["runs"]] == [0, 0, 0]
    assert all(r["timesteps"] >= 100_000 for r in summary["runs"])
    assert summary["final_return"]["mean"] >= -250.0
