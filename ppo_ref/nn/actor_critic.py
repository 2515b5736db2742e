"""The MLP actor-critic of PPO: a policy tower and a value tower, separate or on a shared trunk.

Architecture (SB3 ``ActorCriticPolicy`` / CleanRL ``ppo.py`` defaults)::

    separate towers (default)                 shared trunk (shared_trunk=True)
    pi: obs -> 64 -> 64 -> policy_out [P]      trunk: obs -> 64 -> 64 -> z
    vf: obs -> 64 -> 64 -> value [1]           pi: z -> policy_out [P];  vf: z -> value [1]

Hidden layers use ``activation`` (tanh by default); heads are linear. Init is orthogonal
(:func:`ppo_ref.nn.init.orthogonal`) with gain sqrt(2) for hidden layers, ``policy_gain`` (0.01)
for the policy head and ``value_gain`` (1.0) for the value head; every bias is zero
(Huang et al. 2022, "The 37 Implementation Details of PPO", details 2 and 13).

``policy_out`` is what a distribution head reads: categorical logits ``[B, n_actions]`` or the
Gaussian mean ``[B, action_dim]`` (the state-independent ``log_std`` lives in the policy, not
here).

Parameters are one flat dict (so one Adam state, one gradient clip and one checkpoint cover
everything), keys ``"pi.w0", "pi.b0", ...``, ``"vf.w0", ...`` and with a shared trunk
``"trunk.w0", ...``. Each tower's keys follow :func:`ppo_ref.nn.mlp.mlp_init`.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ppo_ref._checks import check_choice, check_real_scalar
from ppo_ref.nn.mlp import (
    ACTIVATIONS, MLPCache, Params, _activate_inplace, _activation_grad, _activation_grad_inplace,
    _as_grad, _as_input, _check_dim, _check_params_mapping, _mlp_backward_2d, _mlp_backward_flat,
    _mlp_forward_2d, _mlp_forward_flat, _mlp_layers, mlp_init,
)

__all__ = ["ActorCriticCache", "actor_critic_init", "actor_critic_forward",
           "actor_critic_backward", "value_forward"]

HIDDEN_GAIN = math.sqrt(2.0)


class ActorCriticCache(NamedTuple):
    """What :func:`actor_critic_backward` needs.

    Attributes:
        shared_trunk: whether the trunk is shared.
        trunk: :class:`~ppo_ref.nn.mlp.MLPCache` of the shared trunk, or ``None``.
        pi: cache of the policy tower (with a shared trunk: the policy head on the trunk output).
        vf: cache of the value tower (same).
        trunk_out: with a shared trunk, ``z`` (float64 ``[B, width]``): the activated trunk
            output read by both heads (``obs`` itself when ``net_arch=()``); ``None`` otherwise.
    """
    shared_trunk: bool
    trunk: Optional[MLPCache]
    pi: MLPCache
    vf: MLPCache
    trunk_out: Optional[np.ndarray]


def actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                      net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                      shared_trunk: bool = False, policy_gain: float = 0.01,
                      value_gain: float = 1.0) -> Params:
    """Initial actor-critic parameters (flat dict of float64 arrays).

    Separate towers: ``pi.*`` = ``mlp_init(obs_dim, net_arch, policy_out_dim, out_gain=policy_gain)``
    and ``vf.*`` = ``mlp_init(obs_dim, net_arch, 1, out_gain=value_gain)``, hidden gain sqrt(2).
    Shared trunk: ``trunk.w{i}`` for the hidden layers of ``net_arch`` (gain sqrt(2)) and
    one-layer heads ``pi.w0 [P, net_arch[-1]]`` (gain ``policy_gain``) and
    ``vf.w0 [1, net_arch[-1]]`` (gain ``value_gain``). Biases are zero.

    Draw order from ``rng``: separate: pi tower (layer order) then vf tower; shared: trunk,
    pi head, vf head.

    Args:
        rng: ``np.random.Generator``.
        obs_dim: observation size (> 0).
        policy_out_dim: ``P``, the number of logits (discrete) or the action dimension (Gaussian mean).
        net_arch: hidden widths, default ``(64, 64)``; may be empty (linear heads on ``obs``).
        activation: ``"tanh"`` or ``"relu"``. Validated only: the initialisation is the same
            for both (as in SB3); accepted so a config can be passed through unchanged.
        shared_trunk: share the hidden layers between policy and value.
        policy_gain, value_gain: head gains (default 0.01 and 1.0; thrust-rl uses 0.01 for both).

    Raises:
        ValueError: bad dimensions, unknown activation or non-finite gains.
    """
    obs_dim = _check_dim(obs_dim, "obs_dim")
    policy_out_dim = _check_dim(policy_out_dim, "policy_out_dim")
    try:
        arch = tuple(_check_dim(h, "net_arch entries") for h in net_arch)
    except TypeError:
        raise ValueError(f"net_arch must be a sequence of ints, got {net_arch!r}") from None
    check_choice(activation, "activation", ACTIVATIONS)
    policy_gain = check_real_scalar(policy_gain, "policy_gain")
    value_gain = check_real_scalar(value_gain, "value_gain")
    params: Params = {}
    if not shared_trunk:
        for prefix, out_dim, gain in (("pi.", policy_out_dim, policy_gain), ("vf.", 1, value_gain)):
            tower = mlp_init(rng, obs_dim, arch, out_dim, hidden_gain=HIDDEN_GAIN, out_gain=gain)
            params.update({prefix + k: v for k, v in tower.items()})
        return params
    head_in = obs_dim
    if arch:
        # the trunk is an MLP whose last layer is itself hidden (activated): build it as
        # hidden layers [obs -> arch[0] -> ... -> arch[-1]], all with the hidden gain
        trunk = mlp_init(rng, obs_dim, arch[:-1], arch[-1], hidden_gain=HIDDEN_GAIN,
                         out_gain=HIDDEN_GAIN)
        params.update({"trunk." + k: v for k, v in trunk.items()})
        head_in = arch[-1]
    for prefix, out_dim, gain in (("pi.", policy_out_dim, policy_gain), ("vf.", 1, value_gain)):
        head = mlp_init(rng, head_in, (), out_dim, out_gain=gain)
        params.update({prefix + k: v for k, v in head.items()})
    return params


def _structure(params: Mapping, shared_trunk: bool):
    """Parse and check the towers: returns ``(trunk_layers or None, pi_layers, vf_layers)``."""
    _check_params_mapping(params)
    pi = _mlp_layers(params, "pi.")
    vf = _mlp_layers(params, "vf.")
    if vf[-1][0].shape[0] != 1:
        raise ValueError(f"params['vf.w{len(vf) - 1}'] must have 1 output row, got "
                         f"{vf[-1][0].shape[0]}")
    n_keys = 2 * (len(pi) + len(vf))
    trunk = None
    if shared_trunk:
        if len(pi) != 1 or len(vf) != 1:
            raise ValueError("shared_trunk=True expects one-layer heads pi.w0/vf.w0 on a "
                             f"'trunk.' MLP, got {len(pi)} pi and {len(vf)} vf layers")
        if "trunk.w0" in params:
            trunk = _mlp_layers(params, "trunk.")
            n_keys += 2 * len(trunk)
            z_dim = trunk[-1][0].shape[0]
        else:
            z_dim = None
        for name, layers in (("pi", pi), ("vf", vf)):
            w = layers[0][0]
            want = z_dim if z_dim is not None else pi[0][0].shape[1]
            if w.shape[1] != want:
                raise ValueError(f"params['{name}.w0'] has input width {w.shape[1]}, expected "
                                 f"{want} (the trunk output width)")
    else:
        if pi[0][0].shape[1] != vf[0][0].shape[1]:
            raise ValueError(f"params['pi.w0'] and params['vf.w0'] have different input widths "
                             f"{pi[0][0].shape[1]} and {vf[0][0].shape[1]}")
    if len(params) != n_keys:
        known = ("pi.", "vf.") + (("trunk.",) if shared_trunk else ())
        extra = sorted(k for k in params if not k.startswith(known))
        hint = " (a shared trunk? pass shared_trunk=True)" if any(
            k.startswith("trunk.") for k in extra) else ""
        raise ValueError(f"params has unexpected keys {extra or sorted(params)}{hint}")
    return trunk, pi, vf


def _obs_dim(trunk, pi) -> int:
    return (trunk if trunk is not None else pi)[0][0].shape[1]


def _as_obs(obs, in_dim: int) -> np.ndarray:
    x = _as_input(obs, "obs", in_dim)
    if x.ndim != 2:
        raise ValueError(f"obs must have shape [batch, {in_dim}], got {x.shape} "
                         f"(use obs[None] for a single observation)")
    return x


def actor_critic_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                         shared_trunk: bool = False
                         ) -> Tuple[np.ndarray, np.ndarray, ActorCriticCache]:
    """Policy output and state values for a batch of observations.

    Separate: ``policy_out = MLP_pi(obs)``, ``values = MLP_vf(obs)[:, 0]``.
    Shared: ``z = act(MLP_trunk(obs))`` (every trunk layer activated),
    ``policy_out = z @ pi.w0.T + pi.b0``, ``values = (z @ vf.w0.T + vf.b0)[:, 0]``.

    Args:
        params: from :func:`actor_critic_init` with the same ``shared_trunk``.
        obs: ``[B, obs_dim]`` finite real array (float32 cast to float64).
        activation: hidden activation, ``"tanh"`` or ``"relu"``.
        shared_trunk: must match how ``params`` was built.

    Returns:
        ``(policy_out [B, P], values [B], cache)``, float64; ``cache`` an :class:`ActorCriticCache`.

    Raises:
        ValueError: unknown activation, params that do not match ``shared_trunk`` or do not
            chain, ``obs`` of the wrong shape or non-finite.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    x = _as_obs(obs, _obs_dim(trunk, pi))
    if not shared_trunk:
        logits, pi_in = _mlp_forward_2d(pi, x, activation)
        v, vf_in = _mlp_forward_2d(vf, x, activation)
        cache = ActorCriticCache(False, None, MLPCache(pi_in, x.shape[:1], activation),
                                 MLPCache(vf_in, x.shape[:1], activation), None)
        return logits, v[:, 0], cache
    trunk_cache = None
    z = x
    if trunk is not None:
        z, trunk_in = _mlp_forward_2d(trunk, x, activation)
        if activation == "relu":
            np.maximum(z, 0.0, out=z)
        else:
            np.tanh(z, out=z)
        trunk_cache = MLPCache(trunk_in, x.shape[:1], activation)
    logits, pi_in = _mlp_forward_2d(pi, z, activation)
    v, vf_in = _mlp_forward_2d(vf, z, activation)
    cache = ActorCriticCache(True, trunk_cache, MLPCache(pi_in, x.shape[:1], activation),
                             MLPCache(vf_in, x.shape[:1], activation), z)
    return logits, v[:, 0], cache


