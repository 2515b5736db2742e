"""The compiled tier of the PPO losses: the minibatch loss of the fast update in one pass.

:func:`_minibatch_loss_kernel` compiles and calls the element functions of the spec
(:func:`~ppo_ref.spec.losses.clipped_surrogate_element`,
:func:`~ppo_ref.spec.losses.value_element` with :func:`~ppo_ref.spec.losses.value_distance`,
:func:`~ppo_ref.spec.losses.k3_element`), summing
in element order as the spec losses do, so its sums and gradients equal those of
:func:`ppo_ref.spec.losses.policy_loss`, :func:`ppo_ref.spec.losses.value_loss` and
:func:`ppo_ref.spec.losses.approx_kl` bit for bit (``tests/test_losses.py``). Its caller is
:func:`ppo_ref.fast.update.minibatch_loss`; the public losses are :mod:`ppo_ref.losses` (the
spec's).

:func:`_normalize_advantages_kernel` compiles the spec's
:func:`~ppo_ref.spec.losses.advantage_moments` and equals
:func:`ppo_ref.spec.losses.normalize_advantages` bit for bit (on float64 input of two or more
elements; ``tests/test_tiers.py``).
"""
from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import losses as _spec
from ppo_ref.spec.losses import (MAX_LOG_RATIO, advantage_moments, clipped_surrogate_element,
                                 k3_element, value_element)

__all__ = []  # no public function: the kernels' one caller is ppo_ref.fast.update

# the element functions, usable from compiled code (the spec functions are returned unchanged)
for _element in (_spec.k3_element, _spec.clipped_surrogate_element, _spec.value_distance,
                 _spec.value_element, _spec.advantage_moments):
    register_jitable(**NJIT_OPTIONS)(_element)
del _element


@njit
def _normalize_advantages_kernel(adv, ddof, eps, clamp, out):
    """:func:`ppo_ref.spec.losses.normalize_advantages` of a 1-D float64 array of n >= 2 finite
    entries, written into ``out`` (float64 ``[n]``, may be ``adv`` itself), bit for bit: the
    compiled :func:`~ppo_ref.spec.losses.advantage_moments`, then ``(A_i - mean) / scale`` per
    element with ``scale = std + eps`` (placement ``"add"``) or ``max(std, eps)`` (``clamp``
    True: ``"clamp"``). Returns False (``out`` untouched) when the mean or std is not finite
    (the caller raises the spec's error)."""
    mean, std = advantage_moments(adv, ddof)
    if not (math.isfinite(mean) and math.isfinite(std)):
        return False
    scale = max(std, eps) if clamp else std + eps
    for i in range(adv.size):
        out[i] = np.divide(adv[i] - mean, scale)
    return True


#: The largest finite float64: ``abs(x) <= _FLOAT64_MAX`` is False exactly for inf and nan.
_FLOAT64_MAX = float(np.finfo(np.float64).max)


@njit
def _first_non_finite_argument(new, entropy, values, old, adv, returns, old_values, weights):
    """The position in the argument list of the first array that holds inf or nan (-1 if
    none)."""
    arrays = (new, entropy, values, old, adv, returns, old_values, weights)
    for j in range(len(arrays)):
        arr = arrays[j]
        for i in range(arr.size):
            if not math.isfinite(arr[i]):
                return j
    return -1


