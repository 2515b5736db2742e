"""Rollout collection from gymnasium vector environments (same-step autoreset), written once.

Layout (docs/specification.md §1): time-major ``[T, N, ...]``, ``T = n_steps``; ``values``
and ``log_probs`` are the behaviour policy's at acting time; ``final_values[t] =
V(final_obs[t])`` where step ``t`` truncated without terminating (a recurrent policy reads the
state after step ``t``, without a reset), else 0. Vector envs use
``autoreset_mode=AutoresetMode.SAME_STEP`` (the real last observation is in
``info["final_obs"]``: no phantom rows). Episode statistics are gymnasium's
``RecordEpisodeStatistics`` (raw rewards), reward scaling its ``NormalizeReward`` above it,
observation normalization :mod:`ppo_ref.spec.normalization`; ``clip_observations`` /
``clip_rewards`` clip the normalized values (the statistics see the raw ones). With gSDE
(:class:`~ppo_ref.train.policies.GSDEHead`) the collector holds one exploration matrix per env,
drawn with the acting ``rng`` at the start of every rollout and, when ``config.sde_sample_freq =
k > 0``, before every step ``t`` with ``t % k == 0`` (SB3 ``collect_rollouts``).

The collector is the boundary with the environment: every step's outputs are checked and a bad
one raises :class:`EnvStepError` naming the sub-env and the step; nothing after it re-checks.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.wrappers.vector import NormalizeReward, RecordEpisodeStatistics

from ppo_ref._checks import env_value_problem, one_line
from ppo_ref.io.state import restore_single_env_state, single_env_state
from ppo_ref.spec.normalization import initial_moments, normalize_observations, update_moments
from ppo_ref.spec.recurrent_networks import LSTMStates

__all__ = ["Rollout", "EnvStepError", "RolloutCollector", "make_vector_env", "check_vector_env"]


@dataclasses.dataclass
class Rollout:
    """One rollout of ``T`` steps from ``N`` envs (time-major, module docstring).

    Attributes: ``observations`` float64 ``[T, N, obs_dim]``; ``actions`` int64 ``[T, N]``
    (Discrete), ``[T, N, K]`` (MultiDiscrete) or float64 ``[T, N, A]`` (Box, raw sample);
    ``rewards`` float64 ``[T, N]``; ``terminated``, ``truncated``, ``episode_starts`` bool
    ``[T, N]``; ``values``, ``log_probs`` float64 ``[T, N]``; ``final_values`` float64 ``[T,
    N]`` or None (nothing truncated); ``last_values`` float64 ``[N]``; the raw return, length
    and env index of every episode that finished in the rollout; ``initial_state``: the
    recurrent state every env had before step 0 (None without memory).
    """
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_starts: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    final_values: Optional[np.ndarray]
    last_values: np.ndarray
    episode_returns: List[float] = dataclasses.field(default_factory=list)
    episode_lengths: List[int] = dataclasses.field(default_factory=list)
    episode_envs: List[int] = dataclasses.field(default_factory=list)
    initial_state: Optional[LSTMStates] = None

    @property
    def n_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def n_envs(self) -> int:
        return int(self.rewards.shape[1])


class EnvStepError(RuntimeError):
    """An environment raised, or returned something the rollout cannot train on: a non-finite
    or wrongly shaped observation, a non-finite reward, an output that is not real numbers
    (complex, strings, objects; flags that are not bools), or observations too large for the
    running normalization statistics.

    Attributes: ``env_index`` (the sub-env, -1 when unknown), ``vector_step`` (vector steps
    completed before the failing one) and ``rollout_step`` (row ``t`` of the rollout; -1: the
    failure was in ``reset``).
    """

    def __init__(self, message: str, env_index: int, vector_step: int, rollout_step: int):
        super().__init__(message)
        self.env_index = env_index
        self.vector_step = vector_step
        self.rollout_step = rollout_step


def _env_error(text: str, env_index: int, vector_step: int, rollout_step: int) -> EnvStepError:
    """:class:`EnvStepError` saying ``text`` and where: in the reset (``rollout_step`` -1) or at
    the vector step (and rollout step)."""
    where = (f"in reset (before vector step {vector_step})" if rollout_step < 0
             else f"at vector step {vector_step} (rollout step {rollout_step})")
    return EnvStepError(f"{text} {where}", env_index, vector_step, rollout_step)


_REWARD_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
_FLAG_TYPES = frozenset({bool, np.bool_})

#: The ``info`` key under which a sub-env made by :func:`make_vector_env` reports a failure;
#: the collector raises it as :class:`EnvStepError`.
ENV_FAILURE_KEY = "ppo_ref_env_failure"


class _CheckedEnv(gym.Wrapper):
    """The wrapper of every sub-env :func:`make_vector_env` makes, where the env runs: it
    checks each step's outputs (:func:`ppo_ref._checks.env_value_problem`) before the vector
    env converts them. A bad value or any exception of ``step``/``reset`` (but
    ``KeyboardInterrupt``) returns the last good observation, reward 0, not done, with
    ``info[ENV_FAILURE_KEY]`` saying what happened (raised by the collector as
    :class:`EnvStepError`). It also serves an ``AsyncVectorEnv``'s parent the env's state
    (``call("ppo_ref_state")``; ``set_attr("ppo_ref_pending", states)``, then
    ``call("ppo_ref_apply")``)."""

    ppo_ref_pending = None

    def __init__(self, env):
        super().__init__(env)
        self._last_obs = None
        self._shape = tuple(env.observation_space.shape or ())

    def _problem(self, obs) -> Optional[str]:
        if type(obs) is np.ndarray and obs.shape == self._shape and obs.dtype.kind in "biuf":
            return None
        try:
            a = np.asarray(obs)
        except Exception:  # noqa: BLE001
            return f"an observation of type {type(obs).__name__} (not real numbers)"
        if a.dtype.kind not in "biuf":
            return f"an observation of dtype {a.dtype} (not real numbers)"
        if a.shape != self._shape:
            return f"an observation of shape {a.shape}, expected {self._shape}"
        return None

    def _failure(self, text: str):
        obs = self._last_obs if self._last_obs is not None else self.observation_space.sample()
        return obs, {ENV_FAILURE_KEY: text}

    def reset(self, **kwargs):
        try:
            obs, info = self.env.reset(**kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (the env's failure, reported as such)
            return self._failure(f"raised {type(exc).__name__}: {one_line(exc, 200)} in reset")
        problem = self._problem(obs)
        if problem is not None:
            return self._failure(f"returned {problem} from reset")
        self._last_obs = obs
        return obs, info

    def step(self, action):
        try:
            result = self.env.step(action)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (the env's failure, reported as such)
            obs, info = self._failure(f"raised {type(exc).__name__}: {one_line(exc, 200)}")
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, _ = result
        if (type(reward) not in _REWARD_TYPES or type(terminated) not in _FLAG_TYPES
                or type(truncated) not in _FLAG_TYPES or self._problem(obs) is not None):
            problem = (env_value_problem(reward, "reward")
                       or env_value_problem(terminated, "terminated")
                       or env_value_problem(truncated, "truncated") or self._problem(obs))
            if problem is not None:
                obs, info = self._failure(f"returned {problem}")
                return obs, 0.0, False, False, info
        self._last_obs = obs
        return result

    def ppo_ref_state(self):
        return single_env_state(self.env)

    def ppo_ref_apply(self):
        restore_single_env_state(self.env, self.ppo_ref_pending)
        self.ppo_ref_pending = None
        return True


def _raise_env_failure(info, vector_step: int, rollout_step: int) -> None:
    """Raise :class:`EnvStepError` for the first sub-env whose ``info`` carries
    :data:`ENV_FAILURE_KEY` (set by :class:`_CheckedEnv` where the env runs)."""
    if not isinstance(info, dict) or ENV_FAILURE_KEY not in info:
        return
    texts, mask = info[ENV_FAILURE_KEY], info.get("_" + ENV_FAILURE_KEY)
    for i in range(len(texts)):
        if mask is None or mask[i]:
            text = f"env {i} {texts[i]}"  # (a text from reset says so)
            if rollout_step < 0:
                raise EnvStepError(f"{text} (before vector step {vector_step})", i, vector_step,
                                   rollout_step)
            raise _env_error(text, i, vector_step, rollout_step)


def _make_single(env_id: str, env_kwargs: Optional[dict], in_worker: bool):
    def thunk():
        if in_worker:  # an AsyncVectorEnv worker never outlives the trainer, and leaves Ctrl-C
            # (sent to the whole process group) to the trainer, which closes the workers itself
            import signal
            from ppo_ref._lifeline import exit_with_parent
            exit_with_parent()
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return _CheckedEnv(gym.make(env_id, disable_env_checker=True, **(env_kwargs or {})))
    return thunk


#: The ways :func:`make_vector_env` can step ``n_envs`` envs.
VECTORIZATIONS = ("sync", "async", "envpool")


def make_vector_env(env_id: str, n_envs: int, *, vectorization: str = "sync",
                    env_kwargs: Optional[dict] = None) -> VectorEnv:
    """``n_envs`` copies of ``env_id`` in a gymnasium ``SyncVectorEnv`` (``vectorization =
    "sync"``), ``AsyncVectorEnv`` (``"async"``, one process per env) or envpool's C++ vector env
    (``"envpool"``, :class:`~ppo_ref.train.envpool_env.EnvpoolVectorEnv`), in SAME_STEP
    autoreset mode. Raises ``ValueError`` naming a bad ``vectorization``, ``n_envs`` or an
    ``env_id`` gymnasium (or envpool) cannot make (``"module:EnvId"`` imports ``module`` first,
    as ``gym.make``)."""
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization must be one of {list(VECTORIZATIONS)}, got "
                         f"{vectorization!r}")
    if int(n_envs) < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    if not isinstance(env_id, str):
        raise ValueError(f"env must be a gymnasium id or a gymnasium.vector.VectorEnv, got "
                         f"{type(env_id).__name__}")
    if vectorization == "envpool":
        from ppo_ref.train.envpool_env import EnvpoolVectorEnv
        return EnvpoolVectorEnv(env_id, int(n_envs), env_kwargs)
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ImportError) as exc:
        raise ValueError(f"env {env_id!r} is not a gymnasium id that can be made: {exc}") from None
    fns = [_make_single(env_id, env_kwargs, vectorization == "async") for _ in range(n_envs)]
    if vectorization == "sync":
        return SyncVectorEnv(fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    return AsyncVectorEnv(fns, copy=True, autoreset_mode=AutoresetMode.SAME_STEP)


def check_vector_env(env) -> None:
    """Raise ``ValueError`` unless ``env`` is a gymnasium VectorEnv in SAME_STEP autoreset mode."""
    if not isinstance(env, VectorEnv):
        raise ValueError(f"env must be a gymnasium id or a gymnasium.vector.VectorEnv, got "
                         f"{type(env).__name__}")
    mode = env.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:
        raise ValueError(f"env must use autoreset_mode=AutoresetMode.SAME_STEP (final_obs in "
                         f"info), got {mode!r}; NEXT_STEP would insert phantom reset rows")


class _CheckedVector(VectorWrapper):
    """The vector env under the episode statistics and reward scaling: each step's outputs are
    checked by the collector (:meth:`RolloutCollector._checked_step`) before those wrappers
    compute with them."""

    def __init__(self, env, collector: "RolloutCollector"):
        super().__init__(env)
        self.collector = collector

    def step(self, actions):
        return self.collector._checked_step(self.env, actions)


class RolloutCollector:
    """Steps a vector env with a policy (:mod:`ppo_ref.train.policies`) and fills a
    :class:`Rollout`; carries observations, episode starts, the policy's state and the episode
    and normalization statistics across rollouts (:meth:`state_arrays`, :meth:`load_state`).

    Args:
        env: a gymnasium ``VectorEnv`` in SAME_STEP autoreset mode (:func:`make_vector_env`).
        policy: the policy that acts (``act``, ``values``, ``initial_state``, ``head``,
            ``compute_params``, ``obs_dim``, ``obs_shape``, ``dtype``, ``config``).
        n_steps: T, steps per env per rollout.
        normalize_observations, normalize_rewards, gamma, clip_observations, clip_rewards:
            the :class:`~ppo_ref.config.PPOConfig` fields of those names.
    """

    def __init__(self, env, policy, n_steps: int, *, normalize_observations: bool = False,
                 normalize_rewards: bool = False, gamma: float = 0.99,
                 clip_observations: Optional[float] = None, clip_rewards: Optional[float] = None):
        check_vector_env(env)
        if isinstance(env, SyncVectorEnv):  # a user's sub-envs are checked as make_vector_env's
            env.envs = [e if isinstance(e, _CheckedEnv) else _CheckedEnv(e) for e in env.envs]
        self.base_env = env
        self.policy = policy
        self.n_steps = int(n_steps)
        self.n_envs = int(env.num_envs)
        self.clip_observations = clip_observations if normalize_observations else None
        self.clip_rewards = clip_rewards if normalize_rewards else None
        self.episode_stats = RecordEpisodeStatistics(_CheckedVector(env, self))
        self.reward_normalizer = (NormalizeReward(self.episode_stats, gamma=float(gamma))
                                  if normalize_rewards else None)
        self.env = self.reward_normalizer or self.episode_stats
        self.obs_moments = initial_moments(policy.obs_dim) if normalize_observations else None
        self.update_statistics = True
        self.obs: Optional[np.ndarray] = None
        self.episode_starts = np.ones(self.n_envs, dtype=bool)
        self.state = policy.initial_state(self.n_envs)
        #: gSDE's exploration matrices ``[N, L, A]`` (compute dtype; None for other heads),
        #: drawn anew by :meth:`collect`
        self.exploration_matrices: Optional[np.ndarray] = None
        if policy.head.uses_latent:
            head = policy.head
            self.exploration_matrices = np.zeros((self.n_envs, head.latent_dim, head.out_dim),
                                                 policy.dtype)
        self.vector_steps = 0
        self._rollout_step = -1
        self._obs_shape = (self.n_envs,) + tuple(policy.obs_shape)

    # -- observations -------------------------------------------------------------------------
    def _observe(self, raw, step: int, rollout_step: int, out: np.ndarray) -> None:
        """Check a batch of raw observations (returned by the reset, or by vector step ``step``),
        update the running statistics (when on) and write what the policy sees into ``out``
        (float64 ``[N, obs_dim]``)."""
        try:
            obs = np.asarray(raw)
        except (ValueError, TypeError) as exc:
            raise _env_error(f"the vector env returned observations that are not a numeric "
                             f"array ({exc})", -1, step, rollout_step) from None
        if obs.dtype.kind not in "biuf" or obs.shape != self._obs_shape:
            raise _env_error(f"the vector env returned observations of dtype {obs.dtype} and "
                             f"shape {obs.shape}, expected real numbers of shape "
                             f"{self._obs_shape},", -1, step, rollout_step)
        np.copyto(out, obs.reshape(out.shape))
        if not np.isfinite(out).all():
            i = int(np.argmin(np.isfinite(out).all(axis=1)))
            raise _env_error(f"env {i} returned a non-finite observation {out[i].tolist()}", i,
                             step, rollout_step)
        if self.obs_moments is None:
            return
        if self.update_statistics:
            moments = update_moments(self.obs_moments, out)
            if not (np.isfinite(moments.mean).all() and np.isfinite(moments.var).all()):
                i = int(np.argmax(np.abs(out).max(axis=1)))
                raise _env_error(f"env {i} returned an observation too large to normalize (the "
                                 f"running variance overflows float64: components above "
                                 f"~1.3e154; scale the observations or turn "
                                 f"normalize_observations off)", i, step, rollout_step)
            self.obs_moments = moments
        out[...] = self.normalize_obs(out)

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """What the policy sees for float64 raw observations ``[B, obs_dim]`` with the current
        statistics (:func:`ppo_ref.spec.normalization.normalize_observations`; identity when
        normalization is off). Raises ``ValueError`` when the result overflows."""
        if self.obs_moments is None:
            return obs
        out = normalize_observations(obs, self.obs_moments, self.clip_observations)
        if not np.isfinite(out).all():
            raise ValueError("obs: the normalized observation overflows float64 with the "
                             "running statistics")
        return out

    def reset(self, seeds) -> np.ndarray:
        """Reset every sub-env with its seed (N ints); starts new episodes everywhere."""
        raw, info = self.env.reset(seed=[int(s) for s in seeds])
        _raise_env_failure(info, self.vector_steps, -1)
        self.obs = np.empty((self.n_envs, self.policy.obs_dim))
        self._observe(raw, self.vector_steps, -1, self.obs)
        self.episode_starts[:] = True
        return self.obs

    # -- one rollout ----------------------------------------------------------------------------
    def _step(self, actions, rollout_step: int):
        """``env.step`` with its outputs checked: ``(raw_obs, rewards, terminated, truncated,
        info)``, the rewards float64 and finite (scaled and clipped when on), the flags bool
        ``[N]``."""
        self._rollout_step = rollout_step
        raw_obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.vector_steps += 1
        rewards = np.asarray(rewards)
        if not np.isfinite(rewards).all():  # (checked raw; here after the reward scaling)
            i = int(np.argmin(np.isfinite(rewards)))
            raise _env_error(f"env {i}: the scaled reward is not finite", i,
                             self.vector_steps - 1, rollout_step)
        rewards = rewards.astype(np.float64)
        if self.clip_rewards is not None:
            np.clip(rewards, -self.clip_rewards, self.clip_rewards, out=rewards)
        return raw_obs, rewards, np.asarray(terminated), np.asarray(truncated), info

    def _checked_step(self, env, actions):
        """``env.step`` of the vector env itself, its outputs checked before the statistics
        wrappers see them: rewards real, finite and ``[N]``, flags bool ``[N]``, no env failure
        reported by a sub-env. Raises :class:`EnvStepError` naming the vector step."""
        step, n, rollout_step = self.vector_steps, self.n_envs, self._rollout_step
        try:
            raw_obs, rewards, terminated, truncated, info = env.step(actions)
        except (ValueError, TypeError) as exc:  # observations the vector env cannot stack
            raise _env_error(f"the vector env failed ({type(exc).__name__}: "
                             f"{one_line(exc, 200)})", -1, step, rollout_step) from None
        except (EOFError, ConnectionError) as exc:  # an AsyncVectorEnv worker died
            raise _env_error(f"an env worker process of the async vector env ended (killed, "
                             f"or its env exited: {type(exc).__name__})", -1, step,
                             rollout_step) from None
        _raise_env_failure(info, step, rollout_step)
        rewards = np.asarray(rewards)
        for what, arr, kinds in (("rewards", rewards, "biuf"),
                                 ("terminated", np.asarray(terminated), "b"),
                                 ("truncated", np.asarray(truncated), "b")):
            if arr.dtype.kind not in kinds or arr.shape != (n,):
                raise _env_error(f"the vector env returned {what} of dtype {arr.dtype} and "
                                 f"shape {arr.shape}", -1, step, rollout_step)
        if not np.isfinite(rewards).all():
            i = int(np.argmin(np.isfinite(rewards)))
            raise _env_error(f"env {i} returned a non-finite reward", i, step, rollout_step)
        return raw_obs, rewards, terminated, truncated, info

    def _final_obs(self, info, envs, rollout_step: int) -> np.ndarray:
        """The checked, normalized ``info["final_obs"]`` of ``envs`` (frozen statistics)."""
        step = self.vector_steps - 1
        rows = []
        for i in envs:
            try:
                a = np.asarray(info["final_obs"][i])
            except (KeyError, IndexError, TypeError):
                raise _env_error("info has no 'final_obs' on a truncated step (the vector env "
                                 "is not in SAME_STEP autoreset mode)", int(i), step,
                                 rollout_step) from None
            if (a.dtype.kind not in "biuf" or a.shape != self.policy.obs_shape
                    or not np.isfinite(a).all()):
                raise _env_error(f"env {int(i)} returned a final observation that is not a "
                                 f"finite real array of shape {self.policy.obs_shape}", int(i),
                                 step, rollout_step)
            rows.append(a.reshape(-1).astype(np.float64))
        return self.normalize_obs(np.stack(rows))

    def collect(self, params, rng: np.random.Generator) -> Rollout:
        """Run ``n_steps`` vector steps acting with ``params`` (sampling with ``rng``) and return
        the :class:`Rollout`. Raises :class:`EnvStepError` for a bad environment output, naming
        the sub-env and the vector step; ``RuntimeError`` before :meth:`reset`."""
        if self.obs is None:
            raise RuntimeError("call reset(seeds) before collect()")
        T, N, policy = self.n_steps, self.n_envs, self.policy
        head = policy.head
        cparams = policy.compute_params(params)
        obs_buf = np.empty((T + 1, N, policy.obs_dim))  # row T: the observations after
        act_buf = np.empty((T, N) + head.action_shape, dtype=head.action_dtype)
        rew_buf = np.empty((T, N))
        term_buf, trunc_buf, start_buf = (np.zeros((T, N), dtype=bool) for _ in range(3))
        outs, acted_values = [], []
        final_values = None
        returns, lengths, envs = [], [], []
        start_state = self.state
        obs_buf[0] = self.obs
        sde_freq = policy.config.sde_sample_freq
        for t in range(T):
            start_buf[t] = self.episode_starts
            if head.uses_latent and (t == 0 or (sde_freq > 0 and t % sde_freq == 0)):
                self.exploration_matrices = head.exploration_matrices(rng, cparams, N)
            acted = policy.act(cparams, obs_buf[t], self.state, self.episode_starts, rng,
                               self.exploration_matrices)
            act_buf[t] = acted.actions
            outs.append(acted.policy_out)
            acted_values.append(acted.values)
            self.state = acted.state
            raw_obs, rew_buf[t], term_buf[t], trunc_buf[t], info = self._step(
                head.to_env(acted.actions), t)
            self._observe(raw_obs, self.vector_steps - 1, t, obs_buf[t + 1])
            done = term_buf[t] | trunc_buf[t]
            self.episode_starts = done
            if not done.any():
                continue
            cut = np.flatnonzero(trunc_buf[t] & ~term_buf[t])
            if cut.size:
                if final_values is None:
                    final_values = np.zeros((T, N))
                cut_state = None if self.state is None else self.state.select(cut)
                final_values[t, cut] = policy.values(cparams, self._final_obs(info, cut, t),
                                                     cut_state, np.zeros(cut.size, dtype=bool))
            for i in np.flatnonzero(done):
                returns.append(float(info["episode"]["r"][i]))
                lengths.append(int(info["episode"]["l"][i]))
                envs.append(int(i))
        self.obs = obs_buf[T].copy()
        observations = obs_buf[:T]
        log_probs, values = policy.behaviour(
            cparams, observations.reshape(T * N, -1),
            act_buf.reshape((T * N,) + head.action_shape), np.concatenate(outs), acted_values)
        last_values = policy.values(cparams, self.obs, self.state, self.episode_starts)
        # (copies: the compiled tier's results may view its pooled pass buffer, which would
        # be kept from reuse while the rollout lives)
        return Rollout(observations, act_buf, rew_buf, term_buf, trunc_buf, start_buf,
                       np.array(values, dtype=np.float64).reshape(T, N),
                       np.array(log_probs, dtype=np.float64).reshape(T, N), final_values,
                       np.array(last_values, dtype=np.float64), returns, lengths, envs,
                       start_state)

    # -- state for checkpoints ----------------------------------------------------------------
    def state_arrays(self) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """``(arrays, json)``: everything the next :meth:`collect` depends on. Arrays: ``obs``,
        ``episode_starts``, ``episode_return``, ``episode_length``, the policy state
        (``state.h``, ``state.c``), gSDE's ``exploration_matrices``, the observation statistics
        (``obs_rms.*``) and the reward scaling's (``ret_rms.*``, ``ret_accumulated``,
        ``ret_prev_dones``). JSON:
        ``vector_steps``, ``sub_envs`` (per sub-env snapshots) and ``unsupported`` (attributes
        that could not be captured: when non-empty a resume is not exact)."""
        if self.obs is None:
            raise RuntimeError("collector has no state before reset()")
        stats = self.episode_stats
        arrays = {"obs": self.obs.copy(), "episode_starts": self.episode_starts.copy(),
                  "episode_return": np.array(stats.episode_returns, dtype=np.float64),
                  "episode_length": np.array(stats.episode_lengths, dtype=np.int64)}
        if self.state is not None:
            arrays["state.h"], arrays["state.c"] = self.state.h.copy(), self.state.c.copy()
        if self.exploration_matrices is not None:
            arrays["exploration_matrices"] = self.exploration_matrices.copy()
        if self.obs_moments is not None:
            m = self.obs_moments
            arrays.update({"obs_rms.mean": m.mean.copy(), "obs_rms.var": m.var.copy(),
                           "obs_rms.count": np.array(m.count, dtype=np.float64)})
        if self.reward_normalizer is not None:
            rn = self.reward_normalizer
            arrays.update({"ret_rms.mean": np.array(rn.return_rms.mean, dtype=np.float64),
                           "ret_rms.var": np.array(rn.return_rms.var, dtype=np.float64),
                           "ret_rms.count": np.array(rn.return_rms.count, dtype=np.float64),
                           "ret_accumulated": np.array(rn.accumulated_reward, dtype=np.float64),
                           "ret_prev_dones": np.array(rn._prev_dones, dtype=np.float64)})
        subs = self._sub_env_states()
        unsupported = sorted({u for s in subs for u in s.get("unsupported", [])})
        return arrays, {"vector_steps": int(self.vector_steps), "sub_envs": subs,
                        "unsupported": unsupported}

    def load_state(self, arrays: Dict[str, np.ndarray], meta: Dict[str, Any], *,
                   env_state: bool = True) -> None:
        """Inverse of :meth:`state_arrays` (the arrays vetted by the caller against a fresh
        collector's; the env built the same way); ``env_state=False`` leaves the sub-envs' own
        state as it is."""
        from gymnasium.wrappers.utils import RunningMeanStd
        if self.obs_moments is not None:
            self.obs_moments = self.obs_moments._replace(
                mean=arrays["obs_rms.mean"].copy(), var=arrays["obs_rms.var"].copy(),
                count=float(arrays["obs_rms.count"]))
        if self.reward_normalizer is not None:
            rn, rms = self.reward_normalizer, RunningMeanStd(shape=())
            rms.mean, rms.var = arrays["ret_rms.mean"].copy(), arrays["ret_rms.var"].copy()
            rms.count = float(arrays["ret_rms.count"])
            rn.return_rms = rms
            # (saved as float64, exactly; restored in the wrapper's own dtypes)
            rn.accumulated_reward = arrays["ret_accumulated"].astype(rn.accumulated_reward.dtype)
            rn._prev_dones = arrays["ret_prev_dones"].astype(rn._prev_dones.dtype)
        if env_state:
            self._restore_sub_envs(meta["sub_envs"])
        self.obs = arrays["obs"].copy()
        self.episode_starts = arrays["episode_starts"].copy()
        self.episode_stats.episode_returns = arrays["episode_return"].copy()
        self.episode_stats.episode_lengths = arrays["episode_length"].copy()
        if self.state is not None:
            self.state = LSTMStates(arrays["state.h"].copy(), arrays["state.c"].copy())
        if self.exploration_matrices is not None:
            self.exploration_matrices = arrays["exploration_matrices"].copy()
        self.vector_steps = int(meta["vector_steps"])

    def _sub_env_states(self) -> List[Dict[str, Any]]:
        base = self.base_env
        if isinstance(base, SyncVectorEnv):
            return [single_env_state(e.env) for e in base.envs]  # (inside its _CheckedEnv)
        try:
            return list(base.call("ppo_ref_state"))
        except Exception as exc:  # noqa: BLE001  (a user's vector env without _CheckedEnv)
            return [{"layers": [], "unsupported": [f"vector env state: {type(exc).__name__}"]}
                    for _ in range(self.n_envs)]

    def _restore_sub_envs(self, states: List[Dict[str, Any]]) -> None:
        if len(states) != self.n_envs:
            raise ValueError(f"saved env state has {len(states)} sub-envs, this env has "
                             f"{self.n_envs}")
        base = self.base_env
        if isinstance(base, SyncVectorEnv):
            for e, s in zip(base.envs, states):
                restore_single_env_state(e.env, s)
            return
        try:
            base.set_attr("ppo_ref_pending", list(states))
            base.call("ppo_ref_apply")
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot restore the sub-env states of this vector env: "
                             f"{exc}") from exc

    def close(self) -> None:
        self.env.close()
