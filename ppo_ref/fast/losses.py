"""The compiled twins of :mod:`ppo_ref.spec.losses`, each equal to its spec namesake bit for bit.

Each loop calls the spec's element functions (registered with ``register_jitable``) on float64
entries (float32 inputs widened exactly, as the spec's ``float()``) and sums ``w[i] * term``
from 0.0 in element order, dividing by the sum of the weights in the same pass; the unweighted
mean entropy is ``np.mean``'s pairwise sum compiled (:func:`_numpy_sum`). The twins check only
what they need to run (sizes, option names, the ratio interval); a result that is not finite
raises ``FloatingPointError`` (the spec function, given the same arguments, names the cause).
"""
from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from ppo_ref._checks import check_choice, non_finite_result
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import losses as _spec
from ppo_ref.spec.losses import MAX_LOG_RATIO
from ppo_ref.spec.losses import advantage_moments as _advantage_moments
from ppo_ref.spec.losses import eps_scale as _eps_scale
from ppo_ref.spec.losses import clipped_surrogate_element as _clipped_surrogate_element
from ppo_ref.spec.losses import k3_element as _k3_element
from ppo_ref.spec.losses import kl_term as _kl_term
from ppo_ref.spec.losses import value_element as _value_element

__all__ = ["policy_loss", "value_loss", "entropy_loss", "approx_kl", "normalize_advantages"]

# the element functions, usable from compiled code (the spec functions are returned unchanged)
for _element in (_spec.k3_element, _spec.clipped_surrogate_element, _spec.value_distance,
                 _spec.value_element, _spec.advantage_moments, _spec.kl_term, _spec.eps_scale):
    register_jitable(**NJIT_OPTIONS)(_element)
del _element

_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_NO_WEIGHTS = np.empty(0)  # (no weights: the loops read none, w = 1.0)
_VALUE_MODES = {mode: code for code, mode in enumerate(_spec.VALUE_LOSS_MODES)}


def _floats(x) -> np.ndarray:
    """``x`` as the spec's ``as_float_array`` makes it (float32 or float64, native byte order),
    unchecked."""
    a = x if type(x) is np.ndarray else np.asarray(x)
    if a.dtype == _F64 or a.dtype == _F32:
        return a
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:  # float16 (or float32 of another order)
        return a.astype(_F32)
    return a.astype(_F64)


def _vector(x) -> np.ndarray:
    """A float32/float64 array (:func:`_floats`) as a 1-D C-contiguous float64 vector (itself
    when it is one)."""
    if x.dtype != _F64 or x.ndim != 1 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=_F64).reshape(-1)
    return x


def _inputs(where: str, *arrays):
    """``(vectors, shape, narrow)``: each array as a float64 vector (:func:`_vector`), the
    shape of the results (None: the arrays are such vectors already, and so are the results)
    and whether the results are float32 (every array float32: the spec's rule); ``ValueError``
    naming ``where`` unless they are non-empty and of one size (so the loops never read past an
    end)."""
    size = arrays[0].size if type(arrays[0]) is np.ndarray else -1
    for a in arrays:
        if not (type(a) is np.ndarray and a.dtype == _F64 and a.ndim == 1 and a.size == size
                and a.flags.c_contiguous):
            break
    else:
        if size:
            return arrays, None, False
    given = [_floats(a) for a in arrays]
    vectors = [_vector(a) for a in given]
    size = vectors[0].size
    for v in vectors:
        if v.size != size or size == 0:
            raise ValueError(f"{where}: the arrays must be non-empty and of one size, got "
                             f"shapes {[a.shape for a in given]}")
    return vectors, given[0].shape, all(a.dtype == _F32 for a in given)


def _weights(where: str, weights, size: int) -> np.ndarray:
    """Given ``weights`` as a float64 vector of ``size`` entries (``ValueError`` otherwise)."""
    w = _vector(_floats(weights))
    if w.size != size:
        raise ValueError(f"{where}: weights must have the size of the inputs {size}, got "
                         f"{w.size}")
    return w


def _as_result(grad: np.ndarray, shape, narrow: bool, where: str) -> np.ndarray:
    """A float64 gradient vector shaped as the inputs (``shape`` None: as it is), rounded once
    to float32 when ``narrow`` (``FloatingPointError`` if the rounding overflows)."""
    if shape is None:
        return grad
    grad = grad.reshape(shape)
    if not narrow:
        return grad
    with np.errstate(over="ignore"):
        out = grad.astype(_F32)
    if not np.isfinite(out).all():
        raise non_finite_result(where)
    return out


