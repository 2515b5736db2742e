"""The learner of the actor-learner loop: :func:`learner_loop` (docs/specification.md §6)."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np

from ppo_ref._checks import check_count
from ppo_ref.distributed.actor import POLL_SECONDS
from ppo_ref.distributed.config import AsyncActorLearnerConfig
from ppo_ref.distributed.messages import (ActorDiedError, ActorFailed, ActorFinished,
                                          ActorLearnerError, ActorStats, Experience,
                                          ExperienceBatch, ExperienceError, PolicyBroadcast,
                                          StarvationError)
from ppo_ref.distributed.transport import ActorGroup, start_actors

__all__ = ["UpdateInfo", "LearnerReport", "learner_loop", "make_learner", "train_async",
           "resumed_actors_config"]


class UpdateInfo(NamedTuple):
    """What :func:`learner_loop` passes to its callback after every update: the ``rollout``
    (``[n_steps, num_actors]``, column = agent_id) trained on, its ``advantages`` and
    ``returns``, the version each row acted with (``policy_versions``; lag = ``version -
    policy_versions``) and the episodes completed in it (row by row, columns in agent order)."""

    update: int
    env_steps: int
    episodes: int
    version: int
    policy_lag_mean: float
    policy_lag_max: int
    stats: dict
    episode_returns: List[float]
    episode_lengths: List[int]
    rollout: Any
    advantages: np.ndarray
    returns: np.ndarray
    policy_versions: np.ndarray
    wall_seconds: float


@dataclass
class LearnerReport:
    """Summary of a :func:`learner_loop` run: ``broadcasts`` counts version 0 too;
    ``policy_lag_mean``/``policy_lag_max`` one entry per update; ``actor_stats`` each actor's
    :class:`ActorStats` (None: no report); ``stopped_early``: the callback returned False;
    ``actor_errors``: id -> exception text of actors that failed after the learner held all it
    needed."""

    updates: int = 0
    env_steps: int = 0
    episodes: int = 0
    broadcasts: int = 0
    last_version: int = 0
    episode_returns: List[float] = field(default_factory=list)
    episode_lengths: List[int] = field(default_factory=list)
    final_stats: dict = field(default_factory=dict)
    policy_lag_mean: List[float] = field(default_factory=list)
    policy_lag_max: List[int] = field(default_factory=list)
    actor_stats: List[Optional[ActorStats]] = field(default_factory=list)
    wall_seconds: float = 0.0
    stopped_early: bool = False
    actor_errors: Dict[int, str] = field(default_factory=dict)

    @property
    def steps_per_second(self) -> float:
        """Env steps consumed per wall-clock second."""
        return self.env_steps / self.wall_seconds if self.wall_seconds > 0 else float("nan")


class _ActorFifo:
    """FIFO of one actor's experiences, stored as the chunks they arrived in."""

    def __init__(self, agent_id: int):
        self.agent_id = agent_id
        self.chunks: List[ExperienceBatch] = []
        self.count = 0           # rows available

    def push(self, batch: ExperienceBatch) -> None:
        if batch.reset_observations is None:    # no episode ended in it: acts on from the next
            batch = ExperienceBatch(*tuple(batch)[:-1], batch.next_observations)
        if len(batch):
            self.chunks.append(batch)
            self.count += len(batch)

    def take(self, n: int) -> ExperienceBatch:
        """Remove and return the oldest ``n`` rows (``count >= n``); the rest stays as one chunk."""
        columns = list(zip(*(chunk[1:] for chunk in self.chunks)))
        fields = [np.concatenate(cols) if len(cols) > 1 else cols[0] for cols in columns]
        self.count -= n
        rest = ExperienceBatch(self.agent_id, *(f[n:] for f in fields))
        self.chunks = [rest] if self.count else []
        return ExperienceBatch(self.agent_id, *(f[:n] for f in fields))


