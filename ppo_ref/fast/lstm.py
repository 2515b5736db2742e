"""The compiled tier of the LSTM: the twins of :mod:`ppo_ref.spec.lstm`'s ``lstm_forward``,
``lstm_backward`` and ``lstm_step`` (same parameters, same return structures).

What runs is the spec's own code: the forward recursion, the BPTT recursion and the cell's
equations (``ppo_ref.spec.lstm._forward_recursion``, ``_bptt_recursion``, ``_cell_forward``,
``_cell_backward``; equations in that module's docstring) are compiled here as they are written.
This module supplies what the spec leaves to a tier: the products, as chains of fused
multiply-adds in index order (:func:`ppo_ref.fast._products._add_products`; a step's gate
pre-activations are one product of ``[x[t], h~[t]]`` with ``[w_ih.T; w_hh.T]``,
:func:`_gate_inputs`); the loops that apply the cell to every row and unit (:func:`_cells`,
:func:`_cells_backward`); the weight gradients and ``dx`` after the recursion; and the arrays
(reused across calls: :func:`ppo_ref.fast._products._bundle`).

Numerics. float64 inputs compute in float64; when every float input (the parameters included)
is float32, the same functions run in float32 and return float32 (``tanh`` in float32
arithmetic). ``tanh`` is :func:`ppo_ref.fast._products._tanh_any` (within a few units in the
last place of NumPy's). Every product is an FMA chain in the order of its index, so a row's
results do not depend on the other rows of the call: acting on N envs one step at a time
(:func:`lstm_step`), replaying T steps of them and training on any subset of them give each env
the same bits. A non-finite result raises ``FloatingPointError``
(:func:`ppo_ref._checks.non_finite_result`); arguments are not validated here (the spec
functions do that, and name the bad one).
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Tuple

import numpy as np
from numba import prange
from numba.core import types
from numba.core.errors import TypingError as NumbaTypingError
from numba.extending import overload, register_jitable

from ppo_ref._checks import as_flag_array, check_same_shape, non_finite_result, result_dtype
from ppo_ref._numba import njit
from ppo_ref.fast import _products, workspace
from ppo_ref.fast._products import (  # noqa: F401  (also names the legacy section reads)
    _HALF, _ONE, _VECTOR_BITS, _block_loops, _block_vector_intrinsic, _check_block_operands,
    _column_sums, _fma, _round_to_float32, _strided, _tanh, _tanh_any, _tanh_f32,
    _transpose_into, _wide)
from ppo_ref.spec import lstm as _spec

__all__ = ["lstm_forward", "lstm_backward", "lstm_step"]


def _gate_inputs(weights, x_t, h_t, z):
    """This tier's ``ppo_ref.spec.lstm._gate_inputs``: ``z = b + [x_t, h_t] @ w_t`` with
    ``weights = (w_t, b)``, ``w_t = [w_ih.T; w_hh.T] [D + H, 4H]`` (one product per step: every
    element the FMA chain from ``b[j]`` over the D input terms, then the H state terms)."""
    w_t, b = weights
    n_env, d_in = x_t.shape
    xh = np.empty((n_env, w_t.shape[0]), x_t.dtype)
    for n in range(n_env):
        for k in range(d_in):
            xh[n, k] = x_t[n, k]
        for k in range(h_t.shape[1]):
            xh[n, d_in + k] = h_t[n, k]
        for j in range(z.shape[1]):
            z[n, j] = b[j]
    _products._add_products(z, _strided(xh), w_t)


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
             h[n, j], h_next[n, j], c_next[n, j]) = _spec._cell_forward(
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
             dc_next[n, j]) = _spec._cell_backward(
                gates[0, n, j], gates[1, n, j], gates[2, n, j], gates[3, n, j], c_prev[n, j],
                tanh_c[n, j], dh_out[n, j], k, dh_next[n, j], dc_next[n, j])


# The spec's recursions and cell equations compiled as they are written, with this tier's
# _gate_inputs, _add_products, _cells and _cells_backward in place of the spec's (numba
# overloads of those names: what a tier supplies, ppo_ref.spec.lstm's module docstring). The
# cell equations are compiled inline into the loops over elements (a call per element would
# keep LLVM from vectorizing them); the recursions are compiled functions of their own, called
# by the two passes below (a function inlined by numba is compiled twice: slower to compile).
register_jitable(inline="always")(_spec._cell_forward)
register_jitable(inline="always")(_spec._cell_backward)
register_jitable(_spec._sigmoid)
overload(_spec._gate_inputs)(lambda weights, x_t, h_t, z: _gate_inputs)
overload(_spec._add_products, inline="always")(
    lambda out, a, w_t: lambda out, a, w_t: _products._add_products(out, _strided(a), w_t))
overload(_spec._cells)(lambda z, c_prev, keep_next, gates, tanh_c, h, h_next, c_next: _cells)
overload(_spec._cells_backward)(
    lambda gates, c_prev, tanh_c, dh_out, keep_next, dh_next, dc_next, dz: _cells_backward)
_forward_recursion = njit(_spec._forward_recursion)
_bptt_recursion = njit(_spec._bptt_recursion)


@njit
def _forward_pass(w_ih, w_hh, b, x, keep, h0, c0, w_t, h_prev, c_prev, gates, tanh_c, h_seq):
    """The forward pass, in place; True when its final state is finite.

    ``w_ih [4H, D]``, ``w_hh [4H, H]``, ``b [4H]``, ``x [T, N, D]``, ``keep [T + 1, N]``
    (``keep[T] = 1``), ``h0, c0 [N, H]``; scratch ``w_t [D + H, 4H]`` (``[w_ih.T; w_hh.T]``,
    packed here); results ``h_prev, c_prev [T + 1, N, H]`` (row t: the state step t read; row
    T: the final state), ``gates [T, 4, N, H]``, ``tanh_c, h_seq [T, N, H]``. All C-contiguous,
    one dtype. The spec's recursion after the initial state's mask."""
    n_steps, n_env, d_in = x.shape
    hidden = w_hh.shape[1]
    _products._transpose_into(w_ih, w_t[:d_in])
    _products._transpose_into(w_hh, w_t[d_in:])
    for n in range(n_env):
        k = keep[0, n]
        for j in range(hidden):
            h_prev[0, n, j] = k * h0[n, j]
            c_prev[0, n, j] = k * c0[n, j]
    _forward_recursion((w_t, b), x, keep, h_prev, c_prev, gates, tanh_c, h_seq)
    # A NaN or inf anywhere in the recursion reaches the final state (c is carried on as
    # f * c, masking multiplies by 0, and tanh(inf) would not hide an inf c): its check is the
    # pass's.
    return (_products._all_finite(h_prev[n_steps].reshape(-1))
            and _products._all_finite(c_prev[n_steps].reshape(-1)))


@njit
def _backward_pass(w_ih, w_hh, x, keep, h_prev, c_prev, gates, tanh_c, dh_seq, dz, dh_next,
                   dc_next, g_w_ih, g_w_hh, g_b, g_w_ih_t, w_hh_copy, dx):
    """BPTT, in place.

    The arrays of :func:`_forward_pass` (``h_prev``, ``c_prev`` with their T + 1 rows),
    ``dh_seq [T, N, H]``, ``dh_next, dc_next [N, H]`` holding ``dh_T, dc_T`` (left holding
    ``dh~[0], dc~[0]``); writes ``dz [T, N, 4H]``, the weight gradients ``g_w_ih [4H, D]``,
    ``g_w_hh [4H, H]``, ``g_b [4H]`` and, when ``dx`` has T rows (``[T, N, D]``; else it is not
    computed), ``dx = dz @ w_ih``. Scratch ``g_w_ih_t [D, 4H]`` (``x^T dz``, then transposed:
    its few rows D would not fill the blocks as columns) and ``w_hh_copy [4H, H]`` (the
    recursion reads a copy of ``w_hh`` that starts at a cache line, as :func:`_forward_pass`
    reads its transposed copies). Every sum over the ``T N`` rows runs in the order ``m = t N +
    n``, one FMA per product term."""
    n_steps, n_env, d_in = x.shape
    hidden = w_hh.shape[1]
    rows = n_steps * n_env
    for j in range(4 * hidden):
        for k in range(hidden):
            w_hh_copy[j, k] = w_hh[j, k]
    _bptt_recursion(w_hh_copy, keep, gates, c_prev, tanh_c, dh_seq, dz, dh_next, dc_next)
    dz_rows = dz.reshape(rows, 4 * hidden)
    g_w_hh[:, :] = 0.0
    _products._add_products(g_w_hh, _strided(dz_rows.T), h_prev[:n_steps].reshape(rows, hidden))
    g_w_ih_t[:, :] = 0.0
    _products._add_products(g_w_ih_t, _strided(x.reshape(rows, d_in).T), dz_rows)
    _products._transpose_into(g_w_ih_t, g_w_ih)
    _products._column_sums(dz_rows, g_b)
    finite = True
    for a in (g_w_ih.reshape(-1), g_w_hh.reshape(-1), g_b, dh_next.reshape(-1),
              dc_next.reshape(-1)):
        finite = finite and _products._all_finite(a)
    if dx.shape[0] == n_steps:
        dx[:, :, :] = 0.0
        _products._add_products(dx.reshape(rows, d_in), _strided(dz_rows), w_ih)
        finite = finite and _products._all_finite(dx.reshape(-1))
    return finite


class _LSTMCache(NamedTuple):
    """What :func:`lstm_backward` reads (the arrays of :func:`_forward_pass`, compute dtype)."""
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


def _forward_arrays(n_steps: int, n_env: int, d_in: int, hidden: int, dt):
    """The arrays of :func:`_forward_pass` (its results, then its scratch), from the pool of
    :func:`ppo_ref.fast._products._bundle`."""
    def make():
        new = _products._aligned
        state = (n_steps + 1, n_env, hidden)
        return (new(state, dt), new(state, dt), new((n_steps, 4, n_env, hidden), dt),
                new((n_steps, n_env, hidden), dt), new((n_steps, n_env, hidden), dt),
                new((d_in + hidden, 4 * hidden), dt))
    return _products._bundle(("lstm.forward", n_steps, n_env, d_in, hidden, dt), make)


def _run_forward(w_ih, w_hh, b, x, h0, c0, keep, where: str):
    """:func:`_forward_pass` on C-contiguous arrays of one dtype: ``(h_seq, c_T, cache)``
    (``c_T`` a view of the cache)."""
    n_steps, n_env, d_in = x.shape
    hidden = w_hh.shape[1]
    h_prev, c_prev, gates, tanh_c, h_seq, w_t = _forward_arrays(n_steps, n_env, d_in, hidden,
                                                                x.dtype)
    if not _forward_pass(w_ih, w_hh, b, x, keep, h0, c0, w_t, h_prev, c_prev, gates, tanh_c,
                         h_seq):
        raise non_finite_result(where)
    return h_seq, c_prev[n_steps], _LSTMCache(x, keep, h_prev, c_prev, gates, tanh_c)


def _backward_arrays(n_steps: int, n_env: int, d_in: int, hidden: int, dt, with_dx: bool):
    """The arrays of :func:`_backward_pass`: the weight gradients and ``dx`` (its results),
    then its scratch, from the pool of :func:`ppo_ref.fast._products._bundle`."""
    def make():
        new = _products._aligned
        four_h = 4 * hidden
        return (new((four_h, d_in), dt), new((four_h, hidden), dt), new(four_h, dt),
                new((n_steps if with_dx else 0, n_env, d_in), dt),
                new((n_steps, n_env, four_h), dt), new((d_in, four_h), dt),
                new((four_h, hidden), dt))
    return _products._bundle(("lstm.backward", n_steps, n_env, d_in, hidden, dt, with_dx),
                             make)


def _run_backward(w_ih, w_hh, cache: _LSTMCache, dh_seq, dh_T, dc_T, with_dx: bool, where: str):
    """:func:`_backward_pass` on arrays of the cache's dtype: ``(dx or None, grads, dh~[0],
    dc~[0])`` (``dh_T``, ``dc_T`` are overwritten)."""
    n_steps, n_env, d_in = cache.x.shape
    hidden = w_hh.shape[1]
    g_w_ih, g_w_hh, g_b, dx, dz, g_w_ih_t, w_hh_copy = _backward_arrays(
        n_steps, n_env, d_in, hidden, cache.x.dtype, with_dx)
    if not _backward_pass(w_ih, w_hh, cache.x, cache.keep, cache.h_prev, cache.c_prev,
                          cache.gates, cache.tanh_c, dh_seq, dz, dh_T, dc_T, g_w_ih, g_w_hh, g_b,
                          g_w_ih_t, w_hh_copy, dx):
        raise non_finite_result(where)
    grads = {"w_ih": g_w_ih, "w_hh": g_w_hh, "b": g_b}
    return (dx if with_dx else None), grads, dh_T, dc_T


def _float_dtype(arrays, params: Mapping[str, np.ndarray], keys=("w_ih", "w_hh", "b")):
    """The compute dtype: float32 when every float array of ``arrays`` and of ``params[keys]``
    is float32, else float64."""
    return result_dtype(*arrays, *(np.asarray(params[k]) for k in keys))


def lstm_forward(params: Mapping[str, np.ndarray], x, h0, c0, episode_starts):
    """Run the LSTM over a time-major sequence, resetting the state at episode starts: the twin
    of :func:`ppo_ref.spec.lstm.lstm_forward` (arguments, results and equations there).

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 1e-5, atol 1e-6).

    Returns ``(h_seq [T, N, H], (h_T, c_T), cache)``: in the compute dtype (float32 when every
    float input is float32, else float64); ``cache`` is this module's own, for
    :func:`lstm_backward`. Raises ``FloatingPointError`` for a non-finite result.
    """
    x, h0, c0 = np.asarray(x), np.asarray(h0), np.asarray(c0)
    dt = _float_dtype((x, h0, c0), params)
    w_ih, w_hh, b = _weights(params, dt)
    x = np.ascontiguousarray(x, dtype=dt)
    n_steps, n_env = x.shape[:2]
    h_seq, c_T, cache = _run_forward(w_ih, w_hh, b, x, np.ascontiguousarray(h0, dtype=dt),
                                     np.ascontiguousarray(c0, dtype=dt),
                                     _keep(episode_starts, n_steps, n_env, dt),
                                     "ppo_ref.fast.lstm.lstm_forward")
    return h_seq, (h_seq[n_steps - 1].copy(), c_T.copy()), cache


def lstm_step(params: Mapping[str, np.ndarray], x, h, c, episode_starts):
    """One LSTM step for acting, without a cache: the twin of
    :func:`ppo_ref.spec.lstm.lstm_step` (arguments and results there).

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 1e-5, atol 1e-6); the
    pass of :func:`lstm_forward` with T = 1, so stepping a sequence gives its states bit for bit.
    Returns ``(h_new, c_new) [N, H]`` in the compute dtype (fresh arrays).
    """
    x, h, c = np.asarray(x), np.asarray(h), np.asarray(c)
    dt = _float_dtype((x, h, c), params)
    w_ih, w_hh, b = _weights(params, dt)
    x = np.ascontiguousarray(x, dtype=dt)
    h_seq, c_new, _ = _run_forward(w_ih, w_hh, b, x[None], np.ascontiguousarray(h, dtype=dt),
                                   np.ascontiguousarray(c, dtype=dt),
                                   _keep(episode_starts, 1, x.shape[0], dt),
                                   "ppo_ref.fast.lstm.lstm_step")
    return h_seq[0], c_new


def lstm_backward(params: Mapping[str, np.ndarray], cache, dh_seq, dh_T=None, dc_T=None):
    """Backpropagation through time for :func:`lstm_forward`: the twin of
    :func:`ppo_ref.spec.lstm.lstm_backward` (arguments, results and equations there), given
    this module's cache.

    Equals it within rtol 1e-12, atol 1e-14 in float64 (float32: rtol 2e-5, atol 1e-6).

    Returns ``(dx [T, N, D], grads, (dh0, dc0))``, fresh arrays, in the compute dtype: float32
    when the forward pass ran in float32 and ``dh_seq``, ``dh_T``, ``dc_T`` and the parameters
    are float32, else float64. Raises ``FloatingPointError`` for a non-finite result.
    """
    given = [np.asarray(a) for a in (dh_seq, dh_T, dc_T) if a is not None]
    dt = _float_dtype((cache.x, *given), params, ("w_ih", "w_hh"))
    if dt != cache.x.dtype:
        cache = _LSTMCache(*(a.astype(dt) for a in cache))
    w_ih, w_hh = _weights(params, dt, ("w_ih", "w_hh"))
    n_env, hidden = cache.h_prev.shape[1:]
    dh = np.zeros((n_env, hidden), dt) if dh_T is None else np.array(dh_T, dtype=dt)
    dc = np.zeros((n_env, hidden), dt) if dc_T is None else np.array(dc_T, dtype=dt)
    dx, grads, dh, dc = _run_backward(w_ih, w_hh, cache, np.ascontiguousarray(dh_seq, dtype=dt),
                                      dh, dc, True, "ppo_ref.fast.lstm.lstm_backward")
    keep0 = cache.keep[0, :, None]
    return dx, grads, (keep0 * dh, keep0 * dc)


# ============================================================================================
# Legacy: the old RecurrentPolicy's fast path (train/recurrent_policies.py: forward_stacked,
# backward_stacked, step_stacked, keep_rows, StackedArrays, all_finite*; fast/mlp.py reads the
# block, panel and product helpers below). To delete when the policies call the twins.
# ============================================================================================

if _VECTOR_BITS >= 512:
    _BLOCK_ROWS, _BLOCK_COLS = 8, 16
    _WIDE_ROWS, _WIDE_COLS = 6, 32
    _WIDE_MIN_ROWS = 24   # fewer rows than this: the 8 x 16 blocks
else:
    _BLOCK_ROWS, _BLOCK_COLS = 6, 8
    _WIDE_ROWS, _WIDE_COLS = 6, 8
    _WIDE_MIN_ROWS = 2 ** 62   # (never: one block shape)


def _add_block(out, a, w_t, n, j0):
    """:func:`_block_loops` on the 8 x 16 block at ``(n, j0)``. Interpreted here; compiled, a
    register block of :func:`_block_vector_intrinsic`."""
    _block_loops(out, a, w_t, n, j0, _BLOCK_ROWS, _BLOCK_COLS)


def _add_block_wide(out, a, w_t, n, j0):
    """:func:`_block_loops` on the 6 x 32 block at ``(n, j0)``. Interpreted here; compiled, a
    register block of :func:`_block_vector_intrinsic`."""
    _block_loops(out, a, w_t, n, j0, _WIDE_ROWS, _WIDE_COLS)


_add_block_vector = _block_vector_intrinsic(_BLOCK_ROWS, _BLOCK_COLS)
_add_block_wide_vector = _block_vector_intrinsic(_WIDE_ROWS, _WIDE_COLS)


@overload(_add_block)
def _add_block_compiled(out, a, w_t, n, j0):
    """Compiled, :func:`_add_block` is the 8 x 16 register block (operands:
    :func:`_check_block_operands`)."""
    _check_block_operands(out, a, w_t)
    return lambda out, a, w_t, n, j0: _add_block_vector(out, a, w_t, n, j0)


@overload(_add_block_wide)
def _add_block_wide_compiled(out, a, w_t, n, j0):
    """Compiled, :func:`_add_block_wide` is the 6 x 32 register block (operands:
    :func:`_check_block_operands`)."""
    _check_block_operands(out, a, w_t)
    return lambda out, a, w_t, n, j0: _add_block_wide_vector(out, a, w_t, n, j0)


@njit
def _add_products_loops(out, a, w_t, n_lo, n_hi, j_lo):
    """The rows ``n_lo .. n_hi - 1`` and columns ``j_lo .. J - 1`` of :func:`_add_products`,
    four k and four rows at a time (each loaded weight serves four rows), the remaining k and
    rows one at a time; the loop over j vectorizes."""
    _wide()
    n_k = a.shape[1]
    n_j = w_t.shape[1]
    k4 = n_k - n_k % 4
    n4 = n_lo + (n_hi - n_lo) // 4 * 4
    for n in range(n_lo, n4, 4):
        for k in range(0, k4, 4):
            a0, a1, a2, a3 = a[n, k], a[n, k + 1], a[n, k + 2], a[n, k + 3]
            b0, b1, b2, b3 = a[n + 1, k], a[n + 1, k + 1], a[n + 1, k + 2], a[n + 1, k + 3]
            c0, c1, c2, c3 = a[n + 2, k], a[n + 2, k + 1], a[n + 2, k + 2], a[n + 2, k + 3]
            d0, d1, d2, d3 = a[n + 3, k], a[n + 3, k + 1], a[n + 3, k + 2], a[n + 3, k + 3]
            for j in range(j_lo, n_j):
                w0, w1, w2, w3 = w_t[k, j], w_t[k + 1, j], w_t[k + 2, j], w_t[k + 3, j]
                out[n, j] = _fma(a3, w3, _fma(a2, w2, _fma(a1, w1, _fma(a0, w0, out[n, j]))))
                out[n + 1, j] = _fma(b3, w3, _fma(b2, w2, _fma(b1, w1,
                                                                _fma(b0, w0, out[n + 1, j]))))
                out[n + 2, j] = _fma(c3, w3, _fma(c2, w2, _fma(c1, w1,
                                                                _fma(c0, w0, out[n + 2, j]))))
                out[n + 3, j] = _fma(d3, w3, _fma(d2, w2, _fma(d1, w1,
                                                                _fma(d0, w0, out[n + 3, j]))))
        for k in range(k4, n_k):
            for m in range(n, n + 4):
                am = a[m, k]
                for j in range(j_lo, n_j):
                    out[m, j] = _fma(am, w_t[k, j], out[m, j])
    for n in range(n4, n_hi):
        for k in range(0, k4, 4):
            a0, a1, a2, a3 = a[n, k], a[n, k + 1], a[n, k + 2], a[n, k + 3]
            for j in range(j_lo, n_j):
                out[n, j] = _fma(a3, w_t[k + 3, j], _fma(a2, w_t[k + 2, j], _fma(
                    a1, w_t[k + 1, j], _fma(a0, w_t[k, j], out[n, j]))))
        for k in range(k4, n_k):
            a0 = a[n, k]
            for j in range(j_lo, n_j):
                out[n, j] = _fma(a0, w_t[k, j], out[n, j])


@njit
def _add_products_narrow(out, a, w_t):
    """:func:`_add_products` for few columns (an output layer of one or two units): each
    column's chain over k = 0, 1, ... held in registers for eight rows at once (eight
    independent FMA chains in flight, instead of a load and store of ``out`` per few terms);
    the same FMA chain per element."""
    n_rows, n_k = a.shape
    n_j = w_t.shape[1]
    n8 = n_rows - n_rows % 8
    for n in range(0, n8, 8):
        for j in range(n_j):
            o0, o1, o2, o3 = out[n, j], out[n + 1, j], out[n + 2, j], out[n + 3, j]
            o4, o5, o6, o7 = out[n + 4, j], out[n + 5, j], out[n + 6, j], out[n + 7, j]
            for k in range(n_k):
                w = w_t[k, j]
                o0 = _fma(a[n, k], w, o0)
                o1 = _fma(a[n + 1, k], w, o1)
                o2 = _fma(a[n + 2, k], w, o2)
                o3 = _fma(a[n + 3, k], w, o3)
                o4 = _fma(a[n + 4, k], w, o4)
                o5 = _fma(a[n + 5, k], w, o5)
                o6 = _fma(a[n + 6, k], w, o6)
                o7 = _fma(a[n + 7, k], w, o7)
            out[n, j], out[n + 1, j], out[n + 2, j], out[n + 3, j] = o0, o1, o2, o3
            out[n + 4, j], out[n + 5, j], out[n + 6, j], out[n + 7, j] = o4, o5, o6, o7
    for n in range(n8, n_rows):
        for j in range(n_j):
            o = out[n, j]
            for k in range(n_k):
                o = _fma(a[n, k], w_t[k, j], o)
            out[n, j] = o


# at most this many columns: _add_products_narrow (one or two outputs: the value and a
# two-action policy head)
_NARROW_COLS = 2


@njit
def _add_products(out, a, w_t):
    """``out[n, j] += sum_k a[n, k] * w_t[k, j]``, term by term in the order k = 0, 1, ...,
    K-1, each term added by one fused multiply-add: ``o <- fma(a[n, k], w_t[k, j], o)``.

    ``out`` ``[M, J]``, ``a`` ``[M, K]``, ``w_t`` ``[K, J]`` (the weight pre-transposed so j is
    contiguous), 2-D arrays of one dtype, float64 or float32, ``out`` and ``w_t`` C-contiguous,
    ``a`` of any strides (e.g. a transposed view; other layouts are refused:
    :func:`_check_block_operands`). Register blocks accumulated in vector registers over all k:
    6 rows x 32 columns (:func:`_add_block_wide`) when there are at least 24 rows and the
    width is a multiple of 32, else 8 x 16 (:func:`_add_block`); the columns and rows left over
    by :func:`_add_products_loops`; one or two columns in all by :func:`_add_products_narrow`.
    The arithmetic of an element is the same chain of FMAs in every case (which block computes
    it changes nothing), so a row's result does not depend on the other rows of the call.
    """
    n_rows = a.shape[0]
    n_j = w_t.shape[1]
    if n_j <= _NARROW_COLS:
        _add_products_narrow(out, a, w_t)
        return
    if n_rows >= _WIDE_MIN_ROWS and n_j % _WIDE_COLS == 0:
        n6 = n_rows - n_rows % _WIDE_ROWS
        for n in range(0, n6, _WIDE_ROWS):
            for j0 in range(0, n_j, _WIDE_COLS):
                _add_block_wide(out, a, w_t, n, j0)
        if n6 < n_rows:
            _add_products_loops(out, a, w_t, n6, n_rows, 0)
        return
    n8 = n_rows - n_rows % _BLOCK_ROWS
    j16 = n_j - n_j % _BLOCK_COLS
    if j16 == 0:
        n8 = 0
    for n in range(0, n8, _BLOCK_ROWS):
        for j0 in range(0, j16, _BLOCK_COLS):
            _add_block(out, a, w_t, n, j0)
    if n8 > 0 and j16 < n_j:
        _add_products_loops(out, a, w_t, 0, n8, j16)
    if n8 < n_rows:
        _add_products_loops(out, a, w_t, n8, n_rows, 0)


# Panels: a transposed weight ``w_t [K, J]`` stored as ``w_p [P, K, C]`` with ``w_p[p, k, c] =
# w_t[k, p C + c]`` (C = _PANEL_COLS, P = ceil(J / C), zeros beyond column J), so that a
# register block reads its weights from one contiguous stretch of memory instead of a few
# vectors from each of K rows far apart. A full panel is computed in register blocks of
# _PANEL_WIDE_F64 (float64) or _PANEL_WIDE_F32 (float32) columns, on AVX-512 three vectors a
# row in either dtype (8 x 24 float64, 8 x 48 float32: 24 accumulators, each weight vector
# loaded serving 8 rows); the last, partial panel (4H = 256 = 5 x 48 + 16) in blocks of
# _BLOCK_COLS columns. AVX2 uses one block shape (6 x 8, panels of 8). Which layout the
# weights are read from and which block computes an element change no element's arithmetic:
# :func:`_linear_panels` is :func:`_linear_rows`, bit for bit.
if _VECTOR_BITS >= 512:
    _PANEL_COLS = 48
    _PANEL_WIDE_F64, _PANEL_WIDE_F32 = 24, 48
else:
    _PANEL_COLS = _BLOCK_COLS
    _PANEL_WIDE_F64 = _PANEL_WIDE_F32 = _BLOCK_COLS


def _panel_block(out, a, w_panel, b, n, j0, c0, cols, rows=_BLOCK_ROWS):
    """``out[n:n+R, j0+c0:j0+c0+cols] = b[j0+c0:j0+c0+cols] + a[n:n+R] @ w_panel[:, c0:c0+cols]``
    (R = ``rows``), every element the FMA chain of :func:`_linear_rows`."""
    for m in range(n, n + rows):
        for c in range(c0, c0 + cols):
            o = b[j0 + c]
            for k in range(a.shape[1]):
                o = _fma(a[m, k], w_panel[k, c], o)
            out[m, j0 + c] = o


def _linear_panel(out, a, w_panel, b, n, j0, c0):
    """:func:`_panel_block` of _BLOCK_COLS columns (a partial panel's). Interpreted here;
    compiled, a register block of :func:`_block_vector_intrinsic` (``panel=True``)."""
    _panel_block(out, a, w_panel, b, n, j0, c0, _BLOCK_COLS)


def _panel_wide_cols(out):
    """The width of the full panels' blocks for the dtype of ``out``: _PANEL_WIDE_F32 for
    float32, else _PANEL_WIDE_F64 (a constant when compiled)."""
    return _PANEL_WIDE_F32 if out.dtype == np.float32 else _PANEL_WIDE_F64


@overload(_panel_wide_cols)
def _panel_wide_cols_compiled(out):
    cols = _PANEL_WIDE_F32 if out.dtype == types.float32 else _PANEL_WIDE_F64
    return lambda out: cols


def _linear_panel_wide(out, a, w_panel, b, n, j0, c0):
    """:func:`_panel_block` of :func:`_panel_wide_cols` columns (a full panel's). Interpreted
    here; compiled, a register block of :func:`_block_vector_intrinsic` (``panel=True``)."""
    _panel_block(out, a, w_panel, b, n, j0, c0, _panel_wide_cols(out))


_linear_panel_vector = _block_vector_intrinsic(_BLOCK_ROWS, _BLOCK_COLS, panel=True)
_linear_panel_wide_vector = _block_vector_intrinsic(_BLOCK_ROWS, _PANEL_WIDE_F64, panel=True,
                                                    f32_cols=_PANEL_WIDE_F32)


def _check_panel_operands(out, a, w_panel, b):
    """Typing-time check of a panel block's operands: :func:`_check_block_operands`, and ``b``
    1-D, C-contiguous, of their dtype."""
    _check_block_operands(out, a, w_panel)
    if not (isinstance(b, types.Array) and b.ndim == 1 and b.layout == "C"
            and b.dtype == out.dtype):
        raise NumbaTypingError(f"_linear_panel takes a 1-D C-contiguous bias of the dtype of "
                               f"out, got {b}")


@overload(_linear_panel)
def _linear_panel_compiled(out, a, w_panel, b, n, j0, c0):
    """Compiled, :func:`_linear_panel` is a register block (:func:`_check_panel_operands`)."""
    _check_panel_operands(out, a, w_panel, b)
    return lambda out, a, w_panel, b, n, j0, c0: _linear_panel_vector(out, a, w_panel, b, n,
                                                                      j0, c0)


@overload(_linear_panel_wide)
def _linear_panel_wide_compiled(out, a, w_panel, b, n, j0, c0):
    """Compiled, :func:`_linear_panel_wide` is a register block
    (:func:`_check_panel_operands`)."""
    _check_panel_operands(out, a, w_panel, b)
    return lambda out, a, w_panel, b, n, j0, c0: _linear_panel_wide_vector(out, a, w_panel, b,
                                                                           n, j0, c0)


@njit
def _linear_panel_loops(out, a, w_p, b, n_lo, n_hi, p, c_lo):
    """The rows ``n_lo .. n_hi - 1`` and the columns ``c_lo ..`` of panel ``p`` (those below J)
    of :func:`_linear_panels`, the loop over the panel's columns vectorized."""
    _wide()
    j0 = p * _PANEL_COLS
    cols = min(_PANEL_COLS, out.shape[1] - j0)
    for m in range(n_lo, n_hi):
        for c in range(c_lo, cols):
            out[m, j0 + c] = b[j0 + c]
        for k in range(a.shape[1]):
            am = a[m, k]
            for c in range(c_lo, cols):
                out[m, j0 + c] = _fma(am, w_p[p, k, c], out[m, j0 + c])


@njit
def _linear_panels(x, w_p, b, out):
    """:func:`_linear_rows` (``out = b + x @ w_t``, the same FMA chain per element) with the
    weight as panels ``w_p [P, K, C]`` of ``w_t [K, J]`` (:func:`_pack_panels`): ``x [M, K]``
    (any strides), ``b [J]``, ``out [M, J]`` C-contiguous. Full panels in register blocks of
    :func:`_linear_panel_wide`, a last partial panel in blocks of :func:`_linear_panel` as far
    as they fit; the rows and columns left over by :func:`_linear_panel_loops`."""
    n_rows = x.shape[0]
    n_j = out.shape[1]
    n_blocked = n_rows - n_rows % _BLOCK_ROWS
    wide = _panel_wide_cols(out)
    for p in range(w_p.shape[0]):
        j0 = p * _PANEL_COLS
        cols = min(_PANEL_COLS, n_j - j0)
        if cols == _PANEL_COLS:
            for n in range(0, n_blocked, _BLOCK_ROWS):
                for c0 in range(0, _PANEL_COLS, wide):
                    _linear_panel_wide(out, x, w_p[p], b, n, j0, c0)
            c_blocked = cols
        else:
            c_blocked = cols - cols % _BLOCK_COLS
            for n in range(0, n_blocked, _BLOCK_ROWS):
                for c0 in range(0, c_blocked, _BLOCK_COLS):
                    _linear_panel(out, x, w_p[p], b, n, j0, c0)
        if c_blocked < cols:
            _linear_panel_loops(out, x, w_p, b, 0, n_blocked, p, c_blocked)
        if n_blocked < n_rows:
            _linear_panel_loops(out, x, w_p, b, n_blocked, n_rows, p, 0)


@njit
def _pack_panels(w, w_p, k0):
    """Rows ``k0 .. k0 + K - 1`` of the panels ``w_p [P, >= k0 + K, C]`` of ``w.T``, from a
    weight as stored, ``w [J, K]``: ``w_p[p, k0 + k, c] = w[p C + c, k]``, and 0 where ``p C + c
    >= J``."""
    n_j, n_k = w.shape
    for p in range(w_p.shape[0]):
        for k in range(n_k):
            for c in range(_PANEL_COLS):
                j = p * _PANEL_COLS + c
                w_p[p, k0 + k, c] = w[j, k] if j < n_j else 0.0


def _panel_count(n_cols: int) -> int:
    """The number of panels P of a weight with ``n_cols`` output columns: ceil(J / C)."""
    return -(-n_cols // _PANEL_COLS)


@njit
def _activate_gates(z):
    """In place on ``z`` ``[N, 4H]``: (i, f, o) blocks ``sigmoid(z) = 0.5 + 0.5 tanh(0.5 z)``
    (``0.5 z`` is exact), g block ``tanh(z)``. (One call site of :func:`_tanh` per kernel, so
    LLVM inlines it and vectorizes the loop.)"""
    _wide()
    n_env, four_h = z.shape
    lo, hi = four_h // 2, 3 * four_h // 4
    for n in range(n_env):
        for j in range(four_h):
            is_g = lo <= j < hi
            v = _tanh_any(z[n, j] if is_g else _HALF * z[n, j])
            z[n, j] = v if is_g else _HALF + _HALF * v


@njit
def _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq):
    """Step t from the activations ``z = gates[t]``: ``c = f c~ + i g``, ``h = o tanh(c)``;
    the next carried state ``(h~, c~)[t+1] = keep[t+1] (h, c)`` (``keep[T] = 1``: row T holds
    the unmasked final state)."""
    _wide()
    n_env, hidden = h_seq.shape[1], h_seq.shape[2]
    for n in range(n_env):
        k = keep[t + 1, n]
        for j in range(hidden):
            c = z[n, hidden + j] * c_prev[t, n, j] + z[n, j] * z[n, 2 * hidden + j]
            tanh_c[t, n, j] = _tanh_any(c)
            h = z[n, 3 * hidden + j] * tanh_c[t, n, j]  # tanh(c) as stored (float32: rounded)
            h_seq[t, n, j] = h
            h_prev[t + 1, n, j] = k * h
            c_prev[t + 1, n, j] = k * c


@njit
def _forward_kernel(x, w_ih_t, w_hh_t, b, keep, h_prev, c_prev, gates, tanh_c, h_seq):
    """The forward recursion over all T steps (module docstring), in place.

    Inputs: ``x`` ``[T, N, D]``, ``w_ih_t = w_ih.T`` ``[D, 4H]``, ``w_hh_t = w_hh.T``
    ``[H, 4H]``, ``b`` ``[4H]``, ``keep`` ``[T + 1, N]``, and rows 0 of ``h_prev``/``c_prev``
    (``[T + 1, N, H]``) holding ``keep[0] * (h0, c0)``. Writes rows 1..T of ``h_prev``/``c_prev``
    (row T: the unmasked final state), ``gates`` ``[T, N, 4H]`` (i, f, g, o), ``tanh_c``,
    ``h_seq``. Per step: ``z = (b + sum_d x_d w_ih_t[d]) + sum_k h~_k w_hh_t[k]``, then
    :func:`_activate_gates` and :func:`_cell_output`.
    """
    _wide()
    n_steps, n_env, _ = x.shape
    for t in range(n_steps):
        z = gates[t]
        _linear_rows(x[t], w_ih_t, b, z)
        _add_products(z, h_prev[t], w_hh_t)
        _activate_gates(z)
        _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq)


@njit
def _forward_kernel_panels(xh, w_p, b, keep, h_prev, c_prev, gates, tanh_c, h_seq):
    """:func:`_forward_kernel` with a step's two products as one over the concatenated input:
    ``z = b + [x[t], h~[t]] @ [w_ih.T; w_hh.T]`` is the same FMA chain per element (the bias,
    then the D input terms, then the H state terms, in that order). ``xh [T, N, D + H]`` holds
    ``x[t]`` in its first D columns; the last H columns of row t are set to ``h~[t]`` here;
    ``w_p`` the panels of ``[w_ih.T; w_hh.T]`` (``[D + H, 4H]``, :func:`_pack_panels`). The
    other arguments and results as :func:`_forward_kernel`."""
    _wide()
    n_steps, n_env, d_xh = xh.shape
    hidden = h_prev.shape[2]
    d_in = d_xh - hidden
    for t in range(n_steps):
        for n in range(n_env):
            for j in range(hidden):
                xh[t, n, d_in + j] = h_prev[t, n, j]
        z = gates[t]
        _linear_panels(xh[t], w_p, b, z)
        _activate_gates(z)
        _cell_output(t, z, keep, c_prev, h_prev, tanh_c, h_seq)


@njit
def _backward_kernel(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz):
    """BPTT over all T steps (module docstring), in place: ``dh_rec``/``dc_rec`` ``[N, H]``
    enter holding ``dh~[T], dc~[T]`` (``dh_T``, ``dc_T``) and leave holding ``dh~[0], dc~[0]``;
    writes ``dz`` ``[T, N, 4H]``. ``w_hh`` ``[4H, H]`` as stored (``dh~ = dz @ w_hh`` has the
    contiguous index innermost already)."""
    _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz, True)


