"""The actor-learner's learner and the synchronous trainer are one learner.

The synchronous trainer collects two rollouts and trains on them; the same transitions, sent to
the learner as Experience messages (the actors' protocol, reset_observation included), must give
the same Rollout (episode starts, bootstrap values, finished episodes), the same advantages and
returns, the same counters and the same parameters after every update, under every preset and
both tiers. The env ends episodes on a schedule that puts a terminal on the last row (read by
the thrust preset's bootstrap_terminal_last_row), truncations inside the rollout and on its last
row (final observations), and a step that is both terminated and truncated. With V-trace in its
on-policy case (behaviour = target log-probs, bars 1) the learner must give GAE with lambda 1.
"""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppo_ref.distributed import AsyncActorLearnerConfig, Experience, make_learner
from ppo_ref.distributed.learner import _Learner
from ppo_ref.config import PPOConfig, PRESETS
from ppo_ref.train.ppo import PPOTrainer

T, N = 8, 4
# (episode length at which env i terminates, at which it truncates), counted from its reset:
# env 0 terminates on rows 3 and 7 of each rollout (a terminal last row), env 1 truncates on
# rows 2 and 5 (and row 0 of the second rollout), env 2 truncates on its last row, env 3
# terminates and truncates on the same step.
SCHEDULE = [(4, 1000), (1000, 3), (1000, 8), (5, 5)]