def _check_experience_batch(batch: ExperienceBatch, num_actors: int, obs_shape: tuple,
                            action_shape: tuple, discrete: bool, version: int) -> ExperienceBatch:
    """The message of an actor, checked and normalised; :class:`ExperienceError` names the
    field."""
    try:
        agent_id = check_count(batch.agent_id, "Experience.agent_id", 0)
    except ValueError as exc:
        raise ExperienceError(str(exc)) from None
    if agent_id >= num_actors:
        raise ExperienceError(f"Experience.agent_id must be in [0, {num_actors}), got {agent_id}")
    k = len(batch)
    who = f"(agent {agent_id})"

    def floats(value, name, shape):
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ExperienceError(f"Experience.{name} must be real numbers of shape "
                                  f"{shape[1:]} {who}") from None
        if arr.shape != shape:
            raise ExperienceError(f"Experience.{name} must have shape {shape[1:]}, got "
                                  f"{arr.shape[1:]} {who}")
        if not np.isfinite(arr).all():
            raise ExperienceError(f"Experience.{name} must be finite {who}")
        return arr

    def flags(value, name):
        arr = np.asarray(value)
        if arr.shape != (k,) or arr.dtype != np.bool_:
            raise ExperienceError(f"Experience.{name} must be a bool per step {who}")
        return arr

    observations = floats(batch.observations, "observation", (k,) + obs_shape)
    next_observations = floats(batch.next_observations, "next_observation", (k,) + obs_shape)
    actions = np.asarray(batch.actions)
    if actions.shape != (k,) + action_shape:
        raise ExperienceError(f"Experience.action must have shape {action_shape}, got "
                              f"{actions.shape[1:]} {who}")
    if discrete:
        if not np.issubdtype(actions.dtype, np.integer):
            raise ExperienceError(f"Experience.action must be an integer {who}")
        actions = actions.astype(np.int64, copy=False)
    else:
        actions = floats(actions, "action", (k,) + action_shape)
    rewards = floats(batch.rewards, "reward", (k,))
    values = floats(batch.values, "value", (k,))
    log_probs = floats(batch.log_probs, "log_prob", (k,))
    versions = np.asarray(batch.policy_versions)
    if versions.shape != (k,) or not np.issubdtype(versions.dtype, np.integer):
        raise ExperienceError(f"Experience.policy_version must be an integer per step {who}")
    if k and (versions.min() < 0 or versions.max() > version):
        raise ExperienceError(f"Experience.policy_version must be in [0, {version}] (versions "
                              f"broadcast so far), got {versions.min()}..{versions.max()} {who}")
    terminated = flags(batch.terminated, "terminated")
    truncated = flags(batch.truncated, "truncated")
    ended = terminated | truncated
    if batch.reset_observations is None:
        if ended.any():
            raise ExperienceError(f"Experience.reset_observation is required where the step "
                                  f"terminated or truncated (the first observation of the next "
                                  f"episode) {who}")
        resets = next_observations
    else:
        resets = floats(batch.reset_observations, "reset_observation", (k,) + obs_shape)
        resets = np.where(ended.reshape((k,) + (1,) * len(obs_shape)), resets, next_observations)
    return ExperienceBatch(agent_id, observations, actions, rewards, next_observations,
                           terminated, truncated, values, log_probs,
                           versions.astype(np.int64, copy=False), resets)


#: Seconds between liveness checks of the actors while the learner waits or reads.
LIVENESS_SECONDS = 0.5
#: Seconds the learner keeps reading after finding a dead actor, for its exception text.
DEATH_NOTICE_SECONDS = 1.0
#: Seconds actors get to exit by themselves after a failure before they are terminated.
ERROR_SHUTDOWN_SECONDS = 0.25
#: An actor that dies (even by SIGKILL) while the learner waits is reported as ActorDiedError
#: within this many seconds, whatever the number of actors (the constants above keep it).
ACTOR_DEATH_SECONDS = 2.0


