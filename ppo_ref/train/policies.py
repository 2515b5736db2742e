"""The policies: an actor-critic network plus a distribution head, written once against a tier.

A policy composes the leaf computations of its :class:`~ppo_ref.tiers.Tier` (``config.backend``,
:func:`ppo_ref.tiers.tier_for`) and never asks which tier it holds: :class:`MLPPolicy` runs
``tier.networks``, :class:`RecurrentPolicy` ``tier.recurrent_networks`` (its state is carried by
the rollout). A *head* (:func:`make_head`) turns the network's ``policy_out`` into a
distribution of ``tier.distributions``.

Parameters are one dict of float64 arrays (the network's keys plus the head's ``log_std``);
policies hold none, so a trainer, a learner and actors share one policy object.
``config.compute_dtype="float32"`` runs network and head in float32; parameters, returned
gradients, losses and Adam stay float64. ``evaluate`` recomputes what acting recorded with the
same per-row arithmetic, so the first minibatch of an update has ratio 1 (exactly on the
compiled tier, to rounding on the readable one, whose products are BLAS's).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref._checks import check_positive_int
from ppo_ref.spec.networks import actor_critic_init
from ppo_ref.spec.recurrent_networks import LSTMStates, lstm_names, recurrent_actor_critic_init

__all__ = ["CategoricalHead", "MultiCategoricalHead", "GaussianHead", "GSDEHead", "make_head",
           "observation_dim", "Acted", "MLPPolicy", "RecurrentPolicy", "make_policy"]

Params = Dict[str, np.ndarray]


def observation_dim(observation_space) -> int:
    """Flat size of a ``gymnasium.spaces.Box`` observation space (``prod(shape)``); observations
    are flattened to ``[N, obs_dim]``. Raises ``ValueError`` naming any other space."""
    from gymnasium import spaces
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(f"observation_space must be a gymnasium Box (flattened to a vector); "
                         f"got {observation_space!r}. Wrap the env (e.g. FlattenObservation, "
                         f"a one-hot wrapper) to get a Box.")
    return int(np.prod(observation_space.shape, dtype=np.int64))


class CategoricalHead:
    """Categorical distribution over ``n`` actions; ``policy_out`` = logits ``[B, n]``."""

    def __init__(self, n_actions: int, dist):
        self.dist = dist
        self.out_dim = int(n_actions)
        self.action_shape: Tuple[int, ...] = ()
        self.action_dtype = np.dtype(np.int64)

    #: whether ``policy_out`` carries the latent features after the head's own outputs (gSDE)
    uses_latent = False

    def init_params(self) -> Params:
        return {}

    def sample(self, rng, out, params, noise=None):
        """Actions drawn with ``rng`` (``noise``: :class:`GSDEHead`'s alone)."""
        return self.dist.categorical_sample(rng, out)

    def mode(self, out, params):
        return self.dist.categorical_mode(out)

    def log_prob(self, out, params, actions):
        return self.dist.categorical_log_prob(out, actions)

    def entropy(self, out, params):
        return self.dist.categorical_entropy(out)

    def log_prob_entropy(self, out, params, actions):
        """``(log_prob, entropy)``: what the update evaluates per minibatch."""
        return self.dist.categorical_log_prob_entropy(out, actions)

    def backward(self, out, params, actions, d_log_probs, d_entropy):
        """``(d_policy_out, head_grads)`` for the upstream gradients (``d_entropy`` may be
        None: zero)."""
        return self.dist.categorical_log_prob_entropy_backward(out, actions, d_log_probs,
                                                               d_entropy), {}

    def to_env(self, actions):
        return actions


class MultiCategoricalHead(CategoricalHead):
    """Independent categoricals of ``MultiDiscrete(nvec)``: component ``k`` reads the ``nvec[k]``
    logits after those of components ``0 .. k-1`` (SB3 ``MultiCategoricalDistribution``)."""

    def __init__(self, nvec, dist):
        super().__init__(int(np.sum(nvec)), dist)
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.action_shape = (int(self.nvec.size),)

    def sample(self, rng, out, params, noise=None):
        return self.dist.multi_categorical_sample(rng, out, self.nvec)

    def mode(self, out, params):
        return self.dist.multi_categorical_mode(out, self.nvec)

    def log_prob(self, out, params, actions):
        return self.dist.multi_categorical_log_prob(out, actions, self.nvec)

    def entropy(self, out, params):
        return self.dist.multi_categorical_entropy(out, self.nvec)

    def log_prob_entropy(self, out, params, actions):
        return self.log_prob(out, params, actions), self.entropy(out, params)

    def backward(self, out, params, actions, d_log_probs, d_entropy):
        d_out = self.dist.multi_categorical_log_prob_backward(out, actions, self.nvec, d_log_probs)
        if d_entropy is not None:
            d_out = d_out + self.dist.multi_categorical_entropy_backward(out, self.nvec, d_entropy)
        return d_out, {}


class GaussianHead:
    """Diagonal Gaussian with a state-independent ``log_std``; ``policy_out`` = mean ``[B, A]``;
    ``low``/``high`` are the Box bounds that clip what the environment receives."""

    uses_latent = False

    def __init__(self, action_dim: int, low, high, log_std_init: float, dist):
        self.dist = dist
        self.out_dim = int(action_dim)
        self.action_shape = (self.out_dim,)
        self.action_dtype = np.dtype(np.float64)
        self.low = np.asarray(low, dtype=np.float64).reshape(-1)
        self.high = np.asarray(high, dtype=np.float64).reshape(-1)
        self.log_std_init = float(log_std_init)

    def init_params(self) -> Params:
        return {"log_std": np.full(self.out_dim, self.log_std_init)}

    def sample(self, rng, out, params, noise=None):
        return self.dist.gaussian_sample(rng, out, params["log_std"])

    def mode(self, out, params):
        return np.array(out, dtype=np.float64)

    def log_prob(self, out, params, actions):
        return self.dist.gaussian_log_prob(out, params["log_std"], actions)

    def entropy(self, out, params):
        return self.dist.gaussian_entropy(params["log_std"], np.shape(out)[:-1])

    def log_prob_entropy(self, out, params, actions):
        return self.log_prob(out, params, actions), self.entropy(out, params)

    def backward(self, out, params, actions, d_log_probs, d_entropy):
        d_mean, d_log_std = self.dist.gaussian_log_prob_backward(out, params["log_std"], actions,
                                                                 d_log_probs)
        if d_entropy is not None:
            d_log_std = d_log_std + self.dist.gaussian_entropy_backward(params["log_std"],
                                                                        d_entropy)
        return d_mean, {"log_std": d_log_std}

    def to_env(self, actions):
        """``clip(actions, low, high)``: what the environment receives."""
        return np.clip(actions, self.low, self.high)


class GSDEHead(GaussianHead):
    """gSDE (:func:`ppo_ref.spec.distributions.gsde_log_prob`; ``config.use_sde``): ``policy_out
    [B, A + L]`` is the mean ``[B, A]`` followed by the latent features ``phi [B, L]``
    (:func:`ppo_ref.spec.networks.policy_latent`); the parameter ``log_std`` is ``[L, A]``
    (``config.full_std``) or ``[L, 1]``, every entry ``config.log_std_init``. Acting adds
    ``phi @ E`` with the env's exploration matrix ``E`` (:meth:`exploration_matrices`, drawn by
    the rollout at its start and every ``config.sde_sample_freq`` steps); the mode is the mean.

    The features receive gradient through the mean only: the distribution's gradient in them
    (``d_features``, which the spec computes) is not propagated, as in SB3's PPO, which fixes
    ``learn_features=False`` and offers no option for it.
    """

    uses_latent = True

    def __init__(self, action_dim: int, low, high, latent_dim: int, config, dist):
        super().__init__(action_dim, low, high, config.log_std_init, dist)
        self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        self.std_cols = self.out_dim if config.full_std else 1
        self.use_expln = bool(config.use_expln)

    def init_params(self) -> Params:
        return {"log_std": np.full((self.latent_dim, self.std_cols), self.log_std_init)}

    def _split(self, out):
        return out[:, :self.out_dim], out[:, self.out_dim:]

    def exploration_matrices(self, rng, params, n: int):
        """``[n, L, A]`` exploration matrices drawn with ``rng`` from ``params["log_std"]``."""
        return self.dist.gsde_exploration_matrices(rng, params["log_std"], n, self.out_dim,
                                                   self.use_expln)

    def sample(self, rng, out, params, noise=None):
        """``mean + phi @ E`` per row, ``E = noise[row]``; ``noise`` None (``predict``): a new
        matrix per row drawn with ``rng``."""
        if noise is None:
            noise = self.exploration_matrices(rng, params, out.shape[0])
        mean, phi = self._split(out)
        return self.dist.gsde_action(mean, phi, noise)

    def mode(self, out, params):
        return np.array(self._split(out)[0], dtype=np.float64)

    def log_prob(self, out, params, actions):
        mean, phi = self._split(out)
        return self.dist.gsde_log_prob(mean, params["log_std"], phi, actions, self.use_expln)

    def entropy(self, out, params):
        return self.dist.gsde_entropy(params["log_std"], self._split(out)[1], self.out_dim,
                                      self.use_expln)

    def backward(self, out, params, actions, d_log_probs, d_entropy):
        """``(d_mean [B, A], {"log_std": ...})``: the gradient in the mean, for the network."""
        mean, phi = self._split(out)
        d_mean, d_log_std, _ = self.dist.gsde_log_prob_backward(
            mean, params["log_std"], phi, actions, d_log_probs, self.use_expln)
        if d_entropy is not None:
            d_log_std = d_log_std + self.dist.gsde_entropy_backward(
                params["log_std"], phi, self.out_dim, d_entropy, self.use_expln)[0]
        return d_mean, {"log_std": d_log_std}


def make_head(action_space, config, dist, latent_dim: Optional[int] = None):
    """The head of a gymnasium action space (Discrete, 1-d MultiDiscrete, 1-d Box; with
    ``config.use_sde`` a :class:`GSDEHead` on ``latent_dim`` features) on the distribution
    module ``dist`` (``tier.distributions``). Raises ``ValueError`` for other spaces, ones that
    do not start at 0, or ``use_sde`` with an action space that is not a Box or a
    ``latent_dim`` that is not a positive int."""
    from gymnasium import spaces
    if config.use_sde and not isinstance(action_space, spaces.Box):
        raise ValueError(f"use_sde=True needs a Box action space (gSDE is continuous "
                         f"exploration), got {action_space!r}")
    if isinstance(action_space, spaces.MultiDiscrete):
        if len(action_space.shape) != 1 or np.any(action_space.start != 0):
            raise ValueError(f"action_space MultiDiscrete must be 1-d and start at 0, got "
                             f"{action_space!r}")
        return MultiCategoricalHead(action_space.nvec, dist)
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action_space Discrete must start at 0, got start="
                             f"{action_space.start}")
        return CategoricalHead(int(action_space.n), dist)
    if isinstance(action_space, spaces.Box):
        if len(action_space.shape) != 1:
            raise ValueError(f"action_space Box must be 1-d, got shape {action_space.shape}")
        if config.use_sde:
            return GSDEHead(action_space.shape[0], action_space.low, action_space.high,
                            latent_dim, config, dist)
        return GaussianHead(action_space.shape[0], action_space.low, action_space.high,
                            config.log_std_init, dist)
    raise ValueError(f"action_space must be gymnasium Discrete, 1-d MultiDiscrete or 1-d Box, "
                     f"got {action_space!r}")


