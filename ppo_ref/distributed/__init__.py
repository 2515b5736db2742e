"""Asynchronous actor-learner PPO, the Python counterpart of thrust-rl's ``learner_loop`` /
``actor_thread`` (the data flow, flow control, resume and failure guarantees:
docs/specification.md §6): :mod:`~ppo_ref.distributed.config` (settings),
:mod:`~ppo_ref.distributed.messages` (messages, errors), :mod:`~ppo_ref.distributed.actor`
(:func:`run_actor`), :mod:`~ppo_ref.distributed.transport` (thread and process actors:
:func:`start_actors`), :mod:`~ppo_ref.distributed.ray_actors` (Ray actors) and
:mod:`~ppo_ref.distributed.learner` (:func:`learner_loop`; the learner is a PPOTrainer)."""
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
