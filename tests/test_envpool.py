"""envpool stepping (``vectorization="envpool"``): the rollout records the same transitions from
envpool's CartPole as from gymnasium's, started in the same states and driven by the same policy.

Runs where envpool is installed (``.ci/run`` installs the ``envpool`` extra)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppo_ref import PPOConfig, PPOTrainer
from ppo_ref.train.rollout import make_vector_env

envpool = pytest.importorskip("envpool")

N_ENVS, N_STEPS, MAX_STEPS = 4, 96, 30


def _config():
    return PPOConfig.zoo_cartpole().replace(n_envs=N_ENVS, n_steps=N_STEPS)


class _StartsAt(CartPoleEnv):
    """gymnasium's CartPole whose episodes start in given states (in order), not random ones."""

    def __init__(self, starts):
        super().__init__()
        self.starts = list(starts)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.array(self.starts.pop(0), dtype=np.float64)
        self.steps_beyond_terminated = None
        return np.array(self.state, dtype=np.float32), {}


def _episode_starts(rollout, last_obs, env: int):
    """The first observation of every episode env ``env`` began in the rollout (and after it)."""
    rows = [rollout.observations[t, env] for t in range(rollout.observations.shape[0])
            if rollout.episode_starts[t, env]]
    return rows + [last_obs[env]]


def test_rollout_records_the_same_transitions_as_gymnasium():
    config = _config()
    pool = make_vector_env("CartPole-v1", N_ENVS, vectorization="envpool",
                           env_kwargs={"max_episode_steps": MAX_STEPS})
    reference = PPOTrainer(pool, config, seed=3)
    ours = reference.collect_rollout()
    last_obs = reference.collector.obs
    mirror = SyncVectorEnv(
        [lambda i=i: gym.wrappers.TimeLimit(_StartsAt(_episode_starts(ours, last_obs, i)),
                                            MAX_STEPS) for i in range(N_ENVS)],
        autoreset_mode=AutoresetMode.SAME_STEP)
    trainer = PPOTrainer(mirror, config, seed=3)
    theirs = trainer.collect_rollout()
    # the rollout ends several episodes in every env, some by termination, some by truncation
    assert ours.terminated.any() and ours.truncated.any()
    # and one episode both terminates and reaches its step limit on the same step (envpool
    # itself reports that as truncated only; gymnasium, and so the adapter, as both)
    assert (ours.terminated & ours.truncated).any()
    assert (ours.terminated | ours.truncated).sum(axis=0).min() >= 2
    for name in ("actions", "rewards", "terminated", "truncated", "episode_starts"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)
    # envpool steps the dynamics in float64 from its unrounded start state; the mirror starts
    # from the float32 observation of it, so the trajectories agree to float32 precision
    for name in ("observations", "values", "log_probs", "final_values", "last_values"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=0,
                                   atol=1e-5, err_msg=name)
    assert ours.episode_returns == theirs.episode_returns
    assert ours.episode_lengths == theirs.episode_lengths
    np.testing.assert_allclose(last_obs, trainer.collector.obs, rtol=0, atol=1e-5)


def test_reset_step_is_never_a_transition():
    """After an episode ends, the row holds the next episode's first observation (marked as an
    episode start) and the ended episode's last observation is the truncation bootstrap's."""
    config = _config()
    pool = make_vector_env("CartPole-v1", N_ENVS, vectorization="envpool",
                           env_kwargs={"max_episode_steps": MAX_STEPS})
    rollout = PPOTrainer(pool, config, seed=0).collect_rollout()
    ended = rollout.terminated | rollout.truncated
    # every step returns reward 1: a reset step (reward 0) never entered the rollout
    np.testing.assert_array_equal(rollout.rewards, 1.0)
    np.testing.assert_array_equal(rollout.episode_starts[1:], ended[:-1])
    lengths = np.array(rollout.episode_lengths)
    assert lengths.max() <= MAX_STEPS and (lengths == MAX_STEPS).any()
    assert rollout.final_values is not None
    assert np.all(rollout.final_values[rollout.truncated & ~rollout.terminated] != 0)


