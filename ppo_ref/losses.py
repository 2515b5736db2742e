"""PPO losses, each returned together with its gradient (SPEC §4).

Every loss here is a *mean* over the minibatch of n elements, and every gradient is
d(loss)/d(input) of that mean-reduced loss (so it carries the 1/n factor). The caller scales
and sums them into the total PPO objective

    loss = policy_loss + vf_coef * value_loss_scale * value_loss + ent_coef * entropy_loss

with ``entropy_loss = -mean(entropy)``, and hands the gradients to the networks' backward.

Non-differentiable points (the "kinks" of clip and min/max) follow the subgradient that
``torch`` autograd picks for the usual torch formulation of the same loss (SB3, CleanRL), so
gradients match those implementations exactly, including at the boundaries:

* ``clamp(x, lo, hi)`` passes the gradient where ``lo <= x <= hi`` (boundaries *inclusive*).
* ``minimum(a, b)`` / ``maximum(a, b)`` send the gradient to the selected operand and split it
  half/half when ``a == b``.

The consequences are spelled out in each function's docstring and tested in
``tests/test_losses.py``.

Sources: Schulman et al., "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), eq. (7)
for the clipped surrogate and eq. (9) for the combined objective; value clipping from OpenAI
baselines ``ppo2`` (Huang et al., "The 37 Implementation Details of PPO", ICLR blog track 2022,
detail 9); KL estimators k1 and k3 from J. Schulman, "Approximating KL divergence" (2020).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from ppo_ref._numba import njit
from ppo_ref._checks import (as_float_array, check_choice, check_positive, check_same_shape,
                             result_dtype)

__all__ = [
    "policy_loss",
    "value_loss",
    "entropy_loss",
    "approx_kl",
    "normalize_advantages",
    "explained_variance",
    "VALUE_LOSS_MODES",
    "KL_ESTIMATORS",
]

VALUE_LOSS_MODES = ("max", "sb3")
KL_ESTIMATORS = ("k3", "k1")


def _nonempty(arr: np.ndarray, name: str) -> None:
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty (a mean over zero elements is undefined)")


# ----------------------------------------------------------------------------------------------
# compiled kernels: flat contiguous arrays in, sums out. Every element is widened with
# np.float64() and all arithmetic is float64, for float32 inputs too (numba's float() would keep
# a float32 as float32). The public wrappers below validate, reshape and divide by n. The
# equations are in the wrappers' docstrings; tests/test_losses.py checks every kernel against
# the same equations written with NumPy.
# ----------------------------------------------------------------------------------------------

# exp(r) is finite for r <= 709.78; past this bound a ratio is treated as overflowing (the same
# test in compiled and in pure-Python mode, where math.exp raises instead of returning inf).
_MAX_LOG_RATIO = 709.0


@njit
def _k3_term(log_ratio):
    # exp(r) - 1 - r, with expm1 so that small r keeps its precision; >= 0 in exact arithmetic
    # and the max guards the last ulp of rounding. inf when exp(r) overflows.
    if log_ratio > _MAX_LOG_RATIO:
        return math.inf
    return max(math.expm1(log_ratio) - log_ratio, 0.0)


@njit
def _policy_loss_kernel(new, old, adv, clip_range, d_new):
    """Returns (sum of surrogate terms, count of |ratio-1| > eps, sum of k3 terms, index of the
    first overflowing ratio or gradient, or -1 (the sums are then meaningless)); writes
    d loss / d new (in d_new's dtype)."""
    n = new.size
    low = 1.0 - clip_range
    high = 1.0 + clip_range
    surrogate_sum = 0.0
    n_clipped = 0
    k3_sum = 0.0
    for i in range(n):
        log_ratio = np.float64(new[i]) - np.float64(old[i])
        if log_ratio > _MAX_LOG_RATIO:
            return 0.0, 0, 0.0, i
        ratio = math.exp(log_ratio)
        a = np.float64(adv[i])
        clipped_ratio = min(max(ratio, low), high)
        surrogate_sum += min(ratio * a, clipped_ratio * a)
        if (a > 0.0 and ratio > high) or (a < 0.0 and ratio < low):
            d_new[i] = 0.0
        else:
            d_new[i] = -a * ratio / n
            if not math.isfinite(d_new[i]):  # ratio * A overflows d_new's dtype (float32 first)
                return 0.0, 0, 0.0, i
        if abs(ratio - 1.0) > clip_range:
            n_clipped += 1
        k3_sum += _k3_term(log_ratio)
    return surrogate_sum, n_clipped, k3_sum, -1


@njit
def _value_loss_kernel(values, old_values, returns, clip_range_vf, clip_on, sb3_mode, d_values):
    """Returns the sum of the per-element value losses; writes d loss / d values."""
    n = values.size
    total = 0.0
    for i in range(n):
        v = np.float64(values[i])
        err = v - np.float64(returns[i])
        if not clip_on:
            total += err * err
            d_values[i] = 2.0 * err / n
            continue
        old = np.float64(old_values[i])
        delta = v - old
        inside = abs(delta) <= clip_range_vf
        err_clip = old + min(max(delta, -clip_range_vf), clip_range_vf) - np.float64(returns[i])
        sq_clip = err_clip * err_clip
        if sb3_mode:
            total += sq_clip
            d_values[i] = 2.0 * err_clip / n if inside else 0.0
        else:
            sq = err * err
            total += max(sq, sq_clip)
            if inside or sq > sq_clip:
                weight = 1.0
            elif sq == sq_clip:
                weight = 0.5
            else:
                weight = 0.0
            d_values[i] = weight * 2.0 * err / n
    return total


@njit
def _approx_kl_kernel(old, new, use_k3):
    total = 0.0
    for i in range(old.size):
        log_ratio = np.float64(new[i]) - np.float64(old[i])
        total += _k3_term(log_ratio) if use_k3 else -log_ratio
    return total / old.size


@njit
def _normalize_kernel(adv, ddof, eps, out):
    """Writes (A - mean) / (std + eps) into out; returns False if a statistic overflowed."""
    n = adv.size
    total = 0.0
    for i in range(n):
        total += np.float64(adv[i])
    mean = total / n
    ss = 0.0
    for i in range(n):
        dev = np.float64(adv[i]) - mean
        ss += dev * dev
    std = math.sqrt(ss / (n - ddof))
    if not (math.isfinite(mean) and math.isfinite(std)):
        return False
    denom = std + eps
    for i in range(n):
        out[i] = (np.float64(adv[i]) - mean) / denom
    return True


@njit
def _minibatch_loss_kernel(new, entropy, values, old, adv, returns, old_values, normalize, ddof,
                           clip_range, clip_range_vf, clip_on, sb3_mode, v_scale, adv_out, d_new,
                           d_values):
    """The kernels of one PPO minibatch loss in one call, for 1-D float64 arrays of one length
    n: checks that every input is finite, normalizes the advantages into ``adv_out``
    (:func:`_normalize_kernel`, eps 1e-8) when ``normalize``, then :func:`_policy_loss_kernel`
    and :func:`_value_loss_kernel` exactly as the public wrappers call them; ``d_values`` is
    then multiplied by ``v_scale`` (the value-loss weight: one rounded product per entry, as
    numpy's ``d_values *= v_scale``).

    Returns ``(status, surrogate_sum, n_clipped, k3_sum, value_sum)``; ``status`` 0 when
    everything is finite, else 1 (a non-finite input), 2 (a normalization statistic
    overflowed) or 3 (a ratio or gradient overflowed): the sums are then meaningless and the
    caller takes the checked path, which raises the errors."""
    for arr in (new, entropy, values, old, adv, returns, old_values):
        for i in range(arr.size):
            if not math.isfinite(arr[i]):
                return 1, 0.0, 0, 0.0, 0.0
    a = adv
    if normalize:
        if not _normalize_kernel(adv, ddof, 1e-8, adv_out):
            return 2, 0.0, 0, 0.0, 0.0
        a = adv_out
    surrogate_sum, n_clipped, k3_sum, bad = _policy_loss_kernel(new, old, a, clip_range, d_new)
    if bad >= 0:
        return 3, 0.0, 0, 0.0, 0.0
    v_sum = _value_loss_kernel(values, old_values, returns, clip_range_vf, clip_on, sb3_mode,
                               d_values)
    for i in range(d_values.size):
        d_values[i] *= v_scale
    return 0, surrogate_sum, n_clipped, k3_sum, v_sum


def _flat(arr: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype=dtype).reshape(-1)


def policy_loss(new_log_probs, old_log_probs, advantages,
                clip_range: float) -> Tuple[float, np.ndarray, Dict[str, float]]:
    """PPO clipped surrogate loss and its gradient with respect to ``new_log_probs``.

    With ``ratio = exp(new_log_probs - old_log_probs)`` and eps = ``clip_range``:

        loss = -mean( min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) )

    (Schulman et al. 2017, eq. 7, negated to be minimized.) Gradient, per element i of n:

        d loss / d new_log_probs[i] = -A[i] * ratio[i] / n   if the unclipped term is active
                                    = 0                      otherwise

    where the clipped term is the active one (zero gradient) exactly when
    ``A > 0 and ratio > 1 + eps`` or ``A < 0 and ratio < 1 - eps``. Kinks: at
    ``ratio == 1 +- eps`` the gradient is the unclipped one (torch: clamp passes the gradient at
    its bounds, and min of two equal values splits it half/half between two equal
    gradients); at ``A == 0`` it is 0 either way.

    Args:
        new_log_probs: log pi_theta(a|s) of the current parameters, float array of any shape [...].
        old_log_probs: log pi_old(a|s) recorded at collection, same shape.
        advantages: advantage estimates (usually normalized), same shape.
        clip_range: eps > 0 (0.2 in the paper, SB3 and CleanRL).

    Returns:
        ``(loss, d_new_log_probs, info)``: ``loss`` a Python float; ``d_new_log_probs`` an array
        of the input shape in float32 if every input is float32, else float64; ``info`` a dict
        with ``clip_fraction = mean(|ratio - 1| > clip_range)`` (fraction of elements whose
        ratio lies strictly outside the clip interval) and ``approx_kl``, the k3 estimate
        ``mean(exp(r) - 1 - r)`` with ``r = new - old`` (see :func:`approx_kl`).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, ``clip_range`` <= 0, or
            ``new_log_probs - old_log_probs`` is so large that ``exp`` overflows float64 or an
            active gradient ``-A * ratio / n`` overflows the result dtype (float32: a log-ratio
            above about 88).
    """
    new = as_float_array(new_log_probs, "new_log_probs")
    old = as_float_array(old_log_probs, "old_log_probs")
    adv = as_float_array(advantages, "advantages")
    check_same_shape(old, "old_log_probs", new.shape, "new_log_probs")
    check_same_shape(adv, "advantages", new.shape, "new_log_probs")
    _nonempty(new, "new_log_probs")
    eps = check_positive(clip_range, "clip_range")
    dtype = result_dtype(new, old, adv)

    d_new = np.empty(new.size, dtype=dtype)
    surrogate_sum, n_clipped, k3_sum, bad = _policy_loss_kernel(
        _flat(new, dtype), _flat(old, dtype), _flat(adv, dtype), eps, d_new)
    if bad >= 0:
        i = tuple(int(j) for j in np.unravel_index(bad, new.shape))
        raise ValueError(f"new_log_probs - old_log_probs = {float(new[i]) - float(old[i])} at index "
                         f"{i}: the ratio exp(new - old) (times the advantage) overflows "
                         f"{dtype}; the policy moved too far from the one that collected the data")
    n = new.size
    info = {"clip_fraction": n_clipped / n, "approx_kl": k3_sum / n}
    return -surrogate_sum / n, d_new.reshape(new.shape), info


def value_loss(values, old_values, returns, clip_range_vf: Optional[float] = None,
               mode: str = "max") -> Tuple[float, np.ndarray]:
    """Value-function loss (no 0.5 factor) and its gradient with respect to ``values``.

    Without clipping (``clip_range_vf is None``):

        loss = mean((V - R)^2),      d loss / d V[i] = 2 (V[i] - R[i]) / n

    With clipping, c = ``clip_range_vf`` and ``V_clip = V_old + clip(V - V_old, -c, c)``:

    * ``mode="max"`` (OpenAI baselines ppo2, CleanRL, thrust-rl; a pessimistic bound):
      ``loss = mean(max((V - R)^2, (V_clip - R)^2))``. Gradient: ``2 (V - R) / n`` where
      ``|V - V_old| <= c`` (the two terms coincide; boundary inclusive) or where the unclipped
      term is strictly larger; ``0`` where the clipped (constant) term is strictly larger; and
      ``(V - R) / n`` (half, torch's tie rule for max) where clipping is active and the two
      terms are exactly equal.
    * ``mode="sb3"`` (Stable-Baselines3): ``loss = mean((V_clip - R)^2)``. Gradient:
      ``2 (V_clip - R) / n`` where ``|V - V_old| <= c`` (boundary inclusive), else 0.

    Scale by ``vf_coef`` (and ``value_loss_scale`` = 0.5 to reproduce CleanRL) in the caller.

    Args:
        values: V_theta(s) of the current parameters, float array of any shape [...].
        old_values: V(s) recorded at collection, same shape. May be ``None`` when
            ``clip_range_vf`` is ``None`` (it is not used then).
        returns: value targets R (lambda-returns), same shape.
        clip_range_vf: c > 0, or ``None`` for no clipping. Units of the value function.
        mode: ``"max"`` or ``"sb3"`` (checked even when clipping is off).

    Returns:
        ``(loss, d_values)``: a Python float and an array shaped like ``values`` (float32 if
        every input is float32, else float64).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, ``clip_range_vf`` <= 0,
            ``old_values`` is None while clipping is on, or ``mode`` is unknown.
    """
    check_choice(mode, "mode", VALUE_LOSS_MODES)
    v = as_float_array(values, "values")
    ret = as_float_array(returns, "returns")
    check_same_shape(ret, "returns", v.shape, "values")
    _nonempty(v, "values")
    clip_on = clip_range_vf is not None
    c = check_positive(clip_range_vf, "clip_range_vf") if clip_on else 0.0
    if old_values is None:
        if clip_on:
            raise ValueError("old_values is required when clip_range_vf is set")
        old = None
    else:
        old = as_float_array(old_values, "old_values")
        check_same_shape(old, "old_values", v.shape, "values")
    dtype = result_dtype(v, ret, old)
    flat_v = _flat(v, dtype)
    flat_old = flat_v if old is None else _flat(old, dtype)  # unused when clipping is off
    d_v = np.empty(v.size, dtype=dtype)
    total = _value_loss_kernel(flat_v, flat_old, _flat(ret, dtype), c, clip_on, mode == "sb3", d_v)
    return total / v.size, d_v.reshape(v.shape)


def entropy_loss(entropy) -> Tuple[float, np.ndarray]:
    """Entropy bonus as a loss: ``-mean(entropy)``, and its gradient ``-1/n`` per element.

    Multiply by ``ent_coef`` in the total loss (SB3 and CleanRL: ``- ent_coef * mean(H)``).

    Args:
        entropy: per-sample policy entropy in nats, float array of any shape [...].

    Returns:
        ``(loss, d_entropy)``: a Python float and an array shaped like ``entropy``.

    Raises:
        ValueError: ``entropy`` empty or not finite.
    """
    h = as_float_array(entropy, "entropy")
    _nonempty(h, "entropy")
    return -float(np.mean(h)), np.full(h.shape, -1.0 / h.size, dtype=h.dtype)


def approx_kl(old_log_probs, new_log_probs, estimator: str = "k3") -> float:
    """Sample estimate of KL(pi_old || pi_new) from log-probs of actions drawn from pi_old.

    With ``r = new_log_probs - old_log_probs`` (the log of the importance ratio):

    * ``"k3"``: ``mean(exp(r) - 1 - r)``: unbiased and never negative (each term is >= 0);
      SB3 and CleanRL. Computed with ``expm1`` for precision at small r.
    * ``"k1"``: ``mean(old - new) = mean(-r)``: unbiased, higher variance, can be negative;
      thrust-rl.

    Note the argument order (old first), unlike :func:`policy_loss`.

    Args:
        old_log_probs: log pi_old(a|s), float array [...].
        new_log_probs: log pi_new(a|s), same shape.
        estimator: ``"k3"`` or ``"k1"``.

    Returns:
        The estimate in nats, a Python float (``inf`` if some ``r`` overflows ``exp`` under k3).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, unknown ``estimator``.

    Source: J. Schulman, "Approximating KL divergence" (2020), estimators k1 and k3.
    """
    check_choice(estimator, "estimator", KL_ESTIMATORS)
    old = as_float_array(old_log_probs, "old_log_probs")
    new = as_float_array(new_log_probs, "new_log_probs")
    check_same_shape(new, "new_log_probs", old.shape, "old_log_probs")
    _nonempty(old, "old_log_probs")
    dtype = result_dtype(old, new)
    return float(_approx_kl_kernel(_flat(old, dtype), _flat(new, dtype), estimator == "k3"))


def normalize_advantages(advantages, ddof: int = 1, eps: float = 1e-8) -> np.ndarray:
    """Standardize advantages: ``(A - mean(A)) / (std(A, ddof) + eps)``.

    SB3 and CleanRL normalize each minibatch with ``ddof=1`` (torch's unbiased ``std``);
    thrust-rl the whole batch with ``ddof=0``. An array of one element is returned unchanged
    (as SB3 does; its std is undefined with ddof 1), whatever ``ddof``. A constant array maps to
    (near) zeros, never NaN. Statistics are computed in float64; the result has the input's
    dtype (float32 stays float32).

    Args:
        advantages: float array of any shape [...] (statistics over all elements).
        ddof: delta degrees of freedom of the standard deviation, 0 or 1.
        eps: > 0, added to the standard deviation.

    Returns:
        A new array shaped like ``advantages`` (an empty input gives an empty copy).

    Raises:
        ValueError: ``advantages`` not finite, ``ddof`` not 0 or 1, ``eps`` <= 0, or the values
            are so large (> ~1e150) that their variance overflows.
    """
    adv = as_float_array(advantages, "advantages")
    if isinstance(ddof, (bool, np.bool_)) or ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    eps = check_positive(eps, "eps")
    if adv.size <= 1:
        return adv.copy()
    out = np.empty(adv.size, dtype=adv.dtype)
    if not _normalize_kernel(_flat(adv, adv.dtype), int(ddof), eps, out):
        raise ValueError("advantages are too large to normalize: their variance overflows float64")
    return out.reshape(adv.shape)


def explained_variance(y_pred, y_true) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` with population variances (ddof 0).

    1 is a perfect prediction, 0 no better than predicting the mean, negative worse. Returns
    ``nan`` when ``Var[y_true] == 0`` (undefined), as SB3's ``explained_variance``. The trainers
    report it with ``y_pred`` = rollout values and ``y_true`` = returns.

    Args:
        y_pred: predictions, float array [...].
        y_true: targets, same shape.

    Returns:
        A Python float.

    Raises:
        ValueError: shapes differ, an input is empty or not finite.
    """
    pred = as_float_array(y_pred, "y_pred")
    true = as_float_array(y_true, "y_true")
    check_same_shape(true, "y_true", pred.shape, "y_pred")
    _nonempty(pred, "y_pred")
    var_y = float(np.var(true.astype(np.float64)))
    if var_y == 0.0:
        return float("nan")
    return 1.0 - float(np.var(true.astype(np.float64) - pred.astype(np.float64))) / var_y
