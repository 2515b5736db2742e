"""The compiled twins of :mod:`ppo_ref.spec.optim`: :func:`adam_update` and
:func:`clip_by_global_norm`, on plain dicts of arrays, pure (inputs never written).

* :func:`adam_update` equals :func:`ppo_ref.spec.optim.adam_update` bit for bit: per entry
  the spec's :func:`~ppo_ref.spec.optim.adam_element` (compiled, ``register_jitable``) with the
  spec's :func:`~ppo_ref.spec.optim.adam_step_scalars`, on the entries widened to float64 as
  the spec widens them, rounded once to each parameter's dtype.
* :func:`clip_by_global_norm` equals :func:`ppo_ref.spec.optim.clip_by_global_norm` within
  rtol 1e-13, atol 0 (the norm and the clipped gradients; the copies made when no clipping
  happens are the same bits). The norm is the spec's norm of the per-array norms; each
  array's sum of squares is added in an order fixed here (:func:`_sum_of_squares`: blocks of
  1024 entries, eight interleaved partial sums per block, the blocks left to right), where
  the spec's ``np.sum`` adds pairwise. Both sum non-negative terms, so each is within ``k u``
  (relative) of the exact sum, ``k`` the longest chain of additions: at most ``138 + n / 1024``
  here for an array of ``n`` entries, about 20 for NumPy, ``u = 2^-53``; for arrays of up to
  10^6 entries the two norms differ by less than 1e-13 relative.

Machinery (private): the arrays of a dict are gathered into one float64 vector in key order
(``np.concatenate``), so one compiled call steps every entry; the results are written into one
new buffer and returned as views of it, one per key (new arrays: the inputs are untouched).
A dict whose values are the views one of these functions returned (the parameters and moments
of the previous step, the clipped gradients) is read in place, without the copy: the views
are recognised by identity (:func:`_gathered`; the last 16 such dicts are remembered, and their
buffers kept alive until forgotten).

Non-finite results (a gradient norm that is inf or nan, a step that overflows or starts from
non-finite values) raise ``FloatingPointError`` (:func:`ppo_ref._checks.non_finite_result`);
the spec functions, given the same arguments, name the arrays.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from operator import is_
from typing import NamedTuple

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
    """The keys and shapes of a dict of arrays, and where each array sits in its gathered
    vector (``starts[j]:stops[j]``, ``total`` entries in all; ``spans``: the same as Python
    ``(key, start, stop, shape, one_dimensional)`` tuples)."""
    keys: tuple
    shapes: tuple
    starts: np.ndarray
    stops: np.ndarray
    total: int
    spans: tuple


_LAYOUTS = {}


def _layout(keys: tuple, shapes: tuple) -> _Layout:
    layout = _LAYOUTS.get((keys, shapes))
    if layout is None:
        sizes = [math.prod(shape) for shape in shapes]
        stops = np.cumsum(np.array(sizes, dtype=np.int64))
        starts = stops - np.array(sizes, dtype=np.int64)
        layout = _LAYOUTS[(keys, shapes)] = _Layout(
            keys, shapes, starts, stops, int(stops[-1]) if sizes else 0,
            tuple(zip(keys, starts.tolist(), stops.tolist(), shapes,
                      [len(shape) == 1 for shape in shapes])))
    return layout


#: id(first view) -> (layout, the views, the vector they are views of): the last dicts of
#: views this module returned (at most :data:`_KEEP`, the oldest forgotten first; their
#: arrays are kept alive until then).
_RETURNED: "OrderedDict[int, tuple]" = OrderedDict()
_KEEP = 16


def _views(vector: np.ndarray, layout: _Layout) -> dict:
    """A new dict of ``layout``'s keys, each a view of the float64 ``vector`` shaped as its
    array; remembered (:func:`_gathered`)."""
    out = {key: vector[a:b] if flat else vector[a:b].reshape(shape)
           for key, a, b, shape, flat in layout.spans}
    if out:
        values = tuple(out.values())
        _RETURNED[id(values[0])] = (layout, values, vector)
        if len(_RETURNED) > _KEEP:
            try:
                _RETURNED.popitem(last=False)
            except KeyError:  # (emptied by another thread meanwhile)
                pass
    return out


def _gathered(values: list, layout: _Layout):
    """The vector ``values`` (arrays in ``layout``'s key order) are views of, when they are,
    in order, the very arrays of a dict this module returned with this layout; else None."""
    entry = _RETURNED.get(id(values[0])) if values else None
    if entry is None or entry[0] is not layout:
        return None
    views = entry[1]
    if len(views) != len(values) or not all(map(is_, views, values)):
        return None
    return entry[2]


def _gather(values: list, layout: _Layout, name: str) -> np.ndarray:
    """``values`` as one float64 vector in key order (read in place when possible); a
    ``ValueError`` naming ``name`` when their shapes are not ``layout``'s."""
    flat = _gathered(values, layout)
    if flat is not None:
        return flat
    shapes = tuple(np.shape(v) for v in values)
    if shapes != layout.shapes:
        raise ValueError(f"ppo_ref.fast.optim: {name} must have the shapes of params "
                         f"{dict(zip(layout.keys, layout.shapes))}, got {shapes}")
    if not values:
        return np.empty(0)
    return np.concatenate(values, axis=None, dtype=np.float64)


def _dict_layout(arrays):
    """``(layout, values, vector)`` of a dict of arrays: its layout, its values in key order
    and, when they are the views of a dict this module returned, the vector they view (else
    None)."""
    values = list(arrays.values())
    entry = _RETURNED.get(id(values[0])) if values else None
    if entry is not None:
        flat = _gathered(values, entry[0])
        if flat is not None:
            return entry[0], values, flat
    values = [np.asarray(v) for v in values]
    return _layout(tuple(arrays), tuple(v.shape for v in values)), values, None


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
    bit. Returns new plain dicts (views of one new buffer when every parameter is float64).
    Raises ``FloatingPointError`` when a result is not finite; ``ValueError`` when ``grads``,
    ``state["m"]`` or ``state["v"]`` do not have the keys and shapes of ``params``."""
    where = "ppo_ref.fast.optim.adam_update"
    layout, values, p = _dict_layout(params)
    keys = layout.keys
    moments_m, moments_v = state["m"], state["v"]
    try:
        g = _gather([grads[k] for k in keys], layout, "grads")
        m = _gather([moments_m[k] for k in keys], layout, "state['m']")
        v = _gather([moments_v[k] for k in keys], layout, "state['v']")
    except KeyError as exc:
        raise ValueError(f"{where}: grads and state must have the keys of params: missing "
                         f"{exc}") from None
    if len(grads) != len(keys):
        raise ValueError(f"{where}: grads must have the keys of params {list(keys)}")
    t = state["t"] + 1
    beta1, beta2 = float(betas[0]), float(betas[1])
    step_size, bias_correction2_sqrt = _adam_step_scalars(t, float(lr), beta1, beta2)
    dtypes = None
    if p is None:
        dtypes = [v.dtype for v in values]
        if all(d == _F64 for d in dtypes):
            dtypes = None
            p = np.concatenate(values, axis=None) if values else np.empty(0)
        else:  # the spec's casts: each entry to its parameter's dtype, then float64
            g, m, v = (np.concatenate([x[a:b].astype(d).astype(_F64) for a, b, d in zip(
                layout.starts, layout.stops, dtypes)]) for x in (g, m, v))
            p = np.concatenate([x.astype(_F64).ravel() for x in values])
    out = np.empty(3 * layout.total)
    if not _adam_pass(p, g, m, v, out, beta1, beta2, step_size, bias_correction2_sqrt,
                      float(eps)):
        raise non_finite_result(where)
    n = layout.total
    new = [_views(out[k * n:(k + 1) * n], layout) for k in range(3)]
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
    (module docstring). Returns a new plain dict (views of one new buffer when every gradient
    is float64) and the norm. Raises ``FloatingPointError`` when the norm is not finite."""
    layout, values, g = _dict_layout(grads)
    mine = g is not None  # the views of a dict returned here: float64
    if not mine:  # (the layout is that of these very values)
        g = (np.concatenate(values, axis=None, dtype=np.float64) if values else np.empty(0))
    out = np.empty(layout.total)
    norm, scale = _clip_pass(g, layout.starts, layout.stops, float(max_norm), out)
    if not math.isfinite(norm):
        raise non_finite_result("ppo_ref.fast.optim.clip_by_global_norm")
    if not mine and not all([v.dtype == _F64 for v in values]):  # the spec's products
        if scale < 1.0:
            return {k: v * scale for k, v in zip(layout.keys, values)}, norm
        return {k: np.array(v, copy=True) for k, v in zip(layout.keys, values)}, norm
    return _views(out, layout), norm


# -- the fused in-place clipped-Adam step on one-buffer FlatArrays of ppo_ref.fast.update, kept
#    importable until the switch (then to delete with fast/update.py and fast/flat.py):
#    clipped_adam_step, check_flat_step_arguments, _clipped_adam_step, _clipped_adam_kernel,
#    _adam_pass_in_place, _segmented_global_norm, _first_non_finite_result, _layout_segments,
#    _previous_values_scratch, _raise_step_failure, _key_at


import threading  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Dict  # noqa: E402

from numba import prange  # noqa: E402

from ppo_ref._checks import (check_adam_hyperparameters, check_positive,  # noqa: E402
                             check_step_count)
from ppo_ref.fast.flat import FlatArrays, same_layout  # noqa: E402
from ppo_ref.fast.sums import pairwise_sum  # noqa: E402




@njit
def _segmented_global_norm(x, starts, stops):
    """The global norm of a one-buffer dict whose arrays are the float64 segments ``[starts[j],
    stops[j])`` in key order, as :func:`ppo_ref.spec.optim.global_norm` defines it: per array
    ``norm_j = sqrt(sum of squares)``, then ``sqrt(sum_j norm_j * norm_j)`` summed left to
    right. Each array's sum of squares is :func:`ppo_ref.fast.sums.pairwise_sum`, a fixed
    order written there (eight independent partial sums per block of 128, not one sequential chain);
    it is the order of the NumPy pairwise sum the spec calls, so the two agree bit for bit
    where NumPy sums that way (NumPy 2.4 does). The contract tested is within rtol 1e-14 (the
    ``clipped_adam_step`` row of ``tests/test_tiers.py``), which does not depend on NumPy's
    internals."""
    total = 0.0
    for j in range(starts.size):
        norm_j = math.sqrt(pairwise_sum(x[starts[j]:stops[j]], True))
        total += norm_j * norm_j
    return math.sqrt(total)


_SEGMENTS: Dict = {}


def _layout_segments(layout):
    """``(starts, stops)`` int64 arrays of a FlatLayout's entries in key order (cached)."""
    seg = _SEGMENTS.get(layout)
    if seg is None:
        starts = np.array([o for _, o, _ in layout.entries], dtype=np.int64)
        sizes = np.array([int(np.prod(s, dtype=np.int64)) for _, _, s in layout.entries],
                         dtype=np.int64)
        seg = _SEGMENTS[layout] = (starts, starts + sizes)
    return seg


#: The largest finite float64: ``abs(x) <= _FLOAT64_MAX`` is False exactly for inf and nan.
_FLOAT64_MAX = float(np.finfo(np.float64).max)


@njit
def _first_non_finite_result(param, grad, scale, m, v, beta1, beta2, step_size,
                             bias_correction2_sqrt, eps):
    """The first index whose step results are not all finite (-1 if none); writes nothing."""
    for i in range(param.size):
        p_i, m_i, v_i = _adam_element(param[i], grad[i] * scale, m[i], v[i], beta1, beta2,
                                     step_size, bias_correction2_sqrt, eps)
        if not (math.isfinite(p_i) and math.isfinite(m_i) and math.isfinite(v_i)):
            return i
    return -1


@njit(parallel=True)
def _adam_pass_in_place(param, grad, scale, m, v, beta1, beta2, step_size,
                        bias_correction2_sqrt, eps, previous):
    """Per entry ``(param[i], m[i], v[i]) = adam_element(param[i], grad[i] * scale, m[i], v[i],
    ...)`` (:func:`ppo_ref.spec.optim.adam_element`, evaluated once per entry), written in place
    when every result is finite; otherwise every entry is put back to its value before the
    call. Returns whether the results were finite (and so kept).

    One pass: each entry's previous ``(param, m, v)`` goes to ``previous[0/1/2, i]`` (a float64
    ``(3, n)`` scratch array, distinct from the others) before its results are written, and the
    results are counted finite with comparisons (so that LLVM vectorizes the loop); when the
    count falls short, ``previous`` is copied back. ``scale`` < 1, or exactly 1.0 when there is
    no clipping (``g * 1.0`` is ``g``); ``grad`` must not overlap the others. The entries are
    independent and the count is an integer sum, so the loop runs its ranges of ``i`` on
    numba's threads (``prange``) with the results of the plain loop, bit for bit."""
    n_finite = 0
    n = param.size
    for i in prange(n):
        p_i = param[i]
        m_i = m[i]
        v_i = v[i]
        previous[0, i] = p_i
        previous[1, i] = m_i
        previous[2, i] = v_i
        p_i, m_i, v_i = _adam_element(p_i, grad[i] * scale, m_i, v_i, beta1, beta2, step_size,
                                     bias_correction2_sqrt, eps)
        param[i] = p_i
        m[i] = m_i
        v[i] = v_i
        n_finite += (abs(p_i) <= _FLOAT64_MAX) & (abs(m_i) <= _FLOAT64_MAX) & (abs(v_i) <= _FLOAT64_MAX)
    if n_finite == n:
        return True
    param[:] = previous[0]
    m[:] = previous[1]
    v[:] = previous[2]
    return False


@njit
def _clipped_adam_kernel(param, grad, starts, stops, m, v, max_norm, beta1, beta2, step_size,
                         bias_correction2_sqrt, eps, previous):
    """The step in one compiled call: ``norm = _segmented_global_norm(grad, starts, stops)``;
    if it is finite, ``scale = max_norm / (norm + CLIP_NORM_EPS)`` (the spec's clipping
    factor, taken only when below 1, else exactly 1.0) and :func:`_adam_pass_in_place`.
    Returns ``(norm, written)``: ``written`` is False, and every buffer as it was, when the
    norm or a result is not finite."""
    norm = _segmented_global_norm(grad, starts, stops)
    if not math.isfinite(norm):
        return norm, False
    scale = max_norm / (norm + CLIP_NORM_EPS)
    if not scale < 1.0:
        scale = 1.0
    return norm, _adam_pass_in_place(param, grad, scale, m, v, beta1, beta2, step_size,
                                     bias_correction2_sqrt, eps, previous)


_scratch = threading.local()


def _previous_values_scratch(size: int) -> np.ndarray:
    """This thread's float64 ``(3, size)`` scratch for :func:`_adam_pass_in_place`, kept for the
    next call (made anew when the size changes; its contents are undefined)."""
    previous = getattr(_scratch, "previous", None)
    if previous is None or previous.shape[1] != size:
        previous = _scratch.previous = np.empty((3, size), np.float64)
    return previous


def _key_at(layout, index: int) -> str:
    """The key of a FlatLayout whose entry holds buffer position ``index``."""
    for key, start, stop, _ in layout.slices:
        if start <= index < stop:
            return key
    raise IndexError(index)


def check_flat_step_arguments(params, grads, m, v) -> None:
    """Raise ``ValueError`` unless ``params``, ``grads``, ``m`` and ``v`` are intact float64
    :class:`~ppo_ref.fast.flat.FlatArrays` of one layout, and the buffers written in place
    (``params``, ``m``, ``v``) are distinct and not ``grads``' buffer."""
    if not (same_layout(params, grads, m, v) and params.flat.dtype == np.float64):
        raise ValueError("clipped_adam_step takes params, grads and the Adam moments as intact "
                         "float64 FlatArrays of one layout (ppo_ref.fast.flat); for plain dicts call "
                         "clip_by_global_norm then adam_update")
    bases = [a.flat if a.flat.base is None else a.flat.base for a in (params, m, v, grads)]
    if len({id(b) for b in bases}) != 4:
        raise ValueError("clipped_adam_step writes params, state['m'] and state['v'] in place: "
                         "their buffers must be distinct and not share memory with grads")


def _clipped_adam_step(params, grads, t_prev: int, m, v, max_norm: float, lr: float,
                       beta1: float, beta2: float, eps: float):
    """The body of :func:`clipped_adam_step` on checked arguments; returns ``(t, norm)``."""
    t = t_prev + 1
    step_size, bias_correction2_sqrt = _adam_step_scalars(t, lr, beta1, beta2)
    starts, stops = _layout_segments(grads.layout)
    norm, written = _clipped_adam_kernel(params.flat, grads.flat, starts, stops, m.flat, v.flat,
                                         max_norm, beta1, beta2, step_size,
                                         bias_correction2_sqrt, eps,
                                         _previous_values_scratch(params.flat.size))
    if not written:  # then every value is as it was
        _raise_step_failure(params, grads, m, v, norm, max_norm, beta1, beta2, step_size,
                            bias_correction2_sqrt, eps)
    return t, norm


def _raise_step_failure(params, grads, m, v, norm: float, max_norm: float, beta1: float,
                        beta2: float, step_size: float, bias_correction2_sqrt: float,
                        eps: float):
    """Raise the error of a step that :func:`_clipped_adam_kernel` did not write (``norm``: the
    norm it returned): ``FloatingPointError`` for a norm that is not finite, else
    ``ValueError`` naming the array of the first element whose results are not finite."""
    if not math.isfinite(norm):
        _spec.clip_by_global_norm(grads, max_norm)  # raises FloatingPointError, naming them
        raise FloatingPointError(f"the global norm of grads is {norm}")
    scale = max_norm / (norm + CLIP_NORM_EPS)
    index = _first_non_finite_result(params.flat, grads.flat, scale if scale < 1.0 else 1.0,
                                     m.flat, v.flat, beta1, beta2, step_size,
                                     bias_correction2_sqrt, eps)
    key = _key_at(params.layout, int(index))
    raise ValueError(f"params[{key!r}] and state['m'/'v'][{key!r}] must be finite: the "
                     "step gives inf or nan (the parameters or moments given already "
                     "hold them, or the step overflowed); nothing was changed (the step "
                     "was undone)")


def clipped_adam_step(params: FlatArrays, grads: FlatArrays, state: dict, *, max_norm: float,
                      lr: float, betas=(0.9, 0.999), eps: float = 1e-5):
    """``clip_by_global_norm(grads, max_norm)`` then ``adam_update(params, clipped, state,
    lr=lr, betas=betas, eps=eps)``, written **in place** into ``params``, ``state["m"]`` and
    ``state["v"]`` (the fast update's step, on buffers it owns).

    Equals the spec functions (:mod:`ppo_ref.spec.optim`): per element the same
    :func:`~ppo_ref.spec.optim.adam_element` on the same product ``g * scale``; the global norm
    is :func:`~ppo_ref.spec.optim.global_norm` with each array's sum of squares in NumPy's
    pairwise order, written out in the kernel. ``norm`` and, when clipping is active, the
    results agree within rtol 1e-14 per result array (the ``clipped_adam_step`` row of
    ``tests/test_tiers.py``; the same bits with NumPy 2.4, whose ``np.sum`` sums in that order);
    when no clipping happens the new parameters and moments are the same bits (the
    ``clipped_adam_step_no_clip`` row, BITS).

    Args:
        params, grads: intact float64 :class:`~ppo_ref.fast.flat.FlatArrays` of one layout.
        state: ``{"t": int, "m": FlatArrays, "v": FlatArrays}`` in that layout; ``params``,
            ``m`` and ``v`` have distinct buffers, none shared with ``grads``.
        max_norm, lr, betas, eps: as :func:`~ppo_ref.spec.optim.clip_by_global_norm` and
            :func:`~ppo_ref.spec.optim.adam_update`.

    Returns:
        ``(params, new_state, norm)``: ``params`` itself (updated), a new state dict holding
        the same (updated) moment FlatArrays and ``t + 1``, and the global norm before clipping.

    Raises:
        ValueError: arguments not as above, hyperparameters out of range, or a step whose
            results are not finite (only from non-finite parameters or moments, or an overflow):
            such a step is undone before the call returns (each element's previous values are
            kept while the step writes), so ``params`` and the moments hold exactly what they
            held before.
        FloatingPointError: the gradient norm is not finite (nothing is written).
    """
    if not (isinstance(state, Mapping) and {"t", "m", "v"} <= state.keys()):
        raise ValueError("state must be an Adam state (keys 't', 'm', 'v')")
    check_flat_step_arguments(params, grads, state["m"], state["v"])
    t_prev = check_step_count(state["t"])
    lr, beta1, beta2, eps = check_adam_hyperparameters(lr, betas, eps)
    max_norm = check_positive(max_norm, "max_norm")
    t, norm = _clipped_adam_step(params, grads, t_prev, state["m"], state["v"], max_norm, lr,
                                 beta1, beta2, eps)
    return params, {"t": t, "m": state["m"], "v": state["v"]}, norm
