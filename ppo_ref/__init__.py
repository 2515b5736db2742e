"""ppo_ref: a NumPy + numba reference implementation of PPO.

Read it as an executable specification, run it for known-good numbers, and point its tests and
golden vectors at other implementations. See README.md for how to use it, docs/specification.md
for the vocabulary and conventions; the equations are in the docstrings of ``ppo_ref.spec``.

The advantage kernels and the trainers are re-exported here. The package, in the order the data
flows (env -> rollout -> advantages -> losses and networks -> optimizer)::

    envs.py          the bundled gymnasium envs (registers the ppo_ref/ ids on import)
    spec/            the readable tier: every computation once, plain NumPy float64
    fast/            the compiled tier: numba twins of spec/ functions (each names its twin)
    kernels/         gae, vtrace, episode_starts: validating wrappers running spec/ or fast/
    nn/, losses.py,  the public names of the layers, losses and optimizer (re-exports of
    optim.py           spec/, plus the npz form of an Adam state)
    config.py        PPOConfig and the convention presets (settings shared by every layer)
    io/              checkpoints (checkpoint.py) and run directories (runlog.py)
    train/           rollout collection, the policies (compositions of spec/ and fast/),
                       PPOTrainer (train/ppo.py) and RecurrentPPOTrainer (train/recurrent_ppo.py)
    distributed/     the actor-learner loop: config, messages, actor, transport, learner
    zoo.py           per-env default settings of ``ppo-ref train --env ID``
    details.py       the PPO implementation-details table (data; no imports)
    vectors.py       golden JSON test vectors: write, read, check another implementation
    conventions.py   the table of convention options (presets' fields) testing and vectors read
    testing/         property checks of another implementation (hypothesis)
    cli/             the ``ppo-ref`` command; it calls the library, nothing imports it

Imports run one way, down this list of ranks (a module imports only from lower ranks or its own
subpackage; tests/test_architecture.py enforces it, and that no private name crosses a
subpackage boundary)::

    cli > testing > vectors, zoo, distributed > train, conventions > io, config, kernels,
    nn, losses, optim, envs, details > fast > spec > _checks, _numba, _lifeline

Module paths from before this layout stay importable as the modules that now hold the code
(:data:`MOVED_MODULES`): ``ppo_ref.ppo`` is ``ppo_ref.train.ppo``, ``ppo_ref.actor_learner``
is ``ppo_ref.distributed``, and so on.
"""
__version__ = "0.1.0"

import importlib as _importlib
import sys as _sys

from ppo_ref.kernels import VTraceReturns, episode_starts, gae, vtrace
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

#: Old module path (``ppo_ref.<key>``) -> the module that holds that code now. Each old path is
#: the same module object (``ppo_ref.ppo is ppo_ref.train.ppo``), so ``import ppo_ref.ppo`` and
#: ``from ppo_ref.rollout import RolloutCollector`` keep working. Library code imports the new
#: paths (tests/test_architecture.py checks it).
MOVED_MODULES = {
    "ppo": "ppo_ref.train.ppo",
    "recurrent_ppo": "ppo_ref.train.recurrent_ppo",
    "policies": "ppo_ref.train.policies",
    "recurrent_policies": "ppo_ref.train.recurrent_policies",
    "rollout": "ppo_ref.train.rollout",
    "actor_learner": "ppo_ref.distributed",
    "checkpoint": "ppo_ref.io.checkpoint",
    "runlog": "ppo_ref.io.runlog",
}
for _old, _new in MOVED_MODULES.items():
    globals()[_old] = _sys.modules[f"{__name__}.{_old}"] = _importlib.import_module(_new)
del _old, _new
