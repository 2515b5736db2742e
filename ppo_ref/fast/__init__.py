"""The compiled tier: faster versions of the readable tier's computations (:mod:`ppo_ref.spec`).

:mod:`ppo_ref.spec` defines every computation (plain NumPy, float64, the papers' notation).
This package holds what runs faster: numba kernels through :func:`ppo_ref._numba.njit`,
parameters in one flat buffer, fused passes, reuse pools. Each function here names, in its
docstring, the spec function it equals and how: bit for bit, or within a stated rtol and
atol, the tolerance of its row in ``tests/test_tiers.py``.

Modules:

* :mod:`ppo_ref.fast.advantages`: ``njit`` of the spec's mask and advantage loops
  (:mod:`ppo_ref.spec.masks`, :mod:`ppo_ref.spec.advantages`), bit for bit; the public
  validating wrappers are :mod:`ppo_ref.kernels`.
* :mod:`ppo_ref.fast.lstm`: the compiled LSTM (twins of :mod:`ppo_ref.spec.lstm`'s
  ``lstm_forward``, ``lstm_backward``, ``lstm_step``, rtol 1e-12, atol 1e-14) and the
  FMA-chain product, ``tanh`` and finiteness primitives every compiled network here uses.
* :mod:`ppo_ref.fast.mlp`: MLP towers on a flat parameter buffer (twins of
  :func:`ppo_ref.spec.layers.mlp_forward` / ``mlp_backward``, rtol 1e-12, atol 1e-14), and two
  towers at once (``mlp_forward_pair``, ``mlp_backward_pair``).
* :mod:`ppo_ref.fast.actor_critic`: the MLP actor-critic on one buffer (twins of
  :mod:`ppo_ref.spec.networks`' forward and backward, rtol 1e-11, atol 1e-14).
* :mod:`ppo_ref.fast.distributions`: the categorical kernels of the fast policies and the
  compiled MultiDiscrete functions (twins of :mod:`ppo_ref.spec.distributions`, rtol 1e-12).
* :mod:`ppo_ref.fast.losses`: the one-pass minibatch loss kernel (the spec's ``policy_loss``,
  ``value_loss`` and ``approx_kl``, bit for bit) and the compiled ``normalize_advantages``
  (bit for bit).
* :mod:`ppo_ref.fast.optim`: the fused in-place clipped-Adam step on one buffer
  (``clip_by_global_norm`` then ``adam_update`` of :mod:`ppo_ref.spec.optim`; rtol 1e-14
  when clipping, bit for bit when not, the norm's summation order aside).
* :mod:`ppo_ref.fast.update`: the trainers' update (:func:`ppo_ref.spec.update.minibatch_loss`
  bit for bit; :func:`ppo_ref.spec.update.run_epochs` up to the global norm's summation order)
  and their minibatches (:func:`ppo_ref.spec.update.feedforward_minibatches` and
  ``recurrent_minibatches``, bit for bit, gathered for all epochs at once when no KL stop).
* :mod:`ppo_ref.fast.sums`: NumPy's pairwise summation order written out (the sums the spec
  takes with ``np.sum``/``np.mean``: the entropy mean, each array's sum of squares of the
  global norm).
* :mod:`ppo_ref.fast.flat`, :mod:`ppo_ref.fast.workspace`: the one-buffer parameter dicts and
  the reuse pools of large scratch arrays (speed layouts, not math: no spec twin).

Threads: the loops whose iterations share nothing they write (the two LSTMs of the stacked
helpers, the two towers of the ``*_pair`` functions, the entries of the Adam step) run on
numba's threads (``ppo_ref._numba``, "Threads"); no result depends on the number of threads.
The public modules ``ppo_ref.nn.*``, ``ppo_ref.losses`` and ``ppo_ref.optim`` re-export the
spec; the trainers and the fast policies (:class:`ppo_ref.train.policies.MLPPolicy`,
:class:`ppo_ref.train.recurrent_policies.RecurrentPolicy`) call this package.
"""