@njit
def _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh, dz,
                    initial_state_grads):
    """:func:`_backward_kernel`; with ``initial_state_grads`` False the last product, ``dh~[0] =
    dz[0] @ w_hh`` (read only by the initial-state gradient), is skipped: ``dz`` is the same,
    ``dh_rec``/``dc_rec`` are left undefined."""
    _wide()
    n_steps, n_env, hidden = dh_seq.shape
    for t in range(n_steps - 1, -1, -1):
        for n in range(n_env):
            k = keep[t + 1, n]
            for j in range(hidden):
                gi = gates[t, n, j]
                gf = gates[t, n, hidden + j]
                gg = gates[t, n, 2 * hidden + j]
                go = gates[t, n, 3 * hidden + j]
                tc = tanh_c[t, n, j]
                dh = dh_seq[t, n, j] + k * dh_rec[n, j]
                dc = k * dc_rec[n, j] + dh * go * (_ONE - tc * tc)
                dz[t, n, j] = dc * gg * gi * (_ONE - gi)
                dz[t, n, hidden + j] = dc * c_prev[t, n, j] * gf * (_ONE - gf)
                dz[t, n, 2 * hidden + j] = dc * gi * (_ONE - gg * gg)
                dz[t, n, 3 * hidden + j] = dh * tc * go * (_ONE - go)
                dc_rec[n, j] = dc * gf
        if t == 0 and not initial_state_grads:
            break
        dh_rec[:, :] = 0.0
        _add_products(dh_rec, dz[t], w_hh)