def value_forward(params: Mapping[str, np.ndarray], obs, activation: str = "tanh",
                  shared_trunk: bool = False) -> np.ndarray:
    """Only the state values ``V(obs)`` ``[B]`` (float64): no policy tower, no cache.

    For bootstrapping (``last_values``, ``final_values``). Same arguments and errors as
    :func:`actor_critic_forward`; with separate towers it evaluates only the value tower.
    """
    check_choice(activation, "activation", ACTIVATIONS)
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    x = _as_obs(obs, _obs_dim(trunk, pi))
    z = x
    if shared_trunk and trunk is not None:
        z, _ = _mlp_forward_2d(trunk, x, activation)
        if activation == "relu":
            np.maximum(z, 0.0, out=z)
        else:
            np.tanh(z, out=z)
    v, _ = _mlp_forward_2d(vf, z, activation)
    return v[:, 0]


def actor_critic_backward(params: Mapping[str, np.ndarray], cache: ActorCriticCache,
                          d_policy_out, d_values) -> Params:
    """Gradients of a scalar loss w.r.t. every parameter, given ``dL/dpolicy_out`` and ``dL/dvalues``.

    With a shared trunk the trunk receives the sum of both heads' input gradients, then goes
    back through its last activation (``tanh' = 1 - z^2``, ``relu' = [z > 0]``) and its layers.
    No gradient w.r.t. ``obs`` is computed (observations are data).

    Args:
        params: as given to :func:`actor_critic_forward`.
        cache: the :class:`ActorCriticCache` it returned.
        d_policy_out: ``[B, P]``; d_values: ``[B]`` (float32 cast to float64).

    Returns:
        ``grads``: dict with exactly the keys (and key order) of ``params``, float64.

    Raises:
        ValueError: malformed params/cache or gradients of the wrong shape.
    """
    if not isinstance(cache, ActorCriticCache):
        raise ValueError(f"cache must be an ActorCriticCache, got {type(cache).__name__}")
    trunk, pi, vf = _structure(params, cache.shared_trunk)
    if len(cache.pi.layer_inputs) != len(pi) or len(cache.vf.layer_inputs) != len(vf):
        raise ValueError("cache does not match params (different number of layers)")
    batch = cache.pi.layer_inputs[0].shape[0]
    d_pi = _as_grad(d_policy_out, "d_policy_out", (batch, pi[-1][0].shape[0]))
    d_v = _as_grad(d_values, "d_values", (batch,))
    activation = cache.pi.activation
    grads: Params = {}
    shared = cache.shared_trunk
    dz_pi = _mlp_backward_2d(pi, cache.pi.layer_inputs, d_pi, activation, "pi.", grads,
                             need_dx=shared and trunk is not None)
    dz_v = _mlp_backward_2d(vf, cache.vf.layer_inputs, d_v[:, None], activation, "vf.", grads,
                            need_dx=shared and trunk is not None)
    if shared and trunk is not None:
        dz = dz_pi
        dz += dz_v  # dz_pi is a fresh array
        _activation_grad_inplace(dz, cache.trunk_out, activation)
        _mlp_backward_2d(trunk, cache.trunk.layer_inputs, dz, activation, "trunk.", grads,
                         need_dx=False)
    return {k: grads[k] for k in params}


