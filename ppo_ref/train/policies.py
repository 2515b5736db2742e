"""Policies: the MLP actor-critic (:mod:`ppo_ref.spec.networks`; compiled:
:mod:`ppo_ref.fast.actor_critic`) plus a distribution head.

A *head* turns the network's ``policy_out`` into a distribution over actions; it is written
once here and reused by the recurrent policy:

* :class:`CategoricalHead` (``gymnasium.spaces.Discrete``): ``policy_out`` are logits
  ``[B, n]``; actions are int64 ``[B]``.
* :class:`MultiCategoricalHead` (``gymnasium.spaces.MultiDiscrete``): ``policy_out`` are the
  concatenated logits ``[B, sum(nvec)]`` of independent categoricals; actions are int64
  ``[B, K]``; log-prob and entropy are sums over the components.
* :class:`GaussianHead` (``gymnasium.spaces.Box`` actions): ``policy_out`` is the mean
  ``[B, A]``; a state-independent parameter ``log_std [A]`` (key ``"log_std"``, initialised to
  ``PPOConfig.log_std_init``) gives the diagonal standard deviation. The buffer stores the raw
  sample; the environment receives ``clip(sample, low, high)`` (SB3's convention; the
  log-probability is that of the raw, unclipped sample).

Each head offers ``sample``, ``mode``, ``log_prob``, ``entropy`` and ``backward`` (the
gradient of ``sum_i d_log_probs[i] * log_prob[i] + d_entropy[i] * entropy[i]`` with respect to
``policy_out`` and the head's own parameters), delegating the math to
:mod:`ppo_ref.nn.distributions` (= :mod:`ppo_ref.spec.distributions`). The fast policies run
the categorical head's log-prob, entropy and backward by the compiled kernels of
:mod:`ppo_ref.fast.distributions` instead.

Parameters are one flat dict of float64 arrays: the network keys (``pi.*``, ``vf.*``,
``trunk.*``) plus the head's keys (``log_std`` for the Gaussian). Policies hold no parameters;
every method takes ``params`` explicitly, so a trainer, a learner and an actor can share one
policy object.

Speed: :class:`MLPPolicy` is the compiled tier. Its parameters are one
:class:`~ppo_ref.fast.flat.FlatArrays` (:meth:`MLPPolicy.init_params`, :meth:`MLPPolicy.as_flat`:
views into one float64 buffer, which :mod:`ppo_ref.fast.optim` updates at once), and every pass
(acting, values, evaluate, backward) runs the compiled towers of
:func:`ppo_ref.fast.actor_critic.flat_forward` / :func:`~ppo_ref.fast.actor_critic.flat_backward`
(evaluate and backward: their one-call drivers, with the categorical head's kernels in the same
call): fused multiply-add chains in a fixed, documented order, so a row's results never depend on the
other rows of the call nor on BLAS or the machine (the rollout's stored log-probabilities and
every minibatch's agree bit for bit). ``config.compute_dtype="float32"`` runs those passes in
float32 as torch does; parameters, gradients as returned, losses and Adam stay float64.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref.fast import workspace
from ppo_ref.fast.actor_critic import (FlatNet, acting_forward, acting_weights,
                                      categorical_backward_into, categorical_forward_into,
                                      flat_backward_into, flat_forward, flat_forward_into,
                                      flat_net, tower_tables)
from ppo_ref.fast.distributions import categorical_backward_kernel, categorical_eval_kernel
from ppo_ref.fast.flat import FlatArrays, FlatLayout, flatten_arrays, is_flat
from ppo_ref.fast.lstm import all_finite, all_finite_1d
from ppo_ref.nn.actor_critic import actor_critic_init
from ppo_ref.fast import distributions as fast_distributions
from ppo_ref.spec import distributions as spec_distributions
from ppo_ref.spec import networks

__all__ = ["head_backward", "gradient_buffer", "gradient_arrays", "PolicyBase", "SpecPolicyBase",
           "CategoricalHead", "MultiCategoricalHead", "GaussianHead", "make_head", "observation_dim", "MLPPolicy",
           "PolicyEval"]

Params = Dict[str, np.ndarray]


def observation_dim(observation_space) -> int:
    """Flat size of a ``gymnasium.spaces.Box`` observation space (``prod(shape)``).

    Observations are flattened to ``[N, obs_dim]`` float64. Raises ``ValueError`` for any
    other space (Discrete, Dict, Tuple, ...), naming it.
    """
    from gymnasium import spaces
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(f"observation_space must be a gymnasium Box (flattened to a vector); "
                         f"got {observation_space!r}. Wrap the env (e.g. FlattenObservation, "
                         f"a one-hot wrapper) to get a Box.")
    return int(np.prod(observation_space.shape, dtype=np.int64))


class CategoricalHead:
    """Categorical distribution over ``n`` discrete actions; ``policy_out`` = logits ``[B, n]``."""

    kind = "categorical"

    def __init__(self, n_actions: int, dist=spec_distributions):
        self.dist = dist
        if int(n_actions) < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        self.n_actions = int(n_actions)
        self.out_dim = self.n_actions
        self.action_shape: Tuple[int, ...] = ()
        self.action_dtype = np.dtype(np.int64)

    def init_params(self) -> Params:
        """The head's own parameters: none."""
        return {}

    def sample(self, rng, policy_out, params) -> np.ndarray:
        """int64 actions ``[B]`` drawn from ``softmax(policy_out)`` with ``rng``."""
        return self.dist.categorical_sample(rng, policy_out)

    def mode(self, policy_out, params) -> np.ndarray:
        """The most probable action per row, int64 ``[B]``."""
        return self.dist.categorical_mode(policy_out)

    def log_prob(self, policy_out, params, actions) -> np.ndarray:
        """``log softmax(policy_out)[actions]``, ``[B]`` float64."""
        return self.dist.categorical_log_prob(policy_out, actions)

    def entropy(self, policy_out, params) -> np.ndarray:
        """``-sum_k p_k log p_k`` per row, ``[B]``."""
        return self.dist.categorical_entropy(policy_out)

    def backward(self, policy_out, params, actions, d_log_probs, d_entropy):
        """``(d_policy_out [B, n], {})`` for upstream gradients ``d_log_probs``, ``d_entropy``
        (either may be ``None`` for zero)."""
        d_out = np.zeros(np.shape(policy_out), dtype=np.float64)
        if d_log_probs is not None:
            d_out += self.dist.categorical_log_prob_backward(policy_out, actions, d_log_probs)
        if d_entropy is not None:
            d_out += self.dist.categorical_entropy_backward(policy_out, d_entropy)
        return d_out, {}

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """The action array the environment receives (unchanged for Discrete)."""
        return actions


