"""The compiled twins of :mod:`ppo_ref.spec.masks`, bit for bit: the spec's validation around
its loops compiled (``njit`` of the very functions; its scalar rule through
``register_jitable``)."""
from numba.extending import register_jitable

from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import masks as _spec

__all__ = ["episode_starts", "transition_masks"]

register_jitable(**NJIT_OPTIONS)(_spec.transition_flags)

_transition_masks_loop = njit(_spec.transition_masks_loop)
_episode_starts_loop = njit(_spec.episode_starts_loop)


def transition_masks(terminated, truncated, truncation="bootstrap"):
    """:func:`ppo_ref.spec.masks.transition_masks` with the loop compiled; bit for bit."""
    return _spec.run_transition_masks(_transition_masks_loop, terminated, truncated, truncation)


def episode_starts(terminated, truncated, initial):
    """:func:`ppo_ref.spec.masks.episode_starts` with the loop compiled; bit for bit."""
    return _spec.run_episode_starts(_episode_starts_loop, terminated, truncated, initial)
