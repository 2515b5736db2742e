"""Env outputs of the wrong kind stop the rollout with EnvStepError naming the env and the step;
observations too large for the running normalizer statistics are refused instead of becoming 0."""
import gymnasium as gym
import numpy as np
import pytest

from ppo_ref.config import PPOConfig
from ppo_ref.train.ppo import PPOTrainer
from ppo_ref.train.rollout import EnvStepError

from test_rollout_helpers import same_step_vector_env

AT = 5  # the junk comes at this sub-env step


class JunkEnv(gym.Wrapper):
    """CartPole whose step number ``AT`` replaces one output (``field``) with ``value``."""

    def __init__(self, field, value):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.field, self.value, self.steps = field, value, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps == AT:
            out = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated}
            out[self.field] = self.value
            return out["obs"], out["reward"], out["terminated"], out["truncated"], info
        return obs, reward, terminated, truncated, info


class JunkVector(gym.vector.VectorWrapper):
    """A vector env (not a plain SyncVectorEnv: the collector calls its ``step``) whose vector
    step number ``AT`` returns ``value`` in place of one of its arrays."""

    def __init__(self, env, field, value):
        super().__init__(env)
        self.field, self.value, self.steps = field, value, 0

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.steps += 1
        if self.steps == AT:
            out = {"obs": obs, "reward": rewards, "terminated": terminated, "truncated": truncated}
            out[self.field] = self.value
            return out["obs"], out["reward"], out["terminated"], out["truncated"], info
        return obs, rewards, terminated, truncated, info


JUNK = [("obs", np.array([0.1, 0.2, 0.3, 0.4]) * (1 + 1j)),
        ("obs", np.array(["0.1", "0.2", "0.3", "0.4"])),
        ("obs", np.array([0.1, None, 0.3, 0.4], dtype=object)),
        ("reward", "1.5"),
        ("reward", 1 + 2j),
        ("reward", np.array([1.0, 2.0])),
        ("reward", None),
        ("terminated", "no"),
        ("truncated", "yes"),
        ("terminated", 0.5),
        ("terminated", None)]


def _names(case):
    field, value = case
    return f"{field}-{type(value).__name__}-{getattr(value, 'dtype', '')}"


@pytest.mark.parametrize("field, value", JUNK, ids=[_names(c) for c in JUNK])
def test_sub_env_junk_is_refused_naming_env_and_step(field, value):
    good = lambda: gym.make("CartPole-v1", disable_env_checker=True)  # noqa: E731
    env = same_step_vector_env([good, lambda: JunkEnv(field, value)])
    trainer = PPOTrainer(env, PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0)
    with pytest.raises(EnvStepError, match=field.replace("obs", "observation")) as info:
        trainer.collect_rollout()
    err = info.value
    assert err.env_index == 1 and err.vector_step == AT - 1
    assert "env 1" in str(err) and f"vector step {AT - 1}" in str(err)


VECTOR_JUNK = [("obs", np.full((2, 4), 0.5 + 1j)),
               ("obs", np.full((2, 4), "0.5")),
               ("reward", np.array(["1", "1"])),
               ("reward", np.array([1.0, 1j])),
               ("terminated", np.array(["no", "no"])),
               ("truncated", np.array([0.5, 0.0])),
               ("terminated", np.array([False, False, False]))]


@pytest.mark.parametrize("field, value", VECTOR_JUNK, ids=[_names(c) for c in VECTOR_JUNK])
def test_vector_env_junk_arrays_are_refused(field, value):
    good = lambda: gym.make("CartPole-v1", disable_env_checker=True)  # noqa: E731
    env = JunkVector(same_step_vector_env([good, good]), field, value)
    trainer = PPOTrainer(env, PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0)
    with pytest.raises(EnvStepError, match=field.replace("obs", "observation")) as info:
        trainer.collect_rollout()
    assert info.value.vector_step == AT - 1 and f"vector step {AT - 1}" in str(info.value)


class HugeObsEnv(gym.Wrapper):
    """CartPole with float64 observations (its space says so: a vector env stores what the
    space declares), multiplied by ``scale`` from step ``AT`` on."""

    def __init__(self, scale):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
        self.scale, self.steps = scale, 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs.astype(np.float64), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps >= AT:
            obs = obs.astype(np.float64) * self.scale + self.scale
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("n_envs", [1, 3])
def test_observation_normalizer_overflow_is_refused(n_envs):
    fns = [lambda: HugeObsEnv(1.0)] * (n_envs - 1)  # (the same space: ordinary values)
    env = same_step_vector_env(fns + [lambda: HugeObsEnv(1e200)])
    cfg = PPOConfig(n_envs=n_envs, n_steps=16, batch_size=16 * n_envs, normalize_observations=True)
    trainer = PPOTrainer(env, cfg, seed=0)
    var_before = None
    with pytest.raises(EnvStepError, match="running variance") as info:
        trainer.collect_rollout()
    err = info.value
    assert err.env_index == n_envs - 1 and err.vector_step == AT - 1
    rms = trainer.collector.obs_moments
    assert np.isfinite(rms.var).all() and np.isfinite(rms.mean).all()  # statistics untouched
    del var_before


def test_large_but_representable_observations_still_normalize():
    env = same_step_vector_env([lambda: HugeObsEnv(1e150)] * 2)
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, normalize_observations=True)
    trainer = PPOTrainer(env, cfg, seed=0)
    r = trainer.collect_rollout()
    assert np.isfinite(r.observations).all() and np.abs(r.observations[AT:]).max() > 0.1


class ResetFailsEnv(gym.Wrapper):
    """CartPole whose reset raises (``when="first"``: the first one; ``"later"``: every reset
    after the first, so the autoreset within a step fails)."""

    def __init__(self, when):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.when, self.resets = when, 0

    def reset(self, **kwargs):
        self.resets += 1
        if self.when == "first" or self.resets > 1:
            raise RuntimeError("no reset today")
        return self.env.reset(**kwargs)


def test_an_env_failing_in_reset_is_reported_as_failing_in_reset():
    """The first reset is not a rollout step: the error says reset, never 'rollout step -1'."""
    good = lambda: gym.make("CartPole-v1", disable_env_checker=True)  # noqa: E731
    env = same_step_vector_env([good, lambda: ResetFailsEnv("first")])
    with pytest.raises(EnvStepError) as info:
        PPOTrainer(env, PPOConfig(n_envs=2, n_steps=16, batch_size=32), seed=0)
    text = str(info.value)
    assert text == "env 1 raised RuntimeError: no reset today in reset (before vector step 0)"
    assert info.value.env_index == 1 and info.value.rollout_step == -1
    assert env.closed  # the trainer that could not be built closed its env


def test_an_autoreset_failure_names_the_reset_and_the_step():
    good = lambda: gym.make("CartPole-v1", disable_env_checker=True)  # noqa: E731
    env = same_step_vector_env([good, lambda: ResetFailsEnv("later")])
    trainer = PPOTrainer(env, PPOConfig(n_envs=2, n_steps=64, batch_size=32), seed=0)
    with pytest.raises(EnvStepError, match=r"^env 1 raised RuntimeError: no reset today in reset "
                                           r"at vector step \d+ \(rollout step \d+\)$") as info:
        trainer.collect_rollout()
    assert info.value.rollout_step >= 0
