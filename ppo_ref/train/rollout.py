"""Rollout collection from gymnasium vector environments (same-step autoreset).

Data layout (docs/specification.md §1): every array is time-major ``[T, N, ...]`` with ``T = n_steps`` and
``N`` parallel environments. For the action taken at step ``t``:

* ``observations[t]`` is what the policy saw (normalized when observation normalization is on),
* ``rewards[t]``, ``terminated[t]``, ``truncated[t]`` are what ``env.step`` returned,
* ``values[t] = V(observations[t])``, ``log_probs[t] = log pi(actions[t] | observations[t])``,
* ``episode_starts[t]`` is True when ``observations[t]`` is the first of an episode
  (``done[t-1]``; row 0 carries the previous rollout's last flags, True after the first reset),
* ``final_values[t] = V(final_obs[t])`` where step ``t`` truncated and did not terminate
  (``final_obs`` from ``info["final_obs"]``, the real last observation before the reset), else 0,
* ``last_values = V(observation after the last step)``.

Vector envs run with ``autoreset_mode=AutoresetMode.SAME_STEP``: a finished sub-env is reset
inside the step that finished it, the step returns the reset observation and puts the real last
one in ``info["final_obs"]``. There are therefore no phantom rows (the NEXT_STEP mode's
"reset step" with reward 0 and an ignored action) to filter.

Speed: with a plain ``SyncVectorEnv`` (no vector wrappers) the collector steps the sub-envs
itself with exactly the calls ``SyncVectorEnv.step`` makes in SAME_STEP mode (tested to give
identical rollouts), and acts through the policy tower only; values and behaviour log-probs
are recorded from one batched forward pass at the end of the rollout. Each step's outputs go
straight into the rollout's arrays: the observations are checked and converted to float64 once,
into their row; the rewards are stored from the sub-envs' list in one assignment; the
terminated/truncated flags (and the next row's ``episode_starts``) are written only where an
episode ended, into arrays that start False.

Normalization (options of :class:`RolloutCollector`):

* observations: ``(obs - mean) / sqrt(var + 1e-8)`` with running statistics (gymnasium's
  ``RunningMeanStd``) updated with every batch of observations the env returns (resets
  included, final observations excluded: the convention of gymnasium's and SB3's wrappers).
  gymnasium 1.4's vector ``NormalizeObservation`` refuses SAME_STEP envs, so the same formula
  is applied here; ``final_obs`` is normalized with the same statistics before ``V`` reads it.
* rewards: gymnasium's vector ``NormalizeReward`` wrapper (divides by the running std of the
  discounted return). Episode returns for logging are always the raw rewards.
* clipping (``clip_observations`` / ``clip_rewards`` = c, each only together with its
  normalization): the normalized value is clipped to ``[-c, c]`` and the clipped value is what
  the policy sees and the buffer stores ("observation clipping" and "reward clipping" of
  Huang et al., "The 37 Implementation Details of PPO", ICLR blog track 2022; SB3's
  ``VecNormalize(clip_obs=10.0, clip_reward=10.0)``). The running statistics are updated with
  the raw, unclipped values before normalizing, as ``VecNormalize`` does, so clipping never
  changes them; ``final_obs`` is clipped the same way before ``V`` reads it.

Both sets of statistics are part of :meth:`RolloutCollector.state` and can be frozen
(``update_statistics = False``) for evaluation.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import gymnasium.vector
import numpy as np

from ppo_ref._checks import check_real_scalar, env_value_problem
from ppo_ref._numba import njit
from ppo_ref.io.checkpoint import generator_state, set_generator_state, vet_env_value
from ppo_ref.fast.lstm import all_finite, all_finite_1d

__all__ = ["Rollout", "EnvStepError", "RolloutCollector", "make_vector_env", "check_vector_env",
           "single_env_state", "restore_single_env_state", "rollout_from_transitions",
           "finished_episodes"]

OBS_NORM_EPS = 1e-8
_FLOAT64 = np.dtype(np.float64)  # (a dtype compares with a dtype faster than with a type)


@dataclasses.dataclass
class Rollout:
    """One rollout of ``T`` steps from ``N`` envs (time-major, see the module docstring).

    Attributes:
        observations: float64 ``[T, N, obs_dim]`` (flattened; normalized if that option is on).
        actions: int64 ``[T, N]`` (Discrete) or float64 ``[T, N, A]`` (Box: raw, unclipped sample).
        rewards: float64 ``[T, N]`` (normalized if that option is on).
        terminated, truncated, episode_starts: bool ``[T, N]``.
        values, log_probs: float64 ``[T, N]``.
        final_values: float64 ``[T, N]``, ``V(final_obs)`` on truncated-not-terminated steps and
            0 elsewhere; ``None`` when no step truncated.
        last_values: float64 ``[N]``.
        episode_returns, episode_lengths: raw return and length of every episode that finished
            in this rollout (in order of completion); ``episode_envs`` the env index of each.
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

    @property
    def n_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def n_envs(self) -> int:
        return int(self.rewards.shape[1])


