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

The compiled drivers run a whole pass in one call, into buffers the caller owns (the fast
policy's update reuses them from minibatch to minibatch): :func:`flat_forward_into` and
:func:`flat_backward_into` are the network's passes (:func:`flat_forward` and
:func:`flat_backward` are they, on fresh buffers / the cache's), and
:func:`categorical_forward_into` / :func:`categorical_backward_into` add the categorical
head's kernels of :mod:`ppo_ref.fast.distributions` to them (the same calls on the same values,
so the same bits). Through :class:`ppo_ref.train.policies.MLPPolicy` they are the
``mlp_policy`` (Gaussian and MultiDiscrete heads) and ``mlp_policy_categorical`` rows of
``tests/test_tiers.py``, within the tolerances above.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import numpy as np

from ppo_ref.fast.distributions import categorical_backward_kernel, categorical_eval_kernel
from ppo_ref.fast.mlp import (_activate_inplace, _activation_grad, _dense_layer, layer_table,
                              mlp_backward_flat, mlp_backward_pair, mlp_forward_flat,
                              mlp_forward_pair)
from ppo_ref._numba import njit
from ppo_ref.spec.networks import actor_critic_towers

__all__ = ["FlatNet", "FlatCache", "flat_net", "flat_forward", "flat_backward",
           "flat_forward_into", "flat_backward_into", "categorical_forward_into",
           "categorical_backward_into", "tower_tables", "NO_LAYERS", "acting_weights",
           "acting_forward"]


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


#: The layer table of no layers (``[0, 4]``: nothing in it to write), the trunk's table of a
#: network without one in :func:`tower_tables`.
NO_LAYERS = np.zeros((0, 4), dtype=np.int64)


def tower_tables(net: FlatNet):
    """``(trunk, pi, vf)``: the layer tables of ``net`` as the compiled drivers
    (:func:`flat_forward_into`, :func:`flat_backward_into`, :func:`categorical_forward_into`,
    :func:`categorical_backward_into`) read them, the trunk's a ``[0, 4]`` table
    (:data:`NO_LAYERS`) when there is none."""
    return (net.trunk if net.trunk is not None else NO_LAYERS), net.pi, net.vf


@njit
def _last_block(acts, rows, table):
    """The last layer's block ``[rows, out_L]`` of an outputs buffer ``acts`` of exactly
    ``rows * sum_i out_i`` entries written by :func:`ppo_ref.fast.mlp.mlp_forward_flat` with
    ``table`` (a view)."""
    n_out = table[table.shape[0] - 1, 2]
    return acts[acts.size - rows * n_out:].reshape(rows, n_out)


@njit
def flat_forward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts, values,
                      policy, value):
    """:func:`flat_forward` in one compiled call, into buffers the caller gives (the same
    calls of :func:`ppo_ref.fast.mlp.mlp_forward_flat` on the same values, so the same bits:
    :func:`flat_forward` is this function on fresh buffers; both towers by
    :func:`ppo_ref.fast.mlp.mlp_forward_pair`, on numba's threads).

    Args:
        x: ``[B, D]`` C-contiguous, the dtype of ``flat`` (float64 or float32).
        flat: 1-D parameter buffer; ``trunk``, ``pi``, ``vf``: its layer tables
            (:func:`tower_tables`).
        relu: as :func:`flat_forward`.
        trunk_acts, pi_acts, vf_acts: 1-D outputs buffers (dtype of ``flat``) of exactly ``B``
            times the tower's ``*_width`` entries (``trunk_acts`` any size without a trunk,
            ``pi_acts`` / ``vf_acts`` any size when ``policy`` / ``value`` is False), written:
            every layer's output (:func:`ppo_ref.fast.mlp.mlp_forward_flat`); the trunk's last
            block activated in place (the heads' input ``z``).
        values: float64 ``[B]``, written with the value head's output when ``value`` (exact
            for float32: a widening).
        policy, value: run the policy / value tower.

    Unchecked: the caller guarantees shapes, contiguity and one dtype.
    """
    rows = x.shape[0]
    z = x
    if trunk.shape[0] > 0:
        mlp_forward_flat(x, flat, trunk, relu, trunk_acts)
        z = _last_block(trunk_acts, rows, trunk)
        _activate_inplace(z, relu)
    if policy and value:
        mlp_forward_pair(flat, relu, z, pi, pi_acts, z, vf, vf_acts)
    elif policy:
        mlp_forward_flat(z, flat, pi, relu, pi_acts)
    elif value:
        mlp_forward_flat(z, flat, vf, relu, vf_acts)
    if value:
        v = _last_block(vf_acts, rows, vf)
        for n in range(rows):
            values[n] = v[n, 0]


