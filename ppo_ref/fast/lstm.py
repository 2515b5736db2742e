"""The compiled tier of the LSTM: the twins of :mod:`ppo_ref.spec.lstm`'s ``lstm_forward``,
``lstm_backward`` and ``lstm_step`` (parameters, results and equations there).

What runs is the spec's own code: its recursions and cell equations (``_forward_recursion``,
``_bptt_recursion``, ``_cell_forward``, ``_cell_backward``) compiled with this tier's leaves in
place of the spec's: the products as FMA chains in index order
(:func:`ppo_ref.fast._products._add_products`, :func:`_gate_inputs`), the loops applying the cell
to every row and unit (:func:`_cells`, :func:`_cells_backward`), and pooled arrays. float32 when
every float input (the parameters included) is float32, else float64. A non-finite result raises
``FloatingPointError``; arguments are not validated here.
"""
from __future__ import annotations

from types import FunctionType
from typing import Mapping, NamedTuple

import numpy as np

from ppo_ref._checks import non_finite_result, result_dtype
from ppo_ref._numba import njit
from ppo_ref.fast import _products
from ppo_ref.fast._products import _strided, _tanh_any, _wide
from ppo_ref.spec import lstm as _spec

__all__ = ["lstm_forward", "lstm_backward", "lstm_step"]


