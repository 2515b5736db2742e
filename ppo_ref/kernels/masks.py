"""Old home of :func:`episode_starts` and :func:`transition_masks` (now in
:mod:`ppo_ref.spec.masks`, compiled twins in :mod:`ppo_ref.fast.masks`): a thin layer choosing
the tier by ``backend``, kept until the switch."""
from ppo_ref.kernels._inputs import tier_module
from ppo_ref.spec.masks import TRUNCATION_MODES, TransitionMasks  # noqa: F401

__all__ = ["episode_starts", "transition_masks", "TransitionMasks", "TRUNCATION_MODES"]


def transition_masks(terminated, truncated, truncation: str = "bootstrap", *,
                     backend: str = "fast") -> TransitionMasks:
    """:func:`ppo_ref.spec.masks.transition_masks` (``backend="spec"``) or its compiled twin."""
    return tier_module(backend, "masks").transition_masks(terminated, truncated, truncation)


def episode_starts(terminated, truncated, initial, *, backend: str = "fast"):
    """:func:`ppo_ref.spec.masks.episode_starts` (``backend="spec"``) or its compiled twin."""
    return tier_module(backend, "masks").episode_starts(terminated, truncated, initial)
