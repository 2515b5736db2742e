"""What actors and the learner send each other (experiences, policy broadcasts, shutdown,
actor reports) and the errors of the actor-learner loop. Every message is a NamedTuple of
plain values, picklable for the process backend."""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np


__all__ = [
    "Experience", "ExperienceBatch", "PolicyBroadcast", "Shutdown", "ActorStats",
    "ActorFinished", "ActorFailed", "ActorLearnerError", "StarvationError", "ActorDiedError",
    "ExperienceError",
]


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

    ``payload`` is :func:`ppo_ref.io.checkpoint.arrays_to_bytes` of the parameter dict: npz bytes,
    no pickle, a bit-exact round trip through :func:`~ppo_ref.io.checkpoint.arrays_from_bytes`.
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


# Errors

class ActorLearnerError(RuntimeError):
    """Base class of the actor-learner loop's errors."""


class StarvationError(ActorLearnerError):
    """No experience reached the learner for ``starvation_timeout`` seconds."""


class ActorDiedError(ActorLearnerError):
    """An actor raised, exited or was killed while the learner still needed it.

    ``agent_id`` is the actor's id, ``reason`` its exception text (or exit code) and
    ``actor_traceback`` the traceback the actor sent (empty when it died without a word). The
    message is one line, ``actor <id> died: <reason>``; the traceback stays in the attribute
    (``ppo-ref train`` writes it to the run's ``error.log``).
    """

    def __init__(self, agent_id: int, reason: str, actor_traceback: str = ""):
        self.agent_id = agent_id
        self.reason = reason
        self.actor_traceback = actor_traceback
        super().__init__(f"actor {agent_id} died: {' '.join(str(reason).split())}")




class ExperienceError(ActorLearnerError, ValueError):
    """An experience that cannot be placed in the buffer (bad agent_id, shape, values, order)."""
