"""The zoo rows learn with their defaults: ``ppo-ref train --env Pendulum-v1`` over three seeds
(the rl-baselines3-zoo settings, ppo_ref.zoo; the zoo publishes -172 with gSDE)."""
import json
import os

import pytest

from ppo_ref import cli


@pytest.mark.slow
def test_pendulum_default_cli_learns_over_three_seeds(tmp_path):
    run_dir = str(tmp_path / "pendulum")
    assert cli.main(["train", "--env", "Pendulum-v1", "--seeds", "0-2",
                     "--run-dir", run_dir]) == 0
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert [r["exit_code"] for r in summary["runs"]] == [0, 0, 0]
    assert all(r["timesteps"] >= 100_000 for r in summary["runs"])
    assert summary["final_return"]["mean"] >= -250.0
