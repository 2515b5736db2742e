"""The compiled tier of the LSTM actor-critic: the twins of
:mod:`ppo_ref.spec.recurrent_networks`' functions (parameters, architecture and results there):
this tier's LSTM passes (:mod:`ppo_ref.fast.lstm`) composed with its MLP
(:mod:`ppo_ref.fast.layers`). float32 when the observations, the state and every parameter are
float32, else float64; the backward pass computes in the dtype of the forward pass. A
non-finite result raises ``FloatingPointError``; arguments are not validated here.
"""
from __future__ import annotations

from typing import Dict, Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref._checks import non_finite_result, result_dtype
from ppo_ref.fast import layers as _layers
from ppo_ref.fast import lstm as _lstm
from ppo_ref.spec import recurrent_networks as _spec

__all__ = ["recurrent_actor_critic_forward", "recurrent_actor_critic_backward",
           "recurrent_actor_critic_step", "recurrent_value_step"]

_WHERE = "ppo_ref.fast.recurrent_networks."


class _Cache(NamedTuple):
    """What :func:`recurrent_actor_critic_backward` reads: ``lstm_shared``, the cache of this
    tier's LSTM passes (all LSTMs, :func:`lstm_names` order) and those of the two towers."""
    lstm_shared: bool
    lstm: object
    pi: object
    vf: object


def _parts(params: Mapping[str, np.ndarray], names: Tuple[str, ...]) -> Dict[str, dict]:
    """``parts[prefix]``: the entries of ``params`` under each prefix (the LSTMs' ``names``,
    ``"pi"``, ``"vf"``), the prefix stripped."""
    parts = {prefix: {} for prefix in names + ("pi", "vf")}
    for key, value in params.items():
        prefix, _, rest = key.partition(".")
        part = parts.get(prefix)
        if part is not None:
            part[rest] = value
    return parts


def _compute_dtype(parts: Dict[str, dict], *arrays) -> np.dtype:
    """float32 when every float array of ``arrays`` and of the parameters is float32."""
    if result_dtype(*arrays) != np.float32:   # (the common float64 case decided at once)
        return np.dtype(np.float64)
    return result_dtype(*arrays, *(np.asarray(v) for part in parts.values()
                                   for v in part.values()))


def _tower(where: str, mlp_pass, *args):
    """``mlp_pass(*args)`` (:func:`ppo_ref.fast.layers.mlp_forward` or ``mlp_backward``), its
    non-finite result reported as ``where``'s."""
    try:
        return mlp_pass(*args)
    except FloatingPointError:
        raise non_finite_result(where) from None


def _inputs(parts, obs, state):
    """``(x, h0, c0, dt)``: the arrays of ``obs`` and ``state`` and the compute dtype."""
    h0, c0 = state
    obs, h0, c0 = np.asarray(obs), np.asarray(h0), np.asarray(c0)
    dt = _compute_dtype(parts, obs, h0, c0)
    return np.ascontiguousarray(obs, dt), h0, c0, dt


def _step(params, obs, state, episode_starts, lstm_shared, where: str):
    """``(parts, h_new, c_new)``: one step of every LSTM of ``params`` (the critic's last) in
    the acting step's compiled pass, :func:`ppo_ref.fast.lstm._step`."""
    names = _spec.lstm_names(bool(lstm_shared))
    parts = _parts(params, names)
    x, h, c, dt = _inputs(parts, obs, state)
    h_new, c_new = _lstm._step([_lstm._weights(parts[name], dt) for name in names], x, h, c,
                               episode_starts, where)
    return parts, h_new, c_new


def recurrent_actor_critic_forward(params: Mapping[str, np.ndarray], obs, state,
                                   episode_starts, activation: str = "tanh",
                                   lstm_shared: bool = False):
    """Twin of :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_forward`:
    ``(policy_out [T, N, P], values [T, N], final_state, cache)``, the cache this module's own.
    Within rtol 1e-12, atol 1e-14 (float32: rtol 1e-5, atol 1e-6) of the spec."""
    where = _WHERE + "recurrent_actor_critic_forward"
    names = _spec.lstm_names(bool(lstm_shared))
    parts = _parts(params, names)
    x, h0, c0, dt = _inputs(parts, obs, state)
    keep = _lstm._keep(episode_starts, x.shape[0], x.shape[1], dt)
    h_seq, c_T, lstm_cache = _lstm._run_forward(
        [_lstm._weights(parts[name], dt) for name in names], x, np.ascontiguousarray(h0, dt),
        np.ascontiguousarray(c0, dt), keep, where)
    policy_out, pi_cache = _tower(where, _layers.mlp_forward, parts["pi"], h_seq[0], activation)
    values, vf_cache = _tower(where, _layers.mlp_forward, parts["vf"], h_seq[-1], activation)
    final = _spec.LSTMStates(h_seq[:, -1].copy(), c_T.copy())
    cache = _Cache(bool(lstm_shared), lstm_cache, pi_cache, vf_cache)
    return policy_out, values[..., 0], final, cache


