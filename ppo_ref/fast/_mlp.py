"""Machinery of the compiled MLP twins (:mod:`ppo_ref.fast.layers`, :mod:`ppo_ref.fast.networks`):
one compiled forward pass (:func:`_forward`) and one compiled backward pass (:func:`_backward`)
over a sequence of dense layers.

A network is a tuple of weights ``ws`` (``w_i [out_i, in_i]``, torch layout) and one of biases
``bs`` (``b_i [out_i]``), all C-contiguous and of one dtype (float64 or float32: the dtype of
the arithmetic), of which the first ``n_layers`` are read (the callers pad the tuples to a
multiple of 8 entries, so that one compiled version per dtype serves every network of up to 8
layers), cut into three consecutive segments: the shared trunk (``n_trunk`` layers, every one
activated, the last included), the policy tower (``n_pi`` layers) and the value tower (the
rest), each tower's layers activated except its last. A tower reads the trunk's last output, or
the input ``x [M, D]`` when there is no trunk. A plain MLP is the policy tower alone
(``n_trunk = 0``, ``n_pi = L``, no value layer). The outputs of every layer live in one 1-D
buffer ``acts``: layer ``i``'s block ``[M, out_i]`` (activated where the layer is) follows
layer ``i - 1``'s; the backward reads them.

Summation order (fixed by the code, so a row's results never depend on the other rows of the
call, on BLAS or on the machine): every product is a chain of fused multiply-adds over its
contraction index in increasing order (:func:`ppo_ref.fast.lstm._add_products`)::

    forward   a[n, j]  = fma(h[n, K-1], w[j, K-1], ... fma(h[n, 0], w[j, 0], b[j]))
    backward  gw[j, k] = fma(d[M-1, j], h[M-1, k], ... fma(d[0, j], h[0, k], 0))
              gb[j]    = (((0 + d[0, j]) + d[1, j]) + ...) + d[M-1, j]
              dh[n, k] = fma(d[n, J-1], w[J-1, k], ... fma(d[n, 0], w[0, k], 0))

then ``dh`` times the activation's derivative (tanh: ``dh * (1 - h * h)``; relu: ``dh`` where
``h > 0``, else +0). With a shared trunk the two towers' input gradients are one chain: the
value tower's terms continue the policy tower's (``dz = d_pi @ w_pi``, then ``dz += d_vf @
w_vf``). ``tanh`` is the project's own (:func:`ppo_ref.fast.lstm._tanh_any`, in the dtype of
the arithmetic). A forward pass of at most :data:`_FEW` rows computes each layer transposed
(``a.T = w @ h.T``, :func:`_feature_products`): the same chain per element, so the same bits
as on many rows.
"""
from __future__ import annotations

import numpy as np

from ppo_ref._numba import njit
from ppo_ref.fast._products import (_VECTOR_BITS, _WIDE_COLS, _WIDE_ROWS, _add_products,
                                   _block_vector_intrinsic, _fma, _tanh_any, _wide)

_ZERO = np.float32(0.0)   # dtype-neutral constants: float32 stays float32, float64 exact
_ONE = np.float32(1.0)

#: A forward pass of at most this many rows runs feature-major (``a.T = w @ h.T``, each layer's
#: output ``[out, _FEW]`` with its rows in the first columns, then copied into ``acts``): the
#: same FMA chain per element, without transposing the weights (which costs more than the
#: products on so few rows).
_FEW = 16