@njit
def _linear_rows(x, w_t, b, out):
    """``out = b + x @ w_t`` row by row (a dense layer ``x @ w.T + b`` with ``w_t = w.T``
    ``[K, J]``): ``out[n, j] = fma(x[n, K-1], w_t[K-1, j], ... fma(x[n, 0], w_t[0, j], b[j]))``,
    the chain of :func:`_add_products`. A row's result does not depend on the other rows of
    the call (a BLAS product's rounding can depend on the number of rows), which is what lets
    the recurrent policy's towers replay any subset of envs bit for bit."""
    _wide()
    for n in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[n, j] = b[j]
    _add_products(out, x, w_t)


# Several LSTMs reading the same inputs (the actor and critic LSTMs of a policy) in one call:
# the kernels above, once per LSTM, on stacked weights and outputs with a leading axis L. The
# arithmetic of each LSTM is that of lstm_forward / lstm_backward / lstm_step, bit for bit.

_FLOAT64_MAX = float(np.finfo(np.float64).max)  # abs(v) <= it is False exactly for inf, nan


@njit
def all_finite(a):
    """True if every entry of the C-contiguous float64 array ``a`` is finite (a count of
    comparisons, which vectorizes, rather than a loop that stops at the first failure)."""
    _wide()
    flat = a.reshape(-1)
    n_finite = 0
    for i in range(flat.size):
        n_finite += abs(flat[i]) <= _FLOAT64_MAX
    return n_finite == flat.size