class _Learner:
    """State of one :func:`learner_loop` run (FIFOs, carries, counters)."""

    def __init__(self, config: AsyncActorLearnerConfig, trainer, group: ActorGroup, callback,
                 start_version: int = 0):
        self.config = config
        self.trainer = trainer
        self.group = group
        self.callback = callback
        self.policy = trainer.policy
        self.obs_shape = tuple(self.policy.obs_shape)
        self.action_shape = tuple(self.policy.head.action_shape)
        self.discrete = self.policy.head.action_dtype.kind == "i"
        n = config.num_actors
        self.fifos = [_ActorFifo(i) for i in range(n)]
        self.version = start_version        # the first broadcast carries it
        self.report = LearnerReport()
        self.episode_start_carry = np.ones(n, dtype=bool)
        # [N, *obs_shape]: what each actor acts from after the last consumed row
        self.observations_after: Optional[np.ndarray] = None
        self.episode_return = np.zeros(n, dtype=np.float64)
        self.episode_length = np.zeros(n, dtype=np.int64)
        self.t0 = time.monotonic()

    def handle(self, msg) -> bool:
        """Process one message; True when it carried experience."""
        if isinstance(msg, Experience):
            msg = ExperienceBatch.from_experiences([msg])
        if isinstance(msg, ExperienceBatch):
            batch = _check_experience_batch(msg, self.config.num_actors, self.obs_shape,
                                            self.action_shape, self.discrete, self.version)
            self.fifos[batch.agent_id].push(batch)
            return True
        if isinstance(msg, ActorFailed):
            raise ActorDiedError(msg.agent_id, msg.error, msg.traceback)
        if isinstance(msg, ActorFinished):
            raise ActorDiedError(msg.agent_id, f"stopped before the learner finished "
                                               f"({msg.stats})")
        raise ActorLearnerError(f"learner received an unexpected message {type(msg).__name__}")

    def check_actors(self) -> None:
        """Raise :class:`ActorDiedError` for an actor that is no longer running."""
        for agent_id in range(self.config.num_actors):
            if self.group.is_alive(agent_id):
                continue
            # Its last words may still be in the queue behind experiences: read on briefly.
            deadline = time.monotonic() + DEATH_NOTICE_SECONDS
            while time.monotonic() < deadline and not self.group.channel_finished(agent_id):
                msg = self.group.get(0.05)
                if msg is not None:
                    self.handle(msg)   # raises on the ActorFailed / ActorFinished notice
            for msg in iter(lambda: self.group.get(0.0), None):  # read before end-of-file
                self.handle(msg)
            raise ActorDiedError(agent_id, f"{self.group.exit_description(agent_id)} without "
                                           f"reporting an exception")

    def check_hung(self, heard: List[float], now: float) -> None:
        """Raise :class:`StarvationError` for an actor whose rows the learner needs and which
        sent nothing for ``config.env_step_timeout`` seconds."""
        limit = self.config.env_step_timeout
        for agent_id, fifo in enumerate(self.fifos):
            if fifo.count < self.config.n_steps and now - heard[agent_id] > limit:
                raise StarvationError(
                    f"actor {agent_id} sent nothing for {now - heard[agent_id]:.1f} s "
                    f"(env_step_timeout {limit:g} s) while the learner waited for its rows "
                    f"({fifo.count} of {self.config.n_steps}): its env is presumably hung inside "
                    f"env.step or env.reset")

    def fill(self) -> None:
        """Read messages until every FIFO holds ``n_steps`` experiences."""
        n_steps = self.config.n_steps
        timeout = self.config.starvation_timeout
        last_experience = time.monotonic()
        next_check = last_experience + LIVENESS_SECONDS
        # per actor: when it last sent experience, or when this wait began if later (before it,
        # the actor may have been waiting for the broadcast that preceded this call)
        heard = [last_experience] * len(self.fifos)
        while min(f.count for f in self.fifos) < n_steps:
            msg = self.group.get(POLL_SECONDS)
            now = time.monotonic()
            if msg is not None and self.handle(msg):
                last_experience = now
                heard[msg.agent_id] = now
            if now >= next_check:
                self.check_actors()
                next_check = now + LIVENESS_SECONDS
                self.check_hung(heard, now)
            if now - last_experience > timeout:
                counts = [f.count for f in self.fifos]
                raise StarvationError(
                    f"no experience for {timeout:g} s (starvation_timeout); update "
                    f"{self.report.updates + 1} needs {n_steps} per actor, FIFO counts {counts}")

    def check_continuity(self, buf: ExperienceBatch) -> None:
        """Each row's observation must be the one the actor acts from after the previous row
        (its ``next_observation``, or its ``reset_observation`` where an episode ended): catches
        reordered, dropped or duplicated experiences."""
        obs, after = buf.observations, buf.reset_observations
        axes = tuple(range(2, obs.ndim))
        mismatch = np.zeros(buf.rewards.shape, dtype=bool)
        mismatch[1:] = np.any(obs[1:] != after[:-1], axis=axes)
        if self.observations_after is not None:
            mismatch[0] = np.any(obs[0] != self.observations_after,
                                 axis=tuple(range(1, obs.ndim - 1)))
        if mismatch.any():
            t, n = (int(i) for i in np.argwhere(mismatch)[0])
            raise ExperienceError(
                f"Experience.observation of agent {n} at buffer row {t} is not the "
                f"next_observation of its previous step (its reset_observation where the "
                f"episode ended): experiences were reordered, dropped or duplicated")

    def rollout(self, buf: ExperienceBatch):
        """The buffer as the :class:`~ppo_ref.train.rollout.Rollout` the synchronous collector
        records for the same transitions, counted by the trainer: the actors' ``values`` and
        ``log_probs``; ``last_values[n] = V(what actor n acts from next)`` and, where step t
        truncated without terminating, ``final_values[t, n] = V(next_observation[t, n])``
        under the learner's current parameters."""
        from ppo_ref.train.rollout import Rollout
        self.check_continuity(buf)
        terminated, truncated = buf.terminated, buf.truncated
        starts = self.trainer.tier.masks.episode_starts(terminated, truncated,
                                                        self.episode_start_carry)
        done = terminated | truncated
        self.episode_start_carry = done[-1].copy()
        self.observations_after = buf.reset_observations[-1]
        T, N = buf.rewards.shape
        policy, cparams = self.policy, self.policy.compute_params(self.trainer.params)
        cut = truncated & ~terminated
        final_values = np.zeros((T, N)) if cut.any() else None
        for t in np.flatnonzero(cut.any(axis=1)):  # V(final obs), one call per step as acting
            idx = np.flatnonzero(cut[t])
            final_values[t, idx] = policy.values(
                cparams, buf.next_observations[t, idx].reshape(idx.size, -1), None, None)
        last_values = policy.values(cparams, self.observations_after.reshape(N, -1), None, None)
        rollout = Rollout(buf.observations.reshape(T, N, -1).astype(np.float64), buf.actions,
                          buf.rewards, terminated, truncated, starts, buf.values, buf.log_probs,
                          final_values, np.asarray(last_values, dtype=np.float64))
        for t in range(T):  # the episodes that end in this buffer, in step order
            self.episode_return += buf.rewards[t]
            self.episode_length += 1
            for n in np.flatnonzero(done[t]):
                rollout.episode_returns.append(float(self.episode_return[n]))
                rollout.episode_lengths.append(int(self.episode_length[n]))
                rollout.episode_envs.append(int(n))
            self.episode_return[done[t]] = 0.0
            self.episode_length[done[t]] = 0
        return self.trainer.record_rollout(rollout)

    def update(self) -> UpdateInfo:
        """One :meth:`~ppo_ref.train.ppo.PPOTrainer.iteration` on the next buffer (GAE, or
        V-trace against the current parameters)."""
        config = self.config
        # the [n_steps, num_actors] buffer: every actor's oldest rows, stacked along axis 1
        columns = [fifo.take(config.n_steps) for fifo in self.fifos]
        buf = ExperienceBatch(-1, *(np.stack(f, axis=1) for f in list(zip(*columns))[1:]))
        advantages_fn = None
        if config.use_vtrace:
            advantages_fn = functools.partial(self.trainer.compute_vtrace_advantages,
                                              rho_bar=config.rho_bar, c_bar=config.c_bar)
        step = self.trainer.iteration(lambda: self.rollout(buf), advantages_fn)
        rollout, stats = step.rollout, step.stats
        lags = self.version - buf.policy_versions
        r = self.report
        r.updates += 1
        r.env_steps += buf.rewards.size
        r.episode_returns.extend(rollout.episode_returns)
        r.episode_lengths.extend(rollout.episode_lengths)
        r.episodes += len(rollout.episode_returns)
        r.final_stats = dict(stats)
        r.policy_lag_mean.append(float(lags.mean()))
        r.policy_lag_max.append(int(lags.max()))
        info = UpdateInfo(r.updates, r.env_steps, r.episodes, self.version,
                          r.policy_lag_mean[-1], r.policy_lag_max[-1], dict(stats),
                          list(rollout.episode_returns), list(rollout.episode_lengths), rollout,
                          step.advantages, step.returns, buf.policy_versions,
                          time.monotonic() - self.t0)
        if r.updates % config.broadcast_every == 0:
            self.broadcast()
        return info

    def broadcast(self) -> None:
        from ppo_ref.io.checkpoint import arrays_to_bytes
        if self.report.broadcasts:
            self.version += 1
        payload = arrays_to_bytes(self.trainer.params)
        self.group.broadcast(PolicyBroadcast(self.version, payload))
        self.report.broadcasts += 1
        self.report.last_version = self.version

    def run(self) -> LearnerReport:
        c = self.config  # the schedules' horizon: the steps this run consumes
        self.trainer.total_timesteps = (self.trainer.num_timesteps
                                        + c.num_updates * c.n_steps * c.num_actors)
        self.broadcast()                      # version 0: the actors' initial parameters
        for _ in range(self.config.num_updates):
            self.fill()
            info = self.update()
            if self.callback is not None and self.callback(info) is False:
                self.report.stopped_early = True
                break
        self.report.wall_seconds = time.monotonic() - self.t0
        return self.report


