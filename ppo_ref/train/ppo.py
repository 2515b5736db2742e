"""The feedforward PPO trainer: rollout -> gae -> minibatch epochs -> clip -> Adam.

``PPOTrainer`` composes the pieces and re-derives nothing::

    rollout   = collector.collect(params, action_rng)            # ppo_ref.train.rollout
    adv, ret  = gae(rollout..., truncation=..., ...)             # ppo_ref.kernels
    params    = run_epochs(params, adam_state, minibatches, ...) # ppo_ref.fast.update (losses, optim)

One update per rollout. Learning rate and clip range follow ``config.lr_schedule`` /
``config.clip_range_schedule`` with SB3's ``progress_remaining = 1 - steps / total_timesteps``
measured after the rollout (``schedule_progress="after_rollout"``, SB3) or before it
(``"before_rollout"``, CleanRL).

Randomness: one ``np.random.SeedSequence(seed)`` spawns independent streams for parameter
init, env seeds (one per sub-env, used at the first reset), action sampling and minibatch
permutations. The same seed gives bit-identical runs.

Checkpoints (:meth:`PPOTrainer.save` / :meth:`PPOTrainer.load`) hold the parameters, Adam
state, the three generators, the normalization statistics, counters, the config and the
environment state at a rollout boundary (current observations, ``episode_starts``, per-env
episode accumulators and every sub-env's own state: see :func:`ppo_ref.train.rollout.single_env_state`),
so stopping and resuming continues the run exactly (bit-identical parameters) for envs whose
state is plain attributes (all classic-control envs).
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numba
import numpy as np

from ppo_ref._checks import as_float_array, check_count
from ppo_ref._numba import PARALLEL_LOOPS
from ppo_ref.io.checkpoint import (RECENT_EPISODES, CheckpointError, array_to_json,
                                   check_env_import, generator_state, json_to_array,
                                   load_checkpoint, save_checkpoint, set_generator_state,
                                   vet_checkpoint_metadata, vet_state_arrays, vet_state_record)
from ppo_ref.config import PPOConfig
from ppo_ref.fast.update import feedforward_minibatches, run_epochs
from ppo_ref.kernels import gae
from ppo_ref.losses import explained_variance
from ppo_ref.optim import adam_init, adam_state_from_arrays, adam_state_to_arrays
from ppo_ref.train.policies import make_mlp_policy
from ppo_ref.train.rollout import (EnvStepError, Rollout, RolloutCollector, check_vector_env,
                             make_vector_env)
from ppo_ref.spec import update as spec_update
from ppo_ref.spec.update import batch_advantages

__all__ = ["PPOTrainer", "Iteration", "EnvStepError", "progress_remaining",
           "limit_blas_threads", "check_kernel_threads", "kernel_threads", "RECENT_EPISODES"]


Callback = Callable[["PPOTrainer", Dict[str, float]], Optional[bool]]


class Iteration(NamedTuple):
    """One PPO iteration (:meth:`PPOTrainer.iteration`): the rollout trained on, its
    ``advantages`` and ``returns`` (float64 ``[T, N]``) and the update's ``stats``."""

    rollout: Rollout
    advantages: np.ndarray
    returns: np.ndarray
    stats: Dict[str, float]


def limit_blas_threads(n_threads: int = 1) -> bool:
    """Limit the BLAS library NumPy uses (OpenBLAS, MKL, BLIS) to ``n_threads`` threads, for
    the whole process, from now on (``threadpoolctl.threadpool_limits(n_threads,
    user_api="blas")``; the same as ``OPENBLAS_NUM_THREADS=1`` before start-up, but effective
    after NumPy is imported).

    PPO's matrices are tiny (``[256, 64] @ [64, 64]``): a multi-threaded BLAS spends more on
    waking threads than on arithmetic, and on a shared 2-core machine it is ~10x slower than one
    thread. :class:`PPOTrainer` calls this with its ``blas_threads`` argument (default 1) when it
    is built, so the limit holds for collection and updates alike, including when a caller
    drives ``collect_rollout``/``train_on`` itself (the actor-learner). It is not undone when
    the trainer is closed; use ``threadpoolctl.threadpool_limits`` as a context manager around
    a run (and ``blas_threads=None``) to scope it instead. Returns True if a BLAS thread pool
    was found and limited.
    """
    from threadpoolctl import threadpool_limits
    n = int(n_threads)
    if n < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    limiter = threadpool_limits(limits=n, user_api="blas")
    return limiter.get_original_num_threads().get("blas") is not None