def recurrent_actor_critic_backward(params: Mapping[str, np.ndarray], cache, d_policy_out,
                                    d_values):
    """Twin of :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_backward`, given
    this module's cache: the gradients in the key order of ``params`` and the dtype of the
    forward pass. Within rtol 1e-12, atol 1e-14 (float32: rtol 2e-5, atol 1e-6) of the spec."""
    where = _WHERE + "recurrent_actor_critic_backward"
    names = _spec.lstm_names(cache.lstm_shared)
    parts = _parts(params, names)
    dh_pi, pi_grads = _tower(where, _layers.mlp_backward, parts["pi"], cache.pi, d_policy_out)
    dh_vf, vf_grads = _tower(where, _layers.mlp_backward, parts["vf"], cache.vf,
                             np.asarray(d_values)[..., None])
    lstm_cache = cache.lstm
    dt = lstm_cache.x.dtype
    dh_seqs = (dh_pi + dh_vf,) if cache.lstm_shared else (dh_pi, dh_vf)
    w_ih, w_hh = zip(*[_lstm._weights(parts[name], dt, ("w_ih", "w_hh")) for name in names])
    state = (len(names),) + lstm_cache.h_prev.shape[2:]
    _, (g_w_ih, g_w_hh, g_b), _, _ = _lstm._run_backward(
        w_ih, w_hh, lstm_cache, tuple(np.ascontiguousarray(dh, dt) for dh in dh_seqs),
        np.zeros(state, dt), np.zeros(state, dt), False, where)
    grads = {}
    for l, name in enumerate(names):
        grads.update({f"{name}.w_ih": g_w_ih[l], f"{name}.w_hh": g_w_hh[l], f"{name}.b": g_b[l]})
    grads.update({f"pi.{k}": v for k, v in pi_grads.items()})
    grads.update({f"vf.{k}": v for k, v in vf_grads.items()})
    return {k: grads[k] for k in params}


def recurrent_actor_critic_step(params: Mapping[str, np.ndarray], obs, state, episode_starts,
                                activation: str = "tanh", lstm_shared: bool = False, *,
                                with_values: bool = True):
    """Twin of :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_step`:
    ``(policy_out [N, P], values [N] or None, new_state)``, the bits a replay of the steps by
    :func:`recurrent_actor_critic_forward` gives. Within rtol 1e-12, atol 1e-14 (float32: rtol
    1e-5, atol 1e-6) of the spec."""
    where = _WHERE + "recurrent_actor_critic_step"
    parts, h_new, c_new = _step(params, obs, state, episode_starts, lstm_shared, where)
    policy_out, _ = _tower(where, _layers.mlp_forward, parts["pi"], h_new[0], activation)
    values = None
    if with_values:
        values = _tower(where, _layers.mlp_forward, parts["vf"], h_new[-1], activation)[0][:, 0]
    return policy_out, values, _spec.LSTMStates(h_new, c_new)


def recurrent_value_step(params: Mapping[str, np.ndarray], obs, state, episode_starts,
                         activation: str = "tanh", lstm_shared: bool = False) -> np.ndarray:
    """Twin of :func:`ppo_ref.spec.recurrent_networks.recurrent_value_step`: the values ``[N]``
    (every LSTM steps, in the acting step's pass). Within rtol 1e-12, atol 1e-14 (float32: rtol
    1e-5, atol 1e-6) of the spec."""
    where = _WHERE + "recurrent_value_step"
    parts, h_new, _ = _step(params, obs, state, episode_starts, lstm_shared, where)
    return _tower(where, _layers.mlp_forward, parts["vf"], h_new[-1], activation)[0][:, 0]
