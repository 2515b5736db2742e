"""Asynchronous actor-learner PPO (docs/specification.md §6): actors, the learner loop, messages, reports.

Modules, one job each: :mod:`~ppo_ref.distributed.config` (:class:`AsyncActorLearnerConfig`),
:mod:`~ppo_ref.distributed.messages` (what actors and the learner send each other, the errors),
:mod:`~ppo_ref.distributed.actor` (:func:`run_actor`), :mod:`~ppo_ref.distributed.transport`
(threads or processes and their channels: :func:`start_actors`; Ray actors in
:mod:`~ppo_ref.distributed.ray_actors`) and
:mod:`~ppo_ref.distributed.learner` (:func:`learner_loop`). This package builds on
:mod:`ppo_ref.train` (the learner is a PPOTrainer) and never imports the command line.

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
  learner shuts down all actors (terminating processes that do not exit in time, killing Ray
  actors) before it raises.

Actor kinds (``config.actors``, one learner for all: the kind is a transport detail of
:mod:`~ppo_ref.distributed.transport`): ``"process"`` (``multiprocessing`` with the spawn start
method; one process per actor with its own pipe to the learner, drained by a reader thread of
the learner process, and a ``multiprocessing`` queue back; messages are pickled, the policy
itself only ever travels as the bit-exact npz bytes of
:func:`ppo_ref.io.checkpoint.arrays_to_bytes`), ``"thread"`` (threads and ``queue.Queue``; the
same messages, the same payload bytes; the GIL serialises the Python work) or ``"ray"`` (Ray
actors on this machine or a cluster, :mod:`~ppo_ref.distributed.ray_actors`: the learner pulls
each actor's messages and puts each broadcast in the object store once).
"""
from ppo_ref.distributed.actor import run_actor
from ppo_ref.distributed.config import (MAX_PROCESS_ACTORS_PER_CPU, AsyncActorLearnerConfig,
                                        async_config_from_ppo)
from ppo_ref.distributed.learner import (LearnerReport, UpdateInfo, learner_loop, make_learner,
                                         resumed_actors_config, train_async)
from ppo_ref.distributed.messages import (ActorDiedError, ActorFailed, ActorFinished,
                                          ActorLearnerError, ActorStats, Experience,
                                          ExperienceBatch, ExperienceError, PolicyBroadcast,
                                          Shutdown, StarvationError)
from ppo_ref.distributed.transport import ActorGroup, start_actors

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
    "resumed_actors_config",
    "MAX_PROCESS_ACTORS_PER_CPU",
]
