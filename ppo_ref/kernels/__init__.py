"""Advantages and episode-boundary masks: the validating public wrappers.

* :func:`episode_starts`: the reset mask, ``episode_starts[t] = done[t-1]``.
* :func:`gae`: Generalized Advantage Estimation -> ``(advantages, returns)``.
* :func:`vtrace`: V-trace -> :class:`VTraceReturns` ``(vs, pg_advantages)``.

Thin layers (kept until the switch, then deleted) over the public functions of
:mod:`ppo_ref.spec.advantages` and :mod:`ppo_ref.spec.masks` (``backend="spec"``) and their
compiled twins in :mod:`ppo_ref.fast` (``backend="fast"``, the default): the same bits.
"""
from ppo_ref.kernels.gae import gae
from ppo_ref.kernels.masks import TransitionMasks, episode_starts, transition_masks
from ppo_ref.kernels.vtrace import VTraceReturns, vtrace

__all__ = ["episode_starts", "gae", "vtrace", "VTraceReturns", "transition_masks",
           "TransitionMasks"]
