"""The MLP actor-critic of PPO: a policy tower and a value tower, separate or on a shared trunk.

Architecture (SB3 ``ActorCriticPolicy`` and CleanRL ``ppo.py`` defaults)::

    separate towers (default)                  shared trunk (shared_trunk=True)
    pi: obs -> 64 -> 64 -> policy_out [P]       trunk: obs -> 64 -> 64 -> z (every layer activated)
    vf: obs -> 64 -> 64 -> value [1]            pi: z -> policy_out [P];  vf: z -> value [1]

Hidden layers use ``activation`` (tanh by default); heads are linear. Weights are orthogonal
(:func:`ppo_ref.spec.layers.orthogonal`) with gain sqrt(2) for hidden layers, ``policy_gain``
(0.01) for the policy head and ``value_gain`` (1.0) for the value head; every bias is zero
(Huang et al. 2022, "The 37 Implementation Details of PPO", details 2 and 13).

``policy_out`` is what a distribution head (:mod:`ppo_ref.spec.distributions`) reads:
categorical logits ``[B, n_actions]`` or the Gaussian mean ``[B, action_dim]`` (the
state-independent ``log_std`` belongs to the policy, not to this network).

Parameters are one flat dict: ``"pi.w0", "pi.b0", ...``, ``"vf.w0", ...`` and, with a shared
trunk, ``"trunk.w0", ...``; each tower (and the trunk) is an MLP of
:func:`ppo_ref.spec.layers.mlp_init` under its prefix. With a shared trunk and ``net_arch=()``
there is no trunk and the one-layer heads read ``obs`` directly.
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
           "actor_critic_backward", "policy_forward", "value_forward", "actor_critic_towers"]

HIDDEN_GAIN = math.sqrt(2.0)


class ActorCriticCache(NamedTuple):
    """What :func:`actor_critic_backward` reads.

    Attributes:
        shared_trunk: whether the trunk is shared.
        trunk: the :class:`~ppo_ref.spec.layers.MLPCache` of the trunk's layers, or ``None``
            (separate towers, or a shared trunk with ``net_arch=()``).
        trunk_act: the :class:`~ppo_ref.spec.layers.ActivationCache` of the trunk's last
            activation ``z = act(a_trunk)``, or ``None`` when ``trunk`` is ``None``.
        pi: cache of the policy tower (with a shared trunk: of the one-layer policy head).
        vf: cache of the value tower (with a shared trunk: of the one-layer value head).
    """
    shared_trunk: bool
    trunk: Optional[MLPCache]
    trunk_act: Optional[ActivationCache]
    pi: MLPCache
    vf: MLPCache


def actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                      net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                      shared_trunk: bool = False, policy_gain: float = 0.01,
                      value_gain: float = 1.0) -> Params:
    """Initial actor-critic parameters (a flat dict of float64 arrays).

    Separate towers, drawn from ``rng`` in this order:
    ``pi.* = mlp_init(obs_dim, net_arch, policy_out_dim, out_gain=policy_gain)``, then
    ``vf.* = mlp_init(obs_dim, net_arch, 1, out_gain=value_gain)``, hidden gain sqrt(2).

    Shared trunk: ``trunk.* = mlp_init(obs_dim, net_arch[:-1], net_arch[-1])`` with gain
    sqrt(2) on every layer (all trunk layers are hidden layers), then the one-layer heads
    ``pi.* = mlp_init(net_arch[-1], (), policy_out_dim, out_gain=policy_gain)`` and
    ``vf.* = mlp_init(net_arch[-1], (), 1, out_gain=value_gain)`` (``obs_dim`` inputs if
    ``net_arch`` is empty). Biases are zero.

    Args:
        rng: ``np.random.Generator``.
        obs_dim: observation size (> 0).
        policy_out_dim: ``P``, the number of logits (discrete) or the action dimension
            (Gaussian mean).
        net_arch: hidden widths, default ``(64, 64)``; may be empty (linear heads on ``obs``).
        activation: ``"tanh"`` or ``"relu"``. Only validated: the initialisation is the same
            for both (as in SB3), so a config passes through unchanged.
        shared_trunk: share the hidden layers between policy and value.
        policy_gain, value_gain: head gains (default 0.01 and 1.0).

    Raises:
        ValueError: bad dimensions, unknown activation or non-finite gains.
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
                      out_gain=policy_gain)
        vf = mlp_init(rng, obs_dim, arch, 1, hidden_gain=HIDDEN_GAIN, out_gain=value_gain)
        params.update(_with_prefix("pi.", pi))
        params.update(_with_prefix("vf.", vf))
        return params
    head_in = obs_dim
    if arch:
        trunk = mlp_init(rng, obs_dim, arch[:-1], arch[-1], hidden_gain=HIDDEN_GAIN,
                         out_gain=HIDDEN_GAIN)
        params.update(_with_prefix("trunk.", trunk))
        head_in = arch[-1]
    params.update(_with_prefix("pi.", mlp_init(rng, head_in, (), policy_out_dim,
                                               out_gain=policy_gain)))
    params.update(_with_prefix("vf.", mlp_init(rng, head_in, (), 1, out_gain=value_gain)))
    return params


def _with_prefix(prefix: str, params: Mapping[str, np.ndarray]) -> Params:
    return {prefix + k: v for k, v in params.items()}