def _gate_inputs(weights, x_t, h_t, z):
    """This tier's ``ppo_ref.spec.lstm._gate_inputs``: ``z = b + x_t @ w_ih.T + h_t @ w_hh.T``
    with ``weights = (w_ih, w_hh, b, w_t)``, every element the FMA chain from ``b[j]`` over the
    D input terms, then the H state terms (the same bits by either route below, whichever other
    rows share the call). With ``w_t = [w_ih.T; w_hh.T] [D + H, 4H]`` (packed by
    :func:`_forward_pass` for a sequence): one product of ``[x_t, h_t]`` with it. With ``w_t``
    empty (one step, where packing would cost more than the step's products): unit-major from
    the weights as stored, ``z.T = b + w_ih @ x_t.T + w_hh @ h_t.T`` as ``[4H, C]`` (``C``: N
    rounded up to whole vector registers), then transposed into ``z``."""
    w_ih, w_hh, b, w_t = weights
    n_env, d_in = x_t.shape
    hidden = h_t.shape[1]
    if w_t.shape[0] > 0:
        xh = np.empty((n_env, d_in + hidden), z.dtype)
        for n in range(n_env):
            for k in range(d_in):
                xh[n, k] = x_t[n, k]
            for k in range(hidden):
                xh[n, d_in + k] = h_t[n, k]
            for j in range(z.shape[1]):
                z[n, j] = b[j]
        _products._add_products(z, _strided(xh), w_t)
        return
    lanes = _products._vector_lanes(z)
    cols = -(-n_env // lanes) * lanes
    x_u = np.zeros((d_in, cols), z.dtype)
    h_u = np.zeros((hidden, cols), z.dtype)
    z_u = np.empty((z.shape[1], cols), z.dtype)
    for n in range(n_env):
        for k in range(d_in):
            x_u[k, n] = x_t[n, k]
        for k in range(hidden):
            h_u[k, n] = h_t[n, k]
    for j in range(z.shape[1]):
        for c in range(cols):
            z_u[j, c] = b[j]
    _products._add_products(z_u, _strided(w_ih), x_u)
    _products._add_products(z_u, _strided(w_hh), h_u)
    for n in range(n_env):
        for j in range(z.shape[1]):
            z[n, j] = z_u[j, n]


def _cells(z, c_prev, keep_next, gates, tanh_c, h, h_next, c_next):
    """This tier's ``ppo_ref.spec.lstm._cells``: ``_cell_forward`` on every row n and unit j,
    the loop NumPy's broadcasting runs in the spec tier. ``z [N, 4H]`` in blocks (i, f, g, o);
    ``gates [4, N, H]`` gate by gate (four stores into one row at offsets of H would keep LLVM
    from vectorizing the loop)."""
    _wide()
    hidden = c_prev.shape[1]
    for n in range(c_prev.shape[0]):
        k = keep_next[n]
        for j in range(hidden):
            (gates[0, n, j], gates[1, n, j], gates[2, n, j], gates[3, n, j], tanh_c[n, j],
             h[n, j], h_next[n, j], c_next[n, j]) = _cell_forward(
                z[n, j], z[n, hidden + j], z[n, 2 * hidden + j], z[n, 3 * hidden + j],
                c_prev[n, j], k, _tanh_any)


def _cells_backward(gates, c_prev, tanh_c, dh_out, keep_next, dh_next, dc_next, dz):
    """This tier's ``ppo_ref.spec.lstm._cells_backward``: ``_cell_backward`` on every row n and
    unit j; ``gates [4, N, H]``, ``dz [N, 4H]`` in blocks (i, f, g, o); ``dc_next``
    overwritten with ``dc~[t]``."""
    _wide()
    hidden = c_prev.shape[1]
    for n in range(c_prev.shape[0]):
        k = keep_next[n]
        for j in range(hidden):
            (dz[n, j], dz[n, hidden + j], dz[n, 2 * hidden + j], dz[n, 3 * hidden + j],
             dc_next[n, j]) = _cell_backward(
                gates[0, n, j], gates[1, n, j], gates[2, n, j], gates[3, n, j], c_prev[n, j],
                tanh_c[n, j], dh_out[n, j], k, dh_next[n, j], dc_next[n, j])


# The spec's recursions and cell equations with this tier's leaves, inlined by numba into the
# two passes below: each pass is optimized once by LLVM (docs/BENCHMARKS.md, the LSTM passes).
_inlined = njit(inline="always")   # (NUMBA_DISABLE_JIT=1: the function itself)


def _with_leaves(function, **leaves):
    """The spec's ``function`` reading ``leaves`` in place of the spec module's names."""
    return _inlined(FunctionType(function.__code__, {**vars(_spec), **leaves}, function.__name__))


_cell_forward = _with_leaves(_spec._cell_forward, _sigmoid=_with_leaves(_spec._sigmoid))
_cell_backward = _with_leaves(_spec._cell_backward)
_forward_recursion = _with_leaves(_spec._forward_recursion, _gate_inputs=_inlined(_gate_inputs),
                                  _cells=_inlined(_cells))
_bptt_recursion = _with_leaves(
    _spec._bptt_recursion, _cells_backward=_inlined(_cells_backward),
    _add_products=_inlined(lambda out, a, w_t: _products._add_products(out, _strided(a), w_t)))


@njit
def _forward_pass(w_ih, w_hh, b, w_t, x, keep, h0, c0, h_prev, c_prev, gates, tanh_c, h_seq):
    """The forward passes of L LSTMs on one ``x [T, N, D]`` and ``keep [T + 1, N]`` (``keep[T]
    = 1``), in place (per LSTM the spec's recursion after the initial state's mask); True when
    every final state is finite. ``w_ih``, ``w_hh``, ``b``: tuples of L ``[4H, D]``, ``[4H,
    H]``, ``[4H]``; ``h0, c0 [L, N, H]``; scratch ``w_t [L, D + H, 4H]`` (packed here) or ``[L,
    0, 4H]`` (not packed: :func:`_gate_inputs`); results ``h_prev, c_prev [L, T + 1, N, H]`` (row
    t: the state step t read; row T: the final state), ``gates [L, T, 4, N, H]``, ``tanh_c,
    h_seq [L, T, N, H]``. All C-contiguous, one dtype."""
    n_steps, n_env, d_in = x.shape
    hidden = h0.shape[2]
    finite = True
    for l in range(h0.shape[0]):
        if w_t.shape[1] > 0:
            _products._transpose_into(w_ih[l], w_t[l, :d_in])
            _products._transpose_into(w_hh[l], w_t[l, d_in:])
        for n in range(n_env):
            k = keep[0, n]
            for j in range(hidden):
                h_prev[l, 0, n, j] = k * h0[l, n, j]
                c_prev[l, 0, n, j] = k * c0[l, n, j]
        _forward_recursion((w_ih[l], w_hh[l], b[l], w_t[l]), x, keep, h_prev[l], c_prev[l],
                           gates[l], tanh_c[l], h_seq[l])
        # A NaN or inf anywhere reaches the final state (c is carried on as f * c, masking
        # multiplies by 0, tanh(inf) would not hide an inf c): its check is the pass's.
        finite = (finite and _products._all_finite(h_prev[l, n_steps].reshape(-1))
                  and _products._all_finite(c_prev[l, n_steps].reshape(-1)))
    return finite


@njit
def _backward_pass(w_ih, w_hh, x, keep, h_prev, c_prev, gates, tanh_c, dh_seq, dz, dh_next,
                   dc_next, g_w_ih, g_w_hh, g_b, g_w_ih_t, w_hh_copy, dx):
    """BPTT of the L LSTMs of :func:`_forward_pass` (its arrays; ``w_ih``, ``w_hh``,
    ``dh_seq``: tuples of L ``[4H, D]``, ``[4H, H]``, ``[T, N, H]``), in place: ``dh_next,
    dc_next [L, N, H]`` hold ``dh_T, dc_T`` (left holding ``dh~[0], dc~[0]``); writes ``dz [L,
    T, N, 4H]``, ``g_w_ih [L, 4H, D]``, ``g_w_hh [L, 4H, H]``, ``g_b [L, 4H]`` and, when ``dx``
    has T rows (``[L, T, N, D]``), ``dx = dz @ w_ih``. Scratch ``g_w_ih_t [L, D, 4H]`` (``x^T
    dz``, then transposed: D rows would not fill the blocks as columns), ``w_hh_copy [L, 4H, H]``
    (a copy starting at a cache line). Every sum over the ``T N`` rows runs in the order ``m = t
    N + n``, one FMA per product term."""
    n_steps, n_env, d_in = x.shape
    hidden = dh_next.shape[2]
    rows = n_steps * n_env
    x_rows = x.reshape(rows, d_in)
    finite = True
    for l in range(dh_next.shape[0]):
        for j in range(4 * hidden):
            for k in range(hidden):
                w_hh_copy[l, j, k] = w_hh[l][j, k]
        _bptt_recursion(w_hh_copy[l], keep, gates[l], c_prev[l], tanh_c[l], dh_seq[l], dz[l],
                        dh_next[l], dc_next[l])
        dz_rows = dz[l].reshape(rows, 4 * hidden)
        g_w_hh[l] = 0.0
        _products._add_products(g_w_hh[l], _strided(dz_rows.T),
                                h_prev[l, :n_steps].reshape(rows, hidden))
        g_w_ih_t[l] = 0.0
        _products._add_products(g_w_ih_t[l], _strided(x_rows.T), dz_rows)
        _products._transpose_into(g_w_ih_t[l], g_w_ih[l])
        g_b[l] = 0.0
        for m in range(rows):
            for j in range(4 * hidden):
                g_b[l, j] += dz_rows[m, j]
        for a in (g_w_ih[l].reshape(-1), g_w_hh[l].reshape(-1), g_b[l], dh_next[l].reshape(-1),
                  dc_next[l].reshape(-1)):
            finite = finite and _products._all_finite(a)
        if dx.shape[1] == n_steps:
            dx[l] = 0.0
            _products._add_products(dx[l].reshape(rows, d_in), _strided(dz_rows), w_ih[l])
            finite = finite and _products._all_finite(dx[l].reshape(-1))
    return finite


class _LSTMCache(NamedTuple):
    """What :func:`lstm_backward` reads: the arrays of :func:`_forward_pass` for L LSTMs
    (compute dtype; ``x``, ``keep`` shared, the others with a leading ``[L]``)."""
    x: np.ndarray
    keep: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray


def _weights(params: Mapping[str, np.ndarray], dtype, keys=("w_ih", "w_hh", "b")):
    """The arrays ``params[k]`` of ``keys`` as C-contiguous arrays of ``dtype`` (no copy when
    they are already)."""
    return tuple(np.ascontiguousarray(params[k], dtype=dtype) for k in keys)


def _keep(episode_starts, n_steps: int, n_env: int, dtype) -> np.ndarray:
    """``keep [T + 1, N]``: ``1 - episode_starts`` (bool or 0/1 numbers), then a row of ones."""
    keep = np.empty((n_steps + 1, n_env), dtype)
    np.logical_not(np.reshape(episode_starts, (n_steps, n_env)), out=keep[:n_steps])
    keep[n_steps] = 1.0
    return keep


def _pooled(name: str, dt, *shapes):
    """Arrays of ``shapes`` and ``dt`` from the pool of :func:`ppo_ref.fast._products._bundle`
    (reused across calls; contents undefined)."""
    return _products._bundle((name, dt) + shapes,
                             lambda: tuple(_products._aligned(shape, dt) for shape in shapes))


def _run_forward(lstms, x, h0, c0, keep, where: str):
    """:func:`_forward_pass` of the LSTMs ``lstms`` (a sequence of ``(w_ih, w_hh, b)``) on
    C-contiguous arrays of one dtype, from ``h0, c0 [L, N, H]``: ``(h_seq [L, T, N, H], c_T [L,
    N, H], cache)`` (``c_T`` a view of the cache)."""
    (n_steps, n_env, d_in), (n_lstm, _, hidden), dt = x.shape, h0.shape, x.dtype
    state, seq = (n_lstm, n_steps + 1, n_env, hidden), (n_lstm, n_steps, n_env, hidden)
    h_prev, c_prev, gates, tanh_c, h_seq, w_t = _pooled(
        "lstm.forward", dt, state, state, (n_lstm, n_steps, 4, n_env, hidden), seq, seq,
        (n_lstm, d_in + hidden if n_steps > 1 else 0, 4 * hidden))
    w_ih, w_hh, b = zip(*lstms)
    if not _forward_pass(w_ih, w_hh, b, w_t, x, keep, h0, c0, h_prev, c_prev, gates, tanh_c,
                         h_seq):
        raise non_finite_result(where)
    return h_seq, c_prev[:, n_steps], _LSTMCache(x, keep, h_prev, c_prev, gates, tanh_c)


def _run_backward(w_ih, w_hh, cache: _LSTMCache, dh_seq, dh_T, dc_T, with_dx: bool, where: str):
    """:func:`_backward_pass` for the cache of :func:`_run_forward` (``w_ih``, ``w_hh``,
    ``dh_seq``: tuples over its L LSTMs; all of the cache's dtype): ``(dx [L, T, N, D] or None,
    (g_w_ih, g_w_hh, g_b) [L, ...], dh~[0], dc~[0])`` (``dh_T``, ``dc_T`` ``[L, N, H]`` are
    overwritten)."""
    (n_steps, n_env, d_in), (n_lstm, _, hidden), dt = cache.x.shape, dh_T.shape, cache.x.dtype
    four_h = 4 * hidden
    g_w_ih, g_w_hh, g_b, dx, dz, g_w_ih_t, w_hh_copy = _pooled(
        "lstm.backward", dt, (n_lstm, four_h, d_in), (n_lstm, four_h, hidden), (n_lstm, four_h),
        (n_lstm, n_steps if with_dx else 0, n_env, d_in), (n_lstm, n_steps, n_env, four_h),
        (n_lstm, d_in, four_h), (n_lstm, four_h, hidden))
    if not _backward_pass(w_ih, w_hh, cache.x, cache.keep, cache.h_prev, cache.c_prev,
                          cache.gates, cache.tanh_c, dh_seq, dz, dh_T, dc_T, g_w_ih, g_w_hh, g_b,
                          g_w_ih_t, w_hh_copy, dx):
        raise non_finite_result(where)
    return (dx if with_dx else None), (g_w_ih, g_w_hh, g_b), dh_T, dc_T


def _step(lstms, x, h, c, episode_starts, where: str):
    """One step of every LSTM of ``lstms`` (a sequence of ``(w_ih, w_hh, b)``; LSTM l from the
    state ``h[l], c[l]``, ``[L, N, H]``) on ``x [N, D]`` (C-contiguous, the compute dtype), for
    acting: :func:`_forward_pass` with T = 1 (so the bits of a sequence's step), the weights not
    packed (:func:`_gate_inputs`) and fresh arrays (no pool: they are small). Returns ``(h_new,
    c_new) [L, N, H]``; a non-finite result raises ``FloatingPointError`` naming ``where``."""
    dt = x.dtype
    n_lstm, n_env, hidden = h.shape
    keep = _keep(episode_starts, 1, n_env, dt)
    h, c = np.ascontiguousarray(h, dt), np.ascontiguousarray(c, dt)
    w_ih, w_hh, b = zip(*lstms)
    state = (n_lstm, 2, n_env, hidden)
    h_prev, c_prev, h_new = np.empty(state, dt), np.empty(state, dt), np.empty(h.shape, dt)
    if not _forward_pass(w_ih, w_hh, b, np.empty((n_lstm, 0, 4 * hidden), dt),
                         x.reshape(1, n_env, x.shape[1]), keep, h, c, h_prev, c_prev,
                         np.empty((n_lstm, 1, 4, n_env, hidden), dt),
                         np.empty((n_lstm, 1, n_env, hidden), dt),
                         h_new.reshape(n_lstm, 1, n_env, hidden)):
        raise non_finite_result(where)
    return h_new, c_prev[:, 1].copy()


def _float_dtype(arrays, params: Mapping[str, np.ndarray], keys=("w_ih", "w_hh", "b")):
    """The compute dtype: float32 when every float array of ``arrays`` and of ``params[keys]``
    is float32, else float64."""
    return result_dtype(*arrays, *(np.asarray(params[k]) for k in keys))


def lstm_forward(params: Mapping[str, np.ndarray], x, h0, c0, episode_starts):
    """Twin of :func:`ppo_ref.spec.lstm.lstm_forward`: ``(h_seq [T, N, H], (h_T, c_T),
    cache)`` in the compute dtype, the cache this module's own. Within rtol 1e-12, atol 1e-14
    (float32: rtol 1e-5, atol 1e-6) of the spec."""
    x, h0, c0 = np.asarray(x), np.asarray(h0), np.asarray(c0)
    dt = _float_dtype((x, h0, c0), params)
    x = np.ascontiguousarray(x, dtype=dt)
    n_steps, n_env = x.shape[:2]
    h_seq, c_T, cache = _run_forward((_weights(params, dt),), x,
                                     np.ascontiguousarray(h0, dtype=dt)[None],
                                     np.ascontiguousarray(c0, dtype=dt)[None],
                                     _keep(episode_starts, n_steps, n_env, dt),
                                     "ppo_ref.fast.lstm.lstm_forward")
    return h_seq[0], (h_seq[0, n_steps - 1].copy(), c_T[0].copy()), cache


def lstm_step(params: Mapping[str, np.ndarray], x, h, c, episode_starts):
    """Twin of :func:`ppo_ref.spec.lstm.lstm_step`: ``(h_new, c_new) [N, H]`` (fresh, the
    compute dtype), the bits of :func:`lstm_forward`'s states. Within rtol 1e-12, atol 1e-14
    (float32: rtol 1e-5, atol 1e-6) of the spec."""
    x, h, c = np.asarray(x), np.asarray(h), np.asarray(c)
    dt = _float_dtype((x, h, c), params)
    h_new, c_new = _step((_weights(params, dt),), np.ascontiguousarray(x, dtype=dt), h[None],
                         c[None], episode_starts, "ppo_ref.fast.lstm.lstm_step")
    return h_new[0], c_new[0]


def lstm_backward(params: Mapping[str, np.ndarray], cache, dh_seq, dh_T=None, dc_T=None):
    """Twin of :func:`ppo_ref.spec.lstm.lstm_backward`, given this module's cache: ``(dx [T,
    N, D], grads, (dh0, dc0))``, float32 when the forward pass, ``dh_seq``, ``dh_T``, ``dc_T``
    and the parameters are, else float64. Within rtol 1e-12, atol 1e-14 (float32: rtol 2e-5,
    atol 1e-6) of the spec."""
    given = [np.asarray(a) for a in (dh_seq, dh_T, dc_T) if a is not None]
    dt = _float_dtype((cache.x, *given), params, ("w_ih", "w_hh"))
    if dt != cache.x.dtype:
        cache = _LSTMCache(*(a.astype(dt) for a in cache))
    w_ih, w_hh = _weights(params, dt, ("w_ih", "w_hh"))
    n_env, hidden = cache.h_prev.shape[2:]
    state = (1, n_env, hidden)
    dh = np.zeros(state, dt) if dh_T is None else np.array(dh_T, dtype=dt).reshape(state)
    dc = np.zeros(state, dt) if dc_T is None else np.array(dc_T, dtype=dt).reshape(state)
    dx, (g_w_ih, g_w_hh, g_b), dh, dc = _run_backward(
        (w_ih,), (w_hh,), cache, (np.ascontiguousarray(dh_seq, dtype=dt),), dh, dc, True,
        "ppo_ref.fast.lstm.lstm_backward")
    keep0 = cache.keep[0, :, None]
    return dx[0], {"w_ih": g_w_ih[0], "w_hh": g_w_hh[0], "b": g_b[0]}, (keep0 * dh[0],
                                                                         keep0 * dc[0])
