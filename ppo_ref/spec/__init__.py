"""The readable tier of ppo_ref: every computation, once, in plain NumPy float64.

These functions define what ppo_ref computes, in the notation of the papers they cite (each
equation in the docstring of the function that implements it). The algorithm's steps
(:mod:`ppo_ref.spec.update`) run as written under both backends; the leaf computations have
compiled twins of the same names in :mod:`ppo_ref.fast` (:func:`ppo_ref.tiers.tier_for`), and
where the readable form is a loop, the compiled tier compiles this very function. Randomness
comes only from an explicit ``np.random.Generator``.

Modules, in the order the data flows: :mod:`~ppo_ref.spec.masks` (episode starts, the bootstrap
and trace masks), :mod:`~ppo_ref.spec.advantages` (GAE, V-trace),
:mod:`~ppo_ref.spec.normalization` (running observation statistics),
:mod:`~ppo_ref.spec.layers` (orthogonal init, linear, tanh, relu, MLP),
:mod:`~ppo_ref.spec.networks` (the MLP actor-critic), :mod:`~ppo_ref.spec.lstm` (the LSTM with
episode resets), :mod:`~ppo_ref.spec.recurrent_networks` (the LSTM actor-critic),
:mod:`~ppo_ref.spec.distributions` (categorical with action masks, MultiDiscrete, diagonal
Gaussian), :mod:`~ppo_ref.spec.losses` (the PPO losses with their gradients),
:mod:`~ppo_ref.spec.optim` (Adam, global-norm clipping, schedules), :mod:`~ppo_ref.spec.update`
(the minibatch loss, the epoch loop, minibatching).
"""
