"""The MLP actor-critic of PPO: a policy tower and a value tower, separate or on a shared trunk.

Parameters are one flat dict: ``"pi.w0", "pi.b0", ...``, ``"vf.w0", ...`` and with a shared
trunk ``"trunk.w0", ...``, each an MLP of :func:`ppo_ref.spec.layers.mlp_init` under its prefix
(with a shared trunk and ``net_arch=()`` there is no trunk: the heads read ``obs``).
``policy_out`` is what a distribution head (:mod:`ppo_ref.spec.distributions`) reads:
categorical logits or the Gaussian mean (the ``log_std`` belongs to the policy).
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, check_choice, check_last_dim, check_positive_int,
                             check_real_scalar, check_same_shape)
from ppo_ref.spec.layers import (ACTIVATIONS, ActivationCache, MLPCache, Params,
                                 _ACTIVATION_FUNCTIONS, mlp_depth, mlp_backward, mlp_forward,
                                 mlp_init)

__all__ = ["ActorCriticCache", "actor_critic_init", "actor_critic_forward",
           "actor_critic_backward", "policy_forward", "value_forward", "actor_critic_towers",
           "policy_latent"]

HIDDEN_GAIN = math.sqrt(2.0)


class ActorCriticCache(NamedTuple):
    """What :func:`actor_critic_backward` reads: the trunk's ``MLPCache`` and the
    ``ActivationCache`` of its last activation (None without a trunk), and the ``MLPCache`` of
    the policy and value towers (with a shared trunk: the one-layer heads)."""
    shared_trunk: bool
    trunk: Optional[MLPCache]
    trunk_act: Optional[ActivationCache]
    pi: MLPCache
    vf: MLPCache


def actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                      net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                      shared_trunk: bool = False, policy_gain: float = 0.01,
                      value_gain: float = 1.0, ortho_init: bool = True) -> Params:
    """Initial actor-critic parameters, float64 (SB3 ``ActorCriticPolicy``, CleanRL ``ppo.py``;
    Huang et al. 2022, "The 37 Implementation Details of PPO", details 2 and 13).

    Separate towers, drawn from ``rng`` in this order: ``pi.* = mlp_init(obs_dim, net_arch,
    policy_out_dim, out_gain=policy_gain)``, ``vf.* = mlp_init(obs_dim, net_arch, 1,
    out_gain=value_gain)``, hidden gain sqrt(2). Shared trunk: ``trunk.* = mlp_init(obs_dim,
    net_arch[:-1], net_arch[-1])`` with gain sqrt(2) on every layer, then one-layer heads
    ``pi.*``, ``vf.*`` reading ``net_arch[-1]`` (``obs_dim`` if ``net_arch`` is empty).

    ``policy_out_dim``: P, the number of logits or the action dimension (Gaussian mean);
    ``net_arch``: hidden widths (may be empty); ``activation`` is only validated (the
    initialisation is the same for every activation); ``ortho_init=False``: every layer
    :func:`~ppo_ref.spec.layers.torch_linear_init` instead, the gains unused (SB3's
    ``ortho_init=False``). Raises ``ValueError`` for bad dimensions, an unknown activation or
    non-finite gains.
    """
    obs_dim = check_positive_int(obs_dim, "obs_dim")
    policy_out_dim = check_positive_int(policy_out_dim, "policy_out_dim")
    try:
        arch = tuple(check_positive_int(h, "net_arch entries") for h in net_arch)
    except TypeError:
        raise ValueError(f"net_arch must be a sequence of ints, got {net_arch!r}") from None
    check_choice(activation, "activation", ACTIVATIONS)
    policy_gain = check_real_scalar(policy_gain, "policy_gain")
    value_gain = check_real_scalar(value_gain, "value_gain")
    params: Params = {}
    if not shared_trunk:
        pi = mlp_init(rng, obs_dim, arch, policy_out_dim, hidden_gain=HIDDEN_GAIN,
                      out_gain=policy_gain, ortho_init=ortho_init)
        vf = mlp_init(rng, obs_dim, arch, 1, hidden_gain=HIDDEN_GAIN, out_gain=value_gain,
                      ortho_init=ortho_init)
        params.update(_with_prefix("pi.", pi))
        params.update(_with_prefix("vf.", vf))
        return params
    head_in = obs_dim
    if arch:
        trunk = mlp_init(rng, obs_dim, arch[:-1], arch[-1], hidden_gain=HIDDEN_GAIN,
                         out_gain=HIDDEN_GAIN, ortho_init=ortho_init)
        params.update(_with_prefix("trunk.", trunk))
        head_in = arch[-1]
    params.update(_with_prefix("pi.", mlp_init(rng, head_in, (), policy_out_dim,
                                               out_gain=policy_gain, ortho_init=ortho_init)))
    params.update(_with_prefix("vf.", mlp_init(rng, head_in, (), 1, out_gain=value_gain,
                                               ortho_init=ortho_init)))
    return params


def _with_prefix(prefix: str, params: Mapping[str, np.ndarray]) -> Params:
    return {prefix + k: v for k, v in params.items()}


def _tower(params: Mapping[str, np.ndarray], prefix: str) -> Params:
    """The MLP stored under ``prefix`` as its own dict ``{"w0", "b0", ...}`` (same arrays)."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def actor_critic_towers(params: Mapping[str, np.ndarray], shared_trunk: bool
            ) -> Tuple[Optional[Params], Params, Params]:
    """The one check of an actor-critic's parameters: splits ``params`` into ``(trunk or None,
    pi, vf)`` MLP dicts (``{"w0", "b0", ...}``, the same arrays). Raises ``ValueError`` naming
    the key: a tower missing, malformed or not chaining, a value head with more than one
    output, with a shared trunk heads that are not one layer or do not read the trunk's width,
    with separate towers different input widths, or keys of no tower.
    """
    prefixes = ("trunk.", "pi.", "vf.") if shared_trunk else ("pi.", "vf.")
    depth = {}
    for prefix in prefixes:
        if prefix == "trunk." and "trunk.w0" not in params:
            continue  # a shared trunk with net_arch=(): the heads read obs
        depth[prefix] = mlp_depth(params, prefix)
    n_vf = depth["vf."]
    if params[f"vf.w{n_vf - 1}"].shape[0] != 1:
        raise ValueError(f"params['vf.w{n_vf - 1}'] must have 1 output row, got "
                         f"{params[f'vf.w{n_vf - 1}'].shape[0]}")
    if shared_trunk:
        if depth["pi."] != 1 or depth["vf."] != 1:
            raise ValueError("params do not match shared_trunk=True, which expects one-layer "
                             "heads pi.w0/vf.w0 on a 'trunk.' MLP: got "
                             f"{depth['pi.']} pi and {depth['vf.']} vf layers")
        if "trunk." in depth:
            z_dim = params[f"trunk.w{depth['trunk.'] - 1}"].shape[0]
        else:
            z_dim = params["pi.w0"].shape[1]
        for head in ("pi.w0", "vf.w0"):
            if params[head].shape[1] != z_dim:
                raise ValueError(f"params[{head!r}] has input width {params[head].shape[1]}, "
                                 f"expected {z_dim} (the trunk output width)")
    elif params["pi.w0"].shape[1] != params["vf.w0"].shape[1]:
        raise ValueError(f"params['pi.w0'] and params['vf.w0'] have different input widths "
                         f"{params['pi.w0'].shape[1]} and {params['vf.w0'].shape[1]}")
    expected = {f"{prefix}{k}{i}" for prefix, n in depth.items() for i in range(n)
                for k in ("w", "b")}
    if set(params) != expected:
        extra = sorted(set(params) - expected)
        hint = " (a shared trunk? pass shared_trunk=True)" if any(
            k.startswith("trunk.") for k in extra) else ""
        raise ValueError(f"params has unexpected keys {extra}{hint}")
    trunk = _tower(params, "trunk.") if "trunk." in depth else None
    return trunk, _tower(params, "pi."), _tower(params, "vf.")


