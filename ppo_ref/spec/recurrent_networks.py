"""The LSTM actor-critic: LSTM(s) over a sequence, then the policy and value towers.

Architecture (sb3-contrib ``RecurrentActorCriticPolicy``; CleanRL ``ppo_atari_lstm`` and
thrust-rl share one LSTM)::

    lstm_shared=False (sb3-contrib enable_critic_lstm=True)
        h^pi[t] = LSTM_pi(obs[t], h^pi[t-1])        policy_out[t] = MLP_pi(h^pi[t])    [P]
        h^vf[t] = LSTM_vf(obs[t], h^vf[t-1])        values[t]     = MLP_vf(h^vf[t])    [1]
    lstm_shared=True
        h[t] = LSTM(obs[t], h[t-1])      policy_out[t] = MLP_pi(h[t])      values[t] = MLP_vf(h[t])

with :mod:`ppo_ref.spec.lstm` (state reset at episode starts) and towers of
:func:`ppo_ref.spec.layers.mlp_forward`. Parameters: one dict of float64 arrays, keys
``lstm.w_ih, lstm.w_hh, lstm.b`` (shared) or ``lstm_pi.*`` and ``lstm_vf.*``, then ``pi.w0,
pi.b0, ...`` and ``vf.w0, ...``. Recurrent state: :class:`LSTMStates` ``(h, c)``, each
``[L, N, H]`` with ``L = 1`` (shared) or 2 (0 the actor's LSTM, 1 the critic's).
"""
from __future__ import annotations

from typing import Dict, Mapping, NamedTuple, Sequence, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, as_flag_array, check_count, check_finite_param,
                             check_same_shape)
from ppo_ref.spec.networks import actor_critic_init
from ppo_ref.spec.layers import MLPCache, mlp_backward, mlp_forward
from ppo_ref.spec.lstm import LSTMCache, lstm_backward, lstm_forward, lstm_init, lstm_step

__all__ = ["LSTMStates", "RecurrentActorCriticCache", "lstm_names",
           "recurrent_actor_critic_init", "initial_lstm_states",
           "recurrent_actor_critic_forward", "recurrent_actor_critic_backward",
           "recurrent_actor_critic_step", "recurrent_value_step"]

Params = Dict[str, np.ndarray]
LSTM_KEYS = ("w_ih", "w_hh", "b")


class LSTMStates(NamedTuple):
    """Recurrent state of every LSTM for N envs: hidden ``h`` and cell ``c``, float64
    ``[L, N, H]`` each (L = 1 shared, else 0 actor and 1 critic)."""
    h: np.ndarray
    c: np.ndarray

    def select(self, envs) -> "LSTMStates":
        """Copies of the states of the envs ``envs`` (indices into N): ``[L, len(envs), H]``."""
        return LSTMStates(self.h[:, envs].copy(), self.c[:, envs].copy())

    def copy(self) -> "LSTMStates":
        """A deep copy."""
        return LSTMStates(self.h.copy(), self.c.copy())


class RecurrentActorCriticCache(NamedTuple):
    """What :func:`recurrent_actor_critic_backward` reads: ``lstm_shared``, the
    :class:`~ppo_ref.spec.lstm.LSTMCache` of every LSTM (:func:`lstm_names` order), and the MLP
    caches of the two towers."""
    lstm_shared: bool
    lstm: Tuple[LSTMCache, ...]
    pi: MLPCache
    vf: MLPCache


def lstm_names(lstm_shared: bool) -> Tuple[str, ...]:
    """Key prefixes of the LSTMs, in state order: ``("lstm",)`` or ``("lstm_pi", "lstm_vf")``."""
    return ("lstm",) if lstm_shared else ("lstm_pi", "lstm_vf")