@njit
def all_finite_1d(a) -> bool:
    """True if every entry of the 1-D float array ``a`` is finite (stops at the first that is
    not)."""
    for i in range(a.size):
        if not math.isfinite(a[i]):
            return False
    return True


@njit(parallel=True)
def _forward_stack(x, w_ih_t, w_hh_t, b, keep, h0, c0, h_prev, c_prev, gates, tanh_c, h_seq):
    """:func:`_forward_kernel` for L LSTMs on the same ``x [T, N, D]`` and ``keep [T + 1, N]``:
    ``w_ih_t [L, D, 4H]``, ``w_hh_t [L, H, 4H]``, ``b [L, 4H]``, carried states ``h0, c0
    [L, N, H]`` (multiplied by ``keep[0]`` here, as :func:`_run` does); writes ``h_prev,
    c_prev [L, T + 1, N, H]``, ``gates [L, T, N, 4H]``, ``tanh_c, h_seq [L, T, N, H]``. The L
    LSTMs share no written array, so they run on numba's threads (``prange``), with the results
    of the plain loop over ``l``."""
    n_lstm, n_env, hidden = h0.shape
    for l in prange(n_lstm):
        for n in range(n_env):
            k = keep[0, n]
            for j in range(hidden):
                h_prev[l, 0, n, j] = h0[l, n, j] * k
                c_prev[l, 0, n, j] = c0[l, n, j] * k
        _forward_kernel(x, w_ih_t[l], w_hh_t[l], b[l], keep, h_prev[l], c_prev[l], gates[l],
                        tanh_c[l], h_seq[l])