def _as_obs(obs, trunk: Optional[Params], pi: Params) -> np.ndarray:
    """``obs`` as finite float64 ``[B, obs_dim]``, ``obs_dim`` the first layer's input width."""
    first = trunk if trunk is not None else pi
    x = as_float_array(obs, "obs").astype(np.float64, copy=False)
    check_last_dim(x, "obs", first["w0"].shape[1])
    if x.ndim != 2:
        raise ValueError(f"obs must have shape [batch, {first['w0'].shape[1]}], got {x.shape} "
                         f"(use obs[None] for a single observation)")
    return x


def _features(params, obs, activation, shared_trunk):
    """Checked ``(z, pi, vf, trunk_cache, trunk_act_cache)``: ``z`` is the heads' input,
    ``obs`` or ``act(MLP_trunk(obs))`` (the caches are None without a trunk)."""
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = actor_critic_towers(params, shared_trunk)
    z = _as_obs(obs, trunk, pi)
    trunk_cache, trunk_act_cache = None, None
    if trunk is not None:
        act_forward, _ = _ACTIVATION_FUNCTIONS[activation]
        a, trunk_cache = mlp_forward(trunk, z, activation)
        z, trunk_act_cache = act_forward(a)
    return z, pi, vf, trunk_cache, trunk_act_cache


