"""The compiled twins of :mod:`ppo_ref.spec.optim`, on plain dicts of arrays (inputs never
written).

* :func:`adam_update` equals :func:`ppo_ref.spec.optim.adam_update` bit for bit (the spec's
  :func:`~ppo_ref.spec.optim.adam_element` compiled, on entries widened to float64 as the spec
  widens them, rounded once to each parameter's dtype).
* :func:`clip_by_global_norm` equals :func:`ppo_ref.spec.optim.clip_by_global_norm` within
  rtol 1e-13, atol 0: each array's sum of squares is added in a fixed order
  (:func:`_sum_of_squares`) where the spec's ``np.sum`` adds pairwise; both sum non-negative
  terms, each within ``k u`` of the exact sum (``k`` the longest chain of additions: at most
  ``138 + n / 1024`` here, about 20 for NumPy; ``u = 2^-53``), so for arrays of up to 10^6
  entries the norms differ by less than 1e-13 relative.

One compiled call steps every entry of a dict, gathered into one float64 vector in key order; a
result is one vector returned as new dicts of views of it. Result vectors are reused
(:func:`_results`) when neither they nor a view are referenced outside this module, and a dict
of such views (the previous step's results, the gradients of :mod:`ppo_ref.fast.layers`) is
read in place (:func:`_vector_of`). A non-finite result raises ``FloatingPointError``.
"""
from __future__ import annotations

import math
import sys
import threading
from itertools import chain
from operator import is_
from typing import Dict, NamedTuple
from weakref import getweakrefcount

import numpy as np
from numba.extending import register_jitable

from ppo_ref._checks import non_finite_result
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import optim as _spec
from ppo_ref.spec.optim import CLIP_NORM_EPS
from ppo_ref.spec.optim import adam_element as _adam_element
from ppo_ref.spec.optim import adam_step_scalars as _adam_step_scalars

__all__ = ["adam_update", "clip_by_global_norm"]

# the Adam element, usable from compiled code (the spec function is returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec.adam_element)

_F64 = np.dtype(np.float64)
#: The largest finite float64: ``abs(x) <= _FLOAT64_MAX`` is False exactly for inf and nan.
_FLOAT64_MAX = float(np.finfo(np.float64).max)


class _Layout(NamedTuple):
    """The keys and shapes of a dict of arrays, and where each array sits in its vector
    (``starts[j]:stops[j]``, ``total`` entries in all)."""
    keys: tuple
    shapes: tuple
    starts: np.ndarray
    stops: np.ndarray
    total: int


_LAYOUTS = {}


def _layout(keys: tuple, shapes: tuple) -> _Layout:
    layout = _LAYOUTS.get((keys, shapes))
    if layout is None:
        sizes = np.array([math.prod(shape) for shape in shapes], dtype=np.int64)
        stops = np.cumsum(sizes)
        layout = _LAYOUTS[(keys, shapes)] = _Layout(keys, shapes, stops - sizes, stops,
                                                    int(np.sum(sizes)))
    return layout


#: (id(layout), blocks) -> :func:`_results`'s entries, oldest first, ``[vector, views per block,
#: block vectors, _refcounts when only held here]``: _POOLED per key, 2 * _POOLED keys (the oldest
#: dropped; layouts live on in _LAYOUTS); id(a block's first view) -> (its views, its vector,
#: layout) for their blocks. Written under _LOCK; a read of _REMEMBERED is one dict.get.
_POOLED = 4
_POOL: Dict[tuple, list] = {}
_REMEMBERED: Dict[int, tuple] = {}
_LOCK = threading.Lock()


def _refcounts(entry) -> tuple:
    """``sys.getrefcount`` of an entry's vector and the sum of its views', each plus its weak
    references (a result the caller watches through one is not reused either)."""
    views = tuple(chain.from_iterable(entry[1]))
    return (sys.getrefcount(entry[0]) + getweakrefcount(entry[0]),
            sum(map(sys.getrefcount, views)) + sum(map(getweakrefcount, views)))


def _forget(entries) -> None:
    """Drop the blocks of ``entries`` from ``_REMEMBERED``."""
    for views in chain.from_iterable(entry[1] for entry in entries):
        _REMEMBERED.pop(id(views[0]) if views else None, None)