@njit
def _forward_one_t(x, w_ih, w_hh, b, keep, h0, c0, w_p, xh, h_prev, c_prev, gates, tanh_c,
                   h_seq):
    """One LSTM of :func:`_forward_stack_t` (its arguments without the leading ``L`` axis):
    ``x`` copied into the first D columns of ``xh [T, N, D + H]``, ``[w_ih.T; w_hh.T]`` packed
    into ``w_p`` (:func:`_pack_panels`), the carried state masked by ``keep[0]``, then
    :func:`_forward_kernel_panels`."""
    _wide()
    n_steps, n_env, d_in = x.shape
    hidden = h0.shape[1]
    for t in range(n_steps):
        for n in range(n_env):
            for d in range(d_in):
                xh[t, n, d] = x[t, n, d]
    _pack_panels(w_ih, w_p, 0)
    _pack_panels(w_hh, w_p, d_in)
    for n in range(n_env):
        k = keep[0, n]
        for j in range(hidden):
            h_prev[0, n, j] = h0[n, j] * k
            c_prev[0, n, j] = c0[n, j] * k
    _forward_kernel_panels(xh, w_p, b, keep, h_prev, c_prev, gates, tanh_c, h_seq)


@njit(parallel=True)
def _forward_stack_t(x, w_ih, w_hh, b, keep, h0, c0, w_p, xh, h_prev, c_prev, gates, tanh_c,
                     h_seq):
    """:func:`_forward_stack` from the weights as stored (``w_ih [L, 4H, D]``, ``w_hh
    [L, 4H, H]``), packed here into the scratch panels ``w_p [L, P, D + H, C]`` of ``[w_ih.T;
    w_hh.T]`` (:func:`_pack_panels`), by :func:`_forward_kernel_panels` with the scratch ``xh
    [L, T, N, D + H]`` (same results, bit for bit). The L LSTMs (:func:`_forward_one_t` each)
    share no written array, so they run on numba's threads (``prange``), with the results of
    the plain loop over ``l``."""
    for l in prange(w_ih.shape[0]):
        _forward_one_t(x, w_ih[l], w_hh[l], b[l], keep, h0[l], c0[l], w_p[l], xh[l], h_prev[l],
                       c_prev[l], gates[l], tanh_c[l], h_seq[l])


