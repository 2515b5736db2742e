"""ppo_ref: a NumPy + numba reference implementation of PPO.

Read it as an executable specification, run it for known-good numbers, and point its tests and
golden vectors at other implementations. See README.md for how to use it, docs/specification.md
for the vocabulary and conventions; the equations are in the docstrings of ``ppo_ref.spec``.

The advantage kernels (docs/specification.md §2) and the trainers are re-exported here; the
layers, losses and optimizer live in their modules (``ppo_ref.nn.*``, ``ppo_ref.losses``,
``ppo_ref.optim``), which re-export the readable tier ``ppo_ref.spec``; the compiled tier is
``ppo_ref.fast``.
"""
__version__ = "0.1.0"

from ppo_ref.kernels import VTraceReturns, episode_starts, gae, vtrace
from ppo_ref import envs as _envs  # registers the ppo_ref/ gymnasium ids
from ppo_ref.config import PPOConfig
from ppo_ref.ppo import PPOTrainer
from ppo_ref.recurrent_ppo import RecurrentPPOTrainer
from ppo_ref.actor_learner import AsyncActorLearnerConfig, LearnerReport, learner_loop

__all__ = [
    "__version__",
    "episode_starts", "gae", "vtrace", "VTraceReturns",
    "PPOConfig", "PPOTrainer", "RecurrentPPOTrainer",
    "AsyncActorLearnerConfig", "LearnerReport", "learner_loop",
]
