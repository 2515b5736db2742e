"""The compiled twins of :mod:`ppo_ref.spec.masks`: the same validation, the spec's loops
compiled (``njit`` of the very functions), bit for bit.

* :func:`episode_starts` equals :func:`ppo_ref.spec.masks.episode_starts` bit for bit;
* :func:`transition_masks` equals :func:`ppo_ref.spec.masks.transition_masks` bit for bit.

The scalar rule the loops call, :func:`ppo_ref.spec.masks.transition_flags`, is registered with
numba's ``register_jitable``: compiled code calling it gets a compiled version, plain Python keeps
calling the function itself.
"""
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