@register_jitable(**NJIT_OPTIONS)
def _weight_sum(weights, size):
    """``sum(weights)`` accumulated in element order (the spec's ``_weights``), or ``size``
    when there are no weights."""
    if weights.size == 0:
        return float(size)
    total = 0.0
    for i in range(size):
        total += weights[i]
    return total


@njit
def _policy_loss_pass(new, old, adv, weights, low, high, clip_range, symmetric, dual_clip,
                      count_active, d_new):
    """The loop of :func:`ppo_ref.spec.losses.policy_loss`: per element
    :func:`~ppo_ref.spec.losses.clipped_surrogate_element` and
    :func:`~ppo_ref.spec.losses.k3_element` of ``new[i] - old[i]``, ``d_new[i] = -(w[i] *
    d_surrogate) / n`` (``n = sum(w)``), the sums of ``w[i] * term`` in element order. Returns
    ``(ok, -surrogate_sum / n, counted_sum / n, k3_sum / n)``; ``ok`` is False (and the rest
    meaningless) when a log-ratio passes ``MAX_LOG_RATIO``, ``n`` is not > 0 or a result is
    not finite."""
    size = new.size
    weighted = weights.size > 0
    n = _weight_sum(weights, size)
    if not n > 0.0:
        return False, 0.0, 0.0, 0.0
    surrogate_sum = 0.0
    counted_sum = 0.0
    k3_sum = 0.0
    finite = True
    for i in range(size):
        w = weights[i] if weighted else 1.0
        log_ratio = new[i] - old[i]
        if log_ratio > MAX_LOG_RATIO:
            return False, 0.0, 0.0, 0.0
        surrogate, d_surrogate, counted = _clipped_surrogate_element(
            log_ratio, adv[i], low, high, clip_range, symmetric, dual_clip, count_active)
        surrogate_sum += w * surrogate
        d = -(w * d_surrogate) / n
        d_new[i] = d
        finite &= math.isfinite(d)
        counted_sum += w * counted
        k3_sum += w * _k3_element(log_ratio)
    ok = finite and math.isfinite(surrogate_sum) and math.isfinite(k3_sum)
    return ok, -surrogate_sum / n, counted_sum / n, k3_sum / n


def policy_loss(new_log_probs, old_log_probs, advantages, clip_range, *,
                clip_range_low=None, clip_range_high=None, clip_interval="symmetric",
                dual_clip=None, weights=None, clip_fraction_mode="outside"):
    """:func:`ppo_ref.spec.losses.policy_loss`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite (module docstring)."""
    where = "ppo_ref.fast.losses.policy_loss"
    (new, old, adv), shape, narrow = _inputs(where, new_log_probs, old_log_probs, advantages)
    low, high, symmetric = _spec.clip_bounds(clip_range, clip_range_low, clip_range_high,
                                             clip_interval)
    check_choice(clip_fraction_mode, "clip_fraction_mode", _spec.CLIP_FRACTION_MODES)
    w = _NO_WEIGHTS if weights is None else _weights(where, weights, new.size)
    d_new = np.empty(new.size)
    ok, loss, clip_fraction, kl = _policy_loss_pass(
        new, old, adv, w, low, high, float(clip_range), symmetric,
        0.0 if dual_clip is None else _spec.check_dual_clip(dual_clip),
        clip_fraction_mode == "active", d_new)
    if not ok:
        raise non_finite_result(where)
    return loss, _as_result(d_new, shape, narrow, where), {"clip_fraction": clip_fraction,
                                                           "approx_kl": kl}


@njit
def _value_loss_pass(values, old_values, returns, weights, clip_range_vf, clip_on, mode,
                     huber_delta, boundary_grad, d_values):
    """The loop of :func:`ppo_ref.spec.losses.value_loss`: per element
    :func:`~ppo_ref.spec.losses.value_element`, ``d_values[i] = (w[i] * d_term) / n``, the sum
    of ``w[i] * term`` in element order. Returns ``(ok, total / n)``; ``ok`` is False when ``n``
    is not > 0 or a result is not finite."""
    size = values.size
    weighted = weights.size > 0
    n = _weight_sum(weights, size)
    if not n > 0.0:
        return False, 0.0
    total = 0.0
    finite = True
    for i in range(size):
        w = weights[i] if weighted else 1.0
        term, d_term = _value_element(values[i], old_values[i], returns[i], clip_range_vf,
                                     clip_on, mode, huber_delta, boundary_grad)
        total += w * term
        d = (w * d_term) / n
        d_values[i] = d
        finite &= math.isfinite(d)
    return finite and math.isfinite(total), total / n