class ScriptedEnv(gym.Env):
    """Random observations, a reward that depends on the observation, the action and the step,
    episodes that end on SCHEDULE[index]; remembers every observation step returned."""

    def __init__(self, index: int, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = (gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous
                             else gym.spaces.Discrete(2))
        self.terminate_at, self.truncate_at = SCHEDULE[index]
        self.step_observations = []
        self.t = 0
        self.obs = np.zeros(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.normal(size=3)
        return self.obs.copy(), {}

    def step(self, action):
        self.t += 1
        a = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        reward = float(self.obs[0] * (a - 0.5) + 0.1 * self.t)
        self.obs = self.np_random.normal(size=3)
        self.step_observations.append(self.obs.copy())
        return (self.obs.copy(), reward, self.t == self.terminate_at, self.t == self.truncate_at,
                {})


class NoActors:
    """The learner's view of its actors when the test hands it the messages itself."""

    def broadcast(self, message) -> None:
        pass


def experiences(rollout, envs, observations_after, first_step: int):
    """The rollout's transitions as the messages actor n would have sent (column n)."""
    done = rollout.terminated | rollout.truncated
    out = []
    for t in range(T):
        for n in range(N):
            reset = None
            if done[t, n]:   # the observation the env continued from after its reset
                reset = rollout.observations[t + 1, n] if t + 1 < T else observations_after[n]
            out.append(Experience(
                n, rollout.observations[t, n].copy(), rollout.actions[t, n].copy(),
                float(rollout.rewards[t, n]), envs[n].unwrapped.step_observations[first_step + t].copy(),
                bool(rollout.terminated[t, n]), bool(rollout.truncated[t, n]),
                float(rollout.values[t, n]), float(rollout.log_probs[t, n]), 0,
                None if reset is None else reset.copy()))
    return out


def run_both(preset: str, tier: str, use_vtrace: bool, continuous: bool = False):
    """Two updates of the synchronous trainer and of the learner on the same transitions;
    yields (sync Iteration, learner UpdateInfo, sync trainer, learner trainer) per update."""
    ppo = PPOConfig.preset(preset, batch_size=16, n_epochs=2, backend=tier)
    config = AsyncActorLearnerConfig(
        num_actors=N, n_steps=T, total_timesteps=2 * T * N, gamma=0.9,
        gae_lambda=1.0 if use_vtrace else 0.8, use_vtrace=use_vtrace, actors="thread",
        ppo=ppo, seed=3)
    sync_env = SyncVectorEnv([functools.partial(ScriptedEnv, i, continuous) for i in range(N)],
                             autoreset_mode=AutoresetMode.SAME_STEP)
    sync = PPOTrainer(sync_env, config.learner_ppo_config(), seed=config.seed)
    trainer = make_learner(config, functools.partial(ScriptedEnv, 0, continuous))
    for t in (sync, trainer):
        t.total_timesteps = config.num_updates * T * N
    learner = _Learner(config, trainer, NoActors(), None)
    envs = sync_env.envs
    try:
        for update in range(config.num_updates):
            step = sync.iteration()
            for message in experiences(step.rollout, envs, sync.collector.obs, update * T):
                assert learner.handle(message)
            yield step, learner.update(), sync, trainer
    finally:
        sync.close()
        trainer.close()


def assert_same_rollout(a, b, rtol=0.0):
    """Equal rollouts; the bootstrap values (computed from each side's parameters) within
    ``rtol`` (0: bit for bit)."""
    for name in ("observations", "actions", "rewards", "terminated", "truncated",
                 "episode_starts", "values", "log_probs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert (a.final_values is None) == (b.final_values is None)
    for name in ("last_values", "final_values"):
        if getattr(a, name) is not None:
            np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=rtol,
                                       atol=rtol * 1e-3, err_msg=name)
    assert (a.episode_returns, a.episode_lengths, a.episode_envs) == \
           (b.episode_returns, b.episode_lengths, b.episode_envs)


def assert_same_counters(sync, trainer):
    for name in ("num_timesteps", "n_updates", "n_episodes", "progress_remaining",
                 "last_episodes"):
        assert getattr(sync, name) == getattr(trainer, name), name
    assert list(sync.recent_returns) == list(trainer.recent_returns)


@pytest.mark.parametrize("tier", ["fast", "spec"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_learner_gives_the_trainers_rollout_advantages_and_parameters(preset, tier):
    terminal_last_rows = 0
    for step, info, sync, trainer in run_both(preset, tier, use_vtrace=False):
        assert_same_rollout(step.rollout, info.rollout)
        np.testing.assert_array_equal(info.advantages, step.advantages)
        np.testing.assert_array_equal(info.returns, step.returns)
        assert_same_counters(sync, trainer)
        assert list(sync.params) == list(trainer.params)
        for key in sync.params:   # the same minibatches (minibatch_rng) and the same steps
            np.testing.assert_array_equal(trainer.params[key], sync.params[key], err_msg=key)
        # the schedule exercised what the conventions disagree on
        r = step.rollout
        assert r.terminated[-1, 0] and r.truncated[-1, 2] and r.final_values[-1, 2] != 0
        assert (r.terminated & r.truncated).any() and r.truncated[:-1].any()
        terminal_last_rows += 1
    assert terminal_last_rows == 2


def test_a_terminal_last_row_bootstraps_the_reset_observation_under_thrust():
    """The case the two copies disagreed on: thrust's bootstrap_terminal_last_row reads
    last_values at a terminated column, which is V(observation after the reset)."""
    runs = run_both("thrust", "fast", use_vtrace=False)
    step, info, sync, trainer = next(runs)
    runs.close()
    assert step.rollout.terminated[-1, 0]
    assert info.rollout.last_values[0] != 0.0
    np.testing.assert_array_equal(info.rollout.last_values, step.rollout.last_values)
    # and that value moves the advantage of the terminal last row
    rewards, values = step.rollout.rewards, step.rollout.values
    expected = rewards[-1, 0] + 0.9 * step.rollout.last_values[0] - values[-1, 0]
    np.testing.assert_allclose(info.advantages[-1, 0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tier", ["fast", "spec"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_on_policy_vtrace_learner_equals_trainer_gae_lambda_one(preset, tier):
    for step, info, sync, trainer in run_both(preset, tier, use_vtrace=True):
        # (after the first update the two sides' parameters differ by rounding)
        assert_same_rollout(step.rollout, info.rollout, rtol=1e-9)
        np.testing.assert_allclose(info.advantages, step.advantages, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(info.returns, step.returns, rtol=1e-12, atol=1e-12)
        assert_same_counters(sync, trainer)
        for key in sync.params:
            np.testing.assert_allclose(trainer.params[key], sync.params[key], rtol=1e-9,
                                       atol=1e-12, err_msg=key)


def test_gaussian_actions_learner_equals_trainer():
    for step, info, sync, trainer in run_both("reference", "fast", use_vtrace=False,
                                              continuous=True):
        assert_same_rollout(step.rollout, info.rollout)
        np.testing.assert_array_equal(info.advantages, step.advantages)
        np.testing.assert_array_equal(info.returns, step.returns)
        for key in sync.params:
            np.testing.assert_array_equal(trainer.params[key], sync.params[key], err_msg=key)