class MultiCategoricalHead:
    """Independent categoricals for ``gymnasium.spaces.MultiDiscrete(nvec)`` actions.

    ``policy_out`` are the logits ``[B, sum(nvec)]``, component ``k`` reading the consecutive
    slice of ``nvec[k]`` logits after those of components ``0 .. k-1``; actions are int64
    ``[B, K]``. ``log_prob`` and ``entropy`` are sums over the components (the distribution is
    their product: SB3 ``MultiCategoricalDistribution``, CleanRL ``ppo_multidiscrete.py``;
    the MultiDiscrete detail of Huang et al. 2022). The math is the
    ``multi_categorical_*`` of the head's ``dist`` (see :func:`make_head`).
    """

    kind = "multi_categorical"

    def __init__(self, nvec, dist=spec_distributions):
        self.dist = dist
        v = np.asarray(nvec)
        if v.ndim != 1 or v.size == 0 or v.dtype.kind not in "iu" or (v < 1).any():
            raise ValueError(f"nvec must be a non-empty 1-D array of integers >= 1, got {nvec!r}")
        self.nvec = v.astype(np.int64)
        self.out_dim = int(self.nvec.sum())
        self.action_shape: Tuple[int, ...] = (int(self.nvec.size),)
        self.action_dtype = np.dtype(np.int64)

    def init_params(self) -> Params:
        """The head's own parameters: none."""
        return {}

    def sample(self, rng, policy_out, params) -> np.ndarray:
        """int64 actions ``[B, K]``, one independent draw per component with ``rng``."""
        return self.dist.multi_categorical_sample(rng, policy_out, self.nvec)

    def mode(self, policy_out, params) -> np.ndarray:
        """Each component's most probable choice, int64 ``[B, K]``."""
        return self.dist.multi_categorical_mode(policy_out, self.nvec)

    def log_prob(self, policy_out, params, actions) -> np.ndarray:
        """``sum_k log softmax(slice_k)[actions[:, k]]``, ``[B]`` float64."""
        return self.dist.multi_categorical_log_prob(policy_out, actions, self.nvec)

    def entropy(self, policy_out, params) -> np.ndarray:
        """``sum_k H_k`` per row, ``[B]`` float64."""
        return self.dist.multi_categorical_entropy(policy_out, self.nvec)

    def backward(self, policy_out, params, actions, d_log_probs, d_entropy):
        """``(d_policy_out [B, sum(nvec)], {})`` for upstream gradients ``d_log_probs``,
        ``d_entropy`` (either may be ``None`` for zero)."""
        d_out = np.zeros(np.shape(policy_out), dtype=np.float64)
        if d_log_probs is not None:
            d_out += self.dist.multi_categorical_log_prob_backward(policy_out, actions, self.nvec,
                                                         d_log_probs)
        if d_entropy is not None:
            d_out += self.dist.multi_categorical_entropy_backward(policy_out, self.nvec, d_entropy)
        return d_out, {}

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """The action array the environment receives (unchanged for MultiDiscrete)."""
        return actions


class GaussianHead:
    """Diagonal Gaussian with a state-independent ``log_std`` parameter; ``policy_out`` = mean.

    ``low``/``high`` are the Box bounds used to clip what the environment receives.
    """

    kind = "gaussian"

    def __init__(self, action_dim: int, low: np.ndarray, high: np.ndarray, log_std_init: float = 0.0,
                 dist=spec_distributions):
        self.dist = dist
        self.action_dim = int(action_dim)
        self.out_dim = self.action_dim
        self.action_shape = (self.action_dim,)
        self.action_dtype = np.dtype(np.float64)
        self.low = np.asarray(low, dtype=np.float64).reshape(-1)
        self.high = np.asarray(high, dtype=np.float64).reshape(-1)
        self.log_std_init = float(log_std_init)

    def init_params(self) -> Params:
        """``{"log_std": full(action_dim, log_std_init)}``."""
        return {"log_std": np.full(self.action_dim, self.log_std_init, dtype=np.float64)}

    def sample(self, rng, policy_out, params) -> np.ndarray:
        """Raw (unclipped) sample ``mean + exp(log_std) * eps``, float64 ``[B, A]``."""
        return self.dist.gaussian_sample(rng, policy_out, params["log_std"])

    def mode(self, policy_out, params) -> np.ndarray:
        """The mean, float64 ``[B, A]`` (unclipped)."""
        return np.array(policy_out, dtype=np.float64, copy=True)

    def log_prob(self, policy_out, params, actions) -> np.ndarray:
        """Log-density of the raw actions, summed over action dims, ``[B]``."""
        return self.dist.gaussian_log_prob(policy_out, params["log_std"], actions)

    def entropy(self, policy_out, params) -> np.ndarray:
        """``sum_j (log_std_j + 0.5 log(2 pi e))`` broadcast to ``[B]``."""
        return self.dist.gaussian_entropy(params["log_std"], np.shape(policy_out)[:-1])

    def backward(self, policy_out, params, actions, d_log_probs, d_entropy):
        """``(d_mean [B, A], {"log_std": d_log_std [A]})``."""
        log_std = params["log_std"]
        d_mean = np.zeros(np.shape(policy_out), dtype=np.float64)
        d_log_std = np.zeros_like(log_std, dtype=np.float64)
        if d_log_probs is not None:
            dm, dls = self.dist.gaussian_log_prob_backward(policy_out, log_std, actions, d_log_probs)
            d_mean += dm
            d_log_std += dls
        if d_entropy is not None:
            d_log_std += self.dist.gaussian_entropy_backward(log_std, d_entropy)
        return d_mean, {"log_std": d_log_std}

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """``clip(actions, low, high)``: what the environment receives (the buffer keeps the raw sample)."""
        return np.clip(actions, self.low, self.high)


