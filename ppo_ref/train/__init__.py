"""Training: rollout collection (:mod:`~ppo_ref.train.rollout`), the policies that act and
learn (:mod:`~ppo_ref.train.policies`, :mod:`~ppo_ref.train.recurrent_policies`: compositions of
the networks and heads of :mod:`ppo_ref.spec` and :mod:`ppo_ref.fast`), and the trainers
:class:`~ppo_ref.train.ppo.PPOTrainer` and
:class:`~ppo_ref.train.recurrent_ppo.RecurrentPPOTrainer` (collect, compute advantages with
:mod:`ppo_ref.kernels`, run the epochs of minibatch updates, checkpoint with :mod:`ppo_ref.io`).
"""