@njit
def _step_stack(x, w_ih_t, w_hh_t, b, keep, h, c, h_new, c_new):
    """One step of L LSTMs for acting: :func:`_forward_stack` with T = 1 on ``x [N, D]``,
    ``keep [2, N]`` (``1 - episode_starts``, then ones), ``h, c [L, N, H]``; writes the new
    states into ``h_new, c_new [L, N, H]`` (what ``lstm_step`` returns, bit for bit)."""
    n_lstm, n_env, hidden = h.shape
    x3 = x.reshape(1, n_env, x.shape[1])
    dtype = h.dtype
    h_prev = np.empty((n_lstm, 2, n_env, hidden), dtype)
    c_prev = np.empty((n_lstm, 2, n_env, hidden), dtype)
    gates = np.empty((n_lstm, 1, n_env, 4 * hidden), dtype)
    tanh_c = np.empty((n_lstm, 1, n_env, hidden), dtype)
    h_seq = np.empty((n_lstm, 1, n_env, hidden), dtype)
    _forward_stack(x3, w_ih_t, w_hh_t, b, keep, h, c, h_prev, c_prev, gates, tanh_c, h_seq)
    for l in range(n_lstm):
        for n in range(n_env):
            for j in range(hidden):
                h_new[l, n, j] = h_seq[l, 0, n, j]
                c_new[l, n, j] = c_prev[l, 1, n, j]