def _tower(params: Mapping[str, np.ndarray], prefix: str) -> Params:
    """The MLP stored under ``prefix`` as its own dict ``{"w0", "b0", ...}`` (same arrays)."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def actor_critic_towers(params: Mapping[str, np.ndarray], shared_trunk: bool
            ) -> Tuple[Optional[Params], Params, Params]:
    """Check ``params`` and split it into ``(trunk or None, pi, vf)`` MLP dicts
    (``{"w0", "b0", ...}``, the same arrays). The one check of an actor-critic's parameters:
    the forward and backward passes here use it (the compiled twins do not re-check).

    Raises ``ValueError`` naming the offending key: a tower that is missing, malformed or
    does not chain, a value head with more than one output, with a shared trunk heads that
    are not one layer or do not read the trunk's output width, with separate towers towers
    of different input widths, or keys that belong to no tower.
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


def actor_critic_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                         shared_trunk: bool = False
                         ) -> Tuple[np.ndarray, np.ndarray, ActorCriticCache]:
    """Policy output and state values for a batch of observations.

    Separate towers::

        policy_out = MLP_pi(obs)
        values = MLP_vf(obs)[:, 0]

    Shared trunk::

        z = act(MLP_trunk(obs))                      (z = obs when there is no trunk)
        policy_out = z @ pi.w0.T + pi.b0
        values = (z @ vf.w0.T + vf.b0)[:, 0]

    Args:
        params: from :func:`actor_critic_init` with the same ``shared_trunk``.
        obs: ``[B, obs_dim]`` finite real array (cast to float64).
        activation: hidden activation, ``"tanh"`` or ``"relu"``.
        shared_trunk: must match how ``params`` was built.

    Returns:
        ``(policy_out [B, P], values [B], cache)``, float64; ``cache`` an
        :class:`ActorCriticCache`.

    Raises:
        ValueError: unknown activation, params that do not match ``shared_trunk`` or do not
            chain, ``obs`` of the wrong shape or non-finite.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    shared_trunk = bool(shared_trunk)
    trunk, pi, vf = actor_critic_towers(params, shared_trunk)
    z = _as_obs(obs, trunk, pi)
    trunk_cache, trunk_act_cache = None, None
    if trunk is not None:
        act_forward, _ = _ACTIVATION_FUNCTIONS[activation]
        a, trunk_cache = mlp_forward(trunk, z, activation)
        z, trunk_act_cache = act_forward(a)
    policy_out, pi_cache = mlp_forward(pi, z, activation)
    values, vf_cache = mlp_forward(vf, z, activation)
    cache = ActorCriticCache(shared_trunk, trunk_cache, trunk_act_cache, pi_cache, vf_cache)
    return policy_out, values[:, 0], cache


def policy_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                   shared_trunk: bool = False) -> np.ndarray:
    """Only the policy output ``policy_out`` ``[B, P]`` (float64), for acting: the policy tower
    (with a shared trunk: trunk and policy head) of :func:`actor_critic_forward`, no cache.

    Same arguments and errors as :func:`actor_critic_forward`.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = actor_critic_towers(params, bool(shared_trunk))
    z = _as_obs(obs, trunk, pi)
    if trunk is not None:
        act_forward, _ = _ACTIVATION_FUNCTIONS[activation]
        a, _ = mlp_forward(trunk, z, activation)
        z, _ = act_forward(a)
    policy_out, _ = mlp_forward(pi, z, activation)
    return policy_out


def value_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                  shared_trunk: bool = False) -> np.ndarray:
    """Only the state values ``V(obs)`` ``[B]`` (float64), for bootstrapping: the value tower
    (with a shared trunk: trunk and value head) of :func:`actor_critic_forward`, no cache.

    Same arguments and errors as :func:`actor_critic_forward`.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = actor_critic_towers(params, bool(shared_trunk))
    z = _as_obs(obs, trunk, pi)
    if trunk is not None:
        act_forward, _ = _ACTIVATION_FUNCTIONS[activation]
        a, _ = mlp_forward(trunk, z, activation)
        z, _ = act_forward(a)
    values, _ = mlp_forward(vf, z, activation)
    return values[:, 0]


def actor_critic_backward(params: Mapping[str, np.ndarray], cache: ActorCriticCache,
                          d_policy_out, d_values) -> Params:
    """Gradients of a scalar loss w.r.t. every parameter, given ``dL/dpolicy_out`` and
    ``dL/dvalues``.

    Separate towers: each tower's :func:`~ppo_ref.spec.layers.mlp_backward`. Shared trunk: the
    trunk output receives the sum of both heads' input gradients, then goes back through its
    activation and its layers::

        dz = dz_pi + dz_vf
        da_trunk = dz * act'(a_trunk)
        grads_trunk = mlp_backward(trunk, da_trunk)

    No gradient w.r.t. ``obs`` is returned (observations are data).

    Args:
        params: as given to :func:`actor_critic_forward`.
        cache: the :class:`ActorCriticCache` it returned.
        d_policy_out: ``[B, P]`` finite; d_values: ``[B]`` finite.

    Returns:
        ``grads``: float64 arrays with exactly the keys (and key order) of ``params``.

    Raises:
        ValueError: malformed params, a cache that is not an :class:`ActorCriticCache` or does
            not match ``params``, or gradients of the wrong shape or non-finite.
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