# --------------------------------------------------------------------------------------------
# Compiled actor-critic on a flat parameter buffer (the fast tier of MLPPolicy)
#
# Each tower (and the shared trunk) is an MLP of :func:`ppo_ref.nn.mlp._mlp_forward_flat` /
# :func:`~ppo_ref.nn.mlp._mlp_backward_flat` described by a layer table into the parameter
# buffer: every product is a chain of fused multiply-adds in the order documented in
# :mod:`ppo_ref.nn.mlp` (forward over the inputs k = 0, 1, ..., row by row; weight gradients
# over the rows in order), tanh is the project's own :func:`ppo_ref.fast.lstm._tanh_any`. So a
# row's outputs never depend on the other rows of the call (acting on N rows, the rollout's
# T N rows and any minibatch agree bit for bit), and no result depends on BLAS or on the
# machine (IEEE 754 arithmetic with a correctly rounded fma). The shared trunk's last layer is
# activated (:func:`~ppo_ref.nn.mlp._activate_inplace`) and the heads' input gradients are
# summed into one array (the value head's chain continues the policy head's) before its
# activation derivative.

class FlatNet(NamedTuple):
    """The layer tables of an actor-critic whose parameters live in one buffer (checked once per
    layout by :func:`flat_net`): ``trunk`` (``None`` with separate towers or a shared trunk of
    ``net_arch=()``), ``pi``, ``vf``: int64 ``[layers, 4]`` tables of
    :func:`ppo_ref.nn.mlp._mlp_forward_flat` (``w`` offset, ``b`` offset, ``out``, ``in``);
    ``*_width``: the sum of each one's output widths (its per-row outputs buffer);
    ``obs_dim``, ``policy_out_dim``."""
    trunk: Optional[np.ndarray]
    pi: np.ndarray
    vf: np.ndarray
    trunk_width: int
    pi_width: int
    vf_width: int
    obs_dim: int
    policy_out_dim: int