def value_loss(values, old_values, returns, clip_range_vf=None, mode="max", *,
               huber_delta=1.0, weights=None, boundary_grad=1.0):
    """:func:`ppo_ref.spec.losses.value_loss`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite (module docstring)."""
    where = "ppo_ref.fast.losses.value_loss"
    code = _VALUE_MODES.get(mode)
    if code is None:
        raise ValueError(f"{where}: mode must be one of {_spec.VALUE_LOSS_MODES}, got {mode!r}")
    clip_on = clip_range_vf is not None
    if old_values is None:
        if clip_on:
            raise ValueError("old_values is required when clip_range_vf is set")
        (v, ret), shape, narrow = _inputs(where, values, returns)
        old = v  # not read when clipping is off
    else:
        (v, old, ret), shape, narrow = _inputs(where, values, old_values, returns)
    w = _NO_WEIGHTS if weights is None else _weights(where, weights, v.size)
    d_v = np.empty(v.size)
    ok, loss = _value_loss_pass(v, old, ret, w, float(clip_range_vf) if clip_on else 0.0,
                                clip_on, code, float(huber_delta), float(boundary_grad), d_v)
    if not ok:
        raise non_finite_result(where)
    return loss, _as_result(d_v, shape, narrow, where)


@register_jitable(**NJIT_OPTIONS)
def _block_sum(a, start, stop):
    """NumPy's sum of at most 128 entries ``a[start:stop]`` (:func:`_numpy_sum`)."""
    n = stop - start
    if n < 8:
        total = a[start] - a[start]  # 0 in a's dtype (the entries are finite or the sum is not)
        for i in range(start, stop):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = start + 8
    end = stop - n % 8
    while i < end:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < stop:
        total += a[i]
        i += 1
    return total


@register_jitable(**NJIT_OPTIONS)
def _numpy_sum(a):
    """The entries of ``a`` summed in its dtype as NumPy sums a contiguous float array
    (``np.add.reduce``, hence ``np.mean``: its pairwise summation): at most 128 entries by
    :func:`_block_sum`; more, the sums of the two halves (the first half's length ``n // 2``
    rounded down to a multiple of 8) added. NumPy recurses; here the recursion runs on a stack
    of ranges ``starts[k]:stops[k]`` (a start of -1: add the last two sums)."""
    starts = np.empty(128, np.int64)
    stops = np.empty(128, np.int64)
    sums = np.empty(64, a.dtype)
    starts[0] = 0
    stops[0] = a.size
    n_ranges = 1
    n_sums = 0
    while n_ranges > 0:
        n_ranges -= 1
        start = starts[n_ranges]
        stop = stops[n_ranges]
        if start < 0:  # both halves summed: add them
            n_sums -= 1
            sums[n_sums - 1] = sums[n_sums - 1] + sums[n_sums]
        elif stop - start <= 128:
            sums[n_sums] = _block_sum(a, start, stop)
            n_sums += 1
        else:
            half = (stop - start) // 2
            half -= half % 8
            starts[n_ranges] = -1
            starts[n_ranges + 1] = start + half
            stops[n_ranges + 1] = stop
            starts[n_ranges + 2] = start
            stops[n_ranges + 2] = start + half
            n_ranges += 3
    return sums[0]


@njit
def _entropy_pass(entropy, grad):
    """The unweighted loop of :func:`ppo_ref.spec.losses.entropy_loss`: returns ``np.mean``'s
    sum of the entropies (:func:`_numpy_sum`, in their dtype) and fills ``grad`` with ``-1 /
    n``."""
    n = entropy.size
    value = -1.0 / n
    for i in range(n):
        grad[i] = value
    return _numpy_sum(entropy)


@njit
def _weighted_entropy_pass(entropy, weights, grad):
    """The weighted loop of :func:`ppo_ref.spec.losses.entropy_loss`: ``sum(w)`` and ``sum(w[i]
    * H[i])`` in element order (float64), ``grad[i] = -w[i] / sum(w)``; returns ``(sum(w) > 0,
    sum(w H) / sum(w))``."""
    n = entropy.size
    total_w = _weight_sum(weights, n)
    total = 0.0
    for i in range(n):
        total += weights[i] * float(entropy[i])
    if not total_w > 0.0:
        return False, 0.0
    for i in range(n):
        grad[i] = -weights[i] / total_w
    return True, total / total_w