class Acted(NamedTuple):
    """What one acting step returns: ``actions`` (as the buffer keeps them: Gaussian raw
    samples), the ``policy_out`` they were drawn from, the ``values`` the step computed (None
    when the policy computes them for the whole rollout afterwards: :meth:`MLPPolicy.behaviour`)
    and the recurrent ``state`` after the step (None for a policy without memory)."""
    actions: np.ndarray
    policy_out: np.ndarray
    values: Optional[np.ndarray]
    state: Optional[LSTMStates]


class _Policy:
    """What both policies share: spaces, head, compute dtype, the acting and prediction steps."""

    recurrent = False

    def __init__(self, observation_space, action_space, config, tier):
        self.tier = tier
        self.config = config
        self.obs_dim = observation_dim(observation_space)
        self.obs_shape = tuple(observation_space.shape)
        if config.use_sde and self.recurrent:
            raise ValueError("use_sde=True (gSDE; a zoo default of the Pendulum-v1 and "
                             "MountainCarContinuous-v0 rows) is not supported with the recurrent "
                             "(LSTM) policy: set use_sde=False (--set use_sde=false)")
        latent_dim = config.net_arch[-1] if config.net_arch else self.obs_dim
        self.head = make_head(action_space, config, tier.distributions, latent_dim)
        self.head_keys = tuple(self.head.init_params())
        self.dtype = np.dtype(config.compute_dtype)

    def init_params(self, rng: np.random.Generator) -> Params:
        """The network's parameters drawn from ``rng`` with the config's settings
        (:func:`~ppo_ref.spec.networks.actor_critic_init` or
        :func:`~ppo_ref.spec.recurrent_networks.recurrent_actor_critic_init`), plus the head's."""
        c = self.config
        params = self._init(rng, self.obs_dim, self.head.out_dim, net_arch=tuple(c.net_arch),
                            activation=c.activation, policy_gain=c.policy_head_gain,
                            value_gain=c.value_head_gain, ortho_init=bool(c.ortho_init),
                            **self._init_options)
        params.update(self.head.init_params())
        return params

    def compute_params(self, params: Params) -> Params:
        """``params`` in the compute dtype (the same dict for float64)."""
        if self.dtype == np.float64:
            return params
        return {k: v.astype(self.dtype) for k, v in params.items()}

    def _net(self, params: Params) -> Params:
        """The network's part of ``params`` (without the head's ``log_std``)."""
        if not self.head_keys:
            return params
        return {k: v for k, v in params.items() if k not in self.head_keys}

    def _grads(self, params: Params, net_grads: Params, head_grads: Params) -> Params:
        """float64 gradients with the keys (and key order) of ``params``."""
        if not head_grads and self.dtype == np.float64:  # the network's, in the key order
            return net_grads
        grads = {**net_grads, **head_grads}
        return {k: np.asarray(grads[k], dtype=np.float64) for k in params}

    def act(self, cparams: Params, obs, state, episode_starts, rng, noise=None) -> Acted:
        """One acting step for ``N`` envs with parameters in the compute dtype
        (:meth:`compute_params`): actions sampled with ``rng`` from ``obs [N, obs_dim]`` (and,
        for the recurrent policy, the state before the step, reset where ``episode_starts``;
        for :class:`GSDEHead`, ``noise``: the envs' exploration matrices ``[N, L, A]``)."""
        out, values, state = self._step(cparams, obs, state, episode_starts)
        return Acted(self.head.sample(rng, out, cparams, noise), out, values, state)

    def behaviour(self, cparams: Params, observations, actions, policy_outs, acted_values):
        """``(log_probs, values)`` ``[B]`` of acted rows: the behaviour log-probabilities of
        ``actions`` under the ``policy_outs`` they were drawn from, and the values of
        ``observations`` under the acting parameters (those the acting steps returned,
        concatenated, when they computed them)."""
        log_probs = self.head.log_prob(policy_outs, cparams, actions)
        if acted_values[0] is None:
            return log_probs, self.values(cparams, observations, None, None)
        return log_probs, np.concatenate(acted_values)

    def predict(self, params: Params, obs, state, episode_starts, rng, deterministic: bool):
        """``(env_actions, state)``: actions as the environment receives them (Gaussian:
        clipped) for float64 ``obs [B, obs_dim]``, sampled with ``rng`` or the mode when
        ``deterministic``."""
        cparams = self.compute_params(params)
        out, _, state = self._step(cparams, obs, state, episode_starts)
        actions = (self.head.mode(out, cparams) if deterministic
                   else self.head.sample(rng, out, cparams))
        return self.head.to_env(actions), state

    def evaluate(self, params: Params, data) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """``(log_probs, entropy, values, cache)`` ``[B]`` of the rows of ``data`` under
        ``params``: what :func:`ppo_ref.spec.update.run_epochs` calls (``data``: the subclass's
        :meth:`_network_forward`)."""
        cparams = self.compute_params(params)
        out, values, actions, net_cache = self._network_forward(self._net(cparams), data)
        log_probs, entropy = self.head.log_prob_entropy(out, cparams, actions)
        return log_probs, entropy, values, (cparams, out, actions, net_cache)

    def backward(self, params: Params, cache, d_log_probs, d_entropy, d_values) -> Params:
        """float64 gradients (keys of ``params``) of ``sum(d_log_probs * log_probs + d_entropy *
        entropy + d_values * values)`` ``[B]`` for the ``cache`` of :meth:`evaluate`
        (``d_entropy`` None: zero)."""
        cparams, out, actions, net_cache = cache
        dtype = self.dtype
        d_out, head_grads = self.head.backward(
            out, cparams, actions, d_log_probs.astype(dtype, copy=False),
            None if d_entropy is None else d_entropy.astype(dtype, copy=False))
        net_grads = self._network_backward(self._net(cparams), net_cache, d_out,
                                           d_values.astype(dtype, copy=False))
        return self._grads(params, net_grads, head_grads)


