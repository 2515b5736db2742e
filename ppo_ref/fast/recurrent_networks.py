"""The compiled tier of the LSTM actor-critic: the twins of
:mod:`ppo_ref.spec.recurrent_networks`' ``recurrent_actor_critic_forward``,
``recurrent_actor_critic_backward``, ``recurrent_actor_critic_step`` and
``recurrent_value_step`` (same parameters, same results; the architecture is stated there).

They take the spec's parameters (one dict: ``lstm.*`` or ``lstm_pi.*`` and ``lstm_vf.*``, then
the towers ``pi.*`` and ``vf.*``) and states (:class:`ppo_ref.spec.recurrent_networks.LSTMStates`
``[L, N, H]``), and compose this tier's LSTM (the passes of :mod:`ppo_ref.fast.lstm`, which run
the spec's own recursions) with its MLP (:func:`ppo_ref.fast.layers.mlp_forward` and
``mlp_backward``). Every product is a chain of fused multiply-adds in a fixed order, so an
env's results do not depend on which other envs share the call: an acting step of N envs, the
replay of their T steps and a minibatch of any subset of them give each env the same bits.

dtype: when the observations, the state and every parameter are float32, everything computes
in float32 and the results are float32; otherwise float64. The backward pass computes in the
dtype of the forward pass that made the cache. A non-finite result raises
``FloatingPointError`` (:func:`ppo_ref._checks.non_finite_result`); arguments are not validated
here (the spec functions do that, and name the bad one).
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
_LSTM_KEYS = ("w_ih", "w_hh", "b")


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


def _tower(part: dict, x, activation: str, where: str):
    """:func:`ppo_ref.fast.layers.mlp_forward`, its non-finite result reported as ``where``'s."""
    try:
        return _layers.mlp_forward(part, x, activation)
    except FloatingPointError:
        raise non_finite_result(where) from None


def _tower_backward(part: dict, cache, dy, where: str):
    """:func:`ppo_ref.fast.layers.mlp_backward`, its non-finite result reported as ``where``'s."""
    try:
        return _layers.mlp_backward(part, cache, dy)
    except FloatingPointError:
        raise non_finite_result(where) from None


def _lstm_steps(parts, names, x, h0, c0, episode_starts, dt, where: str):
    """Every LSTM of ``names`` over ``x [T, N, D]`` (compute dtype, C-contiguous) from the
    states ``h0, c0 [L, N, H]``, in one pass: :func:`ppo_ref.fast.lstm._run_forward`'s
    ``(h_seq [L, T, N, H], c_T [L, N, H], cache)``."""
    keep = _lstm._keep(episode_starts, x.shape[0], x.shape[1], dt)
    return _lstm._run_forward([_lstm._weights(parts[name], dt) for name in names], x,
                              np.ascontiguousarray(h0, dt), np.ascontiguousarray(c0, dt), keep,
                              where)


def _inputs(parts, obs, state):
    """``(x, h0, c0, dt)``: the arrays of ``obs`` and ``state`` and the compute dtype."""
    h0, c0 = state
    obs, h0, c0 = np.asarray(obs), np.asarray(h0), np.asarray(c0)
    dt = _compute_dtype(parts, obs, h0, c0)
    return np.ascontiguousarray(obs, dt), h0, c0, dt


def recurrent_actor_critic_forward(params: Mapping[str, np.ndarray], obs, state,
                                   episode_starts, activation: str = "tanh",
                                   lstm_shared: bool = False):
    """Policy outputs and values over a ``[T, N]`` sequence, replayed from ``state``: the twin
    of :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_forward` (arguments and
    results there).

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 1e-5, atol 1e-6).

    Returns ``(policy_out [T, N, P], values [T, N], final_state, cache)`` in the compute dtype;
    ``final_state`` an ``LSTMStates``; ``cache`` this module's own, for
    :func:`recurrent_actor_critic_backward`.
    """
    where = _WHERE + "recurrent_actor_critic_forward"
    names = _spec.lstm_names(bool(lstm_shared))
    parts = _parts(params, names)
    x, h0, c0, dt = _inputs(parts, obs, state)
    h_seq, c_T, lstm_cache = _lstm_steps(parts, names, x, h0, c0, episode_starts, dt, where)
    policy_out, pi_cache = _tower(parts["pi"], h_seq[0], activation, where)
    values, vf_cache = _tower(parts["vf"], h_seq[-1], activation, where)
    final = _spec.LSTMStates(h_seq[:, -1].copy(), c_T.copy())
    cache = _Cache(bool(lstm_shared), lstm_cache, pi_cache, vf_cache)
    return policy_out, values[..., 0], final, cache


def recurrent_actor_critic_backward(params: Mapping[str, np.ndarray], cache, d_policy_out,
                                    d_values):
    """Gradients of a scalar loss w.r.t. every parameter, by backpropagation through time: the
    twin of :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_backward` (arguments
    and results there), given this module's cache.

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 2e-5, atol 1e-6).

    Returns a dict with the keys (and key order) of ``params``, in the dtype of the forward
    pass.
    """
    where = _WHERE + "recurrent_actor_critic_backward"
    names = _spec.lstm_names(cache.lstm_shared)
    parts = _parts(params, names)
    dh_pi, pi_grads = _tower_backward(parts["pi"], cache.pi, d_policy_out, where)
    dh_vf, vf_grads = _tower_backward(parts["vf"], cache.vf, np.asarray(d_values)[..., None],
                                      where)
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
    """One acting step for N envs: the twin of
    :func:`ppo_ref.spec.recurrent_networks.recurrent_actor_critic_step` (arguments and results
    there); the passes of :func:`recurrent_actor_critic_forward` with T = 1, so an env's
    outputs and states are the bits a replay of its steps gives.

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 1e-5, atol 1e-6).

    Returns ``(policy_out [N, P], values [N] or None, new_state)`` in the compute dtype.
    """
    where = _WHERE + "recurrent_actor_critic_step"
    names = _spec.lstm_names(bool(lstm_shared))
    parts = _parts(params, names)
    x, h, c, dt = _inputs(parts, obs, state)
    h_new, c_new = _lstm._step([_lstm._weights(parts[name], dt) for name in names], x, h, c,
                               episode_starts, where)
    policy_out, _ = _tower(parts["pi"], h_new[0], activation, where)
    values = None
    if with_values:
        values = _tower(parts["vf"], h_new[-1], activation, where)[0][:, 0]
    return policy_out, values, _spec.LSTMStates(h_new, c_new)


def recurrent_value_step(params: Mapping[str, np.ndarray], obs, state, episode_starts,
                         activation: str = "tanh", lstm_shared: bool = False) -> np.ndarray:
    """Values ``[N]`` after one step of the critic's LSTM (the state is not returned): the twin
    of :func:`ppo_ref.spec.recurrent_networks.recurrent_value_step` (arguments there). Every
    LSTM of ``params`` steps, in the acting step's compiled pass; the critic's gives the values.

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 1e-5, atol 1e-6).
    """
    where = _WHERE + "recurrent_value_step"
    names = _spec.lstm_names(bool(lstm_shared))
    parts = _parts(params, names)
    x, h, c, dt = _inputs(parts, obs, state)
    # every LSTM steps (the critic's is the last), so this is the acting step's compiled pass
    h_new, _ = _lstm._step([_lstm._weights(parts[name], dt) for name in names], x, h, c,
                           episode_starts, where)
    values, _ = _tower(parts["vf"], h_new[-1], activation, where)
    return values[:, 0]
