"""Settings of the actor-learner loop: :class:`AsyncActorLearnerConfig` and
:func:`async_config_from_ppo` (what ``ppo-ref train --async`` derives from a PPOConfig)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ppo_ref._checks import check_choice, check_count, check_positive, check_unit_interval
from ppo_ref.config import CLIP_NEEDS, PPOConfig

__all__ = ["AsyncActorLearnerConfig", "async_config_from_ppo", "ACTOR_KINDS",
           "MAX_PROCESS_ACTORS_PER_CPU"]

#: Where actors run: threads of the learner's process, processes of its machine, Ray actors.
ACTOR_KINDS = ("thread", "process", "ray")
#: Most actor processes per CPU core :func:`async_config_from_ppo` accepts (each holds its own
#: interpreter, numpy, numba and env: hundreds of them exhaust memory).
MAX_PROCESS_ACTORS_PER_CPU = 16
#: PPOConfig settings the actor-learner does not support, and why.
_UNSUPPORTED = {
    "normalize_observations": "actors would each hold different running statistics",
    "normalize_rewards": "actors would each hold different running statistics",
    "use_sde": "its actors do not hold gSDE's exploration matrices",
}


@dataclass(frozen=True)
class AsyncActorLearnerConfig:
    """Settings of the asynchronous actor-learner loop (docs/specification.md §6), validated at
    construction (``ValueError`` naming the field).

    Attributes:
        num_actors, n_steps: the buffer of an update is [n_steps, num_actors], a column per
            actor (each with its own env).
        total_timesteps: env steps to consume at least, in whole updates (:attr:`num_updates`).
        broadcast_every: a new policy version goes to every actor after this many updates.
        max_lead_steps: how far (env steps) an actor may run ahead of what the learner provably
            consumed; 0: 2 * broadcast_every * n_steps (:attr:`lead_limit`).
        gamma, gae_lambda: discount and GAE lambda in [0, 1] (lambda unused with V-trace).
        use_vtrace, rho_bar, c_bar: V-trace against the learner's policy, truncated at
            ``rho_bar`` (importance weight) and ``c_bar`` (traces), both > 0; else GAE.
        seed: the learner's seed; actor k seeds its generator and env with seed + 1 + k.
        starvation_timeout: seconds without any experience before StarvationError.
        env_step_timeout: seconds an actor whose rows the learner waits for may send nothing
            before StarvationError names it (its env hung in step or reset).
        actors: where the actors run (:data:`ACTOR_KINDS`).
        ray_address: with ``actors="ray"``, the cluster to join (``"HOST:PORT"``, ``"auto"``;
            None: a Ray of this machine on 127.0.0.1 only, or the one already connected).
        ppo: the learner's PPO settings, ``n_steps``, ``n_envs``, ``gamma`` and ``gae_lambda``
            replaced by this config's (:meth:`learner_ppo_config`).
    """

    num_actors: int = 4
    n_steps: int = 256
    total_timesteps: int = 200_000
    broadcast_every: int = 1
    max_lead_steps: int = 0
    gamma: float = 0.99
    gae_lambda: float = 0.95
    use_vtrace: bool = False
    rho_bar: float = 1.0
    c_bar: float = 1.0
    seed: int = 0
    starvation_timeout: float = 60.0
    env_step_timeout: float = 60.0
    actors: str = "process"
    ray_address: Optional[str] = None
    ppo: PPOConfig = field(default_factory=PPOConfig)

    def __post_init__(self):
        for name, minimum in (("num_actors", 1), ("n_steps", 1), ("total_timesteps", 1),
                              ("broadcast_every", 1), ("max_lead_steps", 0), ("seed", 0)):
            check_count(getattr(self, name), name, minimum)
        for name in ("gamma", "gae_lambda"):
            check_unit_interval(getattr(self, name), name)
        for name in ("rho_bar", "c_bar", "starvation_timeout", "env_step_timeout"):
            check_positive(getattr(self, name), name)
        if not isinstance(self.use_vtrace, (bool, np.bool_)):
            raise ValueError(f"use_vtrace must be a bool, got {self.use_vtrace!r}")
        check_choice(self.actors, "actors", ACTOR_KINDS)
        if self.ray_address is not None and (self.actors != "ray" or not isinstance(
                self.ray_address, str) or not self.ray_address.strip()):
            raise ValueError(f"ray_address must be None or a non-empty address string with "
                             f"actors='ray', got {self.ray_address!r} with actors={self.actors!r}")
        if not isinstance(self.ppo, PPOConfig):
            raise ValueError(f"ppo must be a PPOConfig, got {type(self.ppo).__name__}")
        minimum_lead = self.steps_per_broadcast
        if self.max_lead_steps != 0 and self.max_lead_steps < minimum_lead:
            raise ValueError(
                f"max_lead_steps must be 0 (= 2 * broadcast_every * n_steps) or >= "
                f"broadcast_every * n_steps = {minimum_lead}, got {self.max_lead_steps}: the "
                f"learner needs that many rows from every actor between two broadcasts, so a "
                f"smaller lead deadlocks")
        unsupported = [name for name in _UNSUPPORTED if getattr(self.ppo, name)]
        if unsupported:  # one error naming every one, and every setting that turns them off
            off = [f"{name}=False" for name in unsupported] + [
                f"{clip}=None" for clip, flag in CLIP_NEEDS.items()
                if flag in unsupported and getattr(self.ppo, clip) is not None]
            flags = " ".join(f"--set {item.lower()}" for item in off)
            why = "; ".join(dict.fromkeys(_UNSUPPORTED[n] for n in unsupported))
            raise ValueError(f"{', '.join(f'ppo.{n}' for n in unsupported)} "
                             f"{'is' if len(unsupported) == 1 else 'are'} not supported by the "
                             f"actor-learner loop ({why}): set {', '.join(off)} ({flags}) or "
                             f"train without it (PPOTrainer)")
        try:
            self.learner_ppo_config()
        except ValueError as exc:
            raise ValueError(f"ppo: {exc} (with n_steps={self.n_steps}, "
                             f"n_envs=num_actors={self.num_actors})") from None

    @property
    def lead_limit(self) -> int:
        """``max_lead_steps`` with 0 resolved to ``2 * broadcast_every * n_steps``."""
        return self.max_lead_steps or 2 * self.steps_per_broadcast

    @property
    def num_updates(self) -> int:
        """``ceil(total_timesteps / (n_steps * num_actors))``, at least 1 (whole updates)."""
        return max(1, -(-self.total_timesteps // (self.n_steps * self.num_actors)))

    @property
    def steps_per_broadcast(self) -> int:
        """Rows of each actor consumed between two broadcasts: ``broadcast_every * n_steps``."""
        return self.broadcast_every * self.n_steps

    def learner_ppo_config(self) -> PPOConfig:
        """``ppo`` with this config's ``n_steps``, ``n_envs = num_actors``, ``gamma`` and
        ``gae_lambda``: the configuration of the learner's PPOTrainer."""
        return self.ppo.replace(n_steps=self.n_steps, n_envs=self.num_actors,
                                gamma=self.gamma, gae_lambda=self.gae_lambda)

    def replace(self, **changes) -> "AsyncActorLearnerConfig":
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-safe dict (``ppo`` as ``PPOConfig.to_dict()``)."""
        return {f.name: self.ppo.to_dict() if f.name == "ppo" else getattr(self, f.name)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "AsyncActorLearnerConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        d = dict(d)
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown AsyncActorLearnerConfig fields: {unknown}")
        if "ppo" in d and not isinstance(d["ppo"], PPOConfig):
            d["ppo"] = PPOConfig.from_dict(d["ppo"])
        return cls(**d)


def async_config_from_ppo(ppo: PPOConfig, *, num_actors: int, total_timesteps: int,
                          use_vtrace: bool = False, broadcast_every: int = 1, seed: int = 0,
                          actors: str = "process",
                          ray_address: Optional[str] = None) -> AsyncActorLearnerConfig:
    """The actor-learner configuration of a synchronous ``PPOConfig``: each update consumes the
    rows of one synchronous update, split evenly (``n_steps = ppo.n_steps * ppo.n_envs //
    num_actors``), with its ``gamma`` and ``gae_lambda``. ``ValueError`` for ``num_actors`` < 1
    or not a divisor of those rows, or, with actor processes (or Ray actors on a local Ray),
    more than :data:`MAX_PROCESS_ACTORS_PER_CPU` per CPU core."""
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
    return AsyncActorLearnerConfig(num_actors=num_actors, n_steps=rows // num_actors,
                                   total_timesteps=int(total_timesteps),
                                   broadcast_every=int(broadcast_every), gamma=ppo.gamma,
                                   gae_lambda=ppo.gae_lambda, use_vtrace=bool(use_vtrace),
                                   seed=int(seed), actors=actors,
                                   ray_address=ray_address, ppo=ppo)