#: The register block of the feature-major products: 8 output rows (features) by one vector
#: register of columns (rows of the batch: 8 float64 or 16 float32 with AVX-512).
_column_block = _block_vector_intrinsic(8, _VECTOR_BITS // 64, f32_cols=_VECTOR_BITS // 32)


@njit
def _feature_products(out, w, h_t):
    """``out [J, C] += w [J, K] @ h_t [K, C]`` (``C`` a multiple of the lanes of a vector
    register in the dtype; all C-contiguous), every element the chain ``fma(w[j, K-1],
    h_t[K-1, c], ... fma(w[j, 0], h_t[0, c], out[j, c]))``: the chain of
    :func:`ppo_ref.fast.lstm._add_products` for ``h_t.T @ w.T``, so the same bits. Blocks of 8
    rows by :data:`_column_block`; the last ``J mod 8`` rows by a loop."""
    _wide()
    n_j, cols = out.shape
    lanes = _VECTOR_BITS // (8 * out.itemsize)
    j8 = n_j - n_j % 8
    for j0 in range(0, j8, 8):
        for c0 in range(0, cols, lanes):
            _column_block(out, w, h_t, j0, c0)
    for j in range(j8, n_j):
        for k in range(w.shape[1]):
            w_jk = w[j, k]
            for c in range(cols):
                out[j, c] = _fma(w_jk, h_t[k, c], out[j, c])

#: Rows per product call in the row-major passes (:func:`_products`): a multiple of the
#: register blocks' 6 and 8 rows, so that no rows are left to the products' slower loops, and
#: few enough that a chunk's outputs stay in the L1 cache between the bias, the products and
#: the activation.
_CHUNK = 48


#: The register block of the row-major forward that starts from the bias: rows ``n .. n + 5``
#: and columns ``c0 .. c0 + _WIDE_COLS - 1`` of ``out = b + a @ w_t`` (on AVX-512 6 x 32), the
#: chain of :func:`ppo_ref.fast.lstm._add_products` from ``b`` (no pass writing the bias first).
_bias_block = _block_vector_intrinsic(_WIDE_ROWS, _WIDE_COLS, panel=True)


@njit
def _products(out, a, w_t):
    """:func:`ppo_ref.fast.lstm._add_products` ``(out, a, w_t)`` (``out += a @ w_t``, ``a`` of
    any strides) by chunks of :data:`_CHUNK` rows: the same chain per element."""
    for lo in range(0, out.shape[0], _CHUNK):
        hi = min(lo + _CHUNK, out.shape[0])
        _add_products(out[lo:hi], a[lo:hi], w_t)


#: A weight gradient of fewer inputs than this (and at least as many outputs) is formed
#: transposed, ``gw.T = h.T @ d``, so that its wide axis is the one the products vectorize.
_NARROW = 16


@njit
def _strided(a):
    """``a`` (2-D) as a view typed of any strides, so that every product here passes the same
    operand types to :func:`ppo_ref.fast.lstm._add_products` (one compiled version per dtype;
    its first operand is read as scalars, whatever its strides)."""
    return a[:, 0:a.shape[1]]


@njit
def _transpose(a, a_t):
    """``a_t[j, n] = a[n, j]`` for the rows and columns of ``a`` (2-D; a copy, no
    arithmetic)."""
    _wide()
    rows, cols = a.shape
    for j in range(cols):
        for n in range(rows):
            a_t[j, n] = a[n, j]


@njit
def _activate(a, relu):
    """In place on ``a [M, J]``: ``max(a, 0)`` (relu) or ``tanh(a)`` (one loop per activation,
    so that each vectorizes)."""
    _wide()
    rows, cols = a.shape
    if relu:
        for n in range(rows):
            for j in range(cols):
                v = a[n, j]
                a[n, j] = v if v > _ZERO else _ZERO
    else:
        for n in range(rows):
            for j in range(cols):
                a[n, j] = _tanh_any(a[n, j])


@njit
def _all_finite(a):
    """True if every entry of the 2-D array ``a`` is finite (``a - a`` is 0 exactly then)."""
    _wide()
    bad = 0
    rows, cols = a.shape
    for n in range(rows):
        for j in range(cols):
            bad += (a[n, j] - a[n, j]) != _ZERO
    return bad == 0


@njit
def _forward(x, ws, bs, n_layers, n_trunk, n_pi, policy, relu):
    """The forward pass of the network of the first ``n_layers`` entries of ``ws`` and ``bs``
    (module docstring; the tuples may hold more, unread) on ``x [M, D]``.

    ``policy`` False skips the policy tower (its block of ``acts`` is left unwritten).
    Returns ``(acts, pi_start, vf_start, ok)``: the outputs buffer, the offsets in it of the
    last blocks of the policy and of the value tower, and whether both blocks are finite.
    Raises ``ValueError`` when the widths do not chain.
    """
    rows = x.shape[0]
    total = 0
    biggest = 0
    for i in range(n_layers):
        n_out, n_in = ws[i].shape
        if i == 0 or i == n_trunk or i == n_trunk + n_pi:
            width = x.shape[1] if n_trunk == 0 or i == 0 else ws[n_trunk - 1].shape[0]
        else:
            width = ws[i - 1].shape[0]
        if n_in != width or bs[i].shape[0] != n_out:
            raise ValueError("params: the layers' widths do not chain (with each other and the "
                             "input's last dimension), or a bias does not match its weight")
        total += n_out
        biggest = max(biggest, n_out * n_in)
    dt = x.dtype
    acts = np.empty(rows * total, dt)
    few = rows <= _FEW   # feature-major products: no weight is transposed
    scratch = np.empty(0 if few else biggest, dt)
    y_pi = acts[:0].reshape(rows, 0)
    y_vf = y_pi
    pi_start = vf_start = 0
    z = h = x
    lanes = _VECTOR_BITS // (8 * x.itemsize)
    cols = -(-rows // lanes) * lanes
    z_t = h_t = np.zeros((x.shape[1] if few else 0, cols), dt)
    if few:
        _transpose(x, h_t)
    start = 0
    for i in range(n_layers):
        n_out, n_in = ws[i].shape
        a = acts[start:start + rows * n_out].reshape(rows, n_out)
        start += rows * n_out
        if i == n_trunk or i == n_trunk + n_pi:
            h, h_t = z, z_t                           # a tower starts on the trunk's output
        if not policy and n_trunk <= i < n_trunk + n_pi:
            continue
        b = bs[i]
        activate = i < n_trunk or not (i == n_trunk + n_pi - 1 or i == n_layers - 1)
        if few:
            a_t = np.empty((n_out, cols), dt)
            for j in range(n_out):
                for c in range(cols):
                    a_t[j, c] = b[j]
            _feature_products(a_t, ws[i], h_t)
            _transpose(a_t[:, :rows], a)
            if activate:          # on the rows, where the activation's loop vectorizes
                _activate(a, relu)
                _transpose(a, a_t)
            h_t = a_t
        else:
            w_t = scratch[:n_in * n_out].reshape(n_in, n_out)
            _transpose(ws[i], w_t)
            for lo in range(0, rows, _CHUNK):     # a chunk's outputs stay in the L1 cache
                hi = min(lo + _CHUNK, rows)
                if hi - lo == _CHUNK and n_out % _WIDE_COLS == 0:
                    for n in range(lo, hi, _WIDE_ROWS):
                        for c0 in range(0, n_out, _WIDE_COLS):
                            _bias_block(a, _strided(h), w_t, b, n, 0, c0)
                else:
                    for n in range(lo, hi):
                        for j in range(n_out):
                            a[n, j] = b[j]
                    _add_products(a[lo:hi], _strided(h)[lo:hi], w_t)
                if activate:
                    _activate(a[lo:hi], relu)
            h = a
        if i == n_trunk - 1:
            z, z_t = a, h_t
        elif i == n_trunk + n_pi - 1:
            y_pi = a
            pi_start = start - rows * n_out
        elif i == n_layers - 1:
            y_vf = a
            vf_start = start - rows * n_out
    return acts, pi_start, vf_start, _all_finite(y_pi) and _all_finite(y_vf)


@njit
def _backward(x, ws, acts, n_layers, n_trunk, n_pi, relu, d_pi, d_vf, gws, gbs, want_dx):
    """The backward pass of :func:`_forward` (run with the policy tower) for the gradients
    ``d_pi``, ``d_vf`` of the towers' outputs (``[M, out]``; a tower without layers: ignored).

    Writes every ``gws[i] = dL/dw_i`` and ``gbs[i] = dL/db_i``; returns ``(dx, ok)``: ``dx =
    dL/dx [M, D]`` when ``want_dx`` (else ``[M, 0]``) and whether every result is finite.
    Passes are fused where that changes no operation and no order: a hidden layer's
    activation derivative with the column sums of the result (the bias gradient of the layer
    below), and a layer of at most :data:`_FUSED_OUT` outputs above another layer (a head)
    altogether (:func:`_head_backward`).
    """
    rows = x.shape[0]
    dt = x.dtype
    starts = np.empty(n_layers + 1, np.int64)
    starts[0] = 0
    for i in range(n_layers):
        starts[i + 1] = starts[i] + rows * ws[i].shape[0]
    z = x if n_trunk == 0 else acts[starts[n_trunk - 1]:starts[n_trunk]].reshape(rows, -1)
    dx = np.zeros((rows, x.shape[1] if want_dx else 0), dt)
    dz = dx if n_trunk == 0 else np.zeros(z.shape, dt)
    into = want_dx or n_trunk > 0       # the towers' input gradient is wanted
    # the policy tower, the value tower, then the trunk: each from its last layer down
    for segment in range(3):
        summed = False                  # gbs[i] already summed by the layer above
        if segment == 0:
            lo, hi, d = n_trunk, n_trunk + n_pi, d_pi
        elif segment == 1:
            lo, hi, d = n_trunk + n_pi, n_layers, d_vf
        else:
            lo, hi, d = 0, n_trunk, dz
            into = want_dx
            if n_trunk > 0:
                _activation_grad(dz, z, relu, gbs[n_trunk - 1])
                summed = True
        for i in range(hi - 1, lo - 1, -1):
            w = ws[i]
            n_out, n_in = w.shape
            h = z if i == lo and segment < 2 else (
                x if i == 0 else acts[starts[i - 1]:starts[i]].reshape(rows, n_in))
            gw, gb = gws[i], gbs[i]
            if i > lo and n_out <= _FUSED_OUT:
                d_prev = np.empty((rows, n_in), dt)
                _head_backward(d, w, h, relu, gw, gb, d_prev, gbs[i - 1])
                d = d_prev
                summed = True
                continue
            if n_in < _NARROW <= n_out:       # gw.T = h.T @ d, the same chains
                gw_t = np.zeros((n_in, n_out), dt)
                _products(gw_t, _strided(h.T), d)
                _transpose(gw_t, gw)
            else:
                gw[:, :] = _ZERO
                _products(gw, _strided(d.T), h)
            if not summed:
                gb[:] = _ZERO
                for n in range(rows):
                    for j in range(n_out):
                        gb[j] += d[n, j]
            summed = False
            if i > lo:
                d_prev = np.zeros((rows, n_in), dt)
                _products(d_prev, _strided(d), w)
                _activation_grad(d_prev, h, relu, gbs[i - 1])
                d = d_prev
                summed = True
            elif segment == 2 and want_dx:
                _products(dx, _strided(d), w)
            elif segment < 2 and into:
                _products(dz, _strided(d), w)
    ok = _all_finite(dx)
    for i in range(n_layers):
        ok = ok and _all_finite(gws[i]) and _all_finite(gbs[i].reshape(1, -1))
    return dx, ok


@njit
def _activation_grad(d, h, relu, sums):
    """In place on ``d [M, K]``: ``d * act'(h)``, ``h`` the activation's output (tanh: ``d *
    (1 - h * h)``; relu: ``d`` where ``h > 0``, else +0); and ``sums [K]`` the column sums of
    the result, rows added in order from 0."""
    _wide()
    rows, cols = d.shape
    sums[:] = _ZERO
    if relu:
        for n in range(rows):
            for k in range(cols):
                g = d[n, k] if h[n, k] > _ZERO else _ZERO
                d[n, k] = g
                sums[k] += g
    else:
        for n in range(rows):
            for k in range(cols):
                g = d[n, k] * (_ONE - h[n, k] * h[n, k])
                d[n, k] = g
                sums[k] += g


#: A layer of at most this many outputs above another layer (a value head, a policy head of a
#: few actions) takes its backward in one pass over the rows (:func:`_head_backward`).
_FUSED_OUT = 4


@njit
def _head_backward(d, w, h, relu, gw, gb, d_prev, gb_below):
    """The backward of a layer of ``J <= _FUSED_OUT`` outputs whose ``K`` inputs ``h [M, K]``
    are the activated outputs of the layer below, for ``d [M, J]`` and ``w [J, K]``, row by
    row, bit for bit the separate passes: ``gw = d.T @ h`` (chains over the rows in order,
    from 0), ``gb`` the column sums of ``d``, ``d_prev = (d @ w) * act'(h)`` (each element the
    chain over j from 0, then the derivative as :func:`_activation_grad`) and ``gb_below``
    the column sums of ``d_prev``. (For so few outputs, a product's register blocks would load
    and store a whole ``[M, K]`` array for one or two terms.)"""
    _wide()
    rows, n_out = d.shape
    n_in = w.shape[1]
    # weight rows 1..3 (the first when there are fewer: read but unused)
    w0, w1, w2, w3 = w[0], w[min(1, n_out - 1)], w[min(2, n_out - 1)], w[min(3, n_out - 1)]
    gw[:, :] = _ZERO
    gb[:] = _ZERO
    gb_below[:] = _ZERO
    for n in range(rows):
        d0, d1 = d[n, 0], d[n, min(1, n_out - 1)]
        d2, d3 = d[n, min(2, n_out - 1)], d[n, min(3, n_out - 1)]
        for k in range(n_in):
            o = _fma(d0, w0[k], _ZERO)
            if n_out > 1:
                o = _fma(d1, w1[k], o)
            if n_out > 2:
                o = _fma(d2, w2[k], o)
            if n_out > 3:
                o = _fma(d3, w3[k], o)
            v = h[n, k]
            o = (o if v > _ZERO else _ZERO) if relu else o * (_ONE - v * v)
            d_prev[n, k] = o
            gb_below[k] += o
        for j in range(n_out):
            d_nj = d[n, j]
            gb[j] += d_nj
            for k in range(n_in):
                gw[j, k] = _fma(d_nj, h[n, k], gw[j, k])
