"""Neural-network pieces with hand-written backward passes (plain NumPy, float64): the public
names, re-exported from the readable tier :mod:`ppo_ref.spec` (the compiled twins are in
:mod:`ppo_ref.fast`).

Modules:

* :mod:`ppo_ref.nn.init`: orthogonal initialisation with a gain (torch semantics).
* :mod:`ppo_ref.nn.mlp`: linear layer, tanh/relu, the MLP.
* :mod:`ppo_ref.nn.actor_critic`: the PPO actor-critic (separate towers or a shared trunk).
* :mod:`ppo_ref.nn.distributions`: categorical (with ``-inf`` action masking), MultiDiscrete
  and diagonal Gaussian heads: log-prob, entropy, their gradients, sampling.
* :mod:`ppo_ref.nn.lstm`: the LSTM with episode resets (imported on demand).

Every layer is a pair ``*_forward(params, x, ...) -> (y, cache)`` and
``*_backward(params, cache, dy) -> (dx, grads)``. ``params`` and ``grads`` are dicts of float64
arrays with identical keys; weights use torch's layout ``w: [out, in]`` with ``y = x @ w.T + b``;
caches are NamedTuples; a backward never mutates its inputs. Randomness comes only from an
explicit ``np.random.Generator``.
"""
from ppo_ref.nn import actor_critic, distributions, init, mlp

__all__ = ["actor_critic", "distributions", "init", "mlp"]
