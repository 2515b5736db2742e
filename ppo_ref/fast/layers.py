"""The compiled tier's MLP: the twins of :func:`ppo_ref.spec.layers.mlp_forward` and
:func:`ppo_ref.spec.layers.mlp_backward` (parameters, shapes and equations there), by the passes
of :mod:`ppo_ref.fast._mlp`. float32 when ``x`` and every parameter are float32, else float64.
A non-finite result raises ``FloatingPointError``; widths that do not chain ``ValueError``.
"""
from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Callable, Dict, Mapping, NamedTuple, Tuple

import numpy as np
from numba.core import config as _numba_config
from numba.core.errors import TypingError

from ppo_ref._checks import non_finite_result
from ppo_ref.fast._mlp import _FEW, _backward, _forward
from ppo_ref.fast._products import _aligned, _bundle
from ppo_ref.fast.optim import _layout, _results

__all__ = ["mlp_forward", "mlp_backward"]

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
#: Empty arrays that pad the layer tuples to a multiple of 8 (:func:`_layers`), per dtype.
_PAD = {dt: ((np.empty((0, 0), dt),) * 7, (np.empty(0, dt),) * 7) for dt in (_F64, _F32)}


class _Net(NamedTuple):
    """The layers of a parameter dict: ``keys`` the ``(w, b)`` key pairs in network order,
    ``weights`` / ``biases``: ``params ->`` the tuple of its weights / biases in that order;
    ``names`` the keys in that order (``w0, b0, w1, ...``) and ``in_order`` whether they are
    exactly the keys of ``params`` in order; ``n_trunk`` and ``n_pi`` the segments of
    :mod:`ppo_ref.fast._mlp` (trunk layers, then policy layers; the value layers after them)."""
    keys: Tuple[Tuple[str, str], ...]
    weights: Callable
    biases: Callable
    names: Tuple[str, ...]
    in_order: bool
    n_trunk: int
    n_pi: int


_NETS: Dict[tuple, _Net] = {}


def _net(params: Mapping, prefixes: Tuple[str, ...]) -> _Net:
    """The :class:`_Net` of the layers of ``params`` stored under each of ``prefixes`` in turn
    (``prefix + "w{i}"``, ``prefix + "b{i}"``; none only under ``"trunk."``), cached by the key
    names of ``params``. The segments: a ``"trunk."`` prefix first is the trunk; the prefix
    after it (or the first) the policy tower."""
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
        trunk = prefixes[0] == "trunk."
        net = _NETS[names] = _Net(tuple(keys), getter([w for w, _ in keys]),
                                  getter([b for _, b in keys]), flat, flat == names[1],
                                  counts[0] if trunk else 0, counts[1 if trunk else 0])
    return net


def _arrays(params: Mapping, net: _Net, x, dt=None, convert: bool = False):
    """``(x, ws, bs)``: ``x [..., in]`` as C-contiguous ``[M, in]`` rows of the compute dtype
    (``dt``; None: float32 if ``x`` and every parameter are float32, else float64) and the
    weights and biases as tuples padded with empty arrays to a multiple of 8 entries. The
    parameters are passed on as they are when the first weight and bias have the compute dtype
    (another dtype, rank or layout then fails to type: the callers retry with ``convert``,
    which makes each a C-contiguous array of the compute dtype, ``ValueError`` if of the wrong
    rank; always under ``NUMBA_DISABLE_JIT``)."""
    convert = convert or _numba_config.DISABLE_JIT
    ws, bs = net.weights(params), net.biases(params)
    if type(x) is not np.ndarray:
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
    if x.ndim != 2:
        if x.ndim == 0:
            raise ValueError("x must have at least one dimension [..., in]")
        x = x.reshape(-1, x.shape[-1])
    pad = -len(ws) % 8
    w_pad, b_pad = _PAD[dt]
    return x, ws + w_pad[:pad], bs + b_pad[:pad]


def _run_forward(params: Mapping, net: _Net, x, policy: bool, value: bool, keep: bool,
                 relu: bool, where: str):
    """:func:`ppo_ref.fast._mlp._forward` on :func:`_arrays` of the arguments (again on
    converted ones when the compiled call cannot be typed: parameters of mixed dtypes, ranks
    or layouts): ``(rows [M, in], ws, acts, pi_start, vf_start)``, ``acts`` from the pool of
    :func:`ppo_ref.fast._products._bundle` when ``M > _FEW`` (never one the caller still
    holds, directly or through a view). A non-finite result raises ``FloatingPointError``
    naming ``where``."""
    def run(rows, ws, bs):
        n, dt = len(net.keys), rows.dtype
        if rows.shape[0] > _FEW:    # (a few rows' buffer: quicker to allocate than to pool)
            size = rows.shape[0] * sum([w.shape[0] for w in ws[:n]])
            buffer = _bundle(("mlp.acts", size, dt), lambda: (_aligned(size, dt),))[0]
        else:
            buffer = _PAD[dt][1][0]
        return rows, ws, bs, _forward(rows, ws, bs, n, net.n_trunk, net.n_pi, policy, value,
                                      keep, relu, buffer)
    try:
        rows, ws, bs, (acts, pi_start, vf_start, ok) = run(*_arrays(params, net, x))
    except TypingError:
        rows, ws, bs, (acts, pi_start, vf_start, ok) = run(*_arrays(params, net, x, convert=True))
    if not ok:
        raise non_finite_result(where)
    return rows, ws, acts, pi_start, vf_start


