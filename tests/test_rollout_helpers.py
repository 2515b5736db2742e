"""Tiny deterministic environments for the rollout/trainer/CLI tests (no tests in this file).

* ``CounterEnv``: observation ``[k, 1]`` where ``k`` counts steps since reset; reward 1 per step;
  never terminates, truncates after ``limit`` steps (so ``final_obs = [limit, 1]``), or
  terminates instead when ``terminate=True``.
* ``FaultyEnv``: CartPole that returns a NaN observation (``fault="nan"``) or one of the wrong
  shape (``fault="shape"``) at its ``at``-th step, only in the sub-env whose reset seed is
  ``bad_seed``.
* ``ActionRecorder``: a wrapper keeping every action the env received.
"""
import gymnasium as gym
import numpy as np
from gymnasium import spaces

FAULTY_ID = "ppo_ref_test/Faulty-v0"


class CounterEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, limit: int = 3, terminate: bool = False):
        self.limit = int(limit)
        self.terminate = bool(terminate)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Discrete(2)
        self.k = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return np.array([0.0, 1.0]), {}

    def step(self, action):
        self.k += 1
        end = self.k >= self.limit
        obs = np.array([float(self.k), 1.0])
        return obs, 1.0, end and self.terminate, end and not self.terminate, {}


class FaultyEnv(gym.Wrapper):
    def __init__(self, fault: str = "nan", at: int = 40, bad_seed: int = -1):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.fault = fault
        self.at = int(at)
        self.bad_seed = int(bad_seed)
        self.is_bad = False
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.is_bad = seed == self.bad_seed
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.is_bad and self.steps == self.at:
            if self.fault == "nan":
                obs = obs.copy()
                obs[2] = np.nan
            elif self.fault == "reward":
                reward = float("inf")
            else:
                obs = np.zeros(3, dtype=obs.dtype)
        return obs, reward, terminated, truncated, info


class ActionRecorder(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.received = []

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        return self.env.step(action)


def same_step_vector_env(fns):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def register_faulty() -> str:
    if FAULTY_ID not in gym.registry:
        gym.register(FAULTY_ID, entry_point=FaultyEnv)
    return FAULTY_ID