@njit
def _step_stack_flags(x, w_ih_t, w_hh_t, b, starts, h, c, h_new, c_new):
    """:func:`_step_stack` from the bool flags ``starts [N]``: ``keep`` (``[2, N]``, the values
    :func:`keep_rows` gives: ``1 - starts``, then ones) is made here."""
    n_env = x.shape[0]
    keep = np.ones((2, n_env), x.dtype)
    for n in range(n_env):
        if starts[n]:
            keep[0, n] = 0.0
    _step_stack(x, w_ih_t, w_hh_t, b, keep, h, c, h_new, c_new)


@njit
def _weight_grads(dz, x, h_prev, g_w_ih, g_w_hh, g_b, x_t, out):
    """The weight gradients of BPTT from ``dz [T, N, 4H]``, ``x [T, N, D]`` and the states the
    cell read, ``h_prev`` (rows ``0..T-1`` of ``[>= T, N, H]``), all C-contiguous of one
    dtype; overwrites ``g_w_ih [4H, D]``, ``g_w_hh [4H, H]``, ``g_b [4H]``::

        g_w_ih[j, d] = sum_m dz[m, j] x[m, d]    g_w_hh[j, k] = sum_m dz[m, j] h~[m, k]
        g_b[j] = sum_m dz[m, j]                  (m = t N + n over the T N rows)

    Every sum runs over the rows in the order m = 0, 1, ..., T N - 1, a product weight term
    added by one FMA (:func:`_add_products`), a bias term by one addition: the summation order
    is this documented one whatever the machine or BLAS (a BLAS product orders its sums by its
    own kernels), and the products run in vector registers. ``g_w_hh`` by
    ``_add_products(g_w_hh, dz.T, h~)`` (the transposed view: no copy); ``g_w_ih``, whose few
    columns D would not fill a vector, as its transpose ``x^T dz`` into ``out [D, 4H]``
    (scratch), then copied (the same products in the same order). ``x_t [D, T N]`` must hold
    ``x^T`` (the caller transposes ``x`` once for every LSTM reading it,
    :func:`_transpose_into`)."""
    _wide()
    n_steps, n_env, four_h = dz.shape
    hidden = h_prev.shape[2]
    rows = n_steps * n_env
    dz_rows = dz.reshape(rows, four_h)
    out[:, :] = 0.0
    _add_products(out, x_t, dz_rows)
    _transpose_into(out, g_w_ih)
    g_w_hh[:, :] = 0.0
    _add_products(g_w_hh, dz_rows.T, h_prev[:n_steps].reshape(rows, hidden))
    _column_sums(dz_rows, g_b)


@njit
def _backward_one(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh, g_b,
                  x_t, products, w_hh_copy):
    """One LSTM of :func:`_backward_stack` (its arguments without the leading ``L`` axis,
    ``x_t`` already holding ``x^T``): ``w_hh`` copied into ``w_hh_copy``, then
    :func:`_backward_steps` from zero final-state gradients and :func:`_weight_grads`."""
    _wide()
    four_h, hidden = w_hh.shape
    n_env = dh_seq.shape[1]
    for j in range(four_h):
        for k in range(hidden):
            w_hh_copy[j, k] = w_hh[j, k]
    dh_rec = np.zeros((n_env, hidden), dh_seq.dtype)
    dc_rec = np.zeros((n_env, hidden), dh_seq.dtype)
    _backward_steps(dh_seq, dh_rec, dc_rec, keep, gates, tanh_c, c_prev, w_hh_copy, dz, False)
    _weight_grads(dz, x, h_prev, g_w_ih, g_w_hh, g_b, x_t, products)


@njit(parallel=True)
def _backward_stack(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh,
                    g_b, x_t, products, w_hh_copy):
    """:func:`_backward_kernel` (without the initial-state product: :func:`_backward_steps`)
    then :func:`_weight_grads` for L LSTMs from zero final-state gradients: ``dh_seq [L, T, N,
    H]``, the ``keep``/``gates``/``tanh_c``/``c_prev`` of :func:`_forward_stack`, ``w_hh [L,
    4H, H]``, the inputs ``x [T, N, D]`` and ``h_prev [L, T + 1, N, H]``; writes ``dz [L, T,
    N, 4H]`` and the weight gradients ``g_w_ih [L, 4H, D]``, ``g_w_hh [L, 4H, H]``, ``g_b [L,
    4H]``. Scratch: ``x_t [D, T N]`` (``x^T``, written once here for every LSTM), ``products
    [L, D, 4H]`` (:func:`_weight_grads`'), ``w_hh_copy [L, 4H, H]`` (the steps read a copy of
    ``w_hh`` that starts at a cache line: StackedArrays). The L LSTMs (:func:`_backward_one`
    each) share no written array, so they run on numba's threads (``prange``), with the
    results of the plain loop over ``l``."""
    n_steps, n_env = dh_seq.shape[1], dh_seq.shape[2]
    _transpose_into(x.reshape(n_steps * n_env, x.shape[2]), x_t)
    for l in prange(dh_seq.shape[0]):
        _backward_one(dh_seq[l], keep, gates[l], tanh_c[l], c_prev[l], w_hh[l], x, h_prev[l],
                      dz[l], g_w_ih[l], g_w_hh[l], g_b[l], x_t, products[l], w_hh_copy[l])