def rollout_from_transitions(policy, params, *, observations, actions, rewards, terminated,
                             truncated, episode_starts, values, log_probs, next_observations,
                             observations_after) -> Rollout:
    """The :class:`Rollout` that :meth:`RolloutCollector.collect` records for these transitions,
    with the collector's bootstrap values (for a policy without memory)::

        final_values[t, n] = V(next_observations[t, n])  where truncated[t, n] and not
                             terminated[t, n] (the real last observation), else 0;
                             None when no step truncated without terminating
        last_values[n]     = V(observations_after[n])

    ``observations_after[n]`` is the observation env ``n`` continues from after the last row:
    the first observation of the next episode (what the env's reset returned) where the last
    row terminated or truncated, else ``next_observations[T-1, n]``. So a terminal last row
    bootstraps the value of the reset observation (read only under
    ``bootstrap_terminal_last_row``), exactly as the collector stores it. The values are
    computed under ``params`` with the batch shapes the collector uses (one call per step with
    truncations, one call for the ``[N]`` last observations).

    Args:
        policy: the feedforward policy (``values(params, obs [B, obs_dim]) -> [B]``).
        params: its parameters.
        observations: ``[T, N, *obs_shape]`` float64 (stored flattened to ``[T, N, obs_dim]``).
        actions: int64 ``[T, N]`` or float64 ``[T, N, A]``.
        rewards: float64 ``[T, N]``.
        terminated, truncated, episode_starts: bool ``[T, N]``.
        values, log_probs: float64 ``[T, N]``: ``V(observations[t])`` and the behaviour
            ``log pi(actions[t] | observations[t])`` (nats) recorded when acting.
        next_observations: ``[T, N, *obs_shape]``: the real observation after each step (the
            final one where the step ended an episode).
        observations_after: ``[N, *obs_shape]``, as above.

    Returns:
        :class:`Rollout` (no finished episodes recorded: see :func:`finished_episodes`).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    T, N = rewards.shape
    observations = np.asarray(observations, dtype=np.float64)
    next_observations = np.asarray(next_observations, dtype=np.float64)
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    final_values = None
    cut = truncated & ~terminated
    for t in np.flatnonzero(cut.any(axis=1)):
        if final_values is None:
            final_values = np.zeros((T, N), dtype=np.float64)
        idx = np.flatnonzero(cut[t])
        final_values[t, idx] = policy.values(params, next_observations[t, idx].reshape(len(idx), -1))
    after = np.asarray(observations_after, dtype=np.float64).reshape(N, -1)
    last_values = np.asarray(policy.values(params, after), dtype=np.float64)
    return Rollout(observations.reshape(T, N, -1), np.asarray(actions), rewards, terminated,
                   truncated, np.asarray(episode_starts, dtype=bool),
                   np.asarray(values, dtype=np.float64), np.asarray(log_probs, dtype=np.float64),
                   final_values, last_values)


def finished_episodes(rewards: np.ndarray, done: np.ndarray, episode_return: np.ndarray,
                      episode_length: np.ndarray) -> Tuple[List[float], List[int], List[int]]:
    """The episodes that end in ``[T, N]`` ``rewards`` / ``done`` (terminated or truncated),
    as :meth:`RolloutCollector.collect` records them: per env, in step order, ``return +=
    reward`` and ``length += 1``, recorded and reset to 0 where ``done``. ``episode_return``
    (float64 ``[N]``) and ``episode_length`` (int64 ``[N]``) carry the unfinished episodes
    between rollouts and are updated in place. Returns ``(returns, lengths, envs)`` in order of
    completion (step by step, envs in index order within a step)."""
    done = np.asarray(done, dtype=bool)
    n_ended = int(np.count_nonzero(done))
    ended_returns = np.empty(n_ended, dtype=np.float64)
    ended_lengths = np.empty(n_ended, dtype=np.int64)
    ended_envs = np.empty(n_ended, dtype=np.int64)
    _episode_bookkeeping(np.ascontiguousarray(rewards, dtype=np.float64), done, episode_return,
                         episode_length, ended_returns, ended_lengths, ended_envs)
    return ended_returns.tolist(), ended_lengths.tolist(), ended_envs.tolist()


class EnvStepError(RuntimeError):
    """An environment returned a non-finite or wrongly shaped observation, a non-finite reward,
    an output that is not real numbers (complex, strings, objects; flags that are not bools or
    0/1), or observations too large for the normalizer's running variance (above ~1.3e154).

    Attributes: ``env_index`` (the sub-env, -1 when the vector env could not say),
    ``vector_step`` (how many vector steps the collector had completed before the failing one:
    the failing step is number ``vector_step`` counting from 0; single-env steps =
    ``vector_step * n_envs``) and ``rollout_step`` (row t of the rollout being collected).
    """

    def __init__(self, message: str, env_index: int, vector_step: int, rollout_step: int):
        super().__init__(message)
        self.env_index = env_index
        self.vector_step = vector_step
        self.rollout_step = rollout_step


# -- vector env construction ------------------------------------------------------------------

#: The ``info`` key under which a sub-env made by :func:`make_vector_env` reports a failure
#: (:class:`StateAccessWrapper`); the collector raises it as :class:`EnvStepError`.
ENV_FAILURE_KEY = "ppo_ref_env_failure"


class StateAccessWrapper(gym.Wrapper):
    """The wrapper of every sub-env :func:`make_vector_env` makes.

    State: ``ppo_ref_get_state()`` returns :func:`single_env_state` of the wrapped env;
    ``set_attr("ppo_ref_pending_state", states)`` then ``call("ppo_ref_apply_state")``
    restores one state per sub-env (how AsyncVectorEnv sub-envs are reached). The wrapper is
    not part of the saved wrapper chain.

    Checks where the env runs (in an AsyncVectorEnv worker, or inside ``SyncVectorEnv.step``),
    with the rule the collector applies when it steps the envs itself: the reward and flags
    (:func:`ppo_ref._checks.env_value_problem`) and the observation's kind and shape. A bad
    value, or any exception from the env's ``step`` or ``reset`` (``SystemExit`` and other
    ``BaseException`` included; ``KeyboardInterrupt`` excepted), is never passed on as
    numbers (a vector env would convert ``"1.0"`` to 1.0) nor left to end the worker: the call
    returns the last good observation, reward 0, not done, with
    ``info[ENV_FAILURE_KEY]`` describing it, which the collector raises as
    :class:`EnvStepError` naming the env.
    """

    ppo_ref_pending_state = None
    _ppo_ref_last_obs = None

    def ppo_ref_get_state(self):
        return single_env_state(self.env)

    def ppo_ref_apply_state(self):
        restore_single_env_state(self.env, self.ppo_ref_pending_state)
        self.ppo_ref_pending_state = None
        return True

    def _obs_problem(self, obs) -> Optional[str]:
        shape = getattr(self.observation_space, "shape", None)
        try:
            a = np.asarray(obs)
        except Exception:  # noqa: BLE001
            return f"an observation of type {type(obs).__name__} (not real numbers)"
        if a.dtype.kind not in _REAL_KINDS:
            return f"an observation of dtype {a.dtype} (not real numbers)"
        if shape is not None and a.shape != tuple(shape):
            return f"an observation of shape {a.shape}, expected {tuple(shape)}"
        return None

    def _failure(self, text: str):
        obs = self._ppo_ref_last_obs
        if obs is None:
            obs = self.observation_space.sample()
        return obs, {ENV_FAILURE_KEY: text}

    def reset(self, **kwargs):
        try:
            obs, info = self.env.reset(**kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (the env's failure, reported as such)
            return self._failure(f"raised {type(exc).__name__}: {_one_line(exc)} in reset")
        problem = self._obs_problem(obs)
        if problem is not None:
            return self._failure(f"returned {problem} from reset")
        self._ppo_ref_last_obs = obs
        return obs, info

    def step(self, action):
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (the env's failure, reported as such)
            obs, info = self._failure(f"raised {type(exc).__name__}: {_one_line(exc)}")
            return obs, 0.0, False, False, info
        problem = (env_value_problem(reward, "reward")
                   or env_value_problem(terminated, "terminated")
                   or env_value_problem(truncated, "truncated") or self._obs_problem(obs))
        if problem is not None:
            obs, info = self._failure(f"returned {problem}")
            return obs, 0.0, False, False, info
        self._ppo_ref_last_obs = obs
        return obs, reward, terminated, truncated, info


def _make_single(env_id: str, env_kwargs: Optional[dict], for_async: bool):
    def thunk():
        if for_async:  # runs in the AsyncVectorEnv worker: never outlive the trainer, and
            # leave Ctrl-C (sent to the whole process group) to the trainer, which stops at
            # the end of its update and closes the workers itself
            import signal
            from ppo_ref._lifeline import exit_with_parent
            exit_with_parent()
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        env = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
        return StateAccessWrapper(env)
    return thunk


def make_vector_env(env_id: str, n_envs: int, *, vectorization: str = "sync",
                    env_kwargs: Optional[dict] = None):
    """A gymnasium vector env of ``n_envs`` copies of ``env_id`` in SAME_STEP autoreset mode.

    ``vectorization``: ``"sync"`` (``SyncVectorEnv``, one process; ``copy=False``: the
    collector copies observations itself) or ``"async"`` (``AsyncVectorEnv``, one subprocess
    per env; each worker ends when the trainer's process dies, even inside a hung
    ``env.step``: :func:`ppo_ref._lifeline.exit_with_parent`). Sub-envs are made with ``gym.make(env_id, disable_env_checker=True)`` (the
    passive checker only warns and costs time on every step).
    """
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
    if vectorization not in ("sync", "async"):
        raise ValueError(f"vectorization must be 'sync' or 'async', got {vectorization!r}")
    if int(n_envs) < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    _check_env_id(env_id)  # a clear error for unknown ids before any process starts
    fns = [_make_single(env_id, env_kwargs, vectorization == "async") for _ in range(int(n_envs))]
    if vectorization == "sync":
        return SyncVectorEnv(fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    return AsyncVectorEnv(fns, copy=True, autoreset_mode=AutoresetMode.SAME_STEP)


def _check_env_id(env_id: str) -> None:
    """Raise ``ValueError`` naming ``env_id`` unless gymnasium knows it. gymnasium's
    ``"module:EnvId"`` form (as ``gym.make`` takes it) imports ``module`` first, which
    registers the id."""
    if not isinstance(env_id, str):
        raise ValueError(f"env must be a gymnasium id or a gymnasium.vector.VectorEnv, "
                         f"got {type(env_id).__name__}")
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ImportError) as exc:
        raise ValueError(f"env {env_id!r} is not a gymnasium id that can be made: {exc}") from None


def check_vector_env(env) -> None:
    """Raise ``ValueError`` unless ``env`` is a gymnasium VectorEnv in SAME_STEP autoreset mode."""
    from gymnasium.vector import AutoresetMode, VectorEnv
    if not isinstance(env, VectorEnv):
        raise ValueError(f"env must be a gymnasium id or a gymnasium.vector.VectorEnv, got {type(env).__name__}")
    mode = env.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:
        raise ValueError(f"env must use autoreset_mode=AutoresetMode.SAME_STEP (final_obs in info), "
                         f"got {mode!r}; NEXT_STEP would insert phantom reset rows")


# -- per-sub-env state (exact resume) ---------------------------------------------------------

_SKIP_ATTRS = frozenset({"env", "_env", "spec", "_cached_spec", "metadata", "_metadata",
                         "render_mode", "_action_space", "_observation_space", "action_space",
                         "observation_space", "_saved_kwargs", "_ezpickle_args",
                         "_ezpickle_kwargs"})


_MISSING = object()


def _is_skipped_value(value) -> bool:
    """Attribute values never saved nor restored: spaces and callables (a Generator is state)."""
    from gymnasium import Space
    return isinstance(value, Space) or callable(value) and not isinstance(value, np.random.Generator)


def _encode_value(value):
    """JSON form of a plain attribute value, or raise TypeError when it cannot be saved."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.random.Generator):
        return {"__generator__": generator_state(value)}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"__scalar__": value.item(), "dtype": str(value.dtype)}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_value(v) for v in value]}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    raise TypeError(type(value).__name__)