#: Dotted names of every public function of the compiled tier: each public (no leading
#: underscore) function defined in a ``ppo_ref.fast`` module (its ``__all__``, classes aside),
#: plus the private compiled kernels that are the direct twins of spec functions. A test table
#: pairing the tiers covers these; the entries of ``flat``, ``workspace`` and
#: ``optim.check_flat_step_arguments`` are infrastructure with no spec twin.
FAST_FUNCTIONS = (
    # advantages and masks: njit of the spec loops (bit for bit)
    "ppo_ref.fast.advantages.gae_recursion",
    "ppo_ref.fast.advantages.vtrace_recursion",
    "ppo_ref.fast.advantages.log_ratios",
    "ppo_ref.fast.advantages.transition_masks_loop",
    "ppo_ref.fast.advantages.episode_starts_loop",
    # LSTM
    "ppo_ref.fast.lstm.lstm_forward",
    "ppo_ref.fast.lstm.lstm_backward",
    "ppo_ref.fast.lstm.lstm_step",
    "ppo_ref.fast.lstm.forward_stacked",
    "ppo_ref.fast.lstm.backward_stacked",
    "ppo_ref.fast.lstm.step_stacked",
    # MLP towers (twins of spec.layers.mlp_forward / mlp_backward)
    "ppo_ref.fast.mlp.mlp_forward_flat",
    "ppo_ref.fast.mlp.mlp_backward_flat",
    "ppo_ref.fast.mlp.mlp_forward_pair",
    "ppo_ref.fast.mlp.mlp_backward_pair",
    # actor-critic on one buffer
    "ppo_ref.fast.actor_critic.flat_net",
    "ppo_ref.fast.actor_critic.flat_forward",
    "ppo_ref.fast.actor_critic.flat_backward",
    "ppo_ref.fast.actor_critic.flat_forward_into",
    "ppo_ref.fast.actor_critic.flat_backward_into",
    "ppo_ref.fast.actor_critic.categorical_forward_into",
    "ppo_ref.fast.actor_critic.categorical_backward_into",
    "ppo_ref.fast.actor_critic.tower_tables",
    "ppo_ref.fast.actor_critic.acting_weights",
    "ppo_ref.fast.actor_critic.acting_forward",
    # distributions
    "ppo_ref.fast.distributions.inverse_cdf_actions",
    "ppo_ref.fast.distributions.categorical_sample",
    "ppo_ref.fast.distributions.categorical_eval_kernel",
    "ppo_ref.fast.distributions.categorical_backward_kernel",
    "ppo_ref.fast.distributions.multi_categorical_log_prob",
    "ppo_ref.fast.distributions.multi_categorical_entropy",
    "ppo_ref.fast.distributions.multi_categorical_log_prob_backward",
    "ppo_ref.fast.distributions.multi_categorical_entropy_backward",
    # losses and update
    "ppo_ref.fast.update._loss_pass",  # runs ppo_ref.fast.losses._minibatch_loss_kernel
    "ppo_ref.fast.losses._normalize_advantages_kernel",
    "ppo_ref.fast.update.minibatch_loss",
    "ppo_ref.fast.update.run_epochs",
    "ppo_ref.fast.update.feedforward_minibatches",
    "ppo_ref.fast.update.recurrent_minibatches",
    "ppo_ref.fast.update.epoch_permutations",
    # NumPy's pairwise summation order, written out (the entropy mean, the global norm)
    "ppo_ref.fast.sums.pairwise_sum",
    # optimizer
    "ppo_ref.fast.optim.clipped_adam_step",
    "ppo_ref.fast.optim.check_flat_step_arguments",
    # one-buffer parameters and reuse pools (no spec twin)
    "ppo_ref.fast.flat.flatten_arrays",
    "ppo_ref.fast.flat.is_flat",
    "ppo_ref.fast.flat.same_layout",
    "ppo_ref.fast.workspace.empty",
    "ppo_ref.fast.workspace.aligned",
    # helpers the trainers and policies share (no spec twin)
    "ppo_ref.fast.lstm.keep_rows",
    "ppo_ref.fast.lstm.all_finite",
    "ppo_ref.fast.lstm.all_finite_1d",
    "ppo_ref.fast.mlp.layer_table",
)

#: The entries of :data:`FAST_FUNCTIONS` that are machinery, not math, so have no spec twin:
#: the one-buffer parameter dicts, the reuse pools, the fused step's argument check, the
#: layer tables as the actor-critic's compiled drivers read them, and the pairwise sum (whose
#: reference is NumPy's own summation order; ``tests/test_sums.py`` checks it against an
#: oracle of that order, and the loss and Adam rows of ``tests/test_tiers.py`` cover it).
NO_TWIN = (
    "ppo_ref.fast.flat.flatten_arrays",
    "ppo_ref.fast.flat.is_flat",
    "ppo_ref.fast.flat.same_layout",
    "ppo_ref.fast.workspace.empty",
    "ppo_ref.fast.workspace.aligned",
    "ppo_ref.fast.optim.check_flat_step_arguments",
    "ppo_ref.fast.lstm.keep_rows",
    "ppo_ref.fast.lstm.all_finite",
    "ppo_ref.fast.lstm.all_finite_1d",
    "ppo_ref.fast.actor_critic.tower_tables",
    "ppo_ref.fast.sums.pairwise_sum",
)
