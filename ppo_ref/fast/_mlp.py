"""Machinery of the compiled MLP twins (:mod:`ppo_ref.fast.layers`, :mod:`ppo_ref.fast.networks`):
one compiled forward pass (:func:`_forward`) and one backward pass (:func:`_backward`).

A network is a tuple of weights ``ws`` (``w_i [out_i, in_i]``) and one of biases ``bs``
(``b_i [out_i]``), C-contiguous, of one dtype (that of the arithmetic), of which the first
``n_layers`` are read (the tuples are padded to 8 entries: one compiled version per dtype), cut
into the shared trunk (``n_trunk`` layers, all activated), the policy tower (``n_pi`` layers)
and the value tower (the rest), each tower's last layer not activated. A tower reads the trunk's
last output, or ``x [M, D]`` when there is no trunk; a plain MLP is the policy tower alone.
Layer ``i``'s outputs ``[M, out_i]`` follow layer ``i - 1``'s in one 1-D buffer ``acts``.

Every product is a chain of fused multiply-adds in increasing index order
(:func:`ppo_ref.fast._products._add_products`)::

    forward   a[n, j]  = fma(h[n, K-1], w[j, K-1], ... fma(h[n, 0], w[j, 0], b[j]))
    backward  gw[j, k] = fma(d[M-1, j], h[M-1, k], ... fma(d[0, j], h[0, k], 0))
              gb[j]    = (((0 + d[0, j]) + d[1, j]) + ...) + d[M-1, j]
              dh[n, k] = fma(d[n, J-1], w[J-1, k], ... fma(d[n, 0], w[0, k], 0))

then ``dh`` times the activation's derivative (tanh: ``dh * (1 - h * h)``; relu: ``dh`` where
``h > 0``, else +0). With a shared trunk the value tower's input-gradient terms continue the
policy tower's chain. ``tanh``: :func:`ppo_ref.fast._products._tanh_any`.
"""
from __future__ import annotations

import numpy as np
from numba.extending import overload

from ppo_ref._numba import njit
from ppo_ref.fast._products import (_ZERO, _ONE, _add_products, _all_finite, _select,
                                    _strided, _tanh, _tanh_any, _tanh_f32, _transpose_into,
                                    _vector_lanes, _wide)

#: A forward pass of at most this many rows runs feature-major (``a.T = b + w @ h.T``, the rows
#: padded to whole vector registers): the same chains, without transposing the weights.
_FEW = 16

#: A weight gradient of fewer inputs than this (and at least as many outputs) is formed
#: transposed, ``gw.T = h.T @ d``, so that its wide axis is the one the products vectorize.
_NARROW = 16


def _activate(a, relu):
    """In place on the 1-D array ``a``: ``max(a, 0)`` as ``a if a > 0 else 0`` (relu) or
    ``tanh(a)`` (:func:`ppo_ref.fast._products._tanh_any`). Interpreted: whole-array
    operations; compiled: one loop per activation, so that each vectorizes."""
    a[...] = _select(a > _ZERO, a, _ZERO) if relu else _tanh_any(a)


@overload(_activate)
def _activate_compiled(a, relu):
    tanh = _tanh_f32 if a.dtype.bitwidth == 32 else _tanh   # (what _tanh_any picks)
    def activate(a, relu):
        _wide()
        if relu:
            for i in range(a.size):
                v = a[i]
                a[i] = v if v > _ZERO else _ZERO
        else:
            for i in range(a.size):
                a[i] = tanh(a[i])
    return activate


