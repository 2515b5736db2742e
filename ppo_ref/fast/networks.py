"""The compiled tier's MLP actor-critic: the twins of :mod:`ppo_ref.spec.networks`' functions
(parameters, architecture and equations there), the whole network in one compiled pass of
:mod:`ppo_ref.fast._mlp`. float32 when ``obs`` and every parameter are float32, else float64.
Each equals the spec within rtol 1e-12, atol 1e-14 (float32: rtol 1e-4, atol 1e-6) per result
array relative to its largest entry. A non-finite result raises ``FloatingPointError``; widths
that do not chain ``ValueError``; nothing else is validated.
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
    """``(x, acts, policy_out or None, vf_start, net)``: the forward pass of the towers asked for
    (:func:`ppo_ref.fast.layers._run_forward`; the hidden layers' outputs kept when both
    towers run, for the backward pass)."""
    net = _net(params, _SHARED if shared_trunk else _SEPARATE)
    if np.ndim(obs) != 2:
        raise ValueError(f"obs must have shape [batch, obs_dim], got {np.shape(obs)}")
    x, ws, acts, pi_start, vf_start = _run_forward(params, net, obs, policy, value,
                                                   policy and value, activation == "relu", where)
    policy_out = None
    if policy:
        rows, n_out = x.shape[0], ws[net.n_trunk + net.n_pi - 1].shape[0]
        policy_out = acts[pi_start:pi_start + rows * n_out].reshape(rows, n_out)
    return x, acts, policy_out, vf_start, net


def actor_critic_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_forward`: ``(policy_out [B, P],
    values [B], cache)``; the cache is opaque (for :func:`actor_critic_backward` only)."""
    shared_trunk = bool(shared_trunk)
    x, acts, policy_out, vf_start, _ = _run(params, obs, activation, shared_trunk, True, True,
                                            "ppo_ref.fast.networks.actor_critic_forward")
    cache = _Cache(x, acts, shared_trunk, activation == "relu")
    return policy_out, acts[vf_start:vf_start + x.shape[0]], cache


def value_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.value_forward`: the values ``[B]`` (the bits of
    :func:`actor_critic_forward`; the policy tower is not run)."""
    x, acts, _, vf_start, _ = _run(params, obs, activation, bool(shared_trunk), False, True,
                                   "ppo_ref.fast.networks.value_forward")
    return acts[vf_start:vf_start + x.shape[0]]


def policy_forward(params, obs, activation="tanh", shared_trunk=False):
    """Twin of :func:`ppo_ref.spec.networks.policy_forward`: ``policy_out [B, P]`` (the bits of
    :func:`actor_critic_forward`; the value tower is not run)."""
    return _run(params, obs, activation, bool(shared_trunk), True, False,
                "ppo_ref.fast.networks.policy_forward")[2]


def policy_latent(params, cache):
    """Twin of :func:`ppo_ref.spec.networks.policy_latent`: the input rows ``[B, L]`` of the
    policy tower's output layer (a copy; the bits of :func:`actor_critic_forward`)."""
    net = _net(params, _SHARED if cache.shared_trunk else _SEPARATE)
    rows = cache.x.shape[0]
    last = net.n_trunk + net.n_pi - 1   # the policy output layer; its input is layer last - 1's
    if net.n_pi == 1 and net.n_trunk == 0:
        return cache.x.copy()
    widths = [params[w].shape[0] for w, _ in net.keys]
    start = rows * sum(widths[:last - 1])
    return cache.acts[start:start + rows * widths[last - 1]].reshape(rows, -1).copy()


def actor_critic_backward(params, cache, d_policy_out, d_values):
    """Twin of :func:`ppo_ref.spec.networks.actor_critic_backward`: the gradients in the key
    order of ``params`` and the dtype of the forward pass."""
    net = _net(params, _SHARED if cache.shared_trunk else _SEPARATE)
    return _run_backward(params, net, cache.x, cache.acts, cache.relu, d_policy_out, d_values,
                         False, "ppo_ref.fast.networks.actor_critic_backward")[1]
