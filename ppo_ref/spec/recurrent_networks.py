"""The LSTM actor-critic, readable: LSTM(s) over a sequence, then the policy and value towers.

Architecture (sb3-contrib ``RecurrentActorCriticPolicy``; CleanRL ``ppo_atari_lstm`` and
thrust-rl share one LSTM)::

    lstm_shared=False (sb3-contrib enable_critic_lstm=True)
        h^pi[t] = LSTM_pi(obs[t], h^pi[t-1])        policy_out[t] = MLP_pi(h^pi[t])    [P]
        h^vf[t] = LSTM_vf(obs[t], h^vf[t-1])        values[t]     = MLP_vf(h^vf[t])    [1]
    lstm_shared=True
        h[t] = LSTM(obs[t], h[t-1])      policy_out[t] = MLP_pi(h[t])      values[t] = MLP_vf(h[t])

Every LSTM is :mod:`ppo_ref.spec.lstm` (gate order i, f, g, o as ``torch.nn.LSTM``; the carried
state multiplied by ``1 - episode_starts[t]`` before step ``t``, so no episode sees its
predecessor's memory and no gradient crosses the boundary). The towers are MLPs on the LSTM
output (hidden layers with ``activation``, linear output; ``net_arch=()`` gives linear heads).

Parameters: one dict of float64 arrays with the keys ``lstm.w_ih, lstm.w_hh, lstm.b`` (shared)
or ``lstm_pi.*`` and ``lstm_vf.*`` (separate), then ``pi.w0, pi.b0, ...`` and
``vf.w0, vf.b0, ...`` (the network part of :class:`ppo_ref.train.policies.RecurrentPolicy`'s
parameters; any mapping is read as the dict it is). Recurrent state: a pair
``(h, c)`` (:class:`LSTMStates`), each ``[L, N, H]`` with ``L = 1`` (shared) or ``L = 2``
(index 0 the actor's LSTM, 1 the critic's).

Training replays a stored ``[T, N]`` rollout: from the state each env had before step 0, with
the stored episode starts, over all T steps (:func:`recurrent_actor_critic_forward`), and
backpropagates through all of them (:func:`recurrent_actor_critic_backward`; BPTT stops only
at episode starts; the initial state is data, so it gets no gradient). Acting runs the same
step one ``t`` at a time (:func:`recurrent_actor_critic_step`, :func:`recurrent_value_step`).
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
    """Recurrent state of every LSTM of the network for N envs.

    Attributes:
        h: hidden states, float64 ``[L, N, H]`` (L = 1 shared, else 0 actor and 1 critic).
        c: cell states, same shape.
    """
    h: np.ndarray
    c: np.ndarray

    def select(self, envs) -> "LSTMStates":
        """The states of the envs ``envs`` (an index array into N), ``[L, len(envs), H]`` copies."""
        return LSTMStates(self.h[:, envs].copy(), self.c[:, envs].copy())

    def copy(self) -> "LSTMStates":
        """A deep copy."""
        return LSTMStates(self.h.copy(), self.c.copy())


class RecurrentActorCriticCache(NamedTuple):
    """What :func:`recurrent_actor_critic_backward` reads.

    Attributes:
        lstm_shared: whether one LSTM feeds both towers.
        lstm: the :class:`~ppo_ref.spec.lstm.LSTMCache` of every LSTM (:func:`lstm_names` order).
        pi, vf: the MLP caches of the policy and value towers.
    """
    lstm_shared: bool
    lstm: Tuple[LSTMCache, ...]
    pi: MLPCache
    vf: MLPCache


def lstm_names(lstm_shared: bool) -> Tuple[str, ...]:
    """Key prefixes of the LSTMs, in state order: ``("lstm",)`` or ``("lstm_pi", "lstm_vf")``."""
    return ("lstm",) if lstm_shared else ("lstm_pi", "lstm_vf")


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------

def _split(params, lstm_shared) -> Tuple[Tuple[str, ...], Dict[str, Params]]:
    """``(names, parts)``: the LSTM prefixes and ``parts[prefix]`` = the sub-dict of every
    prefix (``lstm*``, ``pi``, ``vf``) with the prefix stripped. ``ValueError`` for a
    ``params`` that is not a dict, keys of the other LSTM layout, keys of no part, or a
    float array holding NaN or inf (named by its full key)."""
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
    """P, the output width of the policy tower ``pi.w0 .. pi.w{L-1}``: rows of its last weight."""
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


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def recurrent_actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                                hidden_size: int = 64, lstm_shared: bool = False,
                                net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                                policy_gain: float = 0.01, value_gain: float = 1.0) -> Params:
    """Initial parameters (dict of float64 arrays, key order as the module docstring).

    Draws from ``rng`` in this order: each LSTM (:func:`~ppo_ref.spec.lstm.lstm_init`, actor
    first), then the towers on input width H (separate ``pi``/``vf`` MLPs: orthogonal, gain
    sqrt(2) hidden, ``policy_gain`` / ``value_gain`` heads, zero biases). Both backends'
    recurrent policies draw their parameters with this function.

    Args:
        rng: ``np.random.Generator``.
        obs_dim: D, observation size (>= 1).
        policy_out_dim: P, logits (discrete) or action dimension (Gaussian mean).
        hidden_size: H, LSTM width.
        lstm_shared: one LSTM for both towers (True) or one each (False).
        net_arch, activation, policy_gain, value_gain: the towers.

    Raises:
        ValueError: bad sizes, activation or gains.
    """
    if not isinstance(lstm_shared, (bool, np.bool_)):
        raise ValueError(f"lstm_shared must be a bool, got {lstm_shared!r}")
    params: Params = {}
    for name in lstm_names(bool(lstm_shared)):
        for key, value in lstm_init(rng, obs_dim, hidden_size).items():
            params[f"{name}.{key}"] = value
    params.update(actor_critic_init(rng, hidden_size, policy_out_dim, net_arch=tuple(net_arch),
                                    activation=activation, shared_trunk=False,
                                    policy_gain=policy_gain, value_gain=value_gain))
    return params


def initial_lstm_states(params: Mapping[str, np.ndarray], n_envs: int,
                        lstm_shared: bool = False) -> LSTMStates:
    """All-zero :class:`LSTMStates` ``[L, n_envs, H]`` (the state before the first episode).

    Raises:
        ValueError: ``params`` that do not match ``lstm_shared`` or hold NaN or inf,
            ``n_envs`` not an integer >= 1 (a bool, float or string is refused).
    """
    names, parts = _split(params, lstm_shared)
    n_envs = check_count(n_envs, "n_envs", 1)
    shape = (len(names), n_envs, _hidden_size(parts, names))
    return LSTMStates(np.zeros(shape), np.zeros(shape))


def recurrent_actor_critic_forward(params: Mapping[str, np.ndarray], obs, state,
                                   episode_starts, activation: str = "tanh",
                                   lstm_shared: bool = False):
    """Policy outputs and values over a ``[T, N]`` sequence, replayed from ``state``.

    For each LSTM ``l``: ``h^l_seq, (h^l_T, c^l_T) = lstm_forward(params_l, obs, state.h[l],
    state.c[l], episode_starts)``; then ``policy_out = MLP_pi(h^0_seq)`` and
    ``values = MLP_vf(h^{L-1}_seq)[..., 0]``.

    Args:
        params: the network's parameters (module docstring) for this ``lstm_shared``.
        obs: ``[T, N, D]`` observations (flattened per step), finite.
        state: :class:`LSTMStates` (or any pair ``(h, c)``) ``[L, N, H]``: the state *before*
            step 0.
        episode_starts: ``[T, N]`` bool or 0/1; True at t resets every LSTM before step t.
        activation: the towers' hidden activation, ``"tanh"`` or ``"relu"``.
        lstm_shared: one LSTM (True) or an actor and a critic LSTM (False).

    Returns:
        ``(policy_out [T, N, P], values [T, N], final_state, cache)``, float64;
        ``final_state`` the :class:`LSTMStates` after step T-1 (unmasked); ``cache`` a
        :class:`RecurrentActorCriticCache`.

    Raises:
        ValueError: naming the argument: malformed ``params`` or ones that do not match
            ``lstm_shared``, wrong shapes or non-finite ``obs`` / ``state``, bad
            ``episode_starts`` or ``activation``.
    """
    names, parts = _split(params, lstm_shared)
    hidden = _hidden_size(parts, names)
    obs = _check_obs(obs, 3, parts, names)
    h0, c0 = _check_state(state, len(names), obs.shape[1], hidden)
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
    """Gradients of a scalar loss w.r.t. every parameter, by backpropagation through time.

    ``dh^pi_seq`` from the policy tower (MLP backward of ``d_policy_out``) and ``dh^vf_seq``
    from the value tower (of ``d_values``), summed when the LSTM is shared; then each LSTM's
    ``lstm_backward`` over all T steps (no truncation: the gradient stops only at episode
    starts). The initial state is data: its gradient is not returned.

    Args:
        params: as given to :func:`recurrent_actor_critic_forward`.
        cache: the cache it returned.
        d_policy_out: ``[T, N, P]`` gradient w.r.t. ``policy_out``.
        d_values: ``[T, N]`` gradient w.r.t. ``values``.

    Returns:
        grads: dict with the keys (and key order) of ``params``, float64.

    Raises:
        ValueError: naming the argument: a cache that is not a
            :class:`RecurrentActorCriticCache` or does not match ``params``, gradients of the
            wrong shape or not finite.
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
    """One acting step for N envs: every LSTM's ``lstm_step``, then the towers.

    What :func:`recurrent_actor_critic_forward` computes at one time step (same reset rule),
    without a cache; every LSTM is stepped (the critic's state is carried too).

    Args:
        obs: ``[N, D]``; state: :class:`LSTMStates` ``[L, N, H]`` before this step;
        episode_starts: ``[N]`` bool or 0/1 (True: reset that env's state first);
        with_values: False skips the value tower (``values`` is then None); the others as
        :func:`recurrent_actor_critic_forward`.

    Returns:
        ``(policy_out [N, P], values [N] or None, new_state)``, float64.

    Raises:
        ValueError: naming the argument, as :func:`recurrent_actor_critic_forward`.
    """
    names, parts = _split(params, lstm_shared)
    hidden = _hidden_size(parts, names)
    obs = _check_obs(obs, 2, parts, names)
    h, c = _check_state(state, len(names), obs.shape[0], hidden)
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
    """Values ``V(obs | state)`` ``[N]`` after one step of the critic's LSTM only; the state is
    not returned (bootstrapping ``last_values`` / ``final_values`` without advancing it).

    Arguments and errors as :func:`recurrent_actor_critic_step`.
    """
    names, parts = _split(params, lstm_shared)
    hidden = _hidden_size(parts, names)
    obs = _check_obs(obs, 2, parts, names)
    h, c = _check_state(state, len(names), obs.shape[0], hidden)
    h_new, _ = lstm_step(parts[names[-1]], obs, h[-1], c[-1], episode_starts)
    values, _ = mlp_forward(parts["vf"], h_new, activation)
    return values[:, 0]
