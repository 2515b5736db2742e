"""The compiled tier of the optimizer: the fused clipped-Adam step of the fast update.

:func:`clipped_adam_step` is :func:`ppo_ref.spec.optim.clip_by_global_norm` then
:func:`ppo_ref.spec.optim.adam_update` for parameters held in one float64 buffer
(:class:`~ppo_ref.fast.flat.FlatArrays`, what the fast policies give), written into that buffer
and the moments' buffers in place, in one compiled call (norm, clipping factor, step).

* The global norm (:func:`_segmented_global_norm`) is :func:`ppo_ref.spec.optim.global_norm`:
  the norm of the per-array norms, each array's sum of squares in NumPy's pairwise order
  (:func:`ppo_ref.fast.sums.pairwise_sum`, written out there: eight partial sums per block
  of at most 128 terms, blocks combined by halving), the order of the ``np.sum`` the spec calls. The order
  is fixed by this code, not by the compiler or the vector width. Tested within rtol 1e-14 of
  the spec (the ``clipped_adam_step`` row of ``tests/test_tiers.py``, ``|fast - spec| <=
  1e-14 * max|spec|`` per result array), a contract that does not lean on NumPy's internals;
  with NumPy 2.4 the two are the same bits.
* Per element the step computes the spec's :func:`~ppo_ref.spec.optim.adam_element` (compiled
  and called by the kernel, once per element) on ``g * scale``, the product
  ``clip_by_global_norm`` computes, so the new parameters and moments equal those of the spec
  functions given the same ``scale``: bit for bit when no clipping happens (the
  ``clipped_adam_step_no_clip`` row, BITS on the parameters and moments).
* A step with a result that is not finite changes nothing: the kernel keeps each element's
  previous values in a scratch array while it writes, and puts them back before returning.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Dict

import numpy as np
from numba import prange
from numba.extending import register_jitable

from ppo_ref._checks import check_adam_hyperparameters, check_positive, check_step_count
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.fast.flat import FlatArrays, same_layout
from ppo_ref.fast.sums import pairwise_sum
from ppo_ref.spec import optim as _spec
from ppo_ref.spec.optim import CLIP_NORM_EPS, adam_element, adam_step_scalars, clip_by_global_norm

__all__ = ["clipped_adam_step", "check_flat_step_arguments"]

# the Adam element, usable from compiled code (the spec function is returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec.adam_element)


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
        p_i, m_i, v_i = adam_element(param[i], grad[i] * scale, m[i], v[i], beta1, beta2,
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
        p_i, m_i, v_i = adam_element(p_i, grad[i] * scale, m_i, v_i, beta1, beta2, step_size,
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
    step_size, bias_correction2_sqrt = adam_step_scalars(t, lr, beta1, beta2)
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
        clip_by_global_norm(grads, max_norm)  # raises FloatingPointError, naming the arrays
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
