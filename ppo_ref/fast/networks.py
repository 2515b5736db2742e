"""The compiled tier's MLP actor-critic: the twins of :mod:`ppo_ref.spec.networks`'
``actor_critic_forward``, ``actor_critic_backward``, ``value_forward``, ``policy_forward`` and
``policy_latent``
(the readable definitions, whose docstrings state the architecture and the equations).

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

from ppo_ref.fast.layers import _net, _run_backward, _run_forward

__all__ = ["actor_critic_forward", "actor_critic_backward", "value_forward",
           "policy_forward", "policy_latent"]

_SEPARATE, _SHARED = ("pi.", "vf."), ("trunk.", "pi.", "vf.")


class _Cache(NamedTuple):
    """What :func:`actor_critic_backward` reads: the rows ``x [B, D]`` and the outputs buffer
    of :func:`ppo_ref.fast._mlp._forward` (compute dtype), ``shared_trunk``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    shared_trunk: bool
    relu: bool


def _run(params, obs, activation, shared_trunk: bool, policy: bool, value: bool, where: str):
    """``(x, ws, acts, pi_start, vf_start, net)``: the forward pass of the towers asked for
    (:func:`ppo_ref.fast.layers._run_forward`; the hidden layers' outputs kept when both
    towers run, for the backward pass)."""
    net = _net(params, _SHARED if shared_trunk else _SEPARATE)
    if np.ndim(obs) != 2:
        raise ValueError(f"obs must have shape [batch, obs_dim], got {np.shape(obs)}")
    return _run_forward(params, net, obs, policy, value, policy and value,
                        activation == "relu", where) + (net,)


def actor_critic_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_forward`: ``(policy_out [B, P],
    values [B], cache)``; the cache is opaque (for :func:`actor_critic_backward` only).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per result array relative to its largest entry.
    """
    shared_trunk = bool(shared_trunk)
    x, ws, acts, pi_start, vf_start, net = _run(params, obs, activation, shared_trunk, True, True,
                                                "ppo_ref.fast.networks.actor_critic_forward")
    rows, n_out = x.shape[0], ws[net.n_trunk + net.n_pi - 1].shape[0]
    policy_out = acts[pi_start:pi_start + rows * n_out].reshape(rows, n_out)
    cache = _Cache(x, acts, shared_trunk, activation == "relu")
    return policy_out, acts[vf_start:vf_start + rows], cache


def value_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.value_forward`: the values ``[B]`` (the trunk and
    value tower of :func:`actor_critic_forward`, the same bits; the policy tower is not run).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, relative to the largest value.
    """
    x, _, acts, _, vf_start, _ = _run(params, obs, activation, bool(shared_trunk), False, True,
                                      "ppo_ref.fast.networks.value_forward")
    return acts[vf_start:vf_start + x.shape[0]]


def policy_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.policy_forward`: ``policy_out [B, P]`` (the trunk
    and policy tower of :func:`actor_critic_forward`, the same bits; the value tower is not
    run).

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, relative to the largest entry.
    """
    x, ws, acts, pi_start, _, net = _run(params, obs, activation, bool(shared_trunk), True, False,
                                         "ppo_ref.fast.networks.policy_forward")
    rows, n_out = x.shape[0], ws[net.n_trunk + net.n_pi - 1].shape[0]
    return acts[pi_start:pi_start + rows * n_out].reshape(rows, n_out)


def policy_latent(params, cache):
    """Twin of :func:`ppo_ref.spec.networks.policy_latent`: the input rows of the policy
    tower's output layer, copied from the pass's outputs buffer (or its input rows when the
    tower reads ``obs``), ``[B, L]`` in the dtype of the forward pass.

    The same bits as the activations of :func:`actor_critic_forward`; against the spec within
    rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in float32.
    """
    net = _net(params, _SHARED if cache.shared_trunk else _SEPARATE)
    rows = cache.x.shape[0]
    last = net.n_trunk + net.n_pi - 1   # the policy output layer; its input is layer last - 1's
    if net.n_pi == 1 and net.n_trunk == 0:
        return cache.x.copy()
    widths = [params[w].shape[0] for w, _ in net.keys]
    start = rows * sum(widths[:last - 1])
    return cache.acts[start:start + rows * widths[last - 1]].reshape(rows, -1).copy()


def actor_critic_backward(params, cache, d_policy_out, d_values):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_backward`: the gradients, a dict with
    the keys and key order of ``params``, in the dtype of the forward pass.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per gradient array relative to its largest entry.
    """
    net = _net(params, _SHARED if cache.shared_trunk else _SEPARATE)
    return _run_backward(params, net, cache.x, cache.acts, cache.relu, d_policy_out, d_values,
                         False, "ppo_ref.fast.networks.actor_critic_backward")[1]
