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

from typing import Mapping, NamedTuple, Tuple

import numpy as np

from ppo_ref._checks import non_finite_result
from ppo_ref.fast._mlp import _backward, _forward

__all__ = ["mlp_forward", "mlp_backward"]

_MAX_LAYERS = 64
_KEYS = tuple((f"w{i}", f"b{i}") for i in range(_MAX_LAYERS))


class _Cache(NamedTuple):
    """What :func:`mlp_backward` reads: the input rows ``x [M, in]`` and the outputs buffer of
    :func:`ppo_ref.fast._mlp._forward` (compute dtype), the leading shape of ``x``, ``relu``."""
    x: np.ndarray
    acts: np.ndarray
    lead: Tuple[int, ...]
    relu: bool


def _compute_dtype(arrays, x) -> type:
    """float32 when ``x`` and every array of ``arrays`` are float32 arrays, else float64."""
    f32 = np.float32
    if getattr(x, "dtype", None) != f32:
        return np.float64
    for v in arrays:
        if getattr(v, "dtype", None) != f32:
            return np.float64
    return f32


def _layers(params: Mapping, keys, dt) -> Tuple[tuple, tuple]:
    """``(ws, bs)``: the layers ``keys`` of ``params`` as C-contiguous arrays of ``dt`` (the
    caller's arrays when they are already), weights 2-D, biases 1-D; ``ValueError`` naming
    ``params`` otherwise."""
    ws = tuple(np.ascontiguousarray(params[w], dt) for w, _ in keys)
    bs = tuple(np.ascontiguousarray(params[b], dt) for _, b in keys)
    if any(w.ndim != 2 for w in ws) or any(b.ndim != 1 for b in bs):
        raise ValueError("params: every weight must be 2-D [out, in] and every bias 1-D [out]")
    return ws, bs


def _depth(params: Mapping, prefix: str = "") -> int:
    depth = 0
    while depth < _MAX_LAYERS and f"{prefix}w{depth}" in params:
        depth += 1
    if depth == 0:
        raise ValueError(f"params has no layer {prefix}w0")
    return depth


def _rows(x, dt, width: int) -> np.ndarray:
    """``x [..., width]`` as C-contiguous ``[M, width]`` rows of ``dt``."""
    x = np.ascontiguousarray(x, dt)
    if x.ndim == 0 or x.shape[-1] != width:
        raise ValueError(f"x must have shape [..., {width}], got {x.shape}")
    return x.reshape(-1, width)


def mlp_forward(params, x, activation="tanh"):
    """Twin of :func:`ppo_ref.spec.layers.mlp_forward`: ``(y [..., out], cache)``.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 2e-4, atol 1e-5 in
    float32, per result array relative to its largest entry. The cache is opaque (for
    :func:`mlp_backward` only).
    """
    depth = _depth(params)
    keys = _KEYS[:depth]
    dt = _compute_dtype([params[k] for pair in keys for k in pair], x)
    ws, bs = _layers(params, keys, dt)
    rows = _rows(x, dt, ws[0].shape[1])
    relu = activation == "relu"
    acts, y, _, ok = _forward(rows, ws, bs, 0, depth, True, relu)
    if not ok:
        raise non_finite_result("ppo_ref.fast.layers.mlp_forward")
    lead = np.shape(x)[:-1]
    return y.reshape(lead + (y.shape[1],)), _Cache(rows, acts, lead, relu)


def mlp_backward(params, cache, dy):
    """Twin of :func:`ppo_ref.spec.layers.mlp_backward`: ``(dx [..., in], grads)``, ``grads``
    with the keys and key order of ``params``.

    Equals the spec within rtol 1e-12, atol 1e-14 in float64 and rtol 2e-4, atol 1e-5 in
    float32, per result array relative to its largest entry.
    """
    depth = _depth(params)
    keys = _KEYS[:depth]
    dt = cache.x.dtype
    ws, bs = _layers(params, keys, dt)
    d = np.ascontiguousarray(dy, dt).reshape(cache.x.shape[0], ws[-1].shape[0])
    gws = tuple(np.empty(w.shape, dt) for w in ws)
    gbs = tuple(np.empty(b.shape, dt) for b in bs)
    dx, ok = _backward(cache.x, cache.acts, ws, 0, depth, cache.relu, d, np.empty((d.shape[0], 0), dt), gws,
                       gbs, True)
    if not ok:
        raise non_finite_result("ppo_ref.fast.layers.mlp_backward")
    grads = {}
    for (wk, bk), gw, gb in zip(keys, gws, gbs):
        grads[wk], grads[bk] = gw, gb
    return dx.reshape(cache.lead + (dx.shape[1],)), {k: grads[k] for k in params if k in grads}
