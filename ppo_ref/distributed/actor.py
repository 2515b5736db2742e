"""One actor of the actor-learner loop: :func:`run_actor`, the policy it acts with, and the
thread and process entry points that run it (a process actor exits with its parent)."""
from __future__ import annotations

import contextlib
import multiprocessing
import queue as queue_module
import traceback
from typing import Any, Callable, List, Optional

import numpy as np

from ppo_ref._checks import check_count, env_value_problem
from ppo_ref.config import PPOConfig
from ppo_ref.distributed.config import AsyncActorLearnerConfig
from ppo_ref.distributed.messages import (ActorFailed, ActorFinished, ActorLearnerError, ActorStats,
                                          ExperienceBatch, PolicyBroadcast, Shutdown)

__all__ = ["run_actor", "POLL_SECONDS"]

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

    Per env step: take every pending message (the newest :class:`PolicyBroadcast` replaces the
    parameters once the old ones' steps are sent; :class:`Shutdown` ends the actor); while it
    holds no policy or is over its budget (docs/specification.md §6, flow control), send and
    wait; act with its own generator (seed ``config.seed + 1 + agent_id``, also the env's).
    Every ``chunk_size`` steps (and before waiting or switching parameters) the unsent steps go
    as one :class:`ExperienceBatch`, valued in one pass with the parameters that acted.

    ``env``: gymnasium id or zero-argument factory; ``send(message)`` puts on the learner's
    queue; ``receive(timeout)`` returns the next learner message or None (0: do not wait);
    ``learner_gone()`` is True once the learner cannot read. Returns :class:`ActorStats`.
    """
    from ppo_ref.io.checkpoint import arrays_from_bytes
    chunk_size = check_count(chunk_size, "chunk_size", 1)
    actor_seed = config.seed + 1 + agent_id
    rng = np.random.default_rng(actor_seed)
    env_obj = _make_env(env)
    try:
        policy = _ActorPolicy(env_obj, config.ppo)
        obs = policy.observation(env_obj.reset(seed=actor_seed)[0])
        version = -1
        broadcasts = steps = episodes = 0
        budget = config.steps_per_broadcast
        lead = config.lead_limit
        # unsent steps, all acted with `version`: (observation, action, reward, next_observation,
        # terminated, truncated, the observation acted from next, the policy output acted from)
        rows: List[tuple] = []

        def flush():
            if rows:
                obs, actions, rewards, next_obs, terminated, truncated, after, outs = zip(*rows)
                values, log_probs = policy.behaviour(obs, actions, outs)
                send(ExperienceBatch(agent_id, np.array(obs), np.array(actions),
                                     np.array(rewards, dtype=np.float64), np.array(next_obs),
                                     np.array(terminated, dtype=bool),
                                     np.array(truncated, dtype=bool), values, log_probs,
                                     np.full(len(rows), version, dtype=np.int64),
                                     np.array(after)))
                rows.clear()

        def stats() -> ActorStats:
            return ActorStats(agent_id, steps, episodes, broadcasts, version)

        newest: Optional[PolicyBroadcast] = None
        first_version = -1
        while True:
            waiting = False
            while True:
                msg = receive(POLL_SECONDS if waiting and newest is None else 0.0)
                if msg is None:
                    if newest is not None:
                        flush()
                        policy.set_params(arrays_from_bytes(newest.payload,
                                                            source="PolicyBroadcast"))
                        version = newest.version
                        if first_version < 0:
                            first_version = version
                        newest = None
                    if version >= 0 and steps - (version - first_version) * budget < lead:
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
            action, env_action, policy_out = policy.act(obs, rng)
            next_obs, reward, terminated, truncated, _ = env_obj.step(env_action)
            for what, value in (("reward", reward), ("terminated", terminated),
                                ("truncated", truncated)):
                problem = env_value_problem(value, what)  # the trainer's rule, never converted
                if problem is not None:
                    raise ValueError(f"env returned {problem} (step {steps + 1} of actor "
                                     f"{agent_id})")
            next_obs = policy.observation(next_obs)
            steps += 1
            if terminated or truncated:
                episodes += 1
                after = policy.observation(env_obj.reset()[0])
            else:
                after = next_obs
            rows.append((obs, action, float(reward), next_obs, bool(terminated), bool(truncated),
                         after, policy_out))
            obs = after
            if len(rows) >= chunk_size:
                flush()
    finally:
        env_obj.close()


def _report_actor(actor_fn, agent_id, env, config, send, receive, learner_gone, chunk_size):
    """Run ``actor_fn`` on one numba thread and always tell the learner how it ended."""
    from ppo_ref.train.ppo import kernel_threads
    try:
        with kernel_threads(1):
            stats = actor_fn(agent_id, env, config, send, receive, learner_gone,
                             chunk_size=chunk_size)
    except BaseException as exc:  # noqa: BLE001  (the learner must hear about everything)
        # a queue that is gone: the liveness check reports the actor
        with contextlib.suppress(Exception):  # noqa: BLE001
            send(ActorFailed(agent_id, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    send(ActorFinished(agent_id, stats))


def _queue_receiver(messages):
    """``receive(timeout)`` on a ``queue.Queue`` or ``multiprocessing.Queue``: the next message,
    waiting up to ``timeout`` seconds (not at all for 0), or None."""
    def receive(timeout: float):
        try:
            return messages.get(block=timeout > 0, timeout=timeout)
        except queue_module.Empty:
            return None
    return receive


def _process_actor_main(actor_fn, agent_id, env, config, experience_writer, broadcast_queue,
                        chunk_size):
    """Entry point of an actor process (spawn). Experiences go through its own pipe (no lock
    shared with other actors; a dead actor gives the learner end-of-file); it dies with the
    learner, ignores Ctrl-C (the learner's) and runs BLAS on one thread."""
    import signal

    from ppo_ref._lifeline import exit_with_parent
    from ppo_ref.train.ppo import limit_blas_threads
    exit_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_blas_threads(1)
    parent = multiprocessing.parent_process()
    try:
        _report_actor(actor_fn, agent_id, env, config, experience_writer.send,
                      _queue_receiver(broadcast_queue),
                      lambda: parent is not None and not parent.is_alive(), chunk_size)
    finally:
        experience_writer.close()


class _ActorPolicy:
    """An actor's :class:`ppo_ref.train.policies.MLPPolicy` on the tier of
    ``ppo_config.backend``: one observation at a time, parameters fixed between broadcasts."""

    def __init__(self, env, ppo_config: PPOConfig):
        from ppo_ref.tiers import tier_for
        from ppo_ref.train.policies import MLPPolicy
        self.policy = MLPPolicy(env.observation_space, env.action_space, ppo_config,
                                tier_for(ppo_config.backend))
        self.cparams = None

    def set_params(self, params) -> None:
        self.cparams = self.policy.compute_params(
            {k: np.asarray(v, dtype=np.float64) for k, v in params.items()})

    def observation(self, obs) -> np.ndarray:
        """A float64 copy, checked as the synchronous collector checks one: ``ValueError`` for
        one that is not real numbers (never converted), of the wrong shape, or not finite."""
        try:
            a = np.asarray(obs)
        except Exception:  # noqa: BLE001  (ragged or exotic: reported, not converted)
            a = np.asarray(None)
        if a.dtype.kind not in "biuf":
            raise ValueError(f"env returned an observation of dtype {a.dtype} (not real numbers)")
        shape = tuple(self.policy.obs_shape)
        if a.shape != shape:
            raise ValueError(f"env returned an observation of shape {a.shape}, expected {shape}")
        out = np.array(a, dtype=np.float64, copy=True)
        if not np.isfinite(out).all():
            raise ValueError(f"env returned a non-finite observation {out.ravel().tolist()}")
        return out

    def act(self, obs: np.ndarray, rng: np.random.Generator):
        """``(action as stored, action the env receives (clipped), policy output)``."""
        acted = self.policy.act(self.cparams, obs.reshape(1, -1), None, None, rng)
        return (acted.actions[0], self.policy.head.to_env(acted.actions)[0],
                acted.policy_out[0])

    def behaviour(self, observations, actions, policy_outs):
        """``(values [k], log_probs [k])`` float64 of k acted steps under the current parameters."""
        obs = np.asarray(observations, dtype=np.float64).reshape(len(observations), -1)
        log_probs, values = self.policy.behaviour(self.cparams, obs, np.asarray(actions),
                                                  np.asarray(policy_outs), [None])
        return np.asarray(values, dtype=np.float64), np.asarray(log_probs, dtype=np.float64)
