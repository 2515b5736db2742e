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
from ppo_ref.fast.layers import _compiled, _gradient_arrays, _grads, _net

__all__ = ["actor_critic_forward", "actor_critic_backward", "value_forward"]

_SEPARATE, _SHARED = ("pi.", "vf."), ("trunk.", "pi.", "vf.")


class _Cache(NamedTuple):
    """What :func:`actor_critic_backward` reads: the rows ``x [B, D]`` and the outputs buffer
    of :func:`ppo_ref.fast._mlp._forward` (compute dtype), ``shared_trunk``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    shared_trunk: bool
    relu: bool


def _towers(params, shared_trunk: bool):
    """``(net, n_trunk, n_pi)``: the layers of ``params`` in network order (trunk, policy,
    value) and the numbers of trunk and policy layers."""
    net = _net(params, _SHARED if shared_trunk else _SEPARATE)
    return net, net.counts[0] if shared_trunk else 0, net.counts[-2]


def _forward_pass(params, obs, activation, shared_trunk: bool, policy: bool, where: str):
    """``(x, acts, pi_start, vf_start, n_out)`` of the forward pass (``policy`` False: the
    value tower alone); ``n_out`` the policy output width."""
    net, n_trunk, n_pi = _towers(params, shared_trunk)
    relu = activation == "relu"

    def run(x, ws, bs):
        return x, ws[n_trunk + n_pi - 1].shape[0], _forward(
            x, ws, bs, len(net.keys), n_trunk, n_pi, policy, relu)
    if np.ndim(obs) != 2:
        raise ValueError(f"obs must have shape [batch, obs_dim], got {np.shape(obs)}")
    x, n_out, (acts, pi_start, vf_start, ok) = _compiled(run, params, net, obs)
    if not ok:
        raise non_finite_result(where)
    return x, acts, pi_start, vf_start, n_out


def actor_critic_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_forward`: ``(policy_out [B, P],
    values [B], cache)``; the cache is opaque (for :func:`actor_critic_backward` only).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per result array relative to its largest entry.
    """
    shared_trunk = bool(shared_trunk)
    x, acts, pi_start, vf_start, n_out = _forward_pass(
        params, obs, activation, shared_trunk, True, "ppo_ref.fast.networks.actor_critic_forward")
    rows = x.shape[0]
    policy_out = acts[pi_start:pi_start + rows * n_out].reshape(rows, n_out)
    cache = _Cache(x, acts, shared_trunk, activation == "relu")
    return policy_out, acts[vf_start:vf_start + rows], cache


def value_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.value_forward`: the values ``[B]`` (the trunk and
    value tower of :func:`actor_critic_forward`, the same bits; the policy tower is not run).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, relative to the largest value.
    """
    x, acts, _, vf_start, _ = _forward_pass(params, obs, activation, bool(shared_trunk), False,
                                            "ppo_ref.fast.networks.value_forward")
    return acts[vf_start:vf_start + x.shape[0]]


def actor_critic_backward(params, cache, d_policy_out, d_values):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_backward`: the gradients, a dict with
    the keys and key order of ``params``, in the dtype of the forward pass.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per gradient array relative to its largest entry.
    """
    net, n_trunk, n_pi = _towers(params, cache.shared_trunk)

    def run(x, ws, bs):
        dt, rows = x.dtype, x.shape[0]
        d_pi = np.ascontiguousarray(d_policy_out, dt).reshape(
            rows, ws[n_trunk + n_pi - 1].shape[0])
        d_vf = np.ascontiguousarray(d_values, dt).reshape(rows, 1)
        gws, gbs = _gradient_arrays(ws, bs, len(net.keys))
        _, ok = _backward(x, ws, cache.acts, len(net.keys), n_trunk, n_pi, cache.relu, d_pi,
                          d_vf, gws, gbs, False)
        return ok, gws, gbs
    ok, gws, gbs = _compiled(run, params, net, cache.x, cache.x.dtype)
    if not ok:
        raise non_finite_result("ppo_ref.fast.networks.actor_critic_backward")
    return _grads(net, gws, gbs, params)