def actor_critic_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                         shared_trunk: bool = False
                         ) -> Tuple[np.ndarray, np.ndarray, ActorCriticCache]:
    """Policy output and state values for a batch of observations::

        separate towers:  policy_out = MLP_pi(obs),    values = MLP_vf(obs)[:, 0]
        shared trunk:     z = act(MLP_trunk(obs))      (z = obs when there is no trunk)
                          policy_out = z @ pi.w0.T + pi.b0,   values = (z @ vf.w0.T + vf.b0)[:, 0]

    with :func:`ppo_ref.spec.layers.mlp_forward` (hidden layers activated, heads linear).

    ``params``: from :func:`actor_critic_init` with the same ``shared_trunk``; ``obs``:
    finite ``[B, obs_dim]``; ``activation``: a key of ``ACTIVATIONS``. Returns float64
    ``(policy_out [B, P], values [B], ActorCriticCache)``. Raises
    ``ValueError`` for an unknown activation, params that do not match ``shared_trunk`` or do
    not chain, or a bad ``obs``.
    """
    shared_trunk = bool(shared_trunk)
    z, pi, vf, trunk_cache, trunk_act_cache = _features(params, obs, activation, shared_trunk)
    policy_out, pi_cache = mlp_forward(pi, z, activation)
    values, vf_cache = mlp_forward(vf, z, activation)
    cache = ActorCriticCache(shared_trunk, trunk_cache, trunk_act_cache, pi_cache, vf_cache)
    return policy_out, values[:, 0], cache


def policy_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                   shared_trunk: bool = False) -> np.ndarray:
    """:func:`actor_critic_forward`'s ``policy_out [B, P]`` alone, for acting (no value tower,
    no cache); its arguments and errors."""
    z, pi, _, _, _ = _features(params, obs, activation, bool(shared_trunk))
    policy_out, _ = mlp_forward(pi, z, activation)
    return policy_out


def value_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                  shared_trunk: bool = False) -> np.ndarray:
    """:func:`actor_critic_forward`'s ``values [B]`` alone, for bootstrapping (no policy tower,
    no cache); its arguments and errors."""
    z, _, vf, _, _ = _features(params, obs, activation, bool(shared_trunk))
    values, _ = mlp_forward(vf, z, activation)
    return values[:, 0]


def policy_latent(params: Mapping[str, np.ndarray], cache: ActorCriticCache) -> np.ndarray:
    """The latent features of the policy, ``latent_pi [B, L]``: the input of the policy tower's
    output layer in the :func:`actor_critic_forward` pass that gave ``cache`` (its last hidden
    activation; with a shared trunk ``z``; ``obs`` when there is no hidden layer), which gSDE
    reads (:func:`ppo_ref.spec.distributions.gsde_log_prob`; SB3 ``latent_pi``).

    Returns float64 ``[B, L]`` (a view of the cache). Raises ``ValueError`` for a cache that is
    not an :class:`ActorCriticCache` or malformed ``params``.
    """
    if not isinstance(cache, ActorCriticCache):
        raise ValueError(f"cache must be an ActorCriticCache, got {type(cache).__name__}")
    actor_critic_towers(params, cache.shared_trunk)
    return cache.pi.linear[-1].x


def actor_critic_backward(params: Mapping[str, np.ndarray], cache: ActorCriticCache,
                          d_policy_out, d_values) -> Params:
    """Gradients of a scalar loss in every parameter from ``d_policy_out [B, P]`` and
    ``d_values [B]`` (finite): each tower's :func:`~ppo_ref.spec.layers.mlp_backward`; with a
    trunk, its output gets both heads' input gradients::

        dz = dz_pi + dz_vf,    da_trunk = dz * act'(a_trunk),    mlp_backward(trunk, da_trunk)

    No gradient in ``obs``. Returns float64 ``grads`` with the keys (and key order) of
    ``params``. Raises ``ValueError`` for malformed params, a cache that is not an
    :class:`ActorCriticCache` or does not match ``params``, or bad gradients.
    """
    if not isinstance(cache, ActorCriticCache):
        raise ValueError(f"cache must be an ActorCriticCache, got {type(cache).__name__}")
    trunk, pi, vf = actor_critic_towers(params, cache.shared_trunk)
    if (trunk is None) != (cache.trunk is None):
        raise ValueError("cache does not match params (trunk present in only one of them)")
    batch = cache.pi.linear[0].x.shape[0]
    policy_out_dim = pi[f"w{len(pi) // 2 - 1}"].shape[0]  # pi holds w0, b0, ..., wL, bL
    d_pi = as_float_array(d_policy_out, "d_policy_out").astype(np.float64, copy=False)
    check_same_shape(d_pi, "d_policy_out", (batch, policy_out_dim), "policy_out")
    d_v = as_float_array(d_values, "d_values").astype(np.float64, copy=False)
    check_same_shape(d_v, "d_values", (batch,), "values")
    dz_pi, pi_grads = mlp_backward(pi, cache.pi, d_pi)
    dz_vf, vf_grads = mlp_backward(vf, cache.vf, d_v[:, None])
    grads = {**_with_prefix("pi.", pi_grads), **_with_prefix("vf.", vf_grads)}
    if trunk is not None:
        _, act_backward = _ACTIVATION_FUNCTIONS[cache.trunk.activation]
        dz = dz_pi + dz_vf
        da_trunk = act_backward(cache.trunk_act, dz)
        _, trunk_grads = mlp_backward(trunk, cache.trunk, da_trunk)
        grads.update(_with_prefix("trunk.", trunk_grads))
    return {k: grads[k] for k in params}
