"""Asynchronous actor-learner PPO (docs/specification.md §6), the Python counterpart of
thrust-rl's ``learner_loop`` / ``actor_thread``: :mod:`~ppo_ref.distributed.config` (settings),
:mod:`~ppo_ref.distributed.messages` (messages, errors), :mod:`~ppo_ref.distributed.actor`
(:func:`run_actor`), :mod:`~ppo_ref.distributed.transport` (threads, processes:
:func:`start_actors`), :mod:`~ppo_ref.distributed.ray_actors` (Ray actors) and
:mod:`~ppo_ref.distributed.learner` (:func:`learner_loop`). Builds on :mod:`ppo_ref.train`
(the learner is a PPOTrainer); never imports the command line.

Actor k acts in its own env with its own policy copy and RNG and sends ``Experience(agent_id=k,
..., policy_version=v)`` to FIFO k of the learner; when every FIFO holds ``n_steps`` rows the
learner builds a ``[n_steps, num_actors]`` buffer (column = agent_id), turns it into the
collector's Rollout, runs ``trainer.iteration`` (GAE or V-trace) and, every ``broadcast_every``
updates, broadcasts ``PolicyBroadcast(v + 1, payload)``.

* **Budget** (the only flow control): holding version ``v`` proves that ``v * broadcast_every *
  n_steps`` of the actor's steps were consumed; it produces step ``s`` only while ``s - v *
  broadcast_every * n_steps <= max_lead_steps``, else it flushes and waits for a broadcast.
* **Policy lag** of a consumed row: the learner's version minus the version that acted (0 in
  lockstep, ``max_lead_steps = n_steps`` and ``broadcast_every = 1``: on-policy PPO).
* **Nothing is dropped**: rows beyond an update's stay in their FIFO, in order.
* **Failures never hang**: an actor that raised reports its exception, one that died silently is
  found by its liveness, no experience for ``starvation_timeout`` s is a StarvationError; the
  learner then shuts every actor down (terminating or killing them) before it raises.

Actor kinds (``config.actors``): ``"process"`` (spawn; a pipe per actor drained by a reader
thread of the learner, a queue back; the policy travels as the npz bytes of
:func:`ppo_ref.io.checkpoint.arrays_to_bytes`), ``"thread"`` (queues; the same messages) and
``"ray"`` (:mod:`~ppo_ref.distributed.ray_actors`).
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
    "AsyncActorLearnerConfig", "Experience", "ExperienceBatch", "PolicyBroadcast", "Shutdown",
    "ActorFinished", "ActorFailed", "ActorStats", "ActorGroup", "ActorLearnerError",
    "StarvationError", "ActorDiedError", "ExperienceError", "UpdateInfo", "LearnerReport",
    "run_actor", "start_actors", "make_learner", "learner_loop", "train_async",
    "async_config_from_ppo", "resumed_actors_config", "MAX_PROCESS_ACTORS_PER_CPU",
]