@njit
def _forward(x, ws, bs, n_layers, n_trunk, n_pi, policy, value, keep, relu, buffer):
    """The forward pass of the network of the first ``n_layers`` entries of ``ws`` and ``bs``
    (module docstring; the tuples may hold more, unread) on ``x [M, D]``.

    ``policy`` / ``value`` False skip the policy / value tower (its blocks of ``acts`` are left
    unwritten); ``keep`` False leaves the hidden layers' blocks unwritten where they are not
    computed in place (a pass whose cache is not wanted). ``acts`` is the first ``M * sum_i
    out_i`` entries of the 1-D ``buffer`` (of the dtype of ``x``), a new array when it is
    shorter. Returns ``(acts, pi_start, vf_start, ok)``: the outputs buffer, the offsets in it
    of the last blocks of the policy and of the value tower, and whether the blocks of the
    towers run are finite. Raises ``ValueError`` when the widths do not chain.
    """
    rows, d_in = x.shape
    dt = x.dtype
    pi_end = n_trunk + n_pi
    total = 0
    biggest = 0
    for i in range(n_layers):
        n_out, n_in = ws[i].shape
        if i == 0 or (n_trunk == 0 and i == pi_end):
            width = d_in
        elif i == n_trunk or i == pi_end:
            width = ws[n_trunk - 1].shape[0]
        else:
            width = ws[i - 1].shape[0]
        if n_in != width or bs[i].shape[0] != n_out:
            raise ValueError("params: the layers' widths do not chain (with each other and the "
                             "input's last dimension), or a bias does not match its weight")
        total += n_out
        biggest = max(biggest, n_out * n_in)
    acts = buffer[:rows * total] if buffer.size >= rows * total else np.empty(rows * total, dt)
    few = rows <= _FEW
    lanes = _vector_lanes(x)
    cols = -(-rows // lanes) * lanes if few else 0   # feature-major: rows padded to vectors
    # feature-major: x.T and every layer's a.T, [width, cols] each; row-major: each weight
    # transposed in turn
    scratch = np.empty((d_in + total) * cols if few else biggest, dt)
    x_t = scratch[:d_in * cols].reshape(d_in if few else 0, cols)
    for k in range(x_t.shape[0]):
        for n in range(rows):
            x_t[k, n] = x[n, k]
        for n in range(rows, cols):
            x_t[k, n] = _ZERO
    z, z_t = x, x_t          # the towers' input: the trunk's output, or x
    h, h_t = x, x_t
    pi_start = vf_start = 0
    ok = True
    start = 0
    start_t = d_in * cols
    for i in range(n_layers):
        w, b = ws[i], bs[i]
        n_out, n_in = w.shape
        a = acts[start:start + rows * n_out].reshape(rows, n_out)
        start += rows * n_out
        if i == n_trunk or i == pi_end:
            h, h_t = z, z_t
        if (n_trunk <= i < pi_end and not policy) or (i >= pi_end and not value):
            continue
        last = i == pi_end - 1 or i == n_layers - 1
        activate = i < n_trunk or not last
        if few:
            a_t = scratch[start_t:start_t + n_out * cols].reshape(n_out, cols)
            start_t += n_out * cols
            for j in range(n_out):
                for c in range(cols):
                    a_t[j, c] = b[j]
            _add_products(a_t, _strided(w), h_t)
            if activate:
                _activate(a_t.reshape(-1), relu)
            if keep or last:
                for n in range(rows):
                    for j in range(n_out):
                        a[n, j] = a_t[j, n]
            h_t = a_t
        else:
            w_t = scratch[:n_in * n_out].reshape(n_in, n_out)
            _transpose_into(w, w_t)
            for n in range(rows):
                for j in range(n_out):
                    a[n, j] = b[j]
            _add_products(a, _strided(h), w_t)
            if activate:
                _activate(a.reshape(-1), relu)
        h = a
        if i == n_trunk - 1:
            z, z_t = a, h_t
        if last and i >= n_trunk:
            ok = ok and _all_finite(a.reshape(-1))
            if i == pi_end - 1:
                pi_start = start - rows * n_out
            else:
                vf_start = start - rows * n_out
    return acts, pi_start, vf_start, ok


def _activation_grad(d, h, relu, sums):
    """In place on ``d [M, K]``: ``d * act'(h)``, ``h`` the activation's output (tanh: ``d *
    (1 - h * h)``; relu: ``d`` where ``h > 0``, else +0); and ``sums [K]`` the column sums of
    the result, rows added in order from 0. Interpreted: whole rows at a time."""
    d[...] = _select(h > _ZERO, d, _ZERO) if relu else d * (_ONE - h * h)
    sums[:] = _ZERO
    for n in range(d.shape[0]):
        sums += d[n]


@overload(_activation_grad)
def _activation_grad_compiled(d, h, relu, sums):
    def activation_grad(d, h, relu, sums):
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
    return activation_grad


@njit
def _backward(x, ws, acts, n_layers, n_trunk, n_pi, relu, d_pi, d_vf, gws, gbs, want_dx):
    """The backward pass of :func:`_forward` (run with both towers) for the gradients
    ``d_pi``, ``d_vf`` of the towers' outputs (``[M, out]``; a tower without layers: ignored).

    Writes every ``gws[i] = dL/dw_i`` and ``gbs[i] = dL/db_i``; returns ``(dx, ok)``: ``dx =
    dL/dx [M, D]`` when ``want_dx`` (else ``[M, 0]``) and whether every result is finite. A
    hidden layer's activation derivative is taken with the column sums of the result (the
    bias gradient of the layer below) in one pass.
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
            if n_in < _NARROW <= n_out:       # gw.T = h.T @ d, the same chains
                gw_t = np.zeros((n_in, n_out), dt)
                _add_products(gw_t, _strided(h.T), d)
                _transpose_into(gw_t, gw)
            else:
                gw[:, :] = _ZERO
                _add_products(gw, _strided(d.T), h)
            if not summed:
                gb[:] = _ZERO
                for n in range(rows):
                    for j in range(n_out):
                        gb[j] += d[n, j]
            summed = False
            if i > lo:
                d_prev = np.zeros((rows, n_in), dt)
                _add_products(d_prev, _strided(d), w)
                _activation_grad(d_prev, h, relu, gbs[i - 1])
                d = d_prev
                summed = True
            elif segment == 2 and want_dx:
                _add_products(dx, _strided(d), w)
            elif segment < 2 and into:
                _add_products(dz, _strided(d), w)
    ok = _all_finite(dx.reshape(-1))
    for i in range(n_layers):
        ok = ok and _all_finite(gws[i].reshape(-1)) and _all_finite(gbs[i])
    return dx, ok