@njit
def _minibatch_loss_sums(new, entropy, values, old, adv, returns, old_values, weights, low,
                         high, clip_range, symmetric, dual_clip, clip_range_vf, clip_on,
                         value_mode, huber_delta, v_scale, d_new, d_values):
    """:func:`_minibatch_loss_kernel`'s results (same arguments), plus a ninth: whether every
    ``d_values`` entry written is finite (meaningful when ``status`` is 0).

    The finiteness of the inputs is counted inside the loss's own pass (comparisons, no early
    exit) rather than in a pass of its own before it; when an input is not finite, or before
    reporting an overflow (``status`` 2), :func:`_first_non_finite_argument` names the first
    such array, so the results are those of checking the inputs first. The sums are
    accumulated in the same element order as the kernel documents."""
    n = new.size
    w_sum = 0.0
    for i in range(n):
        w_sum += weights[i]
    if not (w_sum > 0.0 and abs(w_sum) <= _FLOAT64_MAX):  # inputs first, then the division
        j = _first_non_finite_argument(new, entropy, values, old, adv, returns, old_values,
                                       weights)
        if j >= 0:
            return 1, j, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
    surrogate_sum = 0.0
    outside_sum = 0.0
    k3_sum = 0.0
    k1_sum = 0.0
    value_sum = 0.0
    n_finite = 0  # elements whose inputs are all finite
    n_finite_d_values = 0
    for i in range(n):
        w = weights[i]
        new_i = new[i]
        old_i = old[i]
        adv_i = adv[i]
        value_i = values[i]
        old_value_i = old_values[i]
        return_i = returns[i]
        n_finite += ((abs(new_i) <= _FLOAT64_MAX) & (abs(old_i) <= _FLOAT64_MAX)
                     & (abs(adv_i) <= _FLOAT64_MAX) & (abs(value_i) <= _FLOAT64_MAX)
                     & (abs(old_value_i) <= _FLOAT64_MAX) & (abs(return_i) <= _FLOAT64_MAX)
                     & (abs(w) <= _FLOAT64_MAX))
        log_ratio = new_i - old_i
        if log_ratio > MAX_LOG_RATIO:
            j = _first_non_finite_argument(new, entropy, values, old, adv, returns, old_values,
                                           weights)
            if j >= 0:
                return 1, j, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
            return 2, i, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
        surrogate, d_surrogate, outside = clipped_surrogate_element(
            log_ratio, adv_i, low, high, clip_range, symmetric, dual_clip)
        surrogate_sum += w * surrogate
        d_new_i = -(w * d_surrogate) / w_sum
        d_new[i] = d_new_i
        if not math.isfinite(d_new_i):
            j = _first_non_finite_argument(new, entropy, values, old, adv, returns, old_values,
                                           weights)
            if j >= 0:
                return 1, j, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
            return 2, i, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
        outside_sum += w * outside
        k3_sum += w * k3_element(log_ratio)
        k1_sum += w * -log_ratio
        term, d_term = value_element(value_i, old_value_i, return_i, clip_range_vf, clip_on,
                                     value_mode, huber_delta)
        value_sum += w * term
        d_values_i = ((w * d_term) / w_sum) * v_scale
        d_values[i] = d_values_i
        n_finite_d_values += abs(d_values_i) <= _FLOAT64_MAX
    entropy_finite = True
    for i in range(entropy.size):
        if not math.isfinite(entropy[i]):
            entropy_finite = False
            break
    if n_finite != n or not entropy_finite:
        return (1, _first_non_finite_argument(new, entropy, values, old, adv, returns,
                                              old_values, weights),
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)
    return (0, -1, surrogate_sum, outside_sum, k3_sum, k1_sum, value_sum, w_sum,
            n_finite_d_values == n)


@njit
def _minibatch_loss_kernel(new, entropy, values, old, adv, returns, old_values, weights, low,
                           high, clip_range, symmetric, dual_clip, clip_range_vf, clip_on,
                           value_mode, huber_delta, v_scale, d_new, d_values):
    """The sums and gradients of one PPO minibatch loss, for 1-D float64 arrays of one length n
    (``weights``: the per-row weights, all 1.0 for the plain means).

    First ``w_sum``, the sum of ``weights`` in element order. Then per element, in order:
    :func:`~ppo_ref.spec.losses.clipped_surrogate_element` of ``new - old`` and ``adv`` with
    the ratio interval ``[low, high]`` and ``dual_clip`` (``d_new[i] = -(w[i] * d_surrogate) /
    w_sum``), :func:`~ppo_ref.spec.losses.k3_element`, the k1 term ``-(new - old)`` and
    :func:`~ppo_ref.spec.losses.value_element` with ``value_mode`` and ``huber_delta``
    (``d_values[i] = ((w[i] * d_term) / w_sum) * v_scale``), each sum of ``w[i] * term``
    accumulated in element order: the arithmetic of the spec's ``policy_loss``, ``approx_kl``
    and ``value_loss`` (with ``weights``) followed by ``d_values * v_scale``, bit for bit.

    Returns ``(status, index, surrogate_sum, outside_sum, k3_sum, k1_sum, value_sum, w_sum)``:
    ``status`` 0 when all is well; 1 when an input holds inf or nan (``index``: the position of
    the first such array in the argument list); 2 when the ratio or its gradient overflows at
    element ``index`` (every input finite). The sums, and ``d_new``/``d_values``, are
    meaningless unless ``status`` is 0. The pass is :func:`_minibatch_loss_sums`.
    """
    (status, index, surrogate_sum, outside_sum, k3_sum, k1_sum, value_sum, w_sum,
     _d_values_finite) = _minibatch_loss_sums(new, entropy, values, old, adv, returns,
                                              old_values, weights, low, high, clip_range,
                                              symmetric, dual_clip, clip_range_vf, clip_on,
                                              value_mode, huber_delta, v_scale, d_new,
                                              d_values)
    return status, index, surrogate_sum, outside_sum, k3_sum, k1_sum, value_sum, w_sum


@njit
def _weighted_sum(weights, values):
    """``sum_i weights[i] * values[i]`` over two 1-D float64 arrays of one length, accumulated in
    element order from 0.0: the weighted sum of :func:`ppo_ref.spec.losses.entropy_loss`
    (``total += w_i * h_i``), bit for bit."""
    total = 0.0
    for i in range(weights.size):
        total += weights[i] * values[i]
    return total
