"""The LSTM with episode resets: one step, the loop over steps, and BPTT.

The cell of Hochreiter & Schmidhuber (1997, Neural Computation 9(8)) with the forget gate of
Gers, Schmidhuber & Cummins (2000), parametrised as ``torch.nn.LSTM``: the gate blocks of
``w_ih [4H, D]``, ``w_hh [4H, H]`` and ``b [4H]`` are stacked (i, f, g, o), and ``b`` is torch's
``b_ih + b_hh``. Episodes are cut as in recurrent PPO (sb3-contrib ``RecurrentPPO``, CleanRL
``ppo_atari_lstm``): the carried state is multiplied by ``keep[t] = 1 - episode_starts[t]``
before step ``t``, so an episode starts from the zero state and no gradient crosses the cut.

The cell's equations (:func:`_cell_forward`, :func:`_cell_backward`) and the loops over steps
(:func:`_forward_recursion`, :func:`_bptt_recursion`) are written in the subset of Python numba
compiles; ``ppo_ref.fast.lstm`` compiles these same functions with its own products and
per-unit loops in place of :func:`_gate_inputs`, :func:`_add_products`, :func:`_cells` and
:func:`_cells_backward` (here NumPy ``@`` and broadcasting, so the tiers agree to rounding).
Float64 throughout (inputs are cast on entry).
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, as_flag_array, check_count,
                             check_lstm_params, check_lstm_state, check_same_shape)
from ppo_ref.spec.layers import orthogonal

__all__ = ["LSTMStepCache", "LSTMCache", "lstm_init", "step_forward", "step_backward",
           "lstm_forward", "lstm_backward", "lstm_step"]

Params = Dict[str, np.ndarray]


class LSTMStepCache(NamedTuple):
    """What :func:`step_backward` reads (float64): ``x [N, D]``, ``keep [N]``, ``h_prev``
    and ``c_prev [N, H]`` (``h~``, ``c~``), ``gates [N, 4H]`` (i, f, g, o), ``tanh_c [N, H]``."""
    x: np.ndarray
    keep: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray


class LSTMCache(NamedTuple):
    """What :func:`lstm_backward` reads (float64): the fields of :class:`LSTMStepCache` with a
    leading ``[T]``, and ``keep [T + 1, N]`` with ``keep[T] = 1``. ``x`` is the caller's array
    when it was float64: do not modify it between forward and backward."""
    x: np.ndarray
    keep: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray


# Exact constants typed float32, so that a compiled float32 run stays in float32 (a Python
# float is float64 to numba); with float64 operands they are the same numbers.
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)


def _sigmoid(z, tanh):
    """``sigma(z) = 1 / (1 + exp(-z))``, as ``(1 + tanh(z / 2)) / 2`` (never overflows)."""
    return _HALF + _HALF * tanh(_HALF * z)


def _cell_forward(z_i, z_f, z_g, z_o, c_prev, keep_next, tanh):
    """The cell at step t, elementwise (arrays of one shape, or numbers)::

        h~[t] = keep[t] * h[t-1],    c~[t] = keep[t] * c[t-1]      (h[-1] = h0, c[-1] = c0)
        z[t]  = x[t] @ w_ih.T + h~[t] @ w_hh.T + b    [N, 4H] = (z_i, z_f, z_g, z_o)
        i = sigma(z_i),  f = sigma(z_f),  g = tanh(z_g),  o = sigma(z_o)
        c[t] = f * c~[t] + i * g
        h[t] = o * tanh(c[t])

    from ``z`` (:func:`_gate_inputs`) and ``c_prev = c~[t]``, with :func:`_sigmoid` and the
    tier's ``tanh``. Returns ``(i, f, g, o, tanh(c[t]), h[t], keep[t+1] * h[t], keep[t+1] *
    c[t])``: the last two are the state carried into step t + 1 (``keep[T] = 1``: the final
    state, unmasked)."""
    i = _sigmoid(z_i, tanh)
    f = _sigmoid(z_f, tanh)
    g = tanh(z_g)
    o = _sigmoid(z_o, tanh)
    c = f * c_prev + i * g
    tanh_c = tanh(c)
    h = o * tanh_c
    return i, f, g, o, tanh_c, h, keep_next * h, keep_next * c


def _cell_backward(i, f, g, o, c_prev, tanh_c, dh_out, keep_next, dh_next, dc_next):
    """Backpropagation through time (Werbos 1990) through the cell at step t, elementwise::

        dh   = dh_seq[t] + keep[t+1] * dh_next                     (total gradient of h[t])
        dc   = keep[t+1] * dc_next + dh * o * (1 - tanh(c[t])^2)   (total gradient of c[t])
        dz_i = dc * g * i * (1 - i)          dz_f = dc * c~[t] * f * (1 - f)
        dz_g = dc * i * (1 - g^2)            dz_o = dh * tanh(c[t]) * o * (1 - o)
        dc~[t] = dc * f,                     dh~[t] = dz[t] @ w_hh (a product, by the caller)

    ``dh_next, dc_next``: ``dh~[t+1], dc~[t+1]`` (``dh_T, dc_T`` at t = T-1, ``keep[T] = 1``).
    After the loop ``dh0 = keep[0] * dh~[0]``, ``dc0 = keep[0] * dc~[0]``, ``dw_ih = sum_t
    dz[t].T @ x[t]``, ``dw_hh = sum_t dz[t].T @ h~[t]``, ``db = sum_{t,n} dz[t, n]``,
    ``dx[t] = dz[t] @ w_ih`` (:func:`_run_bptt`); a state cut by a reset gets exactly 0.
    Returns ``(dz_i, dz_f, dz_g, dz_o, dc~[t])``."""
    dh = dh_out + keep_next * dh_next
    dc = keep_next * dc_next + dh * o * (_ONE - tanh_c * tanh_c)
    return (dc * g * i * (_ONE - i), dc * c_prev * f * (_ONE - f), dc * i * (_ONE - g * g),
            dh * tanh_c * o * (_ONE - o), dc * f)


def _forward_recursion(weights, x, keep, h_prev, c_prev, gates, tanh_c, h_seq):
    """The forward loop over ``t = 0 .. T-1``, in place: row 0 of ``h_prev, c_prev
    [T + 1, N, H]`` holds ``h~[0], c~[0]`` on entry; step t runs :func:`_gate_inputs` and
    :func:`_cells`, writing ``gates[t]``, ``tanh_c[t]``, ``h_seq[t]`` and row t + 1 of
    ``h_prev``, ``c_prev`` (row T: the final state, unmasked). ``weights``: the tier's form of
    ``(w_ih, w_hh, b)``."""
    z = np.empty((x.shape[1], 4 * h_seq.shape[2]), x.dtype)
    for t in range(x.shape[0]):
        _gate_inputs(weights, x[t], h_prev[t], z)
        _cells(z, c_prev[t], keep[t + 1], gates[t], tanh_c[t], h_seq[t], h_prev[t + 1],
               c_prev[t + 1])


def _bptt_recursion(w_hh, keep, gates, c_prev, tanh_c, dh_seq, dz, dh_next, dc_next):
    """The backward loop over ``t = T-1 .. 0``, in place: ``dh_next, dc_next [N, H]`` hold
    ``dh_T, dc_T`` on entry; step t writes ``dz[t]`` and ``dc~[t]`` (:func:`_cells_backward`),
    then ``dh~[t] = dz[t] @ w_hh``; on exit they hold ``dh~[0], dc~[0]``."""
    for t in range(dh_seq.shape[0] - 1, -1, -1):
        _cells_backward(gates[t], c_prev[t], tanh_c[t], dh_seq[t], keep[t + 1], dh_next, dc_next,
                        dz[t])
        dh_next[:, :] = 0.0
        _add_products(dh_next, dz[t], w_hh)


# What a tier supplies; the readable tier's: NumPy (the compiled tier's: ppo_ref.fast.lstm).

def _gate_inputs(weights, x_t, h_t, z):
    """``z = x_t @ w_ih.T + h_t @ w_hh.T + b`` (``weights = (w_ih, w_hh, b)``), into ``z``."""
    w_ih, w_hh, b = weights
    z[...] = x_t @ w_ih.T + h_t @ w_hh.T + b


def _add_products(out, a, w_t):
    """``out += a @ w_t``."""
    out += a @ w_t


def _cells(z, c_prev, keep_next, gates, tanh_c, h, h_next, c_next):
    """:func:`_cell_forward` on every row and unit at once (NumPy broadcasting), into the
    given arrays; ``z`` and ``gates`` ``[N, 4H]`` in blocks (i, f, g, o)."""
    hidden = c_prev.shape[1]
    blocks = [slice(q * hidden, (q + 1) * hidden) for q in range(4)]
    (gates[:, blocks[0]], gates[:, blocks[1]], gates[:, blocks[2]], gates[:, blocks[3]],
     tanh_c[...], h[...], h_next[...], c_next[...]) = _cell_forward(
        *(z[:, block] for block in blocks), c_prev, keep_next[:, None], np.tanh)


def _cells_backward(gates, c_prev, tanh_c, dh_out, keep_next, dh_next, dc_next, dz):
    """:func:`_cell_backward` on every row and unit at once, into ``dz [N, 4H]`` and
    ``dc_next``."""
    hidden = c_prev.shape[1]
    blocks = [slice(q * hidden, (q + 1) * hidden) for q in range(4)]
    (dz[:, blocks[0]], dz[:, blocks[1]], dz[:, blocks[2]], dz[:, blocks[3]],
     dc_next[...]) = _cell_backward(*(gates[:, block] for block in blocks), c_prev, tanh_c,
                                    dh_out, keep_next[:, None], dh_next, dc_next)


def _run_forward(w_ih, w_hh, b, x, h0, c0, keep):
    """:func:`_forward_recursion` on checked float64 arrays, ``keep [T + 1, N]``: returns
    ``(h_seq, (h_T, c_T), LSTMCache)``."""
    n_steps, n_env, _ = x.shape
    hidden = w_hh.shape[1]
    h_prev = np.empty((n_steps + 1, n_env, hidden))
    c_prev = np.empty((n_steps + 1, n_env, hidden))
    h_prev[0] = keep[0, :, None] * h0
    c_prev[0] = keep[0, :, None] * c0
    gates = np.empty((n_steps, n_env, 4 * hidden))
    tanh_c = np.empty((n_steps, n_env, hidden))
    h_seq = np.empty((n_steps, n_env, hidden))
    _forward_recursion((w_ih, w_hh, b), x, keep, h_prev, c_prev, gates, tanh_c, h_seq)
    cache = LSTMCache(x, keep, h_prev[:n_steps], c_prev[:n_steps], gates, tanh_c)
    return h_seq, (h_seq[-1].copy(), c_prev[n_steps].copy()), cache


def _run_bptt(w_ih, w_hh, cache: LSTMCache, dh_seq, dh_T, dc_T):
    """:func:`_bptt_recursion` on checked float64 arrays, then the sums over steps
    (:func:`_cell_backward`). Returns ``(dx, grads, (dh0, dc0))``."""
    dz = np.empty(cache.gates.shape)
    dh_next, dc_next = dh_T.copy(), dc_T.copy()
    _bptt_recursion(w_hh, cache.keep, cache.gates, cache.c_prev, cache.tanh_c, dh_seq, dz,
                    dh_next, dc_next)
    keep0 = cache.keep[0, :, None]
    grads = {
        "w_ih": np.einsum("tnj,tnd->jd", dz, cache.x),
        "w_hh": np.einsum("tnj,tnk->jk", dz, cache.h_prev),
        "b": np.einsum("tnj->j", dz),
    }
    return dz @ w_ih, grads, (keep0 * dh_next, keep0 * dc_next)


def _check_input(x, name: str, ndim: int, w_ih: np.ndarray) -> np.ndarray:
    """``x`` as float64 of rank ``ndim`` whose last dimension is D, with every other >= 1."""
    x = as_float_array(x, name, ndim=(ndim,)).astype(np.float64, copy=False)
    lead = "[T, N, D]" if ndim == 3 else "[N, D]"
    if min(x.shape[:-1]) < 1:
        raise ValueError(f"{name} must be {lead} with no empty leading dimension, got shape "
                         f"{x.shape}")
    if x.shape[-1] != w_ih.shape[1]:
        raise ValueError(f"{name} must have {w_ih.shape[1]} features (params['w_ih'] is "
                         f"[4H, D] = {list(w_ih.shape)}), got shape {x.shape}")
    return x


def _check_starts(episode_starts, shape: Tuple[int, ...], shape_name: str) -> np.ndarray:
    starts = as_flag_array(episode_starts, "episode_starts", ndim=(len(shape),))
    check_same_shape(starts, "episode_starts", shape, shape_name)
    return starts


def _check_cache(cache, cls, w_ih: np.ndarray, w_hh: np.ndarray, producer: str):
    if not isinstance(cache, cls):
        raise ValueError(f"cache must be the {cls.__name__} returned by {producer}, "
                         f"got {type(cache).__name__}")
    d_in, hidden = cache.x.shape[-1], cache.tanh_c.shape[-1]
    if w_ih.shape[1] != d_in or w_hh.shape[1] != hidden:
        raise ValueError(f"params do not match cache: params['w_ih'] {w_ih.shape}, "
                         f"params['w_hh'] {w_hh.shape}; cache has D = {d_in}, H = {hidden}")


def lstm_init(rng: np.random.Generator, input_size: int, hidden_size: int, *,
              ortho_init: bool = True) -> Params:
    """Parameters of an LSTM of ``input_size`` D >= 1 inputs and ``hidden_size`` H >= 1 units:
    ``w_ih [4H, D]`` then ``w_hh [4H, H]``, each one :func:`ppo_ref.spec.layers.orthogonal`
    matrix of gain 1 drawn from ``rng``, and ``b = zeros(4H)`` (CleanRL ``ppo_atari_lstm``).
    ``ortho_init=False``: ``torch.nn.LSTM``'s own initialization (sb3-contrib's, whose LSTM is
    never orthogonally initialized) ``w_ih, w_hh, b_ih, b_hh ~ U(-k, k)``, ``k = 1 / sqrt(H)``,
    drawn in that order, ``b = b_ih + b_hh`` (torch's two biases are only ever summed).
    Returns float64 arrays. Raises ``ValueError`` for ``rng`` not a Generator or a size that is
    not a positive integer."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    d, h = check_count(input_size, "input_size", 1), check_count(hidden_size, "hidden_size", 1)
    if not ortho_init:
        k = 1.0 / math.sqrt(h)
        w_ih = rng.uniform(-k, k, size=(4 * h, d))
        w_hh = rng.uniform(-k, k, size=(4 * h, h))
        b_ih = rng.uniform(-k, k, size=4 * h)
        return {"w_ih": w_ih, "w_hh": w_hh, "b": b_ih + rng.uniform(-k, k, size=4 * h)}
    return {"w_ih": orthogonal(rng, (4 * h, d), gain=1.0),
            "w_hh": orthogonal(rng, (4 * h, h), gain=1.0),
            "b": np.zeros(4 * h)}


def step_forward(params: Mapping[str, np.ndarray], x, h, c, episode_starts):
    """One LSTM step with the reset inside: ``(h, c) <- cell(x, keep * h, keep * c)``,
    ``keep = 1 - episode_starts`` (:func:`_cell_forward`).

    ``params``: ``{"w_ih": [4H, D], "w_hh": [4H, H], "b": [4H]}`` (gates i, f, g, o); ``x``:
    ``[N, D]``; ``h, c``: ``[N, H]``, the carried state; ``episode_starts``: ``[N]`` bool or
    0/1, True where this step starts an episode. Returns ``(h_new, c_new, LSTMStepCache)``,
    float64 ``[N, H]``. Raises ``ValueError`` naming the argument: malformed ``params``, wrong
    ranks or shapes, non-finite values, flags other than 0/1, N = 0.
    """
    w_ih, w_hh, b = check_lstm_params(params)
    x = _check_input(x, "x", 2, w_ih)
    n_env, hidden = x.shape[0], w_hh.shape[1]
    h = check_lstm_state(h, "h", n_env, hidden)
    c = check_lstm_state(c, "c", n_env, hidden)
    keep = np.ones((2, n_env))
    keep[0] -= _check_starts(episode_starts, (n_env,), "[N]")
    h_seq, (h_new, c_new), cache = _run_forward(w_ih, w_hh, b, x[None], h, c, keep)
    return h_new, c_new, LSTMStepCache(x, keep[0], *(a[0] for a in cache[2:]))


def step_backward(params: Mapping[str, np.ndarray], cache: LSTMStepCache, dh_new, dc_new):
    """Gradients of one :func:`step_forward` for ``dh_new, dc_new [N, H]``: :func:`lstm_backward`
    with T = 1. ``dh``, ``dc`` are the gradients of the carried ``h, c`` (0 where the step
    started an episode). Returns fresh float64 ``(dx [N, D], grads, dh, dc)``, ``grads`` keyed
    as ``params``. Raises ``ValueError`` naming the argument: a cache that is not an
    :class:`LSTMStepCache` or does not match ``params``, misshapen or non-finite gradients.
    """
    w_ih, w_hh, _ = check_lstm_params(params)
    _check_cache(cache, LSTMStepCache, w_ih, w_hh, "step_forward")
    n_env, hidden = cache.tanh_c.shape
    dh_new = check_lstm_state(dh_new, "dh_new", n_env, hidden)
    dc_new = check_lstm_state(dc_new, "dc_new", n_env, hidden)
    sequence = LSTMCache(cache.x[None], np.stack([cache.keep, np.ones(n_env)]),
                         cache.h_prev[None], cache.c_prev[None], cache.gates[None],
                         cache.tanh_c[None])
    dx, grads, (dh, dc) = _run_bptt(w_ih, w_hh, sequence, np.zeros((1, n_env, hidden)),
                                    dh_new, dc_new)
    return dx[0], grads, dh, dc


def lstm_forward(params: Mapping[str, np.ndarray], x, h0, c0, episode_starts):
    """The LSTM over a time-major sequence: :func:`_cell_forward` for ``t = 0 .. T-1`` from
    ``h[-1] = h0``, ``c[-1] = c0``, the state zeroed before each episode start.

    ``params`` as :func:`step_forward`; ``x``: ``[T, N, D]``, T >= 1 steps of N >= 1 envs; ``h0,
    c0``: ``[N, H]``, the state carried into step 0; ``episode_starts``: ``[T, N]`` bool or 0/1,
    True at the first step of an episode. Returns ``(h_seq [T, N, H], (h_T, c_T), LSTMCache)``:
    the final state ``[N, H]`` is unmasked (fresh arrays), all float64. Raises ``ValueError``
    naming the argument: malformed ``params``, wrong ranks or shapes, non-finite values, flags
    other than 0/1, T = 0 or N = 0.
    """
    w_ih, w_hh, b = check_lstm_params(params)
    x = _check_input(x, "x", 3, w_ih)
    n_steps, n_env, _ = x.shape
    hidden = w_hh.shape[1]
    h = check_lstm_state(h0, "h0", n_env, hidden)
    c = check_lstm_state(c0, "c0", n_env, hidden)
    keep = np.ones((n_steps + 1, n_env))
    keep[:n_steps] -= _check_starts(episode_starts, (n_steps, n_env), "[T, N]")
    return _run_forward(w_ih, w_hh, b, x, h, c, keep)


def lstm_backward(params: Mapping[str, np.ndarray], cache: LSTMCache, dh_seq,
                  dh_T=None, dc_T=None):
    """Backpropagation through time for :func:`lstm_forward` (:func:`_cell_backward`).

    ``params``, ``cache``: of the forward pass; ``dh_seq``: ``[T, N, H]``, the gradient in
    ``h_seq``; ``dh_T, dc_T``: ``[N, H]`` or None (zero), gradients in the final state from
    outside ``h_seq`` (e.g. the next truncated-BPTT segment). Returns fresh float64 ``(dx [T, N,
    D], grads, (dh0, dc0))``, ``grads`` keyed as ``params``, ``dh0, dc0`` exactly 0 where
    ``episode_starts[0]``. Raises ``ValueError`` naming the argument: a cache that is not an
    :class:`LSTMCache` or does not match ``params``, misshapen or non-finite gradients.
    """
    w_ih, w_hh, _ = check_lstm_params(params)
    _check_cache(cache, LSTMCache, w_ih, w_hh, "lstm_forward")
    n_steps, n_env, hidden = cache.tanh_c.shape
    dh_seq = as_float_array(dh_seq, "dh_seq", ndim=(3,)).astype(np.float64, copy=False)
    check_same_shape(dh_seq, "dh_seq", (n_steps, n_env, hidden), "h_seq [T, N, H]")
    zeros = np.zeros((n_env, hidden))
    dh_T = zeros if dh_T is None else check_lstm_state(dh_T, "dh_T", n_env, hidden)
    dc_T = zeros if dc_T is None else check_lstm_state(dc_T, "dc_T", n_env, hidden)
    return _run_bptt(w_ih, w_hh, cache, dh_seq, dh_T, dc_T)


def lstm_step(params: Mapping[str, np.ndarray], x, h, c, episode_starts):
    """One LSTM step for acting: :func:`step_forward`'s ``(h_new, c_new)`` without the cache
    (the same step as :func:`lstm_forward`'s, so the states are identical)."""
    h_new, c_new, _ = step_forward(params, x, h, c, episode_starts)
    return h_new, c_new
