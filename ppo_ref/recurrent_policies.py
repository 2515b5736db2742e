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

Speed: :meth:`RecurrentPolicy.init_params` returns the parameters as one buffer
(:class:`~ppo_ref.flat.FlatArrays`) with the same parameter of every LSTM side by side
(:meth:`RecurrentPolicy.flat_layout`). With such parameters :meth:`RecurrentPolicy.evaluate`,
:meth:`RecurrentPolicy.backward` and :meth:`RecurrentPolicy.acting_step_fn` take a fast path:
both LSTMs in one compiled call on stacked ``[L, ...]`` views (the kernels of
:mod:`ppo_ref.nn.lstm`, same bits), each tower forward and backward in one compiled call on
the parameter and gradient buffers (:func:`ppo_ref.nn.mlp._mlp_forward_flat` /
:func:`~ppo_ref.nn.mlp._mlp_backward_flat`: fused multiply-add chains in a documented order,
independent of BLAS; the forward row by row, so an env's outputs never depend on the other
rows of the call: acting, the rollout replay and any minibatch agree bit for bit), the
categorical head in one compiled pass, and the arguments checked once per call (the structure
once per layout). ``config.compute_dtype="float32"``
runs that path in float32. Anything else takes the checked functions of this module, which
also raise the errors; both paths agree to rounding (tested).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref import _workspace as workspace
from ppo_ref.flat import FlatArrays, FlatLayout, flatten_arrays, is_flat
from ppo_ref.nn.distributions import _categorical_backward_kernel, _categorical_eval_kernel
from ppo_ref.nn.lstm import (_all_finite, _backward_stacked, _check_params, _forward_stacked,
                             _keep_rows, _step_stacked)
from ppo_ref.nn.mlp import _mlp_backward_flat, _mlp_forward_flat, _mlp_layers
from ppo_ref.policies import PolicyBase, PolicyEval, _finite_grad
from ppo_ref.spec.recurrent_networks import (LSTMStates, RecurrentActorCriticCache,
                                             initial_lstm_states, lstm_names,
                                             recurrent_actor_critic_backward,
                                             recurrent_actor_critic_forward,
                                             recurrent_actor_critic_init,
                                             recurrent_actor_critic_step, recurrent_value_step)

__all__ = ["LSTMStates", "RecurrentActorCriticCache", "recurrent_actor_critic_init",
           "initial_lstm_states", "lstm_names", "recurrent_actor_critic_forward",
           "recurrent_actor_critic_backward", "recurrent_actor_critic_step",
           "recurrent_value_step", "RecurrentPolicy", "SpecRecurrentPolicy",
           "make_recurrent_policy"]

Params = dict


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


class _FastSpec(NamedTuple):
    """What the fast path of :class:`RecurrentPolicy` reads from a parameter layout it has
    checked once: the layout, ``L`` LSTMs of width ``H``, the buffer slices ``(start, stop,
    stacked shape)`` of ``w_ih [L, 4H, D]``, ``w_hh [L, 4H, H]``, ``b [L, 4H]``, and per tower
    the layer table of :func:`ppo_ref.nn.mlp._mlp_forward_flat` (int64 ``[layers, 4]``: offsets
    of ``w_i`` and ``b_i`` in the buffer, ``out_i``, ``in_i``) and the sum of its layers'
    output widths (the per-row size of its outputs buffer)."""
    layout: FlatLayout
    n_lstm: int
    hidden: int
    lstm_slices: Tuple[Tuple[int, int, Tuple[int, ...]], ...]
    pi_table: np.ndarray
    vf_table: np.ndarray
    pi_width: int
    vf_width: int