class MLPPolicy(_Policy):
    """Feedforward actor-critic (:mod:`ppo_ref.spec.networks` on the tier) and a head.

    Args: a gymnasium Box ``observation_space`` (flattened), an action space for
    :func:`make_head`, a :class:`~ppo_ref.config.PPOConfig` (``net_arch``, ``activation``,
    ``shared_trunk``, ``policy_head_gain``, ``value_head_gain``, ``log_std_init``,
    ``compute_dtype``) and the tier. Raises ``ValueError`` for unsupported spaces.
    """

    _init = staticmethod(actor_critic_init)

    def __init__(self, observation_space, action_space, config, tier):
        super().__init__(observation_space, action_space, config, tier)
        self._net_args = (config.activation, bool(config.shared_trunk))
        self._init_options = {"shared_trunk": bool(config.shared_trunk)}

    def initial_state(self, n_envs: int) -> None:
        """No memory: None."""
        return None

    def _step(self, cparams, obs, state, episode_starts):
        if self.head.uses_latent:  # (the latent features come from the whole pass's cache)
            out, values, _, _ = self._network_forward(self._net(cparams), (obs, None))
            return out, np.array(values), None   # (a copy: not a view of a pass buffer)
        out = self.tier.networks.policy_forward(self._net(cparams),
                                                obs.astype(self.dtype, copy=False),
                                                *self._net_args)
        return out, None, None

    def values(self, cparams: Params, obs, state, episode_starts) -> np.ndarray:
        """``V(obs)`` ``[B]`` (bootstrap values) with compute-dtype parameters."""
        return self.tier.networks.value_forward(self._net(cparams),
                                                obs.astype(self.dtype, copy=False),
                                                *self._net_args)

    def _network_forward(self, net_params: Params, data):
        """``(policy_out, values, actions, cache)`` of ``data = (obs [B, obs_dim], actions [B,
        ...])``; with a head that ``uses_latent``, ``policy_out`` followed by the latent
        features."""
        obs, actions = data
        networks = self.tier.networks
        out, values, cache = networks.actor_critic_forward(
            net_params, obs.astype(self.dtype, copy=False), *self._net_args)
        if self.head.uses_latent:
            out = np.concatenate([out, networks.policy_latent(net_params, cache)], axis=1)
        return out, values, actions, cache

    def _network_backward(self, net_params: Params, cache, d_out, d_values) -> Params:
        return self.tier.networks.actor_critic_backward(net_params, cache, d_out, d_values)


