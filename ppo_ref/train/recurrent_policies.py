"""The LSTM actor-critic policies: observations -> LSTM -> MLP towers -> distribution head.

Architecture (sb3-contrib ``RecurrentActorCriticPolicy`` layout; CleanRL / thrust-rl share one
LSTM)::

    lstm_shared=False (default, sb3-contrib ``enable_critic_lstm=True``)
        actor:  obs_t -> LSTM_pi(H) -> h^pi_t -> MLP_pi(net_arch) -> policy_out_t  [P]
        critic: obs_t -> LSTM_vf(H) -> h^vf_t -> MLP_vf(net_arch) -> value_t       [1]
    lstm_shared=True (CleanRL ``ppo_atari_lstm.py``, thrust-rl)
        obs_t -> LSTM(H) -> h_t -> MLP_pi -> policy_out_t ;  h_t -> MLP_vf -> value_t

``MLP_pi`` / ``MLP_vf`` are towers on input width H (hidden layers ``net_arch`` with
``activation``, linear output; gains sqrt(2) hidden, ``policy_gain`` / ``value_gain`` heads);
``net_arch=()`` gives linear heads directly on the LSTM output. The LSTM uses the gate order
i, f, g, o of ``torch.nn.LSTM`` (orthogonal weights, zero bias). Before step t every LSTM
multiplies its carried state by ``1 - episode_starts[t]``, so an episode never sees its
predecessor's memory, in acting and in training alike, and no gradient crosses the boundary.
``policy_out`` is read by the distribution heads of :mod:`ppo_ref.train.policies` (categorical logits
or the Gaussian mean).

The network itself -- :func:`recurrent_actor_critic_init`, :func:`recurrent_actor_critic_forward`,
:func:`recurrent_actor_critic_backward`, :func:`recurrent_actor_critic_step`,
:func:`recurrent_value_step`, :class:`LSTMStates` -- is defined once, readably, in
:mod:`ppo_ref.spec.recurrent_networks` and re-exported here.

Parameter keys: ``lstm.w_ih, lstm.w_hh, lstm.b`` (shared) or ``lstm_pi.*`` and ``lstm_vf.*``
(separate), then ``pi.w0, pi.b0, ...`` and ``vf.w0, ...``, then the head's (``log_std`` for a
Gaussian). Recurrent state: :class:`LSTMStates` ``(h, c)``, each ``[L, N, H]`` float64 with
``L = 1`` (shared) or ``L = 2`` (index 0 actor, index 1 critic), N = number of envs.

Two policies compute this, with the same methods, initial parameters (the same draws) and
results:

:class:`SpecRecurrentPolicy` (the readable tier)
    Plain dict parameters, float64; every method is a call of the spec network functions
    followed by the head. It defines what the policy computes.
:class:`RecurrentPolicy` (the compiled tier)
    Parameters in one float64 buffer (:class:`~ppo_ref.fast.flat.FlatArrays` in
    :meth:`RecurrentPolicy.flat_layout`, as :meth:`RecurrentPolicy.init_params` and
    :meth:`RecurrentPolicy.as_flat` give), and nothing else. Both LSTMs run in one compiled
    call on stacked ``[L, ...]`` views of the buffer (the kernels of :mod:`ppo_ref.fast.lstm`),
    each tower in one compiled call whose rows never depend on each other (fused multiply-add
    chains of :func:`ppo_ref.fast.mlp.mlp_forward_flat`, independent of BLAS), the categorical
    head in one compiled pass. So acting one step of N envs, the replay of a ``[T, N]``
    rollout and any minibatch of its envs give the same bits, in float64 and in float32
    (``config.compute_dtype``). It equals :class:`SpecRecurrentPolicy` within the tolerance
    its docstring states.

:func:`make_recurrent_policy` picks one by ``config.backend`` (``"spec"`` or ``"fast"``).
"""
from __future__ import annotations

from typing import Dict, Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref._checks import as_flag_array, as_float_array, check_count, check_same_shape
from ppo_ref.fast import workspace
from ppo_ref.fast.distributions import categorical_eval_kernel
from ppo_ref.fast.flat import FlatArrays, FlatLayout, flatten_arrays
from ppo_ref._checks import check_lstm_params
from ppo_ref.fast.lstm import (StackedArrays, all_finite, backward_stacked, forward_stacked,
                              keep_rows, step_stacked)
from ppo_ref.fast.mlp import (layer_table, mlp_backward_flat, mlp_backward_pair,
                              mlp_forward_flat, mlp_forward_pair)
from ppo_ref.spec.layers import mlp_depth
from ppo_ref.train.policies import (PolicyBase, PolicyEval, SpecPolicyBase, _finite_grad,
                                    gradient_arrays, gradient_buffer, head_backward)
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
    """What :class:`RecurrentPolicy` reads from a parameter layout it has checked once: the
    layout, ``L`` LSTMs of width ``H``, the buffer slices ``(start, stop, stacked shape)`` of
    ``w_ih [L, 4H, D]``, ``w_hh [L, 4H, H]``, ``b [L, 4H]``, and per tower the layer table of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat` (int64 ``[layers, 4]``: offsets of ``w_i`` and
    ``b_i`` in the buffer, ``out_i``, ``in_i``) and the sum of its layers' output widths (the
    per-row size of its outputs buffer)."""
    layout: FlatLayout
    n_lstm: int
    hidden: int
    lstm_slices: Tuple[Tuple[int, int, Tuple[int, ...]], ...]
    pi_table: np.ndarray
    vf_table: np.ndarray
    pi_width: int
    vf_width: int


class _FastCache(NamedTuple):
    """Cache of :meth:`RecurrentPolicy.evaluate`: the spec and ``(T, n)``, the parameter
    buffer in the compute dtype, the inputs and the stacked LSTM arrays of
    :func:`ppo_ref.fast.lstm.forward_stacked` (``h_seq [L, T, n, H]``, whose ``[T * n, H]``
    views ``pi_in``, ``vf_in`` are the towers' inputs), the towers' outputs buffers of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat`, ``policy_out [T * n, P]`` (a view of the policy
    tower's buffer), the flat actions, (categorical head) the probabilities and entropies
    (``None`` otherwise), and the :class:`ppo_ref.fast.lstm.StackedArrays` the LSTM arrays
    belong to (its backward scratch is :meth:`backward`'s)."""
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
    pi_in: np.ndarray
    vf_in: np.ndarray
    pi_acts: np.ndarray
    vf_acts: np.ndarray
    policy_out: np.ndarray
    actions: np.ndarray
    probs: object
    entropy: object
    lstm: StackedArrays


_LOGITS_ERROR = ("params give logits for these inputs that are not finite or whose spread "
                 "overflows float64 (logits - max(logits)): the parameters are too large")


