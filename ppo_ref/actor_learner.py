"""Asynchronous actor-learner PPO (docs/specification.md §6): actors, the learner loop, messages, reports.

The Python counterpart of thrust-rl's ``learner_loop`` / ``actor_thread``. Data flow::

    actor k (own env, own policy copy, own RNG)            learner (a PPOTrainer)
      obs -> act with params of version v -> env.step
      Experience(agent_id=k, ..., policy_version=v) ----->  FIFO[k]
                                                             when every FIFO holds n_steps:
                                                               buffer [n_steps, num_actors]
                                                               (column = agent_id)
                                                               -> the collector's Rollout
                                                               -> trainer.iteration
                                                                  (gae or vtrace, train_on)
      newest PolicyBroadcast(v', payload) <---------------- every broadcast_every updates

* **Budget (the only flow control).** Version ``v`` is broadcast after ``v * broadcast_every``
  updates, each of which consumed ``n_steps`` rows from every actor, so holding version ``v``
  proves that ``v * broadcast_every * n_steps`` of this actor's steps were consumed. An actor
  produces its step ``s`` (1-based) only when ``s - v * broadcast_every * n_steps <=
  max_lead_steps``; otherwise it flushes what it has and waits for a newer broadcast. The learner
  needs ``broadcast_every * n_steps`` further rows from every actor before it can broadcast
  again, so a lead below that would deadlock and is rejected.
* **Policy lag** of a consumed experience: the learner's current version minus the version the
  actor acted with. With ``max_lead_steps = n_steps`` and ``broadcast_every = 1`` (lockstep) it
  is 0 for every experience and the run is on-policy PPO with ``num_actors`` envs.
* **Nothing is dropped.** Experiences beyond the ``n_steps`` an update takes stay in their FIFO
  for the next update, in the order each actor sent them.
* **Failures never hang.** The learner polls its actors while it waits: an actor that raised
  reports its exception text; one that died without a word is found by its liveness; no
  experience for ``starvation_timeout`` seconds is a :class:`StarvationError`. In every case the
  learner shuts down all actors (terminating processes that do not exit in time) before it
  raises.

Backends: ``"process"`` (``multiprocessing`` with the spawn start method; one process per actor
with its own pipe to the learner, drained by a reader thread of the learner process, and a
``multiprocessing`` queue back; messages are pickled, the policy itself only ever travels as the
bit-exact npz bytes of :func:`ppo_ref.checkpoint.arrays_to_bytes`) or ``"thread"`` (threads and
``queue.Queue``; the same messages, the same payload bytes; the GIL serialises the Python work).
"""
from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import queue as queue_module
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ppo_ref._checks import check_choice, check_positive, check_unit_interval
from ppo_ref.config import PPOConfig

__all__ = [
    "AsyncActorLearnerConfig",
    "Experience",
    "ExperienceBatch",
    "PolicyBroadcast",
    "Shutdown",
    "ActorFinished",
    "ActorFailed",
    "ActorStats",
    "ActorGroup",
    "ActorLearnerError",
    "StarvationError",
    "ActorDiedError",
    "ExperienceError",
    "UpdateInfo",
    "LearnerReport",
    "run_actor",
    "start_actors",
    "make_learner",
    "learner_loop",
    "train_async",
    "async_config_from_ppo",
    "cli_train",
]

