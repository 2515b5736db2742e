"""The readable tier trains: ``ppo-ref train --backend spec`` solves CartPole-v1 and the spec LSTM
policy solves MemoryCue-v0.

With ``PPOConfig.backend = "spec"`` every computation of an update runs in ``ppo_ref/spec/``:
the GAE recursion interpreted, the NumPy actor-critic and LSTM with their hand-written
backward passes, the readable losses, Adam and the epoch loop. These are learning tests of
that path alone (its equality with the compiled tier is ``tests/test_tiers.py``'s job).

CartPole-v1: the README's main command (the rl-baselines3-zoo settings, 100k steps, seed 0) with
``--backend spec``; the bar is the task's own "solved" level, a mean of at least 475 over the last
20 training episodes (500 is the maximum).

MemoryCue-v0: the settings of ``tests/test_recurrent_learning.py`` (16 envs x 32 steps, whole-env
minibatches of 4 envs, an LSTM of 32 units with linear heads, 40k steps, seed 0); the bar is 95%
correct answers over 400 deterministic evaluation episodes (a policy without memory gets 50%).
"""
import os

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
from ppo_ref.io.runlog import read_csv

from test_recurrent_learning import BUDGET, CONFIG, ENV_ID, correct_fraction


@pytest.mark.slow
def test_cli_train_backend_spec_solves_cartpole(tmp_path):
    run_dir = str(tmp_path / "run")
    code = cli.main(["train", "--backend", "spec", "--run-dir", run_dir, "--quiet"])
    assert code == 0
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert episodes["timesteps"][-1] <= 100_000 + 256  # within the budget (one rollout over)
    last20 = float(np.mean(episodes["return"][-20:]))
    assert last20 >= 475.0, f"mean return of the last 20 episodes: {last20:.1f}"


@pytest.mark.slow
def test_spec_lstm_policy_solves_memory_cue():
    trainer = RecurrentPPOTrainer(ENV_ID, CONFIG.replace(net_arch=(), backend="spec"), seed=0)
    trainer.learn(BUDGET)
    score = correct_fraction(trainer)
    assert score >= 0.95, f"the spec LSTM answered {score:.1%} correctly"