def _decode_value(obj, current):
    """Inverse of :func:`_encode_value`; raises ``ValueError`` for a form it never writes (an
    array or scalar dtype other than bool/int/uint/float, a malformed entry)."""
    if isinstance(obj, dict):
        if "__generator__" in obj:
            if not isinstance(current, np.random.Generator):
                current = np.random.default_rng()
            set_generator_state(current, obj["__generator__"])
            return current
        if "__scalar__" in obj or "__ndarray__" in obj:
            dtype = np.dtype(obj.get("dtype"))
            if dtype.kind not in "biuf":
                raise ValueError(f"saved env value has dtype {dtype}; only bool, integer and "
                                 "float values are restored")
            if "__scalar__" in obj:
                return dtype.type(obj["__scalar__"])
            return np.asarray(obj["__ndarray__"], dtype=dtype)
        if "__tuple__" in obj:
            return tuple(_decode_value(v, None) for v in obj["__tuple__"])
        raise ValueError(f"saved env value {sorted(obj)!r} is not a form ppo_ref writes")
    if isinstance(obj, list):
        return [_decode_value(v, None) for v in obj]
    return obj


def _layers(env) -> list:
    if isinstance(env, StateAccessWrapper):  # make_vector_env's own layer: not env state
        env = env.env
    layers = [env]
    while hasattr(layers[-1], "env") and layers[-1] is not getattr(layers[-1], "unwrapped", None):
        layers.append(layers[-1].env)
    return layers


def single_env_state(env) -> Dict[str, Any]:
    """A JSON-safe snapshot of one (wrapped) gymnasium env's plain attributes.

    Walks the wrapper chain down to ``env.unwrapped`` and records, per layer, every instance
    attribute that is ``None``, a bool/int/float/str, a numeric NumPy scalar or array, a tuple
    or list of those, or an ``np.random.Generator`` (its bit-generator state). This covers the
    whole dynamic state of the classic-control envs (``state``, ``steps_beyond_terminated``,
    ``last_u``, the env's ``np_random``) and of the standard wrappers (``TimeLimit._elapsed_steps``,
    ``OrderEnforcing._has_reset``). Attributes of other types (simulator handles such as MuJoCo's
    ``MjData`` or Box2D worlds, renderers) cannot be captured: their ``layer.name`` are listed
    under ``"unsupported"`` so the caller can warn that a resume will not be exact.
    """
    layers_out = []
    unsupported = []
    for layer in _layers(env):
        attrs = {}
        for name, value in vars(layer).items():
            if name in _SKIP_ATTRS or _is_skipped_value(value):
                continue
            try:
                attrs[name] = _encode_value(value)
            except TypeError:
                if name in ("screen", "clock", "viewer", "window", "renderer"):
                    continue  # rendering handles: not dynamics state
                unsupported.append(f"{type(layer).__name__}.{name}")
        layers_out.append({"class": type(layer).__name__, "attrs": attrs})
    return {"layers": layers_out, "unsupported": unsupported}


def restore_single_env_state(env, state: Dict[str, Any]) -> None:
    """Write a :func:`single_env_state` snapshot back into ``env`` (same wrapper chain).

    Only attributes the env already has as plain instance attributes are set (never a new
    attribute, a method, a space, the wrapped env or the spec), and the env's limits stay its
    own (:func:`ppo_ref.io.checkpoint.vet_env_value`). Raises ``ValueError`` when the wrapper
    chain differs from the one that was saved, or the snapshot names any other attribute,
    holds a value form :func:`single_env_state` never writes, or changes a limit.
    """
    layers = _layers(env)
    saved = state["layers"]
    if [type(l).__name__ for l in layers] != [s["class"] for s in saved]:
        raise ValueError("env state was saved for wrapper chain "
                         f"{[s['class'] for s in saved]}, this env has {[type(l).__name__ for l in layers]}")
    for layer, entry in zip(layers, saved):
        present = vars(layer)
        for name, obj in entry["attrs"].items():
            # only plain attributes the env already has: a saved state never adds attributes,
            # shadows a method or replaces a space, the wrapped env or the spec
            current = present.get(name, _MISSING)
            if current is _MISSING or name in _SKIP_ATTRS or _is_skipped_value(current):
                raise ValueError(f"saved env state sets {type(layer).__name__}.{name}, which is "
                                 "not a plain attribute this env has")
            value = _decode_value(obj, current)
            vet_env_value(type(layer).__name__, name, value, current,
                          present.get("_max_episode_steps"))
            setattr(layer, name, value)


# -- the collector ----------------------------------------------------------------------------

