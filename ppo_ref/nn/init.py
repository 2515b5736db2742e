"""Parameter initialisation: orthogonal matrices with a gain.

:func:`orthogonal` is defined once, in the readable tier (:func:`ppo_ref.spec.layers.orthogonal`,
Saxe et al. 2014, torch's ``orthogonal_`` procedure); this module re-exports it. The gains
(sqrt(2) hidden, 0.01 policy head, 1.0 value head; Huang et al. 2022, "The 37 Implementation
Details of PPO", detail 2) are chosen by the callers (:mod:`ppo_ref.nn.mlp`,
:mod:`ppo_ref.nn.actor_critic`, :mod:`ppo_ref.nn.lstm`).
"""
from ppo_ref.spec.layers import orthogonal

__all__ = ["orthogonal"]