BACKENDS = ("thread", "process")


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class AsyncActorLearnerConfig:
    """Settings of the asynchronous actor-learner loop (docs/specification.md §6). Validated at construction.

    The learner's PPO update (epochs, minibatch size, learning rate, clip range, losses, network)
    comes from ``ppo``; its ``n_steps``, ``n_envs``, ``gamma`` and ``gae_lambda`` are replaced by
    the fields of this class (see :meth:`learner_ppo_config`), which are the single source for
    the buffer shape and the discount.
    """

    num_actors: int = 4
    """Number of actors, each with its own env; the buffer has one column per actor."""
    n_steps: int = 256
    """Rows taken from every actor per update; the buffer is [n_steps, num_actors]."""
    total_timesteps: int = 200_000
    """Env steps to consume at least: whole updates, ceil(total_timesteps / (n_steps * num_actors))
    of them (as the synchronous trainer runs whole rollouts)."""
    broadcast_every: int = 1
    """A new policy version is sent to all actors after every this many updates."""
    max_lead_steps: int = 0
    """How far (env steps) an actor may run ahead of what the learner provably consumed;
    0 means 2 * broadcast_every * n_steps; below broadcast_every * n_steps it would deadlock."""
    gamma: float = 0.99
    """Discount factor in [0, 1]."""
    gae_lambda: float = 0.95
    """GAE lambda in [0, 1] (ignored with use_vtrace)."""
    use_vtrace: bool = False
    """Advantages and value targets by V-trace against the learner's current policy."""
    rho_bar: float = 1.0
    """V-trace truncation of the importance weight (> 0)."""
    c_bar: float = 1.0
    """V-trace truncation of the trace coefficients (> 0)."""
    seed: int = 0
    """Learner seed; actor k seeds its RNG and env with seed + 1 + k."""
    starvation_timeout: float = 60.0
    """Seconds without any experience before the learner raises StarvationError."""
    env_step_timeout: float = 60.0
    """Seconds an actor the learner is waiting for may send nothing before the learner raises
    StarvationError naming that actor (its env is hung inside env.step or env.reset, or is
    slower than env_step_timeout / chunk_size seconds per step). The clock starts when the
    learner begins to wait for the actor's rows (after its last broadcast), so time the actor
    spent legitimately waiting for a policy never counts."""
    backend: str = "process"
    """"process" (multiprocessing, spawn) or "thread"."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO settings of the learner's update."""

    def __post_init__(self):
        _check_int(self.num_actors, "num_actors", 1)
        _check_int(self.n_steps, "n_steps", 1)
        _check_int(self.total_timesteps, "total_timesteps", 1)
        _check_int(self.broadcast_every, "broadcast_every", 1)
        _check_int(self.max_lead_steps, "max_lead_steps", 0)
        check_unit_interval(self.gamma, "gamma")
        check_unit_interval(self.gae_lambda, "gae_lambda")
        if not isinstance(self.use_vtrace, (bool, np.bool_)):
            raise ValueError(f"use_vtrace must be a bool, got {self.use_vtrace!r}")
        check_positive(self.rho_bar, "rho_bar")
        check_positive(self.c_bar, "c_bar")
        _check_int(self.seed, "seed", 0)
        check_positive(self.starvation_timeout, "starvation_timeout")
        check_positive(self.env_step_timeout, "env_step_timeout")
        check_choice(self.backend, "backend", BACKENDS)
        if not isinstance(self.ppo, PPOConfig):
            raise ValueError(f"ppo must be a PPOConfig, got {type(self.ppo).__name__}")
        minimum_lead = self.broadcast_every * self.n_steps
        if self.max_lead_steps != 0 and self.max_lead_steps < minimum_lead:
            raise ValueError(
                f"max_lead_steps must be 0 (= 2 * broadcast_every * n_steps) or >= "
                f"broadcast_every * n_steps = {minimum_lead}, got {self.max_lead_steps}: the "
                f"learner needs that many rows from every actor between two broadcasts, so a "
                f"smaller lead deadlocks")
        for name in ("normalize_observations", "normalize_rewards"):
            if getattr(self.ppo, name, False):
                raise ValueError(f"ppo.{name} is not supported by the actor-learner loop "
                                 f"(actors would each hold different running statistics)")
        try:
            self.learner_ppo_config()
        except ValueError as exc:
            raise ValueError(f"ppo: {exc} (with n_steps={self.n_steps}, "
                             f"n_envs=num_actors={self.num_actors})") from None

    @property
    def lead_limit(self) -> int:
        """``max_lead_steps`` with 0 resolved to ``2 * broadcast_every * n_steps``."""
        return self.max_lead_steps or 2 * self.broadcast_every * self.n_steps

    @property
    def num_updates(self) -> int:
        """``ceil(total_timesteps / (n_steps * num_actors))``: whole updates, at least
        ``total_timesteps`` env steps (as :meth:`ppo_ref.ppo.PPOTrainer.learn`)."""
        rows = self.n_steps * self.num_actors
        return max(1, -(-self.total_timesteps // rows))

    @property
    def steps_per_broadcast(self) -> int:
        """Rows of each actor consumed between two broadcasts: ``broadcast_every * n_steps``."""
        return self.broadcast_every * self.n_steps

    def learner_ppo_config(self) -> PPOConfig:
        """``ppo`` with ``n_steps``, ``n_envs = num_actors``, ``gamma`` and ``gae_lambda`` set
        from this config: the configuration of the learner's :class:`~ppo_ref.ppo.PPOTrainer`."""
        return self.ppo.replace(n_steps=self.n_steps, n_envs=self.num_actors,
                                gamma=self.gamma, gae_lambda=self.gae_lambda)

    def replace(self, **changes) -> "AsyncActorLearnerConfig":
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-safe dict (``ppo`` as ``PPOConfig.to_dict()``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "ppo"}
        d["ppo"] = self.ppo.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "AsyncActorLearnerConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown AsyncActorLearnerConfig fields: {unknown}")
        if "ppo" in d and not isinstance(d["ppo"], PPOConfig):
            d["ppo"] = PPOConfig.from_dict(d["ppo"])
        return cls(**d)


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------

class Experience(NamedTuple):
    """One env step of one actor, as sent to the learner (docs/specification.md §6).

    ``observation`` ``[*obs_shape]`` float64: the observation the action was chosen from;
    ``action``: int64 scalar (discrete) or ``[A]`` float64 raw Gaussian sample (the env got the
    clipped one); ``reward`` float; ``next_observation``: the real observation after the step
    (the final one when the episode ended, before any reset); ``terminated`` / ``truncated``:
    as returned by ``env.step``; ``value`` = V(observation) and ``log_prob`` = log mu(action |
    observation) (nats) under the parameters of ``policy_version``, the ones that acted;
    ``reset_observation`` ``[*obs_shape]`` float64: where the step ended an episode
    (terminated or truncated), the first observation of the next one (what ``env.reset``
    returned, the observation the actor acts from next), else ``None``. The learner needs it
    where a buffer's last row ended an episode: the collector's ``last_values`` is the value of
    that observation.
    """

    agent_id: int
    observation: np.ndarray
    action: Any
    reward: float
    next_observation: np.ndarray
    terminated: bool
    truncated: bool
    value: float
    log_prob: float
    policy_version: int
    reset_observation: Optional[np.ndarray] = None


class ExperienceBatch(NamedTuple):
    """Consecutive experiences of ONE actor in one message (the fields of :class:`Experience`
    stacked along a leading axis of length k, in the order the steps were taken).

    Sending k steps per queue message instead of one is only a transport optimisation: the
    learner unpacks it into exactly the k experiences, same order, same content.
    """

    agent_id: int
    observations: np.ndarray        # [k, *obs_shape] float64
    actions: np.ndarray             # [k] int64 or [k, A] float64
    rewards: np.ndarray             # [k] float64
    next_observations: np.ndarray   # [k, *obs_shape] float64
    terminated: np.ndarray          # [k] bool
    truncated: np.ndarray           # [k] bool
    values: np.ndarray              # [k] float64
    log_probs: np.ndarray           # [k] float64
    policy_versions: np.ndarray     # [k] int64
    # [k, *obs_shape] float64: the observation the actor acts from next, i.e. reset_observation
    # where the step ended an episode and next_observation elsewhere; None when no step of the
    # batch ended an episode
    reset_observations: Optional[np.ndarray] = None

    def __len__(self) -> int:  # noqa: D105  (number of steps, not of tuple fields)
        return int(self.rewards.shape[0])

    @classmethod
    def from_experiences(cls, experiences: Sequence[Experience]) -> "ExperienceBatch":
        """Stack experiences of a single actor (raises ``ValueError`` on mixed agent ids).
        ``reset_observations`` holds each experience's ``reset_observation`` (its
        ``next_observation`` where that is None), or is None when every one is None."""
        if not experiences:
            raise ValueError("experiences must not be empty")
        agent_id = experiences[0].agent_id
        if any(e.agent_id != agent_id for e in experiences):
            raise ValueError("experiences must all have the same agent_id")
        resets = None
        if any(e.reset_observation is not None for e in experiences):
            resets = np.asarray([e.next_observation if e.reset_observation is None
                                 else e.reset_observation for e in experiences])
        return cls(
            agent_id,
            np.asarray([e.observation for e in experiences]),
            np.asarray([e.action for e in experiences]),
            np.asarray([e.reward for e in experiences]),
            np.asarray([e.next_observation for e in experiences]),
            np.asarray([e.terminated for e in experiences]),
            np.asarray([e.truncated for e in experiences]),
            np.asarray([e.value for e in experiences]),
            np.asarray([e.log_prob for e in experiences]),
            np.asarray([e.policy_version for e in experiences]),
            resets,
        )

    def experiences(self) -> List[Experience]:
        """The individual :class:`Experience` tuples, in order (``reset_observation`` set
        where the step ended an episode and ``reset_observations`` is given)."""
        resets = self.reset_observations
        return [Experience(self.agent_id, self.observations[i], self.actions[i],
                           float(self.rewards[i]), self.next_observations[i],
                           bool(self.terminated[i]), bool(self.truncated[i]),
                           float(self.values[i]), float(self.log_probs[i]),
                           int(self.policy_versions[i]),
                           resets[i] if resets is not None and (self.terminated[i]
                                                                or self.truncated[i]) else None)
                for i in range(len(self))]


class PolicyBroadcast(NamedTuple):
    """Learner -> actor: policy parameters of ``version`` (0 = initial parameters).

    ``payload`` is :func:`ppo_ref.checkpoint.arrays_to_bytes` of the parameter dict: npz bytes,
    no pickle, a bit-exact round trip through :func:`~ppo_ref.checkpoint.arrays_from_bytes`.
    """

    version: int
    payload: bytes


class Shutdown(NamedTuple):
    """Learner -> actor: stop now and report :class:`ActorStats`."""

    reason: str = "learner finished"


class ActorStats(NamedTuple):
    """What an actor did: steps sent, episodes finished, broadcasts taken, last version used."""

    agent_id: int
    steps_sent: int
    episodes: int
    broadcasts_received: int
    last_policy_version: int


class ActorFinished(NamedTuple):
    """Actor -> learner: the actor stopped normally (after a Shutdown or with the learner gone)."""

    agent_id: int
    stats: ActorStats


class ActorFailed(NamedTuple):
    """Actor -> learner: the actor raised; ``error`` is ``"Type: message"``."""

    agent_id: int
    error: str
    traceback: str


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

class ActorLearnerError(RuntimeError):
    """Base class of the actor-learner loop's errors."""


class StarvationError(ActorLearnerError):
    """No experience reached the learner for ``starvation_timeout`` seconds."""


class ActorDiedError(ActorLearnerError):
    """An actor raised, exited or was killed while the learner still needed it.

    ``agent_id`` is the actor's id and ``reason`` its exception text (or exit code).
    """

    def __init__(self, agent_id: int, reason: str, actor_traceback: str = ""):
        self.agent_id = agent_id
        self.reason = reason
        self.actor_traceback = actor_traceback
        msg = f"actor {agent_id} died: {reason}"
        if actor_traceback:
            msg += f"\n--- actor {agent_id} traceback ---\n{actor_traceback.rstrip()}"
        super().__init__(msg)


# --------------------------------------------------------------------------------------------
# Actors
# --------------------------------------------------------------------------------------------

#: Seconds an idle actor or learner waits on a queue before it re-checks liveness.
POLL_SECONDS = 0.1


def _make_env(env):
    """A gymnasium env from an id string or a zero-argument factory (picklable for processes)."""
    if isinstance(env, str):
        import gymnasium as gym
        return gym.make(env, disable_env_checker=True)
    if callable(env):
        return env()
    raise ValueError(f"env must be a gymnasium id string or a zero-argument callable, got {env!r}")


def run_actor(agent_id: int, env, config: AsyncActorLearnerConfig,
              send: Callable[[Any], None], receive: Callable[[float], Optional[Any]],
              learner_gone: Callable[[], bool], *, chunk_size: int = 32) -> ActorStats:
    """One actor: act in its own env with the newest broadcast policy and send experiences.

    Loop, per env step:

    1. take every pending message (non-blocking); the newest :class:`PolicyBroadcast` replaces
       the parameters (after the steps taken with the old ones are sent); :class:`Shutdown`
       ends the actor;
    2. while it holds no policy yet, or producing one more step would put it more than
       ``config.lead_limit`` steps ahead of ``version * broadcast_every * n_steps`` (the rows the
       learner provably consumed), send the unsent steps and wait for a newer broadcast;
    3. sample the action with its own ``np.random.Generator`` (seeded ``seed + 1 + agent_id``);
       step the env; reset it when the episode ended (the reset observation travels with the
       step as ``reset_observation``);
    4. every ``chunk_size`` steps (and before waiting or switching parameters) send the unsent
       steps as one :class:`ExperienceBatch`; their ``log_probs`` and ``values`` are computed
       then, in one batched pass with the parameters that chose the actions (the same
       quantities as at acting time, up to BLAS rounding; as the synchronous collector does).

    Args:
        agent_id: this actor's column in the learner's buffer, in ``[0, num_actors)``.
        env: gymnasium id or zero-argument env factory; the env is reset with
            ``seed = config.seed + 1 + agent_id``.
        config: the loop's configuration (network settings from ``config.ppo``).
        send: puts one message on the learner's queue.
        receive: ``receive(timeout_seconds)`` -> the next learner message or ``None`` (0 means
            do not wait).
        learner_gone: returns True once the learner can no longer read (then the actor stops).
        chunk_size: steps per :class:`ExperienceBatch` message (>= 1).

    Returns:
        :class:`ActorStats`.
    """
    from ppo_ref.checkpoint import arrays_from_bytes

    chunk_size = _check_int(chunk_size, "chunk_size", 1)
    actor_seed = config.seed + 1 + agent_id
    rng = np.random.default_rng(actor_seed)
    env_obj = _make_env(env)
    try:
        policy = _ActorPolicy(env_obj, config.ppo)
        obs, _ = env_obj.reset(seed=actor_seed)
        obs = policy.observation(obs)
        version = -1
        broadcasts = steps = episodes = 0
        budget = config.steps_per_broadcast
        lead = config.lead_limit
        # Unsent steps, one list per field (all acted with `version`): observation, action,
        # reward, next_observation, terminated, truncated, and the observation acted from next
        # (the reset one where the episode ended).
        columns: Tuple[list, ...] = ([], [], [], [], [], [], [])

        def flush():
            if columns[0]:
                observations = np.array(columns[0])
                actions = np.array(columns[1])
                log_probs, values = policy.evaluate(observations, actions)
                k = len(columns[0])
                send(ExperienceBatch(agent_id, observations, actions,
                                     np.array(columns[2], dtype=np.float64), np.array(columns[3]),
                                     np.array(columns[4], dtype=bool),
                                     np.array(columns[5], dtype=bool), values, log_probs,
                                     np.full(k, version, dtype=np.int64),
                                     np.array(columns[6])))
                for column in columns:
                    column.clear()

        def stats() -> ActorStats:
            return ActorStats(agent_id, steps, episodes, broadcasts, version)

        newest: Optional[PolicyBroadcast] = None
        while True:
            # 1. newest pending broadcast; 2. wait while over budget or without a policy.
            waiting = False
            while True:
                msg = receive(POLL_SECONDS if waiting else 0.0)
                if msg is None:
                    if newest is not None:
                        flush()                     # steps of the old version go first
                        policy.set_params(arrays_from_bytes(newest.payload,
                                                            source="PolicyBroadcast"))
                        version = newest.version
                        newest = None
                    if version >= 0 and steps - version * budget < lead:
                        break
                    if not waiting:
                        flush()
                        waiting = True
                    elif learner_gone():
                        flush()
                        return stats()
                    continue
                if isinstance(msg, Shutdown):
                    flush()
                    return stats()
                if isinstance(msg, PolicyBroadcast):
                    broadcasts += 1
                    if msg.version > max(version, -1 if newest is None else newest.version):
                        newest = msg
                    continue
                raise ActorLearnerError(f"actor {agent_id} received an unexpected message "
                                        f"{type(msg).__name__}")
            # 3. act and step.
            action, env_action = policy.act(obs, rng)
            next_obs, reward, terminated, truncated, _ = env_obj.step(env_action)
            next_obs = policy.observation(next_obs)
            for column, value in zip(columns, (obs, action, float(reward), next_obs,
                                               bool(terminated), bool(truncated))):
                column.append(value)
            steps += 1
            if terminated or truncated:
                episodes += 1
                obs, _ = env_obj.reset()
                obs = policy.observation(obs)
            else:
                obs = next_obs
            columns[6].append(obs)
            # 4. send in chunks.
            if len(columns[0]) >= chunk_size:
                flush()
    finally:
        env_obj.close()


def _report_actor(actor_fn, agent_id, env, config, send, receive, learner_gone, chunk_size):
    """Run ``actor_fn`` and always tell the learner how it ended (finished or failed)."""
    try:
        stats = actor_fn(agent_id, env, config, send, receive, learner_gone,
                         chunk_size=chunk_size)
    except BaseException as exc:  # noqa: BLE001  (the learner must hear about everything)
        try:
            send(ActorFailed(agent_id, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except Exception:  # noqa: BLE001  (the queue is gone: the liveness check reports it)
            pass
        return
    send(ActorFinished(agent_id, stats))


def _queue_receiver(broadcast_queue):
    """``receive(timeout)`` for an actor: the next message of its broadcast queue, waiting up to
    ``timeout`` seconds (not at all for 0), or None. Works for ``queue.Queue`` and
    ``multiprocessing.Queue`` alike."""
    def receive(timeout: float):
        try:
            if timeout > 0:
                return broadcast_queue.get(timeout=timeout)
            return broadcast_queue.get_nowait()
        except queue_module.Empty:
            return None
    return receive


def _process_actor_main(actor_fn, agent_id, env, config, experience_writer, broadcast_queue,
                        chunk_size):
    """Entry point of an actor process (spawn start method: everything here is picklable).

    Experiences go through this actor's own pipe (``experience_writer.send``: no feeder thread,
    no lock shared with other actors, so an actor that dies mid-write harms nobody else and the
    learner sees end-of-file); a learner that is gone makes ``send`` raise, which ends the actor.
    """
    import signal

    from ppo_ref.ppo import limit_blas_threads

    from ppo_ref._lifeline import exit_with_parent

    # A learner killed without shutting its actors down takes them with it, even while an
    # actor is blocked inside env.step.
    exit_with_parent()
    # Ctrl-C belongs to the learner, which shuts the actors down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One observation per forward pass: BLAS threads would only compete for the cores.
    limit_blas_threads(1)
    parent = multiprocessing.parent_process()

    def learner_gone() -> bool:
        return parent is not None and not parent.is_alive()

    try:
        _report_actor(actor_fn, agent_id, env, config, experience_writer.send,
                      _queue_receiver(broadcast_queue), learner_gone, chunk_size)
    finally:
        experience_writer.close()


def _thread_actor_main(actor_fn, agent_id, env, config, experience_queue, broadcast_queue,
                       chunk_size, stop_event):
    """Entry point of an actor thread."""
    main_thread = threading.main_thread()

    def learner_gone() -> bool:
        return stop_event.is_set() or not main_thread.is_alive()

    _report_actor(actor_fn, agent_id, env, config, experience_queue.put,
                  _queue_receiver(broadcast_queue), learner_gone, chunk_size)


class ActorGroup:
    """Handles of running actors (threads or processes) and the channels between them and the
    learner. Made by :func:`start_actors`; consumed by :func:`learner_loop`.

    Actor -> learner: actor threads put on one ``queue.Queue`` (the inbox); actor processes
    each write their own pipe, which a reader thread of the learner process drains into the
    inbox as messages arrive, so a pipe never fills up (and never blocks its actor) while the
    learner is busy training. Learner -> actor: one queue per actor (``broadcast_queues``).

    ``get(timeout)`` returns the next message for the learner (``None`` on timeout);
    ``send(agent_id, msg)`` and ``broadcast(msg)`` write to actors; ``is_alive(agent_id)`` and
    ``exit_description`` report liveness; :meth:`shutdown` stops and joins everything
    (idempotent) and returns the last message each actor sent about itself
    (:class:`ActorFinished` or :class:`ActorFailed`).
    """

    def __init__(self, backend: str, workers: list, inbox: "queue_module.Queue",
                 broadcast_queues: list, stop_event: Optional[threading.Event] = None,
                 readers: Sequence = ()):
        self.backend = backend
        self.workers = workers
        self.inbox = inbox
        self.broadcast_queues = broadcast_queues
        self.readers = list(readers)
        self._stop_event = stop_event
        self._closed = False
        self._reader_done = [False] * len(self.readers)
        self._pump_stop = threading.Event()
        self._pump: Optional[threading.Thread] = None
        self.final_messages: Dict[int, Any] = {}
        if self.readers:
            self._pump = threading.Thread(target=self._read_pipes, name="ppo_ref-learner-inbox",
                                          daemon=True)
            self._pump.start()

    @property
    def num_actors(self) -> int:
        return len(self.workers)

    def get(self, timeout: float):
        """Next message for the learner, or ``None`` after ``timeout`` seconds (0: no wait)."""
        try:
            if timeout > 0:
                return self.inbox.get(timeout=timeout)
            return self.inbox.get_nowait()
        except queue_module.Empty:
            return None

    def _read_pipes(self) -> None:
        """Reader thread (process backend): move every message from the actors' pipes to the
        inbox, in arrival order per actor, until every pipe reached end-of-file or shutdown."""
        from multiprocessing.connection import wait
        index = {id(conn): i for i, conn in enumerate(self.readers)}
        while not self._pump_stop.is_set():
            open_readers = [c for i, c in enumerate(self.readers) if not self._reader_done[i]]
            if not open_readers:
                return
            for conn in wait(open_readers, POLL_SECONDS):
                i = index[id(conn)]
                try:
                    self.inbox.put(conn.recv())
                except (EOFError, OSError):
                    self._reader_done[i] = True     # the actor closed its end or died

    def channel_finished(self, agent_id: int) -> bool:
        """True when everything the actor sent is in the inbox (process backend: its pipe
        reached end-of-file). Always False for threads (one shared queue)."""
        return bool(self.readers) and self._reader_done[agent_id]

    def send(self, agent_id: int, message) -> None:
        self.broadcast_queues[agent_id].put(message)

    def broadcast(self, message) -> None:
        """Send ``message`` to every actor that is still alive."""
        for agent_id in range(self.num_actors):
            if self.is_alive(agent_id):
                self.send(agent_id, message)

    def is_alive(self, agent_id: int) -> bool:
        return self.workers[agent_id].is_alive()

    def exit_description(self, agent_id: int) -> str:
        worker = self.workers[agent_id]
        if self.backend == "process":
            text = f"process {worker.pid} exited with code {worker.exitcode}"
            if worker.exitcode == 1:
                text += (" (code 1 before the actor could report anything: usually its imports "
                         "or the unpickling of its arguments failed; its traceback went to "
                         "stderr. The process backend starts actors with 'spawn', which "
                         "re-imports the main script: a script must start the learner under "
                         "`if __name__ == \"__main__\":`)")
            return text
        return f"thread {worker.name} ended"

    def shutdown(self, timeout: float = 10.0) -> Dict[int, Any]:
        """Send :class:`Shutdown` to all, keep reading while they exit, terminate (processes)
        whatever still runs after ``timeout`` seconds, join, close the channels."""
        if self._closed:
            return self.final_messages
        self._closed = True
        for agent_id in range(self.num_actors):
            try:
                self.send(agent_id, Shutdown())
            except Exception:  # noqa: BLE001  (a closed queue: the actor is gone anyway)
                pass
        deadline = time.monotonic() + timeout
        while any(w.is_alive() for w in self.workers) and time.monotonic() < deadline:
            self._keep_final(self.get(0.02))
        if self._stop_event is not None:
            self._stop_event.set()
        started = [w for w in self.workers if w.ident is not None]
        if self.backend == "process":
            # all at once: the time to stop N stuck actors does not grow with N
            for worker in started:
                if worker.is_alive():
                    worker.terminate()
            _join_all(started, 1.0)
            for worker in started:
                if worker.is_alive():
                    worker.kill()
            _join_all(started, 1.0)
        else:
            # A thread cannot be killed: one stuck inside env.step stays behind as a daemon.
            for worker in started:
                worker.join(max(0.0, deadline - time.monotonic()) + 0.5)
        while True:
            msg = self.get(0.0)
            if msg is None:
                break
            self._keep_final(msg)
        if self._pump is not None:
            self._pump_stop.set()
            self._pump.join(2.0)
        while True:
            msg = self.get(0.0)
            if msg is None:
                break
            self._keep_final(msg)
        if self.backend == "process":
            for q in self.broadcast_queues:
                q.cancel_join_thread()      # an actor that died cannot drain its queue
                q.close()
            for conn in self.readers:
                conn.close()
        return self.final_messages

    def _keep_final(self, msg) -> None:
        if isinstance(msg, (ActorFinished, ActorFailed)):
            self.final_messages[msg.agent_id] = msg


def _join_all(processes, timeout: float) -> None:
    """Join every process, waiting at most ``timeout`` seconds in total."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


def start_actors(config: AsyncActorLearnerConfig, env, *, actor_fn: Callable = run_actor,
                 chunk_size: int = 32, start_method: str = "spawn") -> ActorGroup:
    """Start ``config.num_actors`` actors on ``config.backend`` and return their handles.

    Each actor runs ``actor_fn(agent_id, env, config, send, receive, learner_gone,
    chunk_size=...)`` (default :func:`run_actor`); it waits for the learner's version-0
    broadcast before its first step. With the process backend ``env`` and ``actor_fn`` must be
    picklable (a gymnasium id, a module-level factory or ``functools.partial``).

    Args:
        config: the loop's configuration.
        env: gymnasium id string or zero-argument env factory.
        actor_fn: the actor body (tests substitute misbehaving actors).
        chunk_size: experiences per message.
        start_method: ``multiprocessing`` start method for the process backend ("spawn" or
            "forkserver"; fork is refused: it would copy the learner's threads and locks).

    Returns:
        :class:`ActorGroup`; stop it with :meth:`ActorGroup.shutdown` (``learner_loop`` does).
    """
    _check_int(chunk_size, "chunk_size", 1)
    check_choice(start_method, "start_method", ("spawn", "forkserver"))
    inbox: queue_module.Queue = queue_module.Queue()
    if config.backend == "process":
        ctx = multiprocessing.get_context(start_method)
        pipes = [ctx.Pipe(duplex=False) for _ in range(config.num_actors)]
        broadcast_queues = [ctx.Queue() for _ in range(config.num_actors)]
        workers = [ctx.Process(target=_process_actor_main, name=f"ppo_ref-actor-{i}",
                               args=(actor_fn, i, env, config, pipes[i][1],
                                     broadcast_queues[i], chunk_size), daemon=True)
                   for i in range(config.num_actors)]
        stop_event = None
    else:
        pipes = []
        broadcast_queues = [queue_module.Queue() for _ in range(config.num_actors)]
        stop_event = threading.Event()
        workers = [threading.Thread(target=_thread_actor_main, name=f"ppo_ref-actor-{i}",
                                    args=(actor_fn, i, env, config, inbox,
                                          broadcast_queues[i], chunk_size, stop_event),
                                    daemon=True)
                   for i in range(config.num_actors)]
    group = ActorGroup(config.backend, workers, inbox, broadcast_queues, stop_event,
                       readers=[reader for reader, _ in pipes])
    try:
        for worker in workers:
            worker.start()
    except BaseException:
        group.shutdown(timeout=1.0)
        raise
    finally:
        # The children hold the write ends now; closing ours lets a dead actor's pipe report
        # end-of-file instead of staying open forever.
        for _, writer in pipes:
            writer.close()
    return group


# --------------------------------------------------------------------------------------------
# Learner
# --------------------------------------------------------------------------------------------

class ExperienceError(ActorLearnerError, ValueError):
    """An experience that cannot be placed in the buffer (bad agent_id, shape, values, order)."""


class UpdateInfo(NamedTuple):
    """What :func:`learner_loop` passes to its callback after every update.

    ``rollout`` is the ``[n_steps, num_actors]`` buffer the update trained on (column =
    agent_id), ``advantages``/``returns`` what it trained with, ``policy_versions`` ``[n_steps,
    num_actors]`` the version each row was acted with, ``version`` the learner's version while
    the buffer was consumed (lag = ``version - policy_versions``), ``stats`` the trainer's
    update statistics; ``episode_returns``/``episode_lengths`` the episodes completed in this
    buffer (consumption order: row by row, columns in agent order).
    """

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
    """Summary of a :func:`learner_loop` run.

    ``broadcasts`` counts every policy broadcast round including the initial version 0, so
    ``broadcasts = last_version + 1``. ``policy_lag_mean``/``policy_lag_max`` have one entry per
    update (version - experience.policy_version over the buffer). ``actor_stats`` holds each
    actor's :class:`ActorStats` (None for an actor that did not report). ``stopped_early``: the
    callback returned False before ``config.num_updates`` updates. ``actor_errors``: actors
    that failed after the learner already held every experience it needed (id -> exception
    text); such a failure cannot stop the run, so it is reported here.
    """

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

    __slots__ = ("agent_id", "chunks", "offset", "count")

    def __init__(self, agent_id: int):
        self.agent_id = agent_id
        self.chunks: deque = deque()
        self.offset = 0          # rows of chunks[0] already taken
        self.count = 0           # rows available

    def push(self, batch: ExperienceBatch) -> None:
        if batch.reset_observations is None:    # no episode ended in it: acts on from the next
            batch = ExperienceBatch(*tuple(batch)[:-1], batch.next_observations)
        if len(batch):
            self.chunks.append(batch)
            self.count += len(batch)

    def take(self, n: int) -> ExperienceBatch:
        """Remove and return the oldest ``n`` rows (requires ``count >= n``)."""
        parts = []
        need = n
        while need:
            head = self.chunks[0]
            available = len(head) - self.offset
            k = min(need, available)
            parts.append(tuple(f[self.offset:self.offset + k] for f in head[1:]))
            need -= k
            if k == available:
                self.chunks.popleft()
                self.offset = 0
            else:
                self.offset += k
        self.count -= n
        fields = [np.concatenate(cols) if len(parts) > 1 else cols[0] for cols in zip(*parts)]
        return ExperienceBatch(self.agent_id, *fields)


def _check_experience_batch(batch: ExperienceBatch, num_actors: int, obs_shape: tuple,
                            action_shape: tuple, discrete: bool, version: int) -> ExperienceBatch:
    """Validate and normalise a message from an actor; raise :class:`ExperienceError` naming
    the field."""
    agent_id = batch.agent_id
    if isinstance(agent_id, (bool, np.bool_)) or not isinstance(agent_id, (int, np.integer)):
        raise ExperienceError(f"Experience.agent_id must be an integer, got {agent_id!r}")
    if not 0 <= agent_id < num_actors:
        raise ExperienceError(f"Experience.agent_id must be in [0, {num_actors}), got {agent_id}")
    agent_id = int(agent_id)
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
        # what the actor acts from next: the reset observation where the episode ended
        resets = np.where(ended.reshape((k,) + (1,) * len(obs_shape)), resets, next_observations)
    return ExperienceBatch(agent_id, observations, actions, rewards, next_observations,
                           terminated, truncated, values, log_probs,
                           versions.astype(np.int64, copy=False), resets)


class _ActorPolicy:
    """An actor's view of :class:`ppo_ref.policies.MLPPolicy`: one observation at a time,
    parameters fixed between broadcasts (checked once, by ``MLPPolicy.policy_out_fn``)."""

    def __init__(self, env, ppo_config: PPOConfig):
        from ppo_ref.policies import make_mlp_policy
        self.policy = make_mlp_policy(env.observation_space, env.action_space, ppo_config)
        self.params = None
        self._policy_out = None

    def set_params(self, params) -> None:
        """Install broadcast parameters (in the policy's one-buffer layout, its fast path)."""
        self.params = self.policy.as_flat(params)
        self._policy_out = self.policy.policy_out_fn(self.params)

    def observation(self, obs) -> np.ndarray:
        """A float64 copy (envs may reuse and mutate their observation buffer)."""
        return np.array(obs, dtype=np.float64, copy=True)

    def act(self, obs: np.ndarray, rng: np.random.Generator):
        """``(action, env_action)`` for one observation: the action as stored (int64 or the raw
        Gaussian sample) and as the env receives it (clipped); policy tower only."""
        head = self.policy.head
        actions = head.sample(rng, self._policy_out(obs.reshape(1, -1)), self.params)
        return actions[0], head.to_env(actions)[0]

    def evaluate(self, observations: np.ndarray, actions: np.ndarray):
        """``(log_probs [k], values [k])`` of taken actions under the current parameters."""
        ev = self.policy.evaluate(self.params, observations.reshape(len(observations), -1),
                                  actions)
        return ev.log_probs, ev.values


#: Seconds between liveness checks of the actors while the learner waits or reads.
LIVENESS_SECONDS = 0.5
#: Seconds the learner keeps reading after finding a dead actor, for its exception text.
DEATH_NOTICE_SECONDS = 1.0
#: Seconds actors get to exit by themselves after a failure before they are terminated.
ERROR_SHUTDOWN_SECONDS = 0.25
#: The promise these constants keep: an actor that dies (even by SIGKILL) while the learner
#: waits for experience is reported as ActorDiedError within this many seconds, whatever the
#: number of actors: found by the next liveness check (LIVENESS_SECONDS), its last words read
#: until its pipe reaches end-of-file (immediate for a killed process), then the others stopped
#: (ERROR_SHUTDOWN_SECONDS plus a terminate that does not wait actor by actor).
ACTOR_DEATH_SECONDS = 2.0


class _Learner:
    """State of one :func:`learner_loop` run (FIFOs, carries, counters)."""

    def __init__(self, config: AsyncActorLearnerConfig, trainer, group: ActorGroup, callback):
        self.config = config
        self.trainer = trainer
        self.group = group
        self.callback = callback
        policy = trainer.policy
        self.policy = policy
        self.obs_shape = tuple(policy.obs_shape)
        self.action_shape = tuple(policy.head.action_shape)
        self.discrete = policy.head.action_dtype.kind == "i"  # categorical heads: int actions
        n = config.num_actors
        self.fifos = [_ActorFifo(i) for i in range(n)]
        self.version = 0
        self.report = LearnerReport()
        self.episode_start_carry = np.ones(n, dtype=bool)      # the first step starts an episode
        # [N, *obs_shape]: what each actor acts from after the last consumed row
        self.observations_after: Optional[np.ndarray] = None
        # the unfinished episodes' running return and length (finished_episodes)
        self.episode_return = np.zeros(n, dtype=np.float64)
        self.episode_length = np.zeros(n, dtype=np.int64)
        self.t0 = time.monotonic()

    # -- messages -----------------------------------------------------------------------------
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
            while True:                # what was read before end-of-file was seen
                msg = self.group.get(0.0)
                if msg is None:
                    break
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

    # -- one update ---------------------------------------------------------------------------
    def take_buffer(self) -> ExperienceBatch:
        """The next ``[n_steps, num_actors]`` buffer (fields stacked along axis 1)."""
        cols = [fifo.take(self.config.n_steps) for fifo in self.fifos]
        return ExperienceBatch(-1, *(np.stack(f, axis=1) for f in list(zip(*cols))[1:]))

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
        """The buffer as the :class:`~ppo_ref.rollout.Rollout` the synchronous collector would
        have recorded for the same transitions (:func:`ppo_ref.rollout.rollout_from_transitions`:
        its ``episode_starts``, ``final_values`` and ``last_values`` under the learner's current
        parameters; the actors' behaviour ``values`` and ``log_probs``; the episodes finished in
        it), counted by the trainer (:meth:`~ppo_ref.ppo.PPOTrainer.record_rollout`)."""
        from ppo_ref.kernels import episode_starts as make_episode_starts
        from ppo_ref.rollout import finished_episodes, rollout_from_transitions

        self.check_continuity(buf)
        terminated, truncated = buf.terminated, buf.truncated
        starts = make_episode_starts(terminated, truncated, self.episode_start_carry)
        done = terminated | truncated
        self.episode_start_carry = done[-1].copy()
        self.observations_after = buf.reset_observations[-1]
        rollout = rollout_from_transitions(
            self.policy, self.trainer.params, observations=buf.observations,
            actions=buf.actions, rewards=buf.rewards, terminated=terminated,
            truncated=truncated, episode_starts=starts, values=buf.values,
            log_probs=buf.log_probs, next_observations=buf.next_observations,
            observations_after=self.observations_after)
        (rollout.episode_returns, rollout.episode_lengths,
         rollout.episode_envs) = finished_episodes(buf.rewards, done, self.episode_return,
                                                   self.episode_length)
        return self.trainer.record_rollout(rollout)

    def update(self) -> UpdateInfo:
        """One PPO update on the next buffer: :meth:`~ppo_ref.ppo.PPOTrainer.iteration` of the
        trainer with :meth:`rollout` as its rollout source (GAE, or V-trace against the current
        parameters with ``use_vtrace``)."""
        config = self.config
        trainer = self.trainer
        buf = self.take_buffer()
        advantages_fn = None    # the trainer's GAE
        if config.use_vtrace:
            advantages_fn = functools.partial(trainer.compute_vtrace_advantages,
                                              rho_bar=config.rho_bar, c_bar=config.c_bar)
        step = trainer.iteration(lambda: self.rollout(buf), advantages_fn)
        rollout, stats = step.rollout, step.stats
        lags = self.version - buf.policy_versions
        n_steps, n = buf.rewards.shape
        r = self.report
        r.updates += 1
        r.env_steps += n_steps * n
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
        from ppo_ref.checkpoint import arrays_to_bytes

        if self.report.broadcasts:
            self.version += 1
        payload = arrays_to_bytes(self.trainer.params)
        self.group.broadcast(PolicyBroadcast(self.version, payload))
        self.report.broadcasts += 1
        self.report.last_version = self.version

    def run(self) -> LearnerReport:
        # The schedules' horizon: the steps this run will consume (SB3's progress_remaining
        # then reaches 0 on the last update, as in PPOTrainer.learn when total is a multiple).
        c = self.config
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
                 shutdown_timeout: float = 10.0, chunk_size: int = 32):
    """Run the learner of docs/specification.md §6 until ``config.num_updates`` PPO updates are done.

    1. Broadcast version 0 (the trainer's current parameters) to every actor.
    2. Read messages into one FIFO per actor until every FIFO holds ``n_steps`` experiences
       (validating each: ``agent_id`` in ``[0, num_actors)``, shapes, finiteness, versions).
    3. Take the oldest ``n_steps`` of each FIFO into a ``[n_steps, num_actors]`` buffer
       (column = ``agent_id``; later experiences stay queued). ``episode_starts`` continue from
       the previous buffer (all True at first); each row must continue from the previous row's
       ``next_observation``, or its ``reset_observation`` where an episode ended (a check
       against reordering or loss).
    4. The buffer becomes the :class:`~ppo_ref.rollout.Rollout` the synchronous collector
       records for the same transitions (:func:`ppo_ref.rollout.rollout_from_transitions`),
       bootstrapped with the learner's current values: ``last_values[n] = V(the observation
       actor n acts from after the last row)`` (its ``reset_observation`` where that row ended
       an episode, as the collector's observation after the autoreset) and ``final_values[t,
       n] = V(next_observation[t, n])`` where step t truncated without terminating; its
       finished episodes by :func:`ppo_ref.rollout.finished_episodes`.
    5. One :meth:`PPOTrainer.iteration <ppo_ref.ppo.PPOTrainer.iteration>` on that rollout,
       exactly as ``PPOTrainer.learn`` runs one: counters (``num_timesteps``, ``n_episodes``,
       ``recent_returns``, ``last_episodes``; ``progress_remaining`` before or after the
       rollout as ``schedule_progress`` says, with the schedule horizon ``total_timesteps`` =
       the steps this run consumes, ``num_updates * n_steps * num_actors``); advantages by
       ``trainer.compute_advantages`` (GAE with the recorded behaviour values) or, with
       ``use_vtrace``, ``trainer.compute_vtrace_advantages`` (:func:`ppo_ref.kernels.vtrace`
       against the learner's current policy, IMPALA; the same bootstrap values);
       ``trainer.train_on`` (the PPO ratio is pi_learner / mu_actor; the recorded ``values``
       are the old values of value clipping and explained variance); ``n_updates += 1``.
    7. After every ``broadcast_every`` updates: version + 1, its parameters to every actor.
    8. At the end (or on any error): :class:`Shutdown` to every actor, join (processes that do
       not exit within ``shutdown_timeout`` seconds are terminated), then return or re-raise.

    Args:
        config: :class:`AsyncActorLearnerConfig`.
        trainer: a :class:`~ppo_ref.ppo.PPOTrainer` whose ``config`` holds the learner's PPO
            settings (see :func:`make_learner`); its parameters are updated in place.
        actors: an :class:`ActorGroup` from :func:`start_actors` (the loop shuts it down), or a
            gymnasium id / zero-argument env factory, from which the loop starts
            ``config.num_actors`` actors itself with ``chunk_size``.
        callback: called with an :class:`UpdateInfo` after every update; returning ``False``
            stops the loop after that update (then the usual shutdown).
        shutdown_timeout: seconds to wait for actors to exit before terminating them.

    Returns:
        ``(trainer, LearnerReport)``.

    Raises:
        StarvationError: no experience for ``config.starvation_timeout`` seconds.
        ActorDiedError: an actor raised or exited (its id, exception text and traceback).
        ExperienceError: (a ``ValueError``) an experience with a bad field, named.
        ValueError: ``actors`` of the wrong size.
    """
    group = actors if isinstance(actors, ActorGroup) else start_actors(config, actors,
                                                                       chunk_size=chunk_size)
    try:
        if group.num_actors != config.num_actors:
            raise ValueError(f"actors has {group.num_actors} actors, config.num_actors is "
                             f"{config.num_actors}")
        for name in ("gamma", "gae_lambda"):
            if getattr(trainer.config, name) != getattr(config, name):
                raise ValueError(f"trainer.config.{name} ({getattr(trainer.config, name)}) "
                                 f"differs from config.{name} ({getattr(config, name)}): build "
                                 f"the trainer with make_learner(config, env)")
        learner = _Learner(config, trainer, group, callback)
        report = learner.run()
    except BaseException:
        # the run failed: its actors get a short grace period, then are terminated, so the
        # error reaches the caller within ACTOR_DEATH_SECONDS of the failure at any actor count
        group.shutdown(min(shutdown_timeout, ERROR_SHUTDOWN_SECONDS))
        raise
    finals = group.shutdown(shutdown_timeout)
    report.actor_stats = [finals[i].stats if isinstance(finals.get(i), ActorFinished) else None
                          for i in range(config.num_actors)]
    report.actor_errors = {i: m.error for i, m in finals.items() if isinstance(m, ActorFailed)}
    return trainer, report


def make_learner(config: AsyncActorLearnerConfig, env):
    """The learner's :class:`~ppo_ref.ppo.PPOTrainer` for ``env`` (gymnasium id or factory):
    ``config.learner_ppo_config()``, seed ``config.seed``."""
    from ppo_ref.ppo import PPOTrainer
    if not isinstance(env, str):
        # The trainer wants a vector env (it only reads its spaces here: the actors act).
        from gymnasium.vector import AutoresetMode, SyncVectorEnv
        env = SyncVectorEnv([env] * config.num_actors, autoreset_mode=AutoresetMode.SAME_STEP)
    return PPOTrainer(env, config.learner_ppo_config(), seed=config.seed)


def train_async(env, config: AsyncActorLearnerConfig = AsyncActorLearnerConfig(), *,
                callback: Optional[Callable[[UpdateInfo], None]] = None, trainer=None,
                chunk_size: int = 32):
    """Train with the actor-learner loop: :func:`make_learner` (unless ``trainer`` is given),
    :func:`start_actors`, :func:`learner_loop`. Returns ``(trainer, LearnerReport)``."""
    if trainer is None:
        trainer = make_learner(config, env)
    group = start_actors(config, env, chunk_size=chunk_size)
    return learner_loop(config, trainer, group, callback=callback)


# --------------------------------------------------------------------------------------------
# Command line: ppo-ref train --async
# --------------------------------------------------------------------------------------------

MAX_PROCESS_ACTORS_PER_CPU = 16
"""Most actor processes per CPU core :func:`async_config_from_ppo` accepts (a guard against
exhausting memory; each process holds its own interpreter, numpy, numba and env)."""


def async_config_from_ppo(ppo: PPOConfig, *, num_actors: int, total_timesteps: int,
                          use_vtrace: bool = False, broadcast_every: int = 1, seed: int = 0,
                          backend: str = "process") -> AsyncActorLearnerConfig:
    """The actor-learner configuration the CLI derives from a synchronous ``PPOConfig``.

    Each update consumes as many rows as one synchronous update (``ppo.n_steps * ppo.n_envs``),
    split evenly over the actors: ``n_steps = ppo.n_steps * ppo.n_envs // num_actors``;
    ``gamma`` and ``gae_lambda`` are the PPOConfig's. So ``ppo-ref train --async`` on
    CartPole-v1 (zoo settings: 8 envs x 32 steps) with 4 actors takes 64 steps per actor per
    update, the same 256-row batch.

    Raises:
        ValueError: ``num_actors`` < 1, or not a divisor of ``ppo.n_steps * ppo.n_envs`` (the
            batch would change size), or, with the process backend, more than
            :data:`MAX_PROCESS_ACTORS_PER_CPU` per CPU core (every actor is a Python process
            holding numpy, numba and its env: hundreds of them exhaust memory).
    """
    num_actors = _check_int(num_actors, "num_actors", 1)
    rows = ppo.n_steps * ppo.n_envs
    if rows % num_actors:
        valid = [k for k in range(1, rows + 1) if rows % k == 0]
        raise ValueError(f"num_actors ({num_actors}) must divide the rows of one update "
                         f"(n_steps * n_envs = {rows}), so every actor contributes the same "
                         f"number of steps: one of {valid}")
    cpus = os.cpu_count() or 1
    if backend == "process" and num_actors > MAX_PROCESS_ACTORS_PER_CPU * cpus:
        raise ValueError(f"num_actors ({num_actors}) is more than {MAX_PROCESS_ACTORS_PER_CPU} "
                         f"actor processes per CPU core ({cpus} cores here); use fewer actors "
                         f"or the thread backend")
    n_steps = rows // num_actors
    return AsyncActorLearnerConfig(num_actors=num_actors, n_steps=n_steps,
                                   total_timesteps=int(total_timesteps),
                                   broadcast_every=int(broadcast_every), gamma=ppo.gamma,
                                   gae_lambda=ppo.gae_lambda, use_vtrace=bool(use_vtrace),
                                   seed=int(seed), backend=backend, ppo=ppo)


def cli_train(args, ppo: PPOConfig, run_dir: str) -> int:
    """``ppo-ref train --async``: the actor-learner loop with the CLI's run directory.

    Uses ``args.env``, ``args.total_timesteps``, ``args.num_actors``, ``args.vtrace``,
    ``args.broadcast_every``, ``args.seed``, ``args.progress_every``,
    ``args.checkpoint_every``, ``args.quiet`` (and ``args.actor_backend`` when present, default
    "process"). Writes ``config.json`` (with the actor-learner settings), ``metrics.csv``,
    ``timing.csv``, ``episodes.csv`` (``env`` = agent id) and ``checkpoint.npz`` (a
    :class:`~ppo_ref.ppo.PPOTrainer` checkpoint: ``ppo-ref eval`` works on it) through
    :class:`ppo_ref.runlog.RunLogger`; the progress line adds the policy lag. First Ctrl-C:
    stop after the current update, checkpoint, exit 130. An actor failure or starvation:
    checkpoint of the last completed update, exit 3.
    """
    import json
    import sys

    from ppo_ref.cli import (DEFAULT_ENV, DEFAULT_TIMESTEPS, UsageError, _rollout_note,
                             _SigintStopper, user_input)

    env_id = args.env or DEFAULT_ENV
    total = args.total_timesteps if args.total_timesteps is not None else DEFAULT_TIMESTEPS
    try:
        with user_input("--async"):
            config = async_config_from_ppo(
                ppo, num_actors=args.num_actors, total_timesteps=total, use_vtrace=args.vtrace,
                broadcast_every=args.broadcast_every, seed=args.seed,
                backend=getattr(args, "actor_backend", "process"))
    except UsageError:
        if os.path.isdir(run_dir) and not os.listdir(run_dir):
            os.rmdir(run_dir)           # nothing was written: leave no empty run directory
        raise
    trainer = make_learner(config, env_id)
    run_info = {"trainer": type(trainer).__name__, "policy": "mlp", "mode": "async",
                "env_id": env_id, "seed": args.seed, "total_timesteps": total,
                "actor_learner": config.to_dict(), "config": trainer.config.to_dict(),
                "argv": getattr(args, "argv", sys.argv[1:])}
    logger = _async_run_logger(run_dir, json.loads(json.dumps(run_info)),
                               progress_every=args.progress_every,
                               checkpoint_every=args.checkpoint_every, quiet=args.quiet)
    print(f"ppo-ref: training mlp on {env_id} with {config.num_actors} {config.backend} actors "
          f"({config.n_steps} steps each per update, "
          f"{'V-trace' if config.use_vtrace else 'GAE'}, broadcast every "
          f"{config.broadcast_every}) for {total} steps (seed {args.seed}) -> {run_dir}")
    # the learner's config has n_envs = num_actors and the per-actor n_steps of an update
    _rollout_note(trainer.config, 0, total, unit="update", factors="num_actors*n_steps")

    def on_update(info: UpdateInfo):
        stats = dict(info.stats)
        stats.update({"fps": info.env_steps / max(info.wall_seconds, 1e-12),
                      "progress_remaining": trainer.progress_remaining})
        logger.lag = (info.policy_lag_mean, info.policy_lag_max)
        return logger.callback(trainer, stats)

    try:
        logger.begin(trainer)
        try:
            with _SigintStopper(logger):
                _, report = learner_loop(config, trainer, env_id, callback=on_update)
        except ActorLearnerError as exc:
            path = logger.save_last_good(trainer)
            where = f"saved the last good checkpoint to {path}" if path else "nothing saved"
            print(f"ppo-ref: actor-learner error: {exc}\nppo-ref: {where}", file=sys.stderr)
            return 3
        except KeyboardInterrupt:
            path = logger.save_last_good(trainer)
            print(f"\nppo-ref: interrupted; checkpoint of the last completed update: {path}",
                  file=sys.stderr)
            return 130
        logger.save(trainer)
        if report.stopped_early:
            print(f"ppo-ref: stopped at {trainer.num_timesteps} steps", file=sys.stderr)
            return 130
        lags = report.policy_lag_mean
        logger.finish(trainer, f"{report.steps_per_second:.0f} steps/s, policy lag mean "
                               f"{(sum(lags) / len(lags)) if lags else float('nan'):.2f} max "
                               f"{max(report.policy_lag_max, default=0)}, {report.broadcasts} "
                               f"broadcasts")
        return 0
    finally:
        logger.close()
        trainer.close()


def _async_run_logger(*args, **kwargs):
    """A :class:`ppo_ref.runlog.RunLogger` whose progress line ends with the policy lag of the
    last update (``logger.lag = (mean, max)``, set by the caller before each callback)."""
    from ppo_ref.runlog import RunLogger

    class AsyncRunLogger(RunLogger):
        """RunLogger whose progress line also shows the policy lag of the last update."""

        lag = (float("nan"), 0)

        def progress(self, trainer, stats=None) -> None:
            if self.quiet:
                return
            import io
            buffer = io.StringIO()
            stream, self.stream = self.stream, buffer
            try:
                super().progress(trainer, stats)
            finally:
                self.stream = stream
            print(f"{buffer.getvalue().rstrip()} | lag mean {self.lag[0]:.2f} max {self.lag[1]}",
                  file=self.stream, flush=True)

    return AsyncRunLogger(*args, **kwargs)
