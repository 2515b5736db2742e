"""ppo_ref: a NumPy + numba reference implementation of PPO.

Read it as an executable specification, run it for known-good numbers, and point its tests and
golden vectors at other implementations. See README.md for the vocabulary and the equations.
"""
__version__ = "0.1.0"

from ppo_ref.kernels import VTraceReturns, episode_starts, gae, vtrace
from ppo_ref import envs as _envs  # registers the ppo_ref/ gymnasium ids

__all__ = ["__version__", "episode_starts", "gae", "vtrace", "VTraceReturns"]