class FastDistributions:
    """The distribution functions the heads of the fast tier call: the compiled twins of
    :mod:`ppo_ref.fast.distributions` for categorical sampling and the MultiDiscrete
    log-probabilities, entropies and their gradients; every other function is the readable
    tier's own (:mod:`ppo_ref.spec.distributions`: the Gaussian and the categorical mode are
    cheap NumPy, and the fast policies evaluate the categorical head by their own kernels)."""
    categorical_sample = staticmethod(fast_distributions.categorical_sample)
    multi_categorical_log_prob = staticmethod(fast_distributions.multi_categorical_log_prob)
    multi_categorical_entropy = staticmethod(fast_distributions.multi_categorical_entropy)
    multi_categorical_log_prob_backward = staticmethod(
        fast_distributions.multi_categorical_log_prob_backward)
    multi_categorical_entropy_backward = staticmethod(
        fast_distributions.multi_categorical_entropy_backward)

    def __getattr__(self, name):
        return getattr(spec_distributions, name)


def make_head(action_space, config) -> Any:
    """The head for a gymnasium action space: Discrete -> categorical, 1-d MultiDiscrete ->
    independent categoricals, 1-d Box -> Gaussian; its distribution functions are those of
    ``config.backend``: :mod:`ppo_ref.spec.distributions` for ``"spec"``,
    :class:`FastDistributions` for ``"fast"`` (the same numbers: the twins are tested against
    the spec in ``tests/test_tiers.py``).

    Raises ``ValueError`` for other spaces (Dict, MultiBinary, multi-dimensional Box or
    MultiDiscrete, a nonzero start, ...).
    """
    from gymnasium import spaces
    dist = spec_distributions if config.backend == "spec" else FastDistributions()
    if isinstance(action_space, spaces.MultiDiscrete):
        if len(action_space.shape) != 1:
            raise ValueError(f"action_space MultiDiscrete must be 1-d, got shape "
                             f"{action_space.shape}")
        if np.any(action_space.start != 0):
            raise ValueError(f"action_space MultiDiscrete must start at 0, got start="
                             f"{action_space.start.tolist()}")
        return MultiCategoricalHead(action_space.nvec, dist)
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action_space Discrete must start at 0, got start={action_space.start}")
        return CategoricalHead(int(action_space.n), dist)
    if isinstance(action_space, spaces.Box):
        if len(action_space.shape) != 1:
            raise ValueError(f"action_space Box must be 1-d, got shape {action_space.shape}")
        return GaussianHead(action_space.shape[0], action_space.low, action_space.high,
                            getattr(config, "log_std_init", 0.0), dist)
    raise ValueError(f"action_space must be gymnasium Discrete, 1-d MultiDiscrete or 1-d Box, "
                     f"got {action_space!r}")


class PolicyEval(NamedTuple):
    """Result of :meth:`MLPPolicy.evaluate`: per-row ``log_probs``, ``entropy``, ``values`` ``[B]``
    (float64) and the ``cache`` :meth:`MLPPolicy.backward` needs."""
    log_probs: np.ndarray
    entropy: np.ndarray
    values: np.ndarray
    cache: Any


class _PassBuffers(NamedTuple):
    """The arrays one :meth:`MLPPolicy.evaluate` of ``B`` rows and its backward write: the
    towers' outputs buffers ``trunk_acts``, ``pi_acts``, ``vf_acts`` (compute dtype, of
    :func:`~ppo_ref.fast.actor_critic.flat_forward_into`), ``out`` (the policy output ``[B,
    P]``, a view of ``pi_acts``' last block), float64 ``values [B]``, and for a categorical
    head float64 ``log_probs``, ``entropy`` ``[B]``, ``probs [B, P]`` and the logits' gradient
    ``d_out [B, P]`` (compute dtype; all ``None`` for the other heads)."""
    trunk_acts: np.ndarray
    pi_acts: np.ndarray
    vf_acts: np.ndarray
    out: np.ndarray
    values: np.ndarray
    log_probs: Any
    entropy: Any
    probs: Any
    d_out: Any


class _MLPCache(NamedTuple):
    """Cache of :meth:`MLPPolicy.evaluate`: the parameters' layout, its
    :class:`~ppo_ref.fast.actor_critic.FlatNet`, the parameter buffer the pass used (compute
    dtype), the input rows ``x``, the pass's :class:`_PassBuffers` and the actions as
    checked."""
    layout: FlatLayout
    net: FlatNet
    flat: np.ndarray
    x: np.ndarray
    buffers: _PassBuffers
    actions: np.ndarray

    @property
    def out(self) -> np.ndarray:
        """``policy_out [B, P]`` of the pass."""
        return self.buffers.out


def _finite_grad(d, name: str, shape) -> np.ndarray:
    """An upstream per-row gradient of ``shape`` (the rows of ``evaluate``: ``(B,)``, or
    ``(T, n)`` for the recurrent policy) as a finite, C-contiguous float64 1-D array of its
    entries in row order; ``ValueError`` naming it otherwise."""
    arr = np.asarray(d, dtype=np.float64)
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (the rows of evaluate), got "
                         f"{arr.shape}")
    flat = np.ascontiguousarray(arr).reshape(-1)
    if not all_finite_1d(flat):
        raise ValueError(f"{name} must be finite")
    return flat


def head_backward(head, params, policy_out, actions, probs, entropy, d_log_probs, d_entropy,
                  dtype, d_out=None):
    """``(d_policy_out, head_grads)`` of a fast policy's head: for a categorical head (``probs``
    and ``entropy`` kept by its evaluation kernel) one pass of
    :func:`ppo_ref.fast.distributions.categorical_backward_kernel` (no head parameters) into
    ``d_out`` (C-contiguous, the shape and dtype of ``policy_out``; None: a new array), for
    the other heads their own ``backward`` (:func:`make_head`'s distribution functions), cast
    to the compute ``dtype`` C-contiguous. ``d_log_probs``, ``d_entropy`` (or ``None``): checked
    1-D float64 rows."""
    if probs is not None:
        if d_out is None:
            d_out = np.empty_like(policy_out)
        categorical_backward_kernel(probs, actions, entropy, d_log_probs,
                                    d_log_probs if d_entropy is None else d_entropy,
                                    d_entropy is not None, d_out)
        return d_out, {}
    d_out, head_grads = head.backward(policy_out, params, actions, d_log_probs, d_entropy)
    return np.ascontiguousarray(d_out, dtype=dtype), head_grads


