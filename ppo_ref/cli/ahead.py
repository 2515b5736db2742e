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
its standard input (the run ends it so, or by exiting, even when killed). It is not started on
one CPU, nor for an env of the user's own module (``module:EnvId``: not made twice).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Optional

from ppo_ref._numba import PACKAGE_DIR, claim_first

__all__ = ["start_compiling_ahead", "stop_compiling_ahead", "compile_update"]
#: The helper's program (``python -c``).
_HELPER = f"""
import sys
if not getattr(sys.flags, "safe_path", False):
    del sys.path[0]                 # not the working directory's modules (as in the run)
import os, threading
job = sys.stdin.buffer.readline()


def watch():                        # stdin ends when the run closes it or ends: end too
    while os.read(0, 4096):
        pass
    os._exit(0)


threading.Thread(target=watch, daemon=True).start()
sys.path.insert(0, {os.path.dirname(PACKAGE_DIR)!r})
status = 1
try:
    from ppo_ref.cli.ahead import _run
    _run(job)
    status = 0
finally:
    os._exit(status)                # no interpreter shutdown: it would wait on the watcher
"""


def start_compiling_ahead(trainer) -> Optional[subprocess.Popen]:
    """The helper for ``trainer``, started when it was made from a registered env id (not a
    ``module:EnvId``), this process may run on two CPUs or more, and the cache has not had a
    helper for its policy kind, backend and compute dtype; else None."""
    c, env_id = trainer.config, trainer.env_id
    name = f"compile-ahead-{trainer.policy_kind}-{c.backend}-{c.compute_dtype}"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if env_id is None or ":" in env_id or (cpus or 1) < 2 or not claim_first(name):
        return None  # (an env of the user's own module is not made twice; one core: no gain)
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
    threading.Thread(target=helper.wait, daemon=True).start()  # reaped when it ends
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


def _run(job: bytes) -> None:
    """The helper's job: :func:`compile_update` of the JSON object ``job``."""
    compile_update(**json.loads(job))
