"""Advantages and episode-boundary masks: the validating public wrappers.

* :func:`episode_starts`: the reset mask, ``episode_starts[t] = done[t-1]``.
* :func:`gae`: Generalized Advantage Estimation -> ``(advantages, returns)``.
* :func:`vtrace`: V-trace -> :class:`VTraceReturns` ``(vs, pg_advantages)``.

Each validates its arguments and runs a loop of :mod:`ppo_ref.spec.advantages` or
:mod:`ppo_ref.spec.masks`, compiled (``backend="fast"``, the default) or as plain Python
(``backend="spec"``): one definition, the same bits.
"""
from ppo_ref.kernels.gae import gae
from ppo_ref.kernels.masks import TransitionMasks, episode_starts, transition_masks
from ppo_ref.kernels.vtrace import VTraceReturns, vtrace

__all__ = ["episode_starts", "gae", "vtrace", "VTraceReturns", "transition_masks",
           "TransitionMasks"]