class RecurrentPolicy(_Policy):
    """LSTM actor-critic (:mod:`ppo_ref.spec.recurrent_networks` on the tier) and a head: the
    LSTM(s) over the observations (``config.lstm_hidden_size``, ``config.lstm_shared``), then the
    towers of ``config.net_arch``. Arguments and errors as :class:`MLPPolicy`."""

    recurrent = True

    _init = staticmethod(recurrent_actor_critic_init)

    def __init__(self, observation_space, action_space, config, tier):
        super().__init__(observation_space, action_space, config, tier)
        self._net_args = (config.activation, bool(config.lstm_shared))
        self.n_lstm = len(lstm_names(bool(config.lstm_shared)))
        self.hidden_size = int(config.lstm_hidden_size)
        self._init_options = {"hidden_size": self.hidden_size,
                              "lstm_shared": bool(config.lstm_shared)}

    def initial_state(self, n_envs: int) -> LSTMStates:
        """Zero states ``[L, n_envs, H]`` in the compute dtype."""
        shape = (self.n_lstm, int(n_envs), self.hidden_size)
        return LSTMStates(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype))

    def _step(self, cparams, obs, state, episode_starts):
        return self.tier.recurrent_networks.recurrent_actor_critic_step(
            self._net(cparams), obs.astype(self.dtype, copy=False), state, episode_starts,
            *self._net_args)

    def values(self, cparams: Params, obs, state, episode_starts) -> np.ndarray:
        """``V(obs | state)`` ``[B]`` after one step of the critic's LSTM from ``state`` (reset
        where ``episode_starts``); the state is not advanced."""
        return self.tier.recurrent_networks.recurrent_value_step(
            self._net(cparams), obs.astype(self.dtype, copy=False), state, episode_starts,
            *self._net_args)

    def _network_forward(self, net_params: Params, data):
        """The replay of ``data = (obs [T, n, obs_dim], actions [T, n, ...], state [L, n, H],
        episode_starts [T, n])`` from ``state``: ``(policy_out, values, actions, cache)``
        flattened to ``[T * n]`` rows (row ``t * n + j``)."""
        obs, actions, state, starts = data
        T, n = starts.shape
        out, values, _, cache = self.tier.recurrent_networks.recurrent_actor_critic_forward(
            net_params, obs.astype(self.dtype, copy=False), state, starts, *self._net_args)
        actions = actions.reshape((T * n,) + self.head.action_shape)
        return out.reshape(T * n, -1), values.reshape(-1), actions, (cache, (T, n))

    def _network_backward(self, net_params: Params, cache, d_out, d_values) -> Params:
        """Backpropagation through time for ``[T * n]`` upstream gradients."""
        cache, (T, n) = cache
        return self.tier.recurrent_networks.recurrent_actor_critic_backward(
            net_params, cache, d_out.reshape(T, n, -1), d_values.reshape(T, n))


def make_policy(observation_space, action_space, config, tier, recurrent: bool):
    """:class:`RecurrentPolicy` when ``recurrent``, else :class:`MLPPolicy`, on ``tier``."""
    cls = RecurrentPolicy if recurrent else MLPPolicy
    return cls(observation_space, action_space, config, tier)
