"""The readable tier trains: with ``backend="spec"`` PPO solves CartPole-v1 and the spec LSTM
policy solves MemoryCue-v0; ``ppo-ref train --backend spec`` runs that tier.

With ``PPOConfig.backend = "spec"`` every computation of an update runs in ``ppo_ref/spec/``:
the GAE recursion interpreted, the NumPy actor-critic and LSTM with their hand-written
backward passes, the readable losses, Adam and the epoch loop. These are learning tests of
that path alone (its agreement with the compiled tier is ``tests/test_backends.py``'s job).

CartPole-v1: the README's main run (the rl-baselines3-zoo settings, seed 0) on the readable
tier; the bar is the task's own "solved" level, a mean of at least 475 over the last 20
training episodes (500 is the maximum), reached within the README's budget of 100k steps (the
run stops there). The test asks whether the tier learns the task, not where an annealed run
ends: the two tiers' runs separate after about 35 updates (rounding differences of the BLAS
products grow until the trajectories differ), and this tier's seed-0 run, solved after 37,632
steps, had fallen back to a mean of 166 at 100k steps when it was measured.

MemoryCue-v0: the settings of ``tests/test_recurrent_learning.py`` (16 envs x 32 steps, whole-env
minibatches of 4 envs, an LSTM of 32 units with linear heads, at most 40k steps, seed 0), stopped,
as there, once the last 100 training episodes answered 95% right; the bar is 95% correct answers
over 400 deterministic evaluation episodes (a policy without memory gets 50%).
"""
import json
import os

import numpy as np
import pytest

from ppo_ref import cli
from ppo_ref.config import PPOConfig
from ppo_ref.io.checkpoint import load_checkpoint
from ppo_ref.train.ppo import PPOTrainer
from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer

from early_commands import assert_succeeded, python_call
from test_recurrent_learning import BUDGET, CONFIG, ENV_ID, answers_learned, correct_fraction

SOLVED = 475.0


def test_cli_train_backend_spec_runs_the_readable_tier(tmp_path):
    run_dir = str(tmp_path / "run")
    code = cli.main(["train", "--backend", "spec", "--total-timesteps", "512", "--run-dir",
                     run_dir, "--quiet"])
    assert code == 0
    with open(os.path.join(run_dir, "config.json")) as fh:
        assert json.load(fh)["config"]["backend"] == "spec"
    _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
    assert meta["config"]["backend"] == "spec" and meta["num_timesteps"] == 512
    trainer = PPOTrainer.load(os.path.join(run_dir, "checkpoint.npz"))
    assert trainer.tier.name == "spec"
    trainer.close()


def spec_backend_cartpole_run():
    trainer = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(backend="spec"), seed=0)

    def last20(t):
        returns = list(t.recent_returns)[-20:]
        return float(np.mean(returns)) if len(returns) == 20 else 0.0
    trainer.learn(100_000, lambda t, s: last20(t) < SOLVED)
    trainer.close()
    assert last20(trainer) >= SOLVED, (f"mean return of the last 20 episodes: "
                                       f"{last20(trainer):.1f} after {trainer.num_timesteps} steps")


def spec_lstm_memory_cue_run():
    trainer = RecurrentPPOTrainer(ENV_ID, CONFIG.replace(net_arch=(), backend="spec"), seed=0)
    trainer.learn(BUDGET, lambda t, s: not answers_learned(t))
    score = correct_fraction(trainer)
    assert score >= 0.95, f"the spec LSTM answered {score:.1%} correctly"


# each run in a process of its own, started at the end of collection (tests/early_commands.py)
@pytest.mark.slow
@pytest.mark.early_command(python_call(spec_backend_cartpole_run), timeout=900)
def test_spec_backend_solves_cartpole_within_100k_steps(early_command):
    assert_succeeded(early_command)


@pytest.mark.slow
@pytest.mark.early_command(python_call(spec_lstm_memory_cue_run), timeout=900)
def test_spec_lstm_policy_solves_memory_cue(early_command):
    assert_succeeded(early_command)
