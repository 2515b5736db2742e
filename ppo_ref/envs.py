"""Small environments, registered with gymnasium on import (unless the id exists):
``ppo_ref/CartPoleNoVel-v1`` (CartPole-v1 through :class:`MaskVelocityWrapper`, the benchmark
of sb3-contrib's RecurrentPPO), ``ppo_ref/MemoryCue-v0`` (:class:`MemoryCueEnv`, a one-bit
memory task) and ``ppo_ref/MultiChoice-v0`` (:class:`MultiChoiceEnv`, MultiDiscrete actions).
Example: ``import ppo_ref; gym.make("ppo_ref/MemoryCue-v0", blank_steps=4)``.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from ppo_ref._checks import check_count

__all__ = ["MaskVelocityWrapper", "MemoryCueEnv", "MultiChoiceEnv", "make_cartpole_no_vel",
           "CARTPOLE_NO_VEL_ID", "MEMORY_CUE_ID", "MULTI_CHOICE_ID"]

CARTPOLE_NO_VEL_ID = "ppo_ref/CartPoleNoVel-v1"
MEMORY_CUE_ID = "ppo_ref/MemoryCue-v0"
MULTI_CHOICE_ID = "ppo_ref/MultiChoice-v0"


class MaskVelocityWrapper(gym.ObservationWrapper):
    """Zero the ``velocity_indices`` entries of the observations of ``env`` (default
    ``(1, 3)``: CartPole's ``x_dot`` and ``theta_dot``), keeping the wrapped observation space
    (as rl-baselines3-zoo's ``MaskVelocityWrapper``). ``ValueError`` when the observation space
    is not a rank-1 Box or an index is out of range."""

    def __init__(self, env: gym.Env, velocity_indices=(1, 3)):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"env.observation_space must be a rank-1 Box, got {space}")
        idx = np.asarray(velocity_indices, dtype=np.int64)
        if idx.ndim != 1 or idx.size == 0 or idx.min() < 0 or idx.max() >= space.shape[0]:
            raise ValueError(f"velocity_indices must be indices into an observation of shape "
                             f"{space.shape}, got {velocity_indices!r}")
        self._velocity_indices = idx

    def observation(self, observation):
        """Return a copy of ``observation`` with the velocity entries set to 0 (same dtype)."""
        masked = np.array(observation, copy=True)
        masked[self._velocity_indices] = 0
        return masked


def make_cartpole_no_vel(**kwargs) -> gym.Env:
    """Entry point of ``ppo_ref/CartPoleNoVel-v1``: ``MaskVelocityWrapper(CartPoleEnv(**kwargs))``;
    ``gym.make`` adds the 500-step time limit outside the mask, as for CartPole-v1."""
    return MaskVelocityWrapper(CartPoleEnv(**kwargs))


def _check_render_mode(render_mode, env: str) -> None:
    if render_mode is not None:
        raise ValueError(f"render_mode must be None ({env} has no rendering), got {render_mode!r}")


class MemoryCueEnv(gym.Env):
    """Remember a cue for ``blank_steps`` = k steps, then answer it.

    The observation (float32 ``[cue channel, answer flag]``) at step t is ``[cue, 0]`` at t = 0,
    ``[0, 0]`` for t = 1 .. k and ``[0, 1]`` at t = k + 1, the answer step: its action
    (``Discrete(2)``: 0 means cue -1, 1 means cue +1) earns +1 if right, -1 if wrong, and ends
    the episode (``terminated``; length k + 2; never truncated); every other reward is 0.
    ``cue`` is -1.0 or +1.0 with probability 1/2, drawn at reset from ``np_random``.
    ``info["cue"]`` on every step, ``info["correct"]`` on the answer step. A memoryless policy
    answers right with probability exactly 1/2 (mean return 0).

    ``ValueError`` for ``blank_steps`` not an integer >= 0, or ``render_mode`` not None."""

    metadata = {"render_modes": []}

    def __init__(self, blank_steps: int = 8, render_mode: Optional[str] = None):
        check_count(blank_steps, "blank_steps", 0)
        _check_render_mode(render_mode, "MemoryCue")
        self.blank_steps = int(blank_steps)
        self.render_mode = render_mode
        self.observation_space = spaces.Box(np.array([-1.0, 0.0], np.float32),
                                            np.array([1.0, 1.0], np.float32), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._cue, self._t, self._needs_reset = 0.0, 0, True

    def _observation(self) -> np.ndarray:
        cue = self._cue if self._t == 0 else 0.0
        flag = 1.0 if self._t == self.answer_step else 0.0
        return np.array([cue, flag], dtype=np.float32)

    @property
    def answer_step(self) -> int:
        """Index t of the step whose action is the answer: ``blank_steps + 1``."""
        return self.blank_steps + 1

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        """Draw a new cue from ``np_random`` and return ``([cue, flag], {"cue": cue})``."""
        super().reset(seed=seed)
        self._cue = 1.0 if int(self.np_random.integers(2)) == 1 else -1.0
        self._t = 0
        self._needs_reset = False
        return self._observation(), {"cue": self._cue}

    def step(self, action):
        """Advance one step (class docstring)."""
        if self._needs_reset:
            raise RuntimeError("MemoryCueEnv.step called before reset() or after the episode ended")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 or 1, got {action!r}")
        info = {"cue": self._cue}
        if self._t == self.answer_step:
            correct = (int(action) == 1) == (self._cue > 0)
            info["correct"] = bool(correct)
            self._needs_reset = True
            self._t += 1
            return np.zeros(2, dtype=np.float32), (1.0 if correct else -1.0), True, False, info
        self._t += 1
        return self._observation(), 0.0, False, False, info


class MultiChoiceEnv(gym.Env):
    """One cue per action component each step: a MultiDiscrete test bed.

    Each step draws cue ``c_k`` uniformly from ``{0, ..., nvec[k] - 1}`` for every component
    ``k`` (from ``np_random``); the observation (float32 ``[sum(nvec)]``) is their one-hot codes
    concatenated. The reward of an action (``MultiDiscrete(nvec)``) is ``sum_k [a_k = c_k]``:
    each component is rewarded on its own. The ``episode_length``-th step terminates the episode
    (never truncated). ``info["correct"]`` (bool ``[K]``) and ``info["cues"]`` describe the step.
    A perfect policy returns ``episode_length * K``, a uniformly random one
    ``episode_length * sum_k 1 / nvec[k]``.

    ``ValueError`` for ``nvec`` not a non-empty sequence of integers >= 2, ``episode_length``
    not an integer >= 1, or ``render_mode`` not None."""

    metadata = {"render_modes": []}

    def __init__(self, nvec=(3, 4), episode_length: int = 16, render_mode: Optional[str] = None):
        try:
            items = list(nvec)
        except TypeError:
            raise ValueError(f"nvec must be a sequence of integers >= 2, got {nvec!r}") from None
        if not items:
            raise ValueError(f"nvec must be a non-empty sequence of integers >= 2, got {nvec!r}")
        for i, n in enumerate(items):
            check_count(n, f"nvec[{i}]", 2)
        check_count(episode_length, "episode_length", 1)
        _check_render_mode(render_mode, "MultiChoice")
        self.nvec = np.array([int(n) for n in items], dtype=np.int64)
        self.episode_length = int(episode_length)
        self.render_mode = render_mode
        size = int(self.nvec.sum())
        self.observation_space = spaces.Box(low=0.0, high=1.0, shape=(size,), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(self.nvec)
        self._offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
        self._cues = np.zeros(self.nvec.size, dtype=np.int64)
        self._t, self._needs_reset = 0, True

    def _draw(self) -> np.ndarray:
        self._cues = np.array([int(self.np_random.integers(n)) for n in self.nvec], np.int64)
        obs = np.zeros(int(self.nvec.sum()), dtype=np.float32)
        obs[self._offsets + self._cues] = 1.0
        return obs

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        """Start an episode: draw the first cues; returns ``(observation, {"cues": cues})``."""
        super().reset(seed=seed)
        self._t = 0
        self._needs_reset = False
        return self._draw(), {"cues": self._cues.copy()}

    def step(self, action):
        """Score ``action`` against the current cues, then draw the next ones (class docstring)."""
        if self._needs_reset:
            raise RuntimeError("MultiChoiceEnv.step called before reset() or after the episode "
                               "ended")
        a = np.asarray(action)
        if a.shape != self.nvec.shape or not self.action_space.contains(a.astype(np.int64)):
            raise ValueError(f"action must be {self.nvec.size} integers with action[k] in "
                             f"[0, {self.nvec.tolist()}[k]), got {action!r}")
        correct = a.astype(np.int64) == self._cues
        info = {"correct": correct, "cues": self._cues.copy()}
        reward = float(np.count_nonzero(correct))
        self._t += 1
        self._needs_reset = terminated = self._t == self.episode_length
        return self._draw(), reward, terminated, False, info


for _id, _entry, _options in (
        (CARTPOLE_NO_VEL_ID, "make_cartpole_no_vel",
         dict(max_episode_steps=500, reward_threshold=475.0)),
        (MEMORY_CUE_ID, "MemoryCueEnv", dict(reward_threshold=0.9, kwargs={"blank_steps": 8})),
        (MULTI_CHOICE_ID, "MultiChoiceEnv", dict(kwargs={"nvec": (3, 4), "episode_length": 16}))):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=f"ppo_ref.envs:{_entry}", **_options)