class _FastCache(NamedTuple):
    """Cache of the fast path of :meth:`RecurrentPolicy.evaluate`: the spec and ``(T, n)``,
    the parameter buffer in the compute dtype, the inputs and the stacked LSTM arrays of
    :func:`ppo_ref.nn.lstm._forward_stacked` (``h_seq [L, T, n, H]``: the towers' inputs), the
    towers' outputs buffers of :func:`ppo_ref.nn.mlp._mlp_forward_flat`, ``policy_out
    [T * n, P]`` (a view of the policy tower's buffer), the flat actions, and (categorical
    head) the probabilities and entropies (``None`` otherwise)."""
    spec: _FastSpec
    shape: Tuple[int, int]
    flat: np.ndarray
    x: np.ndarray
    keep: np.ndarray
    h_seq: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray
    pi_acts: np.ndarray
    vf_acts: np.ndarray
    policy_out: np.ndarray
    actions: np.ndarray
    probs: object
    entropy: object


def _step_inputs_ok(obs, state, starts, n_lstm: int, hidden: int, obs_dim: int) -> bool:
    """Whether one acting step's arguments are of the kinds the fast path takes: ``obs`` a
    finite C-contiguous float64 ``[N, obs_dim]`` (N >= 1), ``state`` :class:`LSTMStates` of
    finite C-contiguous float64 ``[n_lstm, N, hidden]`` arrays, ``starts`` a bool ``[N]``
    array."""
    if not (type(obs) is np.ndarray and obs.dtype == np.float64 and obs.ndim == 2
            and obs.shape[1] == obs_dim and obs.flags.c_contiguous and obs.shape[0] >= 1
            and isinstance(state, LSTMStates) and type(starts) is np.ndarray
            and starts.dtype == np.bool_ and starts.shape == (obs.shape[0],)):
        return False
    want = (n_lstm, obs.shape[0], hidden)
    for a in (state.h, state.c):
        if not (type(a) is np.ndarray and a.dtype == np.float64 and a.shape == want
                and a.flags.c_contiguous):
            return False
    return _all_finite(obs) and _all_finite(state.h) and _all_finite(state.c)


def _tower_table(layout: FlatLayout, layers, prefix: str):
    """The layer table ``[(w offset, b offset, out, in)]`` (int64 ``[layers, 4]``) of the
    tower ``prefix`` (``"pi."``, ``"vf."``) whose ``(w, b)`` arrays are ``layers``."""
    return np.array([(layout.offset(f"{prefix}w{i}"), layout.offset(f"{prefix}b{i}"))
                     + tuple(w.shape) for i, (w, _) in enumerate(layers)], dtype=np.int64)