def _table(layout, layers, prefix: str) -> np.ndarray:
    return np.array([(layout.offset(f"{prefix}w{i}"), layout.offset(f"{prefix}b{i}"))
                     + tuple(w.shape) for i, (w, _) in enumerate(layers)], dtype=np.int64)


def flat_net(params: Mapping[str, np.ndarray], layout, shared_trunk: bool) -> FlatNet:
    """Check the network's arrays ``params`` (exactly the network's keys, as
    :func:`actor_critic_forward` checks them) and return their :class:`FlatNet` in ``layout``
    (the :class:`~ppo_ref.fast.flat.FlatLayout` of the buffer they are views of). Raises
    ``ValueError`` as :func:`actor_critic_forward` does."""
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    width = lambda layers: sum(int(w.shape[0]) for w, _ in layers)  # noqa: E731
    return FlatNet(None if trunk is None else _table(layout, trunk, "trunk."),
                   _table(layout, pi, "pi."), _table(layout, vf, "vf."),
                   0 if trunk is None else width(trunk), width(pi), width(vf),
                   int(_obs_dim(trunk, pi)), int(pi[-1][0].shape[0]))


class FlatCache(NamedTuple):
    """What :func:`flat_backward` reads: the input ``x [B, D]``, the trunk's outputs buffer (or
    ``None``), the heads' input ``z`` (``x`` with separate towers), the policy and value towers'
    outputs buffers (of :func:`ppo_ref.nn.mlp._mlp_forward_flat`), all in the compute dtype."""
    x: np.ndarray
    trunk_acts: Optional[np.ndarray]
    z: np.ndarray
    pi_acts: Optional[np.ndarray]
    vf_acts: Optional[np.ndarray]


