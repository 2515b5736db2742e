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

from typing import Dict, Optional, Tuple

import numpy as np

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


def _k3(log_ratio: np.ndarray) -> float:
    # exp(r) - 1 - r, written with expm1 so that small r keeps its precision; >= 0 exactly in
    # exact arithmetic, and the maximum guards the last ulp of rounding.
    with np.errstate(over="ignore"):
        terms = np.maximum(np.expm1(log_ratio) - log_ratio, 0.0)
    return float(np.mean(terms))


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
            ``new_log_probs - old_log_probs`` is so large that ``exp`` overflows.
    """
    new = as_float_array(new_log_probs, "new_log_probs")
    old = as_float_array(old_log_probs, "old_log_probs")
    adv = as_float_array(advantages, "advantages")
    check_same_shape(old, "old_log_probs", new.shape, "new_log_probs")
    check_same_shape(adv, "advantages", new.shape, "new_log_probs")
    _nonempty(new, "new_log_probs")
    eps = check_positive(clip_range, "clip_range")
    dtype = result_dtype(new, old, adv)
    new, old, adv = new.astype(dtype, copy=False), old.astype(dtype, copy=False), adv.astype(dtype, copy=False)

    log_ratio = new - old
    with np.errstate(over="ignore"):
        ratio = np.exp(log_ratio)
    if not np.isfinite(ratio).all():
        i = tuple(int(j) for j in np.argwhere(~np.isfinite(ratio))[0])
        raise ValueError(f"new_log_probs - old_log_probs = {log_ratio[i]} at index {i} overflows "
                         "exp(): the policy moved too far from the one that collected the data")
    low, high = 1.0 - eps, 1.0 + eps
    clipped_ratio = np.clip(ratio, low, high)
    surrogate = np.minimum(ratio * adv, clipped_ratio * adv)
    n = new.size
    loss = -float(np.mean(surrogate))

    clip_active = ((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low))
    d_new = np.where(clip_active, 0.0, -adv * ratio / n).astype(dtype, copy=False)
    info = {
        "clip_fraction": float(np.mean(np.abs(ratio - 1.0) > eps)),
        "approx_kl": _k3(log_ratio),
    }
    return loss, d_new, info


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
    if clip_range_vf is None:
        old = None if old_values is None else as_float_array(old_values, "old_values")
        if old is not None:
            check_same_shape(old, "old_values", v.shape, "values")
        dtype = result_dtype(v, ret, old)
        v, ret = v.astype(dtype, copy=False), ret.astype(dtype, copy=False)
        diff = v - ret
        return float(np.mean(diff * diff)), (2.0 * diff / v.size).astype(dtype, copy=False)

    c = check_positive(clip_range_vf, "clip_range_vf")
    if old_values is None:
        raise ValueError("old_values is required when clip_range_vf is set")
    old = as_float_array(old_values, "old_values")
    check_same_shape(old, "old_values", v.shape, "values")
    dtype = result_dtype(v, old, ret)
    v, old, ret = (a.astype(dtype, copy=False) for a in (v, old, ret))
    n = v.size

    delta = v - old
    inside = np.abs(delta) <= c
    v_clip = old + np.clip(delta, -c, c)
    err_clip = v_clip - ret
    if mode == "sb3":
        loss = float(np.mean(err_clip * err_clip))
        d_v = np.where(inside, 2.0 * err_clip / n, 0.0)
        return loss, d_v.astype(dtype, copy=False)

    err = v - ret
    sq, sq_clip = err * err, err_clip * err_clip
    loss = float(np.mean(np.maximum(sq, sq_clip)))
    weight = np.where(inside | (sq > sq_clip), 1.0, np.where(sq == sq_clip, 0.5, 0.0))
    d_v = weight * 2.0 * err / n
    return loss, d_v.astype(dtype, copy=False)


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
    log_ratio = new.astype(dtype, copy=False) - old.astype(dtype, copy=False)
    if estimator == "k3":
        return _k3(log_ratio)
    return float(np.mean(-log_ratio))


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
    a64 = adv.astype(np.float64, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.mean(a64)
        std = np.std(a64, ddof=int(ddof))
        out = (a64 - mean) / (std + eps)
    if not (np.isfinite(mean) and np.isfinite(std) and np.isfinite(out).all()):
        raise ValueError("advantages are too large to normalize: their variance overflows float64")
    return out.astype(adv.dtype, copy=False)


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