def _tower_forward(x: np.ndarray, flat: np.ndarray, table: np.ndarray, width: int,
                   relu: bool):
    """A tower forward on the fast path: ``(acts, y)``, the outputs buffer ``[rows * width]``
    of :func:`ppo_ref.nn.mlp._mlp_forward_flat` (its backward reads it) and the tower output
    ``y [rows, out]``, a view of its last ``rows * out`` entries."""
    rows = x.shape[0]
    acts = np.empty(rows * width, flat.dtype)
    _mlp_forward_flat(x, flat, table, relu, acts)
    n_out = int(table[-1, 2])
    return acts, acts[rows * (width - n_out):].reshape(rows, n_out)


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
            ``activation``, ``policy_head_gain``, ``value_head_gain``, ``log_std_init``,
            ``compute_dtype``: ``"float32"`` runs the fast path's passes (acting, evaluate,
            backward) in float32 as torch does; parameters and returned gradients stay
            float64; the checked path is float64 always).

    Raises:
        ValueError: unsupported observation or action space.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.lstm_shared = bool(config.lstm_shared)
        self.hidden_size = int(config.lstm_hidden_size)
        self._spec = None  # the last _FastSpec built (checked once per layout)
        self.compute_dtype = np.dtype(getattr(config, "compute_dtype", "float64"))

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

    def flat_layout(self, arrays: Mapping[str, np.ndarray]) -> FlatLayout:
        """The one-buffer layout of this policy's parameters: the keys in their order, stored
        with the same parameter of every LSTM side by side (``lstm_pi.w_ih``, ``lstm_vf.w_ih``,
        ``lstm_pi.w_hh``, ``lstm_vf.w_hh``, ``lstm_pi.b``, ``lstm_vf.b``; or the shared
        LSTM's three), then the other keys in order. Each LSTM parameter of the actor and the
        critic is then one ``[L, ...]`` view of the buffer, which the fast path runs both LSTMs
        on. Dicts without those keys are stored in key order."""
        shapes = [(k, np.shape(v)) for k, v in arrays.items()]
        lstm_keys = [f"{name}.{k}" for k in ("w_ih", "w_hh", "b")
                     for name in lstm_names(self.lstm_shared)]
        if not all(k in arrays for k in lstm_keys):
            return FlatLayout.in_order(shapes)
        first = set(lstm_keys)
        return FlatLayout.in_order(shapes, lstm_keys + [k for k, _ in shapes if k not in first])

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> FlatArrays:
        """``arrays`` (same keys as the parameters) copied into one float64 buffer in
        :meth:`flat_layout` (:class:`~ppo_ref.flat.FlatArrays`: still a dict of arrays, same key
        order and values). With parameters and gradients in one layout, Adam and the
        global-norm clip of :mod:`ppo_ref.optim` run one fused pass over the buffer (same bits
        as the per-array path), and :meth:`evaluate`/:meth:`backward` take their fast path."""
        return flatten_arrays(arrays, self.flat_layout(arrays), dtype=np.float64)

    # -- fast path ----------------------------------------------------------------------------
    def _fast_spec(self, params):
        """The :class:`_FastSpec` of ``params`` when they can take the fast path (an intact
        float64 :class:`~ppo_ref.flat.FlatArrays` in :meth:`flat_layout` whose arrays form this
        policy's network), else ``None``. The structure is checked once per layout."""
        if not is_flat(params) or params.flat.dtype != np.float64:
            return None
        spec = self._spec
        if spec is not None and params.layout is spec.layout:
            return spec
        spec = self._make_spec(params)
        if spec is not None:
            self._spec = spec
        return spec

    def _make_spec(self, params: FlatArrays):
        if params.layout != self.flat_layout(params):
            return None
        names = lstm_names(self.lstm_shared)
        try:
            _check_lstm_shared(params, self.lstm_shared)
            shapes = {tuple(a.shape for a in _check_params(_sub(params, name))) for name in names}
            pi = _mlp_layers(params, "pi.")
            vf = _mlp_layers(params, "vf.")
        except ValueError:
            return None
        if len(shapes) != 1:
            return None
        (w_ih_shape, w_hh_shape, _), = shapes
        hidden = w_hh_shape[1]
        keys = {f"{name}.{k}" for name in names for k in ("w_ih", "w_hh", "b")}
        keys |= {f"{tower}.{k}{i}" for tower, layers in (("pi", pi), ("vf", vf))
                 for i in range(len(layers)) for k in ("w", "b")} | set(self._head_keys)
        if (w_ih_shape[1] != self.obs_dim or pi[0][0].shape[1] != hidden
                or vf[0][0].shape[1] != hidden or pi[-1][0].shape[0] != self.head.out_dim
                or vf[-1][0].shape[0] != 1 or set(params) != keys
                or any(np.shape(params[k]) != np.shape(v)
                       for k, v in self.head.init_params().items())):
            return None
        layout = params.layout
        n_lstm = len(names)
        slices = []
        for k, shape in (("w_ih", w_ih_shape), ("w_hh", w_hh_shape), ("b", (4 * hidden,))):
            start = layout.offset(f"{names[0]}.{k}")
            size = n_lstm * int(np.prod(shape))
            slices.append((start, start + size, (n_lstm,) + tuple(shape)))
        return _FastSpec(layout, n_lstm, hidden, tuple(slices), _tower_table(layout, pi, "pi."),
                         _tower_table(layout, vf, "vf."), sum(w.shape[0] for w, _ in pi),
                         sum(w.shape[0] for w, _ in vf))

    @staticmethod
    def _stacked(spec: _FastSpec, flat: np.ndarray):
        """``(w_ih [L, 4H, D], w_hh [L, 4H, H], b [L, 4H])`` views of a buffer in ``spec``'s layout."""
        return tuple(flat[start:stop].reshape(shape) for start, stop, shape in spec.lstm_slices)

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

        Fast path (as :meth:`values`): every LSTM's step by the stacked kernel and both towers
        on the parameter buffer, in the compute dtype (outputs, values and states returned as
        float64).
        """
        fast = self._fast_step(params, obs, state, episode_starts, critic_only=False)
        if fast is not None:
            spec, flat, h_new, c_new = fast
            relu = self.activation == "relu"
            out = _tower_forward(h_new[0], flat, spec.pi_table, spec.pi_width, relu)[1]
            out = out.astype(np.float64, copy=False)
            values = _tower_forward(h_new[-1], flat, spec.vf_table, spec.vf_width,
                                    relu)[1][:, 0].astype(np.float64)
            new_state = LSTMStates(h_new.astype(np.float64, copy=False),
                                   c_new.astype(np.float64, copy=False))
        else:
            out, values, new_state = recurrent_actor_critic_step(
                self._net(params), self.flatten_obs(obs), state, episode_starts,
                self.activation, self.lstm_shared)
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

        Fast path (parameters of :meth:`evaluate`'s fast path and step arguments of
        :meth:`acting_step_fn`'s): the critic LSTM's step by the stacked kernel and the value
        tower on the parameter buffer, in the compute dtype: the bits the fast
        :meth:`evaluate` gives these rows (and :meth:`act` these values).
        """
        fast = self._fast_step(params, obs, state, episode_starts, critic_only=True)
        if fast is not None:
            spec, flat, h_new, _ = fast
            values = _tower_forward(h_new[0], flat, spec.vf_table, spec.vf_width,
                                    self.activation == "relu")[1]
            return values[:, 0].astype(np.float64)
        return recurrent_value_step(self._net(params), self.flatten_obs(obs), state,
                                    episode_starts, self.activation, self.lstm_shared)

    def _fast_step(self, params, obs, state, episode_starts, critic_only: bool):
        """One LSTM step on the fast path for :meth:`act` / :meth:`values`: ``(spec, flat,
        h_new, c_new)`` with the parameter buffer and the new states ``[L', N, H]`` in the
        compute dtype (every LSTM, or only the critic's with ``critic_only``), by
        :func:`ppo_ref.nn.lstm._step_stack` (``lstm_step``'s bits); ``None`` unless ``params``
        take :meth:`evaluate`'s fast path and the step arguments :meth:`acting_step_fn`'s
        (:func:`_step_inputs_ok`)."""
        spec = self._fast_spec(params)
        if (spec is None or not _step_inputs_ok(obs, state, episode_starts, spec.n_lstm,
                                                spec.hidden, self.obs_dim)
                or not _all_finite(params.flat)):
            return None
        first = spec.n_lstm - 1 if critic_only else 0
        dt = self.compute_dtype
        flat = self._compute_flat(params)
        x, h, c = obs, state.h[first:], state.c[first:]
        if dt != np.float64:
            x, h, c = x.astype(dt), h.astype(dt), c.astype(dt)
        h_new, c_new = _step_stacked(*self._step_weights(spec, flat, first), x, h, c,
                                     episode_starts)
        return spec, flat, h_new, c_new

    def _step_weights(self, spec: _FastSpec, flat: np.ndarray, first: int = 0):
        """``(w_ih_t [L', D, 4H], w_hh_t [L', H, 4H], b [L', 4H])``: the stacked LSTM weights
        of ``flat`` from LSTM ``first`` on, transposed (C-contiguous copies) for stepping."""
        w_ih, w_hh, b = self._stacked(spec, flat)
        return (np.ascontiguousarray(w_ih[first:].transpose(0, 2, 1)),
                np.ascontiguousarray(w_hh[first:].transpose(0, 2, 1)), b[first:])

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

        Fast path (same equations; the LSTM outputs bit for bit, the towers as fused
        multiply-add chains in the order of :func:`ppo_ref.nn.mlp._mlp_forward_flat` and the
        categorical head by one compiled pass, equal to rounding): ``params`` from
        :meth:`init_params` / :meth:`as_flat` (finite), ``obs`` a finite float64 array,
        ``actions`` int64 ``[T, n]`` in range (categorical) or an array of the action shape
        (Gaussian), ``state`` finite C-contiguous float64, ``episode_starts`` a bool ``[T, n]``
        array: both LSTMs in one compiled call on stacked views of the parameter buffer, each
        tower in one compiled call, the arguments checked once per call instead of once per
        layer. Anything else takes the
        checked path (which also raises the errors).
        """
        spec = self._fast_spec(params)
        if spec is not None:
            ev = self._fast_evaluate(spec, params, obs, actions, state, episode_starts)
            if ev is not None:
                return ev
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
        that made ``cache``, through the heads, the towers and the LSTM(s) over all T steps.
        After the fast path of :meth:`evaluate` the gradients are a
        :class:`~ppo_ref.flat.FlatArrays` in the layout of ``params`` (float64 compute: a
        buffer of the reuse pools of :mod:`ppo_ref._workspace`, handed out again once the
        caller drops it; float32: a new widened buffer)."""
        if isinstance(cache, _FastCache):
            return self._fast_backward(params, cache, d_log_probs, d_entropy, d_values)
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

    def _compute_flat(self, params) -> np.ndarray:
        """The parameter buffer in the compute dtype (the caller's own buffer for float64; one
        cast copy for float32)."""
        if self.compute_dtype == np.float64:
            return params.flat
        return params.flat.astype(self.compute_dtype)

    def _fast_evaluate(self, spec: _FastSpec, params, obs, actions, state, episode_starts):
        """:meth:`evaluate` on the fast path, or ``None`` when an argument is not of the
        accepted kind (the checked path then runs)."""
        if (type(obs) is not np.ndarray or obs.dtype != np.float64 or obs.ndim < 3
                or obs.shape[2:] != self.obs_shape):
            return None
        T, n = obs.shape[:2]
        rows = T * n
        if rows < 1:
            return None
        x = np.ascontiguousarray(obs).reshape(T, n, self.obs_dim)
        starts = episode_starts
        if type(starts) is not np.ndarray or starts.dtype != np.bool_ or starts.shape != (T, n):
            return None
        if not isinstance(state, LSTMStates):
            return None
        h0, c0 = state.h, state.c
        want = (spec.n_lstm, n, spec.hidden)
        for a in (h0, c0):
            if (type(a) is not np.ndarray or a.dtype != np.float64 or a.shape != want
                    or not a.flags.c_contiguous):
                return None
        head = self.head
        categorical = head.kind == "categorical"
        if categorical:
            if (type(actions) is not np.ndarray or actions.dtype != np.int64
                    or actions.shape != (T, n)):
                return None
            flat_actions = np.ascontiguousarray(actions).reshape(rows)
        else:
            flat_actions = np.asarray(actions)
            if flat_actions.shape != (T, n) + head.action_shape:
                return None
            flat_actions = flat_actions.reshape((rows,) + head.action_shape)
        if not (_all_finite(params.flat) and _all_finite(x) and _all_finite(h0)
                and _all_finite(c0)):
            return None
        dt = self.compute_dtype
        flat = self._compute_flat(params)
        if dt != np.float64:
            x, h0, c0 = x.astype(dt), h0.astype(dt), c0.astype(dt)
        keep = _keep_rows(starts, dt)
        w_ih, w_hh, b = self._stacked(spec, flat)
        h_seq, h_prev, c_prev, gates, tanh_c = _forward_stacked(w_ih, w_hh, b, x, h0, c0, keep)
        hidden = spec.hidden
        relu = self.activation == "relu"
        pi_acts, out = _tower_forward(h_seq[0].reshape(rows, hidden), flat, spec.pi_table,
                                      spec.pi_width, relu)
        vf_acts, values = _tower_forward(h_seq[-1].reshape(rows, hidden), flat, spec.vf_table,
                                         spec.vf_width, relu)
        if categorical:
            log_probs = np.empty(rows)
            entropy = np.empty(rows)
            probs = np.empty(out.shape)
            if not _categorical_eval_kernel(out, flat_actions, log_probs, entropy, probs):
                return None
            cached_entropy = entropy
        else:
            log_probs = head.log_prob(out, params, flat_actions)
            entropy = np.asarray(head.entropy(out, params), dtype=np.float64)
            probs = cached_entropy = None
        cache = _FastCache(spec, (T, n), flat, x, keep, h_seq, h_prev, c_prev, gates, tanh_c,
                           pi_acts, vf_acts, out, flat_actions, probs, cached_entropy)
        return PolicyEval(log_probs.reshape(T, n), entropy.reshape(T, n),
                          values.astype(np.float64).reshape(T, n), cache)

    def _fast_backward(self, params, cache: _FastCache, d_log_probs, d_entropy, d_values):
        """:meth:`backward` for a cache of :meth:`_fast_evaluate`: gradients in one float64
        buffer (a pooled one, see :meth:`backward`; float32 compute: computed in float32, then
        widened into a new one)."""
        spec = self._fast_spec(params)
        if spec is not cache.spec:
            raise ValueError("cache was made by the fast path of evaluate; params must be "
                             "FlatArrays in the layout of the params given to it")
        T, n = cache.shape
        rows = T * n
        d_lp = _finite_grad(d_log_probs, "d_log_probs", cache.shape)
        d_v = _finite_grad(d_values, "d_values", cache.shape)
        d_ent = None if d_entropy is None else _finite_grad(d_entropy, "d_entropy", cache.shape)
        dt = self.compute_dtype
        out = cache.policy_out
        if cache.probs is not None:
            d_out = np.empty_like(out)
            _categorical_backward_kernel(cache.probs, cache.actions, cache.entropy, d_lp,
                                         d_lp if d_ent is None else d_ent, d_ent is not None,
                                         d_out)
            head_grads = {}
        else:
            d_out, head_grads = self.head.backward(out, params, cache.actions, d_lp, d_ent)
            d_out = np.ascontiguousarray(d_out, dtype=dt)
        relu = self.activation == "relu"
        hidden = spec.hidden
        layout = spec.layout
        flat = cache.flat
        g_flat = workspace.empty("policy.grads", (layout.size,), dt)
        # the towers write their weight gradients into g_flat and add dL/dh into dh_seq (a
        # shared LSTM: the value tower's terms continue the policy tower's sums)
        dh_seq = workspace.empty("policy.dh_seq", (spec.n_lstm, T, n, hidden), dt)
        dh_seq[...] = 0.0
        h_seq = cache.h_seq
        _mlp_backward_flat(h_seq[0].reshape(rows, hidden), cache.pi_acts, flat, spec.pi_table,
                           relu, d_out, g_flat, dh_seq[0].reshape(rows, hidden))
        _mlp_backward_flat(h_seq[-1].reshape(rows, hidden), cache.vf_acts, flat, spec.vf_table,
                           relu, np.ascontiguousarray(d_v.reshape(rows, 1), dtype=dt), g_flat,
                           dh_seq[-1].reshape(rows, hidden))
        _, w_hh, _ = self._stacked(spec, flat)
        g_w_ih, g_w_hh, g_b = self._stacked(spec, g_flat)
        _backward_stacked(w_hh, cache.x, cache.h_prev, cache.c_prev, cache.gates, cache.tanh_c,
                          cache.keep, dh_seq, g_w_ih, g_w_hh, g_b)
        if dt != np.float64:
            g_flat = g_flat.astype(np.float64)
        grads = FlatArrays.from_buffer(g_flat, layout)
        for k, g in head_grads.items():
            grads[k][...] = g
        return grads

    def acting_step_fn(self, params):
        """``step(obs, state, episode_starts) -> (policy_out, new_state)``: :meth:`policy_out_step`
        for many steps with fixed ``params`` (one rollout).

        With parameters that take the fast path of :meth:`evaluate`, the parameters are checked
        and the weights transposed (and cast to the compute dtype) once, here; each step is one
        compiled call for both LSTMs (:func:`ppo_ref.nn.lstm._step_stack`, the arithmetic of
        ``lstm_step``) and the row-independent policy tower of the fast :meth:`evaluate`, so an
        env's policy outputs are bit for bit those the replay of its rollout computes. (In
        float32 the state is carried as float64 arrays holding float32 values.) A step whose
        ``obs`` (finite float64 ``[N, obs_dim]``), ``state`` (finite C-contiguous float64) or
        ``episode_starts`` (bool ``[N]``) is of another kind, and any other ``params``, go
        through :meth:`policy_out_step` itself.
        """
        spec = self._fast_spec(params)
        if spec is None or not _all_finite(params.flat):
            return lambda obs, state, starts: self.policy_out_step(params, obs, state, starts)
        dt = self.compute_dtype
        flat = self._compute_flat(params).copy()   # this rollout's parameters, kept apart
        weights = self._step_weights(spec, flat)
        pi_table, pi_width = spec.pi_table, spec.pi_width
        want_lstm, hidden, obs_dim = spec.n_lstm, spec.hidden, self.obs_dim
        relu = self.activation == "relu"
        wide = dt == np.float64

        def step(obs, state, episode_starts):
            if _step_inputs_ok(obs, state, episode_starts, want_lstm, hidden, obs_dim):
                h, c = state.h, state.c
                if not wide:
                    obs, h, c = obs.astype(dt), h.astype(dt), c.astype(dt)
                h_new, c_new = _step_stacked(*weights, obs, h, c, episode_starts)
                out = _tower_forward(h_new[0], flat, pi_table, pi_width, relu)[1]
                if not wide:
                    h_new, c_new = h_new.astype(np.float64), c_new.astype(np.float64)
                return out, LSTMStates(h_new, c_new)
            return self.policy_out_step(params, obs, state, episode_starts)
        return step


