"""PPO losses (public names): the readable definitions of :mod:`ppo_ref.spec.losses`.

This module re-exports them; the compiled minibatch loss of the fast update is
:func:`ppo_ref.fast.losses._minibatch_loss_kernel`, equal to the spec's ``policy_loss``,
``value_loss`` and ``approx_kl`` bit for bit.
"""
from ppo_ref.spec.losses import (KL_ESTIMATORS, VALUE_LOSS_MODES, approx_kl, entropy_loss,
                                 explained_variance, normalize_advantages, policy_loss,
                                 value_loss)

__all__ = [
    "policy_loss",
    "value_loss",
    "entropy_loss",
    "approx_kl",
    "normalize_advantages",
    "explained_variance",
    "VALUE_LOSS_MODES",
    "KL_ESTIMATORS",
]
