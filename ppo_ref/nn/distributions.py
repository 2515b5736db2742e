"""Action distributions of the PPO policy head (public names): the readable definitions of
:mod:`ppo_ref.spec.distributions`, re-exported.

Categorical over logits (``-inf`` masks an action), MultiDiscrete (independent categoricals over
consecutive logit slices) and diagonal Gaussian (state-independent ``log_std``): log-prob,
entropy, their gradients, sampling, mode. The policy heads (:mod:`ppo_ref.train.policies`) call these.
The compiled tier, :mod:`ppo_ref.fast.distributions`, holds the categorical kernels of the fast
policies and the compiled MultiDiscrete functions (equal within rtol 1e-12).
"""
from ppo_ref.spec.distributions import (
    categorical_entropy, categorical_entropy_backward, categorical_log_prob,
    categorical_log_prob_backward, categorical_mode, categorical_sample, gaussian_entropy,
    gaussian_entropy_backward, gaussian_log_prob, gaussian_log_prob_backward, gaussian_sample,
    log_softmax, multi_categorical_entropy, multi_categorical_entropy_backward,
    multi_categorical_log_prob, multi_categorical_log_prob_backward, multi_categorical_mode,
    multi_categorical_sample,
)

__all__ = [
    "log_softmax", "categorical_entropy", "categorical_log_prob", "categorical_log_prob_backward",
    "categorical_entropy_backward", "categorical_sample", "categorical_mode",
    "gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
    "gaussian_entropy_backward", "gaussian_sample",
    "multi_categorical_log_prob", "multi_categorical_entropy",
    "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
    "multi_categorical_sample", "multi_categorical_mode",
]