class SpecRecurrentPolicy(PolicyBase):
    """The recurrent policy of the readable tier (``PPOConfig.backend = "spec"``).

    The LSTM actor-critic of :mod:`ppo_ref.spec.recurrent_networks` (the LSTM of
    :mod:`ppo_ref.spec.lstm`, plain NumPy, float64) plus the head of
    :func:`ppo_ref.policies.make_head`. Parameters are a plain dict with the keys, shapes and
    initial values of :class:`RecurrentPolicy`'s (the same draws), so checkpoints move between
    the backends; every method computes what its :class:`RecurrentPolicy` namesake documents.
    :class:`RecurrentPolicy` is declared equal to this class within the tolerance stated in
    ``tests/test_tiers.py``.

    Raises:
        ValueError: unsupported spaces; ``config.compute_dtype`` other than float64.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        if np.dtype(config.compute_dtype) != np.float64:
            raise ValueError(f"compute_dtype must be 'float64' for the spec backend, got "
                             f"{config.compute_dtype!r}")
        self.lstm_shared = bool(config.lstm_shared)
        self.hidden_size = int(config.lstm_hidden_size)

    def init_params(self, rng: np.random.Generator) -> Params:
        """Fresh parameters (:func:`recurrent_actor_critic_init` + the head's)."""
        c = self.config
        params = recurrent_actor_critic_init(
            rng, self.obs_dim, self.head.out_dim, hidden_size=self.hidden_size,
            lstm_shared=self.lstm_shared, net_arch=tuple(c.net_arch), activation=c.activation,
            policy_gain=c.policy_head_gain, value_gain=c.value_head_gain)
        params.update(self.head.init_params())
        return params

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> Params:
        """A float64 copy of a parameter-shaped dict, as a plain dict (no one-buffer layout
        in this tier; the name matches :meth:`RecurrentPolicy.as_flat`)."""
        return {k: np.array(v, dtype=np.float64) for k, v in arrays.items()}

    def initial_state(self, n_envs: int) -> LSTMStates:
        """Zero :class:`LSTMStates` ``[L, n_envs, H]``."""
        shape = (len(lstm_names(self.lstm_shared)), int(n_envs), self.hidden_size)
        return LSTMStates(np.zeros(shape), np.zeros(shape))

    def _net(self, params: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return {k: v for k, v in params.items() if k not in self._head_keys}

    def flatten_obs(self, obs, lead: int = 1) -> np.ndarray:
        """``[*lead_dims, *obs_shape]`` -> float64 ``[*lead_dims, obs_dim]``."""
        obs = np.asarray(obs, dtype=np.float64)
        if obs.ndim < lead:
            raise ValueError(f"obs must have at least {lead} leading dimensions, got {obs.shape}")
        return obs.reshape(obs.shape[:lead] + (-1,))

    def act(self, params, obs, state: LSTMStates, episode_starts, rng):
        """``(actions, values, log_probs, new_state)`` for one acting step of N envs."""
        out, values, new_state = recurrent_actor_critic_step(
            self._net(params), self.flatten_obs(obs), state, episode_starts, self.activation,
            self.lstm_shared)
        actions = self.head.sample(rng, out, params)
        return actions, values, self.head.log_prob(out, params, actions), new_state

    def policy_out_step(self, params, obs, state: LSTMStates, episode_starts):
        """``(policy_out [N, P], new_state)``: one step of every LSTM and the policy tower."""
        out, _, new_state = recurrent_actor_critic_step(
            self._net(params), self.flatten_obs(obs), state, episode_starts, self.activation,
            self.lstm_shared, with_values=False)
        return out, new_state

    def acting_step_fn(self, params):
        """``step(obs, state, episode_starts) -> (policy_out, new_state)`` with ``params``
        fixed (:meth:`policy_out_step`)."""
        return lambda obs, state, starts: self.policy_out_step(params, obs, state, starts)

    def predict(self, params, obs, state: LSTMStates, episode_starts, rng=None,
                deterministic: bool = False):
        """``(env_actions, new_state)``; the mode when ``deterministic``, else sampled."""
        out, new_state = self.policy_out_step(params, obs, state, episode_starts)
        if deterministic:
            actions = self.head.mode(out, params)
        else:
            if rng is None:
                raise ValueError("rng is required when deterministic=False")
            actions = self.head.sample(rng, out, params)
        return self.head.to_env(actions), new_state

    def values(self, params, obs, state: LSTMStates, episode_starts) -> np.ndarray:
        """``V(obs | state)`` ``[N]`` after one critic LSTM step; ``state`` is not advanced."""
        return recurrent_value_step(self._net(params), self.flatten_obs(obs), state,
                                    episode_starts, self.activation, self.lstm_shared)

    def evaluate(self, params, obs, actions, state: LSTMStates, episode_starts):
        """Replay ``[T, n]`` sequences from ``state``: log-probs, entropies, values, cache."""
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
        entropy + d_values * values)`` over the ``[T, n]`` rows, by BPTT over all T steps."""
        flat_out, flat_actions, net_cache = cache
        T, n = np.shape(d_values)
        d_out, head_grads = self.head.backward(
            flat_out, params, flat_actions, np.reshape(d_log_probs, -1),
            None if d_entropy is None else np.reshape(d_entropy, -1))
        grads = recurrent_actor_critic_backward(
            self._net(params), net_cache, d_out.reshape(T, n, -1),
            np.asarray(d_values, dtype=np.float64))
        grads.update(head_grads)
        return {k: grads[k] for k in params}


def make_recurrent_policy(observation_space, action_space, config):
    """The recurrent policy of ``config.backend``: :class:`SpecRecurrentPolicy` for
    ``"spec"``, :class:`RecurrentPolicy` for ``"fast"``."""
    if config.backend == "spec":
        return SpecRecurrentPolicy(observation_space, action_space, config)
    return RecurrentPolicy(observation_space, action_space, config)
