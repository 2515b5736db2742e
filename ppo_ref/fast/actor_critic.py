"""The compiled tier of the MLP actor-critic: both towers (or a shared trunk and its heads) on
one flat parameter buffer, the network of :class:`ppo_ref.train.policies.MLPPolicy`.

:func:`flat_forward` equals :func:`ppo_ref.spec.networks.actor_critic_forward` and
:func:`flat_backward` equals :func:`ppo_ref.spec.networks.actor_critic_backward` in float64
within rtol 1e-11, atol 1e-14 per result array (``|fast - spec| <= 1e-14 + 1e-11 *
max|spec|``, through :class:`ppo_ref.train.policies.MLPPolicy`: the ``mlp_policy`` row of
``tests/test_tiers.py``), and in float32 buffers within rtol 2e-4, atol 1e-5 (the
``mlp_policy_float32`` row), on the same parameters (the spec's keys ``pi.*``, ``vf.*``,
``trunk.*``, from :func:`ppo_ref.spec.networks.actor_critic_init`) read through a
:class:`FlatNet` of layer tables. :func:`flat_net` checks the parameters once per layout.
:func:`acting_forward` (on the buffer of :func:`acting_weights`) gives the policy output of
:func:`flat_forward` bit for bit (through :meth:`ppo_ref.train.policies.MLPPolicy.policy_out_fn`:
``tests/test_mlp_policy_fast.py``).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import numpy as np

from ppo_ref.fast.mlp import (_activate_inplace, _activation_grad, layer_table,
                              mlp_backward_flat, mlp_forward_flat)
from ppo_ref.fast.lstm import _linear_rows
from ppo_ref._numba import njit
from ppo_ref.spec.networks import actor_critic_towers

__all__ = ["FlatNet", "FlatCache", "flat_net", "flat_forward", "flat_backward",
           "acting_weights", "acting_forward"]


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


def flat_net(params: Mapping[str, np.ndarray], layout, shared_trunk: bool) -> FlatNet:
    """Check the network's arrays ``params`` with the spec's own check
    (:func:`ppo_ref.spec.networks.actor_critic_towers`: exactly the network's keys, finite
    float64 layers whose widths chain, a one-output value head, heads on the trunk when
    ``shared_trunk``) and return their :class:`FlatNet` in ``layout`` (the
    :class:`~ppo_ref.fast.flat.FlatLayout` of the buffer they are views of). Raises
    ``ValueError`` naming the bad or missing key."""
    trunk, pi, vf = actor_critic_towers(params, bool(shared_trunk))
    tables = {prefix: layer_table(layout, params, prefix, len(tower) // 2)
              for prefix, tower in (("trunk.", trunk), ("pi.", pi), ("vf.", vf))
              if tower is not None}
    width = lambda table: int(table[:, 2].sum())  # noqa: E731
    first = tables.get("trunk.", tables["pi."])
    return FlatNet(tables.get("trunk."), tables["pi."], tables["vf."],
                   width(tables["trunk."]) if trunk is not None else 0,
                   width(tables["pi."]), width(tables["vf."]), int(first[0, 3]),
                   int(tables["pi."][-1, 2]))


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
    the machine. Equal to :func:`ppo_ref.spec.networks.actor_critic_forward` within rtol 1e-11,
    atol 1e-14 per result array in float64 (rtol 2e-4, atol 1e-5 in float32): the
    ``mlp_policy`` and ``mlp_policy_float32`` rows of ``tests/test_tiers.py``.
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
    :func:`ppo_ref.spec.networks.actor_critic_backward` within rtol 1e-11, atol 1e-14 in float64,
    relative to each gradient array's largest entry (the ``mlp_policy`` row of
    ``tests/test_tiers.py``).
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


# --------------------------------------------------------------------------------------------
# Acting: the policy output alone, with the weights transposed once per parameter set
#
# A rollout calls the policy tower once per step on a few rows with parameters that do not
# change during the rollout. :func:`flat_forward` transposes each weight into a scratch array
# per call (:func:`ppo_ref.fast.mlp.mlp_forward_flat`); :func:`acting_weights` does it once and
# :func:`acting_forward` reads the transposed copies: the same products on the same values.

def acting_weights(net: FlatNet, flat: np.ndarray):
    """``(flat_t, trunk, pi)`` for :func:`acting_forward`: ``flat_t`` a copy of the parameter
    buffer ``flat`` (1-D, float64 or float32, the layout of ``net``) in which every weight of
    the trunk and policy tower (``w_i [out_i, in_i]``) is stored transposed (``w_i.T [in_i,
    out_i]``, C order, at ``w_i``'s offset; everything else as in ``flat``); ``trunk`` the
    trunk's layer table (``[0, 4]`` when there is none), ``pi`` the policy tower's."""
    flat_t = np.array(flat, copy=True)
    trunk = net.trunk if net.trunk is not None else np.zeros((0, 4), dtype=np.int64)
    for w_off, _, n_out, n_in in trunk.tolist() + net.pi.tolist():
        w = flat_t[w_off:w_off + n_out * n_in]
        w[:] = w.reshape(n_out, n_in).T.reshape(-1)
    return flat_t, trunk, net.pi


@njit
def acting_forward(x, flat_t, trunk, pi, relu):
    """``policy_out [rows, P]`` of :func:`flat_forward` ``(net, flat, x, relu, value=False)``,
    bit for bit, as a new array; ``(flat_t, trunk, pi) = acting_weights(net, flat)``, ``x [rows,
    D]`` C-contiguous in the dtype of ``flat_t``, ``relu`` as in :func:`flat_forward`.

    The trunk's layers all activated (its last one too, as the heads read it), then the policy
    tower's, the last one linear: per layer ``a = b + h @ w.T`` by
    :func:`ppo_ref.fast.lstm._linear_rows` on the transposed weight and
    :func:`ppo_ref.fast.mlp._activate_inplace`, the calls of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat` on the same values. Unchecked."""
    rows = x.shape[0]
    h = x
    for tower in range(2):
        table = trunk if tower == 0 else pi
        n_layers = table.shape[0]
        for i in range(n_layers):
            w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
            a = np.empty((rows, n_out), flat_t.dtype)
            _linear_rows(h, flat_t[w_off:w_off + n_in * n_out].reshape(n_in, n_out),
                         flat_t[b_off:b_off + n_out], a)
            if tower == 0 or i < n_layers - 1:
                _activate_inplace(a, relu)
            h = a
    return h
