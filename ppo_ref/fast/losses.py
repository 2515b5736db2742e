"""The compiled twins of :mod:`ppo_ref.spec.losses`: the spec's element functions compiled and
summed in the spec's element order.

* :func:`policy_loss` equals :func:`ppo_ref.spec.losses.policy_loss` bit for bit;
* :func:`value_loss` equals :func:`ppo_ref.spec.losses.value_loss` bit for bit;
* :func:`entropy_loss` equals :func:`ppo_ref.spec.losses.entropy_loss` bit for bit;
* :func:`approx_kl` equals :func:`ppo_ref.spec.losses.approx_kl` bit for bit;
* :func:`normalize_advantages` equals :func:`ppo_ref.spec.losses.normalize_advantages` bit
  for bit.

Each loop calls the spec's :func:`~ppo_ref.spec.losses.clipped_surrogate_element`,
:func:`~ppo_ref.spec.losses.value_element` (with :func:`~ppo_ref.spec.losses.value_distance`),
:func:`~ppo_ref.spec.losses.k3_element` or :func:`~ppo_ref.spec.losses.advantage_moments`,
registered with numba's ``register_jitable`` (compiled code calling them gets a compiled
version), on float64 entries (float32 inputs are widened exactly, as the spec's ``float()``
does) and accumulates ``w[i] * term`` from 0.0 in element order, the spec's order. The loops
compile once, for 1-D float64 arrays.

The twins check what they need to run (sizes, option names, the ratio interval of
:func:`ppo_ref.spec.losses.clip_bounds`) and no more: inputs are not checked for finiteness or
sign. A result that is not finite (a ratio ``exp(new - old)`` past
:data:`~ppo_ref.spec.losses.MAX_LOG_RATIO`, a NaN or inf input, weights summing to 0) raises
``FloatingPointError`` (:func:`ppo_ref._checks.non_finite_result`); the spec function, given the
same arguments, names the cause.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba.extending import register_jitable

from ppo_ref._checks import non_finite_result
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import losses as _spec
from ppo_ref.spec.losses import MAX_LOG_RATIO
from ppo_ref.spec.losses import advantage_moments as _advantage_moments
from ppo_ref.spec.losses import clipped_surrogate_element as _clipped_surrogate_element
from ppo_ref.spec.losses import k3_element as _k3_element
from ppo_ref.spec.losses import value_element as _value_element

__all__ = ["policy_loss", "value_loss", "entropy_loss", "approx_kl", "normalize_advantages"]

# the element functions, usable from compiled code (the spec functions are returned unchanged)
for _element in (_spec.k3_element, _spec.clipped_surrogate_element, _spec.value_distance,
                 _spec.value_element, _spec.advantage_moments):
    register_jitable(**NJIT_OPTIONS)(_element)
del _element

_NO_WEIGHTS = np.empty(0)  # (the loops read no weight when ``weighted`` is False: w = 1.0)


def _flat64(x) -> np.ndarray:
    """``x`` as a 1-D C-contiguous float64 array (a view when it already is float64 and
    contiguous)."""
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    return x.ravel() if x.dtype == _F64 else x.astype(_F64).ravel()


_F64 = np.dtype(np.float64)
_NARROW = (np.dtype(np.float32), np.dtype(np.float16))


def _inputs(where: str, *arrays):
    """``(shape, dtype, flats)``: the first array's shape, the result dtype (float32 when every
    array is float32 or float16: the spec's rule, else float64) and each array as a 1-D
    float64 vector; ``ValueError`` naming ``where`` unless they are non-empty and of one size
    (so the loops never read past an end)."""
    given = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    flats = [_flat64(a) for a in given]
    size = flats[0].size
    for f in flats:
        if f.size != size or size == 0:
            raise ValueError(f"{where}: the arrays must be non-empty and of one size, got "
                             f"shapes {[a.shape for a in given]}")
    narrow = all(a.dtype in _NARROW for a in given)
    return given[0].shape, (np.dtype(np.float32) if narrow else _F64), flats


def _weights(where: str, weights, size: int):
    if weights is None:
        return _NO_WEIGHTS, False
    w = _flat64(weights)
    if w.size != size:
        raise ValueError(f"{where}: weights must have the size of the inputs {size}, got "
                         f"{w.size}")
    return w, True


_remembered_clip_bounds = functools.lru_cache(maxsize=64)(_spec.clip_bounds)


def _clip_bounds(clip_range, clip_range_low, clip_range_high, clip_interval):
    """:func:`ppo_ref.spec.losses.clip_bounds` (its checks included), remembered per argument
    tuple."""
    try:
        return _remembered_clip_bounds(clip_range, clip_range_low, clip_range_high,
                                       clip_interval)
    except TypeError:  # an unhashable argument (a 0-d array, say)
        return _spec.clip_bounds(clip_range, clip_range_low, clip_range_high, clip_interval)


def _as_result(grad: np.ndarray, dtype, shape, where: str) -> np.ndarray:
    """``grad`` (float64) rounded once to ``dtype`` and shaped; ``FloatingPointError`` if the
    rounding overflows (float32)."""
    if dtype == _F64:
        return grad.reshape(shape)
    with np.errstate(over="ignore"):
        out = grad.astype(dtype)
    if not np.isfinite(out).all():
        raise non_finite_result(where)
    return out.reshape(shape)


@register_jitable(**NJIT_OPTIONS)
def _weight_sum(weights, weighted, size):
    """``sum(weights)`` accumulated in element order (the spec's ``_weights``), or ``size``."""
    if not weighted:
        return float(size)
    total = 0.0
    for i in range(size):
        total += weights[i]
    return total


@njit
def _policy_loss_sums(new, old, adv, weights, weighted, low, high, clip_range, symmetric,
                      dual_clip, d_new):
    """The loop of :func:`ppo_ref.spec.losses.policy_loss`: per element
    :func:`~ppo_ref.spec.losses.clipped_surrogate_element` and
    :func:`~ppo_ref.spec.losses.k3_element` of ``new[i] - old[i]``, ``d_new[i] = -(w[i] *
    d_surrogate) / n``, the sums of ``w[i] * term`` in element order. Returns ``(ok, n,
    surrogate_sum, outside_sum, k3_sum)``; ``ok`` is False (and the rest meaningless) when a
    log-ratio passes ``MAX_LOG_RATIO``, ``n`` is not > 0 or a result is not finite."""
    size = new.size
    n = _weight_sum(weights, weighted, size)
    if not n > 0.0:
        return False, n, 0.0, 0.0, 0.0
    surrogate_sum = 0.0
    outside_sum = 0.0
    k3_sum = 0.0
    finite = True
    for i in range(size):
        w = weights[i] if weighted else 1.0
        log_ratio = new[i] - old[i]
        if log_ratio > MAX_LOG_RATIO:
            return False, n, 0.0, 0.0, 0.0
        surrogate, d_surrogate, outside = _clipped_surrogate_element(
            log_ratio, adv[i], low, high, clip_range, symmetric, dual_clip)
        surrogate_sum += w * surrogate
        d = -(w * d_surrogate) / n
        d_new[i] = d
        finite &= math.isfinite(d)
        outside_sum += w * outside
        k3_sum += w * _k3_element(log_ratio)
    ok = finite and math.isfinite(surrogate_sum) and math.isfinite(k3_sum)
    return ok, n, surrogate_sum, outside_sum, k3_sum


def policy_loss(new_log_probs, old_log_probs, advantages, clip_range, *,
                clip_range_low=None, clip_range_high=None, clip_interval="symmetric",
                dual_clip=None, weights=None):
    """:func:`ppo_ref.spec.losses.policy_loss`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite (module docstring)."""
    where = "ppo_ref.fast.losses.policy_loss"
    shape, dtype, (new, old, adv) = _inputs(where, new_log_probs, old_log_probs, advantages)
    low, high, symmetric = _clip_bounds(clip_range, clip_range_low, clip_range_high,
                                        clip_interval)
    w, weighted = _weights(where, weights, new.size)
    d_new = np.empty(new.size)
    ok, n, surrogate_sum, outside_sum, k3_sum = _policy_loss_sums(
        new, old, adv, w, weighted, low, high, float(clip_range), symmetric,
        _spec.check_dual_clip(dual_clip), d_new)
    if not ok:
        raise non_finite_result(where)
    info = {"clip_fraction": outside_sum / n, "approx_kl": k3_sum / n}
    return -surrogate_sum / n, _as_result(d_new, dtype, shape, where), info


@njit
def _value_loss_sums(values, old_values, returns, weights, weighted, clip_range_vf, clip_on,
                     mode, huber_delta, d_values):
    """The loop of :func:`ppo_ref.spec.losses.value_loss`: per element
    :func:`~ppo_ref.spec.losses.value_element`, ``d_values[i] = (w[i] * d_term) / n``, the sum
    of ``w[i] * term`` in element order. Returns ``(ok, n, total)``; ``ok`` is False when
    ``n`` is not > 0 or a result is not finite."""
    size = values.size
    n = _weight_sum(weights, weighted, size)
    if not n > 0.0:
        return False, n, 0.0
    total = 0.0
    finite = True
    for i in range(size):
        w = weights[i] if weighted else 1.0
        term, d_term = _value_element(values[i], old_values[i], returns[i], clip_range_vf,
                                     clip_on, mode, huber_delta)
        total += w * term
        d = (w * d_term) / n
        d_values[i] = d
        finite &= math.isfinite(d)
    return finite and math.isfinite(total), n, total


def value_loss(values, old_values, returns, clip_range_vf=None, mode="max", *,
               huber_delta=1.0, weights=None):
    """:func:`ppo_ref.spec.losses.value_loss`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite (module docstring)."""
    where = "ppo_ref.fast.losses.value_loss"
    code = _spec.VALUE_LOSS_MODES.index(mode)
    clip_on = clip_range_vf is not None
    if old_values is None:
        if clip_on:
            raise ValueError("old_values is required when clip_range_vf is set")
        shape, dtype, (v, ret) = _inputs(where, values, returns)
        old = v  # not read when clipping is off
    else:
        shape, dtype, (v, old, ret) = _inputs(where, values, old_values, returns)
    w, weighted = _weights(where, weights, v.size)
    d_v = np.empty(v.size)
    ok, n, total = _value_loss_sums(v, old, ret, w, weighted,
                                    float(clip_range_vf) if clip_on else 0.0, clip_on, code,
                                    float(huber_delta), d_v)
    if not ok:
        raise non_finite_result(where)
    return total / n, _as_result(d_v, dtype, shape, where)


@njit
def _entropy_sums(entropy, weights):
    """The weighted loop of :func:`ppo_ref.spec.losses.entropy_loss`: ``sum(w)`` then
    ``sum(w[i] * H[i])``, each in element order, and ``grad[i] = -w[i] / sum(w)``. Returns
    ``(total, total_w, grad)``."""
    total_w = _weight_sum(weights, True, weights.size)
    total = 0.0
    for i in range(entropy.size):
        total += weights[i] * entropy[i]
    grad = np.empty(entropy.size)
    if total_w > 0.0:
        for i in range(entropy.size):
            grad[i] = -weights[i] / total_w
    return total, total_w, grad


def entropy_loss(entropy, weights=None):
    """:func:`ppo_ref.spec.losses.entropy_loss`; bit for bit (the unweighted mean is the
    arithmetic of the spec's ``np.mean``: NumPy's sum in the input's dtype, divided by the
    count; the weighted sums are compiled in the spec's order). Raises
    ``FloatingPointError`` for a result that is not finite."""
    where = "ppo_ref.fast.losses.entropy_loss"
    h = np.asarray(entropy)
    if h.dtype.kind != "f":
        h = h.astype(np.float64)
    if h.size == 0:
        raise ValueError(f"{where}: entropy must not be empty")
    if weights is not None:
        w, _ = _weights(where, weights, h.size)
        total, total_w, grad = _entropy_sums(_flat64(h), w)
        if not total_w > 0.0:
            raise non_finite_result(where)
        mean = total / total_w
        if not math.isfinite(mean):
            raise non_finite_result(where)
        return -mean, grad.reshape(h.shape).astype(h.dtype)
    mean = float(np.add.reduce(h, axis=None) / h.size)  # np.mean's arithmetic, as the spec
    if not math.isfinite(mean):
        raise non_finite_result(where)
    return -mean, np.full(h.shape, -1.0 / h.size, dtype=h.dtype)


@njit
def _kl_sum(old, new, weights, weighted, k3):
    """The loop of :func:`ppo_ref.spec.losses.approx_kl`: ``sum(w[i] * term(new[i] - old[i]))``
    in element order with ``term`` :func:`~ppo_ref.spec.losses.k3_element` (``k3``) or ``-r``
    (k1). Returns ``(n, total)``."""
    size = old.size
    n = _weight_sum(weights, weighted, size)
    total = 0.0
    for i in range(size):
        w = weights[i] if weighted else 1.0
        log_ratio = new[i] - old[i]
        total += w * (_k3_element(log_ratio) if k3 else -log_ratio)
    return n, total


def approx_kl(old_log_probs, new_log_probs, estimator="k3", weights=None):
    """:func:`ppo_ref.spec.losses.approx_kl`, compiled; bit for bit. Raises
    ``FloatingPointError`` for a result that is not finite."""
    where = "ppo_ref.fast.losses.approx_kl"
    k3 = _spec.KL_ESTIMATORS.index(estimator) == 0
    _, _, (old, new) = _inputs(where, old_log_probs, new_log_probs)
    w, weighted = _weights(where, weights, old.size)
    n, total = _kl_sum(old, new, w, weighted, k3)
    if not (n > 0.0 and math.isfinite(total)):
        raise non_finite_result(where)
    return total / n


@njit
def _normalize_advantages_kernel(adv, ddof, eps, clamp, out):
    """:func:`ppo_ref.spec.losses.normalize_advantages` of a 1-D float64 array of n >= 2 finite
    entries, written into ``out`` (float64 ``[n]``, may be ``adv`` itself), bit for bit: the
    compiled :func:`~ppo_ref.spec.losses.advantage_moments`, then ``(A_i - mean) / scale`` per
    element with ``scale = std + eps`` (placement ``"add"``) or ``max(std, eps)`` (``clamp``
    True: ``"clamp"``). Returns False (``out`` untouched) when the mean or std is not finite
    (the caller raises the spec's error)."""
    mean, std = _advantage_moments(adv, ddof)
    if not (math.isfinite(mean) and math.isfinite(std)):
        return False
    scale = max(std, eps) if clamp else std + eps
    for i in range(adv.size):
        out[i] = np.divide(adv[i] - mean, scale)
    return True


def normalize_advantages(advantages, ddof=1, eps=1e-8, placement="add"):
    """:func:`ppo_ref.spec.losses.normalize_advantages`, compiled
    (:func:`~ppo_ref.spec.losses.advantage_moments`, then ``(A - mean) / scale`` per entry);
    bit for bit. Raises ``FloatingPointError`` when the moments are not finite."""
    adv = np.asarray(advantages)
    if adv.dtype.kind != "f":
        adv = adv.astype(np.float64)
    clamp = _spec.NORM_EPS_PLACEMENTS.index(placement) == 1
    if adv.size <= 1:
        return adv.copy()
    out = np.empty(adv.size)
    if not _normalize_advantages_kernel(_flat64(adv), int(ddof), float(eps), clamp, out):
        raise non_finite_result("ppo_ref.fast.losses.normalize_advantages")
    return out.reshape(adv.shape).astype(adv.dtype, copy=False)