def _split(params, lstm_shared) -> Tuple[Tuple[str, ...], Dict[str, Params]]:
    """``(names, parts)``: the LSTM prefixes and ``parts[prefix]``, the sub-dict of each
    prefix (``lstm*``, ``pi``, ``vf``) without it. ``ValueError`` for a ``params`` that is not
    a dict, keys of the other layout or of no part, or a non-finite array (its full key)."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a dict of arrays, got {type(params).__name__}")
    if not isinstance(lstm_shared, (bool, np.bool_)):
        raise ValueError(f"lstm_shared must be a bool, got {lstm_shared!r}")
    names = lstm_names(bool(lstm_shared))
    other = lstm_names(not lstm_shared)[0] + ".w_ih"
    if other in params:
        raise ValueError(f"params has '{other}' but lstm_shared={bool(lstm_shared)}: "
                         f"they do not match")
    parts: Dict[str, Params] = {prefix: {} for prefix in names + ("pi", "vf")}
    unknown = []
    for key, value in params.items():
        prefix, _, rest = str(key).partition(".")
        if prefix in parts and rest:
            parts[prefix][rest] = value
        else:
            unknown.append(key)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            check_finite_param(value, key)  # named by its full key, not the part's
    if unknown:
        raise ValueError(f"params has keys outside {[p + '.*' for p in parts]}: {unknown}")
    for prefix, part in parts.items():
        if not part:
            raise ValueError(f"params has no '{prefix}.*' entries")
    return names, parts


def _hidden_size(parts: Dict[str, Params], names: Tuple[str, ...]) -> int:
    """The common width H of the LSTMs (``ValueError`` if they differ or are malformed)."""
    widths = set()
    for name in names:
        missing = [f"{name}.{k}" for k in LSTM_KEYS if k not in parts[name]]
        if missing:
            raise ValueError(f"params is missing {missing}")
        w_hh = as_float_array(parts[name].get("w_hh"), f"params['{name}.w_hh']", ndim=(2,))
        widths.add(w_hh.shape[1])
    if len(widths) != 1:
        raise ValueError(f"params: the LSTMs {list(names)} must have one width H, got "
                         f"{sorted(widths)}")
    return widths.pop()


def _policy_out_dim(pi: Params) -> int:
    """P, the rows of the policy tower's last weight."""
    last = f"w{sum(1 for k in pi if k.startswith('w')) - 1}"
    w = np.asarray(pi.get(last))
    if w.ndim != 2:
        raise ValueError(f"params['pi.{last}'] must be the policy tower's last weight [P, in], "
                         f"got {None if last not in pi else w.shape}")
    return w.shape[0]


def _check_obs(obs, ndim: int, parts: Dict[str, Params], names) -> np.ndarray:
    obs = as_float_array(obs, "obs", ndim=(ndim,)).astype(np.float64, copy=False)
    w_ih = as_float_array(parts[names[0]].get("w_ih"), f"params['{names[0]}.w_ih']", ndim=(2,))
    if obs.shape[-1] != w_ih.shape[1]:
        raise ValueError(f"obs must have {w_ih.shape[1]} features (params['{names[0]}.w_ih'] "
                         f"is [4H, D] = {list(w_ih.shape)}), got shape {obs.shape}")
    return obs


def _check_inputs(params, obs, state, lstm_shared, ndim: int):
    """The checked ``(names, parts, obs, h, c)`` of a forward (``ndim`` 3) or a step (2)."""
    names, parts = _split(params, lstm_shared)
    hidden = _hidden_size(parts, names)
    obs = _check_obs(obs, ndim, parts, names)
    h, c = _check_state(state, len(names), obs.shape[-2], hidden)
    return names, parts, obs, h, c


def _check_state(state, n_lstm: int, n_env: int, hidden: int) -> Tuple[np.ndarray, np.ndarray]:
    try:
        h, c = state
    except (TypeError, ValueError):
        raise ValueError(f"state must be a pair (h, c) (LSTMStates), got "
                         f"{type(state).__name__}") from None
    arrays = []
    for name, arr in (("state.h", h), ("state.c", c)):
        a = as_float_array(arr, name, ndim=(3,)).astype(np.float64, copy=False)
        check_same_shape(a, name, (n_lstm, n_env, hidden), "[L, N, H]")
        arrays.append(a)
    return arrays[0], arrays[1]


