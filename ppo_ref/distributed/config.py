"""Settings of the actor-learner loop: :class:`AsyncActorLearnerConfig` and
:func:`async_config_from_ppo` (the configuration ``ppo-ref train --async`` derives from a
synchronous :class:`~ppo_ref.config.PPOConfig`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ppo_ref._checks import check_choice, check_count, check_positive, check_unit_interval
from ppo_ref.config import PPOConfig

__all__ = [
    "AsyncActorLearnerConfig", "async_config_from_ppo", "ACTOR_KINDS", "MAX_PROCESS_ACTORS_PER_CPU",
]


ACTOR_KINDS = ("thread", "process", "ray")
"""Where actors run: threads of the learner's process, processes of its machine, or Ray actors
(a local Ray on loopback, or the Ray cluster at ``ray_address``)."""


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
    actors: str = "process"
    """Where the actors run (:data:`ACTOR_KINDS`): "process" (multiprocessing, spawn), "thread"
    or "ray" (one Ray actor each: :mod:`ppo_ref.distributed.ray_actors`)."""
    ray_address: Optional[str] = None
    """With ``actors="ray"``: the address of the Ray cluster to join (``ray.init(address=...)``,
    e.g. ``"10.0.0.1:6379"`` or ``"auto"``); None starts a Ray of this machine on 127.0.0.1
    only (or uses the Ray this process is already connected to)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO settings of the learner's update."""

    def __post_init__(self):
        check_count(self.num_actors, "num_actors", 1)
        check_count(self.n_steps, "n_steps", 1)
        check_count(self.total_timesteps, "total_timesteps", 1)
        check_count(self.broadcast_every, "broadcast_every", 1)
        check_count(self.max_lead_steps, "max_lead_steps", 0)
        check_unit_interval(self.gamma, "gamma")
        check_unit_interval(self.gae_lambda, "gae_lambda")
        if not isinstance(self.use_vtrace, (bool, np.bool_)):
            raise ValueError(f"use_vtrace must be a bool, got {self.use_vtrace!r}")
        check_positive(self.rho_bar, "rho_bar")
        check_positive(self.c_bar, "c_bar")
        check_count(self.seed, "seed", 0)
        check_positive(self.starvation_timeout, "starvation_timeout")
        check_positive(self.env_step_timeout, "env_step_timeout")
        check_choice(self.actors, "actors", ACTOR_KINDS)
        if self.ray_address is not None and (self.actors != "ray" or not isinstance(
                self.ray_address, str) or not self.ray_address.strip()):
            raise ValueError(f"ray_address must be None or a non-empty address string with "
                             f"actors='ray', got {self.ray_address!r} with actors={self.actors!r}")
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
        ``total_timesteps`` env steps (as :meth:`ppo_ref.train.ppo.PPOTrainer.learn`)."""
        rows = self.n_steps * self.num_actors
        return max(1, -(-self.total_timesteps // rows))

    @property
    def steps_per_broadcast(self) -> int:
        """Rows of each actor consumed between two broadcasts: ``broadcast_every * n_steps``."""
        return self.broadcast_every * self.n_steps

    def learner_ppo_config(self) -> PPOConfig:
        """``ppo`` with ``n_steps``, ``n_envs = num_actors``, ``gamma`` and ``gae_lambda`` set
        from this config: the configuration of the learner's :class:`~ppo_ref.train.ppo.PPOTrainer`."""
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




MAX_PROCESS_ACTORS_PER_CPU = 16
"""Most actor processes per CPU core :func:`async_config_from_ppo` accepts (a guard against
exhausting memory; each process holds its own interpreter, numpy, numba and env)."""


def async_config_from_ppo(ppo: PPOConfig, *, num_actors: int, total_timesteps: int,
                          use_vtrace: bool = False, broadcast_every: int = 1, seed: int = 0,
                          actors: str = "process",
                          ray_address: Optional[str] = None) -> AsyncActorLearnerConfig:
    """The actor-learner configuration the CLI derives from a synchronous ``PPOConfig``.

    Each update consumes as many rows as one synchronous update (``ppo.n_steps * ppo.n_envs``),
    split evenly over the actors: ``n_steps = ppo.n_steps * ppo.n_envs // num_actors``;
    ``gamma`` and ``gae_lambda`` are the PPOConfig's. So ``ppo-ref train --async`` on
    CartPole-v1 (zoo settings: 8 envs x 32 steps) with 4 actors takes 64 steps per actor per
    update, the same 256-row batch.

    Raises:
        ValueError: ``num_actors`` < 1, or not a divisor of ``ppo.n_steps * ppo.n_envs`` (the
            batch would change size), or, with actor processes (or Ray actors on a local Ray),
            more than
            :data:`MAX_PROCESS_ACTORS_PER_CPU` per CPU core (every actor is a Python process
            holding numpy, numba and its env: hundreds of them exhaust memory).
    """
    num_actors = check_count(num_actors, "num_actors", 1)
    rows = ppo.n_steps * ppo.n_envs
    if rows % num_actors:
        valid = [k for k in range(1, rows + 1) if rows % k == 0]
        raise ValueError(f"num_actors ({num_actors}) must divide the rows of one update "
                         f"(n_steps * n_envs = {rows}), so every actor contributes the same "
                         f"number of steps: one of {valid}")
    cpus = os.cpu_count() or 1
    local_processes = actors == "process" or (actors == "ray" and ray_address is None)
    if local_processes and num_actors > MAX_PROCESS_ACTORS_PER_CPU * cpus:
        raise ValueError(f"num_actors ({num_actors}) is more than {MAX_PROCESS_ACTORS_PER_CPU} "
                         f"actor processes per CPU core ({cpus} cores here); use fewer actors, "
                         f"thread actors or a Ray cluster")
    n_steps = rows // num_actors
    return AsyncActorLearnerConfig(num_actors=num_actors, n_steps=n_steps,
                                   total_timesteps=int(total_timesteps),
                                   broadcast_every=int(broadcast_every), gamma=ppo.gamma,
                                   gae_lambda=ppo.gae_lambda, use_vtrace=bool(use_vtrace),
                                   seed=int(seed), actors=actors,
                                   ray_address=ray_address, ppo=ppo)
