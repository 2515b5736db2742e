"""What actors and the learner send each other and the errors of the actor-learner loop. Every
message is a NamedTuple of plain values, picklable for the process backend."""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np

__all__ = [
    "Experience", "ExperienceBatch", "PolicyBroadcast", "Shutdown", "ActorStats",
    "ActorFinished", "ActorFailed", "ActorLearnerError", "StarvationError", "ActorDiedError",
    "ExperienceError",
]


class Experience(NamedTuple):
    """One env step of one actor (docs/specification.md §6): ``observation`` ``[*obs_shape]``
    float64 (acted from); ``action`` int64 (discrete) or the ``[A]`` float64 raw Gaussian sample;
    ``next_observation`` the real one after the step (before any reset); ``value`` and
    ``log_prob`` (nats) under the parameters of ``policy_version``; ``reset_observation``: where
    the step ended an episode, the first observation of the next one, else None.
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
    """Consecutive experiences of one actor, the fields of :class:`Experience` stacked along a
    leading axis of length k in step order."""

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
    # [k, *obs_shape] float64: the observation acted from next (reset_observation where the
    # step ended an episode, next_observation elsewhere); None when no step ended an episode
    reset_observations: Optional[np.ndarray] = None

    def __len__(self) -> int:  # noqa: D105  (number of steps, not of tuple fields)
        return int(self.rewards.shape[0])

    @classmethod
    def from_experiences(cls, experiences: Sequence[Experience]) -> "ExperienceBatch":
        """Stack experiences of a single actor (``ValueError`` on none or mixed agent ids)."""
        if not experiences:
            raise ValueError("experiences must not be empty")
        agent_id = experiences[0].agent_id
        if any(e.agent_id != agent_id for e in experiences):
            raise ValueError("experiences must all have the same agent_id")
        resets = None
        if any(e.reset_observation is not None for e in experiences):
            resets = np.asarray([e.next_observation if e.reset_observation is None
                                 else e.reset_observation for e in experiences])
        stacked = (np.asarray([getattr(e, name) for e in experiences])
                   for name in Experience._fields[1:-1])  # observation ... policy_version
        return cls(agent_id, *stacked, resets)

    def experiences(self) -> List[Experience]:
        """The individual :class:`Experience` tuples, in order."""
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
    """Learner -> actor: the parameters of ``version`` (0 = initial) as the npz bytes of
    :func:`ppo_ref.io.checkpoint.arrays_to_bytes` (no pickle, bit exact)."""

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


class ActorLearnerError(RuntimeError):
    """Base class of the actor-learner loop's errors."""


class StarvationError(ActorLearnerError):
    """No experience reached the learner for ``starvation_timeout`` seconds."""


class ActorDiedError(ActorLearnerError):
    """An actor raised, exited or was killed while the learner still needed it: one line
    ``actor <id> died: <reason>``; ``actor_traceback`` holds what the actor sent (or "")."""

    def __init__(self, agent_id: int, reason: str, actor_traceback: str = ""):
        self.agent_id = agent_id
        self.reason = reason
        self.actor_traceback = actor_traceback
        super().__init__(f"actor {agent_id} died: {' '.join(str(reason).split())}")


class ExperienceError(ActorLearnerError, ValueError):
    """An experience that cannot be placed in the buffer (bad agent_id, shape, values, order)."""
