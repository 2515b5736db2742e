"""The compiled tier's MLP actor-critic: the twins of :mod:`ppo_ref.spec.networks`'
``actor_critic_forward``, ``actor_critic_backward`` and ``value_forward`` (the readable
definitions, whose docstrings state the architecture and the equations).

They take the spec's parameters (the flat dict ``pi.*``, ``vf.*`` and, with a shared trunk,
``trunk.*`` of :func:`ppo_ref.spec.networks.actor_critic_init`) and run the whole network in
one compiled pass (:mod:`ppo_ref.fast._mlp`): fused multiply-add chains in a fixed order, so a
row's results never depend on the other rows of the call (acting on a few rows and a minibatch
give the same bits per row). dtype: when ``obs`` and every parameter are float32 the pass
computes in float32 and returns float32; otherwise everything is float64 (other inputs cast).
A non-finite result raises ``FloatingPointError`` (:func:`ppo_ref._checks.non_finite_result`);
parameters whose widths do not chain raise ``ValueError``. Nothing else is validated: the spec
functions do that.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import non_finite_result
from ppo_ref.fast._mlp import _backward, _forward
from ppo_ref.fast.layers import _KEYS, _compute_dtype, _depth, _layers, _rows

__all__ = ["actor_critic_forward", "actor_critic_backward", "value_forward"]

_PREFIXED = {prefix: tuple((prefix + w, prefix + b) for w, b in _KEYS)
             for prefix in ("trunk.", "pi.", "vf.")}


class _Cache(NamedTuple):
    """What :func:`actor_critic_backward` reads: the rows ``x [B, D]`` and the outputs buffer
    of :func:`ppo_ref.fast._mlp._forward` (compute dtype), ``shared_trunk``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    shared_trunk: bool
    relu: bool


def _network(params, shared_trunk: bool, obs, dt=None):
    """``(keys, ws, bs, n_trunk, n_pi, x)``: the layer keys in network order (trunk, policy,
    value), the layers and ``obs`` as ``[B, D]`` rows, all in the compute dtype (``dt``, or
    the one of ``params`` and ``obs`` when None)."""
    n_trunk = _depth(params, "trunk.") if shared_trunk and "trunk.w0" in params else 0
    n_pi = _depth(params, "pi.")
    keys = (_PREFIXED["trunk."][:n_trunk] + _PREFIXED["pi."][:n_pi]
            + _PREFIXED["vf."][:_depth(params, "vf.")])
    if dt is None:
        dt = _compute_dtype([params[k] for pair in keys for k in pair], obs)
    ws, bs = _layers(params, keys, dt)
    x = _rows(obs, dt, ws[0].shape[1])
    if np.ndim(obs) != 2:
        raise ValueError(f"obs must have shape [batch, {ws[0].shape[1]}], got {np.shape(obs)}")
    return keys, ws, bs, n_trunk, n_pi, x


def actor_critic_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_forward`: ``(policy_out [B, P],
    values [B], cache)``; the cache is opaque (for :func:`actor_critic_backward` only).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 2e-4, atol 1e-5 in
    float32, per result array relative to its largest entry.
    """
    shared_trunk = bool(shared_trunk)
    _, ws, bs, n_trunk, n_pi, x = _network(params, shared_trunk, obs)
    relu = activation == "relu"
    acts, policy_out, values, ok = _forward(x, ws, bs, n_trunk, n_pi, True, relu)
    if not ok:
        raise non_finite_result("ppo_ref.fast.networks.actor_critic_forward")
    return policy_out, values[:, 0], _Cache(x, acts, shared_trunk, relu)


def value_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.value_forward`: the values ``[B]`` (the policy
    tower is not run; the trunk and value tower as in :func:`actor_critic_forward`, the same
    bits).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 2e-4, atol 1e-5 in
    float32, relative to the largest value.
    """
    _, ws, bs, n_trunk, n_pi, x = _network(params, bool(shared_trunk), obs)
    _, _, values, ok = _forward(x, ws, bs, n_trunk, n_pi, False, activation == "relu")
    if not ok:
        raise non_finite_result("ppo_ref.fast.networks.value_forward")
    return values[:, 0]


def actor_critic_backward(params, cache, d_policy_out, d_values):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_backward`: the gradients, a dict with
    the keys and key order of ``params``, in the dtype of the forward pass.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 2e-4, atol 1e-5 in
    float32, per gradient array relative to its largest entry.
    """
    keys, ws, bs, n_trunk, n_pi, x = _network(params, cache.shared_trunk, cache.x,
                                               cache.x.dtype)
    dt = x.dtype
    rows = x.shape[0]
    d_pi = np.ascontiguousarray(d_policy_out, dt).reshape(rows, ws[n_trunk + n_pi - 1].shape[0])
    d_vf = np.ascontiguousarray(d_values, dt).reshape(rows, 1)
    gws = tuple(np.empty(w.shape, dt) for w in ws)
    gbs = tuple(np.empty(b.shape, dt) for b in bs)
    _, ok = _backward(x, cache.acts, ws, n_trunk, n_pi, cache.relu, d_pi, d_vf, gws, gbs,
                      False)
    if not ok:
        raise non_finite_result("ppo_ref.fast.networks.actor_critic_backward")
    grads = {}
    for (wk, bk), gw, gb in zip(keys, gws, gbs):
        grads[wk], grads[bk] = gw, gb
    return {k: grads[k] for k in params if k in grads}