def _real_array(x, name: str) -> np.ndarray:
    """``x`` as an ndarray of bools, integers or real floats; ``ValueError`` naming ``name``
    otherwise."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr


def _float64_input(x, name: str, shape: Tuple[int, ...], what: str) -> np.ndarray:
    """``x`` (bools, integers or real floats) as a finite C-contiguous float64 array of
    ``shape`` (described by ``what``); ``ValueError`` naming ``name`` otherwise."""
    arr = _real_array(x, name)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if not all_finite(arr):
        raise ValueError(f"{name} must be finite")
    return arr


def _state_arrays(state, shape: Tuple[int, int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """``state`` as finite C-contiguous float64 ``(h, c)``, each of ``shape`` ``[L, N, H]``;
    ``ValueError`` naming ``state`` otherwise."""
    try:
        h, c = state
    except (TypeError, ValueError):
        raise ValueError(f"state must be a pair (h, c) (LSTMStates), got "
                         f"{type(state).__name__}") from None
    return (_float64_input(h, "state.h", shape, "[L, N, H]"),
            _float64_input(c, "state.c", shape, "[L, N, H]"))


def _tower_forward(x: np.ndarray, flat: np.ndarray, table: np.ndarray, width: int,
                   relu: bool):
    """A tower forward: ``(acts, y)``, the outputs buffer ``[rows * width]`` of
    :func:`ppo_ref.fast.mlp.mlp_forward_flat` (its backward reads it) and the tower output
    ``y [rows, out]``, a view of its last ``rows * out`` entries."""
    rows = x.shape[0]
    acts = np.empty(rows * width, flat.dtype)
    mlp_forward_flat(x, flat, table, relu, acts)
    n_out = int(table[-1, 2])
    return acts, acts[rows * (width - n_out):].reshape(rows, n_out)


class _PassBuffers(NamedTuple):
    """The arrays one :meth:`RecurrentPolicy._evaluate_envs` of ``n`` envs over ``T`` steps
    (``rows = T * n``) writes: the LSTMs' :class:`ppo_ref.fast.lstm.StackedArrays` ``lstm``
    (with the backward's scratch) and the towers' inputs ``pi_in``, ``vf_in`` (``[rows, H]``
    views of its ``h_seq[0]``, ``h_seq[-1]``), the towers' outputs buffers ``pi_acts``,
    ``vf_acts`` (compute dtype, :func:`ppo_ref.fast.mlp.mlp_forward_flat`), ``out [rows, P]``
    and ``value_out [rows]`` (views of their last blocks), and for the categorical head float64
    ``log_probs``, ``entropy`` ``[rows]`` and ``probs [rows, P]`` (None for the other
    heads)."""
    lstm: StackedArrays
    pi_in: np.ndarray
    vf_in: np.ndarray
    pi_acts: np.ndarray
    vf_acts: np.ndarray
    out: np.ndarray
    value_out: np.ndarray
    log_probs: object
    entropy: object
    probs: object


def _pass_buffers(spec: _FastSpec, n_steps: int, n_env: int, d_in: int, dtype,
                  categorical: bool, pooled: bool) -> _PassBuffers:
    """:class:`_PassBuffers` for ``n_env`` envs over ``n_steps`` steps of the network ``spec``
    (``d_in`` inputs) in the compute ``dtype``; ``categorical``: the head is categorical;
    ``pooled``: the LSTM arrays from the reuse pools of :mod:`ppo_ref.fast.workspace` (else
    fresh, like the others)."""
    rows = n_steps * n_env
    hidden = spec.hidden
    lstm = StackedArrays.empty(spec.n_lstm, n_steps, n_env, d_in, hidden, dtype, pooled)
    pi_acts = workspace.aligned(rows * spec.pi_width, dtype)
    vf_acts = workspace.aligned(rows * spec.vf_width, dtype)
    n_out = int(spec.pi_table[-1, 2])
    return _PassBuffers(lstm, lstm.h_seq[0].reshape(rows, hidden),
                        lstm.h_seq[-1].reshape(rows, hidden), pi_acts, vf_acts,
                        pi_acts[rows * (spec.pi_width - n_out):].reshape(rows, n_out),
                        vf_acts[rows * (spec.vf_width - 1):],
                        np.empty(rows) if categorical else None,
                        np.empty(rows) if categorical else None,
                        np.empty((rows, n_out)) if categorical else None)


class _GroupBuffers(NamedTuple):
    """What the passes of :meth:`RecurrentPolicy._update_passes` keep per group size ``n`` (of
    ``T`` steps, ``rows = T * n``), in the compute dtype unless said: ``keep [T + 1, n]``
    (row ``T`` ones; rows ``0..T-1``, the view ``keep_steps``, written per call), the
    :class:`_PassBuffers` ``passes``, float64 ``values [rows]`` (``passes.value_out`` itself
    in float64 compute), the head's gradient ``d_out [rows, P]`` (categorical; else None),
    ``dh_seq [L, T, n, H]`` with its ``[rows, H]`` views ``dpi_in``, ``dvf_in`` (of
    ``dh_seq[0]``, ``dh_seq[-1]``), and ``d_values [rows, 1]`` with its 1-D view
    ``d_values_rows`` (float32 compute; None in float64)."""
    keep: np.ndarray
    keep_steps: np.ndarray
    passes: _PassBuffers
    values: np.ndarray
    d_out: object
    dh_seq: np.ndarray
    dpi_in: np.ndarray
    dvf_in: np.ndarray
    d_values: object
    d_values_rows: object


def _group_buffers(spec: _FastSpec, n_steps: int, n_env: int, d_in: int, dtype,
                   categorical: bool) -> _GroupBuffers:
    """Fresh :class:`_GroupBuffers` for ``n_env`` envs over ``n_steps`` steps of the network
    ``spec`` (``d_in`` inputs) in the compute ``dtype``."""
    rows = n_steps * n_env
    keep = np.ones((n_steps + 1, n_env), dtype)
    passes = _pass_buffers(spec, n_steps, n_env, d_in, dtype, categorical, False)
    low = np.dtype(dtype) != np.float64
    d_values = np.empty((rows, 1), dtype) if low else None
    dh_seq = workspace.aligned((spec.n_lstm, n_steps, n_env, spec.hidden), dtype)
    return _GroupBuffers(keep, keep[:n_steps], passes,
                         np.empty(rows) if low else passes.value_out,
                         workspace.aligned(passes.out.shape, dtype) if categorical else None,
                         dh_seq, dh_seq[0].reshape(rows, spec.hidden),
                         dh_seq[-1].reshape(rows, spec.hidden), d_values,
                         None if d_values is None else d_values.reshape(rows))


def _init_arrays(policy, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Fresh parameter arrays of a recurrent policy of either tier:
    :func:`recurrent_actor_critic_init` with the policy's sizes and ``config``, plus its head's
    (``log_std`` for a Gaussian)."""
    c = policy.config
    params = recurrent_actor_critic_init(
        rng, policy.obs_dim, policy.head.out_dim, hidden_size=policy.hidden_size,
        lstm_shared=policy.lstm_shared, net_arch=tuple(c.net_arch), activation=c.activation,
        policy_gain=c.policy_head_gain, value_gain=c.value_head_gain)
    params.update(policy.head.init_params())
    return params


class RecurrentPolicy(PolicyBase):
    """LSTM actor-critic policy, compiled tier: the network of the module docstring + a
    distribution head of :mod:`ppo_ref.train.policies`, on one parameter buffer.

    Computes what :class:`SpecRecurrentPolicy` computes, method for method (except
    :meth:`evaluate_hidden`, the towers and head of :meth:`evaluate` on LSTM outputs given,
    whose reference is this class's :meth:`evaluate`, bit for bit: ``tests/test_recurrent_fast.py``)
    (same arguments,
    same results, actions sampled with the same ``rng`` draws), within a stated tolerance,
    ``|fast - spec| <= atol + rtol * max|spec|`` per result array (log-probs, entropies,
    values, LSTM states, each gradient array): float64 ``rtol = 1e-11``, ``atol = 1e-13``
    (the ``recurrent_policy`` row of ``tests/test_tiers.py``; the LSTM recurrence is the same
    arithmetic, the towers and the categorical head round in another order);
    ``compute_dtype="float32"``: ``rtol = 2e-4``, ``atol = 1e-5`` (the
    ``recurrent_policy_float32`` row; float32 rounding through the recurrence).
    Within this class everything agrees bit for bit: one step of
    :meth:`act`, :meth:`policy_out_step`, :meth:`predict`, :meth:`values` and
    :meth:`acting_step_fn` gives an env the LSTM states, policy outputs, values and (act)
    log-probs that :meth:`evaluate` computes for it when it replays the whole sequence, with
    any other envs in the call.

    The head is the one of :class:`ppo_ref.train.policies.MLPPolicy` (:func:`ppo_ref.train.policies.make_head`:
    categorical for Discrete, diagonal Gaussian with a state-independent ``log_std`` for 1-d
    Box); the buffer keeps the raw sample, the env gets ``head.to_env(actions)``. Every method
    takes ``params`` explicitly and every acting method takes and returns the
    :class:`LSTMStates`, so the policy object itself is stateless.

    Arguments, every method (each converted and checked once per call):

    - ``params``: the :class:`~ppo_ref.fast.flat.FlatArrays` of :meth:`init_params` /
      :meth:`as_flat` (float64, in :meth:`flat_layout`, entries still views of its buffer),
      finite. A plain dict is refused (convert it with :meth:`as_flat`, or use
      :class:`SpecRecurrentPolicy`, which takes plain dicts).
    - ``obs``: real numbers ``[N, *obs_shape]`` or ``[N, obs_dim]`` (one step), ``[T, n, ...]``
      likewise (a sequence), finite; read as C-contiguous float64.
    - ``state``: a pair ``(h, c)`` (:class:`LSTMStates`) of finite real ``[L, N, H]`` arrays,
      read as C-contiguous float64.
    - ``episode_starts``: bools or 0/1 numbers, ``[N]`` (one step) or ``[T, n]``.

    Args:
        observation_space: a gymnasium Box (flattened to ``obs_dim``).
        action_space: gymnasium Discrete or 1-d Box.
        config: a PPOConfig (``lstm_hidden_size``, ``lstm_shared``, ``net_arch``,
            ``activation``, ``policy_head_gain``, ``value_head_gain``, ``log_std_init``,
            ``compute_dtype``: ``"float32"`` runs the network and the categorical head in
            float32 as torch does; parameters, states, results and gradients stay float64).

    Raises:
        ValueError: unsupported observation or action space; in the methods, an argument
            that is not of the kind above, naming it.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.lstm_shared = bool(config.lstm_shared)
        self.hidden_size = int(config.lstm_hidden_size)
        self._spec = None  # the last _FastSpec built (checked once per layout)
        self.compute_dtype = np.dtype(getattr(config, "compute_dtype", "float64"))

    # -- parameters and state -----------------------------------------------------------------
    def init_params(self, rng: np.random.Generator) -> FlatArrays:
        """Fresh parameters: :func:`recurrent_actor_critic_init` + the head's (``log_std``),
        as a :class:`~ppo_ref.fast.flat.FlatArrays` (:meth:`as_flat`); the draws of
        :meth:`SpecRecurrentPolicy.init_params`, so the same values."""
        return self.as_flat(_init_arrays(self, rng))

    def flat_layout(self, arrays: Mapping[str, np.ndarray]) -> FlatLayout:
        """The one-buffer layout of this policy's parameters: the keys in their order, stored
        with the same parameter of every LSTM side by side (``lstm_pi.w_ih``, ``lstm_vf.w_ih``,
        ``lstm_pi.w_hh``, ``lstm_vf.w_hh``, ``lstm_pi.b``, ``lstm_vf.b``; or the shared
        LSTM's three), then the other keys in order. Each LSTM parameter of the actor and the
        critic is then one ``[L, ...]`` view of the buffer. Dicts without those keys are
        stored in key order (and refused by the other methods)."""
        shapes = [(k, np.shape(v)) for k, v in arrays.items()]
        lstm_keys = [f"{name}.{k}" for k in ("w_ih", "w_hh", "b")
                     for name in lstm_names(self.lstm_shared)]
        if not all(k in arrays for k in lstm_keys):
            return FlatLayout.in_order(shapes)
        first = set(lstm_keys)
        return FlatLayout.in_order(shapes, lstm_keys + [k for k, _ in shapes if k not in first])

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> FlatArrays:
        """``arrays`` (same keys as the parameters, e.g. a plain dict of
        :class:`SpecRecurrentPolicy`) copied into one float64 buffer in :meth:`flat_layout`
        (:class:`~ppo_ref.fast.flat.FlatArrays`: still a dict of arrays, same key order and values):
        the parameters this class takes. With parameters and gradients in one layout, Adam and
        the global-norm clip of :mod:`ppo_ref.fast.optim` run one fused pass over the buffer."""
        return flatten_arrays(arrays, self.flat_layout(arrays), dtype=np.float64)

    def initial_state(self, n_envs: int) -> LSTMStates:
        """Zero :class:`LSTMStates` ``[L, n_envs, H]``; ``ValueError`` unless ``n_envs`` is an
        integer >= 1 (:func:`ppo_ref._checks.check_count`)."""
        shape = (len(lstm_names(self.lstm_shared)), check_count(n_envs, "n_envs", 1),
                 self.hidden_size)
        return LSTMStates(np.zeros(shape), np.zeros(shape))

    # -- argument checks ------------------------------------------------------------------------
    def _checked_spec(self, params) -> _FastSpec:
        """The :class:`_FastSpec` of ``params``, which must be finite float64
        :class:`~ppo_ref.fast.flat.FlatArrays` in :meth:`flat_layout` forming this policy's network
        (the structure is checked once per layout, the values every call); ``ValueError``
        naming ``params`` otherwise."""
        if type(params) is not FlatArrays:
            if isinstance(params, Mapping):
                raise ValueError(
                    f"params must be the one-buffer parameters of RecurrentPolicy (the FlatArrays "
                    f"that init_params and as_flat return), got a plain {type(params).__name__}: "
                    f"convert it with policy.as_flat(params), or use SpecRecurrentPolicy, which "
                    f"takes plain dicts")
            raise ValueError(f"params must be the FlatArrays of RecurrentPolicy.init_params / "
                             f"as_flat, got {type(params).__name__}")
        if not params.intact():
            raise ValueError("params: entries of this FlatArrays were replaced or removed (they "
                             "are no longer views of its buffer); rebuild it with as_flat")
        if params.flat.dtype != np.float64:
            raise ValueError(f"params must hold float64 (as_flat), got {params.flat.dtype}")
        spec = self._spec
        if spec is None or params.layout != spec.layout:
            spec = self._spec = self._make_spec(params)
        if not all_finite(params.flat):
            bad = next(k for k, v in params.items() if not np.isfinite(v).all())
            raise ValueError(f"params['{bad}'] must be finite")
        return spec

    def _make_spec(self, params: FlatArrays) -> _FastSpec:
        """The :class:`_FastSpec` of a float64 ``params`` (``ValueError`` naming ``params``
        when it is not this policy's network in :meth:`flat_layout`)."""
        names = lstm_names(self.lstm_shared)
        try:
            _check_lstm_shared(params, self.lstm_shared)
            shapes = set()
            for name in names:
                try:
                    shapes.add(tuple(a.shape for a in check_lstm_params(_sub(params, name))))
                except ValueError as exc:
                    raise ValueError(f"'{name}.*': {exc}") from None
            pi_depth, vf_depth = mlp_depth(params, "pi."), mlp_depth(params, "vf.")
        except ValueError as exc:
            raise ValueError(f"params are not this policy's network: {exc}") from None
        if len(shapes) != 1:
            raise ValueError(f"params: the LSTMs {list(names)} must have the same shapes, got "
                             f"{sorted(shapes)}")
        (w_ih_shape, w_hh_shape, _), = shapes
        hidden = w_hh_shape[1]
        keys = {f"{name}.{k}" for name in names for k in ("w_ih", "w_hh", "b")}
        keys |= {f"{tower}.{k}{i}" for tower, depth in (("pi", pi_depth), ("vf", vf_depth))
                 for i in range(depth) for k in ("w", "b")} | set(self._head_keys)
        pi = [params[f"pi.w{i}"] for i in range(pi_depth)]
        vf = [params[f"vf.w{i}"] for i in range(vf_depth)]
        problems = []
        if w_ih_shape[1] != self.obs_dim:
            problems.append(f"the LSTM input width is {w_ih_shape[1]}, obs_dim is "
                            f"{self.obs_dim}")
        if pi[0].shape[1] != hidden or vf[0].shape[1] != hidden:
            problems.append(f"the towers' input widths are {pi[0].shape[1]} and "
                            f"{vf[0].shape[1]}, the LSTM width is {hidden}")
        if pi[-1].shape[0] != self.head.out_dim:
            problems.append(f"the policy tower has {pi[-1].shape[0]} outputs, the head "
                            f"reads {self.head.out_dim}")
        if vf[-1].shape[0] != 1:
            problems.append(f"the value tower has {vf[-1].shape[0]} outputs, not 1")
        if set(params) != keys:
            problems.append(f"keys {sorted(set(params) ^ keys)} are extra or missing")
        for k, v in self.head.init_params().items():
            if k in params and np.shape(params[k]) != np.shape(v):
                problems.append(f"params['{k}'] has shape {np.shape(params[k])}, expected "
                                f"{np.shape(v)}")
        if problems:
            raise ValueError("params are not this policy's network: " + "; ".join(problems))
        layout = params.layout
        if layout != self.flat_layout(params):
            raise ValueError("params are FlatArrays in another layout than this policy's "
                             "flat_layout: convert them with policy.as_flat(params)")
        n_lstm = len(names)
        slices = []
        for k, shape in (("w_ih", w_ih_shape), ("w_hh", w_hh_shape), ("b", (4 * hidden,))):
            start = layout.offset(f"{names[0]}.{k}")
            size = n_lstm * int(np.prod(shape))
            slices.append((start, start + size, (n_lstm,) + tuple(shape)))
        return _FastSpec(layout, n_lstm, hidden, tuple(slices),
                         layer_table(layout, params, "pi.", pi_depth),
                         layer_table(layout, params, "vf.", vf_depth),
                         sum(w.shape[0] for w in pi), sum(w.shape[0] for w in vf))

    def _obs_input(self, obs, lead: int) -> np.ndarray:
        """``obs`` ``[*lead_dims, *obs_shape]`` or ``[*lead_dims, obs_dim]`` (``lead`` = 1 for
        one step, 2 for a sequence; every lead dim >= 1) as finite C-contiguous float64
        ``[*lead_dims, obs_dim]``; ``ValueError`` naming ``obs`` otherwise."""
        arr = _real_array(obs, "obs")
        dims = arr.shape[:lead]
        if (arr.ndim <= lead or arr.shape[lead:] not in (self.obs_shape, (self.obs_dim,))
                or 0 in dims):
            lead_names = "[N, " if lead == 1 else "[T, n, "
            raise ValueError(f"obs must have shape {lead_names}*{list(self.obs_shape)}] or "
                             f"{lead_names}{self.obs_dim}] with non-empty leading dimensions, "
                             f"got {arr.shape}")
        x = np.ascontiguousarray(arr, dtype=np.float64).reshape(dims + (self.obs_dim,))
        if not all_finite(x):
            raise ValueError("obs must be finite")
        return x

    @staticmethod
    def _state_input(spec: _FastSpec, state, n_env: int) -> Tuple[np.ndarray, np.ndarray]:
        """``state`` as finite C-contiguous float64 ``(h, c)``, each ``[L, n_env, H]`` (``L``,
        ``H`` of ``spec``); ``ValueError`` naming ``state`` otherwise."""
        return _state_arrays(state, (spec.n_lstm, n_env, spec.hidden))

    @staticmethod
    def _flags_input(episode_starts, shape: Tuple[int, ...]) -> np.ndarray:
        """``episode_starts`` (bools or 0/1 numbers) as a bool array of ``shape``."""
        starts = as_flag_array(episode_starts, "episode_starts", ndim=(len(shape),))
        if starts.shape != shape:
            raise ValueError(f"episode_starts must have shape {shape} (the leading dimensions "
                             f"of obs), got {starts.shape}")
        return starts

    def _step_inputs(self, spec: _FastSpec, obs, state, episode_starts):
        """One step's ``(x [N, D], h, c [L, N, H], starts [N])``, converted and checked, with
        ``x``, ``h``, ``c`` in the compute dtype."""
        x = self._obs_input(obs, 1)
        n = x.shape[0]
        h, c = self._state_input(spec, state, n)
        starts = self._flags_input(episode_starts, (n,))
        dt = self.compute_dtype
        if dt != np.float64:
            x, h, c = x.astype(dt), h.astype(dt), c.astype(dt)
        return x, h, c, starts

    def _actions_input(self, actions, shape: Tuple[int, int]) -> np.ndarray:
        """``actions`` of a ``[T, n]`` sequence as the flat C-contiguous array the head reads:
        int64 ``[T * n]`` in ``[0, n_actions)`` (categorical; integral floats accepted) or
        finite float64 ``[T * n, A]`` (Gaussian); ``ValueError`` naming ``actions``."""
        rows = shape[0] * shape[1]
        head = self.head
        if head.kind != "categorical":
            want = tuple(shape) + head.action_shape
            return _float64_input(actions, "actions", want, "[T, n, A]").reshape(
                (rows,) + head.action_shape)
        a = _real_array(actions, "actions")
        if a.dtype.kind == "b":
            raise ValueError("actions must be integers, got dtype bool")
        if a.shape != tuple(shape):
            raise ValueError(f"actions must have shape [T, n] = {tuple(shape)}, got {a.shape}")
        if a.dtype.kind == "f" and not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise ValueError("actions must hold integer values; got non-integral floats")
        if a.min() < 0 or a.max() >= head.n_actions:
            bad = a[(a < 0) | (a >= head.n_actions)].flat[0]
            raise ValueError(f"actions must be in [0, {head.n_actions}), got {bad}")
        return np.ascontiguousarray(a, dtype=np.int64).reshape(rows)

    # -- the compiled pieces --------------------------------------------------------------------
    @staticmethod
    def _stacked(spec: _FastSpec, flat: np.ndarray):
        """``(w_ih [L, 4H, D], w_hh [L, 4H, H], b [L, 4H])`` views of a buffer in ``spec``'s layout."""
        return tuple(flat[start:stop].reshape(shape) for start, stop, shape in spec.lstm_slices)

    def _step_weights(self, spec: _FastSpec, flat: np.ndarray, first: int = 0):
        """``(w_ih_t [L', D, 4H], w_hh_t [L', H, 4H], b [L', 4H])``: the stacked LSTM weights
        of ``flat`` from LSTM ``first`` on, transposed (C-contiguous copies) for stepping."""
        w_ih, w_hh, b = self._stacked(spec, flat)
        return (np.ascontiguousarray(w_ih[first:].transpose(0, 2, 1)),
                np.ascontiguousarray(w_hh[first:].transpose(0, 2, 1)), b[first:])

    def _compute_flat(self, params: FlatArrays) -> np.ndarray:
        """The parameter buffer in the compute dtype (the caller's own buffer for float64; one
        cast copy for float32)."""
        if self.compute_dtype == np.float64:
            return params.flat
        return params.flat.astype(self.compute_dtype)

    def _tower(self, spec: _FastSpec, flat: np.ndarray, h: np.ndarray, value: bool):
        """The policy (``value`` False) or value tower of ``flat`` on rows ``h [rows, H]``:
        ``(acts, y)`` of :func:`_tower_forward`."""
        table, width = (spec.vf_table, spec.vf_width) if value else (spec.pi_table,
                                                                     spec.pi_width)
        return _tower_forward(h, flat, table, width, self.activation == "relu")

    def _head_eval(self, out: np.ndarray, params, actions: np.ndarray, into=None):
        """``(log_probs [B], entropy [B], probs)`` of the head at ``out [B, P]`` (compute
        dtype) for flat ``actions``: categorical by the compiled pass
        :func:`ppo_ref.fast.distributions.categorical_eval_kernel` (``probs [B, P]`` kept for
        the backward) into the float64 arrays ``into = (log_probs, entropy, probs)`` (None: new
        ones), Gaussian by the head's functions (``probs`` None; ``into`` unused). Row by row,
        so a row gets the same bits in any call. ``ValueError`` when the network's logits are
        not finite (parameters too large for these inputs)."""
        rows = out.shape[0]
        if self.head.kind == "categorical":
            if into is None:
                into = np.empty(rows), np.empty(rows), np.empty(out.shape)
            log_probs, entropy, probs = into
            if not categorical_eval_kernel(out, actions, log_probs, entropy, probs):
                raise ValueError(_LOGITS_ERROR)
            return log_probs, entropy, probs
        log_probs = np.asarray(self.head.log_prob(out, params, actions), dtype=np.float64)
        entropy = np.asarray(self.head.entropy(out, params), dtype=np.float64)
        return log_probs, entropy, None

    def _step(self, params, obs, state, episode_starts, first: int = 0):
        """One checked step of the LSTMs from ``first`` on: ``(spec, flat, h_new, c_new)``,
        the parameter buffer and the new states ``[L - first, N, H]`` in the compute dtype
        (:func:`ppo_ref.fast.lstm.step_stacked`: the arithmetic of the replay's LSTM kernel)."""
        spec = self._checked_spec(params)
        x, h, c, starts = self._step_inputs(spec, obs, state, episode_starts)
        flat = self._compute_flat(params)
        h_new, c_new = step_stacked(*self._step_weights(spec, flat, first), x, h[first:],
                                     c[first:], starts)
        return spec, flat, h_new, c_new

    # -- acting -------------------------------------------------------------------------------
    def act(self, params, obs, state: LSTMStates, episode_starts, rng):
        """One acting step for N envs: sample actions and advance the LSTM state.

        ``policy_out, new_state = policy_out_step(...)``; ``actions ~ head(policy_out)``
        drawn with ``rng`` (the draws of :meth:`SpecRecurrentPolicy.act`); ``values`` the
        value tower on the critic LSTM's new hidden state; ``log_probs`` of the actions.

        Args:
            params, obs ``[N, ...]``, state ``[L, N, H]`` (before this step), episode_starts
            ``[N]``: as the class docstring; rng: a ``np.random.Generator``.

        Returns:
            ``(actions, values, log_probs, new_state)``: raw actions (int64 ``[N]`` or float64
            ``[N, A]``), float64 ``values [N]`` and ``log_probs [N]`` (the bits
            :meth:`evaluate` gives these rows), the new :class:`LSTMStates` (float64).

        Raises:
            ValueError: naming the argument (class docstring).
        """
        spec, flat, h_new, c_new = self._step(params, obs, state, episode_starts)
        out_c = self._tower(spec, flat, h_new[0], value=False)[1]
        values = self._tower(spec, flat, h_new[-1], value=True)[1][:, 0].astype(np.float64)
        actions = self.head.sample(rng, out_c.astype(np.float64, copy=False), params)
        log_probs = self._head_eval(out_c, params, actions)[0]
        return actions, values, log_probs, LSTMStates(h_new.astype(np.float64, copy=False),
                                                      c_new.astype(np.float64, copy=False))

    def policy_out_step(self, params, obs, state: LSTMStates, episode_starts):
        """``(policy_out [N, P], new_state)``: one step of every LSTM and the policy tower only
        (what acting needs when values and log-probs are recomputed later by a replay).

        The policy outputs (float64) are the bits :meth:`evaluate` gives these rows (in
        float32 compute: float32 values); arguments and errors as :meth:`act`.
        """
        spec, flat, h_new, c_new = self._step(params, obs, state, episode_starts)
        out = self._tower(spec, flat, h_new[0], value=False)[1]
        return out.astype(np.float64, copy=False), LSTMStates(
            h_new.astype(np.float64, copy=False), c_new.astype(np.float64, copy=False))

    def acting_step_fn(self, params):
        """``step(obs, state, episode_starts) -> (policy_out, new_state)``: :meth:`policy_out_step`
        for many steps with fixed ``params`` (one rollout), the same bits.

        ``params`` are checked and copied, and the weights transposed (and cast to the compute
        dtype), once, here; each step converts and checks its arguments (as
        :meth:`policy_out_step`) and is one compiled call for both LSTMs and one for the
        policy tower. (In float32 the state is carried as float64 arrays holding float32
        values.)

        Raises:
            ValueError: ``params`` here, the step's arguments at each step, naming them.
        """
        spec = self._checked_spec(params)
        flat = self._compute_flat(params).copy()   # this rollout's parameters, kept apart
        w_ih_t, w_hh_t, b = self._step_weights(spec, flat)
        table, width = spec.pi_table, spec.pi_width
        relu = self.activation == "relu"

        def step(obs, state, episode_starts):
            x, h, c, starts = self._step_inputs(spec, obs, state, episode_starts)
            h_new, c_new = step_stacked(w_ih_t, w_hh_t, b, x, h, c, starts)
            out = _tower_forward(h_new[0], flat, table, width, relu)[1]   # the policy tower
            return out.astype(np.float64, copy=False), LSTMStates(
                h_new.astype(np.float64, copy=False), c_new.astype(np.float64, copy=False))
        return step

    def predict(self, params, obs, state: LSTMStates, episode_starts, rng=None,
                deterministic: bool = False):
        """``(env_actions, new_state)``: actions as the env receives them (Gaussian: clipped).

        ``deterministic=True`` takes the mode (argmax / mean) of :meth:`policy_out_step`'s
        outputs; otherwise they are sampled with ``rng`` (required; the draws of :meth:`act`).

        Raises:
            ValueError: no ``rng`` with ``deterministic=False``; the arguments as :meth:`act`.
        """
        if not deterministic and rng is None:
            raise ValueError("rng is required when deterministic=False")
        out, new_state = self.policy_out_step(params, obs, state, episode_starts)
        if deterministic:
            actions = self.head.mode(out, params)
        else:
            actions = self.head.sample(rng, out, params)
        return self.head.to_env(actions), new_state

    def values(self, params, obs, state: LSTMStates, episode_starts) -> np.ndarray:
        """``V(obs | state)`` float64 ``[N]`` after one step of the critic's LSTM; ``state`` is
        not advanced. The bits :meth:`evaluate` (and :meth:`act`) give these rows.

        For bootstrapping: ``last_values`` (the next rollout will step the same observation
        again from the same state) and ``final_values`` (the state before the reset, with
        ``episode_starts`` all False). Arguments and errors as :meth:`act`.
        """
        spec, flat, h_new, _ = self._step(params, obs, state, episode_starts,
                                          first=len(lstm_names(self.lstm_shared)) - 1)
        return self._tower(spec, flat, h_new[0], value=True)[1][:, 0].astype(np.float64)

    # -- training -----------------------------------------------------------------------------
    def evaluate(self, params, obs, actions, state: LSTMStates, episode_starts):
        """Replay whole sequences: log-probs of ``actions``, entropies and values, plus a cache.

        ``policy_out, values = network(obs | state, episode_starts)`` over all T steps (as
        :func:`recurrent_actor_critic_forward`), then ``log_probs = log pi(actions |
        policy_out)`` and ``entropy = H[pi(. | policy_out)]`` of the head.

        Args:
            params: as the class docstring.
            obs: ``[T, n, *obs_shape]`` or ``[T, n, obs_dim]``.
            actions: ``[T, n]`` integers in ``[0, n_actions)`` (integral floats accepted) or
                ``[T, n, A]`` finite raw samples.
            state: :class:`LSTMStates` ``[L, n, H]`` before step 0 (the stored rollout-start
                state).
            episode_starts: ``[T, n]`` bools or 0/1 numbers.

        Returns:
            :class:`ppo_ref.train.policies.PolicyEval` with float64 ``log_probs``, ``entropy``,
            ``values`` ``[T, n]`` and the cache :meth:`backward` needs.

        Raises:
            ValueError: naming the argument (class docstring; ``actions`` of the wrong shape,
                kind or range); non-finite logits from these ``params``.
        """
        spec = self._checked_spec(params)
        x = self._obs_input(obs, 2)
        T, n = x.shape[:2]
        h0, c0 = self._state_input(spec, state, n)
        starts = self._flags_input(episode_starts, (T, n))
        flat_actions = self._actions_input(actions, (T, n))
        dt = self.compute_dtype
        flat = self._compute_flat(params)
        if dt != np.float64:
            x, h0, c0 = x.astype(dt), h0.astype(dt), c0.astype(dt)
        keep = keep_rows(starts, dt)
        buffers = _pass_buffers(spec, T, n, x.shape[2], dt, self.head.kind == "categorical",
                                True)
        log_probs, entropy, values, cache = self._evaluate_envs(
            params, spec, flat, self._stacked(spec, flat), x, h0, c0, keep, flat_actions, buffers)
        return PolicyEval(log_probs.reshape(T, n), entropy.reshape(T, n),
                          values.astype(np.float64).reshape(T, n), cache)

    def _evaluate_envs(self, params, spec: _FastSpec, flat: np.ndarray, stacked, x, h0, c0,
                       keep, actions, buffers: _PassBuffers):
        """:meth:`evaluate` of checked arguments, unchecked: ``spec`` is
        ``self._checked_spec(params)``, ``flat`` the parameter buffer in the compute dtype and
        ``stacked`` its ``self._stacked(spec, flat)`` views; ``x [T, n, D]``, ``h0, c0 [L, n,
        H]`` and ``keep [T + 1, n]`` (:func:`ppo_ref.fast.lstm.keep_rows` of the flags) are
        C-contiguous in the compute dtype, ``actions`` as :meth:`_actions_input` gives them;
        the towers and the head write into ``buffers`` (:class:`_PassBuffers` of ``T * n``
        rows). Returns ``(log_probs, entropy, value_out, cache)``: float64 ``[T * n]`` rows
        (row ``t * n + j``), the value tower's outputs ``[T * n]`` in the compute dtype, and the
        :class:`_FastCache` :meth:`backward` reads. Both LSTMs run in one compiled call
        (:func:`ppo_ref.fast.lstm.forward_stacked`), both towers in one
        (:func:`ppo_ref.fast.mlp.mlp_forward_pair`), the categorical head in one
        (:func:`ppo_ref.fast.distributions.categorical_eval_kernel`)."""
        relu = self.activation == "relu"
        b = buffers
        h_seq, h_prev, c_prev, gates, tanh_c = forward_stacked(*stacked, x, h0, c0, keep, b.lstm)
        mlp_forward_pair(flat, relu, b.pi_in, spec.pi_table, b.pi_acts, b.vf_in, spec.vf_table,
                         b.vf_acts)
        log_probs, entropy, _ = self._head_eval(b.out, params, actions,
                                                (b.log_probs, b.entropy, b.probs))
        cache = _FastCache(spec, x.shape[:2], flat, x, keep, h_seq, h_prev, c_prev, gates,
                           tanh_c, b.pi_in, b.vf_in, b.pi_acts, b.vf_acts, b.out, actions,
                           b.probs, b.entropy, b.lstm)
        return log_probs, entropy, b.value_out, cache

    def evaluate_hidden(self, params, hidden, actions) -> PolicyEval:
        """:meth:`evaluate` of ``[T, n]`` rows whose LSTM outputs are already known: the towers
        and the head on ``hidden``, without the recursion.

        ``hidden`` holds, for every LSTM, ``h`` after every step: what :meth:`evaluate`
        computes as ``h_seq``, and what the new states of :meth:`act` /
        :meth:`acting_step_fn` hold step by step (the same bits). Given those, the results
        are :meth:`evaluate`'s bit for bit (the towers and the head compute each row on its
        own).

        Args:
            params: as the class docstring.
            hidden: finite real ``[L, T, n, H]`` (read as float64, then the compute dtype).
            actions: as :meth:`evaluate`, ``[T, n]`` or ``[T, n, A]``.

        Returns:
            :class:`ppo_ref.train.policies.PolicyEval` with float64 ``log_probs``, ``entropy``,
            ``values`` ``[T, n]``; ``cache`` is None (no :meth:`backward` from it).

        Raises:
            ValueError: naming the argument (``hidden`` of another shape or not finite, the
                others as :meth:`evaluate`).
        """
        spec = self._checked_spec(params)
        arr = _real_array(hidden, "hidden")
        if arr.ndim != 4 or arr.shape[0] != spec.n_lstm or arr.shape[3] != spec.hidden \
                or 0 in arr.shape:
            raise ValueError(f"hidden must have shape [L, T, n, H] with L = {spec.n_lstm}, "
                             f"H = {spec.hidden} and T, n >= 1, got {arr.shape}")
        h = _float64_input(arr, "hidden", arr.shape, "[L, T, n, H]")
        T, n = h.shape[1:3]
        rows = T * n
        flat_actions = self._actions_input(actions, (T, n))
        dt = self.compute_dtype
        flat = self._compute_flat(params)
        if dt != np.float64:
            h = h.astype(dt)
        _, out = self._tower(spec, flat, h[0].reshape(rows, spec.hidden), value=False)
        _, values = self._tower(spec, flat, h[-1].reshape(rows, spec.hidden), value=True)
        log_probs, entropy, _ = self._head_eval(out, params, flat_actions)
        return PolicyEval(log_probs.reshape(T, n), entropy.reshape(T, n),
                          values.astype(np.float64).reshape(T, n), None)

    def backward(self, params, cache, d_log_probs, d_entropy, d_values) -> FlatArrays:
        """Gradients of ``sum(d_log_probs * log_probs + d_entropy * entropy + d_values *
        values)`` over the ``[T, n]`` rows of the :meth:`evaluate` call that made ``cache``,
        w.r.t. every parameter, through the head, the towers and the LSTM(s) over all T steps
        (BPTT, cut only at episode starts).

        Args:
            params: the parameters given to that :meth:`evaluate` (same layout).
            cache: its ``PolicyEval.cache``.
            d_log_probs, d_values: finite ``[T, n]``; d_entropy: finite ``[T, n]`` or None.

        Returns:
            float64 :class:`~ppo_ref.fast.flat.FlatArrays` in the layout of ``params`` (float64
            compute: a buffer of the reuse pools of :mod:`ppo_ref.fast.workspace`, handed out
            again once the caller drops it; float32: computed in float32, then widened into a
            new buffer).

        Raises:
            ValueError: naming the argument: ``cache`` not made by :meth:`evaluate` of this
                layout, ``params`` as the class docstring, gradients of the wrong shape or not
                finite.
        """
        if not isinstance(cache, _FastCache):
            raise ValueError(f"cache must be the cache of RecurrentPolicy.evaluate, got "
                             f"{type(cache).__name__}")
        spec = self._checked_spec(params)
        if spec.layout != cache.spec.layout:
            raise ValueError("params must be in the layout of the params given to the "
                             "evaluate call that made cache")
        T, n = cache.shape
        d_lp = _finite_grad(d_log_probs, "d_log_probs", cache.shape)
        d_v = _finite_grad(d_values, "d_values", cache.shape)
        d_ent = None if d_entropy is None else _finite_grad(d_entropy, "d_entropy", cache.shape)
        dt = self.compute_dtype
        spec = cache.spec
        g_flat = gradient_buffer("policy.grads", spec.layout, dt, self._head_keys)
        dh_seq = workspace.empty("policy.dh_seq", (spec.n_lstm, T, n, spec.hidden), dt)
        head_grads = self._backward_envs(
            params, cache, self._stacked(spec, cache.flat)[1], d_lp, d_ent,
            np.ascontiguousarray(d_v.reshape(T * n, 1), dtype=dt), g_flat,
            self._stacked(spec, g_flat),
            None, dh_seq,
            dh_seq[0].reshape(T * n, spec.hidden), dh_seq[-1].reshape(T * n, spec.hidden),
            None)   # the backward's scratch from this thread's pools: a cache may be shared
        return gradient_arrays(g_flat, spec.layout, head_grads)

    def _backward_envs(self, params, cache: _FastCache, w_hh, d_lp, d_ent, d_v, g, g_stacked,
                       d_out, dh_seq, dpi_in, dvf_in, lstm_arrays) -> dict:
        """:meth:`backward` of checked arguments, unchecked: ``cache`` from
        :meth:`_evaluate_envs` (or :meth:`evaluate`) with ``params``, ``w_hh`` the ``[L, 4H,
        H]`` view of its parameter buffer, ``d_lp`` (and ``d_ent`` or None) finite C-contiguous
        float64 ``[T * n]``, ``d_v`` C-contiguous ``[T * n, 1]`` in the compute dtype.

        Writes every network gradient into ``g`` (1-D, the compute dtype, in the parameters'
        layout; the head's own entries are not written), whose ``(w_ih, w_hh, b)`` views are
        ``g_stacked``, and returns the head's own gradients (``{"log_std": ...}`` or none).
        Scratch it overwrites: ``d_out`` (the categorical head's ``[T * n, P]`` gradient, in
        the compute dtype; None: a new array; unused by the other heads), ``dh_seq [L, T, n,
        H]``, whose ``[T * n, H]`` views of ``dh_seq[0]``, ``dh_seq[-1]`` are ``dpi_in``,
        ``dvf_in``, and the backward scratch of ``lstm_arrays`` (``cache.lstm``, or None:
        arrays of the calling thread's reuse pools). The categorical head in one compiled pass
        (:func:`ppo_ref.train.policies.head_backward`), the towers, which add ``dL/dh`` into
        ``dh_seq`` (separate LSTMs: both in one :func:`ppo_ref.fast.mlp.mlp_backward_pair`; a
        shared LSTM: one :func:`ppo_ref.fast.mlp.mlp_backward_flat` each, the value tower's
        terms continuing the policy tower's sums), both LSTMs in one
        (:func:`ppo_ref.fast.lstm.backward_stacked`)."""
        spec = cache.spec
        d_out, head_grads = head_backward(self.head, params, cache.policy_out, cache.actions,
                                          cache.probs, cache.entropy, d_lp, d_ent,
                                          self.compute_dtype, d_out)
        relu = self.activation == "relu"
        flat = cache.flat
        dh_seq[...] = 0.0
        if spec.n_lstm == 2:   # each tower adds into its own LSTM's dh: the two at once
            mlp_backward_pair(flat, relu, g, cache.pi_in, cache.pi_acts, spec.pi_table, d_out,
                              dpi_in, cache.vf_in, cache.vf_acts, spec.vf_table, d_v, dvf_in)
        else:
            mlp_backward_flat(cache.pi_in, cache.pi_acts, flat, spec.pi_table, relu, d_out, g,
                              dpi_in)
            mlp_backward_flat(cache.vf_in, cache.vf_acts, flat, spec.vf_table, relu, d_v, g,
                              dvf_in)
        backward_stacked(w_hh, cache.x, cache.h_prev, cache.c_prev, cache.gates, cache.tanh_c,
                         cache.keep, dh_seq, *g_stacked, lstm_arrays)
        return head_grads

    def _update_passes(self, obs, actions, state, episode_starts):
        """The rollout of one PPO update checked once, and the passes its whole-env minibatches
        run: ``(x, a, start, keep, evaluate, backward)`` for :func:`ppo_ref.fast.update.run_epochs`
        (``RecurrentPPOTrainer.train_on`` on the fast backend is the one caller).

        ``x`` (``obs [T, N, ...]``), ``a`` (``actions``, int64 ``[T, N]`` or float64 ``[T, N,
        A]``), ``start`` (``state``, :class:`LSTMStates` ``[L, N, H]`` with ``L`` and ``H`` of
        this policy's config) and ``keep`` (``1 - episode_starts``, ``[T, N]``) are the
        arguments checked and converted as :meth:`evaluate` does (``ValueError`` as it raises),
        ``x``, ``start`` and ``keep`` in the compute dtype. Each minibatch's ``data`` must be
        ``(x[:, g], a[:, g], LSTMStates(start.h[:, g], start.c[:, g]), keep[:, g])`` for a
        group ``g`` of envs (C-contiguous gathers, as
        :func:`ppo_ref.fast.update.recurrent_minibatches` makes them from these four arrays), so
        it is not checked again.

        ``evaluate(params, data)`` is :meth:`evaluate` of that group (results flattened to
        ``[T * n]`` rows, row ``t * n + j``; the values it computes, bit for bit) and
        ``backward(params, cache, d_log_probs, d_entropy, d_values)`` is :meth:`backward` (same
        bits), with these checks left out: ``params`` is checked in full at the first call and
        whenever it is another object than the one checked (run_epochs hands out one buffer of
        its own, written only by its step, which undoes a step whose results are not finite;
        each call still checks that its entries are views of it); the upstream gradients are
        those of run_epochs' own loss (finite float64 ``[T * n]``). ``backward`` writes every
        gradient into one FlatArrays of this update, overwritten at each call (run_epochs'
        step reads it before the next minibatch). Likewise ``evaluate`` writes its results
        (log-probs, entropies, values and the arrays of its towers and head) into
        :class:`_GroupBuffers` of this update, one set per group size, overwritten at the next
        call of that size (the LSTM arrays and the backward's scratch too: their
        :class:`ppo_ref.fast.lstm.StackedArrays`): the epoch loop reads them (loss, backward)
        before it evaluates the next minibatch. The float32 compute
        dtype's parameter copy is one buffer of this update too, rewritten at each call."""
        x = self._obs_input(obs, 2)
        T, N = x.shape[:2]
        L, H = len(lstm_names(self.lstm_shared)), self.hidden_size
        h0, c0 = _state_arrays(state, (L, N, H))
        dt = self.compute_dtype
        keep = keep_rows(self._flags_input(episode_starts, (T, N)), dt)[:T]
        a = self._actions_input(actions, (T, N))
        a = a.reshape((T, N) + a.shape[1:])
        low = dt != np.float64
        if low:
            x, h0, c0 = x.astype(dt), h0.astype(dt), c0.astype(dt)
        categorical = self.head.kind == "categorical"
        rows_shape = self.head.action_shape
        checked = [None, None]  # the params object checked, its _FastSpec
        buffers = {}  # n -> _GroupBuffers of checked[1]'s network
        weights = [None, None]  # the compute buffer of the last call, its stacked views
        flat_low = []  # the compute-dtype copy of the parameters (float32)
        grads = []  # the update's gradient FlatArrays, its compute buffer, that one's views

        def evaluate(params, data):
            x_g, a_g, start_g, keep_g = data
            if params is not checked[0] or not params.intact():
                spec = self._checked_spec(params)
                if spec is not checked[1]:
                    if (spec.n_lstm, spec.hidden) != (L, H):  # evaluate's error for the state
                        self._state_input(spec, start_g, x_g.shape[1])
                    buffers.clear()
                    flat_low.clear()
                    grads.clear()
                    weights[0] = None
                checked[1] = spec
                checked[0] = params
            spec = checked[1]
            n = x_g.shape[1]
            b = buffers.get(n)
            if b is None:
                b = buffers[n] = _group_buffers(spec, T, n, x.shape[2], dt, categorical)
            if low:
                if not flat_low:
                    flat_low.append(workspace.aligned(params.flat.size, dt))
                flat = flat_low[0]
                flat[...] = params.flat  # rounded as astype rounds
            else:
                flat = params.flat
            if flat is not weights[0]:
                weights[0], weights[1] = flat, self._stacked(spec, flat)
            b.keep_steps[...] = keep_g
            log_probs, entropy, value_out, cache = self._evaluate_envs(
                params, spec, flat, weights[1], x_g, start_g.h, start_g.c, b.keep,
                a_g.reshape((T * n,) + rows_shape), b.passes)
            if low:
                b.values[...] = value_out  # float32 -> float64: exact
            return log_probs, entropy, b.values, (cache, b, weights[1][1])

        def backward(params, cache, d_log_probs, d_entropy, d_values):
            cache, b, w_hh = cache
            if not grads:
                layout = params.layout
                out = FlatArrays.from_buffer(workspace.aligned(layout.size, np.float64, True),
                                             layout)
                g = workspace.aligned(layout.size, dt, True) if low else out.flat
                grads.extend((out, g, self._stacked(checked[1], g)))
            out, g, g_stacked = grads
            if low:
                b.d_values_rows[...] = d_values  # rounded as astype rounds
                d_v = b.d_values
            else:
                d_v = d_values.reshape(d_values.shape[0], 1)
            head_grads = self._backward_envs(params, cache, w_hh, d_log_probs, d_entropy, d_v,
                                             g, g_stacked, b.d_out, b.dh_seq, b.dpi_in,
                                             b.dvf_in, cache.lstm)
            if low:
                out.flat[...] = g  # float32 -> float64: exact
            for k, v in head_grads.items():
                out[k][...] = v
            return out
        return x, a, LSTMStates(h0, c0), keep, evaluate, backward


class SpecRecurrentPolicy(SpecPolicyBase):
    """The recurrent policy of the readable tier (``PPOConfig.backend = "spec"``).

    The LSTM actor-critic of :mod:`ppo_ref.spec.recurrent_networks` (the LSTM of
    :mod:`ppo_ref.spec.lstm`, plain NumPy, float64) plus the head of
    :func:`ppo_ref.train.policies.make_head`. Parameters are a plain dict with the keys, shapes and
    initial values of :class:`RecurrentPolicy`'s (the same draws), so checkpoints move between
    the backends; every method computes what its :class:`RecurrentPolicy` namesake documents.
    :class:`RecurrentPolicy` equals this class within the tolerance its docstring states.

    Raises:
        ValueError: unsupported spaces; ``config.compute_dtype`` other than float64.
    """

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.lstm_shared = bool(config.lstm_shared)
        self.hidden_size = int(config.lstm_hidden_size)

    def init_params(self, rng: np.random.Generator) -> Params:
        """Fresh parameters (:func:`recurrent_actor_critic_init` + the head's)."""
        return _init_arrays(self, rng)

    def as_flat(self, arrays: Mapping[str, np.ndarray]) -> Params:
        """A float64 copy of a parameter-shaped dict, as a plain dict (no one-buffer layout
        in this tier; the name matches :meth:`RecurrentPolicy.as_flat`)."""
        return {k: np.array(v, dtype=np.float64) for k, v in arrays.items()}

    def initial_state(self, n_envs: int) -> LSTMStates:
        """Zero :class:`LSTMStates` ``[L, n_envs, H]``; ``ValueError`` unless ``n_envs`` is an
        integer >= 1 (:func:`ppo_ref._checks.check_count`)."""
        shape = (len(lstm_names(self.lstm_shared)), check_count(n_envs, "n_envs", 1),
                 self.hidden_size)
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
        rows = net_cache.lstm[0].x.shape[:2]  # [T, n] of evaluate
        for name, d in (("d_log_probs", d_log_probs), ("d_entropy", d_entropy),
                        ("d_values", d_values)):
            if d is not None:
                check_same_shape(as_float_array(d, name), name, rows, "the rows of evaluate [T, n]")
        T, n = rows
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