def _tower(x, flat, table, width, relu):
    """``(acts, y)``: the outputs buffer of :func:`_mlp_forward_flat` on ``x`` and its last
    block, the tower output ``y [rows, out]``."""
    rows = x.shape[0]
    acts = np.empty(rows * width, flat.dtype)
    _mlp_forward_flat(x, flat, table, relu, acts)
    n_out = int(table[-1, 2])
    return acts, acts[rows * (width - n_out):].reshape(rows, n_out)


def flat_forward(net: FlatNet, flat: np.ndarray, x: np.ndarray, relu: bool,
                 policy: bool = True, value: bool = True):
    """:func:`actor_critic_forward` on the parameter buffer ``flat`` (float64 or float32) in the
    layout of ``net``, for ``x [B, D]`` C-contiguous of the dtype of ``flat``; unchecked.

    Returns ``(policy_out [B, P] or None, values [B] or None, FlatCache)`` in the dtype of
    ``flat`` (``policy``/``value`` False skip that tower). Same equations; the summation order is
    the fixed one of the section comment, so per row the results do not depend on the batch or
    the machine. Equal to :func:`actor_critic_forward` (and to
    ``ppo_ref.spec.networks.actor_critic_forward``, the same math) within rtol 1e-12 in
    float64.
    """
    trunk_acts = None
    z = x
    if net.trunk is not None:
        trunk_acts, z = _tower(x, flat, net.trunk, net.trunk_width, relu)
        _activate_inplace(z, relu)
    out = values = pi_acts = vf_acts = None
    if policy:
        pi_acts, out = _tower(z, flat, net.pi, net.pi_width, relu)
    if value:
        vf_acts, v = _tower(z, flat, net.vf, net.vf_width, relu)
        values = v[:, 0]
    return out, values, FlatCache(x, trunk_acts, z, pi_acts, vf_acts)


def flat_backward(net: FlatNet, flat: np.ndarray, cache: FlatCache, d_policy_out: np.ndarray,
                  d_values: np.ndarray, relu: bool, grads: np.ndarray) -> None:
    """:func:`actor_critic_backward` of :func:`flat_forward` (both towers run): writes every
    network gradient into ``grads`` (1-D, the layout and dtype of ``flat``; other entries
    untouched). ``d_policy_out [B, P]``, ``d_values [B]`` C-contiguous of the dtype of
    ``flat``; unchecked. No gradient with respect to ``x`` is formed.

    Summation order: that of :func:`ppo_ref.nn.mlp._mlp_backward_flat` per tower (rows in
    order); with a shared trunk ``dz = d_pi @ w_pi`` then the value head's terms added on
    (``dz += d_v @ w_vf``, one FMA chain), times the trunk's activation derivative. Equal to
    :func:`actor_critic_backward` (and ``ppo_ref.spec.networks.actor_critic_backward``) within
    rtol 1e-10 in float64 (relative to each gradient array's largest entry).
    """
    x = cache.x
    dv = d_values.reshape(-1, 1)
    if net.trunk is None:
        _mlp_backward_flat(x, cache.pi_acts, flat, net.pi, relu, d_policy_out, grads, None)
        _mlp_backward_flat(x, cache.vf_acts, flat, net.vf, relu, dv, grads, None)
        return
    z = cache.z
    dz = np.zeros(z.shape, flat.dtype)
    _mlp_backward_flat(z, cache.pi_acts, flat, net.pi, relu, d_policy_out, grads, dz)
    _mlp_backward_flat(z, cache.vf_acts, flat, net.vf, relu, dv, grads, dz)
    _activation_grad(dz, z, relu)
    _mlp_backward_flat(x, cache.trunk_acts, flat, net.trunk, relu, dz, grads, None)