@njit
def flat_backward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts,
                       d_policy_out, d_values, grads):
    """:func:`flat_backward` in one compiled call (the same calls of
    :func:`ppo_ref.fast.mlp.mlp_backward_flat` on the same values, so the same bits:
    :func:`flat_backward` is this function on its cache's buffers; separate towers by
    :func:`ppo_ref.fast.mlp.mlp_backward_pair`, on numba's threads).

    ``x``, ``flat``, the tables, ``relu`` and the three outputs buffers as given to (and
    written by) :func:`flat_forward_into` with both towers run; ``d_policy_out [B, P]``
    C-contiguous of the dtype of ``flat``; ``d_values [B]`` float64 or of the dtype of
    ``flat`` (rounded to it entry by entry, as ``astype``); ``grads`` 1-D of the layout and
    dtype of ``flat``: every network gradient written (other entries untouched). Unchecked.
    """
    rows = x.shape[0]
    dv = np.empty((rows, 1), flat.dtype)
    for n in range(rows):
        dv[n, 0] = d_values[n]
    if trunk.shape[0] == 0:   # separate towers: nothing written in common
        mlp_backward_pair(flat, relu, grads, x, pi_acts, pi, d_policy_out, None, x, vf_acts, vf,
                          dv, None)
        return
    z = _last_block(trunk_acts, rows, trunk)
    dz = np.zeros(z.shape, flat.dtype)
    mlp_backward_flat(z, pi_acts, flat, pi, relu, d_policy_out, grads, dz)
    mlp_backward_flat(z, vf_acts, flat, vf, relu, dv, grads, dz)
    _activation_grad(dz, z, relu)
    mlp_backward_flat(x, trunk_acts, flat, trunk, relu, dz, grads, None)


@njit
def categorical_forward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts,
                             values, actions, log_probs, entropy, probs):
    """:func:`flat_forward_into` (both towers) then
    :func:`ppo_ref.fast.distributions.categorical_eval_kernel` on its logits (the policy
    tower's last block) in one compiled call: writes ``values``, ``log_probs``, ``entropy``
    (float64 ``[B]``) and ``probs`` (float64 ``[B, P]``) for ``actions`` int64 ``[B]``.
    Returns the kernel's flag (False: logits not finite, their spread overflows, or an
    action out of range; the caller raises). Unchecked."""
    flat_forward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts, values,
                      True, True)
    return categorical_eval_kernel(_last_block(pi_acts, x.shape[0], pi), actions, log_probs,
                                   entropy, probs)


@njit
def categorical_backward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts,
                              probs, actions, entropy, d_log_probs, d_entropy, use_entropy,
                              d_values, d_logits, grads):
    """:func:`ppo_ref.fast.distributions.categorical_backward_kernel` (``probs``,
    ``entropy`` of :func:`categorical_forward_into`; ``d_log_probs``, ``d_entropy`` float64
    ``[B]``, ``d_entropy`` read only when ``use_entropy``) into ``d_logits [B, P]`` (the dtype
    of ``flat``), then :func:`flat_backward_into` with it, in one compiled call. Unchecked."""
    categorical_backward_kernel(probs, actions, entropy, d_log_probs, d_entropy, use_entropy,
                                d_logits)
    flat_backward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts, d_logits,
                       d_values, grads)


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
    ``mlp_policy`` and ``mlp_policy_float32`` rows of ``tests/test_tiers.py``. It is
    :func:`flat_forward_into` on fresh buffers.
    """
    rows = x.shape[0]
    dt = flat.dtype
    trunk, pi, vf = tower_tables(net)
    trunk_acts = np.empty(rows * net.trunk_width, dt)
    pi_acts = np.empty(rows * net.pi_width if policy else 0, dt)
    vf_acts = np.empty(rows * net.vf_width if value else 0, dt)
    flat_forward_into(x, flat, trunk, pi, vf, relu, trunk_acts, pi_acts, vf_acts,
                      np.empty(rows if value else 0), policy, value)
    z = x
    if net.trunk is not None:
        z = trunk_acts[rows * (net.trunk_width - int(trunk[-1, 2])):].reshape(rows, -1)
    out = pi_acts[rows * (net.pi_width - net.policy_out_dim):].reshape(rows, -1) if policy else None
    values = vf_acts[rows * (net.vf_width - 1):] if value else None
    return out, values, FlatCache(x, trunk_acts if net.trunk is not None else None, z,
                                  pi_acts if policy else None, vf_acts if value else None)


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
    ``tests/test_tiers.py``). It is :func:`flat_backward_into` on the cache's buffers.
    """
    trunk, pi, vf = tower_tables(net)
    trunk_acts = cache.trunk_acts if cache.trunk_acts is not None else flat[:0]
    flat_backward_into(cache.x, flat, trunk, pi, vf, relu, trunk_acts, cache.pi_acts,
                       cache.vf_acts, d_policy_out, d_values, grads)


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
    tower's, the last one linear: per layer ``a = b + h @ w.T`` and the activation by
    :func:`ppo_ref.fast.mlp._dense_layer` on the transposed weight, the calls of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat` on the same values. Unchecked."""
    rows = x.shape[0]
    h = x
    for tower in range(2):
        table = trunk if tower == 0 else pi
        n_layers = table.shape[0]
        for i in range(n_layers):
            w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
            a = np.empty((rows, n_out), flat_t.dtype)
            _dense_layer(h, flat_t[w_off:w_off + n_in * n_out].reshape(n_in, n_out),
                         flat_t[b_off:b_off + n_out], a, tower == 0 or i < n_layers - 1, relu)
            h = a
    return h
