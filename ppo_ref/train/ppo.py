"""The PPO trainers: collect a rollout, compute advantages, run the epochs of the update.

``PPOTrainer`` composes the pieces of its tier (:func:`ppo_ref.tiers.tier_for`):
:class:`~ppo_ref.train.rollout.RolloutCollector`, the tier's ``advantages.gae`` and
:func:`ppo_ref.spec.update.run_epochs`, one update per rollout. ``np.random.SeedSequence(seed)``
spawns the streams of parameter init, env seeds, action sampling, minibatch permutations and
``predict``: the same seed gives bit-identical runs, and a checkpoint (:meth:`PPOTrainer.save`)
captures the whole run state at a rollout boundary, so a resumed run continues exactly for envs
whose state is plain attributes (all classic-control envs; :mod:`ppo_ref.io.state`).
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numba
import numpy as np

from ppo_ref._checks import as_float_array, check_count, one_line
from ppo_ref._numba import PARALLEL_LOOPS
from ppo_ref.config import PPOConfig
from ppo_ref.io.checkpoint import (RECENT_EPISODES, CheckpointError, array_to_json,
                                   check_env_import, generator_state, json_to_array,
                                   load_checkpoint, save_checkpoint, set_generator_state,
                                   vet_checkpoint_metadata, vet_state_arrays, vet_state_record)
from ppo_ref.io.state import adam_state_from_arrays, adam_state_to_arrays
from ppo_ref.spec.losses import explained_variance
from ppo_ref.spec.optim import adam_init
from ppo_ref.spec.update import (batch_advantages, feedforward_minibatches, run_epochs,
                                 truncation_weights)
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import make_policy
from ppo_ref.train.rollout import (EnvStepError, Rollout, RolloutCollector, check_vector_env,
                                   make_vector_env)

__all__ = ["PPOTrainer", "Iteration", "EnvStepError", "progress_remaining",
           "limit_blas_threads", "check_kernel_threads", "kernel_threads"]

Callback = Callable[["PPOTrainer", Dict[str, float]], Optional[bool]]


class Iteration(NamedTuple):
    """One PPO iteration (:meth:`PPOTrainer.iteration`): the rollout trained on, its
    ``advantages`` and ``returns`` (float64 ``[T, N]``) and the update's ``stats``."""

    rollout: Rollout
    advantages: np.ndarray
    returns: np.ndarray
    stats: Dict[str, float]


def limit_blas_threads(n_threads: int = 1) -> bool:
    """Limit NumPy's BLAS to ``n_threads`` threads for the rest of the process
    (``threadpoolctl.threadpool_limits(n_threads, user_api="blas")``: PPO's matrices are too
    small to gain from more; use ``threadpool_limits`` as a context manager to scope it).
    Returns True if a BLAS pool was limited; ``ValueError`` for ``n_threads < 1``."""
    from threadpoolctl import threadpool_limits
    n = int(n_threads)
    if n < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    limiter = threadpool_limits(limits=n, user_api="blas")
    return limiter.get_original_num_threads().get("blas") is not None


def check_kernel_threads(value, name: str = "threads", none_ok: bool = True) -> Optional[int]:
    """``value`` as a number of numba threads: None when ``none_ok`` (numba's setting stays),
    or an integer (not a bool) in ``[1, numba.config.NUMBA_NUM_THREADS]``; ``ValueError``
    naming ``name`` otherwise."""
    if value is None and none_ok:
        return None
    most = numba.config.NUMBA_NUM_THREADS
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or not 1 <= value <= most:
        allowed = "None or an integer" if none_ok else "an integer"
        raise ValueError(f"{name} must be {allowed} in [1, {most}] (numba's threads, "
                         f"NUMBA_NUM_THREADS), got {value!r}")
    return int(value)


@contextlib.contextmanager
def kernel_threads(n_threads: Optional[int]):
    """Run the block with ``numba.set_num_threads(n_threads)`` for the calling thread, then
    restore the previous value; None, or plain loops (``PARALLEL_LOOPS`` False), change
    nothing. ``ValueError`` as :func:`check_kernel_threads`."""
    n = check_kernel_threads(n_threads, "n_threads")
    if n is None or not PARALLEL_LOOPS:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def progress_remaining(num_timesteps: int, total_timesteps: int) -> float:
    """SB3's ``1 - num_timesteps / total_timesteps``, clipped to [0, 1]."""
    if total_timesteps <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - num_timesteps / total_timesteps)))


