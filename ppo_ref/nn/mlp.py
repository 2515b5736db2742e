"""Linear layers, tanh/relu activations and the MLP (public names): the readable definitions of
:mod:`ppo_ref.spec.layers`, re-exported.

Two tiers: :mod:`ppo_ref.spec.layers` defines the computation (``*_forward(params, x) -> (y,
cache)`` / ``*_backward(params, cache, dy) -> (dx, grads)``, torch layout ``w [out, in]``, ``y =
x @ w.T + b``); :mod:`ppo_ref.fast.mlp` holds the compiled towers on a flat parameter buffer
(equal to ``mlp_forward`` / ``mlp_backward`` within rtol 1e-12) that the fast policies run.
"""
from ppo_ref.spec.layers import (ACTIVATIONS, ActivationCache, LinearCache, MLPCache,
                                 linear_backward, linear_forward, linear_init, mlp_backward,
                                 mlp_forward, mlp_init, relu_backward, relu_forward,
                                 tanh_backward, tanh_forward)

__all__ = [
    "ACTIVATIONS", "LinearCache", "ActivationCache", "MLPCache",
    "linear_init", "linear_forward", "linear_backward",
    "tanh_forward", "tanh_backward", "relu_forward", "relu_backward",
    "mlp_init", "mlp_forward", "mlp_backward",
]