def recurrent_actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                                hidden_size: int = 64, lstm_shared: bool = False,
                                net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                                policy_gain: float = 0.01, value_gain: float = 1.0,
                                ortho_init: bool = True) -> Params:
    """Initial parameters, float64, in the module docstring's key order: each LSTM
    (:func:`~ppo_ref.spec.lstm.lstm_init` of ``obs_dim`` D inputs and ``hidden_size`` H units,
    actor first), then the separate towers of :func:`~ppo_ref.spec.networks.actor_critic_init`
    on input width H (``net_arch``, ``activation``, ``policy_gain``, ``value_gain``,
    ``ortho_init``: the LSTMs' too), all drawn from ``rng`` in that order. ``policy_out_dim``:
    P. Raises ``ValueError`` for bad sizes, activation or gains."""
    if not isinstance(lstm_shared, (bool, np.bool_)):
        raise ValueError(f"lstm_shared must be a bool, got {lstm_shared!r}")
    params: Params = {}
    for name in lstm_names(bool(lstm_shared)):
        for key, value in lstm_init(rng, obs_dim, hidden_size, ortho_init=ortho_init).items():
            params[f"{name}.{key}"] = value
    params.update(actor_critic_init(rng, hidden_size, policy_out_dim, net_arch=tuple(net_arch),
                                    activation=activation, shared_trunk=False,
                                    policy_gain=policy_gain, value_gain=value_gain,
                                    ortho_init=ortho_init))
    return params


def initial_lstm_states(params: Mapping[str, np.ndarray], n_envs: int,
                        lstm_shared: bool = False) -> LSTMStates:
    """All-zero :class:`LSTMStates` ``[L, n_envs, H]`` (before the first episode). Raises
    ``ValueError`` for ``params`` that do not match ``lstm_shared`` or are not finite, or
    ``n_envs`` not an int >= 1."""
    names, parts = _split(params, lstm_shared)
    n_envs = check_count(n_envs, "n_envs", 1)
    shape = (len(names), n_envs, _hidden_size(parts, names))
    return LSTMStates(np.zeros(shape), np.zeros(shape))


def recurrent_actor_critic_forward(params: Mapping[str, np.ndarray], obs, state,
                                   episode_starts, activation: str = "tanh",
                                   lstm_shared: bool = False):
    """Policy outputs and values over a stored ``[T, N]`` rollout, replayed from ``state``:
    each LSTM ``l`` runs :func:`~ppo_ref.spec.lstm.lstm_forward` from ``(state.h[l],
    state.c[l])``, then ``policy_out = MLP_pi(h^0_seq)``, ``values = MLP_vf(h^{L-1}_seq)``.

    ``obs``: finite ``[T, N, D]`` (flattened per step); ``state``: :class:`LSTMStates` (or a
    pair ``(h, c)``) ``[L, N, H]`` before step 0; ``episode_starts``: ``[T, N]`` bool or 0/1,
    True resets every LSTM before that step; ``activation``: the towers'; ``lstm_shared``: one
    LSTM (True) or an actor's and a critic's. Returns float64 ``(policy_out [T, N, P], values
    [T, N], final_state, cache)``: the :class:`LSTMStates` after step T-1 (unmasked) and a
    :class:`RecurrentActorCriticCache`. Raises ``ValueError`` naming the argument: malformed
    ``params`` or a layout that does not match ``lstm_shared``, bad ``obs``, ``state``,
    ``episode_starts`` or ``activation``.
    """
    names, parts, obs, h0, c0 = _check_inputs(params, obs, state, lstm_shared, 3)
    h_seqs, h_last, c_last, lstm_caches = [], [], [], []
    for l, name in enumerate(names):
        h_seq, (h_T, c_T), lstm_cache = lstm_forward(parts[name], obs, h0[l], c0[l],
                                                     episode_starts)
        h_seqs.append(h_seq)
        h_last.append(h_T)
        c_last.append(c_T)
        lstm_caches.append(lstm_cache)
    policy_out, pi_cache = mlp_forward(parts["pi"], h_seqs[0], activation)
    values, vf_cache = mlp_forward(parts["vf"], h_seqs[-1], activation)
    if values.shape[-1] != 1:
        raise ValueError(f"params: the value tower must have one output, got "
                         f"{values.shape[-1]}")
    cache = RecurrentActorCriticCache(bool(lstm_shared), tuple(lstm_caches), pi_cache, vf_cache)
    return policy_out, values[..., 0], LSTMStates(np.stack(h_last), np.stack(c_last)), cache