def learner_loop(config: AsyncActorLearnerConfig, trainer, actors, *,
                 callback: Optional[Callable[[UpdateInfo], None]] = None,
                 shutdown_timeout: float = 10.0, chunk_size: Optional[int] = None,
                 start_version: int = 0):
    """Run the learner for ``config.num_updates`` PPO updates (docs/specification.md §6): each
    ``[n_steps, num_actors]`` buffer gets one :meth:`~ppo_ref.train.ppo.PPOTrainer.iteration`
    (:meth:`_Learner.rollout`, :meth:`_Learner.update`). At the end or on any error the actors
    are shut down (:meth:`ActorGroup.shutdown`, ``shutdown_timeout`` s).

    ``trainer``: a PPOTrainer from :func:`make_learner` (updated in place). ``actors``: an
    :class:`ActorGroup` (the loop shuts it down) or a gymnasium id / factory from which the loop
    starts actors with ``chunk_size`` (seeds advanced by :func:`resumed_actors_config`).
    ``callback(UpdateInfo)`` returning ``False`` stops after that update. ``start_version``: 0,
    or the version a resumed run's checkpoint saved. Returns ``(trainer, LearnerReport)``.

    Raises:
        StarvationError: no experience for ``config.starvation_timeout`` seconds, or an actor
            silent for ``env_step_timeout``. ActorDiedError: an actor raised or exited.
        ExperienceError: (a ``ValueError``) an experience with a bad field, named.
        ValueError: ``actors`` of the wrong size, a trainer whose gamma/gae_lambda differ.
    """
    start_version = check_count(start_version, "start_version", 0)
    group = actors if isinstance(actors, ActorGroup) else start_actors(
        resumed_actors_config(config, start_version), actors, chunk_size=chunk_size)
    try:
        if group.num_actors != config.num_actors:
            raise ValueError(f"actors has {group.num_actors} actors, config.num_actors is "
                             f"{config.num_actors}")
        for name in ("gamma", "gae_lambda"):
            if getattr(trainer.config, name) != getattr(config, name):
                raise ValueError(f"trainer.config.{name} ({getattr(trainer.config, name)}) "
                                 f"differs from config.{name} ({getattr(config, name)}): build "
                                 f"the trainer with make_learner(config, env)")
        learner = _Learner(config, trainer, group, callback, start_version)
        report = learner.run()
    except BaseException:  # a short grace, then terminated: within ACTOR_DEATH_SECONDS
        group.shutdown(min(shutdown_timeout, ERROR_SHUTDOWN_SECONDS))
        raise
    finals = group.shutdown(shutdown_timeout)
    report.actor_stats = [finals[i].stats if isinstance(finals.get(i), ActorFinished) else None
                          for i in range(config.num_actors)]
    report.actor_errors = {i: m.error for i, m in finals.items() if isinstance(m, ActorFailed)}
    return trainer, report


