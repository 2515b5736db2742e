"""envpool's C++ vector environments behind gymnasium's SAME_STEP autoreset contract.

envpool (Weng et al. 2022, "EnvPool: A Highly Parallel Reinforcement Learning Environment
Execution Engine", NeurIPS Datasets and Benchmarks; ``pip install 'ppo_ref[envpool]'``) differs
from gymnasium's vector envs in two ways that change what a rollout records, and
:class:`EnvpoolVectorEnv` undoes both:

* **The time limit.** When an episode reaches its step limit on the step that also ends it,
  envpool reports ``truncated`` only, where gymnasium (its ``TimeLimit`` over the env) reports
  ``terminated`` and ``truncated``; PPO would then bootstrap from a terminal state. So envpool
  runs without a limit and the adapter truncates: ``truncated[i]`` is true on the
  ``max_episode_steps``-th step of an episode (``env_kwargs["max_episode_steps"]``, else
  gymnasium's registered limit for the id, else envpool's), ``terminated[i]`` is the env's own.
* **The reset.** envpool resets an env on the step after the one that ended its episode (that
  step ignores the action and returns reward 0: gymnasium's NEXT_STEP mode). The adapter resets
  the envs that ended in the same call (envpool's ``reset`` of those env ids), as gymnasium's
  SAME_STEP mode does: the ended episode's last observation is ``info["final_obs"][i]`` (the
  truncation bootstrap reads it), the next episode's first observation is in row ``i``, and no
  reset step is ever a transition of the rollout.

Seeds: envpool seeds an env only when the pool is made, with a 31-bit integer; a reset with
seeds makes the pool anew, env ``i`` seeded with ``seeds[i] mod 2**31`` (two seeds that differ
by a multiple of 2**31 give the same env); before the first such reset env ``i`` has seed ``i``.
Otherwise as gymnasium's vector envs, but: rewards are float32 (the rollout widens them), and
``reset(options=...)`` has nothing to pass them to (envpool takes none).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import List, Optional

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

__all__ = ["EnvpoolVectorEnv"]

_NO_LIMIT = 2**30  # envpool's own step limit, never reached: the adapter truncates


@contextlib.contextmanager
def _float32_bounds_quiet():
    """Silence gymnasium's warning that envpool's float64 Box bounds become float32 (envpool
    builds its spaces when made and on every reset)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32",
                                category=UserWarning)
        yield


class EnvpoolVectorEnv(VectorEnv):
    """``num_envs`` copies of envpool's ``env_id`` as a gymnasium ``VectorEnv`` in SAME_STEP
    autoreset mode (module docstring).

    Args:
        env_id: an id envpool provides (``envpool.list_all_envs()``; the classic-control ids
            are gymnasium's: ``CartPole-v1``, ``Pendulum-v1``, ``MountainCar-v0``,
            ``MountainCarContinuous-v0``, ``Acrobot-v1``).
        num_envs: number of envs (int >= 1).
        env_kwargs: extra keyword arguments of ``envpool.make`` (e.g. ``max_episode_steps``;
            ``num_threads`` defaults to 1: for a few small envs, stepping them in one thread
            costs less than handing them to several).

    Raises:
        ValueError: envpool is not installed, has no ``env_id``, or rejects ``env_kwargs``.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, env_kwargs: Optional[dict] = None):
        try:
            import envpool
        except ImportError:
            raise ValueError("vectorization 'envpool' needs envpool: pip install "
                             "'ppo_ref[envpool]'") from None
        if env_id not in envpool.list_all_envs():
            raise ValueError(f"envpool has no env {env_id!r} (envpool.list_all_envs() lists "
                             f"its ids); use vectorization 'sync' for gymnasium's")
        self._envpool = envpool
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self._kwargs = {"num_threads": 1, **(env_kwargs or {})}
        limit = self._kwargs.pop("max_episode_steps", None)
        if limit is None:  # gymnasium's registered limit, else envpool's own
            limit = (gym.spec(env_id).max_episode_steps if env_id in gym.registry
                     else envpool.make_spec(env_id).config.max_episode_steps)
        self.max_episode_steps = None if limit is None else int(limit)
        self._pool = self._make(list(range(self.num_envs)))
        with _float32_bounds_quiet():
            self.single_observation_space = self._pool.observation_space
            self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._episode_steps = np.zeros(self.num_envs, dtype=np.int64)

    def _make(self, seeds: List[int]):
        try:
            with _float32_bounds_quiet():
                return self._envpool.make(self.env_id, env_type="gymnasium",
                                          num_envs=self.num_envs,
                                          env_seed=[int(s) % 2**31 for s in seeds],
                                          max_episode_steps=_NO_LIMIT, **self._kwargs)
        except (TypeError, ValueError, AssertionError, RuntimeError) as exc:
            raise ValueError(f"envpool cannot make {self.env_id!r} with env_kwargs "
                             f"{self._kwargs}: {exc}") from None

    def reset(self, *, seed=None, options=None):
        """Start new episodes in every env; ``seed``: an int (env ``i`` gets ``seed + i``), a
        list of ``num_envs`` ints, or None (keep the pool's seeding)."""
        if seed is not None:
            seeds = ([int(seed) + i for i in range(self.num_envs)]
                     if np.ndim(seed) == 0 else list(seed))
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: expected {self.num_envs} seeds, got {len(seeds)}")
            self._pool.close()
            self._pool = self._make(seeds)
        with _float32_bounds_quiet():
            obs, info = self._pool.reset()
        self._episode_steps[:] = 0
        return obs[np.argsort(info["env_id"])], {}

    def step(self, actions):
        """One step of every env; the envs whose episode ended are reset in the same call
        (module docstring). Returns ``(obs, rewards, terminated, truncated, info)``."""
        obs, rewards, terminated, _, info = self._pool.step(np.asarray(actions))
        order = np.argsort(info["env_id"])  # envpool returns rows with their env ids
        obs, rewards, terminated = obs[order], rewards[order], terminated[order]
        self._episode_steps += 1
        truncated = (np.zeros(self.num_envs, dtype=bool) if self.max_episode_steps is None
                     else self._episode_steps >= self.max_episode_steps)
        ended = np.flatnonzero(terminated | truncated)
        if not ended.size:
            return obs, rewards, terminated, truncated, {}
        final_obs = np.empty(self.num_envs, dtype=object)
        for i in ended:
            final_obs[i] = obs[i].copy()
        with _float32_bounds_quiet():
            first, reset_info = self._pool.reset(ended.astype(np.int32))
        obs[reset_info["env_id"]] = first
        self._episode_steps[ended] = 0
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[ended] = True
        return obs, rewards, terminated, truncated, {"final_obs": final_obs, "_final_obs": mask}

    def close_extras(self, **kwargs) -> None:
        self._pool.close()

    # The rollout's checkpoint protocol (RolloutCollector.state_arrays / load_state): envpool
    # does not expose its envs' state, so a checkpoint records that, and restoring one refuses
    # rather than continue from states it does not have.
    def call(self, name: str, *args, **kwargs):
        if name == "ppo_ref_state":
            return [{"layers": [], "unsupported": ["envpool (its C++ envs' state)"]}
                    for _ in range(self.num_envs)]
        raise AttributeError(f"EnvpoolVectorEnv has no sub-env method {name!r}")

    def set_attr(self, name: str, values) -> None:
        raise ValueError("a run made with vectorization 'envpool' cannot be resumed: envpool "
                         "does not expose its envs' state (ppo-ref eval evaluates it)")
