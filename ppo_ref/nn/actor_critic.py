"""The MLP actor-critic of PPO (public names): the readable definitions of
:mod:`ppo_ref.spec.networks`, re-exported.

Two tiers: :mod:`ppo_ref.spec.networks` defines the network (a policy tower and a value tower,
separate or on a shared trunk; keys ``pi.*``, ``vf.*``, ``trunk.*``);
:mod:`ppo_ref.fast.actor_critic` holds the compiled twin on one parameter buffer (``flat_forward``
/ ``flat_backward``, equal within rtol 1e-12 / 1e-10) that :class:`ppo_ref.train.policies.MLPPolicy`
runs.
"""
from ppo_ref.spec.networks import (HIDDEN_GAIN, ActorCriticCache, actor_critic_backward,
                                   actor_critic_forward, actor_critic_init, value_forward)

__all__ = ["ActorCriticCache", "actor_critic_init", "actor_critic_forward",
           "actor_critic_backward", "value_forward", "HIDDEN_GAIN"]