def recurrent_actor_critic_backward(params: Mapping[str, np.ndarray],
                                    cache: RecurrentActorCriticCache, d_policy_out, d_values
                                    ) -> Params:
    """Gradients of a scalar loss in every parameter, from ``d_policy_out [T, N, P]`` and
    ``d_values [T, N]``: the towers' MLP backward gives ``dh^pi_seq`` and ``dh^vf_seq`` (summed
    for a shared LSTM), then :func:`~ppo_ref.spec.lstm.lstm_backward` over all T steps (the
    gradient stops only at episode starts; the initial state is data, no gradient).

    Returns float64 ``grads`` with the keys (and key order) of ``params``. Raises
    ``ValueError`` naming the argument: a cache that is not a
    :class:`RecurrentActorCriticCache` or does not match ``params``, or bad gradients.
    """
    if not isinstance(cache, RecurrentActorCriticCache):
        raise ValueError(f"cache must be the RecurrentActorCriticCache returned by "
                         f"recurrent_actor_critic_forward, got {type(cache).__name__}")
    names, parts = _split(params, cache.lstm_shared)
    n_steps, n_env = cache.lstm[0].x.shape[:2]
    n_out = (_policy_out_dim(parts["pi"]),)
    d_policy_out = as_float_array(d_policy_out, "d_policy_out", ndim=(3,)).astype(np.float64,
                                                                                 copy=False)
    check_same_shape(d_policy_out, "d_policy_out", (n_steps, n_env) + n_out,
                     "policy_out [T, N, P]")
    d_values = as_float_array(d_values, "d_values", ndim=(2,)).astype(np.float64, copy=False)
    check_same_shape(d_values, "d_values", (n_steps, n_env), "values [T, N]")
    dh_pi, pi_grads = mlp_backward(parts["pi"], cache.pi, d_policy_out)
    dh_vf, vf_grads = mlp_backward(parts["vf"], cache.vf, d_values[..., None])
    dh_seqs = (dh_pi + dh_vf,) if cache.lstm_shared else (dh_pi, dh_vf)
    grads: Params = {}
    for name, lstm_cache, dh_seq in zip(names, cache.lstm, dh_seqs):
        _, lstm_grads, _ = lstm_backward(parts[name], lstm_cache, dh_seq)
        grads.update({f"{name}.{k}": v for k, v in lstm_grads.items()})
    grads.update({f"pi.{k}": v for k, v in pi_grads.items()})
    grads.update({f"vf.{k}": v for k, v in vf_grads.items()})
    return {k: grads[k] for k in params}


def recurrent_actor_critic_step(params: Mapping[str, np.ndarray], obs, state, episode_starts,
                                activation: str = "tanh", lstm_shared: bool = False, *,
                                with_values: bool = True):
    """One step of :func:`recurrent_actor_critic_forward` for acting, without a cache: every
    LSTM is stepped (:func:`~ppo_ref.spec.lstm.lstm_step`), then the towers. ``obs [N, D]``,
    ``state [L, N, H]`` before the step, ``episode_starts [N]``; ``with_values=False`` skips
    the value tower (``values`` None). Returns float64 ``(policy_out [N, P], values [N],
    new_state)``; raises ``ValueError`` as :func:`recurrent_actor_critic_forward`.
    """
    names, parts, obs, h, c = _check_inputs(params, obs, state, lstm_shared, 2)
    starts = as_flag_array(episode_starts, "episode_starts", ndim=(1,))
    stepped = [lstm_step(parts[name], obs, h[l], c[l], starts) for l, name in enumerate(names)]
    policy_out, _ = mlp_forward(parts["pi"], stepped[0][0], activation)
    values = None
    if with_values:
        values = mlp_forward(parts["vf"], stepped[-1][0], activation)[0][:, 0]
    new_state = LSTMStates(np.stack([s[0] for s in stepped]), np.stack([s[1] for s in stepped]))
    return policy_out, values, new_state


def recurrent_value_step(params: Mapping[str, np.ndarray], obs, state, episode_starts,
                         activation: str = "tanh", lstm_shared: bool = False) -> np.ndarray:
    """Values ``[N]`` after one step of the critic's LSTM only, the state not returned (for
    bootstrapping); arguments and errors as :func:`recurrent_actor_critic_step`."""
    names, parts, obs, h, c = _check_inputs(params, obs, state, lstm_shared, 2)
    h_new, _ = lstm_step(parts[names[-1]], obs, h[-1], c[-1], episode_starts)
    values, _ = mlp_forward(parts["vf"], h_new, activation)
    return values[:, 0]