def _results(layout: _Layout, blocks: int) -> tuple:
    """``(vector, dicts)``: a float64 vector of ``blocks`` blocks of ``layout.total`` entries,
    contents undefined, and per block a new dict of ``layout``'s keys, each a view of the block
    shaped as its array; remembered (:func:`_vector_of`). A vector and its views are reused
    when neither is referenced outside this module."""
    with _LOCK:
        entries = _POOL.setdefault((id(layout), blocks), [])
        for entry in entries:
            counts = _refcounts(entry)
            if counts[0] <= entry[3][0] and counts[1] <= entry[3][1]:
                break
        else:
            n, vector = layout.total, np.empty(blocks * layout.total)
            parts = tuple(vector[b * n:(b + 1) * n] for b in range(blocks))
            entry = [vector, tuple(tuple(part[a:e].reshape(shape) for a, e, shape in zip(
                layout.starts.tolist(), layout.stops.tolist(), layout.shapes)) for part in parts),
                parts, None]
            del vector, parts
            entry[3] = _refcounts(entry)
            entries.append(entry)
            _REMEMBERED.update((id(views[0]), (views, part, layout))
                               for views, part in zip(entry[1], entry[2]) if views)
            if len(entries) > _POOLED:
                _forget([entries.pop(0)])
            if len(_POOL) > 2 * _POOLED:
                _forget(_POOL.pop(next(iter(_POOL))))
        return entry[0], [dict(zip(layout.keys, views)) for views in entry[1]]


def _vector_of(values: tuple, layout: _Layout):
    """The float64 vector ``values`` (arrays in ``layout``'s key order) are views of, when
    they are, in order, the very views of a remembered block of this layout; else None."""
    hit = _REMEMBERED.get(id(values[0])) if values else None
    if hit is None or hit[2] is not layout or not all(map(is_, values, hit[0])):
        return None
    return hit[1]


def _gather(values: tuple, layout: _Layout, name: str) -> np.ndarray:
    """``values`` as one float64 vector in key order (read in place when they are remembered
    views); ``ValueError`` naming ``name`` when their shapes are not ``layout``'s."""
    vector = _vector_of(values, layout)
    if vector is not None:
        return vector
    shapes = tuple(np.shape(v) for v in values)
    if shapes != layout.shapes:
        raise ValueError(f"ppo_ref.fast.optim: {name} must have the shapes of params "
                         f"{dict(zip(layout.keys, layout.shapes))}, got {shapes}")
    if not values:
        return np.empty(0)
    return np.concatenate(values, axis=None, dtype=np.float64)


def _arrays_of(arrays) -> tuple:
    """``(layout, values, vector)`` of a dict of arrays: its layout, its values in key order
    and, when they are remembered views (:func:`_vector_of`), the vector they view (else
    None)."""
    values, keys = tuple(arrays.values()), tuple(arrays)
    hit = _REMEMBERED.get(id(values[0])) if values else None
    if hit is not None and hit[2].keys == keys and all(map(is_, values, hit[0])):
        return hit[2], values, hit[1]
    if not all([type(v) is np.ndarray for v in values]):
        values = tuple([np.asarray(v) for v in values])
    return _layout(keys, tuple([v.shape for v in values])), values, None


@njit
def _adam_pass(param, grad, m, v, out, beta1, beta2, step_size, bias_correction2_sqrt, eps):
    """Per entry ``i`` of the float64 vectors: ``adam_element(param[i], grad[i], m[i], v[i],
    ...)`` (:func:`ppo_ref.spec.optim.adam_element`) written to ``out[i]``, ``out[n + i]``,
    ``out[2 n + i]`` (``out`` float64 ``[3 n]``). Returns whether every result is finite."""
    n = param.size
    n_finite = 0
    for i in range(n):
        p_i, m_i, v_i = _adam_element(param[i], grad[i], m[i], v[i], beta1, beta2, step_size,
                                     bias_correction2_sqrt, eps)
        out[i] = p_i
        out[n + i] = m_i
        out[2 * n + i] = v_i
        n_finite += ((abs(p_i) <= _FLOAT64_MAX) & (abs(m_i) <= _FLOAT64_MAX)
                     & (abs(v_i) <= _FLOAT64_MAX))
    return n_finite == n