def gradient_buffer(name: str, layout, dtype, head_keys) -> np.ndarray:
    """A reused 1-D buffer of ``layout.size`` entries of ``dtype`` (:mod:`ppo_ref.fast.workspace`
    ``name``) for a fast policy's network gradients, with the entries of ``head_keys`` (the
    head's own parameters, which the network passes do not write) set to 0, so that widening
    the buffer to float64 never reads stale values."""
    g = workspace.empty(name, (layout.size,), dtype)
    for key, start, stop, _ in layout.slices:
        if key in head_keys:
            g[start:stop] = 0.0
    return g


def gradient_arrays(g, layout, head_grads) -> FlatArrays:
    """A fast policy's gradients as float64 :class:`~ppo_ref.fast.flat.FlatArrays` in
    ``layout``: the network's buffer ``g`` (widened to a new float64 buffer when it is float32)
    with the head's own gradients (``{"log_std": ...}`` or none) written into their entries."""
    if g.dtype != np.float64:
        g = g.astype(np.float64)
    grads = FlatArrays.from_buffer(g, layout)
    for k, v in head_grads.items():
        grads[k][...] = v
    return grads


class PolicyBase:
    """What every policy shares: the flattened observation shape, the distribution head of
    :func:`make_head` for the action space, and the config. :class:`MLPPolicy` and
    :class:`ppo_ref.train.recurrent_policies.RecurrentPolicy` build on it.

    Raises:
        ValueError: unsupported observation or action space.
    """

    def __init__(self, observation_space, action_space, config):
        self.obs_dim = observation_dim(observation_space)
        self.obs_shape = tuple(observation_space.shape)
        self.head = make_head(action_space, config)
        self.activation = config.activation
        self.config = config
        self._head_keys = tuple(self.head.init_params())


