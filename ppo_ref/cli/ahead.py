"""A helper process that compiles a first run's update kernels while the run compiles the rest.

A run whose kernels are not in the cache (:mod:`ppo_ref._numba`) compiles each when it first
calls it, one after another on one core. So the first ``ppo-ref train`` of a policy kind,
backend and compute dtype with a cache (:func:`ppo_ref._numba.claim_first`) starts a Python
process that runs one update of the same trainer with its policy on the spec tier
(:func:`compile_update`; nothing of the policy is compiled): GAE, the losses, the clip and Adam
run as in the run and are compiled, with the run's argument types, into the cache on the other
core while the run compiles its networks and collects its first rollout. The run loads each
kernel from the cache, or compiles it itself if the helper is not done with it (the same code).
The helper prints nothing, writes only cache entries, and ends when done or when the run closes
its standard input (the run ends it so, or by exiting, even when killed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

from ppo_ref._numba import PACKAGE_DIR, claim_first

__all__ = ["start_compiling_ahead", "stop_compiling_ahead", "compile_update"]
#: The helper's program: the job is its first line of stdin; the end of stdin ends it (watched
#: before the imports); this copy of the package first on its path.
_HELPER = ("import os, sys, threading; job = sys.stdin.buffer.readline(); threading.Thread("
           "target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start(); "
           f"sys.path.insert(0, {os.path.dirname(PACKAGE_DIR)!r}); "
           "from ppo_ref.cli.ahead import compile_update; import json; "
           "compile_update(**json.loads(job))")


def start_compiling_ahead(trainer) -> Optional[subprocess.Popen]:
    """The helper for ``trainer`` (made from an env id), started when the cache has not had one
    for its policy kind, backend and compute dtype; else None."""
    c = trainer.config
    if trainer.env_id is None or not claim_first(
            f"compile-ahead-{trainer.policy_kind}-{c.backend}-{c.compute_dtype}"):
        return None
    vectorization = "sync" if trainer.vectorization == "async" else trainer.vectorization
    try:  # (a helper that cannot start only leaves the run to compile everything)
        job = json.dumps({"policy": trainer.policy_kind, "env_id": trainer.env_id,
                          "config": c.to_dict(), "env_kwargs": trainer.env_kwargs,
                          "vectorization": vectorization})
        helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        helper.stdin.write(job.encode() + b"\n")
        helper.stdin.flush()
    except (OSError, TypeError, ValueError):
        return None
    return helper


def stop_compiling_ahead(helper: Optional[subprocess.Popen]) -> None:
    """End ``helper`` (None: nothing to do) and wait for it (killed after 5 s)."""
    if helper is not None:
        helper.stdin.close()
        try:
            helper.wait(5.0)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def compile_update(policy: str, env_id: str, config: dict, vectorization: str = "sync",
                   env_kwargs: Optional[dict] = None) -> None:
    """One epoch of one update of a new ``policy`` trainer (``"mlp"``, ``"lstm"``) on ``env_id``
    with the PPOConfig ``config`` (:meth:`~ppo_ref.config.PPOConfig.to_dict`), whose policy is
    replaced by that policy on the spec tier, its outputs given the compute dtype."""
    from ppo_ref.cli.common import trainer_class
    from ppo_ref.config import PPOConfig
    from ppo_ref.tiers import tier_for
    from ppo_ref.train.policies import make_policy
    config = PPOConfig.from_dict(config)
    trainer = trainer_class(policy)(env_id, config.replace(n_epochs=1),
                                    vectorization=vectorization, env_kwargs=env_kwargs)
    try:
        env = trainer.collector.env
        spec = make_policy(env.single_observation_space, env.single_action_space,
                           config.replace(backend="spec", compute_dtype="float64"),
                           tier_for("spec"), trainer.recurrent)
        evaluate, dtype = spec.evaluate, config.compute_dtype

        def evaluate_in_dtype(params, data):
            log_probs, entropy, values, cache = evaluate(params, data)
            return log_probs.astype(dtype), entropy.astype(dtype), values.astype(dtype), cache
        spec.evaluate = evaluate_in_dtype
        trainer.policy = trainer.collector.policy = spec
        trainer.update(trainer.collect_rollout())
    finally:
        trainer.close()