class RolloutCollector:
    """Steps a vector env with a policy and fills :class:`Rollout` buffers.

    Args:
        env: a gymnasium ``VectorEnv`` in SAME_STEP autoreset mode (see
            :func:`make_vector_env`).
        policy: what acts, e.g. :class:`~ppo_ref.train.policies.MLPPolicy`: ``policy_out_fn(params)
            -> forward`` (``forward(obs [N, obs_dim]) -> policy_out``, parameters fixed for the
            rollout), ``head`` (``sample``, ``to_env``, ``kind``, ``action_shape``,
            ``action_dtype``), ``values(params, obs)``, ``evaluate(params, obs, actions)``,
            ``obs_dim``, ``obs_shape``. A policy with memory sets ``takes_episode_starts = True``
            and then receives the flags of what it is given: ``forward(obs, episode_starts)``
            (bool ``[N]``: True where ``obs`` is an episode's first observation) once per
            vector step, ``values(params, final_obs, env_indices=idx)`` for the final
            observations of the envs ``idx`` that truncated in the step just taken (they
            continue those envs' episodes), ``values(params, obs, episode_starts=flags)``
            for the observations after the last step, and ``evaluate(params, obs, actions,
            episode_starts=flags [T, N])`` for the rollout's rows. A policy whose acting
            outputs are per row the bits ``evaluate`` computes may set
            ``acting_outputs_exact = True``: the collector then keeps them and takes the
            rollout's log-probabilities and values from ``rollout_log_probs_values(params,
            obs, actions, policy_out)`` instead of ``evaluate`` (the same numbers).
        n_steps: T, steps per env per rollout.
        normalize_observations, normalize_rewards: options (module docstring).
        gamma: discount of the reward normalizer's return estimate.
        clip_observations, clip_rewards: ``c > 0`` clips the normalized observations / rewards
            to ``[-c, c]`` (module docstring); ``None``: no clipping.

    Raises:
        ValueError: a clip that is not a finite number > 0, or given without its normalization.

    Carried state between rollouts: the current observations, ``episode_starts`` flags, the
    per-env running episode return/length, and the normalization statistics; all of it is in
    :meth:`state` / :meth:`load_state` together with every sub-env's own state.
    """

    def __init__(self, env, policy, n_steps: int, *, normalize_observations: bool = False,
                 normalize_rewards: bool = False, gamma: float = 0.99,
                 clip_observations: Optional[float] = None, clip_rewards: Optional[float] = None):
        from gymnasium.wrappers.utils import RunningMeanStd
        self.clip_observations = _check_clip(clip_observations, "clip_observations",
                                             normalize_observations, "normalize_observations")
        self.clip_rewards = _check_clip(clip_rewards, "clip_rewards", normalize_rewards,
                                        "normalize_rewards")
        check_vector_env(env)
        self.base_env = env
        self.policy = policy
        self.n_steps = int(n_steps)
        self.n_envs = int(env.num_envs)
        self.obs_rms = RunningMeanStd(shape=(policy.obs_dim,)) if normalize_observations else None
        self.update_statistics = True
        if normalize_rewards:
            from gymnasium.wrappers.vector import NormalizeReward
            self._tap = _RawRewardTap(env)
            self.env = NormalizeReward(self._tap, gamma=float(gamma))
            self.reward_normalizer = self.env
        else:
            self._tap = None
            self.env = env
            self.reward_normalizer = None
        self.obs: Optional[np.ndarray] = None
        self.episode_starts = np.ones(self.n_envs, dtype=bool)
        self.episode_return = np.zeros(self.n_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.n_envs, dtype=np.int64)
        self.vector_steps = 0
        self._obs_batch_shape = (self.n_envs,) + tuple(policy.obs_shape)
        self.use_fast_sync = True  # False: always go through env.step (same results, slower)

    # -- observations -------------------------------------------------------------------------
    def _obs_into(self, raw, out: np.ndarray, vector_step: int, rollout_step: int) -> None:
        """Check a batch of raw observations and write them into ``out`` (float64 ``[N,
        obs_dim]``): flattened, as float64 (the values unchanged), and normalized with (and
        updating) the running statistics when that option is on."""
        try:
            obs = np.asarray(raw)
        except (ValueError, TypeError) as exc:
            raise EnvStepError(f"the vector env returned observations that are not a numeric array "
                               f"at vector step {vector_step} (rollout step {rollout_step}): {exc}",
                               -1, vector_step, rollout_step) from None
        if obs.dtype.kind not in _REAL_KINDS:  # complex, strings, objects: never converted
            raise _bad_kind(raw if isinstance(raw, (list, tuple)) else obs, "observation",
                            vector_step, rollout_step)
        if obs.shape != self._obs_batch_shape:
            raise EnvStepError(f"the vector env returned observations of shape {obs.shape}, expected "
                               f"{self._obs_batch_shape}, at vector step {vector_step} (rollout step "
                               f"{rollout_step})", -1, vector_step, rollout_step)
        if self.obs_rms is None:  # (out: float64, C-contiguous)
            np.copyto(out, obs if obs.ndim == 2 else obs.reshape(out.shape),
                      casting="unsafe")  # = astype(float64)
            raw64 = out
            finite = all_finite(out)
        else:  # the statistics read this array (its memory order fixes numpy's summation order)
            raw64 = obs.astype(np.float64, copy=False).reshape(self.n_envs, -1)
            finite = all_finite_1d(raw64.reshape(-1))
        if not finite:  # one compiled pass; the row only on failure
            finite = np.isfinite(raw64).all(axis=1)
            i = int(np.argmin(finite))
            raise EnvStepError(f"env {i} returned a non-finite observation {raw64[i].tolist()} at "
                               f"vector step {vector_step} (rollout step {rollout_step})", i,
                               vector_step, rollout_step)
        if self.obs_rms is not None:
            self._normalize_into(raw64, out, vector_step, rollout_step)

    def _normalize_into(self, obs: np.ndarray, out: np.ndarray, vector_step: int,
                        rollout_step: int) -> None:
        """``out[...] =`` :meth:`normalize_obs` of the finite float64 observations ``obs [N,
        obs_dim]`` (not ``out``), after updating the running statistics with them (unless they
        are frozen)."""
        rms = self.obs_rms
        if self.update_statistics:
            before = (rms.mean, rms.var, rms.count)  # update() assigns new arrays
            done = _update_and_normalize_into(rms, obs, out)
            if done is None:
                rms.update(obs)
                finite = all_finite_1d(rms.var.reshape(-1)) and all_finite_1d(rms.mean.reshape(-1))
            else:
                finite = done[1]
            if not finite:
                rms.mean, rms.var, rms.count = before
                raise _statistics_overflow(obs, vector_step, rollout_step)
            if done is not None:
                self._clip_obs(out)
            else:
                out[...] = self.normalize_obs(obs)
            return
        obs = self.normalize_obs(obs)
        if not all_finite_1d(obs.reshape(-1)):  # frozen statistics far from obs
            i = int(np.argmin(np.isfinite(obs).all(axis=1)))
            raise EnvStepError(f"env {i} returned an observation whose normalized value "
                               f"overflows float64 with the frozen normalizer statistics at "
                               f"vector step {vector_step} (rollout step {rollout_step})",
                               i, vector_step, rollout_step)
        out[...] = obs

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """``(obs - mean) / sqrt(var + 1e-8)`` with the current statistics, then clipped to
        ``[-clip_observations, clip_observations]`` when that is set (identity when off).

        ``obs``: float64 ``[B, obs_dim]`` (flattened raw observations)."""
        if self.obs_rms is None:
            return obs
        return self._clip_obs((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + OBS_NORM_EPS))

    def _clip_obs(self, normalized: np.ndarray) -> np.ndarray:
        """``clip(normalized, -c, c)`` in place for ``c = clip_observations`` (unchanged if None)."""
        c = self.clip_observations
        if c is not None:
            np.clip(normalized, -c, c, out=normalized)
        return normalized

    def _locate_bad_sub_env(self, exc, vector_step, rollout_step):
        """When the vector env itself fails to stack observations, find which sub-env was wrong."""
        expected = tuple(self.policy.obs_shape)
        sub_obs = getattr(self.base_env, "_env_obs", None)
        if sub_obs is not None:
            for i, o in enumerate(sub_obs):
                a = np.asarray(o)
                if a.shape != expected:
                    return EnvStepError(f"env {i} returned an observation of shape {a.shape}, expected "
                                        f"{expected}, at vector step {vector_step} (rollout step "
                                        f"{rollout_step})", i, vector_step, rollout_step)
        return EnvStepError(f"the vector env failed at vector step {vector_step} (rollout step "
                            f"{rollout_step}): {type(exc).__name__}: {exc}", -1, vector_step,
                            rollout_step)

    # -- episode control ----------------------------------------------------------------------
    def reset(self, seeds) -> np.ndarray:
        """Reset every sub-env with its seed (list of N ints); starts new episodes everywhere."""
        raw, info = self.env.reset(seed=[int(s) for s in seeds])
        _raise_env_failure(info, self.vector_steps, -1)
        obs = np.empty((self.n_envs, self.policy.obs_dim), dtype=np.float64)
        self._obs_into(raw, obs, vector_step=self.vector_steps, rollout_step=-1)
        self.obs = obs
        self.episode_starts[:] = True
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        return self.obs

    def collect(self, params, rng: np.random.Generator) -> Rollout:
        """Run ``n_steps`` vector steps with ``policy.act(params, obs, rng)``; return the Rollout.

        Raises:
            EnvStepError: a sub-env returned a non-finite or wrongly shaped observation, a
                non-finite reward, an output that is not real numbers (a complex or string
                observation, a string reward, ``terminated="no"``), or an observation that
                overflows the normalizer statistics; the message names the env index and the
                vector step. Outputs are never converted from such types.
            RuntimeError: :meth:`reset` was never called.
        """
        if self.obs is None:
            raise RuntimeError("call reset(seeds) before collect()")
        T, N = self.n_steps, self.n_envs
        policy = self.policy
        head = policy.head
        obs_buf = np.empty((T, N, policy.obs_dim), dtype=np.float64)
        obs_after = np.empty((N, policy.obs_dim), dtype=np.float64)  # after the last step
        # where step t's observations go: row t + 1 of the buffer (obs_after for the last step)
        obs_rows = list(obs_buf)
        obs_rows.append(obs_after)
        act_buf = np.empty((T, N) + tuple(head.action_shape), dtype=head.action_dtype)
        rew_buf = np.empty((T, N), dtype=np.float64)
        # the flags are False but where an episode ends (the fast path writes only those)
        term_buf = np.zeros((T, N), dtype=bool)
        trunc_buf = np.zeros((T, N), dtype=bool)
        start_buf = np.zeros((T, N), dtype=bool)
        final_values = None
        env = self.env
        tap = self._tap
        fast = self._fast_sync_envs()
        forward = policy.policy_out_fn(params)
        with_starts = bool(getattr(policy, "takes_episode_starts", False))
        # a policy whose acting outputs are the bits evaluate computes: kept, and the rollout's
        # log-probabilities taken from them (rollout_log_probs_values)
        keep_outputs = bool(getattr(policy, "acting_outputs_exact", False)) and not with_starts
        out_buf = None
        sample = head.sample
        to_env = head.to_env
        step_sync = self._step_sync
        obs_into = self._obs_into
        expected = tuple(policy.obs_shape)
        sub_obs = [None] * N  # the sub-envs' observations of the current step (fast path)
        rew_rows = list(rew_buf)  # the rows the sub-envs' rewards go into (fast path)
        start_rows = list(start_buf)
        # rewards as logged (before reward normalization): the reward buffer itself without it
        raw_rew_buf = rew_buf if tap is None else np.empty((T, N), dtype=np.float64)
        obs_buf[0] = self.obs
        start_buf[0] = self.episode_starts
        for t in range(T):
            obs = obs_rows[t]
            if with_starts:  # the flags of obs: the last step's ends (the carried ones at t = 0)
                policy_out = forward(obs, start_rows[t])
            else:
                policy_out = forward(obs)
            if keep_outputs:
                if out_buf is None:
                    out_buf = np.empty((T,) + policy_out.shape, policy_out.dtype)
                out_buf[t] = policy_out
            actions = sample(rng, policy_out, params)
            act_buf[t] = actions
            step = self.vector_steps
            if fast is not None:
                # the flags (and the next step's episode starts) of the envs that ended go
                # straight into the buffers
                final_obs = step_sync(fast, to_env(actions), step, t, rew_rows[t], term_buf,
                                      trunc_buf, start_buf, expected, sub_obs)
                raw_obs = sub_obs
                any_done = final_obs is not None  # holds exactly the envs that ended
            else:
                try:
                    raw_obs, env_rewards, env_terminated, env_truncated, info = env.step(to_env(actions))
                except (ValueError, TypeError) as exc:
                    raise self._locate_bad_sub_env(exc, step, t) from exc
                except (EOFError, ConnectionError) as exc:  # an AsyncVectorEnv worker died
                    raise EnvStepError(f"an env worker process of the async vector env ended "
                                       f"(killed, or its env exited) at vector step {step} "
                                       f"(rollout step {t}): {type(exc).__name__}", -1, step,
                                       t) from exc
                _raise_env_failure(info, step, t)
                rew_buf[t] = _checked_step_arrays(env_rewards, env_terminated, env_truncated, N,
                                                  step, t)
                term_buf[t] = env_terminated
                trunc_buf[t] = env_truncated
                ended = np.logical_or(term_buf[t], trunc_buf[t])
                if t + 1 < T:
                    start_buf[t + 1] = ended
                any_done = bool(ended.any())
                final_obs = info
            self.vector_steps = step + 1
            if tap is None:
                raw_rewards = rew_buf[t]
                finite = all_finite_1d(raw_rewards)
            else:
                raw_rewards = raw_rew_buf[t] = tap.last_rewards
                finite = bool(np.isfinite(raw_rewards).all())
            if not finite:
                i = int(np.argmin(np.isfinite(raw_rewards)))
                raise EnvStepError(f"env {i} returned a non-finite reward {raw_rewards[i]} at vector "
                                   f"step {step} (rollout step {t})", i, step, t)
            obs_into(raw_obs, obs_rows[t + 1], step, t)
            if any_done:
                bootstrap = np.logical_and(trunc_buf[t], np.logical_not(term_buf[t]))
                if bootstrap.any():
                    if final_values is None:
                        final_values = np.zeros((T, N), dtype=np.float64)
                    idx = np.flatnonzero(bootstrap)
                    info = {"final_obs": final_obs} if fast is not None else final_obs
                    final = self._final_obs(info, idx, step, t)
                    final_values[t, idx] = (policy.values(params, final, env_indices=idx)
                                            if with_starts else policy.values(params, final))
        # episode bookkeeping of the whole rollout in one compiled pass: per env, in step order,
        # the running return += reward and length += 1, recorded and reset where an episode
        # ended (the same additions in the same order as step by step)
        done = np.logical_or(term_buf, trunc_buf)
        ep_returns, ep_lengths, ep_envs = finished_episodes(raw_rew_buf, done, self.episode_return,
                                                            self.episode_length)
        if self.clip_rewards is not None:  # the normalized rewards (the logged ones are raw)
            np.clip(rew_buf, -self.clip_rewards, self.clip_rewards, out=rew_buf)
        starts = done[T - 1]
        self.obs = obs = obs_after
        self.episode_starts = starts.copy()
        # Record values and behaviour log-probs as the update's evaluate computes them (the
        # parameters did not change during the rollout, so these are the quantities of acting
        # time), so that the first minibatch's ratio is exactly 1: by one evaluate over all
        # T*N rows, or, for a policy whose passes give a row the same bits in a call of any
        # size (acting_outputs_exact: the fast policies' FMA-ordered passes, unlike a BLAS
        # product), from the acting outputs kept step by step.
        flat_obs = obs_buf.reshape(T * N, -1)
        flat_actions = act_buf.reshape((T * N,) + tuple(head.action_shape))
        if keep_outputs:  # the same bits as evaluate, without the policy tower
            log_probs, values = policy.rollout_log_probs_values(
                params, flat_obs, flat_actions, out_buf.reshape(T * N, -1))
        else:
            flat = (policy.evaluate(params, flat_obs, flat_actions, episode_starts=start_buf)
                    if with_starts else policy.evaluate(params, flat_obs, flat_actions))
            log_probs, values = flat.log_probs, flat.values
        logp_buf = log_probs.reshape(T, N)
        val_buf = values.reshape(T, N)
        last_values = (policy.values(params, obs, episode_starts=starts) if with_starts
                       else policy.values(params, obs))
        return Rollout(obs_buf, act_buf, rew_buf, term_buf, trunc_buf, start_buf, val_buf,
                       logp_buf, final_values, last_values, ep_returns, ep_lengths, ep_envs)

    def _fast_sync_envs(self):
        """The sub-env list when the collector may step them directly (see :meth:`_step_sync`)."""
        from gymnasium.vector import SyncVectorEnv
        if self.use_fast_sync and self._tap is None and type(self.base_env) is SyncVectorEnv:
            # make_vector_env's checking layer is skipped: _step_sync checks the same way
            return [e.env if type(e) is StateAccessWrapper else e for e in self.base_env.envs]
        return None

    def _step_sync(self, envs, actions, vector_step, rollout_step, rewards, terminated, truncated,
                   episode_starts, expected, observations):
        """One SAME_STEP vector step over the sub-envs of a plain ``SyncVectorEnv``.

        The same calls, in the same order, as ``SyncVectorEnv.step`` in SAME_STEP mode
        (``env.step(action)``; if it terminated or truncated, keep the observation as the final
        one and ``env.reset()``), so results are identical; it skips the vector env's per-step
        action iteration, info-dict merging, batch concatenation and copies. Each sub-env gets
        ``actions[i]`` of the action array, as ``SyncVectorEnv`` passes it (a numpy integer
        scalar for Discrete: gymnasium's ``Discrete.contains`` checks it faster than a Python
        int; a row for Box).
        Writes env ``i``'s reward (checked to be a real number) into ``rewards[i]`` (the
        rollout's float64 row ``[N]`` of this step) and its observation (the reset one where it ended) into the list ``observations``; where it
        ended, its flags into row ``t = rollout_step`` of the ``[T, N]`` bool ``terminated``,
        ``truncated`` (left False elsewhere) and True into ``episode_starts[t + 1]`` (if
        ``t + 1 < T``). ``expected`` is the observation shape (a tuple).
        Returns ``final_obs`` ``{i: obs}`` of the envs that ended, ``None`` when none did.
        """
        final_obs = None
        t = rollout_step
        next_row = t + 1 < len(episode_starts)
        i = 0
        try:
            for env, action in zip(envs, actions):  # action = actions[i]
                o, r, term, trunc, _ = env.step(action)
                if (o.shape if type(o) is np.ndarray else np.shape(o)) != expected:
                    raise EnvStepError(f"env {i} returned an observation of shape {np.shape(o)}, expected "
                                       f"{expected}, at vector step {vector_step} (rollout step "
                                       f"{rollout_step})", i, vector_step, rollout_step)
                # the common types pass on one set lookup; anything else is checked in full
                if type(r) not in _REAL_SCALAR_TYPES:
                    _check_env_scalar(r, "reward", i, vector_step, rollout_step)
                if type(term) not in _FLAG_TYPES:
                    _check_env_scalar(term, "terminated", i, vector_step, rollout_step)
                if type(trunc) not in _FLAG_TYPES:
                    _check_env_scalar(trunc, "truncated", i, vector_step, rollout_step)
                rewards[i] = r
                if term or trunc:
                    terminated[t, i] = term
                    truncated[t, i] = trunc
                    if next_row:
                        episode_starts[t + 1, i] = True
                    if final_obs is None:
                        final_obs = {}
                    final_obs[i] = o
                    o, _ = env.reset()
                    if np.shape(o) != expected:
                        raise EnvStepError(f"env {i} returned a reset observation of shape {np.shape(o)}, "
                                           f"expected {expected}, at vector step {vector_step} (rollout "
                                           f"step {rollout_step})", i, vector_step, rollout_step)
                observations[i] = o
                i += 1
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as exc:  # SystemExit & co. from env code: the env failed
            raise EnvStepError(f"env {i} raised {type(exc).__name__}: {_one_line(exc)} "
                               f"(vector step {vector_step}, rollout step {rollout_step})",
                               i, vector_step, rollout_step) from exc
        return final_obs

    def _final_obs(self, info, idx, vector_step, rollout_step) -> np.ndarray:
        """Stack, check and normalize ``info["final_obs"][idx]`` (frozen statistics)."""
        try:
            items = info["final_obs"]
        except KeyError:
            raise EnvStepError("info has no 'final_obs' on a truncated step: the vector env is not "
                               "in SAME_STEP autoreset mode", int(idx[0]), vector_step,
                               rollout_step) from None
        expected = tuple(self.policy.obs_shape)
        rows = []
        for i in idx:
            a = np.asarray(items[i])
            if a.dtype.kind not in _REAL_KINDS:
                raise EnvStepError(f"env {int(i)} returned a final observation of dtype {a.dtype} "
                                   f"(not real numbers) at vector step {vector_step} (rollout step "
                                   f"{rollout_step})", int(i), vector_step, rollout_step)
            a = a.astype(np.float64, copy=False)
            if a.shape != expected:
                raise EnvStepError(f"env {int(i)} returned a final observation of shape {a.shape}, "
                                   f"expected {expected}, at vector step {vector_step} (rollout step "
                                   f"{rollout_step})", int(i), vector_step, rollout_step)
            if not np.isfinite(a).all():
                raise EnvStepError(f"env {int(i)} returned a non-finite final observation "
                                   f"{a.ravel().tolist()} at vector step {vector_step} (rollout step "
                                   f"{rollout_step})", int(i), vector_step, rollout_step)
            rows.append(a.reshape(-1))
        return self.normalize_obs(np.stack(rows))

    # -- state for checkpoints ----------------------------------------------------------------
    def sub_envs_state(self) -> List[Dict[str, Any]]:
        """Per-sub-env snapshots (:func:`single_env_state`); Sync and Async vector envs."""
        base = self.base_env
        if hasattr(base, "envs"):
            return [single_env_state(e) for e in base.envs]
        try:
            return list(base.call("ppo_ref_get_state"))
        except Exception as exc:  # a user-made AsyncVectorEnv without the state wrapper
            return [{"layers": [], "unsupported": [f"vector env state: {type(exc).__name__}: {exc}"]}
                    for _ in range(self.n_envs)]

    def restore_sub_envs(self, states: List[Dict[str, Any]]) -> None:
        base = self.base_env
        if len(states) != self.n_envs:
            raise ValueError(f"saved env state has {len(states)} sub-envs, this env has {self.n_envs}")
        if hasattr(base, "envs"):
            for e, s in zip(base.envs, states):
                restore_single_env_state(e, s)
        else:
            try:
                base.set_attr("ppo_ref_pending_state", list(states))
                base.call("ppo_ref_apply_state")
            except Exception as exc:
                raise ValueError(f"cannot restore the sub-env states of this vector env: {exc}") from exc

    def state(self) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """``(arrays, json)`` capturing everything the next :meth:`collect` depends on.

        Arrays: ``obs``, ``episode_starts``, ``episode_return``, ``episode_length``, and the
        normalization statistics (``obs_rms.mean/var/count``, ``ret_rms.mean/var/count``,
        ``ret_accumulated``, ``ret_prev_dones``). JSON: ``vector_steps``, ``sub_envs`` (per
        sub-env snapshots) and ``unsupported`` (attributes that could not be captured: when
        non-empty a resume is not bit-exact).
        """
        if self.obs is None:
            raise RuntimeError("collector has no state before reset()")
        arrays = {"obs": self.obs.copy(), "episode_starts": self.episode_starts.copy(),
                  "episode_return": self.episode_return.copy(),
                  "episode_length": self.episode_length.copy()}
        if self.obs_rms is not None:
            arrays["obs_rms.mean"] = np.array(self.obs_rms.mean, dtype=np.float64)
            arrays["obs_rms.var"] = np.array(self.obs_rms.var, dtype=np.float64)
            arrays["obs_rms.count"] = np.array(self.obs_rms.count, dtype=np.float64)
        if self.reward_normalizer is not None:
            rn = self.reward_normalizer
            arrays["ret_rms.mean"] = np.array(rn.return_rms.mean)
            arrays["ret_rms.var"] = np.array(rn.return_rms.var)
            arrays["ret_rms.count"] = np.array(rn.return_rms.count, dtype=np.float64)
            arrays["ret_accumulated"] = np.array(rn.accumulated_reward)
            arrays["ret_prev_dones"] = np.array(rn._prev_dones)
        subs = self.sub_envs_state()
        unsupported = sorted({u for s in subs for u in s.get("unsupported", [])})
        meta = {"vector_steps": int(self.vector_steps), "sub_envs": subs,
                "unsupported": unsupported}
        return arrays, meta

    def load_state(self, arrays: Dict[str, np.ndarray], meta: Dict[str, Any]) -> None:
        """Inverse of :meth:`state` (the env must have been built the same way)."""
        obs = np.array(arrays["obs"], dtype=np.float64)
        if obs.shape != (self.n_envs, self.policy.obs_dim):
            raise ValueError(f"saved observations have shape {obs.shape}, expected "
                             f"{(self.n_envs, self.policy.obs_dim)}")
        if self.obs_rms is not None:
            if "obs_rms.mean" not in arrays:
                raise ValueError("checkpoint has no observation-normalization statistics")
            self.obs_rms.mean = np.array(arrays["obs_rms.mean"])
            self.obs_rms.var = np.array(arrays["obs_rms.var"])
            self.obs_rms.count = float(arrays["obs_rms.count"])
        if self.reward_normalizer is not None:
            if "ret_rms.mean" not in arrays:
                raise ValueError("checkpoint has no reward-normalization statistics")
            rn = self.reward_normalizer
            rn.return_rms.mean = np.array(arrays["ret_rms.mean"])
            rn.return_rms.var = np.array(arrays["ret_rms.var"])
            rn.return_rms.count = float(arrays["ret_rms.count"])
            rn.accumulated_reward = np.array(arrays["ret_accumulated"])
            rn._prev_dones = np.array(arrays["ret_prev_dones"])
        self.restore_sub_envs(meta["sub_envs"])
        self.obs = obs
        self.episode_starts = np.array(arrays["episode_starts"], dtype=bool)
        self.episode_return = np.array(arrays["episode_return"], dtype=np.float64)
        self.episode_length = np.array(arrays["episode_length"], dtype=np.int64)
        self.vector_steps = int(meta["vector_steps"])

    def close(self) -> None:
        self.env.close()