class SpecPolicyBase(PolicyBase):
    """:class:`PolicyBase` of the readable tier's policies (:class:`SpecMLPPolicy`,
    :class:`ppo_ref.train.recurrent_policies.SpecRecurrentPolicy`), which compute in float64.

    Raises:
        ValueError: unsupported spaces; ``config.compute_dtype`` other than float64.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        if np.dtype(config.compute_dtype) != np.float64:
            raise ValueError(f"compute_dtype must be 'float64' for the spec backend, got "
                             f"{config.compute_dtype!r}")


class MLPPolicy(PolicyBase):
    """Feedforward actor-critic policy (compiled tier): the network of
    :mod:`ppo_ref.fast.actor_critic` + a distribution head.

    Every method runs the network by :func:`ppo_ref.fast.actor_critic.flat_forward` /
    :func:`~ppo_ref.fast.actor_critic.flat_backward` on the parameter buffer (evaluate and
    backward by their drivers :func:`~ppo_ref.fast.actor_critic.flat_forward_into` /
    :func:`~ppo_ref.fast.actor_critic.flat_backward_into`, or for a categorical head
    :func:`~ppo_ref.fast.actor_critic.categorical_forward_into` /
    :func:`~ppo_ref.fast.actor_critic.categorical_backward_into`: network and head in one
    compiled call): equal to
    ``ppo_ref.spec.networks.actor_critic_forward`` and
    ``ppo_ref.spec.networks.actor_critic_backward`` within rtol 1e-11, atol 1e-14 (relative to
    each result array's largest entry) in float64, and rtol 2e-4, atol 1e-5 in float32 (the
    ``mlp_policy``, ``mlp_policy_categorical`` and ``mlp_policy_float32`` rows of
    ``tests/test_tiers.py``); in a summation order fixed by the code, so per-row results
    are the same bits whatever the batch, BLAS or machine. With ``config.compute_dtype="float32"``
    the network runs in float32 (parameters and observations rounded to float32 once per call).

    ``params`` must be a :class:`~ppo_ref.fast.flat.FlatArrays` holding exactly this policy's
    arrays (:meth:`init_params`, or :meth:`as_flat` of a parameter dict); every method checks
    its arguments once per call and raises ``ValueError`` naming the argument (a plain dict
    is refused: convert it with :meth:`as_flat`).

    Args:
        observation_space: a gymnasium Box (flattened).
        action_space: gymnasium Discrete or 1-d Box.
        config: a :class:`~ppo_ref.config.PPOConfig` (``net_arch``, ``activation``,
            ``shared_trunk``, ``policy_head_gain``, ``value_head_gain``, ``log_std_init``,
            ``compute_dtype``).

    Raises:
        ValueError: unsupported observation or action space.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.shared_trunk = bool(config.shared_trunk)
        self.compute_dtype = np.dtype(getattr(config, "compute_dtype", "float64"))
        self._relu = self.activation == "relu"
        self._checked = None  # (layout, FlatNet) of the last parameters checked

    # -- parameters ---------------------------------------------------------------------------
    def init_params(self, rng: np.random.Generator) -> FlatArrays:
        """Fresh parameters: :func:`actor_critic_init` (orthogonal, zero biases) + head params,
        as a :class:`~ppo_ref.fast.flat.FlatArrays` in :meth:`flat_layout` (see :meth:`as_flat`)."""
        c = self.config
        params = actor_critic_init(rng, self.obs_dim, self.head.out_dim, net_arch=tuple(c.net_arch),
                                   activation=c.activation, shared_trunk=self.shared_trunk,
                                   policy_gain=c.policy_head_gain, value_gain=c.value_head_gain)
        params.update(self.head.init_params())
        return self.as_flat(params)

    def flat_layout(self, params: Mapping[str, np.ndarray]) -> FlatLayout:
        """The one-buffer layout of this policy's parameters: the keys in their order."""
        return FlatLayout.in_order([(k, np.shape(v)) for k, v in params.items()])

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> FlatArrays:
        """A copy of a parameter-shaped dict (parameters, gradients, Adam moments) as a
        :class:`~ppo_ref.fast.flat.FlatArrays` in :meth:`flat_layout`, float64: what every method
        of this policy and the one-buffer path of :mod:`ppo_ref.fast.optim` read. Values and key
        order are unchanged."""
        return flatten_arrays(arrays, self.flat_layout(arrays), dtype=np.float64)

    def _net(self, params: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if not self._head_keys:
            return params
        return {k: v for k, v in params.items() if k not in self._head_keys}

    def _check_params(self, params) -> FlatNet:
        """The :class:`~ppo_ref.fast.actor_critic.FlatNet` of ``params`` (structure checked once
        per layout), after checking that they are an intact float64 FlatArrays of this
        policy's arrays with finite entries; ``ValueError`` naming ``params`` otherwise."""
        if type(params) is FlatArrays and not params.intact():
            raise ValueError("params is a FlatArrays whose entries are no longer all views of "
                             "its buffer (an entry was replaced or removed); update entries in "
                             "place (params[k][...] = v) or rebuild with policy.as_flat(params)")
        if not is_flat(params):
            raise ValueError(f"params must be a FlatArrays (one float64 buffer) as "
                             f"MLPPolicy.init_params returns, got {type(params).__name__}; "
                             f"convert a parameter dict with policy.as_flat(params)")
        if params.flat.dtype != np.float64:
            raise ValueError(f"params must be float64, got {params.flat.dtype}")
        checked = self._checked
        if checked is None or (params.layout is not checked[0] and params.layout != checked[0]):
            net = flat_net(self._net(params), params.layout, self.shared_trunk)
            if net.obs_dim != self.obs_dim:
                raise ValueError(f"params take observations of size {net.obs_dim}, the "
                                 f"observation space has {self.obs_dim}")
            if net.policy_out_dim != self.head.out_dim:
                raise ValueError(f"params give {net.policy_out_dim} policy outputs, the action "
                                 f"space needs {self.head.out_dim}")
            for k, v in self.head.init_params().items():
                if k not in params or np.shape(params[k]) != v.shape:
                    raise ValueError(f"params[{k!r}] must have shape {v.shape}")
            checked = self._checked = (params.layout, net)
        if not all_finite(params.flat):
            bad = next(k for k, v in params.items() if not np.isfinite(v).all())
            raise ValueError(f"params[{bad!r}] must be finite")
        return checked[1]

    def _compute_flat(self, params: FlatArrays) -> np.ndarray:
        """The parameter buffer in the compute dtype (the caller's own for float64)."""
        if self.compute_dtype == np.float64:
            return params.flat
        return params.flat.astype(self.compute_dtype)

    def _check_obs(self, obs) -> np.ndarray:
        """``obs`` ``[B, *obs_shape]`` or ``[B, obs_dim]`` (B >= 1), finite, as a C-contiguous
        ``[B, obs_dim]`` array in the compute dtype; ``ValueError`` naming ``obs`` otherwise."""
        try:
            x = np.asarray(obs, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"obs must be a real array, got {type(obs).__name__}") from None
        if x.ndim == len(self.obs_shape) + 1 and x.shape[1:] == self.obs_shape:
            x = x.reshape(x.shape[0], self.obs_dim)
        elif not (x.ndim == 2 and x.shape[1] == self.obs_dim):
            raise ValueError(f"obs must have shape [B, *{self.obs_shape}] or [B, {self.obs_dim}], "
                             f"got {x.shape}")
        if x.shape[0] < 1:
            raise ValueError("obs must have at least one row")
        x = np.ascontiguousarray(x)
        if not all_finite(x):
            raise ValueError(f"obs must be finite; row {int(np.argmin(np.isfinite(x).all(axis=1)))} "
                             f"is not")
        if self.compute_dtype != np.float64:
            x = x.astype(self.compute_dtype)
        return x

    def _check_actions(self, actions, rows: int) -> np.ndarray:
        """Categorical: ``actions`` an integer array ``[rows]`` in ``[0, n)``, as int64;
        Gaussian: a finite real array ``[rows, A]``, as float64. ``ValueError`` otherwise."""
        head = self.head
        a = np.asarray(actions)
        want = (rows,) + head.action_shape
        if a.shape != want:
            raise ValueError(f"actions must have shape {want} (one per row of obs), got {a.shape}")
        if head.kind == "categorical":
            if a.dtype.kind not in "iu":  # signed or unsigned integer
                raise ValueError(f"actions must be integers, got dtype {a.dtype}")
            a = np.ascontiguousarray(a, dtype=np.int64)
            if a.min() < 0 or a.max() >= head.n_actions:
                raise ValueError(f"actions must be in [0, {head.n_actions}), got values in "
                                 f"[{a.min()}, {a.max()}]")
            return a
        try:
            a = np.ascontiguousarray(a, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"actions must be real, got dtype {a.dtype}") from None
        if not all_finite(a):
            raise ValueError("actions must be finite")
        return a

    def _head_eval(self, out, params, actions, with_entropy: bool):
        """``(log_probs [B], entropy [B] or None, probs or None)`` of ``actions`` under the
        head on ``policy_out = out``: the categorical head by one compiled pass
        (:func:`~ppo_ref.fast.distributions.categorical_eval_kernel`, whose probabilities and
        entropies the backward reads), the Gaussian by its own methods."""
        if self.head.kind == "categorical":
            n = out.shape[0]
            log_probs, entropy, probs = np.empty(n), np.empty(n), np.empty(out.shape)
            if not categorical_eval_kernel(out, actions, log_probs, entropy, probs):
                raise ValueError("params give logits for obs that are not finite or whose "
                                 "spread overflows float64 (logits - max(logits))")
            return log_probs, entropy, probs
        log_probs = self.head.log_prob(out, params, actions)
        entropy = self.head.entropy(out, params) if with_entropy else None
        return log_probs, entropy, None

    # -- acting -------------------------------------------------------------------------------
    def policy_out_fn(self, params):
        """``forward(obs) -> policy_out [B, P]`` for acting with fixed parameters (one rollout).

        ``params`` are checked and copied (cast to the compute dtype, the acting layers'
        weights stored transposed: :func:`~ppo_ref.fast.actor_critic.acting_weights`) once
        here; each call checks ``obs`` (as :meth:`evaluate`) and runs the policy tower (with a
        shared trunk: trunk + policy head) only, by
        :func:`~ppo_ref.fast.actor_critic.acting_forward`, with the arithmetic of
        :meth:`evaluate`, so a row's output is bit for bit the one :meth:`evaluate` computes
        for it. ``policy_out`` is a new array in the compute dtype.
        """
        net = self._check_params(params)
        flat_t, trunk, pi = acting_weights(net, self._compute_flat(params))
        relu = self._relu
        check_obs = self._check_obs

        def forward(obs):
            return acting_forward(check_obs(obs), flat_t, trunk, pi, relu)
        return forward

    #: The outputs of :meth:`policy_out_fn` are per row the bits :meth:`evaluate` computes (the
    #: passes are row-independent), so a rollout's log-probabilities may be taken from them
    #: (:meth:`rollout_log_probs_values`; the collector does).
    acting_outputs_exact = True

    def rollout_log_probs_values(self, params, obs, actions, policy_out):
        """``(log_probs, values)``, float64 ``[B]``: what :meth:`evaluate` ``(params, obs,
        actions)`` gives, bit for bit, when ``policy_out`` is the acting output
        ``policy_out_fn(params)(obs)`` (row by row: a rollout's steps stacked): the head's
        log-probabilities of ``actions`` on ``policy_out`` (as :meth:`evaluate` takes them on
        its own policy output, which has these bits) and the value tower alone on ``obs``
        (:meth:`values`). Saves the policy tower over the rollout's rows.

        Args:
            params, obs, actions: as :meth:`evaluate`.
            policy_out: ``[B, P]`` real (``P`` the head's ``out_dim``), the acting outputs.

        Raises:
            ValueError: as :meth:`evaluate` (named arguments), or ``policy_out`` of another
                shape.
        """
        net = self._check_params(params)
        x = self._check_obs(obs)
        a = self._check_actions(actions, x.shape[0])
        out = np.asarray(policy_out)
        if out.shape != (x.shape[0], self.head.out_dim) or out.dtype.kind != "f":
            raise ValueError(f"policy_out must be a float array of shape "
                             f"{(x.shape[0], self.head.out_dim)} (the acting outputs of obs), "
                             f"got {out.dtype} {out.shape}")
        out = np.ascontiguousarray(out, dtype=self.compute_dtype)
        values = flat_forward(net, self._compute_flat(params), x, self._relu, policy=False)[1]
        return self._head_eval(out, params, a, False)[0], values.astype(np.float64)

    def act(self, params, obs, rng) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample actions for a batch of observations ``[B, ...]``.

        Returns ``(actions, values, log_probs)``: actions int64 ``[B]`` or raw float64
        ``[B, A]``; ``values = V(obs)`` ``[B]``; ``log_probs`` of the sampled actions ``[B]``
        (float64): per row the bits :meth:`evaluate` gives.

        Raises:
            ValueError: bad ``params`` or ``obs`` (see :meth:`evaluate`).
        """
        net = self._check_params(params)
        out, values, _ = flat_forward(net, self._compute_flat(params), self._check_obs(obs),
                                      self._relu)
        actions = self.head.sample(rng, out, params)
        log_probs = self._head_eval(out, params, actions, False)[0]
        return actions, values.astype(np.float64), log_probs

    def predict(self, params, obs, rng=None, deterministic: bool = False) -> np.ndarray:
        """Actions for ``obs`` ``[B, ...]`` as the environment receives them (Gaussian: clipped).

        ``deterministic=True`` takes the mode (argmax / mean); otherwise ``rng`` is required.
        """
        if not deterministic and rng is None:
            raise ValueError("rng is required when deterministic=False")
        out = self.policy_out_fn(params)(obs)
        if deterministic:
            actions = self.head.mode(out, params)
        else:
            actions = self.head.sample(rng, out, params)
        return self.head.to_env(actions)

    def values(self, params, obs) -> np.ndarray:
        """``V(obs)`` ``[B]`` float64 (value tower only; for bootstrapping): per row the bits
        :meth:`evaluate` gives."""
        net = self._check_params(params)
        values = flat_forward(net, self._compute_flat(params), self._check_obs(obs),
                              self._relu, policy=False)[1]
        return values.astype(np.float64)

    # -- training -----------------------------------------------------------------------------
    def evaluate(self, params, obs, actions) -> PolicyEval:
        """Log-probs of given ``actions``, entropies and values under ``params``, plus a cache.

        Args:
            params: this policy's FlatArrays (:meth:`init_params` / :meth:`as_flat`), finite.
            obs: ``[B, *obs_shape]`` or ``[B, obs_dim]`` real, finite, B >= 1.
            actions: categorical: integers ``[B]`` in ``[0, n)``; Gaussian: finite reals
                ``[B, A]`` (raw samples).

        Returns:
            :class:`PolicyEval`: ``log_probs``, ``entropy``, ``values`` float64 ``[B]`` (per
            row independent of the other rows, bit for bit) and the cache of :meth:`backward`.

        Raises:
            ValueError: an argument of the wrong kind, shape or range (named), or parameters
                that overflow the logits.
        """
        net = self._check_params(params)
        x = self._check_obs(obs)
        return self._evaluate_rows(params, net, x, self._check_actions(actions, x.shape[0]))

    def _pass_buffers(self, net: FlatNet, rows: int) -> _PassBuffers:
        """Fresh :class:`_PassBuffers` for ``rows`` rows of the network ``net`` (64-byte aligned:
        :func:`ppo_ref.fast.workspace.aligned`)."""
        dt = self.compute_dtype
        pi_acts = workspace.aligned(rows * net.pi_width, dt)
        n_out = net.policy_out_dim
        out = pi_acts[rows * (net.pi_width - n_out):].reshape(rows, n_out)
        categorical = self.head.kind == "categorical"
        new = workspace.aligned
        return _PassBuffers(new(rows * net.trunk_width, dt), pi_acts,
                            new(rows * net.vf_width, dt), out, new(rows),
                            new(rows) if categorical else None,
                            new(rows) if categorical else None,
                            new((rows, n_out)) if categorical else None,
                            new((rows, n_out), dt) if categorical else None)

    def _evaluate_rows(self, params, net: FlatNet, x: np.ndarray, a: np.ndarray,
                       flat=None, buffers=None) -> PolicyEval:
        """:meth:`evaluate` of checked arguments, unchecked: ``net`` is
        ``self._check_params(params)``, ``x`` a C-contiguous ``[B, obs_dim]`` array in the
        compute dtype and ``a`` the actions as :meth:`_check_actions` gives them (or rows of
        such arrays). ``flat``: ``self._compute_flat(params)`` (made here when None);
        ``buffers``: the :class:`_PassBuffers` of ``B`` rows the pass writes (fresh ones when
        None), whose arrays the results are. The network and (categorical head) the head run
        in one compiled call (:func:`~ppo_ref.fast.actor_critic.categorical_forward_into`;
        the other heads after :func:`~ppo_ref.fast.actor_critic.flat_forward_into`)."""
        if flat is None:
            flat = self._compute_flat(params)
        b = self._pass_buffers(net, x.shape[0]) if buffers is None else buffers
        trunk, pi, vf = tower_tables(net)
        if b.probs is not None:
            if not categorical_forward_into(x, flat, trunk, pi, vf, self._relu, b.trunk_acts,
                                            b.pi_acts, b.vf_acts, b.values, a, b.log_probs,
                                            b.entropy, b.probs):
                raise ValueError("params give logits for obs that are not finite or whose "
                                 "spread overflows float64 (logits - max(logits))")
            log_probs, entropy = b.log_probs, b.entropy
        else:
            flat_forward_into(x, flat, trunk, pi, vf, self._relu, b.trunk_acts, b.pi_acts,
                              b.vf_acts, b.values, True, True)
            log_probs = self.head.log_prob(b.out, params, a)
            entropy = self.head.entropy(b.out, params)
        return PolicyEval(log_probs, entropy, b.values,
                          _MLPCache(params.layout, net, flat, x, b, a))

    def backward(self, params, cache, d_log_probs, d_entropy, d_values) -> FlatArrays:
        """Gradients of ``sum(d_log_probs * log_probs + d_entropy * entropy + d_values *
        values)`` for the rows of the :meth:`evaluate` call that made ``cache``, as a new
        float64 :class:`~ppo_ref.fast.flat.FlatArrays` in the layout of ``params`` (same keys).

        Args:
            params: the parameters given to :meth:`evaluate` (unchanged since).
            cache: its :class:`PolicyEval` ``cache``.
            d_log_probs, d_values: finite ``[B]``; d_entropy: finite ``[B]`` or ``None`` (0).

        Raises:
            ValueError: a cache not made by :meth:`evaluate` of this policy with parameters of
                this layout, or upstream gradients of the wrong shape or non-finite (named).
        """
        if not isinstance(cache, _MLPCache):
            raise ValueError(f"cache must be the cache of MLPPolicy.evaluate, got "
                             f"{type(cache).__name__}")
        self._check_params(params)
        if params.layout is not cache.layout and params.layout != cache.layout:
            raise ValueError("params must be in the layout of the params given to evaluate "
                             "(cache was made with another)")
        n = cache.out.shape[0]
        d_lp = _finite_grad(d_log_probs, "d_log_probs", (n,))
        d_v = _finite_grad(d_values, "d_values", (n,))
        d_ent = None if d_entropy is None else _finite_grad(d_entropy, "d_entropy", (n,))
        return self._backward_rows(params, cache, d_lp, d_ent, d_v, None)

    def _backward_rows(self, params, cache: _MLPCache, d_lp: np.ndarray, d_ent, d_v: np.ndarray,
                       grads) -> FlatArrays:
        """:meth:`backward` of checked arguments, unchecked: ``params`` those given to the
        :meth:`_evaluate_rows` or :meth:`evaluate` that made ``cache`` (unchanged since),
        ``d_lp``, ``d_v`` (and ``d_ent`` or None) finite C-contiguous float64 ``[B]``. The
        gradients go into a new FlatArrays when ``grads`` is None, else into ``grads`` (a
        float64 FlatArrays in the layout of ``params`` whose every entry is overwritten), which
        is returned."""
        flat = cache.flat
        dt = flat.dtype
        layout = params.layout
        if dt != np.float64:  # float32 gradients in a reused buffer, then widened
            g = gradient_buffer("mlp_policy.grads", layout, dt, self._head_keys)
        elif grads is None:
            g = np.empty(layout.size)
        else:
            g = grads.flat
        b = cache.buffers
        trunk, pi, vf = tower_tables(cache.net)
        if b.probs is not None:  # the head's backward and the network's in one call
            categorical_backward_into(cache.x, flat, trunk, pi, vf, self._relu, b.trunk_acts,
                                      b.pi_acts, b.vf_acts, b.probs, cache.actions, b.entropy,
                                      d_lp, d_lp if d_ent is None else d_ent, d_ent is not None,
                                      d_v, b.d_out, g)
            head_grads = {}
        else:
            d_out, head_grads = head_backward(self.head, params, b.out, cache.actions, None,
                                              None, d_lp, d_ent, dt)
            flat_backward_into(cache.x, flat, trunk, pi, vf, self._relu, b.trunk_acts,
                               b.pi_acts, b.vf_acts, d_out, d_v, g)
        if grads is None:
            return gradient_arrays(g, layout, head_grads)
        if g is not grads.flat:
            grads.flat[...] = g  # float32 -> float64: exact
        for k, v in head_grads.items():
            grads[k][...] = v
        return grads

    def _update_passes(self, obs, actions):
        """The rows of one PPO update checked once, and the passes the fast update's minibatches
        run on them: ``(x, a, evaluate, backward)`` for :func:`ppo_ref.fast.update.run_epochs`
        (``PPOTrainer.train_on`` on the fast backend is the one caller).

        ``x``, ``a``: ``obs`` and ``actions`` (all ``B`` rows) checked and converted as
        :meth:`evaluate` does (``ValueError`` as it raises); each minibatch's ``data`` must be
        ``(x[rows], a[rows])`` for rows in ``[0, B)`` (C-contiguous gathers of them), so it is
        not checked again. ``evaluate(params, data)`` is :meth:`evaluate` and
        ``backward(params, cache, d_log_probs, d_entropy, d_values)`` is :meth:`backward`, with
        these checks left out: ``params`` is checked in full at the first call and whenever it
        is another object than the one checked (run_epochs hands out one buffer of its own,
        written only by its step, which undoes a step whose results are not finite; each call
        still checks that its entries are views of it); the upstream gradients are those of
        run_epochs' own loss (finite float64 ``[B]``). ``backward`` writes every gradient into
        one FlatArrays of this update, overwritten at each call (run_epochs' step reads it
        before the next minibatch). Likewise ``evaluate`` writes its results (log-probs,
        entropies, values, the cache's arrays) into buffers of this update, one set per
        minibatch size, overwritten at the next call of that size: the epoch loop reads them
        (loss, backward) before it evaluates the next minibatch. The float32 compute dtype's
        parameter copy is one buffer of this update too, rewritten at each call."""
        x = self._check_obs(obs)
        a = self._check_actions(actions, x.shape[0])
        checked = [None, None]  # the params object checked, its FlatNet
        grads = []  # the update's gradient FlatArrays, made at the first backward
        buffers = {}  # rows -> _PassBuffers of checked[1]'s network
        low = self.compute_dtype != np.float64
        flat_low = []  # the compute-dtype copy of the parameters (float32)

        def evaluate(params, data):
            if params is not checked[0] or not params.intact():
                net = self._check_params(params)
                if net is not checked[1]:
                    buffers.clear()
                    flat_low.clear()
                checked[1] = net
                checked[0] = params
            x_rows = data[0]
            rows = x_rows.shape[0]
            b = buffers.get(rows)
            if b is None:
                b = buffers[rows] = self._pass_buffers(checked[1], rows)
            if low:
                if not flat_low:
                    flat_low.append(workspace.aligned(params.flat.size, self.compute_dtype))
                flat = flat_low[0]
                flat[...] = params.flat  # rounded as astype rounds
            else:
                flat = params.flat
            # a PolicyEval: the tuple (log_probs, entropy, values, cache) run_epochs unpacks
            return self._evaluate_rows(params, checked[1], x_rows, data[1], flat, b)

        def backward(params, cache, d_log_probs, d_entropy, d_values):
            if not grads:
                grads.append(FlatArrays.from_buffer(workspace.aligned(params.layout.size),
                                                    params.layout))
            return self._backward_rows(params, cache, d_log_probs, d_entropy, d_values, grads[0])
        return x, a, evaluate, backward


class SpecMLPPolicy(SpecPolicyBase):
    """The feedforward policy of the readable tier (``PPOConfig.backend = "spec"``).

    The actor-critic of :mod:`ppo_ref.spec.networks` (plain NumPy, float64) plus the head of
    :func:`make_head` (the distributions of :mod:`ppo_ref.spec.distributions`). Parameters are a
    plain dict with the same keys, shapes and initial values as :class:`MLPPolicy`'s (the same
    draws from the same generator), so a checkpoint of either backend loads into the other.
    :class:`MLPPolicy` is declared equal to this class within the tolerance stated in
    ``tests/test_tiers.py``.

    Every method computes exactly what its :class:`MLPPolicy` namesake documents: ``act``,
    ``predict``, ``values``, ``evaluate``, ``backward``, ``policy_out_fn`` (the collector's
    acting forward).

    Raises:
        ValueError: unsupported observation or action space; ``config.compute_dtype`` other
            than float64 (the readable tier computes in float64).
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.shared_trunk = bool(config.shared_trunk)

    def init_params(self, rng: np.random.Generator) -> Params:
        """Fresh parameters (:func:`ppo_ref.spec.networks.actor_critic_init` + the head's)."""
        c = self.config
        params = networks.actor_critic_init(
            rng, self.obs_dim, self.head.out_dim, net_arch=tuple(c.net_arch),
            activation=c.activation, shared_trunk=self.shared_trunk,
            policy_gain=c.policy_head_gain, value_gain=c.value_head_gain)
        params.update(self.head.init_params())
        return params

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> Params:
        """A float64 copy of a parameter-shaped dict, as a plain dict (this tier has no
        one-buffer layout; the name matches :meth:`MLPPolicy.as_flat`)."""
        return {k: np.array(v, dtype=np.float64) for k, v in arrays.items()}

    def _net(self, params: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return {k: v for k, v in params.items() if k not in self._head_keys}

    def flatten_obs(self, obs) -> np.ndarray:
        """``[B, *obs_shape]`` -> float64 ``[B, obs_dim]``."""
        obs = np.asarray(obs, dtype=np.float64)
        return obs.reshape(obs.shape[0], -1) if obs.ndim != 2 else obs

    def _forward(self, params, obs):
        return networks.actor_critic_forward(self._net(params), self.flatten_obs(obs),
                                             self.activation, self.shared_trunk)

    def policy_out_fn(self, params):
        """``forward(obs [B, obs_dim]) -> policy_out [B, P]`` with ``params`` fixed."""
        def forward(obs):
            return self._forward(params, obs)[0]
        return forward

    def act(self, params, obs, rng) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(actions, values, log_probs)`` for ``obs [B, ...]``, actions sampled with ``rng``."""
        out, values, _ = self._forward(params, obs)
        actions = self.head.sample(rng, out, params)
        return actions, values, self.head.log_prob(out, params, actions)

    def predict(self, params, obs, rng=None, deterministic: bool = False) -> np.ndarray:
        """Actions as the environment receives them (mode when ``deterministic``)."""
        out, _, _ = self._forward(params, obs)
        if deterministic:
            actions = self.head.mode(out, params)
        else:
            if rng is None:
                raise ValueError("rng is required when deterministic=False")
            actions = self.head.sample(rng, out, params)
        return self.head.to_env(actions)

    def values(self, params, obs) -> np.ndarray:
        """``V(obs)`` ``[B]`` float64."""
        return networks.value_forward(self._net(params), self.flatten_obs(obs), self.activation,
                                      self.shared_trunk)

    def evaluate(self, params, obs, actions) -> PolicyEval:
        """Log-probs of ``actions``, entropies and values under ``params``, plus the cache."""
        out, values, cache = self._forward(params, obs)
        log_probs = self.head.log_prob(out, params, actions)
        entropy = self.head.entropy(out, params)
        return PolicyEval(log_probs, entropy, values, (out, actions, cache))

    def backward(self, params, cache, d_log_probs, d_entropy, d_values) -> Params:
        """Gradients (keys of ``params``) of ``sum(d_log_probs * log_probs + d_entropy *
        entropy + d_values * values)`` over the rows of the :meth:`evaluate` that made
        ``cache``."""
        out, actions, net_cache = cache
        d_out, head_grads = self.head.backward(out, params, actions, d_log_probs, d_entropy)
        grads = networks.actor_critic_backward(self._net(params), net_cache, d_out,
                                               np.asarray(d_values, dtype=np.float64))
        grads.update(head_grads)
        return {k: grads[k] for k in params}


def make_mlp_policy(observation_space, action_space, config):
    """The feedforward policy of ``config.backend``: :class:`SpecMLPPolicy` for ``"spec"``,
    :class:`MLPPolicy` for ``"fast"``."""
    if config.backend == "spec":
        return SpecMLPPolicy(observation_space, action_space, config)
    return MLPPolicy(observation_space, action_space, config)
