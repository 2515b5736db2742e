"""ppo_ref: a NumPy + numba reference implementation of PPO.

Read it as an executable specification, run it for known-good numbers, and point its tests and
golden vectors at other implementations. See README.md for how to use it, docs/specification.md
for the vocabulary and conventions; the equations are in the docstrings of ``ppo_ref.spec``.

The package, in the order the data flows (env -> rollout -> advantages -> losses and networks ->
optimizer)::

    envs.py          the bundled gymnasium envs (registers the ppo_ref/ ids on import)
    spec/            the readable tier: every computation once, plain NumPy float64
    fast/            the compiled tier: numba twins of spec/ functions (same names, parameters)
    tiers.py         tier_for(backend): the one place a backend becomes code
    config.py        PPOConfig and the convention presets
    io/              checkpoints, the trainer state as arrays, run directories
    train/           rollout collection, the policies, PPOTrainer, RecurrentPPOTrainer
    conventions.py   the convention options implementations choose differently (one table)
    distributed/     the actor-learner loop: config, messages, actor, transport, learner
    zoo.py           per-env default settings of ``ppo-ref train --env ID``
    details.py       the PPO implementation-details table (data)
    vectors/         golden JSON test vectors
    testing/         property checks of another implementation (hypothesis), update traces
    cli/             the ``ppo-ref`` command; nothing imports it

Imports run one way: a module imports only from lower ranks (tests/test_architecture.py). The
kernels re-exported here are the compiled twins (:mod:`ppo_ref.fast.advantages`,
:mod:`ppo_ref.fast.masks`), the same bits as :mod:`ppo_ref.spec.advantages` and ``masks``.
"""
__version__ = "0.1.0"

from ppo_ref.fast.advantages import VTraceReturns, gae, vtrace
from ppo_ref.fast.masks import episode_starts
from ppo_ref import envs as _envs  # registers the ppo_ref/ gymnasium ids
from ppo_ref.config import PPOConfig
from ppo_ref.train.ppo import PPOTrainer
from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
from ppo_ref.distributed import AsyncActorLearnerConfig, LearnerReport, learner_loop

__all__ = [
    "__version__",
    "episode_starts", "gae", "vtrace", "VTraceReturns",
    "PPOConfig", "PPOTrainer", "RecurrentPPOTrainer",
    "AsyncActorLearnerConfig", "LearnerReport", "learner_loop",
]
