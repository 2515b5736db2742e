"""Advantage kernels and episode-boundary masks (SPEC §2).

* :func:`episode_starts`: the reset mask, ``episode_starts[t] = done[t-1]``.
* :func:`gae`: Generalized Advantage Estimation -> ``(advantages, returns)``.
* :func:`vtrace`: V-trace -> :class:`VTraceReturns` ``(vs, pg_advantages)``.

Each is a validating Python wrapper around a private ``@njit`` kernel that takes only arrays
and scalars and runs backward over time.
"""
from ppo_ref.kernels.gae import gae
from ppo_ref.kernels.masks import TransitionMasks, episode_starts, transition_masks
from ppo_ref.kernels.vtrace import VTraceReturns, vtrace

__all__ = ["episode_starts", "gae", "vtrace", "VTraceReturns", "transition_masks",
           "TransitionMasks"]
