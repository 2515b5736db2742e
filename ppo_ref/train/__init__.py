"""Training, written once against a tier (:func:`ppo_ref.tiers.tier_for`): rollout collection
(:mod:`~ppo_ref.train.rollout`), the policies (:mod:`~ppo_ref.train.policies`), and the trainers
:class:`~ppo_ref.train.ppo.PPOTrainer` and :class:`~ppo_ref.train.recurrent_ppo.RecurrentPPOTrainer`
(collect, compute advantages, run the epochs of :mod:`ppo_ref.spec.update`, checkpoint with
:mod:`ppo_ref.io`).
"""