def resumed_actors_config(config: AsyncActorLearnerConfig,
                          start_version: int) -> AsyncActorLearnerConfig:
    """The actors' configuration when the learner continues from ``start_version`` v: actor k
    seeds with ``seed + 1 + k + num_actors * v`` (seeds no earlier actor of the run used, the
    same for every resume from the same checkpoint)."""
    if not start_version:
        return config
    return config.replace(seed=config.seed + config.num_actors * int(start_version))


def make_learner(config: AsyncActorLearnerConfig, env):
    """The learner's :class:`~ppo_ref.train.ppo.PPOTrainer` for ``env`` (gymnasium id or factory):
    ``config.learner_ppo_config()``, seed ``config.seed``."""
    from ppo_ref.train.ppo import PPOTrainer
    if not isinstance(env, str):  # the trainer reads a vector env's spaces only
        from gymnasium.vector import AutoresetMode, SyncVectorEnv
        env = SyncVectorEnv([env] * config.num_actors, autoreset_mode=AutoresetMode.SAME_STEP)
    return PPOTrainer(env, config.learner_ppo_config(), seed=config.seed)


def train_async(env, config: AsyncActorLearnerConfig = AsyncActorLearnerConfig(), *,
                callback: Optional[Callable[[UpdateInfo], None]] = None, trainer=None,
                chunk_size: Optional[int] = None):
    """Train with the actor-learner loop: :func:`make_learner` (unless ``trainer`` is given),
    :func:`start_actors`, :func:`learner_loop`. Returns ``(trainer, LearnerReport)``."""
    if trainer is None:
        trainer = make_learner(config, env)
    group = start_actors(config, env, chunk_size=chunk_size)
    return learner_loop(config, trainer, group, callback=callback)