#: What a crafted checkpoint can make a restore raise besides ValueError.
_RESTORE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError,
                   RecursionError, MemoryError, NotImplementedError)


class PPOTrainer:
    """Feedforward PPO on a gymnasium vector environment (module docstring).

    Args:
        env: a gymnasium id (``config.n_envs`` copies are made) or a gymnasium ``VectorEnv``
            in SAME_STEP autoreset mode with ``config.n_envs`` envs.
        config: :class:`~ppo_ref.config.PPOConfig` (default ``PPOConfig()``); its ``backend``
            picks the tier.
        seed: the run's seed (int >= 0).
        vectorization: ``"sync"``, ``"async"`` (AsyncVectorEnv) or ``"envpool"``
            (:class:`~ppo_ref.train.envpool_env.EnvpoolVectorEnv`), when ``env`` is an id.
        env_kwargs: extra keyword arguments of ``gym.make``.
        blas_threads: if not None, passed to :func:`limit_blas_threads`.
        threads: numba's threads while the trainer computes (:func:`kernel_threads`; None
            leaves numba's setting); the same bits for any value. Not saved with a checkpoint.

    Attributes: ``tier``, ``policy``, ``params`` (dict of float64 arrays), ``adam_state``,
    ``num_timesteps`` (single-env steps collected), ``n_updates``, ``n_episodes``,
    ``total_timesteps`` (the schedule horizon of :meth:`learn`), ``recent_returns`` (the last
    100 episode returns), ``last_episodes`` (``(env_index, return, length)`` of the episodes
    that finished in the last rollout).

    Raises:
        ValueError: bad config or seed, unsupported spaces, a vector env not in SAME_STEP mode
            or with a number of envs other than ``config.n_envs``.
    """

    policy_kind = "mlp"
    recurrent = False

    def __init__(self, env, config: Optional[PPOConfig] = None, *, seed: int = 0,
                 vectorization: str = "sync", env_kwargs: Optional[dict] = None,
                 blas_threads: Optional[int] = 1, threads: Optional[int] = 1):
        self.threads = threads
        if blas_threads is not None:
            limit_blas_threads(blas_threads)
        self.config = config if config is not None else PPOConfig()
        if not isinstance(self.config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(self.config).__name__}")
        self._check_config(self.config)
        self.seed = check_count(seed, "seed", 0)
        self.vectorization = vectorization
        self.env_kwargs = dict(env_kwargs or {})
        if isinstance(env, str):
            self.env_id: Optional[str] = env
            env = make_vector_env(env, self.config.n_envs, vectorization=vectorization,
                                  env_kwargs=self.env_kwargs)
        else:
            check_vector_env(env)
            if env.num_envs != self.config.n_envs:
                raise ValueError(f"env has {env.num_envs} sub-envs but config.n_envs is "
                                 f"{self.config.n_envs}")
            self.env_id = getattr(getattr(env, "spec", None), "id", None)
        self.tier = tier_for(self.config.backend)
        init_seq, env_seq, action_seq, minibatch_seq, predict_seq = \
            np.random.SeedSequence(self.seed).spawn(5)
        c = self.config
        try:  # (the env is closed when the trainer cannot be built on it)
            self.policy = make_policy(env.single_observation_space, env.single_action_space,
                                      c, self.tier, self.recurrent)
            self.params = self.policy.init_params(np.random.default_rng(init_seq))
            self.env_seeds = [int(s) for s in env_seq.generate_state(c.n_envs, dtype=np.uint32)]
            self.collector = RolloutCollector(
                env, self.policy, c.n_steps, normalize_observations=c.normalize_observations,
                normalize_rewards=c.normalize_rewards, gamma=c.gamma,
                clip_observations=c.clip_observations, clip_rewards=c.clip_rewards)
            self.collector.reset(self.env_seeds)
        except BaseException:
            env.close()
            raise
        self.adam_state = adam_init(self.params)
        self.action_rng = np.random.default_rng(action_seq)
        self.minibatch_rng = np.random.default_rng(minibatch_seq)
        self.predict_rng = np.random.default_rng(predict_seq)
        self.num_timesteps = self.n_updates = self.n_episodes = self.total_timesteps = 0
        self.progress_remaining = 1.0
        self.recent_returns: deque = deque(maxlen=RECENT_EPISODES)
        self.last_episodes: List[Tuple[int, float, int]] = []

    def _check_config(self, config: PPOConfig) -> None:
        """What a subclass requires of a config beyond its own checks."""

    # -- the three steps of an update ---------------------------------------------------------
    def collect_rollout(self) -> Rollout:
        """Collect ``config.n_steps`` steps from every env with the current parameters; counts
        them (:meth:`record_rollout`). Raises :class:`~ppo_ref.train.rollout.EnvStepError` for
        a bad environment output."""
        return self.record_rollout(self.collector.collect(self.params, self.action_rng))

    def record_rollout(self, rollout: Rollout) -> Rollout:
        """Count a rollout this trainer consumes (collected, or assembled by the actor-learner's
        learner) in ``num_timesteps``, ``last_episodes``, ``n_episodes``, ``recent_returns``."""
        self.num_timesteps += rollout.n_steps * rollout.n_envs
        self.last_episodes = list(zip(rollout.episode_envs, rollout.episode_returns,
                                      rollout.episode_lengths))
        self.n_episodes += len(rollout.episode_returns)
        self.recent_returns.extend(rollout.episode_returns)
        return rollout

    def compute_advantages(self, rollout: Rollout) -> Tuple[np.ndarray, np.ndarray]:
        """GAE (:func:`ppo_ref.spec.advantages.gae` on the tier) of the rollout with
        ``config.gamma``, ``gae_lambda``, ``truncation`` and ``bootstrap_terminal_last_row``.
        Returns ``(advantages, returns)``, float64 ``[T, N]``."""
        c = self.config
        return self.tier.advantages.gae(
            rollout.rewards, rollout.values, rollout.terminated, rollout.truncated,
            rollout.last_values, rollout.final_values, gamma=c.gamma, gae_lambda=c.gae_lambda,
            truncation=c.truncation, bootstrap_terminal_last_row=c.bootstrap_terminal_last_row)

    def compute_vtrace_advantages(self, rollout: Rollout, *, rho_bar: float = 1.0,
                                  c_bar: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
        """V-trace in place of GAE (the actor-learner's off-policy correction):
        :func:`ppo_ref.spec.advantages.vtrace` on the tier, of the rollout's behaviour
        ``log_probs`` against the current ``params``' log-probs and values. Returns
        ``(pg_advantages, vs)``, float64 ``[T, N]``."""
        c = self.config
        T, N = rollout.rewards.shape
        target_log_probs, _, target_values, _ = self.policy.evaluate(
            self.params, self._whole_rollout(rollout))
        vt = self.tier.advantages.vtrace(
            rollout.log_probs, target_log_probs.reshape(T, N), rollout.rewards,
            target_values.reshape(T, N), rollout.terminated, rollout.truncated,
            rollout.last_values, rollout.final_values, gamma=c.gamma, rho_bar=rho_bar,
            c_bar=c_bar, truncation=c.truncation,
            bootstrap_terminal_last_row=c.bootstrap_terminal_last_row)
        return vt.pg_advantages, vt.vs

    def _whole_rollout(self, rollout: Rollout):
        """The policy's ``evaluate`` data for every row of ``rollout`` (time-major)."""
        T, N = rollout.rewards.shape
        return (rollout.observations.reshape(T * N, -1),
                rollout.actions.reshape((T * N,) + rollout.actions.shape[2:]))

    def current_learning_rate(self) -> float:
        """Learning rate at the current ``progress_remaining``."""
        return self.config.learning_rate_at(self.progress_remaining)

    def current_clip_range(self) -> float:
        """Clip range at the current ``progress_remaining``."""
        return self.config.clip_range_at(self.progress_remaining)

    def _minibatches(self, rollout: Rollout, advantages: np.ndarray, returns: np.ndarray):
        """The update's minibatches (:func:`ppo_ref.spec.update.feedforward_minibatches`: the
        ``T*N`` rows flattened time-major, row ``t * N + n``; ``config.drop_truncated_steps``:
        :func:`ppo_ref.spec.update.truncation_weights`)."""
        T, N = rollout.rewards.shape
        B = T * N
        obs, actions = self._whole_rollout(rollout)
        weights = truncation_weights(rollout.terminated, rollout.truncated,
                                     self.config.drop_truncated_steps)
        return feedforward_minibatches(self.minibatch_rng, self.config.batch_size,
                                       rollout.log_probs.reshape(B), advantages.reshape(B),
                                       returns.reshape(B), rollout.values.reshape(B), obs,
                                       actions, None if weights is None else weights.reshape(B))

    def train_on(self, rollout: Rollout, advantages: np.ndarray,
                 returns: np.ndarray) -> Dict[str, float]:
        """The epochs of one PPO update (:func:`ppo_ref.spec.update.run_epochs` with this
        trainer's minibatches, policy and tier): replaces ``params`` and ``adam_state``; returns
        the stats of ``run_epochs`` plus ``explained_variance``. ``FloatingPointError`` naming
        the update, epoch and minibatch for a non-finite result (parameters left unchanged)."""
        c = self.config
        advantages = batch_advantages(advantages, c, self.tier.losses)
        returns = np.asarray(returns, dtype=np.float64)
        try:
            self.params, self.adam_state, stats = run_epochs(
                self.params, self.adam_state, config=c, lr=self.current_learning_rate(),
                clip_range=self.current_clip_range(),
                minibatches=self._minibatches(rollout, advantages, returns),
                evaluate=self.policy.evaluate, backward=self.policy.backward,
                losses=self.tier.losses, optim=self.tier.optim)
        except FloatingPointError as exc:
            raise FloatingPointError(f"update {self.n_updates}, {exc}") from None
        stats["explained_variance"] = explained_variance(rollout.values.ravel(), returns.ravel())
        return stats

    def update(self, rollout: Rollout) -> Dict[str, float]:
        """``compute_advantages`` then ``train_on``: one full PPO update; returns its stats."""
        with kernel_threads(self.threads):
            advantages, returns = self.compute_advantages(rollout)
            return self.train_on(rollout, advantages, returns)

    @property
    def threads(self) -> Optional[int]:
        """numba threads of each :meth:`iteration` (checked by :func:`check_kernel_threads`)."""
        return self._threads

    @threads.setter
    def threads(self, value) -> None:
        self._threads = check_kernel_threads(value)

    # -- the loop -----------------------------------------------------------------------------
    def learn(self, total_timesteps: int, callback: Optional[Callback] = None) -> "PPOTrainer":
        """Train until ``num_timesteps >= total_timesteps`` (an absolute target, also the horizon
        of the linear schedules, so a resumed run anneals exactly as an uninterrupted one).
        After every update ``callback(trainer, stats)`` (:meth:`iteration`'s stats) is called at
        a rollout boundary; returning ``False`` stops training there. Raises ``ValueError`` for
        ``total_timesteps`` not an integer in ``[0, 2**53]``, :class:`EnvStepError`."""
        total = check_count(total_timesteps, "total_timesteps", 0)
        if total > 2 ** 53:  # every step count up to it is exact in float64
            raise ValueError(f"total_timesteps must be in [0, 2**53], got {total}")
        self.total_timesteps = total
        while self.num_timesteps < total:
            stats = self.iteration().stats
            if callback is not None and callback(self, stats) is False:
                break
        return self

    def iteration(self, next_rollout: Optional[Callable[[], Rollout]] = None,
                  compute_advantages: Optional[Callable[[Rollout], Tuple[np.ndarray, np.ndarray]]]
                  = None) -> Iteration:
        """One iteration of :meth:`learn` or of the actor-learner's learner:
        ``progress_remaining`` (per ``config.schedule_progress``), ``rollout = next_rollout()``
        (default :meth:`collect_rollout`; another source must call :meth:`record_rollout`),
        ``compute_advantages(rollout)`` (default GAE), :meth:`train_on`, ``n_updates += 1``.

        Returns :class:`Iteration`; its ``stats`` add ``timesteps``, ``updates``, ``episodes``,
        ``progress_remaining``, ``fps``, ``time_rollout`` and ``time_update`` (seconds).
        """
        with kernel_threads(self.threads):
            t0 = time.perf_counter()
            steps_before = self.num_timesteps
            rollout = (next_rollout or self.collect_rollout)()
            steps = (steps_before if self.config.schedule_progress == "before_rollout"
                     else self.num_timesteps)
            self.progress_remaining = progress_remaining(steps, self.total_timesteps)
            t1 = time.perf_counter()
            advantages, returns = (compute_advantages or self.compute_advantages)(rollout)
            stats = self.train_on(rollout, advantages, returns)
            t2 = time.perf_counter()
        self.n_updates += 1
        stats.update({
            "timesteps": float(self.num_timesteps), "updates": float(self.n_updates),
            "episodes": float(self.n_episodes), "progress_remaining": self.progress_remaining,
            "fps": rollout.n_steps * rollout.n_envs / max(t2 - t0, 1e-12),
            "time_rollout": t1 - t0, "time_update": t2 - t1,
        })
        return Iteration(rollout, advantages, returns, stats)

    # -- acting -------------------------------------------------------------------------------
    def predict(self, obs, deterministic: bool = False) -> np.ndarray:
        """Actions for raw observations (``[obs_shape]`` or ``[B, *obs_shape]``), as the env
        receives them (Gaussian: clipped). Observation normalization, when on, uses the frozen
        training statistics. Sampling uses ``predict_rng`` (never a training stream)."""
        with kernel_threads(self.threads):
            batch, single = self._obs_batch(obs)
            actions, _ = self.policy.predict(self.params, batch, None, None, self.predict_rng,
                                             deterministic)
            return actions[0] if single else actions

    def _obs_batch(self, obs) -> Tuple[np.ndarray, bool]:
        """``(batch, single)``: ``obs`` (one observation of the env's shape, or a batch ``[B,
        *obs_shape]``) as the normalized float64 ``[B, obs_dim]`` the policy reads. Raises
        ``ValueError`` naming ``obs`` for anything else or non-finite values."""
        arr = as_float_array(obs, "obs")
        shape = tuple(self.policy.obs_shape)
        single = arr.shape == shape
        if not single and not (arr.ndim == len(shape) + 1 and arr.shape[1:] == shape
                               and arr.shape[0] >= 1):
            raise ValueError(f"obs must have shape {shape} (one observation) or (B, *{shape}) "
                             f"(a batch), got {arr.shape}")
        batch = arr.astype(np.float64, copy=False).reshape(1 if single else arr.shape[0], -1)
        return self.collector.normalize_obs(batch), single

    def evaluate(self, n_episodes: int = 10, *, deterministic: bool = True, seed: int = 0,
                 env_id: Optional[str] = None) -> List[float]:
        """Returns of ``n_episodes`` episodes on a fresh single env (``gym.make(env_id)``, reset
        with ``seed + i`` for episode i), acting with :meth:`predict` (normalization frozen; a
        recurrent policy starts each episode from a reset memory). Raises ``ValueError`` for
        ``n_episodes`` not an integer >= 1 or ``seed`` not an integer >= 0."""
        import gymnasium as gym
        n_episodes = check_count(n_episodes, "n_episodes", 1)
        seed = check_count(seed, "seed", 0)
        env_id = env_id or self.env_id
        if env_id is None:
            raise ValueError("env_id is required: the trainer was built from a vector env "
                             "without an id")
        env = gym.make(env_id, **self.env_kwargs)
        returns = []
        try:
            for i in range(n_episodes):
                obs, _ = env.reset(seed=seed + i)
                act = self._episode_actor(deterministic)
                total, done = 0.0, False
                while not done:
                    obs, reward, terminated, truncated, _ = env.step(act(obs))
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
        finally:
            env.close()
        return returns

    def _episode_actor(self, deterministic: bool) -> Callable[[np.ndarray], np.ndarray]:
        """``act(obs) -> action`` for one evaluation episode (the recurrent trainer carries
        its memory through the episode)."""
        return lambda obs: self.predict(obs, deterministic)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_arrays(self) -> Dict[str, np.ndarray]:
        """Everything needed to continue this run exactly (call it at a rollout boundary):
        ``params/<key>``, ``adam/<key>``, ``collector/<key>``, ``recent_returns`` and
        ``state_json`` (uint8 JSON: counters, generator states, sub-env states, config)."""
        coll_arrays, coll_meta = self.collector.state_arrays()
        arrays = {"params/" + k: np.array(v, copy=True) for k, v in self.params.items()}
        arrays.update({"adam/" + k: v for k, v in adam_state_to_arrays(self.adam_state).items()})
        arrays.update({"collector/" + k: v for k, v in coll_arrays.items()})
        arrays["recent_returns"] = np.asarray(list(self.recent_returns), dtype=np.float64)
        state = {
            "trainer": type(self).__name__,
            "num_timesteps": self.num_timesteps, "n_updates": self.n_updates,
            "n_episodes": self.n_episodes, "total_timesteps": self.total_timesteps,
            "progress_remaining": self.progress_remaining,
            "action_rng": generator_state(self.action_rng),
            "minibatch_rng": generator_state(self.minibatch_rng),
            "predict_rng": generator_state(self.predict_rng),
            "collector": coll_meta, "config": self.config.to_dict(), "seed": self.seed,
            "env_id": self.env_id, "env_seeds": self.env_seeds,
        }
        arrays["state_json"] = json_to_array(state)
        return arrays

    def load_state_arrays(self, arrays: Dict[str, np.ndarray], *, env_state: bool = True) -> None:
        """Restore a :meth:`state_arrays` snapshot (same env id, config and number of envs),
        vetted against this trainer's own state (``vet_state_arrays``, ``vet_state_record`` of
        :mod:`ppo_ref.io.checkpoint`); ``env_state=False``: not the sub-envs' own state (as
        :meth:`load`). ``ValueError`` on any mismatch, which may leave this trainer
        half-restored (:meth:`load` then discards it)."""
        if "state_json" not in arrays:
            raise ValueError("arrays has no 'state_json' entry: not a PPOTrainer state")
        arrays = _current_layout({k: np.asarray(v) for k, v in arrays.items()})
        vet_state_arrays(self.state_arrays(), arrays)
        state = array_to_json(arrays["state_json"], name="state_json")
        counters = vet_state_record(state, n_steps=self.config.n_steps, n_envs=self.config.n_envs,
                                    n_recent=len(arrays["recent_returns"]),
                                    episode_lengths=arrays["collector/episode_length"])

        def part(prefix):
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        self.collector.load_state(part("collector/"), state["collector"], env_state=env_state)
        params = part("params/")
        self.params = {k: np.array(params[k]) for k in self.params}  # this policy's key order
        self.adam_state = adam_state_from_arrays(part("adam/"))
        for name in ("action_rng", "minibatch_rng", "predict_rng"):
            set_generator_state(getattr(self, name), state[name])
        for key, value in counters.items():
            setattr(self, key, value)
        self.progress_remaining = float(state["progress_remaining"])
        self.recent_returns = deque(arrays["recent_returns"].tolist(), maxlen=RECENT_EPISODES)
        self.last_episodes = []
        self.env_seeds = list(state.get("env_seeds", self.env_seeds))

    def checkpoint_metadata(self, arrays: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, Any]:
        """The JSON metadata stored with a :meth:`state_arrays` snapshot (read by :meth:`load`):
        trainer class, policy kind, env id, seed, vectorization, config, the snapshot's
        counters, and ``exact_resume_limits`` (env attributes that could not be captured;
        empty means the resume is exact)."""
        if arrays is None:
            arrays = self.state_arrays()
        state = array_to_json(arrays["state_json"], name="state_json")
        return {
            "trainer": type(self).__name__, "policy": self.policy_kind, "env_id": self.env_id,
            "seed": self.seed, "vectorization": self.vectorization, "env_kwargs": self.env_kwargs,
            "config": self.config.to_dict(), "num_timesteps": state["num_timesteps"],
            "n_updates": state["n_updates"], "n_episodes": state["n_episodes"],
            "total_timesteps": state["total_timesteps"],
            "exact_resume_limits": state["collector"]["unsupported"],
        }

    def save(self, path, arrays: Optional[Dict[str, np.ndarray]] = None,
             metadata: Optional[Dict[str, Any]] = None) -> str:
        """Write a checkpoint atomically (:func:`ppo_ref.io.checkpoint.save_checkpoint`) of
        ``arrays`` and ``metadata`` (default: the current :meth:`state_arrays` and
        :meth:`checkpoint_metadata`; pass an earlier snapshot to save that state)."""
        if arrays is None:
            arrays = self.state_arrays()
        if metadata is None:
            metadata = self.checkpoint_metadata(arrays)
        return save_checkpoint(path, arrays, metadata)

    @classmethod
    def load(cls, path, env=None, *, allow_import: bool = False, env_state: bool = True,
             **kwargs) -> "PPOTrainer":
        """A trainer restored from a checkpoint written by :meth:`save`, every array compared
        with the new trainer's own state (:meth:`load_state_arrays`). ``env``: a vector env to
        use instead of re-making ``env_id`` (required for a user-built one); ``allow_import``:
        consent to import the module of an ``env_id`` ``"module:EnvId"``; ``env_state=False``
        leaves the sub-envs as made instead of restoring their saved state (to evaluate or
        predict: the next rollout would not continue the saved episodes). Raises
        :class:`~ppo_ref.io.checkpoint.CheckpointError` (one line naming ``path``) for a
        missing, corrupt, truncated or crafted file, a state that does not fit the trainer its
        settings build, or an env module import without consent."""
        arrays, meta = load_checkpoint(path)
        where = f"checkpoint {str(path)!r}"
        vet_checkpoint_metadata(meta, where)  # seed, env_id and env_kwargs of the right types
        if meta["trainer"] != cls.__name__:
            raise CheckpointError(f"{where} holds a {meta['trainer']!r}, not a {cls.__name__}")
        try:
            config = PPOConfig.from_dict(meta["config"])
        except _RESTORE_ERRORS as exc:
            raise CheckpointError(f"{where} has bad settings: {type(exc).__name__}: "
                                  f"{one_line(exc, 300)}") from None
        if env is None:
            env = meta.get("env_id")
            if env is None:
                raise CheckpointError(f"{where} has no env id: pass env=")
            check_env_import(env, allow_import, where)
        trainer = cls(env, config, seed=meta["seed"],
                      vectorization=kwargs.pop("vectorization", meta.get("vectorization", "sync")),
                      env_kwargs=meta.get("env_kwargs") or None, **kwargs)
        try:
            trainer.load_state_arrays(arrays, env_state=env_state)
            for key in ("num_timesteps", "n_updates", "n_episodes", "total_timesteps"):
                if meta[key] != getattr(trainer, key):
                    raise ValueError(f"metadata {key}={meta[key]!r} differs from the "
                                     f"state's {getattr(trainer, key)!r}")
        except BaseException as exc:
            trainer.close()
            if isinstance(exc, _RESTORE_ERRORS):
                raise CheckpointError(f"{where} does not hold a valid {cls.__name__} state: "
                                      f"{type(exc).__name__}: {one_line(exc, 300)}") from None
            raise
        return trainer

    def close(self) -> None:
        """Close the vector env."""
        self.collector.close()


def _current_layout(arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``arrays`` in the current snapshot layout. The layout of ppo_ref 0.1.0 before the
    collector carried the LSTM states (same ``FORMAT_VERSION``) named them ``lstm/h``,
    ``lstm/c`` and stored the reward normalizer's ``ret_accumulated``, ``ret_prev_dones`` as
    float32 (gymnasium's dtype): renamed, and widened to float64, which is exact."""
    out = dict(arrays)
    for name, earlier in (("collector/state.h", "lstm/h"), ("collector/state.c", "lstm/c")):
        if earlier in out and name not in out:
            out[name] = out.pop(earlier)
    for name in ("collector/ret_accumulated", "collector/ret_prev_dones"):
        if name in out and out[name].dtype == np.float32:
            out[name] = out[name].astype(np.float64)
    return out