def entropy_loss(entropy, weights=None):
    """:func:`ppo_ref.spec.losses.entropy_loss`; bit for bit (the unweighted mean is
    ``np.mean``'s arithmetic, NumPy's pairwise sum in the entropy's dtype divided by the
    count, compiled; the weighted sums are compiled in the spec's order). Raises
    ``FloatingPointError`` for a result that is not finite."""
    where = "ppo_ref.fast.losses.entropy_loss"
    h = _floats(entropy)
    if h.ndim != 1 or not h.flags.c_contiguous:
        h = np.ascontiguousarray(h).reshape(-1)
    n = h.size
    if n == 0:
        raise ValueError(f"{where}: entropy must not be empty")
    grad = np.empty(n, h.dtype)
    if weights is None:
        total = float(_entropy_pass(h, grad))
        # np.mean: the sum divided by the count, rounded to the entropy's dtype
        total = total / n if h.dtype == _F64 else float(np.float32(total / n))
        ok = True
    else:
        ok, total = _weighted_entropy_pass(h, _weights(where, weights, n), grad)
    if not (ok and math.isfinite(total)):
        raise non_finite_result(where)
    shape = np.shape(entropy)
    return -total, grad if len(shape) == 1 else grad.reshape(shape)


@njit
def _kl_pass(old, new, weights, code):
    """The loop of :func:`ppo_ref.spec.losses.approx_kl`: ``sum(w[i] * term(new[i] - old[i]))``
    in element order with ``term`` :func:`~ppo_ref.spec.losses.kl_term` of the estimator's
    ``code``. Returns ``(n, total)``."""
    size = old.size
    weighted = weights.size > 0
    n = _weight_sum(weights, size)
    total = 0.0
    for i in range(size):
        w = weights[i] if weighted else 1.0
        log_ratio = new[i] - old[i]
        total += w * _kl_term(log_ratio, code)
    return n, total


def approx_kl(old_log_probs, new_log_probs, estimator="k3", weights=None):
    """:func:`ppo_ref.spec.losses.approx_kl`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite."""
    where = "ppo_ref.fast.losses.approx_kl"
    check_choice(estimator, "estimator", _spec.KL_ESTIMATORS)
    code = _spec.KL_ESTIMATORS.index(estimator)
    (old, new), _, _ = _inputs(where, old_log_probs, new_log_probs)
    w = _NO_WEIGHTS if weights is None else _weights(where, weights, old.size)
    n, total = _kl_pass(old, new, w, code)
    if not (n > 0.0 and math.isfinite(total)):
        raise non_finite_result(where)
    return total / n


@njit
def _normalize_pass(adv, ddof, eps, code, out):
    """:func:`ppo_ref.spec.losses.normalize_advantages` of a 1-D float64 array of n >= 2
    entries, written into ``out`` (float64 ``[n]``), bit for bit: the compiled
    :func:`~ppo_ref.spec.losses.advantage_moments`, then ``(A_i - mean) / scale`` per element
    with :func:`~ppo_ref.spec.losses.eps_scale` of the placement's ``code``. Returns False
    (``out`` untouched) when the mean or std is not finite."""
    mean, std = _advantage_moments(adv, ddof)
    if not (math.isfinite(mean) and math.isfinite(std)):
        return False
    scale = _eps_scale(std, eps, code)
    for i in range(adv.size):
        out[i] = np.divide(adv[i] - mean, scale)
    return True


def normalize_advantages(advantages, ddof=1, eps=1e-8, placement="add",
                         single_element="unchanged"):
    """:func:`ppo_ref.spec.losses.normalize_advantages`, compiled
    (:func:`~ppo_ref.spec.losses.advantage_moments`, then ``(A - mean) / scale`` per entry);
    bit for bit. Raises ``FloatingPointError`` when the moments are not finite."""
    adv = _floats(advantages)
    check_choice(placement, "placement", _spec.NORM_EPS_PLACEMENTS)
    code = _spec.NORM_EPS_PLACEMENTS.index(placement)
    check_choice(single_element, "single_element", _spec.SINGLE_ELEMENT_RESULTS)
    if adv.size <= 1:
        return _spec.single_element_result(adv, single_element)
    out = np.empty(adv.size)
    if not _normalize_pass(_vector(adv), int(ddof), float(eps), code, out):
        raise non_finite_result("ppo_ref.fast.losses.normalize_advantages")
    if adv.dtype == _F64 and adv.ndim == 1:
        return out
    return out.reshape(adv.shape).astype(adv.dtype, copy=False)