def _check_clip(value, name: str, normalized: bool, flag: str) -> Optional[float]:
    """A clip bound as a float (``None`` kept); ``ValueError`` naming ``name`` unless it is a
    finite number > 0 and ``normalized`` (its normalization ``flag`` is on)."""
    if value is None:
        return None
    value = check_real_scalar(value, name)
    if not value > 0:
        raise ValueError(f"{name} must be a finite number > 0 or None, got {value}")
    if not normalized:
        raise ValueError(f"{name} clips the normalized values: it needs {flag}=True")
    return value


# Env outputs are read as numbers only when they are numbers: bool, signed or unsigned
# integer, or real float (dtype kinds). Complex values, strings ("1.5", "no") and objects are
# refused rather than converted (numpy would drop an imaginary part, parse a string, or take
# any non-empty string as True).
_REAL_KINDS = frozenset("biuf")
_REAL_SCALAR_TYPES = frozenset({float, int, bool, np.float64, np.float32, np.int64, np.int32,
                                np.bool_})
_FLAG_TYPES = frozenset({bool, np.bool_})


def _env_value_text(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_env_scalar(value, what: str, i: int, vector_step: int, rollout_step: int) -> None:
    """Raise :class:`EnvStepError` unless ``value`` (one sub-env's reward, or its terminated /
    truncated flag) is a real number (a flag: a bool, or an integer 0 or 1): the rule of
    :func:`ppo_ref._checks.env_value_problem`."""
    problem = env_value_problem(value, what)
    if problem is not None:
        raise EnvStepError(f"env {i} returned {problem} (vector step {vector_step}, rollout "
                           f"step {rollout_step})", i, vector_step, rollout_step)


def _one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _raise_env_failure(info, vector_step: int, rollout_step: int) -> None:
    """Raise :class:`EnvStepError` for the first sub-env whose ``info`` carries
    :data:`ENV_FAILURE_KEY` (set by :class:`StateAccessWrapper` where the env runs)."""
    if not isinstance(info, dict) or ENV_FAILURE_KEY not in info:
        return
    texts, mask = info[ENV_FAILURE_KEY], info.get("_" + ENV_FAILURE_KEY)
    for i in range(len(texts)):
        if mask is None or mask[i]:
            raise EnvStepError(f"env {i} {texts[i]} (vector step {vector_step}, rollout step "
                               f"{rollout_step})", i, vector_step, rollout_step)


def _bad_kind(items, what: str, vector_step: int, rollout_step: int) -> "EnvStepError":
    """The error for a batch of env outputs (an array of a non-real dtype, or the list of the
    sub-envs' outputs): names the first sub-env whose entry is not real numbers (env 0 when the
    whole array has one bad dtype)."""
    i, dtype = 0, getattr(items, "dtype", None)
    sequence = isinstance(items, (list, tuple)) or getattr(items, "ndim", 0) >= 1
    for k in range(len(items) if sequence else 0):
        entry = np.asarray(items[k])
        if entry.dtype.kind not in _REAL_KINDS and (entry.dtype.kind != "c" or np.any(entry.imag)):
            i, dtype = k, entry.dtype
            break
    return EnvStepError(f"env {i} returned {what} values of dtype {dtype} (not real numbers) "
                        f"at vector step {vector_step} (rollout step {rollout_step})", i,
                        vector_step, rollout_step)


def _checked_step_arrays(rewards, terminated, truncated, n_envs: int, vector_step: int,
                         rollout_step: int) -> np.ndarray:
    """Check the reward and flag arrays a vector env's ``step`` returned (dtype kinds and shape
    ``[n_envs]``, no per-element work when they are fine); return the rewards as float64."""
    for what, value, kinds in (("reward", rewards, _REAL_KINDS), ("terminated", terminated, "b"),
                               ("truncated", truncated, "b")):
        arr = np.asarray(value)
        if arr.dtype.kind not in kinds:
            raise _bad_kind(arr, what, vector_step, rollout_step) if what == "reward" else \
                EnvStepError(f"the vector env returned {what} flags of dtype {arr.dtype} (expected "
                             f"bool) at vector step {vector_step} (rollout step {rollout_step})",
                             -1, vector_step, rollout_step)
        if arr.shape != (n_envs,):
            raise EnvStepError(f"the vector env returned {what} of shape {arr.shape}, expected "
                               f"({n_envs},), at vector step {vector_step} (rollout step "
                               f"{rollout_step})", -1, vector_step, rollout_step)
    return np.asarray(rewards, dtype=np.float64)


def _statistics_overflow(obs: np.ndarray, vector_step: int, rollout_step: int) -> "EnvStepError":
    """The error for observations whose squares overflow the normalizer's running variance
    (components above about 1.3e154): names the env holding the largest such component."""
    j = int(np.argmax(np.abs(obs).max(axis=0)))
    i = int(np.argmax(np.abs(obs[:, j])))
    return EnvStepError(f"env {i} returned an observation with component {j} = {obs[i, j]:.3g} at "
                        f"vector step {vector_step} (rollout step {rollout_step}): the observation "
                        f"normalizer's running variance overflows float64 (components above "
                        f"about 1.3e154 cannot be normalized; every normalized observation would "
                        f"be 0); scale the observations or turn normalize_observations off", i,
                        vector_step, rollout_step)


def _update_and_normalize(rms, obs: np.ndarray) -> Optional[np.ndarray]:
    """``rms.update(obs)`` then :meth:`RolloutCollector.normalize_obs` in one compiled call
    (:func:`_obs_statistics_kernel`, the same arithmetic in the same order, so the same bits:
    tested against gymnasium's ``RunningMeanStd``), or ``None`` (nothing done) outside the
    case it covers: ``obs`` a C-contiguous float64 ``[N, d]`` with ``d >= 2``, ``rms.mean`` and
    ``rms.var`` C-contiguous float64 ``[d]``, ``rms.count`` a Python float. (With ``d = 1``
    numpy sums the contiguous column pairwise, in another order than row by row.)
    Sets ``rms.mean``, ``rms.var`` (new arrays) and ``rms.count`` as ``update`` does."""
    done = _update_and_normalize_into(rms, obs, None)
    return None if done is None else done[0]


def _update_and_normalize_into(rms, obs: np.ndarray, out: Optional[np.ndarray]
                               ) -> Optional[Tuple[np.ndarray, bool]]:
    """:func:`_update_and_normalize` writing the normalized batch into ``out`` (the
    collector's own float64 ``[N, d]`` C-contiguous rollout row, never ``obs`` itself; a new
    array when ``None``): ``(out, finite)`` with ``finite`` True iff the new ``rms.mean`` and
    ``rms.var`` are finite, or ``None`` (nothing done) outside the case it covers."""
    mean, var, count = rms.mean, rms.var, rms.count
    if not (type(obs) is np.ndarray and obs.ndim == 2 and obs.dtype == _FLOAT64
            and obs.flags.c_contiguous and obs.shape[1] >= 2 and type(count) is float):
        return None
    d = obs.shape[1]
    for a in (mean, var):
        if not (type(a) is np.ndarray and a.dtype == _FLOAT64 and a.shape == (d,)
                and a.flags.c_contiguous):
            return None
    tot_count = count + obs.shape[0]
    new_mean = np.empty(d)
    new_var = np.empty(d)
    if out is None:
        out = np.empty_like(obs)
    finite = _obs_statistics_kernel(obs, mean, var, count, tot_count, OBS_NORM_EPS, new_mean,
                                    new_var, out)
    rms.mean, rms.var, rms.count = new_mean, new_var, tot_count
    return out, finite


@njit
def _obs_statistics_kernel(obs, mean, var, count, tot_count, eps, new_mean, new_var, out):
    """gymnasium's ``RunningMeanStd.update(obs)`` (parallel-variance merge, Chan et al.) and
    ``(obs - mean') / sqrt(var' + eps)`` with the new statistics, per column ``j`` of the
    float64 ``obs [N, d]``, in numpy's operation order for ``d >= 2`` (sums over rows
    from row 0 on, row by row)::

        bm = sum_i obs[i, j] / N;  bv = sum_i (obs[i, j] - bm)**2 / N;  delta = bm - mean[j]
        mean'[j] = mean[j] + delta * N / tot_count
        var'[j]  = (var[j] * count + bv * N + delta**2 * count * N / tot_count) / tot_count

    with ``tot_count = count + N``; writes ``new_mean``, ``new_var`` ``[d]`` and ``out [N, d]``.
    Returns True iff every ``mean'[j]`` and ``var'[j]`` is finite."""
    N, d = obs.shape
    n = np.float64(N)
    finite = True
    for j in range(d):
        s = obs[0, j]
        for i in range(1, N):
            s += obs[i, j]
        batch_mean = np.true_divide(s, n)
        dev = obs[0, j] - batch_mean
        ss = dev * dev
        for i in range(1, N):
            dev = obs[i, j] - batch_mean
            ss += dev * dev
        batch_var = np.true_divide(ss, n)
        delta = batch_mean - mean[j]
        new_mean[j] = mean[j] + np.true_divide(delta * n, tot_count)
        m2 = var[j] * count + batch_var * n + np.true_divide(delta * delta * count * n, tot_count)
        new_var[j] = np.true_divide(m2, tot_count)
        sd = math.sqrt(new_var[j] + eps)
        for i in range(N):
            out[i, j] = np.true_divide(obs[i, j] - new_mean[j], sd)
        if not (math.isfinite(new_mean[j]) and math.isfinite(new_var[j])):
            finite = False
    return finite


@njit
def _episode_bookkeeping(rewards, done, episode_return, episode_length, ended_returns,
                         ended_lengths, ended_envs):
    """Running episode returns and lengths over a rollout's ``[T, N]`` rewards and ``done``
    flags (terminated or truncated), in step order: per step and env ``return += reward``,
    ``length += 1``; where ``done``, the pair is appended to ``ended_*`` (with the env index,
    step-major then env order) and reset to 0. ``episode_return``/``episode_length`` ``[N]``
    carry over between rollouts (updated in place)."""
    T, N = rewards.shape
    k = 0
    for t in range(T):
        for i in range(N):
            episode_return[i] += rewards[t, i]
            episode_length[i] += 1
            if done[t, i]:
                ended_returns[k] = episode_return[i]
                ended_lengths[k] = episode_length[i]
                ended_envs[k] = i
                k += 1
                episode_return[i] = 0.0
                episode_length[i] = 0


class _RawRewardTap(gym.vector.VectorWrapper):
    """Pass-through vector wrapper that remembers the raw rewards of the last step, so episode
    returns are logged before reward normalization."""

    def __init__(self, env):
        super().__init__(env)
        self.last_rewards = np.zeros(env.num_envs, dtype=np.float64)

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.last_rewards = np.asarray(rewards, dtype=np.float64)
        return obs, rewards, terminated, truncated, info
