"""The compiled tier's MLP: the twins of :func:`ppo_ref.spec.layers.mlp_forward` and
:func:`ppo_ref.spec.layers.mlp_backward` (the readable definitions, whose docstrings state the
equations).

Both take the spec's parameters (``{"w0", "b0", ..., "wL", "bL"}``, ``w_i [out_i, in_i]``)
and inputs ``x [..., in]`` of any leading shape. The arithmetic is that of
:mod:`ppo_ref.fast._mlp`: fused multiply-add chains in a fixed order, so a row's results never
depend on the other rows of the call. dtype: when ``x`` and every parameter are float32 the
pass computes in float32 and returns float32; otherwise everything is float64 (other inputs
cast). A non-finite result raises ``FloatingPointError``
(:func:`ppo_ref._checks.non_finite_result`); parameters whose widths do not chain raise
``ValueError``. Nothing else is validated: the spec functions do that.
"""
from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Callable, Dict, Mapping, NamedTuple, Tuple

import numpy as np
from numba.core.errors import TypingError

from ppo_ref._checks import non_finite_result
from ppo_ref.fast._mlp import _backward, _forward

__all__ = ["mlp_forward", "mlp_backward"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
#: Empty arrays that pad the layer tuples to a multiple of 8 (:func:`_layers`), per dtype.
_PAD = {dt: ((np.empty((0, 0), dt),) * 7, (np.empty(0, dt),) * 7) for dt in (_F64, _F32)}


class _Net(NamedTuple):
    """The layers of a parameter dict: ``keys`` the ``(w, b)`` key pairs in network order,
    ``counts`` the number of layers under each prefix, ``weights`` / ``biases``: ``params ->``
    the tuple of its weights / biases in that order; ``names`` the keys in that order (``w0,
    b0, w1, ...``) and ``in_order`` whether they are exactly the keys of ``params`` in order."""
    keys: Tuple[Tuple[str, str], ...]
    counts: Tuple[int, ...]
    weights: Callable
    biases: Callable
    names: Tuple[str, ...]
    in_order: bool


_NETS: Dict[tuple, _Net] = {}


def _net(params: Mapping, prefixes: Tuple[str, ...]) -> _Net:
    """The :class:`_Net` of the layers of ``params`` stored under each of ``prefixes`` in turn
    (``prefix + "w{i}"``, ``prefix + "b{i}"``; none only under ``"trunk."``), cached by the key
    names of ``params``."""
    names = (prefixes, tuple(params))
    net = _NETS.get(names)
    if net is None:
        keys, counts = [], []
        for prefix in prefixes:
            n = 0
            while prefix + f"w{n}" in params:
                keys.append((prefix + f"w{n}", prefix + f"b{n}"))
                n += 1
            if n == 0 and prefix != "trunk.":
                raise ValueError(f"params has no layer {prefix}w0")
            counts.append(n)
        def getter(ks):  # itemgetter returns a tuple for two keys or more
            return (lambda p: (p[ks[0]],)) if len(ks) == 1 else itemgetter(*ks)
        if len(_NETS) > 64:
            _NETS.clear()
        flat = tuple(k for pair in keys for k in pair)
        net = _NETS[names] = _Net(tuple(keys), tuple(counts), getter([w for w, _ in keys]),
                                  getter([b for _, b in keys]), flat, flat == names[1])
    return net


def _layers(params: Mapping, net: _Net, x, dt=None, convert: bool = False):
    """``(x, ws, bs)``: ``x [..., in]`` as C-contiguous ``[M, in]`` rows of the compute dtype
    (``dt``; when None float32 if ``x`` and every parameter are float32, else float64) and the
    layers' weights and biases as tuples padded with empty arrays to a multiple of 8 entries.

    Without ``convert`` the parameters are passed on as they are when the first weight and the
    first bias have the compute dtype (a parameter of another dtype, rank or layout then makes
    the compiled call fail to type: :func:`_compiled` calls again with ``convert``); with it,
    every one is made a C-contiguous array of the compute dtype, and one of the wrong rank
    raises ``ValueError``.
    """
    ws, bs = net.weights(params), net.biases(params)
    x = np.asarray(x)
    if dt is None:
        f32 = x.dtype == _F32 and all(getattr(v, "dtype", None) == _F32
                                      for v in (ws + bs if convert else (ws[0], bs[0])))
        dt = _F32 if f32 else _F64
    if convert or getattr(ws[0], "dtype", None) != dt or getattr(bs[0], "dtype", None) != dt:
        ws = tuple([np.ascontiguousarray(w, dt) for w in ws])
        bs = tuple([np.ascontiguousarray(b, dt) for b in bs])
        if any(w.ndim != 2 for w in ws) or any(b.ndim != 1 for b in bs):
            raise ValueError("params: every weight must be 2-D [out, in] and every bias 1-D")
    if x.dtype != dt or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dt)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension [..., in]")
    pad = -len(ws) % 8
    w_pad, b_pad = _PAD[x.dtype]
    return x.reshape(-1, x.shape[-1]), ws + w_pad[:pad], bs + b_pad[:pad]


