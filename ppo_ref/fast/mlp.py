"""The compiled tier of the MLP: towers whose layers live in one flat parameter buffer.

:func:`mlp_forward_flat` equals :func:`ppo_ref.spec.layers.mlp_forward` and
:func:`mlp_backward_flat` equals :func:`ppo_ref.spec.layers.mlp_backward` (the same
parameters, read through a layer table) in float64 within rtol 1e-12, atol 1e-14 per result
array (``|fast - spec| <= 1e-14 + 1e-12 * max|spec|``: the ``mlp`` row of
``tests/test_tiers.py``, random tables); float32 buffers give the same computation in float32.
Their summation order is fixed by the code (section comment below), so a row's results do not
depend on the other rows of the call, on BLAS or on the machine. They are the towers of the
fast policies (:mod:`ppo_ref.fast.actor_critic`, :mod:`ppo_ref.train.recurrent_policies`); the
readable MLP is :mod:`ppo_ref.spec.layers` (re-exported by :mod:`ppo_ref.nn.mlp`).
:func:`mlp_forward_pair` and :func:`mlp_backward_pair` are two calls of them on one buffer, run
on numba's threads (``ppo_ref._numba``, "Threads"; the same bits as the two calls in turn).

Layer keys and layout are the spec's: ``prefix + "w{i}"`` ``[out, in]`` (torch layout, ``y =
x @ w.T + b``) and ``prefix + "b{i}"`` ``[out]``, checked by the spec's
:func:`ppo_ref.spec.layers.mlp_depth`; :func:`layer_table` turns the checked layers into the
offsets table the kernels read.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from numba import prange
from numba.extending import overload

from ppo_ref._numba import njit
from ppo_ref.fast.lstm import (_BLOCK_COLS, _BLOCK_ROWS, _NARROW_COLS, _WIDE_COLS, _WIDE_MIN_ROWS,
                              _WIDE_ROWS, _add_products, _block_vector_intrinsic,
                              _check_panel_operands, _column_sums, _fma, _linear_panel,
                              _linear_rows, _panel_block, _tanh_any, _transpose_into, _wide)

__all__ = ["mlp_forward_flat", "mlp_backward_flat", "mlp_forward_pair", "mlp_backward_pair",
           "layer_table"]  # called by the fast policies


# --------------------------------------------------------------------------------------------
# layer tables (the parameters are checked by the spec's parsing, once per layout, by the callers)

def layer_table(layout, params: Mapping, prefix: str, depth: int) -> np.ndarray:
    """The layer table of :func:`mlp_forward_flat` (int64 ``[depth, 4]``, row ``i`` = ``(w
    offset, b offset, out_i, in_i)``) of the MLP of ``depth`` layers stored in ``params`` under
    ``prefix + "w{i}"``, ``prefix + "b{i}"``, whose arrays are views of a buffer of ``layout``
    (a :class:`~ppo_ref.fast.flat.FlatLayout`). Unchecked: ``depth`` comes from the spec's
    check of those layers (:func:`ppo_ref.spec.layers.mlp_depth`, or
    :func:`ppo_ref.spec.networks.actor_critic_towers`)."""
    return np.array([(layout.offset(f"{prefix}w{i}"), layout.offset(f"{prefix}b{i}"))
                     + tuple(params[f"{prefix}w{i}"].shape) for i in range(depth)],
                    dtype=np.int64).reshape(depth, 4)


# --------------------------------------------------------------------------------------------
# Compiled MLP on a flat parameter buffer (the fast policies' towers)
#
# An MLP whose layers live in one 1-D buffer ``flat`` (float64 or float32), described by a
# layer table ``table`` int64 ``[L, 4]``: row i = ``(w offset, b offset, out_i, in_i)``, so
# ``w_i = flat[w_off : w_off + out_i * in_i].reshape(out_i, in_i)`` (torch layout) and
# ``b_i = flat[b_off : b_off + out_i]``. The gradients go into a buffer of the same layout (the
# same table). The outputs of all layers of a batch of M rows are kept in one 1-D buffer
# ``acts`` of ``M * sum_i out_i`` entries: layer i's block ``[M, out_i]`` (post-activation for
# the hidden layers, the linear output for the last) follows layer i-1's.
#
# Summation order (documented, BLAS-independent, so the results are the same on every machine
# with IEEE 754 fused multiply-add, whatever BLAS is installed): every product is a chain of
# FMAs by :func:`ppo_ref.fast.lstm._add_products`,
#
#     forward     a[n, j]     = fma(h[n, K-1], w[j, K-1], ... fma(h[n, 0], w[j, 0], b[j]))
#                               (k = 0 .. in-1: a row never depends on another row)
#     backward    gw[j, k]    = fma(d[M-1, j], h[M-1, k], ... fma(d[0, j], h[0, k], 0))
#                               (rows n = 0 .. M-1 in order)
#                 gb[j]       = (((0 + d[0, j]) + d[1, j]) + ...) + d[M-1, j]
#                 dh[n, k]    = fma(d[n, out-1], w[out-1, k], ... fma(d[n, 0], w[0, k], 0))
#                               (j = 0 .. out-1), then times act'(.) for a hidden layer;
#                 dx[n, k]   += the same chain for layer 0, continuing from dx's entry.
#
# Activations: relu ``max(a, 0)`` (derivative ``[h > 0]``, 0 at 0 as torch) or tanh by the
# project's own :func:`ppo_ref.fast.lstm._tanh_any` (derivative ``1 - h^2``), in the dtype of the
# buffers. The kernels call ``_add_products``, ``_linear_rows`` and ``_tanh_any`` of
# :mod:`ppo_ref.fast.lstm` (one product primitive for the whole project).
# --------------------------------------------------------------------------------------------

_ZERO_F32 = np.float32(0.0)   # dtype-neutral constants: float32 stays float32, float64 exact
_ONE_F32 = np.float32(1.0)


@njit
def _activate_inplace(a, relu):
    """``a <- relu(a)`` (``a > 0 ? a : 0``) or ``a <- tanh(a)`` (:func:`_tanh_any`), 2-D."""
    _wide()
    rows, cols = a.shape
    if relu:
        for n in range(rows):
            for j in range(cols):
                v = a[n, j]
                a[n, j] = v if v > _ZERO_F32 else _ZERO_F32
    else:
        for n in range(rows):
            for j in range(cols):
                a[n, j] = _tanh_any(a[n, j])


@njit
def _activation_grad(d, h, relu):
    """``d <- d * act'(h)`` (``h`` the activation's output: relu ``[h > 0]``, tanh ``1 - h^2``),
    2-D ``d, h [M, W]``. tanh: ``d * (1 - h * h)`` in that order; relu: ``d`` where ``h > 0``,
    else +0 (a product ``d * 0.0`` could give -0; no sum downstream differs)."""
    _wide()
    rows, cols = d.shape
    if relu:
        for n in range(rows):
            for j in range(cols):
                d[n, j] = d[n, j] if h[n, j] > _ZERO_F32 else _ZERO_F32
    else:
        for n in range(rows):
            for j in range(cols):
                d[n, j] *= _ONE_F32 - h[n, j] * h[n, j]


# A weight gradient ``gw [out, in]`` with fewer than this many inputs (a first layer on a few
# observation features) is formed as ``gw.T`` (its wide ``out`` axis vectorized) and copied.
_NARROW = 16


def _linear_block_wide(out, a, w_t, b, n, j0, c0):
    """``out[m, j0+c] = fma(a[m, K-1], w_t[K-1, c], ... fma(a[m, 0], w_t[0, c], b[j0+c]))`` for
    the rows ``m = n .. n + _WIDE_ROWS - 1`` and columns ``c = c0 .. c0 + _WIDE_COLS - 1`` (the
    chain of :func:`ppo_ref.fast.lstm._linear_rows`). Interpreted here; compiled, a register
    block of :func:`ppo_ref.fast.lstm._block_vector_intrinsic` (``panel=True``: accumulators
    start from the bias)."""
    _panel_block(out, a, w_t, b, n, j0, c0, _WIDE_COLS, _WIDE_ROWS)


_linear_block_wide_vector = _block_vector_intrinsic(_WIDE_ROWS, _WIDE_COLS, panel=True)


@overload(_linear_block_wide)
def _linear_block_wide_compiled(out, a, w_t, b, n, j0, c0):
    """Compiled, :func:`_linear_block_wide` is a register block (operands checked at typing by
    :func:`ppo_ref.fast.lstm._check_panel_operands`)."""
    _check_panel_operands(out, a, w_t, b)
    return lambda out, a, w_t, b, n, j0, c0: _linear_block_wide_vector(out, a, w_t, b, n, j0,
                                                                       c0)


@njit
def _linear_loops(h, w_t, b, out, n_lo, n_hi, c_lo):
    """Rows ``n_lo .. n_hi - 1``, columns ``c_lo ..`` of ``out = b + h @ w_t`` (the chain of
    :func:`ppo_ref.fast.lstm._linear_rows`), the loop over the columns vectorized."""
    _wide()
    n_j = out.shape[1]
    for m in range(n_lo, n_hi):
        for c in range(c_lo, n_j):
            out[m, c] = b[c]
        for k in range(h.shape[1]):
            hm = h[m, k]
            for c in range(c_lo, n_j):
                out[m, c] = _fma(hm, w_t[k, c], out[m, c])


@njit
def _dense_layer(h, w_t, b, out, activate, relu):
    """``out = b + h @ w_t`` (:func:`ppo_ref.fast.lstm._linear_rows`: every element the same
    FMA chain over k = 0, 1, ... starting from the bias), then, when ``activate``, ``out <-
    act(out)`` (:func:`_activate_inplace`), bit for bit those two passes: ``h [M, K]`` (any
    strides), ``w_t [K, J]``, ``b [J]``, ``out [M, J]`` C-contiguous, one dtype. The register
    blocks start from the bias (no pass writing it first), and each group of rows is activated
    right after its products, while it is in cache. A layer of at most two outputs (a head) is
    :func:`ppo_ref.fast.lstm._linear_rows` itself."""
    rows = h.shape[0]
    n_j = out.shape[1]
    if n_j <= _NARROW_COLS:
        _linear_rows(h, w_t, b, out)
        if activate:
            _activate_inplace(out, relu)
        return
    wide = rows >= _WIDE_MIN_ROWS
    group = _WIDE_ROWS if wide else _BLOCK_ROWS
    cols = _WIDE_COLS if wide else _BLOCK_COLS
    n_blocked = rows - rows % group
    c_blocked = n_j - n_j % cols
    for n in range(0, n_blocked, group):
        for c0 in range(0, c_blocked, cols):
            if wide:
                _linear_block_wide(out, h, w_t, b, n, 0, c0)
            else:
                _linear_panel(out, h, w_t, b, n, 0, c0)
        if c_blocked < n_j:
            _linear_loops(h, w_t, b, out, n, n + group, c_blocked)
        if activate:
            _activate_inplace(out[n:n + group], relu)
    if n_blocked < rows:
        _linear_loops(h, w_t, b, out, n_blocked, rows, 0)
        if activate:
            _activate_inplace(out[n_blocked:], relu)


@njit
def _transpose_weight(w, w_t):
    """``w_t[k, j] = w[j, k]`` (2-D, C-contiguous): a weight's column read into each row of
    ``w_t`` (contiguous stores; a copy, no arithmetic)."""
    _wide()
    n_out, n_in = w.shape
    for k in range(n_in):
        for j in range(n_out):
            w_t[k, j] = w[j, k]


@njit
def mlp_forward_flat(x, flat, table, relu, acts):
    """Compiled MLP forward on a flat parameter buffer (section comment above): equals
    :func:`ppo_ref.spec.layers.mlp_forward` in float64 within rtol 1e-12, atol 1e-14 (the
    ``mlp`` row of ``tests/test_tiers.py``).

    Args:
        x: ``[M, in_0]`` C-contiguous, the dtype of ``flat`` (float64 or float32).
        flat: 1-D parameter buffer; table: int64 ``[L, 4]`` layer table.
        relu: True for relu hidden layers, False for tanh.
        acts: 1-D ``[M * sum_i out_i]``, written: every layer's output (the last block is
            ``y [M, out_L]``).

    ``a_i = b_i + h_i @ w_i.T`` (FMA chains in input order from the bias, row by row: a row's
    outputs never depend on the other rows of the call), ``h_{i+1} = act(a_i)`` for i < L-1,
    both by :func:`_dense_layer` (bit for bit :func:`ppo_ref.fast.lstm._linear_rows` then
    :func:`_activate_inplace`). Each weight is transposed into a scratch ``[in, out]`` first
    (one scratch for all the layers).
    Unchecked: the caller guarantees shapes, contiguity and one dtype.
    """
    rows = x.shape[0]
    n_layers = table.shape[0]
    size = 0
    for i in range(n_layers):
        size = max(size, table[i, 2] * table[i, 3])
    scratch = np.empty(size, flat.dtype)  # every layer's transposed weight in turn
    h = x
    start = 0
    for i in range(n_layers):
        w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
        w_t = scratch[:n_in * n_out].reshape(n_in, n_out)
        _transpose_weight(flat[w_off:w_off + n_out * n_in].reshape(n_out, n_in), w_t)
        a = acts[start:start + rows * n_out].reshape(rows, n_out)
        _dense_layer(h, w_t, flat[b_off:b_off + n_out], a, i < n_layers - 1, relu)
        h = a
        start += rows * n_out


#: A layer with at most this many outputs (a value head, a policy head of a few actions) that is
#: not a tower's first takes its backward by :func:`_narrow_layer_backward` in
#: :func:`mlp_backward_flat`.
_FUSED_OUT = 4


@njit
def _narrow_layer_backward(d, w, h, relu, gw, gb, d_prev, gb_below):
    """The backward of a layer of ``J`` <= :data:`_FUSED_OUT` outputs and ``K`` inputs that
    are the activation outputs ``h [M, K]`` of the layer below, for ``d [M, J]`` (``dL/d
    output``), ``w [J, K]``, all of one dtype, in one pass over the rows, bit for bit what
    the separate passes (``_add_products``, ``_activation_grad``, ``_column_sums``) compute
    for it (the same operations in the same order):

    * ``gw [J, K]``: ``fma(d[M-1, j], h[M-1, k], ... fma(d[0, j], h[0, k], 0))`` (rows in
      order: ``_add_products(gw, d.T, h)`` on zeros);
    * ``gb [J]``: ``(((0 + d[0, j]) + d[1, j]) + ...)`` (``_column_sums``);
    * ``d_prev [M, K] = (d @ w) * act'(h)``: per element the chain ``fma(d[n, J-1], w[J-1,
      k], ... fma(d[n, 0], w[0, k], 0))`` (``_add_products`` into zeros), then ``relu``: that
      value where ``h > 0``, else +0; tanh: times ``(1 - h * h)`` (``_activation_grad``);
    * ``gb_below [K]``: the column sums of ``d_prev``, rows in order (the bias gradient of
      the layer below, ``_column_sums``).

    For an output layer of a few units the register blocks of ``_add_products`` would load
    and store whole ``[M, K]`` results for every one or two terms; here each row's chains
    run vectorized over k while the row is in cache."""
    _wide()
    rows, n_out = d.shape
    n_in = w.shape[1]
    j1, j2, j3 = min(1, n_out - 1), min(2, n_out - 1), min(3, n_out - 1)  # (past J: unread)
    w0, w1, w2, w3 = w[0], w[j1], w[j2], w[j3]
    gw[:, :] = _ZERO_F32
    gb[:] = _ZERO_F32
    gb_below[:] = _ZERO_F32
    for n in range(rows):
        d0, d1, d2, d3 = d[n, 0], d[n, j1], d[n, j2], d[n, j3]
        for k in range(n_in):
            o = _fma(d0, w0[k], _ZERO_F32)
            if n_out > 1:
                o = _fma(d1, w1[k], o)
            if n_out > 2:
                o = _fma(d2, w2[k], o)
            if n_out > 3:
                o = _fma(d3, w3[k], o)
            if relu:
                o = o if h[n, k] > _ZERO_F32 else _ZERO_F32
            else:
                o = o * (_ONE_F32 - h[n, k] * h[n, k])
            d_prev[n, k] = o
            gb_below[k] += o
        for j in range(n_out):
            d_nj = d[n, j]
            gb[j] += d_nj
            for k in range(n_in):
                gw[j, k] = _fma(d_nj, h[n, k], gw[j, k])


@njit
def _activation_grad_sums(d, h, relu, bias_grad):
    """:func:`_activation_grad` on ``d [M, K]`` (in place) and then
    :func:`ppo_ref.fast.lstm._column_sums` of the result into ``bias_grad [K]``, in one pass
    over the rows (the same operations in the same order: the same bits)."""
    _wide()
    rows, cols = d.shape
    bias_grad[:] = _ZERO_F32
    for n in range(rows):
        for k in range(cols):
            if relu:
                v = d[n, k] if h[n, k] > _ZERO_F32 else _ZERO_F32
            else:
                v = d[n, k] * (_ONE_F32 - h[n, k] * h[n, k])
            d[n, k] = v
            bias_grad[k] += v


@njit
def mlp_backward_flat(x, acts, flat, table, relu, dy, grads, dx):
    """Compiled MLP backward on a flat parameter buffer (section comment above): equals
    :func:`ppo_ref.spec.layers.mlp_backward` in float64 within rtol 1e-12, atol 1e-14, relative
    to each array's largest entry (the ``mlp`` row of ``tests/test_tiers.py``).

    Args:
        x, acts, flat, table, relu: as given to (and written by) :func:`mlp_forward_flat`.
        dy: ``[M, out_L]`` C-contiguous, ``dL/dy``; not modified.
        grads: 1-D buffer of the layout of ``flat``: ``dL/dw_i``, ``dL/db_i`` are written at the
            table's offsets (other entries untouched).
        dx: ``[M, in_0]``: ``dL/dx`` is ADDED to it (zero it first for ``dL/dx`` alone; two
            towers on the same input accumulate into one array); ``None``: not computed (the
            input is data, e.g. observations).

    ``dw_i = d_i.T @ h_i``, ``db_i = sum_n d_i[n]``, ``d_{i-1} = (d_i @ w_i) * act'(h_i)``
    with ``d_L = dy``, in the summation order of the section comment (gw by
    ``_add_products(gw, d_i.T, h_i)`` on the transposed view, rows in order; for a layer of
    fewer than 16 inputs and at least 16 outputs, ``gw.T`` by ``_add_products(gw_t, h_i.T,
    d_i)``: the same products in the same order, so the same bits). Passes are fused where
    that changes no operation or order: a hidden layer's activation derivative and the column
    sums of the result (the bias gradient of the layer below) in one pass
    (:func:`_activation_grad_sums`), and a layer of at most :data:`_FUSED_OUT` outputs above
    another layer (a value or policy head) in one pass over the rows altogether
    (:func:`_narrow_layer_backward`). All arrays one dtype; unchecked.
    """
    rows = x.shape[0]
    n_layers = table.shape[0]
    end = 0
    for i in range(n_layers):
        end += rows * table[i, 2]
    d = dy
    for i in range(n_layers - 1, -1, -1):
        w_off, b_off, n_out, n_in = table[i, 0], table[i, 1], table[i, 2], table[i, 3]
        end -= rows * n_out          # now the start of layer i's block = the end of its input's
        h = x if i == 0 else acts[end - rows * n_in:end].reshape(rows, n_in)
        w = flat[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        gw = grads[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        if i > 0 and n_out <= _FUSED_OUT:  # the whole layer in one pass
            below = table[i - 1, 1]
            d_prev = np.empty((rows, n_in), dy.dtype)
            _narrow_layer_backward(d, w, h, relu, gw, grads[b_off:b_off + n_out], d_prev,
                                   grads[below:below + n_in])
            d = d_prev
            continue
        if n_in < _NARROW and n_out >= _NARROW:  # gw.T [in, out] (same chains), then copied
            gw_t = np.zeros((n_in, n_out), dy.dtype)
            _add_products(gw_t, h.T, d)
            _transpose_into(gw_t, gw)
        else:
            gw[:, :] = 0.0
            _add_products(gw, d.T, h)
        if i == n_layers - 1:  # (below the top, the layer above summed d into it)
            _column_sums(d, grads[b_off:b_off + n_out])
        if i == 0:
            if dx is not None:
                _add_products(dx, d, w)
        else:
            below = table[i - 1, 1]
            d_prev = np.zeros((rows, n_in), dy.dtype)
            _add_products(d_prev, d, w)
            _activation_grad_sums(d_prev, h, relu, grads[below:below + n_in])
            d = d_prev


@njit(parallel=True)
def mlp_forward_pair(flat, relu, x_0, table_0, acts_0, x_1, table_1, acts_1):
    """:func:`mlp_forward_flat` of two towers on one parameter buffer: equals
    :func:`ppo_ref.spec.layers.mlp_forward` of each tower as :func:`mlp_forward_flat` does (the
    ``mlp_pair`` row of ``tests/test_tiers.py``), the two calls on numba's threads
    (``prange``).

    Args:
        flat, relu: the parameter buffer and activation of both calls (as
            :func:`mlp_forward_flat`'s).
        x_0, table_0, acts_0 / x_1, table_1, acts_1: each call's ``x [M_k, in_0]``, layer table
            and outputs buffer (written), as :func:`mlp_forward_flat` takes them; the inputs may
            be one array, ``acts_0`` and ``acts_1`` must be distinct.

    Neither call reads what the other writes, so the results are those of the two calls in
    turn, bit for bit. Unchecked: the caller guarantees shapes, contiguity and one dtype."""
    for k in prange(2):
        if k == 0:
            mlp_forward_flat(x_0, flat, table_0, relu, acts_0)
        else:
            mlp_forward_flat(x_1, flat, table_1, relu, acts_1)


@njit(parallel=True)
def mlp_backward_pair(flat, relu, grads, x_0, acts_0, table_0, dy_0, dx_0, x_1, acts_1,
                       table_1, dy_1, dx_1):
    """:func:`mlp_backward_flat` of two towers on one parameter buffer: equals
    :func:`ppo_ref.spec.layers.mlp_backward` of each tower as :func:`mlp_backward_flat` does
    (the ``mlp_pair`` row of ``tests/test_tiers.py``), the two calls on numba's threads
    (``prange``).

    Args:
        flat, relu, grads: the parameter buffer, activation and gradient buffer of both calls
            (as :func:`mlp_backward_flat`'s; the two tables name disjoint entries of ``grads``).
        x_0, acts_0, table_0, dy_0, dx_0 / x_1, acts_1, table_1, dy_1, dx_1: each call's
            ``x``, outputs buffer, layer table, ``dy [M_k, out_L]`` and ``dx [M_k, in_0]``
            (added to) or None, as :func:`mlp_backward_flat` takes them; ``dx_0`` and ``dx_1``
            distinct arrays or None (towers that add into one input gradient, e.g. on a shared
            trunk, are two :func:`mlp_backward_flat` calls in turn).

    Neither call reads what the other writes, so the results are those of the two calls in
    turn, bit for bit. Unchecked: the caller guarantees shapes, contiguity and one dtype."""
    for k in prange(2):
        if k == 0:
            mlp_backward_flat(x_0, acts_0, flat, table_0, relu, dy_0, grads, dx_0)
        else:
            mlp_backward_flat(x_1, acts_1, flat, table_1, relu, dy_1, grads, dx_1)