def test_seeds_are_honoured():
    def first_rollout(seed):
        trainer = PPOTrainer("CartPole-v1", _config(), seed=seed, vectorization="envpool")
        return trainer.collect_rollout().observations

    np.testing.assert_array_equal(first_rollout(1), first_rollout(1))
    assert not np.array_equal(first_rollout(1), first_rollout(2))


def test_an_id_envpool_does_not_have_is_one_clear_error():
    with pytest.raises(ValueError, match="envpool has no env 'ppo_ref/CartPoleNoVel-v1'"):
        make_vector_env("ppo_ref/CartPoleNoVel-v1", 2, vectorization="envpool")


def test_without_envpool_installed_the_error_says_how_to_install(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_envpool(name, *args, **kwargs):
        if name == "envpool":
            raise ImportError("No module named 'envpool'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_envpool)
    with pytest.raises(ValueError, match=r"pip install 'ppo_ref\[envpool\]'"):
        make_vector_env("CartPole-v1", 2, vectorization="envpool")


def test_trainer_learns_cartpole_with_envpool():
    trainer = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(), seed=0,
                         vectorization="envpool")
    # stops once the recent episodes clear the bar (at most the 40k budget)
    trainer.learn(40_000, lambda t, s: not np.mean(t.recent_returns) > 150)
    assert np.mean(trainer.recent_returns) > 150


def test_an_envpool_run_trains_and_evaluates_from_the_cli_and_refuses_an_inexact_resume(
        tmp_path, capsys):
    from ppo_ref import cli
    run_dir = str(tmp_path / "run")
    assert cli.main(["train", "--vectorization", "envpool", "--total-timesteps", "512",
                     "--run-dir", run_dir, "--quiet"]) == 0
    assert "512 steps" in capsys.readouterr().out
    assert cli.main(["train", "--resume", run_dir, "--total-timesteps", "1024"]) != 0
    assert "cannot be resumed" in capsys.readouterr().err
    assert cli.main(["eval", run_dir, "--episodes", "2"]) == 0  # eval needs no env state
    assert "CartPole-v1: 2 episodes" in capsys.readouterr().out


def test_an_id_gymnasium_does_not_register_keeps_envpools_step_limit():
    env = make_vector_env("NChain-v0", 2, vectorization="envpool")
    limit = envpool.make_spec("NChain-v0").config.max_episode_steps
    assert env.max_episode_steps == limit
    env.reset(seed=[5, 6])
    for step in range(1, limit + 1):
        _, _, terminated, truncated, info = env.step(np.zeros(2, dtype=np.int64))
        assert not terminated.any()
        assert truncated.all() == (step == limit)
    assert all(info["final_obs"][i] is not None for i in range(2))
    env.close()


class _PendulumStartsAt(gym.envs.classic_control.pendulum.PendulumEnv):
    """gymnasium's Pendulum whose episodes start in given states (read from observations)."""

    def __init__(self, starts):
        super().__init__()
        self.starts = list(starts)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        cos, sin, velocity = np.asarray(self.starts.pop(0), dtype=np.float64)
        self.state = np.array([np.arctan2(sin, cos), velocity])
        return self._get_obs(), {}


def test_box_actions_record_the_same_transitions_as_gymnasium():
    """Pendulum (a Box action, clipped to the bounds before the env sees it; a 30-step limit)."""
    config = PPOConfig(n_envs=2, n_steps=64, batch_size=64)
    pool = make_vector_env("Pendulum-v1", 2, vectorization="envpool",
                           env_kwargs={"max_episode_steps": MAX_STEPS})
    reference = PPOTrainer(pool, config, seed=4)
    ours = reference.collect_rollout()
    last_obs = reference.collector.obs
    mirror = SyncVectorEnv(
        [lambda i=i: gym.wrappers.TimeLimit(
            _PendulumStartsAt(_episode_starts(ours, last_obs, i)), MAX_STEPS)
         for i in range(2)], autoreset_mode=AutoresetMode.SAME_STEP)
    theirs = PPOTrainer(mirror, config, seed=4).collect_rollout()
    assert ours.truncated.sum() >= 4 and not ours.terminated.any()
    for name in ("truncated", "terminated", "episode_starts"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)
    for name in ("observations", "actions", "rewards", "values", "final_values"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-4,
                                   atol=1e-4, err_msg=name)