def _run_backward(params: Mapping, net: _Net, x, acts, relu: bool, d_pi, d_vf,
                  want_dx: bool, where: str):
    """:func:`ppo_ref.fast._mlp._backward` for the forward pass that gave ``x [M, in]`` and
    ``acts``, with the towers' output gradients ``d_pi [M, P]`` and ``d_vf`` (``[M]`` or
    ``[M, 1]``; None: no value tower), both cast to the dtype of ``x``: ``(dx, grads)``,
    ``grads`` in the key order of ``params``."""
    dt, rows = x.dtype, x.shape[0]
    n = len(net.keys)

    def run(ws, bs):
        grads, gws, gbs = _gradient_arrays(net, ws, bs, n)
        g_pi = np.ascontiguousarray(d_pi, dt).reshape(rows, ws[net.n_trunk + net.n_pi - 1].shape[0])
        g_vf = g_pi[:, :0] if d_vf is None else np.ascontiguousarray(d_vf, dt).reshape(rows, 1)
        dx, ok = _backward(x, ws, acts, n, net.n_trunk, net.n_pi, relu, g_pi, g_vf, gws, gbs,
                           want_dx)
        return dx, ok, grads
    try:
        dx, ok, grads = run(*_arrays(params, net, x, dt)[1:])
    except TypingError:
        dx, ok, grads = run(*_arrays(params, net, x, dt, convert=True)[1:])
    if not ok:
        raise non_finite_result(where)
    return dx, grads if net.in_order else {k: grads[k] for k in params if k in grads}


def _gradient_arrays(net: _Net, ws, bs, n: int):
    """``(grads, gws, gbs)``: uninitialized gradient arrays of the first ``n`` layers, a dict in
    ``net.names`` order and tuples padded as ``ws``, ``bs`` are; float64: a result vector of
    :func:`ppo_ref.fast.optim._results`, which the twins of clip and Adam read in place."""
    shapes = tuple(chain.from_iterable((w.shape, b.shape) for w, b in zip(ws[:n], bs[:n])))
    grads = (_results(_layout(net.names, shapes), 1)[1][0] if ws[0].dtype == _F64 else
             {k: np.empty(shape, ws[0].dtype) for k, shape in zip(net.names, shapes)})
    return grads, net.weights(grads) + ws[n:], net.biases(grads) + bs[n:]


class _Cache(NamedTuple):
    """What :func:`mlp_backward` reads: the input rows ``x [M, in]`` and the outputs buffer of
    :func:`ppo_ref.fast._mlp._forward` (compute dtype), the leading shape of ``x``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    lead: Tuple[int, ...]
    relu: bool


_PLAIN = ("",)


def mlp_forward(params, x, activation="tanh"):
    """Twin of :func:`ppo_ref.spec.layers.mlp_forward`: ``(y [..., out], cache)``, the cache
    opaque (for :func:`mlp_backward`). Within rtol 1e-12, atol 1e-14 (float32: rtol 1e-4,
    atol 1e-6) of the spec."""
    relu = activation == "relu"
    rows, ws, acts, start, _ = _run_forward(params, _net(params, _PLAIN), x, True, False, True,
                                            relu, "ppo_ref.fast.layers.mlp_forward")
    lead = np.shape(x)[:-1]
    y = acts[start:].reshape(lead + (-1,))
    return y, _Cache(rows, acts, lead, relu)


def mlp_backward(params, cache, dy):
    """Twin of :func:`ppo_ref.spec.layers.mlp_backward`: ``(dx [..., in], grads)``, ``grads``
    in the key order of ``params``. Within rtol 1e-12, atol 1e-14 (float32: rtol 1e-4, atol
    1e-6) of the spec."""
    dx, grads = _run_backward(params, _net(params, _PLAIN), cache.x, cache.acts, cache.relu, dy,
                              None, True, "ppo_ref.fast.layers.mlp_backward")
    return dx.reshape(cache.lead + (dx.shape[1],)), grads
