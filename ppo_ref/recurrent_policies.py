"""The LSTM actor-critic: observations -> LSTM -> MLP towers -> policy output and value.

Architecture (sb3-contrib ``RecurrentActorCriticPolicy`` layout; CleanRL / thrust-rl share one
LSTM)::

    lstm_shared=False (default, sb3-contrib ``enable_critic_lstm=True``)
        actor:  obs_t -> LSTM_pi(H) -> h^pi_t -> MLP_pi(net_arch) -> policy_out_t  [P]
        critic: obs_t -> LSTM_vf(H) -> h^vf_t -> MLP_vf(net_arch) -> value_t       [1]
    lstm_shared=True (CleanRL ``ppo_atari_lstm.py``, thrust-rl)
        obs_t -> LSTM(H) -> h_t -> MLP_pi -> policy_out_t ;  h_t -> MLP_vf -> value_t

``MLP_pi`` / ``MLP_vf`` are the towers of :func:`ppo_ref.nn.actor_critic.actor_critic_init`
built on input width H (hidden layers ``net_arch`` with ``activation``, linear output; gains
sqrt(2) hidden, ``policy_gain`` / ``value_gain`` heads); ``net_arch=()`` gives linear heads
directly on the LSTM output. The LSTM is :mod:`ppo_ref.nn.lstm` (gate order i, f, g, o as
``torch.nn.LSTM``; orthogonal weights, zero bias). Before step t every LSTM multiplies its
carried state by ``1 - episode_starts[t]`` (SPEC §3), so an episode never sees its
predecessor's memory, in acting and in training alike, and no gradient crosses the boundary.

``policy_out`` is read by the distribution heads of :mod:`ppo_ref.policies` (categorical logits
or the Gaussian mean); this module is only the network.

Parameters: one flat dict of float64 arrays. Keys: ``lstm.w_ih, lstm.w_hh, lstm.b`` (shared) or
``lstm_pi.*`` and ``lstm_vf.*`` (separate), then ``pi.w0, pi.b0, ...`` and ``vf.w0, ...``.

Recurrent state: :class:`LSTMStates` ``(h, c)``, each ``[L, N, H]`` float64 with ``L = 1``
(shared) or ``L = 2`` (index 0 actor, index 1 critic), N = number of envs.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence, Tuple

import numpy as np

from ppo_ref._checks import as_flag_array
from ppo_ref.flat import FlatArrays, FlatLayout, flatten_arrays, is_flat
from ppo_ref.nn.actor_critic import actor_critic_init
from ppo_ref.nn.lstm import lstm_backward, lstm_forward, lstm_init, lstm_step
from ppo_ref.nn.mlp import MLPCache, mlp_backward, mlp_forward
from ppo_ref.policies import PolicyBase, PolicyEval

__all__ = ["LSTMStates", "RecurrentActorCriticCache", "recurrent_actor_critic_init",
           "initial_lstm_states", "lstm_names", "recurrent_actor_critic_forward",
           "recurrent_actor_critic_backward", "recurrent_actor_critic_step",
           "recurrent_value_step", "RecurrentPolicy"]

Params = dict


class LSTMStates(NamedTuple):
    """Recurrent state of every LSTM of the policy for N envs.

    Attributes:
        h: hidden states, float64 ``[L, N, H]``; ``L = 1`` with a shared LSTM, else 2
            (0 = actor LSTM, 1 = critic LSTM).
        c: cell states, same shape.
    """
    h: np.ndarray
    c: np.ndarray

    def select(self, envs) -> "LSTMStates":
        """The states of the envs ``envs`` (an index array into N): ``[L, len(envs), H]`` copies."""
        return LSTMStates(self.h[:, envs].copy(), self.c[:, envs].copy())

    def copy(self) -> "LSTMStates":
        """A deep copy (so later steps never alias a stored state)."""
        return LSTMStates(self.h.copy(), self.c.copy())


class RecurrentActorCriticCache(NamedTuple):
    """What :func:`recurrent_actor_critic_backward` needs.

    Attributes:
        lstm_shared: whether one LSTM feeds both towers.
        lstm: the ``lstm_forward`` caches, one per LSTM (in :func:`lstm_names` order).
        pi, vf: the :class:`~ppo_ref.nn.mlp.MLPCache` of the policy and value towers.
    """
    lstm_shared: bool
    lstm: Tuple
    pi: MLPCache
    vf: MLPCache


def lstm_names(lstm_shared: bool) -> Tuple[str, ...]:
    """Key prefixes of the LSTMs, in state order: ``("lstm",)`` or ``("lstm_pi", "lstm_vf")``."""
    return ("lstm",) if lstm_shared else ("lstm_pi", "lstm_vf")


def _sub(params: Mapping[str, np.ndarray], prefix: str) -> dict:
    """The entries of ``params`` under ``prefix + "."`` with the prefix stripped."""
    p = prefix + "."
    n = len(p)
    out = {k[n:]: v for k, v in params.items() if k.startswith(p)}
    if not out:
        raise ValueError(f"params has no '{p}*' entries (lstm_shared does not match the params?)")
    return out


def _check_lstm_shared(params: Mapping, lstm_shared: bool) -> None:
    other = lstm_names(not lstm_shared)[0] + ".w_ih"
    if other in params:
        raise ValueError(f"params has '{other}' but lstm_shared={lstm_shared}: they do not match")


def recurrent_actor_critic_init(rng: np.random.Generator, obs_dim: int, policy_out_dim: int, *,
                                hidden_size: int = 64, lstm_shared: bool = False,
                                net_arch: Sequence[int] = (64, 64), activation: str = "tanh",
                                policy_gain: float = 0.01, value_gain: float = 1.0) -> Params:
    """Initial parameters of the LSTM actor-critic (flat dict of float64 arrays).

    Draw order from ``rng``: the LSTM(s) (actor first), then the towers as
    ``actor_critic_init(rng, hidden_size, policy_out_dim, net_arch=..., shared_trunk=False)``.

    Args:
        rng: ``np.random.Generator``.
        obs_dim: D, observation size (> 0).
        policy_out_dim: P, logits (discrete) or action dimension (Gaussian mean).
        hidden_size: H, LSTM width (default 64, the ``lstm_hidden_size`` of PPOConfig).
        lstm_shared: one LSTM for both towers (True) or one each (False, default).
        net_arch, activation, policy_gain, value_gain: the towers after the LSTM (see
            :func:`~ppo_ref.nn.actor_critic.actor_critic_init`).

    Raises:
        ValueError: bad sizes, activation or gains (from the layer initialisers).
    """
    params: Params = {}
    for name in lstm_names(bool(lstm_shared)):
        for k, v in lstm_init(rng, obs_dim, hidden_size).items():
            params[f"{name}.{k}"] = v
    params.update(actor_critic_init(rng, hidden_size, policy_out_dim, net_arch=tuple(net_arch),
                                    activation=activation, shared_trunk=False,
                                    policy_gain=policy_gain, value_gain=value_gain))
    return params


def initial_lstm_states(params: Mapping[str, np.ndarray], n_envs: int,
                        lstm_shared: bool = False) -> LSTMStates:
    """All-zero :class:`LSTMStates` for ``n_envs`` envs (the state before the very first reset)."""
    _check_lstm_shared(params, lstm_shared)
    names = lstm_names(lstm_shared)
    hidden = _sub(params, names[0])["w_hh"].shape[1]
    shape = (len(names), int(n_envs), hidden)
    return LSTMStates(np.zeros(shape), np.zeros(shape))


def _check_states(state: LSTMStates, n_lstm: int, n_envs: int, hidden: int) -> None:
    if not isinstance(state, LSTMStates):
        raise ValueError(f"state must be LSTMStates, got {type(state).__name__}")
    want = (n_lstm, n_envs, hidden)
    for name, arr in (("state.h", state.h), ("state.c", state.c)):
        if arr.shape != want:
            raise ValueError(f"{name} must have shape [L, N, H] = {want}, got {arr.shape}")


def recurrent_actor_critic_forward(params: Mapping[str, np.ndarray], obs, state: LSTMStates,
                                   episode_starts, activation: str = "tanh",
                                   lstm_shared: bool = False):
    """Policy outputs and values over a whole sequence, replayed from ``state``.

    For each LSTM ``l``: ``h^l_seq = lstm_forward(params_l, obs, state.h[l], state.c[l],
    episode_starts)``; then ``policy_out = MLP_pi(h^0_seq)`` and
    ``values = MLP_vf(h^{L-1}_seq)[..., 0]``.

    Args:
        params: from :func:`recurrent_actor_critic_init` with the same ``lstm_shared``.
        obs: ``[T, N, D]`` float (float64 is used as is).
        state: :class:`LSTMStates` ``[L, N, H]``, the state *before* step 0.
        episode_starts: ``[T, N]`` bool or 0/1; True at t resets every LSTM before step t.
        activation: the towers' hidden activation.
        lstm_shared: must match ``params``.

    Returns:
        ``(policy_out [T, N, P], values [T, N], final_state, cache)``: float64;
        ``final_state`` the :class:`LSTMStates` after step T-1; ``cache`` a
        :class:`RecurrentActorCriticCache`.

    Raises:
        ValueError: shapes that do not match, params that do not match ``lstm_shared``.
    """
    _check_lstm_shared(params, lstm_shared)
    names = lstm_names(lstm_shared)
    obs = np.asarray(obs)
    if obs.ndim != 3:
        raise ValueError(f"obs must have shape [T, N, D], got {obs.shape}")
    T, N = obs.shape[:2]
    hidden = _sub(params, names[0])["w_hh"].shape[1]
    _check_states(state, len(names), N, hidden)
    h_seqs, h_last, c_last, caches = [], [], [], []
    for l, name in enumerate(names):
        h_seq, (h_T, c_T), cache = lstm_forward(_sub(params, name), obs, state.h[l], state.c[l],
                                                episode_starts)
        h_seqs.append(h_seq)
        h_last.append(h_T)
        c_last.append(c_T)
        caches.append(cache)
    policy_out, pi_cache = mlp_forward(_sub(params, "pi"), h_seqs[0], activation)
    values, vf_cache = mlp_forward(_sub(params, "vf"), h_seqs[-1], activation)
    final_state = LSTMStates(np.stack(h_last), np.stack(c_last))
    cache = RecurrentActorCriticCache(bool(lstm_shared), tuple(caches), pi_cache, vf_cache)
    return policy_out, values[..., 0], final_state, cache


def recurrent_actor_critic_backward(params: Mapping[str, np.ndarray],
                                    cache: RecurrentActorCriticCache, d_policy_out, d_values
                                    ) -> Params:
    """Gradients of a scalar loss w.r.t. every parameter, by backpropagation through time.

    ``dL/dh^pi_seq`` comes from the policy tower (``mlp_backward``), ``dL/dh^vf_seq`` from the
    value tower; with a shared LSTM the two are summed. Each LSTM then runs ``lstm_backward``
    over the whole sequence (no truncation of BPTT: the gradient flows from step T-1 back to
    step 0, stopping only where ``episode_starts`` reset the state). The initial state is data
    (stored at collection), so its gradient is dropped.

    Args:
        params: as given to :func:`recurrent_actor_critic_forward`.
        cache: the cache it returned.
        d_policy_out: ``[T, N, P]``; d_values: ``[T, N]``.

    Returns:
        grads: dict with the keys (and key order) of ``params``, float64.

    Raises:
        ValueError: a malformed cache or gradients of the wrong shape.
    """
    if not isinstance(cache, RecurrentActorCriticCache):
        raise ValueError(f"cache must be a RecurrentActorCriticCache, got {type(cache).__name__}")
    names = lstm_names(cache.lstm_shared)
    grads: Params = {}
    dh_pi, g_pi = mlp_backward(_sub(params, "pi"), cache.pi, d_policy_out)
    d_values = np.asarray(d_values, dtype=np.float64)
    dh_vf, g_vf = mlp_backward(_sub(params, "vf"), cache.vf, d_values[..., None])
    if cache.lstm_shared:
        dh_pi += dh_vf
        dh_list = (dh_pi,)
    else:
        dh_list = (dh_pi, dh_vf)
    for name, lstm_cache, dh_seq in zip(names, cache.lstm, dh_list):
        _, g_lstm, _ = lstm_backward(_sub(params, name), lstm_cache, dh_seq)
        grads.update({f"{name}.{k}": v for k, v in g_lstm.items()})
    grads.update({"pi." + k: v for k, v in g_pi.items()})
    grads.update({"vf." + k: v for k, v in g_vf.items()})
    return {k: grads[k] for k in params}


def recurrent_actor_critic_step(params: Mapping[str, np.ndarray], obs, state: LSTMStates,
                                episode_starts, activation: str = "tanh",
                                lstm_shared: bool = False, *, with_values: bool = True):
    """One acting step for N envs: ``lstm_step`` each LSTM, then the towers.

    Computes what :func:`recurrent_actor_critic_forward` computes at one time step (same
    reset rule), without a cache. Every LSTM is stepped (the critic's state is carried too).

    Args:
        obs: ``[N, D]``; state: :class:`LSTMStates` ``[L, N, H]`` before this step;
        episode_starts: ``[N]`` bool or 0/1 (True: reset that env's state first).
        with_values: False skips the value tower (``values`` is then ``None``).

    Returns:
        ``(policy_out [N, P], values [N] or None, new_state)``, float64.
    """
    _check_lstm_shared(params, lstm_shared)
    names = lstm_names(lstm_shared)
    new_h, new_c = _step_lstms(params, names, obs, state, episode_starts)
    policy_out, _ = mlp_forward(_sub(params, "pi"), new_h[0], activation)
    values = None
    if with_values:
        values = mlp_forward(_sub(params, "vf"), new_h[-1], activation)[0][:, 0]
    return policy_out, values, LSTMStates(np.stack(new_h), np.stack(new_c))


def recurrent_value_step(params: Mapping[str, np.ndarray], obs, state: LSTMStates,
                         episode_starts, activation: str = "tanh",
                         lstm_shared: bool = False) -> np.ndarray:
    """Values only, ``V(obs | state)`` ``[N]``, stepping only the critic's LSTM; the state is
    not returned (for bootstrapping ``last_values`` / ``final_values`` without advancing it)."""
    _check_lstm_shared(params, lstm_shared)
    names = lstm_names(lstm_shared)
    l = len(names) - 1
    sub_state = LSTMStates(state.h[l:], state.c[l:])
    new_h, _ = _step_lstms(params, names[l:], obs, sub_state, episode_starts)
    values, _ = mlp_forward(_sub(params, "vf"), new_h[0], activation)
    return values[:, 0]


def _step_lstms(params, names, obs, state: LSTMStates, episode_starts):
    obs = np.asarray(obs)
    if obs.ndim != 2:
        raise ValueError(f"obs must have shape [N, D], got {obs.shape}")
    hidden = _sub(params, names[0])["w_hh"].shape[1]
    _check_states(state, len(names), obs.shape[0], hidden)
    starts = as_flag_array(episode_starts, "episode_starts", ndim=(1,))
    new_h, new_c = [], []
    for l, name in enumerate(names):
        h, c = lstm_step(_sub(params, name), obs, state.h[l], state.c[l], starts)
        new_h.append(h)
        new_c.append(c)
    return new_h, new_c


class RecurrentPolicy(PolicyBase):
    """LSTM actor-critic policy: the network above + a distribution head of :mod:`ppo_ref.policies`.

    The recurrent counterpart of :class:`ppo_ref.policies.MLPPolicy`, with the same head
    objects (:func:`ppo_ref.policies.make_head`: categorical for Discrete, diagonal Gaussian
    with a state-independent ``log_std`` for 1-d Box) and the same conventions (the buffer keeps
    the raw sample, the env gets ``head.to_env(actions)``). Every method takes ``params``
    explicitly and every acting method takes and returns the :class:`LSTMStates`, so the policy
    object itself is stateless.

    Args:
        observation_space: a gymnasium Box (flattened to ``obs_dim``).
        action_space: gymnasium Discrete or 1-d Box.
        config: a PPOConfig (``lstm_hidden_size``, ``lstm_shared``, ``net_arch``,
            ``activation``, ``policy_head_gain``, ``value_head_gain``, ``log_std_init``).

    Raises:
        ValueError: unsupported observation or action space.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.lstm_shared = bool(config.lstm_shared)
        self.hidden_size = int(config.lstm_hidden_size)

    # -- parameters and state -----------------------------------------------------------------
    def init_params(self, rng: np.random.Generator) -> Params:
        """Fresh parameters: :func:`recurrent_actor_critic_init` + the head's (``log_std``),
        as a :class:`~ppo_ref.flat.FlatArrays` (:meth:`as_flat`)."""
        c = self.config
        params = recurrent_actor_critic_init(
            rng, self.obs_dim, self.head.out_dim, hidden_size=self.hidden_size,
            lstm_shared=self.lstm_shared, net_arch=tuple(c.net_arch), activation=c.activation,
            policy_gain=c.policy_head_gain, value_gain=c.value_head_gain)
        params.update(self.head.init_params())
        return self.as_flat(params)

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> FlatArrays:
        """``arrays`` (same keys as the parameters) copied into one float64 buffer, keys in
        their order (:class:`~ppo_ref.flat.FlatArrays`: still a dict of arrays). With parameters
        and gradients in one layout, Adam and the global-norm clip of :mod:`ppo_ref.optim` run
        one fused pass over the buffer (same bits as the per-array path)."""
        layout = FlatLayout.in_order([(k, np.shape(v)) for k, v in arrays.items()])
        return flatten_arrays(arrays, layout, dtype=np.float64)

    def initial_state(self, n_envs: int) -> LSTMStates:
        """Zero :class:`LSTMStates` ``[L, n_envs, H]``."""
        shape = (len(lstm_names(self.lstm_shared)), int(n_envs), self.hidden_size)
        return LSTMStates(np.zeros(shape), np.zeros(shape))

    def _net(self, params: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if not self._head_keys:
            return params
        return {k: v for k, v in params.items() if k not in self._head_keys}

    def flatten_obs(self, obs, lead: int = 1) -> np.ndarray:
        """``[*lead_dims, *obs_shape]`` -> float64 ``[*lead_dims, obs_dim]`` (``lead`` = 1 for
        one step ``[N, ...]``, 2 for a sequence ``[T, N, ...]``)."""
        obs = np.asarray(obs, dtype=np.float64)
        if obs.ndim < lead:
            raise ValueError(f"obs must have at least {lead} leading dimensions, got {obs.shape}")
        return obs.reshape(obs.shape[:lead] + (-1,))

    # -- acting -------------------------------------------------------------------------------
    def act(self, params, obs, state: LSTMStates, episode_starts, rng):
        """One acting step for N envs: sample actions and advance the LSTM state.

        Args:
            obs: ``[N, ...]``; state: the :class:`LSTMStates` before this step;
            episode_starts: ``[N]`` (True: this step starts an episode; its state is reset);
            rng: the sampling generator.

        Returns:
            ``(actions, values, log_probs, new_state)``: raw actions (int64 ``[N]`` or float64
            ``[N, A]``), ``values`` ``[N]``, ``log_probs`` ``[N]``, the new state.
        """
        out, values, new_state = recurrent_actor_critic_step(
            self._net(params), self.flatten_obs(obs), state, episode_starts, self.activation,
            self.lstm_shared)
        actions = self.head.sample(rng, out, params)
        return actions, values, self.head.log_prob(out, params, actions), new_state

    def policy_out_step(self, params, obs, state: LSTMStates, episode_starts):
        """``(policy_out [N, P], new_state)``: one step of every LSTM and the policy tower only
        (what acting needs when values and log-probs are recomputed later by a replay)."""
        out, _, new_state = recurrent_actor_critic_step(
            self._net(params), self.flatten_obs(obs), state, episode_starts, self.activation,
            self.lstm_shared, with_values=False)
        return out, new_state

    def predict(self, params, obs, state: LSTMStates, episode_starts, rng=None,
                deterministic: bool = False):
        """``(env_actions, new_state)``: actions as the env receives them (Gaussian: clipped).

        ``deterministic=True`` takes the mode (argmax / mean); otherwise ``rng`` is required.
        """
        out, new_state = self.policy_out_step(params, obs, state, episode_starts)
        if deterministic:
            actions = self.head.mode(out, params)
        else:
            if rng is None:
                raise ValueError("rng is required when deterministic=False")
            actions = self.head.sample(rng, out, params)
        return self.head.to_env(actions), new_state

    def values(self, params, obs, state: LSTMStates, episode_starts) -> np.ndarray:
        """``V(obs | state)`` ``[N]`` after one (critic) LSTM step; ``state`` is not advanced.

        For bootstrapping: ``last_values`` (the next rollout will step the same observation
        again from the same state) and ``final_values`` (the state before the reset, with
        ``episode_starts`` all False).
        """
        return recurrent_value_step(self._net(params), self.flatten_obs(obs), state,
                                    episode_starts, self.activation, self.lstm_shared)

    # -- training -----------------------------------------------------------------------------
    def evaluate(self, params, obs, actions, state: LSTMStates, episode_starts):
        """Replay whole sequences: log-probs of ``actions``, entropies and values, plus a cache.

        Args:
            obs: ``[T, n, ...]``; actions: ``[T, n]`` int or ``[T, n, A]`` raw samples;
            state: :class:`LSTMStates` ``[L, n, H]`` at step 0 (the stored rollout-start
            state); episode_starts: ``[T, n]``.

        Returns:
            :class:`ppo_ref.policies.PolicyEval` with ``log_probs``, ``entropy``, ``values``
            of shape ``[T, n]`` (float64) and the cache :meth:`backward` needs.
        """
        x = self.flatten_obs(obs, lead=2)
        T, n = x.shape[:2]
        out, values, _, net_cache = recurrent_actor_critic_forward(
            self._net(params), x, state, episode_starts, self.activation, self.lstm_shared)
        flat_out = out.reshape(T * n, -1)
        flat_actions = np.asarray(actions).reshape((T * n,) + self.head.action_shape)
        log_probs = self.head.log_prob(flat_out, params, flat_actions).reshape(T, n)
        entropy = np.asarray(self.head.entropy(flat_out, params)).reshape(T, n)
        return PolicyEval(log_probs, entropy, values, (flat_out, flat_actions, net_cache))

    def backward(self, params, cache, d_log_probs, d_entropy, d_values) -> Params:
        """Gradients (keys of ``params``) of ``sum(d_log_probs * log_probs + d_entropy *
        entropy + d_values * values)`` over the ``[T, n]`` rows of the :meth:`evaluate` call
        that made ``cache``, through the heads, the towers and the LSTM(s) over all T steps."""
        flat_out, flat_actions, net_cache = cache
        T, n = np.shape(d_values)
        d_out, head_grads = self.head.backward(
            flat_out, params, flat_actions, np.reshape(d_log_probs, -1),
            None if d_entropy is None else np.reshape(d_entropy, -1))
        grads = recurrent_actor_critic_backward(
            self._net(params), net_cache, d_out.reshape(T, n, -1),
            np.asarray(d_values, dtype=np.float64))
        grads.update(head_grads)
        if is_flat(params):  # gradients in the parameters' buffer layout (fused Adam and clip)
            return flatten_arrays({k: grads[k] for k in params}, params.layout, dtype=np.float64)
        return {k: grads[k] for k in params}