def _aligned_empty(name: str, shape: Tuple[int, ...], dtype, pooled: bool) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype`` starting at a multiple of
    64 bytes (:mod:`ppo_ref.fast.workspace`'s alignment): fresh, or with ``pooled`` from the
    reuse pool ``"lstm." + name``."""
    if pooled:
        return workspace.empty("lstm." + name, shape, dtype)
    return workspace.aligned(shape, dtype)


class StackedArrays(NamedTuple):
    """The arrays of :func:`forward_stacked` and :func:`backward_stacked` for ``L`` LSTMs of
    width ``H`` with ``D`` inputs over ``T`` steps of ``N`` environments, all C-contiguous of
    one dtype (the compute dtype): what the forward writes, ``h_seq [L, T, N, H]``, ``h_prev,
    c_prev [L, T + 1, N, H]``, ``gates [L, T, N, 4H]``, ``tanh_c [L, T, N, H]`` (the results of
    :func:`forward_stacked`); its scratch, ``w_p [L, P, D + H, C]`` (the weight panels,
    :func:`_pack_panels`) and ``xh [L, T, N, D + H]``; and the backward's scratch, ``dz [L, T,
    N, 4H]``, ``x_t [D, T N]``, ``products [L, D, 4H]``, ``w_hh [L, 4H, H]`` (a copy of the recurrent
    weights); each starting at a multiple of 64 bytes.
    Made once by :meth:`empty` and passed as
    ``arrays`` to both functions, so a caller that runs many passes of one size allocates
    nothing per pass."""
    h_seq: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray
    gates: np.ndarray
    tanh_c: np.ndarray
    w_p: np.ndarray
    xh: np.ndarray
    dz: np.ndarray
    x_t: np.ndarray
    products: np.ndarray
    w_hh: np.ndarray

    @classmethod
    def empty(cls, n_lstm: int, n_steps: int, n_env: int, d_in: int, hidden: int, dtype,
              pooled: bool = False) -> "StackedArrays":
        """Uninitialized :class:`StackedArrays` for these sizes in ``dtype``: fresh arrays
        (:func:`ppo_ref.fast.workspace.aligned`), or with ``pooled`` True arrays of the reuse
        pools of :mod:`ppo_ref.fast.workspace` (never one still held elsewhere)."""
        def new(name, shape):
            return _aligned_empty(name, shape, dtype, pooled)
        four_h = 4 * hidden
        state = (n_lstm, n_steps, n_env, hidden)
        carried = (n_lstm, n_steps + 1, n_env, hidden)
        return cls(new("h_seq", state), new("h_prev", carried), new("c_prev", carried),
                   new("gates", (n_lstm, n_steps, n_env, four_h)), new("tanh_c", state),
                   new("w_panels", (n_lstm, _panel_count(four_h), d_in + hidden, _PANEL_COLS)),
                   new("xh", (n_lstm, n_steps, n_env, d_in + hidden)),
                   new("dz", (n_lstm, n_steps, n_env, four_h)),
                   new("x_t", (d_in, n_steps * n_env)),
                   new("products", (n_lstm, d_in, four_h)),
                   new("w_hh", (n_lstm, four_h, hidden)))


def forward_stacked(w_ih, w_hh, b, x, h0, c0, keep, arrays=None):
    """Unchecked forward of L LSTMs over the same inputs, for the fast path of
    :class:`ppo_ref.train.recurrent_policies.RecurrentPolicy` (its caller has checked what
    :func:`lstm_forward` checks): ``w_ih [L, 4H, D]``, ``w_hh [L, 4H, H]``, ``b [L, 4H]``,
    ``x [T, N, D]`` C-contiguous, ``h0, c0 [L, N, H]`` C-contiguous, ``keep [T + 1, N]`` (as
    :func:`_keep_mask`), all float64: the arithmetic of :func:`lstm_forward` for each LSTM, bit
    for bit. All float32 instead: the same kernels in float32 (16 lanes per AVX-512 vector;
    the products are float32 FMA chains, ``tanh`` is evaluated in float32 arithmetic).

    ``arrays``: a :class:`StackedArrays` of these sizes and dtype to write into, or None for arrays of the reuse pools of
    :mod:`ppo_ref.fast.workspace` (never one still held).

    Returns ``(h_seq [L, T, N, H], h_prev [L, T + 1, N, H], c_prev [L, T + 1, N, H],
    gates [L, T, N, 4H], tanh_c [L, T, N, H])``: per LSTM what :class:`LSTMCache` holds (row
    ``T`` of ``h_prev``/``c_prev`` is the unmasked final state); with ``arrays``, its fields.
    """
    if arrays is None:
        n_lstm, four_h, d_in = w_ih.shape
        n_steps, n_env, _ = x.shape
        arrays = StackedArrays.empty(n_lstm, n_steps, n_env, d_in, four_h // 4, x.dtype,
                                     pooled=True)
    b = np.ascontiguousarray(b)
    a = arrays
    _forward_stack_t(x, w_ih, w_hh, b, keep, h0, c0, a.w_p, a.xh, a.h_prev, a.c_prev, a.gates,
                     a.tanh_c, a.h_seq)
    return a.h_seq, a.h_prev, a.c_prev, a.gates, a.tanh_c


def backward_stacked(w_hh, x, h_prev, c_prev, gates, tanh_c, keep, dh_seq, g_w_ih, g_w_hh, g_b,
                     arrays=None):
    """Unchecked BPTT for :func:`forward_stacked` (its arrays, ``w_hh [L, 4H, H]`` and
    ``dh_seq [L, T, N, H]`` C-contiguous, all float64 or all float32; zero gradient on the
    final states). Writes the weight gradients into ``g_w_ih [L, 4H, D]``, ``g_w_hh [L, 4H,
    H]``, ``g_b [L, 4H]`` with the products and sums of :func:`lstm_backward` (same bits);
    ``dx`` and the initial-state gradients are not computed. Scratch: the ``dz``, ``x_t``,
    ``products`` and ``w_hh`` of ``arrays`` (a :class:`StackedArrays` of these sizes), or of the
    reuse pools of :mod:`ppo_ref.fast.workspace` when ``arrays`` is None."""
    if arrays is None:
        n_lstm, n_steps, n_env, hidden = dh_seq.shape
        dtype = dh_seq.dtype
        d_in = x.shape[2]
        four_h = 4 * hidden
        dz = _aligned_empty("dz", (n_lstm, n_steps, n_env, four_h), dtype, True)
        x_t = _aligned_empty("x_t", (d_in, n_steps * n_env), dtype, True)
        products = _aligned_empty("products", (n_lstm, d_in, four_h), dtype, True)
        w_hh_copy = _aligned_empty("w_hh", w_hh.shape, dtype, True)
    else:
        dz, x_t, products, w_hh_copy = arrays.dz, arrays.x_t, arrays.products, arrays.w_hh
    _backward_stack(dh_seq, keep, gates, tanh_c, c_prev, w_hh, x, h_prev, dz, g_w_ih, g_w_hh,
                    g_b, x_t, products, w_hh_copy)


def _keep_mask(episode_starts, shape: Tuple[int, ...], shape_name: str) -> np.ndarray:
    """``keep[t] = 1 - episode_starts[t]`` with a row of ones appended: float64 ``[T + 1, N]``.

    ``shape`` is the expected shape of ``episode_starts``: ``(T, N)``, or ``(N,)`` for one step.
    """
    starts = as_flag_array(episode_starts, "episode_starts", ndim=(len(shape),))
    check_same_shape(starts, "episode_starts", shape, shape_name)
    n_env = shape[-1]
    return keep_rows(starts.reshape(-1, n_env), np.float64)


def keep_rows(starts: np.ndarray, dtype) -> np.ndarray:
    """``keep`` of :func:`_keep_mask` from checked flags ``starts [T, N]`` (bool or 0/1), no
    checks: ``1 - starts[t]`` for ``t < T`` and a row of ones, ``[T + 1, N]`` in ``dtype``."""
    keep = np.ones((starts.shape[0] + 1, starts.shape[1]), dtype)
    keep[:-1] -= starts
    return keep


def step_stacked(w_ih_t, w_hh_t, b, x, h, c, starts):
    """Unchecked one step of L LSTMs for acting, in the dtype of ``x [N, D]``: ``w_ih_t
    [L, D, 4H]``, ``w_hh_t [L, H, 4H]`` (transposed weights), ``b [L, 4H]``, states ``h, c
    [L, N, H]``, bool ``starts [N]``; returns the new ``(h, c)`` (:func:`_step_stack`, the
    arithmetic of ``lstm_step``; ``keep`` made in the same compiled call,
    :func:`_step_stack_flags`)."""
    h_new = np.empty(h.shape, x.dtype)
    c_new = np.empty(c.shape, x.dtype)
    _step_stack_flags(x, w_ih_t, w_hh_t, b, starts, h, c, h_new, c_new)
    return h_new, c_new
