"""The compiled tier of the MLP actor-critic: both towers (or a shared trunk and its heads) on
one flat parameter buffer, the network of :class:`ppo_ref.train.policies.MLPPolicy`.

:func:`flat_forward` equals :func:`ppo_ref.spec.networks.actor_critic_forward` within rtol
1e-12 and :func:`flat_backward` equals :func:`ppo_ref.spec.networks.actor_critic_backward`
within rtol 1e-10 (relative to each gradient array's largest entry), in float64, on the same
parameters (the spec's keys ``pi.*``, ``vf.*``, ``trunk.*``, from
:func:`ppo_ref.spec.networks.actor_critic_init`) read through a :class:`FlatNet` of layer tables
(``tests/test_mlp_policy_fast.py``). :func:`flat_net` checks the parameters once per layout.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import numpy as np

from ppo_ref.fast.mlp import (_activate_inplace, _activation_grad, mlp_backward_flat,
                              mlp_forward_flat, mlp_layers)

__all__ = ["FlatNet", "FlatCache", "flat_net", "flat_forward", "flat_backward"]


def _check_params_mapping(params, name: str = "params") -> None:
    if not isinstance(params, Mapping):
        raise ValueError(f"{name} must be a dict of arrays, got {type(params).__name__}")


def _structure(params: Mapping, shared_trunk: bool):
    """Parse and check the towers: returns ``(trunk_layers or None, pi_layers, vf_layers)``."""
    _check_params_mapping(params)
    pi = mlp_layers(params, "pi.")
    vf = mlp_layers(params, "vf.")
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
            trunk = mlp_layers(params, "trunk.")
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


# --------------------------------------------------------------------------------------------
# Compiled actor-critic on a flat parameter buffer (the fast tier of MLPPolicy)
#
# Each tower (and the shared trunk) is an MLP of :func:`ppo_ref.fast.mlp.mlp_forward_flat` /
# :func:`~ppo_ref.fast.mlp.mlp_backward_flat` described by a layer table into the parameter
# buffer: every product is a chain of fused multiply-adds in the order documented in
# :mod:`ppo_ref.fast.mlp` (forward over the inputs k = 0, 1, ..., row by row; weight gradients
# over the rows in order), tanh is the project's own :func:`ppo_ref.fast.lstm._tanh_any`. So a
# row's outputs never depend on the other rows of the call (acting on N rows, the rollout's
# T N rows and any minibatch agree bit for bit), and no result depends on BLAS or on the
# machine (IEEE 754 arithmetic with a correctly rounded fma). The shared trunk's last layer is
# activated (:func:`~ppo_ref.fast.mlp._activate_inplace`) and the heads' input gradients are
# summed into one array (the value head's chain continues the policy head's) before its
# activation derivative.

class FlatNet(NamedTuple):
    """The layer tables of an actor-critic whose parameters live in one buffer (checked once per
    layout by :func:`flat_net`): ``trunk`` (``None`` with separate towers or a shared trunk of
    ``net_arch=()``), ``pi``, ``vf``: int64 ``[layers, 4]`` tables of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat` (``w`` offset, ``b`` offset, ``out``, ``in``);
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
    """Check the network's arrays ``params`` (exactly the network's keys: float64 layers whose
    widths chain, a one-output value head, heads on the trunk when ``shared_trunk``) and return
    their :class:`FlatNet` in ``layout`` (the :class:`~ppo_ref.fast.flat.FlatLayout` of the
    buffer they are views of). Raises ``ValueError`` naming the bad or missing key."""
    trunk, pi, vf = _structure(params, bool(shared_trunk))
    width = lambda layers: sum(int(w.shape[0]) for w, _ in layers)  # noqa: E731
    return FlatNet(None if trunk is None else _table(layout, trunk, "trunk."),
                   _table(layout, pi, "pi."), _table(layout, vf, "vf."),
                   0 if trunk is None else width(trunk), width(pi), width(vf),
                   int(_obs_dim(trunk, pi)), int(pi[-1][0].shape[0]))


class FlatCache(NamedTuple):
    """What :func:`flat_backward` reads: the input ``x [B, D]``, the trunk's outputs buffer (or
    ``None``), the heads' input ``z`` (``x`` with separate towers), the policy and value towers'
    outputs buffers (of :func:`ppo_ref.fast.mlp.mlp_forward_flat`), all in the compute dtype."""
    x: np.ndarray
    trunk_acts: Optional[np.ndarray]
    z: np.ndarray
    pi_acts: Optional[np.ndarray]
    vf_acts: Optional[np.ndarray]


def _tower(x, flat, table, width, relu):
    """``(acts, y)``: the outputs buffer of :func:`mlp_forward_flat` on ``x`` and its last
    block, the tower output ``y [rows, out]``."""
    rows = x.shape[0]
    acts = np.empty(rows * width, flat.dtype)
    mlp_forward_flat(x, flat, table, relu, acts)
    n_out = int(table[-1, 2])
    return acts, acts[rows * (width - n_out):].reshape(rows, n_out)


def flat_forward(net: FlatNet, flat: np.ndarray, x: np.ndarray, relu: bool,
                 policy: bool = True, value: bool = True):
    """:func:`ppo_ref.spec.networks.actor_critic_forward` on the parameter buffer ``flat``
    (float64 or float32) in the layout of ``net``, for ``x [B, D]`` C-contiguous of the dtype of
    ``flat``; unchecked.

    Returns ``(policy_out [B, P] or None, values [B] or None, FlatCache)`` in the dtype of
    ``flat`` (``policy``/``value`` False skip that tower). Same equations; the summation order is
    the fixed one of the section comment, so per row the results do not depend on the batch or
    the machine. Equal to :func:`ppo_ref.spec.networks.actor_critic_forward` within rtol 1e-12
    in float64.
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
    """:func:`ppo_ref.spec.networks.actor_critic_backward` of :func:`flat_forward` (both towers
    run): writes every network gradient into ``grads`` (1-D, the layout and dtype of ``flat``;
    other entries untouched). ``d_policy_out [B, P]``, ``d_values [B]`` C-contiguous of the
    dtype of ``flat``; unchecked. No gradient with respect to ``x`` is formed.

    Summation order: that of :func:`ppo_ref.fast.mlp.mlp_backward_flat` per tower (rows in
    order); with a shared trunk ``dz = d_pi @ w_pi`` then the value head's terms added on
    (``dz += d_v @ w_vf``, one FMA chain), times the trunk's activation derivative. Equal to
    :func:`ppo_ref.spec.networks.actor_critic_backward` within rtol 1e-10 in float64 (relative to
    each gradient array's largest entry).
    """
    x = cache.x
    dv = d_values.reshape(-1, 1)
    if net.trunk is None:
        mlp_backward_flat(x, cache.pi_acts, flat, net.pi, relu, d_policy_out, grads, None)
        mlp_backward_flat(x, cache.vf_acts, flat, net.vf, relu, dv, grads, None)
        return
    z = cache.z
    dz = np.zeros(z.shape, flat.dtype)
    mlp_backward_flat(z, cache.pi_acts, flat, net.pi, relu, d_policy_out, grads, dz)
    mlp_backward_flat(z, cache.vf_acts, flat, net.vf, relu, dv, grads, dz)
    _activation_grad(dz, z, relu)
    mlp_backward_flat(x, cache.trunk_acts, flat, net.trunk, relu, dz, grads, None)