def check_kernel_threads(value, name: str = "threads", none_ok: bool = True) -> Optional[int]:
    """``value`` as the number of numba threads for the compiled kernels' parallel loops
    (``ppo_ref._numba``, "Threads"): None when ``none_ok`` (leave numba's setting as it is), or
    an ``int`` (or NumPy integer; not a bool) in ``[1, numba.config.NUMBA_NUM_THREADS]``
    (numba's thread pool, by default one per CPU). Raises ValueError naming ``name`` otherwise."""
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
    """Run the block with ``numba.set_num_threads(n_threads)`` for the calling thread (numba's
    setting is per thread), then put the previous value back (also when the block raises);
    None, or plain loops (``ppo_ref._numba.PARALLEL_LOOPS`` False: numba's threading layer is
    not used, and may not load), change nothing. Raises ValueError naming ``n_threads`` as
    :func:`check_kernel_threads`."""
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


# the largest total_timesteps learn accepts: every step count up to it is exact in float64 (the
# schedules divide by it), and it is far beyond any run (2**53 steps at 10**6 steps/s: 285 years)
MAX_TOTAL_TIMESTEPS = 2 ** 53


def _check_total_timesteps(value) -> int:
    """``value`` as an int in ``[0, MAX_TOTAL_TIMESTEPS]``, or ``ValueError`` naming
    ``total_timesteps``: ``int`` and NumPy integers only (a bool, a float such as ``1e5`` or
    ``nan``, or a string is refused rather than converted)."""
    total = check_count(value, "total_timesteps", 0)
    if total > MAX_TOTAL_TIMESTEPS:
        raise ValueError(f"total_timesteps must be in [0, 2**53], got {total}")
    return total


# what a crafted state record can make the restore raise besides ValueError
_RESTORE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError,
                   RecursionError, MemoryError, NotImplementedError)


def _one_line(text) -> str:
    return " ".join(str(text).split())


def progress_remaining(num_timesteps: int, total_timesteps: int) -> float:
    """SB3's ``1 - num_timesteps / total_timesteps``, clipped to [0, 1]."""
    if total_timesteps <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - num_timesteps / total_timesteps)))