def _compiled(run: Callable, params: Mapping, net: _Net, x, dt=None):
    """``run(x, ws, bs)`` on :func:`_layers` of the arguments; if the compiled call cannot be
    typed (parameters of mixed dtypes, ranks or layouts), again on converted ones."""
    try:
        return run(*_layers(params, net, x, dt))
    except TypingError:
        return run(*_layers(params, net, x, dt, convert=True))


def _grads(net: _Net, gws, gbs, params: Mapping) -> dict:
    """The gradients ``gws``, ``gbs`` of the layers of ``net`` as a dict in the key order of
    ``params``."""
    grads = dict(zip(net.names, chain.from_iterable(zip(gws, gbs))))
    return grads if net.in_order else {k: grads[k] for k in params if k in grads}


def _gradient_arrays(ws, bs, n: int):
    """Uninitialized gradient arrays of the shapes and dtype of the first ``n`` layers, padded
    as ``ws`` and ``bs`` are (with their own empty arrays, which no pass writes)."""
    return (tuple(map(np.empty_like, ws[:n])) + ws[n:],
            tuple(map(np.empty_like, bs[:n])) + bs[n:])


class _Cache(NamedTuple):
    """What :func:`mlp_backward` reads: the input rows ``x [M, in]`` and the outputs buffer of
    :func:`ppo_ref.fast._mlp._forward` (compute dtype), the leading shape of ``x``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    lead: Tuple[int, ...]
    relu: bool


_PLAIN = ("",)


def mlp_forward(params, x, activation="tanh"):
    """Twin of :func:`ppo_ref.spec.layers.mlp_forward`: ``(y [..., out], cache)``.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per result array relative to its largest entry. The cache is opaque (for
    :func:`mlp_backward` only).
    """
    net = _net(params, _PLAIN)
    n = len(net.keys)
    relu = activation == "relu"

    def run(rows, ws, bs):
        return rows, ws[n - 1].shape[0], _forward(rows, ws, bs, n, 0, n, True, relu)
    rows, n_out, (acts, start, _, ok) = _compiled(run, params, net, x)
    if not ok:
        raise non_finite_result("ppo_ref.fast.layers.mlp_forward")
    lead = np.shape(x)[:-1]
    y = acts[start:start + rows.shape[0] * n_out].reshape(lead + (n_out,))
    return y, _Cache(rows, acts, lead, relu)


def mlp_backward(params, cache, dy):
    """Twin of :func:`ppo_ref.spec.layers.mlp_backward`: ``(dx [..., in], grads)``, ``grads``
    with the keys and key order of ``params``.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 1e-4, atol 1e-6 in
    float32, per result array relative to its largest entry.
    """
    net = _net(params, _PLAIN)
    n = len(net.keys)
    x = cache.x

    def run(rows, ws, bs):
        d = np.ascontiguousarray(dy, rows.dtype).reshape(rows.shape[0], ws[n - 1].shape[0])
        gws, gbs = _gradient_arrays(ws, bs, n)
        dx, ok = _backward(rows, ws, cache.acts, n, 0, n, cache.relu, d, d[:, :0], gws, gbs,
                           True)
        return dx, ok, gws, gbs
    dx, ok, gws, gbs = _compiled(run, params, net, x, x.dtype)
    if not ok:
        raise non_finite_result("ppo_ref.fast.layers.mlp_backward")
    return dx.reshape(cache.lead + (dx.shape[1],)), _grads(net, gws, gbs, params)