def adam_update(params, grads, state, *, lr, betas=(0.9, 0.999), eps=1e-5):
    """:func:`ppo_ref.spec.optim.adam_update`, compiled: one call over every entry; bit for
    bit. Returns new plain dicts (of views of one vector when every parameter is float64).
    Raises ``FloatingPointError`` when a result is not finite; ``ValueError`` when ``grads``,
    ``state["m"]`` or ``state["v"]`` do not have the keys and shapes of ``params``."""
    where = "ppo_ref.fast.optim.adam_update"
    layout, values, p = _arrays_of(params)
    keys = layout.keys
    moments_m, moments_v = state["m"], state["v"]
    if len(grads) != len(keys):
        raise ValueError(f"{where}: grads must have the keys of params {list(keys)}")
    try:
        g = _gather(tuple([grads[k] for k in keys]), layout, "grads")
        m = _gather(tuple([moments_m[k] for k in keys]), layout, "state['m']")
        v = _gather(tuple([moments_v[k] for k in keys]), layout, "state['v']")
    except KeyError as exc:
        raise ValueError(f"{where}: grads and state must have the keys of params: missing "
                         f"{exc}") from None
    t = state["t"] + 1
    beta1, beta2 = float(betas[0]), float(betas[1])
    step_size, bias_correction2_sqrt = _adam_step_scalars(t, float(lr), beta1, beta2)
    dtypes = None if p is not None else [x.dtype for x in values]
    if dtypes is not None and all([d == _F64 for d in dtypes]):
        dtypes, p = None, (np.concatenate(values, axis=None) if values else np.empty(0))
    elif dtypes is not None:  # the spec's casts: each entry to its parameter's dtype, then float64
        g, m, v = (np.concatenate([x[a:b].astype(d).astype(_F64) for a, b, d in zip(
            layout.starts, layout.stops, dtypes)]) for x in (g, m, v))
        p = np.concatenate([np.asarray(x).astype(_F64).ravel() for x in values])
    out, new = _results(layout, 3)
    if not _adam_pass(p, g, m, v, out, beta1, beta2, step_size, bias_correction2_sqrt,
                      float(eps)):
        raise non_finite_result(where)
    if dtypes is not None:  # rounded once to each parameter's dtype
        new = [{key: a.astype(d) for (key, a), d in zip(x.items(), dtypes)} for x in new]
        if not all(np.isfinite(a).all() for x in new for a in x.values()):
            raise non_finite_result(where)
    return new[0], {"t": t, "m": new[1], "v": new[2]}


@register_jitable(**NJIT_OPTIONS)
def _sum_of_squares(x, start, stop):
    """``sum_i x[i]^2`` over ``start <= i < stop``, in a fixed order: blocks of 1024 entries,
    left to right; in a block, eight partial sums (entry ``i`` to partial sum ``(i - b) % 8``
    of the block starting at ``b``) combined as ``((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 +
    a7))``, then the block's last ``len % 8`` squares added left to right."""
    total = 0.0
    for b in range(start, stop, 1024):
        e = min(b + 1024, stop)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        i = b
        while i + 8 <= e:
            a0 += x[i] * x[i]
            a1 += x[i + 1] * x[i + 1]
            a2 += x[i + 2] * x[i + 2]
            a3 += x[i + 3] * x[i + 3]
            a4 += x[i + 4] * x[i + 4]
            a5 += x[i + 5] * x[i + 5]
            a6 += x[i + 6] * x[i + 6]
            a7 += x[i + 7] * x[i + 7]
            i += 8
        s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        while i < e:
            s += x[i] * x[i]
            i += 1
        total += s
    return total


@njit
def _clip_pass(g, starts, stops, max_norm, out):
    """The global norm of the float64 vector ``g`` whose arrays are ``g[starts[j]:stops[j]]``
    (the spec's norm of the per-array norms, :func:`_sum_of_squares` for each), and, when it
    is finite, ``out = g * scale`` if ``scale = max_norm / (norm + CLIP_NORM_EPS) < 1`` else a
    copy of ``g``. Returns ``(norm, scale)``."""
    total = 0.0
    for j in range(starts.size):
        norm_j = math.sqrt(_sum_of_squares(g, starts[j], stops[j]))
        total += norm_j * norm_j
    norm = math.sqrt(total)
    if not math.isfinite(norm):
        return norm, 1.0
    scale = max_norm / (norm + CLIP_NORM_EPS)
    if scale < 1.0:
        for i in range(g.size):
            out[i] = g[i] * scale
    else:
        for i in range(g.size):
            out[i] = g[i]
    return norm, scale


def clip_by_global_norm(grads, max_norm):
    """:func:`ppo_ref.spec.optim.clip_by_global_norm`, compiled; within rtol 1e-13, atol 0
    (module docstring). Returns a new plain dict (of views of one vector when every gradient
    is float64) and the norm. Raises ``FloatingPointError`` when the norm is not finite."""
    layout, values, g = _arrays_of(grads)
    mixed = g is None and not all([v.dtype == _F64 for v in values])
    if g is None:
        g = np.concatenate(values, axis=None, dtype=np.float64) if values else np.empty(0)
    out, (clipped,) = (np.empty(g.size), (None,)) if mixed else _results(layout, 1)
    norm, scale = _clip_pass(g, layout.starts, layout.stops, float(max_norm), out)
    if not math.isfinite(norm):
        raise non_finite_result("ppo_ref.fast.optim.clip_by_global_norm")
    if mixed:  # the spec's products (a float32 array times the Python float stays float32)
        clipped = {k: v * scale if scale < 1.0 else v.copy() for k, v in zip(layout.keys, values)}
    return clipped, norm