class PPOTrainer:
    """Feedforward PPO on a gymnasium vector environment.

    Args:
        env: a gymnasium id (``"CartPole-v1"``; ``config.n_envs`` copies are made) or a
            gymnasium ``VectorEnv`` in SAME_STEP autoreset mode with ``config.n_envs`` envs.
        config: :class:`~ppo_ref.config.PPOConfig` (default ``PPOConfig()``).
        seed: the run's seed (int >= 0).
        vectorization: ``"sync"`` (default) or ``"async"`` (AsyncVectorEnv), when ``env`` is an id.
        env_kwargs: extra keyword arguments of ``gym.make``.
        blas_threads: if not None, :func:`limit_blas_threads` is called with it (default 1:
            tiny matrices are fastest single-threaded; this affects the whole process).
        threads: numba threads for the compiled kernels' parallel loops during each
            :meth:`iteration` (the two LSTMs or towers of a pass, the Adam step's entries;
            ``ppo_ref._numba``, "Threads"), set for the calling thread and restored after it
            (:func:`kernel_threads`); the attribute ``threads`` may be reassigned. The results
            are the same bits for any value. Default 1: a second thread makes a run faster only
            on cores nothing else uses (a loop waits for its slowest thread; with another
            process busy on the second core, two threads made CartPole-v1 several times
            slower). None leaves numba's setting (``NUMBA_NUM_THREADS``, one per CPU).
            :meth:`evaluate`, :meth:`predict` and :meth:`update` use it too. Not saved with a
            checkpoint: give it again to :meth:`load` (``threads=N``).

    Attributes: ``params`` (dict of float64 arrays; from an MLP policy a
    :class:`~ppo_ref.fast.flat.FlatArrays`, the one-buffer layout its fast paths read, which
    :meth:`load_state_arrays` restores too), ``adam_state``, ``num_timesteps``
    (single-env steps collected), ``n_updates`` (PPO updates done), ``n_episodes``
    (episodes finished), ``total_timesteps`` (the schedule horizon of :meth:`learn`),
    ``recent_returns`` (returns of the last 100 episodes), ``last_episodes`` (the episodes that
    finished in the last rollout: tuples ``(env_index, return, length)``).

    Raises:
        ValueError: bad config/seed, unsupported spaces, a vector env not in SAME_STEP mode or
            with a number of envs different from ``config.n_envs``.
    """

    policy_kind = "mlp"

    def __init__(self, env, config: Optional[PPOConfig] = None, *, seed: int = 0,
                 vectorization: str = "sync", env_kwargs: Optional[dict] = None,
                 blas_threads: Optional[int] = 1, threads: Optional[int] = 1):
        self.threads = threads
        if blas_threads is not None:
            limit_blas_threads(blas_threads)
        self.config = config if config is not None else PPOConfig()
        if not isinstance(self.config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(self.config).__name__}")
        self.seed = check_count(seed, "seed", 0)
        self.vectorization = vectorization
        self.env_kwargs = dict(env_kwargs or {})
        if isinstance(env, str):
            self.env_id: Optional[str] = env
            vec_env = make_vector_env(env, self.config.n_envs, vectorization=vectorization,
                                      env_kwargs=self.env_kwargs)
        else:
            check_vector_env(env)
            if env.num_envs != self.config.n_envs:
                raise ValueError(f"env has {env.num_envs} sub-envs but config.n_envs is "
                                 f"{self.config.n_envs}")
            spec = getattr(env, "spec", None)
            self.env_id = getattr(spec, "id", None)
            vec_env = env
        self.env = vec_env
        init_seq, env_seq, action_seq, minibatch_seq, predict_seq = \
            np.random.SeedSequence(self.seed).spawn(5)
        self.policy = self._make_policy(vec_env.single_observation_space,
                                        vec_env.single_action_space)
        self.params = self.policy.init_params(np.random.default_rng(init_seq))
        self.adam_state = adam_init(self.params)
        self.action_rng = np.random.default_rng(action_seq)
        self.minibatch_rng = np.random.default_rng(minibatch_seq)
        self.predict_rng = np.random.default_rng(predict_seq)
        self.env_seeds = [int(s) for s in env_seq.generate_state(self.config.n_envs, dtype=np.uint32)]
        self.collector = RolloutCollector(
            vec_env, self._acting_policy(), self.config.n_steps,
            normalize_observations=self.config.normalize_observations,
            normalize_rewards=self.config.normalize_rewards, gamma=self.config.gamma,
            clip_observations=self.config.clip_observations,
            clip_rewards=self.config.clip_rewards)
        self.collector.reset(self.env_seeds)
        self.num_timesteps = 0
        self.n_updates = 0
        self.n_episodes = 0
        self.total_timesteps = 0
        self.progress_remaining = 1.0
        self.recent_returns: deque = deque(maxlen=RECENT_EPISODES)
        self.last_episodes: List[Tuple[int, float, int]] = []

    # -- what a subclass replaces --------------------------------------------------------------
    def _make_policy(self, observation_space, action_space):
        """The policy this trainer trains (:func:`~ppo_ref.train.policies.make_mlp_policy`: the tier of
        ``config.backend``; the recurrent trainer returns its LSTM policy). Called once by the
        constructor, before the parameters are drawn (by ``policy.init_params``)."""
        return make_mlp_policy(observation_space, action_space, self.config)

    def _acting_policy(self):
        """What the rollout collector acts with (the interface of
        :class:`~ppo_ref.train.rollout.RolloutCollector`): the policy itself here; the recurrent
        trainer returns an actor carrying the LSTM state. Called once by the constructor."""
        return self.policy

    # -- the three steps of an update ---------------------------------------------------------
    def collect_rollout(self) -> Rollout:
        """Collect ``config.n_steps`` steps from every env with the current parameters.

        Advances ``num_timesteps`` by ``n_steps * n_envs`` and records finished episodes.
        Raises :class:`~ppo_ref.train.rollout.EnvStepError` on a NaN or wrongly shaped observation.
        """
        return self.record_rollout(self.collector.collect(self.params, self.action_rng))

    def record_rollout(self, rollout: Rollout) -> Rollout:
        """Count a rollout this trainer consumes (collected by it, or assembled by the
        actor-learner's learner): ``num_timesteps += n_steps * n_envs``; its finished episodes
        (``rollout.episode_returns/lengths/envs``) become ``last_episodes`` and are added to
        ``n_episodes`` and ``recent_returns``. Returns ``rollout``."""
        self.num_timesteps += rollout.n_steps * rollout.n_envs
        self.last_episodes = list(zip(rollout.episode_envs, rollout.episode_returns,
                                      rollout.episode_lengths))
        self.n_episodes += len(rollout.episode_returns)
        self.recent_returns.extend(rollout.episode_returns)
        return rollout

    def compute_advantages(self, rollout: Rollout) -> Tuple[np.ndarray, np.ndarray]:
        """``gae`` on the rollout with ``config.gamma``, ``gae_lambda``, ``truncation`` and
        ``bootstrap_terminal_last_row``. Returns ``(advantages, returns)``, float64 ``[T, N]``."""
        c = self.config
        return gae(rollout.rewards, rollout.values, rollout.terminated, rollout.truncated,
                   rollout.last_values, rollout.final_values, gamma=c.gamma,
                   gae_lambda=c.gae_lambda, truncation=c.truncation,
                   bootstrap_terminal_last_row=c.bootstrap_terminal_last_row,
                   backend=c.backend)

    def compute_vtrace_advantages(self, rollout: Rollout, *, rho_bar: float = 1.0,
                                  c_bar: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
        """V-trace in place of GAE (IMPALA: the actor-learner's off-policy correction):
        :func:`ppo_ref.kernels.vtrace` of the rollout's behaviour ``log_probs`` against the
        target log-probs and values of the current ``params`` (one :meth:`evaluate
        <ppo_ref.train.policies.MLPPolicy.evaluate>` over the ``T*N`` rows, time-major), with the
        rollout's ``last_values`` / ``final_values`` (the same bootstrap values GAE reads) and
        ``config.gamma``, ``truncation``, ``bootstrap_terminal_last_row`` and ``backend``.
        Returns ``(advantages, returns) = (pg_advantages, vs)``, float64 ``[T, N]``. On-policy
        (target = behaviour log-probs and values, bars >= 1) they equal
        :meth:`compute_advantages` with ``gae_lambda = 1``."""
        from ppo_ref.kernels import vtrace
        c = self.config
        T, N = rollout.rewards.shape
        target = self.policy.evaluate(self.params, rollout.observations.reshape(T * N, -1),
                                      rollout.actions.reshape((T * N,) + rollout.actions.shape[2:]))
        vt = vtrace(rollout.log_probs, target.log_probs.reshape(T, N), rollout.rewards,
                    target.values.reshape(T, N), rollout.terminated, rollout.truncated,
                    rollout.last_values, rollout.final_values, gamma=c.gamma, rho_bar=rho_bar,
                    c_bar=c_bar, truncation=c.truncation,
                    bootstrap_terminal_last_row=c.bootstrap_terminal_last_row, backend=c.backend)
        return vt.pg_advantages, vt.vs

    def current_learning_rate(self) -> float:
        """Learning rate at the current ``progress_remaining``."""
        return self.config.learning_rate_at(self.progress_remaining)

    def current_clip_range(self) -> float:
        """Clip range at the current ``progress_remaining``."""
        return self.config.clip_range_at(self.progress_remaining)

    def train_on(self, rollout: Rollout, advantages: np.ndarray, returns: np.ndarray) -> Dict[str, float]:
        """The epochs of one PPO update on a rollout (``run_epochs`` of the ``config.backend``
        tier: :func:`ppo_ref.spec.update.run_epochs` or the compiled :func:`ppo_ref.fast.update.run_epochs`).

        The ``T*N`` rows are flattened time-major (row ``t * N + n``) and each epoch visits them
        in a fresh ``minibatch_rng`` permutation cut into ``config.batch_size`` chunks
        (:func:`ppo_ref.spec.update.feedforward_minibatches`, or its bit-equal
        :func:`ppo_ref.fast.update.feedforward_minibatches` on the fast backend, whose
        minibatches are rows of the observations and actions checked once per update:
        ``MLPPolicy._update_passes``). Updates
        ``params`` and ``adam_state`` in place (new dicts) and returns the stats of
        :func:`ppo_ref.fast.update.run_epochs` plus ``explained_variance`` (rollout values vs returns,
        population variances).
        """
        c = self.config
        T, N = rollout.rewards.shape
        B = T * N
        obs = rollout.observations.reshape(B, -1)
        actions = rollout.actions.reshape((B,) + rollout.actions.shape[2:])
        old_log_probs = rollout.log_probs.reshape(B)
        old_values = rollout.values.reshape(B)
        adv = batch_advantages(np.asarray(advantages, dtype=np.float64).reshape(B), c)
        ret = np.asarray(returns, dtype=np.float64).reshape(B)
        rng = self.minibatch_rng
        bs = c.batch_size
        policy = self.policy

        def evaluate(params, data):
            ev = policy.evaluate(params, data[0], data[1])
            return ev.log_probs, ev.entropy, ev.values, ev.cache

        if c.backend == "spec":  # the readable tier: one permutation per epoch, plain dicts
            self.params, self.adam_state, stats = spec_update.run_epochs(
                self.params, self.adam_state, config=c, lr=self.current_learning_rate(),
                clip_range=self.current_clip_range(),
                minibatches=spec_update.feedforward_minibatches(
                    rng, bs, old_log_probs, adv, ret, old_values, obs, actions),
                evaluate=evaluate, backward=policy.backward)
            stats["explained_variance"] = explained_variance(old_values, ret)
            return stats
        # The fast tier: the same minibatches, gathered for all epochs at once when no KL
        # stop can end the update early (ppo_ref.fast.update.feedforward_minibatches), from
        # the rows checked once (MLPPolicy._update_passes: the same numbers evaluate would
        # take, and its ValueError, naming the argument, for rows it refuses: raised before
        # any step, whichever minibatches a KL stop would have run).
        obs, actions, evaluate, backward = policy._update_passes(obs, actions)
        minibatches = feedforward_minibatches(rng, bs, old_log_probs, adv, ret, old_values, obs,
                                              actions, n_epochs=c.n_epochs,
                                              target_kl=c.target_kl)
        self.params, self.adam_state, stats = run_epochs(
            self.params, self.adam_state, config=c, lr=self.current_learning_rate(),
            clip_range=self.current_clip_range(), minibatches=minibatches, evaluate=evaluate,
            backward=backward)
        stats["explained_variance"] = explained_variance(old_values, ret)
        return stats

    def update(self, rollout: Rollout) -> Dict[str, float]:
        """``compute_advantages`` then ``train_on``: one full PPO update; returns its stats."""
        with kernel_threads(self.threads):
            advantages, returns = self.compute_advantages(rollout)
            return self.train_on(rollout, advantages, returns)

    @property
    def threads(self) -> Optional[int]:
        """numba threads of each :meth:`iteration` (the ``threads`` argument; ValueError as
        :func:`check_kernel_threads` on assignment)."""
        return self._threads

    @threads.setter
    def threads(self, value) -> None:
        self._threads = check_kernel_threads(value)

    # -- the loop -----------------------------------------------------------------------------
    def learn(self, total_timesteps: int, callback: Optional[Callback] = None) -> "PPOTrainer":
        """Train until ``num_timesteps >= total_timesteps`` (an absolute target, also the horizon
        of the linear schedules, so a resumed run anneals exactly as an uninterrupted one).

        After every update ``callback(trainer, stats)`` is called at a rollout boundary (the
        state a checkpoint captures); returning ``False`` stops training there. ``stats`` holds
        the update's losses and diagnostics (see :func:`ppo_ref.fast.update.run_epochs`) plus
        ``timesteps``, ``updates``, ``episodes``, ``explained_variance``, ``fps`` (env steps
        per second of this iteration, rollout + update) and ``time_rollout``/``time_update``
        (seconds).

        Raises:
            ValueError: ``total_timesteps`` not an integer (``int`` or NumPy integer; not a
                bool, float or string) in ``[0, 2**53]``.
            EnvStepError: from the collection (the trainer keeps its last boundary state only if
                the caller saved it, e.g. from the callback).
        """
        total = _check_total_timesteps(total_timesteps)
        self.total_timesteps = total
        while self.num_timesteps < total:
            stats = self.iteration().stats
            if callback is not None and callback(self, stats) is False:
                break
        return self

    def iteration(self, next_rollout: Optional[Callable[[], Rollout]] = None,
                  compute_advantages: Optional[Callable[[Rollout], Tuple[np.ndarray, np.ndarray]]]
                  = None) -> "Iteration":
        """One iteration of :meth:`learn` (and of the actor-learner's learner, which passes its
        own rollout source and, with V-trace, :meth:`compute_vtrace_advantages`):

        1. with ``schedule_progress="before_rollout"``: ``progress_remaining`` from
           ``num_timesteps`` and ``total_timesteps``;
        2. ``rollout = next_rollout()`` (default :meth:`collect_rollout`); a source must count
           the rollout with :meth:`record_rollout`, as :meth:`collect_rollout` does;
        3. otherwise (``"after_rollout"``): ``progress_remaining`` now;
        4. ``advantages, returns = compute_advantages(rollout)`` (default
           :meth:`compute_advantages`: GAE);
        5. ``stats = train_on(rollout, advantages, returns)``; ``n_updates += 1``.

        Returns :class:`Iteration` ``(rollout, advantages, returns, stats)``; ``stats`` holds
        :meth:`train_on`'s statistics plus ``timesteps``, ``updates``, ``episodes``,
        ``progress_remaining``, ``fps``, ``time_rollout`` and ``time_update`` (seconds).
        """
        before = self.config.schedule_progress == "before_rollout"
        with kernel_threads(self.threads):
            t0 = time.perf_counter()
            if before:
                self.progress_remaining = progress_remaining(self.num_timesteps,
                                                             self.total_timesteps)
            rollout = (next_rollout or self.collect_rollout)()
            if not before:
                self.progress_remaining = progress_remaining(self.num_timesteps,
                                                             self.total_timesteps)
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
        training statistics. Sampling uses the trainer's ``predict_rng`` (not the training
        streams, so predicting never changes a training run)."""
        with kernel_threads(self.threads):
            batch, single = self._obs_batch(obs)
            actions = self.policy.predict(self.params, batch, self.predict_rng, deterministic)
            return actions[0] if single else actions

    def _obs_batch(self, obs) -> Tuple[np.ndarray, bool]:
        """``(batch, single)``: ``batch`` the normalized float64 ``[B, obs_dim]`` for :meth:`predict`: ``obs`` is one
        observation of the env's shape or a batch ``[B, *obs_shape]``. Raises ``ValueError``
        naming ``obs`` for ``None``, strings, non-finite values or another shape."""
        arr = as_float_array(obs, "obs")
        shape = tuple(self.policy.obs_shape)
        single = arr.shape == shape
        if not single and not (arr.ndim == len(shape) + 1 and arr.shape[1:] == shape):
            raise ValueError(f"obs must have shape {shape} (one observation) or (B, *{shape}) "
                             f"(a batch), got {arr.shape}")
        batch = arr.astype(np.float64, copy=False).reshape(1 if single else arr.shape[0], -1)
        return self.collector.normalize_obs(batch), single

    def evaluate(self, n_episodes: int = 10, *, deterministic: bool = True, seed: int = 0,
                 env_id: Optional[str] = None) -> List[float]:
        """Returns of ``n_episodes`` episodes on a fresh single env (``gym.make(env_id)``, reset
        with ``seed + i`` for episode i), acting with :meth:`predict` (normalization frozen; a
        recurrent policy resets its memory at each episode start). Raises ``ValueError`` if
        ``n_episodes`` is not an integer >= 1 or ``seed`` not an integer >= 0 (a float, bool or
        string)."""
        with kernel_threads(self.threads):
            import gymnasium as gym
            n_episodes = check_count(n_episodes, "n_episodes", 1)
            seed = check_count(seed, "seed", 0)
            env_id = env_id or self.env_id
            if env_id is None:
                raise ValueError("env_id is required: the trainer was built from a vector env without an id")
            env = gym.make(env_id, **self.env_kwargs)
            returns = []
            try:
                for i in range(int(n_episodes)):
                    obs, _ = env.reset(seed=int(seed) + i)
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
        """``act(obs) -> action`` for one evaluation episode (a stateless policy: :meth:`predict`;
        the recurrent trainer returns a closure that carries its memory through the episode)."""
        return lambda obs: self.predict(obs, deterministic)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_arrays(self) -> Dict[str, np.ndarray]:
        """Everything needed to continue this run exactly, as ``{name: ndarray}``.

        ``params/<key>``, ``adam/<key>`` (:func:`ppo_ref.optim.adam_state_to_arrays`),
        ``collector/<key>`` (observations, episode_starts, episode accumulators, normalization
        statistics), ``recent_returns``, and ``state_json`` (uint8 JSON: counters, generator
        states, sub-env states, config). Call it at a rollout boundary (e.g. from the
        :meth:`learn` callback).
        """
        arrays: Dict[str, np.ndarray] = {}
        for k, v in self.params.items():
            arrays["params/" + k] = np.array(v, copy=True)
        for k, v in adam_state_to_arrays(self.adam_state).items():
            arrays["adam/" + k] = v
        coll_arrays, coll_meta = self.collector.state()
        for k, v in coll_arrays.items():
            arrays["collector/" + k] = v
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

    def load_state_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        """Restore a :meth:`state_arrays` snapshot into this trainer (same env id, config and
        number of envs).

        The snapshot is vetted first against this trainer's own :meth:`state_arrays`
        (:func:`ppo_ref.io.checkpoint.vet_state_arrays`: names, dtypes, shapes, finite values,
        non-negative second moments) and its JSON record
        (:func:`ppo_ref.io.checkpoint.vet_state_record`: counters that agree with each other and
        the settings, ``progress_remaining`` in [0, 1]; then generator states, and sub-env
        states that set only attributes the envs have, their limits unchanged). Raises ``ValueError`` on any mismatch;
        a failure may leave this trainer half-restored (:meth:`load` then discards it)."""
        if "state_json" not in arrays:
            raise ValueError("arrays has no 'state_json' entry: not a PPOTrainer state")
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        vet_state_arrays(self.state_arrays(), arrays)
        state = array_to_json(arrays["state_json"], name="state_json")
        counters = vet_state_record(state, n_steps=self.config.n_steps, n_envs=self.config.n_envs,
                                    n_recent=len(arrays["recent_returns"]),
                                    episode_lengths=arrays["collector/episode_length"])
        params = {k[len("params/"):]: np.array(v) for k, v in arrays.items() if k.startswith("params/")}
        adam_arrays = {k[len("adam/"):]: v for k, v in arrays.items() if k.startswith("adam/")}
        coll_arrays = {k[len("collector/"):]: v for k, v in arrays.items() if k.startswith("collector/")}
        self.collector.load_state(coll_arrays, state["collector"])
        params = {k: params[k] for k in self.params}  # this policy's key order
        adam_state = adam_state_from_arrays(adam_arrays)
        as_flat = getattr(self.policy, "as_flat", None)
        if as_flat is not None:  # the one-buffer layout of init_params (fast paths; same values)
            params = as_flat(params)
            if set(adam_state["m"]) == set(params) and set(adam_state["v"]) == set(params):
                for moment in ("m", "v"):
                    adam_state[moment] = as_flat({k: adam_state[moment][k] for k in params})
        self.params = params
        self.adam_state = adam_state
        set_generator_state(self.action_rng, state["action_rng"])
        set_generator_state(self.minibatch_rng, state["minibatch_rng"])
        set_generator_state(self.predict_rng, state["predict_rng"])
        self.num_timesteps = counters["num_timesteps"]
        self.n_updates = counters["n_updates"]
        self.n_episodes = counters["n_episodes"]
        self.total_timesteps = counters["total_timesteps"]
        self.progress_remaining = float(state["progress_remaining"])
        self.recent_returns = deque((float(x) for x in arrays.get("recent_returns", [])),
                                    maxlen=RECENT_EPISODES)
        self.last_episodes = []
        self.env_seeds = list(state.get("env_seeds", self.env_seeds))

    def checkpoint_metadata(self, arrays: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, Any]:
        """The JSON metadata stored with a :meth:`state_arrays` snapshot (read by :meth:`load`):
        trainer class, policy kind, env id, seed, vectorization, config, counters of the
        snapshot, and ``exact_resume_limits`` (env attributes that could not be captured; empty
        means the resume is exact)."""
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
        """Atomically write a checkpoint (``.npz``). ``arrays``/``metadata`` default to the
        current :meth:`state_arrays` / :meth:`checkpoint_metadata`; pass a snapshot taken
        earlier to save that state instead (the last good state after an env error).

        Raises ``ValueError`` when ``path`` exists and is not a regular file (a directory, a
        device node, a FIFO: never replaced). A replaced checkpoint keeps its permissions; a
        new one gets those of the run's other files (``0o666`` minus the umask)."""
        if arrays is None:
            arrays = self.state_arrays()
        if metadata is None:
            metadata = self.checkpoint_metadata(arrays)
        return save_checkpoint(path, arrays, metadata)  # atomic; checks path, keeps its mode

    @classmethod
    def load(cls, path, env=None, *, allow_import: bool = False, **kwargs) -> "PPOTrainer":
        """A trainer restored from a checkpoint written by :meth:`save`.

        ``env``: a vector env to use instead of re-making ``env_id`` (required when the
        checkpoint was made from a user-built vector env). ``allow_import``: a checkpoint whose
        ``env_id`` has gymnasium's ``"module:EnvId"`` form names a Python module that making
        the env imports (runs); it is imported only with ``allow_import=True`` (or when already
        imported). Every array is compared with this trainer's own state (names, shapes, dtypes,
        finite values: :meth:`load_state_arrays`).

        Raises :class:`~ppo_ref.io.checkpoint.CheckpointError` (one line naming ``path``) on a
        missing, corrupt, truncated or crafted file, a state that does not fit the trainer its
        settings build, or an env module import without consent.
        """
        arrays, meta = load_checkpoint(path)
        where = f"checkpoint {str(path)!r}"
        vet_checkpoint_metadata(meta, where)
        if meta.get("trainer") != cls.__name__:
            raise CheckpointError(f"{where} holds a {meta.get('trainer')!r}, not a {cls.__name__}")
        try:
            config = PPOConfig.from_dict(meta["config"])
            seed = meta["seed"]
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ValueError(f"seed must be an integer, got {seed!r}")
            env_kwargs = meta.get("env_kwargs") or None
            if env_kwargs is not None and not isinstance(env_kwargs, dict):
                raise ValueError(f"env_kwargs must be a JSON object, got {type(env_kwargs).__name__}")
        except _RESTORE_ERRORS as exc:
            raise CheckpointError(f"{where} has bad settings: {type(exc).__name__}: "
                                  f"{_one_line(exc)[:300]}") from None
        if env is None:
            if meta.get("env_id") is None:
                raise CheckpointError(f"{where} has no env id: pass env=")
            env = meta["env_id"]
            if not isinstance(env, str):
                raise CheckpointError(f"{where} has env id {env!r}, not a string")
            check_env_import(env, allow_import, where)
        trainer = cls(env, config, seed=seed,
                      vectorization=kwargs.pop("vectorization", meta.get("vectorization", "sync")),
                      env_kwargs=env_kwargs, **kwargs)
        try:
            trainer.load_state_arrays(arrays)
            for key in ("num_timesteps", "n_updates", "n_episodes", "total_timesteps"):
                if meta.get(key) != getattr(trainer, key):
                    raise ValueError(f"metadata {key}={meta.get(key)!r} differs from the "
                                     f"state's {getattr(trainer, key)!r}")
        except BaseException as exc:
            trainer.close()
            if isinstance(exc, _RESTORE_ERRORS):
                raise CheckpointError(f"{where} does not hold a valid {cls.__name__} state: "
                                      f"{type(exc).__name__}: {_one_line(exc)[:300]}") from None
            raise
        return trainer

    def close(self) -> None:
        """Close the vector env."""
        self.collector.close()
