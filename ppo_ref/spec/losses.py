"""PPO losses, each returned together with its gradient (the readable tier).

Every loss here is a *mean* over the n elements of a minibatch, and every gradient is
d(loss)/d(input) of that mean-reduced loss (so it carries the 1/n factor). The caller scales and
sums them into the total PPO objective (Schulman et al. 2017, eq. 9, negated to be minimized)::

    loss = policy_loss + vf_coef * value_loss_scale * value_loss + ent_coef * entropy_loss

with ``entropy_loss = -mean(entropy)``, and hands the gradients to the networks' backward.

The arithmetic of one element is written once, in the scalar functions
:func:`clipped_surrogate_element`, :func:`value_element` and :func:`k3_element`; the losses below
apply them element by element in a loop and sum in element order, and their compiled twins
(:mod:`ppo_ref.fast.losses`) compile and call the same functions in the same order (so both
tiers give the same bits). They are written in the subset of Python that
numba compiles, in float64.

Non-differentiable points (the "kinks" of clip and min/max) follow the subgradient that
``torch`` autograd picks for the usual torch formulation of the same loss (SB3, CleanRL), so in
exact arithmetic the gradients are those implementations' everywhere, the kinks included:

* ``clamp(x, lo, hi)`` passes the gradient where ``lo <= x <= hi`` (boundaries *inclusive*).
* ``minimum(a, b)`` / ``maximum(a, b)`` send the gradient to the selected operand and split it
  half/half when ``a == b``.

In floating point a tie can also arise from rounding alone, and such ties are resolved as the
code here is written, which can differ from torch by one rounding-level case: the clipped
surrogate decides which term is active from the ratio and the interval bounds (clipped, zero
gradient, exactly when ``A > 0 and ratio > high`` or ``A < 0 and ratio < low``), not from the
rounded products. Where the ratio lies an ulp or so beyond a bound and ``ratio * A`` and
``bound * A`` round to the same float64, torch's ``min`` sees equal operands and passes half
the unclipped gradient; here the element counts as clipped and passes none (and a ratio just
inside a bound passes all of it). The loss values are the same. The dual clip's ``max`` and the
clipped value loss's ``max`` compare the computed terms, and split at equality as torch does.

Sources: Schulman et al., "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), eq. (7)
for the clipped surrogate and eq. (9) for the combined objective; value clipping from OpenAI
baselines ``ppo2`` (Huang et al., "The 37 Implementation Details of PPO", ICLR blog track 2022,
detail 9); KL estimators k1 and k3 from J. Schulman, "Approximating KL divergence" (2020).
"""
from __future__ import annotations

import math
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
    "advantage_moments",
    "explained_variance",
    "clipped_surrogate_element",
    "value_element",
    "k3_element",
    "value_distance",
    "clip_bounds",
    "VALUE_LOSS_MODES",
    "CLIP_INTERVALS",
    "NORM_EPS_PLACEMENTS",
    "KL_ESTIMATORS",
    "MAX_LOG_RATIO",
]

VALUE_LOSS_MODES = ("max", "sb3", "huber")
#: The codes of :data:`VALUE_LOSS_MODES` the element functions take (its indices).
VALUE_MODE_MAX, VALUE_MODE_SB3, VALUE_MODE_HUBER = 0, 1, 2
KL_ESTIMATORS = ("k3", "k1")
CLIP_INTERVALS = ("symmetric", "reciprocal")
NORM_EPS_PLACEMENTS = ("add", "clamp")

#: ``exp(r)`` is finite for ``r <= 709.78``; past this bound a ratio counts as overflowing
#: (``math.exp`` raises there in plain Python, compiled code would return inf).
MAX_LOG_RATIO = 709.0


# ----------------------------------------------------------------------------------------------
# the arithmetic of one element (float64 scalars in, float64 scalars out)
# ----------------------------------------------------------------------------------------------

def k3_element(log_ratio):
    """``exp(r) - 1 - r`` for the log-ratio ``r = log pi_new - log pi_old`` (k3 estimator term).

    Computed with ``expm1`` so that a small ``r`` keeps its precision; >= 0 in exact arithmetic,
    and the ``max`` guards the last ulp of rounding. ``inf`` when ``exp(r)`` overflows.
    """
    if log_ratio > MAX_LOG_RATIO:
        return math.inf
    return max(math.expm1(log_ratio) - log_ratio, 0.0)


def clipped_surrogate_element(log_ratio, advantage, low, high, clip_range, symmetric,
                              dual_clip):
    """One term of the clipped surrogate objective (PPO eq. 7) and its derivative.

    With ``ratio = exp(log_ratio)`` (requires ``log_ratio <= MAX_LOG_RATIO``) and the ratio
    interval ``[low, high]`` (``[1 - eps, 1 + eps]`` in the paper)::

        surrogate = min(ratio * A, clip(ratio, low, high) * A)
        d surrogate / d log_ratio = A * ratio    where the unclipped term is active
                                  = 0            where the clipped term is (A > 0 and
                                                 ratio > high, or A < 0 and ratio < low)

    With dual clipping (``dual_clip`` = c > 1; 0 switches it off), for ``A < 0`` the term is
    further bounded below: ``max(surrogate, c * A)`` (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep Reinforcement Learning", arXiv:1912.09729, eq. 5; tianshou
    ``PPO(dual_clip=c)``), derivative 0 where ``c * A`` is larger and half the derivative
    where the two are equal (torch's tie rule for max).

    At ``ratio == low`` or ``high`` the derivative is the unclipped one (torch's clamp passes
    the gradient at its bounds). Returns ``(surrogate, d_surrogate, outside)``; ``outside``
    (counted by the clip fraction) is ``|ratio - 1| > clip_range`` when ``symmetric`` (SB3,
    CleanRL; ``[low, high] = [1 - clip_range, 1 + clip_range]``), else ``ratio < low or ratio >
    high``.
    """
    ratio = math.exp(log_ratio)
    clipped_ratio = min(max(ratio, low), high)
    surrogate = min(ratio * advantage, clipped_ratio * advantage)
    if (advantage > 0.0 and ratio > high) or (advantage < 0.0 and ratio < low):
        d_surrogate = 0.0
    else:
        d_surrogate = advantage * ratio
    if dual_clip > 0.0 and advantage < 0.0:
        floor = dual_clip * advantage
        if floor > surrogate:
            surrogate = floor
            d_surrogate = 0.0
        elif floor == surrogate:
            d_surrogate = 0.5 * d_surrogate
    if symmetric:
        outside = abs(ratio - 1.0) > clip_range
    else:
        outside = ratio < low or ratio > high
    return surrogate, d_surrogate, outside


def value_distance(err, mode, huber_delta):
    """The distance of one value error ``err = V - R`` and its derivative: ``err^2`` and
    ``2 err`` (modes ``VALUE_MODE_MAX``, ``VALUE_MODE_SB3``), or for ``VALUE_MODE_HUBER`` the
    Huber loss with ``delta`` = ``huber_delta``, ``0.5 err^2`` where ``|err| < delta`` else
    ``delta (|err| - delta / 2)``, derivative ``err`` or ``delta sign(err)`` (torch
    ``huber_loss``; torchrl's default ``smooth_l1`` is this with delta 1)."""
    if mode == VALUE_MODE_HUBER:
        z = abs(err)
        if z < huber_delta:
            return 0.5 * err * err, err
        return huber_delta * (z - 0.5 * huber_delta), (huber_delta if err > 0.0 else -huber_delta)
    return err * err, 2.0 * err


def value_element(value, old_value, target, clip_range_vf, clip_on, mode, huber_delta):
    """One term of the value loss (no 0.5 factor) and its derivative w.r.t. ``value``.

    ``d(e)`` is :func:`value_distance` (``e^2``, or the Huber loss in ``VALUE_MODE_HUBER``).
    Without clipping: ``d(V - R)`` and its derivative. With clipping, c = ``clip_range_vf`` and
    ``V_clip = V_old + clip(V - V_old, -c, c)``:

    * ``VALUE_MODE_MAX`` and ``VALUE_MODE_HUBER``: ``max(d(V - R), d(V_clip - R))``;
      derivative ``d'(V - R)`` where ``|V - V_old| <= c`` (boundary inclusive) or the unclipped
      term is strictly larger, 0 where the clipped term is strictly larger, half of it (torch's
      tie rule for max) where clipping is active and both terms are equal.
    * ``VALUE_MODE_SB3``: ``d(V_clip - R)``; derivative ``d'(V_clip - R)`` where ``|V - V_old|
      <= c``, else 0.

    Returns ``(term, d_term)``.
    """
    err = value - target
    if not clip_on:
        return value_distance(err, mode, huber_delta)
    delta = value - old_value
    inside = abs(delta) <= clip_range_vf
    err_clip = old_value + min(max(delta, -clip_range_vf), clip_range_vf) - target
    sq_clip, d_clip = value_distance(err_clip, mode, huber_delta)
    if mode == VALUE_MODE_SB3:
        return sq_clip, (d_clip if inside else 0.0)
    sq, d_sq = value_distance(err, mode, huber_delta)
    if inside or sq > sq_clip:
        weight = 1.0
    elif sq == sq_clip:
        weight = 0.5
    else:
        weight = 0.0
    return max(sq, sq_clip), weight * d_sq


def clip_bounds(clip_range, clip_range_low=None, clip_range_high=None,
                clip_interval="symmetric"):
    """The ratio interval ``(low, high, symmetric)`` of the clipped surrogate.

    * ``clip_interval="symmetric"`` (the paper, SB3, CleanRL): ``[1 - eps_low, 1 + eps_high]``
      with ``eps_low = clip_range_low``, ``eps_high = clip_range_high``, each ``clip_range`` when
      None (torchrl's ``clip_epsilon=(low, high)`` tuple sets both).
    * ``clip_interval="reciprocal"`` (Sample Factory: "unbiased clip(x, 1+e, 1/(1+e))",
      ``clip_ratio_low = 1.0 / clip_ratio_high``): ``[1 / (1 + eps_high), 1 + eps_high]``
      (``clip_range_low`` must then be None).

    ``symmetric`` is True when the interval is ``[1 - clip_range, 1 + clip_range]`` (both
    overrides None, symmetric interval): the clip fraction then counts ``|ratio - 1| >
    clip_range`` exactly as SB3 and CleanRL do. Raises ``ValueError`` for an unknown interval,
    an eps not > 0, or a lower eps >= 1 (a bound <= 0).
    """
    check_choice(clip_interval, "clip_interval", CLIP_INTERVALS)
    eps = check_positive(clip_range, "clip_range")
    high_eps = eps if clip_range_high is None else check_positive(clip_range_high,
                                                                  "clip_range_high")
    if clip_interval == "reciprocal":
        if clip_range_low is not None:
            raise ValueError("clip_range_low must be None with clip_interval='reciprocal' (the "
                             "lower bound is 1 / (1 + eps_high))")
        high = 1.0 + high_eps
        return 1.0 / high, high, False
    low_eps = eps if clip_range_low is None else check_positive(clip_range_low, "clip_range_low")
    if not low_eps < 1.0 and clip_range_low is not None:
        raise ValueError(f"clip_range_low must be < 1 (the ratio bound 1 - clip_range_low must "
                         f"be > 0), got {low_eps}")
    symmetric = clip_range_low is None and clip_range_high is None
    return 1.0 - low_eps, 1.0 + high_eps, symmetric


def check_dual_clip(dual_clip) -> float:
    """``dual_clip`` as the element functions take it: 0.0 for None (off), else the float c;
    raises ``ValueError`` unless c > 1 (tianshou's condition)."""
    if dual_clip is None:
        return 0.0
    c = check_positive(dual_clip, "dual_clip")
    if not c > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {c}")
    return c


def _weights(weights, shape, name_of_shape: str):
    """The per-element weights as a float64 list (all 1.0 when ``weights`` is None) and their
    sum, in element order. Raises ``ValueError`` for a shape other than ``shape``, a negative
    or non-finite weight, or weights summing to 0."""
    if weights is None:
        n = int(np.prod(shape))
        return [1.0] * n, float(n)
    w = as_float_array(weights, "weights")
    check_same_shape(w, "weights", shape, name_of_shape)
    if np.any(w < 0):
        raise ValueError("weights must be >= 0 (a mask of 0/1 or per-row weights)")
    items = _elements(w)
    total = 0.0
    for x in items:
        total += x
    if not total > 0.0 or not math.isfinite(total):
        raise ValueError(f"weights must have a positive finite sum, got {total}")
    return items, total


# ----------------------------------------------------------------------------------------------
# the losses
# ----------------------------------------------------------------------------------------------

def _nonempty(arr: np.ndarray, name: str) -> None:
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty (a mean over zero elements is undefined)")


def _elements(arr: np.ndarray) -> list:
    """The entries of ``arr`` in C order as Python floats (float64)."""
    return np.asarray(arr, dtype=np.float64).ravel().tolist()


def ratio_overflow_error(new_log_probs, old_log_probs, flat_index: int, dtype) -> ValueError:
    """The error for a ratio (or an active gradient ``-A * ratio / n``) that overflows
    ``dtype`` at ``flat_index`` of arrays shaped like ``new_log_probs``."""
    new = np.asarray(new_log_probs)
    i = tuple(int(j) for j in np.unravel_index(flat_index, new.shape))
    diff = float(new[i]) - float(np.asarray(old_log_probs)[i])
    return ValueError(f"new_log_probs - old_log_probs = {diff} at index {i}: the ratio "
                      f"exp(new - old) (times the advantage) overflows {np.dtype(dtype)}; the "
                      "policy moved too far from the one that collected the data")


def log_ratio_overflow_error(estimator: str) -> ValueError:
    """The error for log-ratios ``r = new_log_probs - old_log_probs`` whose difference, or whose
    sum in the KL ``estimator`` (``"k3"`` or ``"k1"``), overflows float64."""
    what = "exp(r) - 1 - r" if estimator == "k3" else "-r"
    return ValueError(f"new_log_probs - old_log_probs is too large in magnitude: r or the sum "
                      f"of the {estimator} terms {what} overflows float64; the policy moved too "
                      "far from the one that collected the data")


def surrogate_overflow_error() -> ValueError:
    """The error for a surrogate sum ``sum ratio * advantages`` that overflows float64."""
    return ValueError("advantages are too large: the sum of the surrogate terms "
                      "ratio * advantages overflows float64")


def value_overflow_error() -> ValueError:
    """The error for a value loss (or its gradient) that overflows: ``values`` and ``returns``
    (or ``old_values``) too far apart."""
    return ValueError("values are too far from returns (or old_values): the squared error "
                      "(values - returns)^2, its mean or its gradient overflows float64")


def entropy_overflow_error() -> ValueError:
    """The error for an ``entropy`` whose mean overflows float64."""
    return ValueError("entropy is too large in magnitude: its mean overflows float64")


def policy_loss(new_log_probs, old_log_probs, advantages, clip_range: float, *,
                clip_range_low: Optional[float] = None, clip_range_high: Optional[float] = None,
                clip_interval: str = "symmetric", dual_clip: Optional[float] = None,
                weights=None) -> Tuple[float, np.ndarray, Dict[str, float]]:
    """PPO clipped surrogate loss and its gradient with respect to ``new_log_probs``.

    With ``ratio = exp(new_log_probs - old_log_probs)`` and eps = ``clip_range``::

        loss = -mean( min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) )

    (Schulman et al. 2017, eq. 7, negated to be minimized.) Gradient, per element i of n::

        d loss / d new_log_probs[i] = -A[i] * ratio[i] / n   if the unclipped term is active
                                    = 0                      otherwise

    where the clipped term is the active one (zero gradient) exactly when
    ``A > 0 and ratio > 1 + eps`` or ``A < 0 and ratio < 1 - eps``. Kinks: at
    ``ratio == 1 +- eps`` the gradient is the unclipped one (torch: clamp passes the gradient at
    its bounds, and min of two equal values splits it half/half between two equal
    gradients); at ``A == 0`` it is 0 either way. Per element: :func:`clipped_surrogate_element`.

    Args:
        new_log_probs: log pi_theta(a|s) of the current parameters, float array of any shape
            [...] (nats).
        old_log_probs: log pi_old(a|s) recorded at collection, same shape.
        advantages: advantage estimates (usually normalized), same shape.
        clip_range: eps > 0 (0.2 in the paper, SB3 and CleanRL).
        clip_range_low, clip_range_high, clip_interval: an asymmetric ratio interval (keyword
            options; :func:`clip_bounds`): ``[1 - clip_range_low, 1 + clip_range_high]``
            (torchrl's ``clip_epsilon=(low, high)``), or with ``clip_interval="reciprocal"``
            Sample Factory's ``[1 / (1 + eps), 1 + eps]``. Defaults: ``[1 - eps, 1 + eps]``.
        dual_clip: None (off) or c > 1: for ``A < 0`` the term is ``max(min(...), c * A)``
            (tianshou ``dual_clip``; Ye et al. 2020, arXiv:1912.09729).
        weights: None or non-negative per-element weights of the input shape (a 0/1 valid
            mask: torchrl, Sample Factory): every mean above, and ``clip_fraction`` and
            ``approx_kl``, becomes ``sum(w * x) / sum(w)`` and the gradient ``w[i] * ... /
            sum(w)``. None is all ones (the same bits as the plain mean).

    Returns:
        ``(loss, d_new_log_probs, info)``: ``loss`` a Python float; ``d_new_log_probs`` an array
        of the input shape in float32 if every input is float32, else float64 (computed in
        float64 either way); ``info`` a dict with ``clip_fraction = mean(|ratio - 1| >
        clip_range)`` and ``approx_kl``, the k3 estimate ``mean(exp(r) - 1 - r)`` with
        ``r = new - old`` (see :func:`approx_kl`).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, ``clip_range`` <= 0, a bad
            ``clip_range_low``/``clip_range_high``/``clip_interval``, ``dual_clip`` not > 1,
            ``weights`` negative, of another shape or summing to 0, or
            ``new_log_probs - old_log_probs`` is so large that ``exp`` overflows float64 or an
            active gradient ``-A * ratio / n`` overflows the result dtype (float32: a log-ratio
            above about 88), so negative that the log-ratio or the k3 sum overflows float64,
            or ``advantages`` so large that the surrogate sum overflows.
    """
    new = as_float_array(new_log_probs, "new_log_probs")
    old = as_float_array(old_log_probs, "old_log_probs")
    adv = as_float_array(advantages, "advantages")
    check_same_shape(old, "old_log_probs", new.shape, "new_log_probs")
    check_same_shape(adv, "advantages", new.shape, "new_log_probs")
    _nonempty(new, "new_log_probs")
    eps = check_positive(clip_range, "clip_range")
    low, high, symmetric = clip_bounds(eps, clip_range_low, clip_range_high, clip_interval)
    dual = check_dual_clip(dual_clip)
    dtype = result_dtype(new, old, adv)
    w, n = _weights(weights, new.shape, "new_log_probs")  # n: sum of the weights

    d_new = np.empty(new.size, dtype=np.float64)
    surrogate_sum = 0.0
    n_outside = 0.0
    k3_sum = 0.0
    for i, (new_i, old_i, a) in enumerate(zip(_elements(new), _elements(old), _elements(adv))):
        log_ratio = new_i - old_i
        if log_ratio > MAX_LOG_RATIO:
            raise ratio_overflow_error(new, old, i, dtype)
        surrogate, d_surrogate, outside = clipped_surrogate_element(log_ratio, a, low, high, eps,
                                                                    symmetric, dual)
        surrogate_sum += w[i] * surrogate
        d_new[i] = -(w[i] * d_surrogate) / n
        n_outside += w[i] * outside
        k3_sum += w[i] * k3_element(log_ratio)
    with np.errstate(over="ignore"):
        d_new = d_new.astype(dtype)
    if not np.isfinite(d_new).all():
        raise ratio_overflow_error(new, old, int(np.argmin(np.isfinite(d_new))), dtype)
    if not math.isfinite(k3_sum):  # a log-ratio below about -1e308, or their sum
        raise log_ratio_overflow_error("k3")
    if not math.isfinite(surrogate_sum):
        raise surrogate_overflow_error()
    info = {"clip_fraction": n_outside / n, "approx_kl": k3_sum / n}
    return -surrogate_sum / n, d_new.reshape(new.shape), info


def value_loss(values, old_values, returns, clip_range_vf: Optional[float] = None,
               mode: str = "max", *, huber_delta: float = 1.0,
               weights=None) -> Tuple[float, np.ndarray]:
    """Value-function loss (no 0.5 factor) and its gradient with respect to ``values``.

    Without clipping (``clip_range_vf is None``)::

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

    * ``mode="huber"`` (torchrl ``ClipPPOLoss`` default ``loss_critic_type="smooth_l1"``): the
      squared error replaced by the Huber loss ``0.5 e^2`` (``|e| < huber_delta``) or
      ``huber_delta (|e| - huber_delta / 2)`` (torch ``huber_loss``; ``smooth_l1`` is
      ``huber_delta = 1``), clipped in the "max" form as torchrl's ``clip_value``. Note the 0.5
      inside the Huber loss.

    Per element: :func:`value_element`. Scale by ``vf_coef`` (and ``value_loss_scale`` = 0.5 to
    reproduce CleanRL) in the caller. With ``weights`` (a 0/1 valid mask or per-element
    weights, shape of ``values``) the mean is ``sum(w * term) / sum(w)`` and the gradient
    ``w[i] * d_term[i] / sum(w)``.

    Args:
        values: V_theta(s) of the current parameters, float array of any shape [...].
        old_values: V(s) recorded at collection, same shape. May be ``None`` when
            ``clip_range_vf`` is ``None`` (it is not used then).
        returns: value targets R (lambda-returns), same shape.
        clip_range_vf: c > 0, or ``None`` for no clipping. Units of the value function.
        mode: ``"max"``, ``"sb3"`` or ``"huber"`` (checked even when clipping is off).
        huber_delta: > 0, the Huber threshold (``mode="huber"`` only; torchrl: 1).
        weights: None (all ones: the plain mean, same bits) or weights >= 0 as described.

    Returns:
        ``(loss, d_values)``: a Python float and an array shaped like ``values`` (float32 if
        every input is float32, else float64; computed in float64).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, ``clip_range_vf`` <= 0,
            ``old_values`` is None while clipping is on, ``mode`` is unknown, or the values are
            so far from the returns that the loss or its gradient (in the result dtype)
            overflows (e.g. ``|values - returns|`` above about 1.3e154 in float64).
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
        old = v  # not read when clipping is off
    else:
        old = as_float_array(old_values, "old_values")
        check_same_shape(old, "old_values", v.shape, "values")
    dtype = result_dtype(v, ret, None if old_values is None else old)

    delta = check_positive(huber_delta, "huber_delta")
    code = VALUE_LOSS_MODES.index(mode)
    w, n = _weights(weights, v.shape, "values")  # n: sum of the weights
    d_v = np.empty(v.size, dtype=np.float64)
    total = 0.0
    for i, (v_i, old_i, r_i) in enumerate(zip(_elements(v), _elements(old), _elements(ret))):
        term, d_term = value_element(v_i, old_i, r_i, c, clip_on, code, delta)
        total += w[i] * term
        d_v[i] = (w[i] * d_term) / n
    with np.errstate(over="ignore", invalid="ignore"):
        d_v = d_v.astype(dtype)
    if not (math.isfinite(total) and np.isfinite(d_v).all()):
        raise value_overflow_error()
    return total / n, d_v.reshape(v.shape)


def entropy_loss(entropy, weights=None) -> Tuple[float, np.ndarray]:
    """Entropy bonus as a loss: ``-mean(entropy)``, and its gradient ``-1/n`` per element.

    With ``weights`` (shape of ``entropy``, >= 0, e.g. a valid mask): ``-sum(w * H) / sum(w)``
    summed in element order, gradient ``-w / sum(w)``.

    Multiply by ``ent_coef`` in the total loss (SB3 and CleanRL: ``- ent_coef * mean(H)``).

    Args:
        entropy: per-sample policy entropy in nats, float array of any shape [...].

    Returns:
        ``(loss, d_entropy)``: a Python float and an array shaped like ``entropy`` (its dtype).

    Raises:
        ValueError: ``entropy`` empty or not finite, or its mean overflows float64.
    """
    h = as_float_array(entropy, "entropy")
    _nonempty(h, "entropy")
    if weights is not None:
        w, total_w = _weights(weights, h.shape, "entropy")
        total = 0.0
        for w_i, h_i in zip(w, _elements(h)):
            total += w_i * h_i
        mean = total / total_w
        if not math.isfinite(mean):
            raise entropy_overflow_error()
        grad = np.array([-w_i / total_w for w_i in w]).reshape(h.shape)
        return -mean, grad.astype(h.dtype)
    with np.errstate(over="ignore"):
        mean = float(np.mean(h))
    if not math.isfinite(mean):
        raise entropy_overflow_error()
    return -mean, np.full(h.shape, -1.0 / h.size, dtype=h.dtype)


def approx_kl(old_log_probs, new_log_probs, estimator: str = "k3", weights=None) -> float:
    """Sample estimate of KL(pi_old || pi_new) from log-probs of actions drawn from pi_old.

    With ``r = new_log_probs - old_log_probs`` (the log of the importance ratio):

    * ``"k3"``: ``mean(exp(r) - 1 - r)`` (:func:`k3_element`): unbiased and never negative
      (each term is >= 0); SB3 and CleanRL. Computed with ``expm1`` for precision at small r.
    * ``"k1"``: ``mean(old - new) = mean(-r)``: unbiased, higher variance, can be negative;
      thrust-rl.

    Note the argument order (old first), unlike :func:`policy_loss`.

    Args:
        old_log_probs: log pi_old(a|s), float array [...] (nats).
        new_log_probs: log pi_new(a|s), same shape.
        estimator: ``"k3"`` or ``"k1"``.
        weights: None, or weights >= 0 of the input shape (a valid mask): the weighted mean
            ``sum(w * term) / sum(w)``.

    Returns:
        The estimate in nats, a finite Python float, computed in float64, summed in element
        order.

    Raises:
        ValueError: shapes differ, an input is empty or not finite, unknown ``estimator``, or
            the log-ratios are so large in magnitude that ``r``, ``exp(r)`` (k3: ``r`` above
            about 709.78) or the sum overflows float64.

    Source: J. Schulman, "Approximating KL divergence" (2020), estimators k1 and k3.
    """
    check_choice(estimator, "estimator", KL_ESTIMATORS)
    old = as_float_array(old_log_probs, "old_log_probs")
    new = as_float_array(new_log_probs, "new_log_probs")
    check_same_shape(new, "new_log_probs", old.shape, "old_log_probs")
    _nonempty(old, "old_log_probs")
    w, n = _weights(weights, old.shape, "old_log_probs")
    total = 0.0
    for w_i, old_i, new_i in zip(w, _elements(old), _elements(new)):
        log_ratio = new_i - old_i
        total += w_i * (k3_element(log_ratio) if estimator == "k3" else -log_ratio)
    if not math.isfinite(total):
        raise log_ratio_overflow_error(estimator)
    return total / n


def advantage_moments(advantages, ddof):
    """The mean and standard deviation of the entries of ``advantages``, as
    :func:`normalize_advantages` uses them::

        mean = (((A_0 + A_1) + A_2) + ... + A_{n-1}) / n
        std  = sqrt( sum_i (A_i - mean)^2 / (n - ddof) )

    every sum accumulated left to right in float64 (two passes: the mean first, then the squared
    deviations from it). Written in the subset of Python that numba compiles: the compiled
    twin :func:`ppo_ref.fast.losses.normalize_advantages` compiles this function, so both tiers
    give the same bits.

    Args:
        advantages: a sequence of n >= 2 floats (a list, or a 1-D float64 array when compiled).
        ddof: 0 or 1 (checked by the caller), ``n - ddof >= 1``.

    Returns:
        ``(mean, std)``, Python floats; ``inf`` or ``nan`` when a sum overflows (the caller
        refuses them).
    """
    n = len(advantages)
    total = 0.0
    for i in range(n):
        total += advantages[i]
    mean = total / n
    squares = 0.0
    for i in range(n):
        deviation = advantages[i] - mean
        squares += deviation * deviation
    return mean, math.sqrt(squares / (n - ddof))


def check_ddof(ddof) -> int:
    """``ddof`` as an int if it is 0 or 1 (not a bool); ``ValueError`` naming it otherwise."""
    if isinstance(ddof, (bool, np.bool_)) or ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    return int(ddof)


def advantages_overflow_error() -> ValueError:
    """The error for advantages whose mean or variance overflows float64."""
    return ValueError("advantages are too large to normalize: their variance overflows float64")


def normalize_advantages(advantages, ddof: int = 1, eps: float = 1e-8,
                         placement: str = "add") -> np.ndarray:
    """Standardize advantages: ``(A - mean(A)) / (std(A, ddof) + eps)``.

    ``placement="clamp"`` divides by ``max(std(A, ddof), eps)`` instead (torchrl
    ``_standardize``: ``std.clamp_min(1e-6)``, its masked form ddof 0 with 1e-4; Sample Factory
    ``torch.clamp_min(adv_std, 1e-7)``).

    SB3 and CleanRL normalize each minibatch with ``ddof=1`` (torch's unbiased ``std``);
    thrust-rl the whole batch with ``ddof=0``. An array of one element is returned unchanged
    (as SB3 does; its std is undefined with ddof 1), whatever ``ddof``. A constant array maps to
    (near) zeros, never NaN. The statistics are :func:`advantage_moments` (float64, summed in
    element order); the result has the input's dtype (float32 stays float32).

    Args:
        advantages: float array of any shape [...] (statistics over all elements).
        ddof: delta degrees of freedom of the standard deviation, 0 or 1.
        eps: > 0, added to the standard deviation (``placement="add"``: SB3, CleanRL,
            tianshou, skrl, PureJaxRL: 1e-8) or its lower bound (``"clamp"``).
        placement: ``"add"`` or ``"clamp"``.

    Returns:
        A new array shaped like ``advantages`` (an empty input gives an empty copy).

    Raises:
        ValueError: ``advantages`` not finite, ``ddof`` not 0 or 1, ``eps`` <= 0, an unknown
            ``placement``, or the values
            are so large (> ~1e150) that their variance overflows.
    """
    adv = as_float_array(advantages, "advantages")
    ddof = check_ddof(ddof)
    eps = check_positive(eps, "eps")
    check_choice(placement, "placement", NORM_EPS_PLACEMENTS)
    if adv.size <= 1:
        return adv.copy()
    a = adv.astype(np.float64)
    mean, std = advantage_moments(a.ravel().tolist(), ddof)
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise advantages_overflow_error()
    scale = std + eps if placement == "add" else max(std, eps)
    return ((a - mean) / scale).astype(adv.dtype)


def explained_variance(y_pred, y_true) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` with population variances (ddof 0).

    1 is a perfect prediction, 0 no better than predicting the mean, negative worse. Returns
    ``nan`` when ``Var[y_true] == 0`` (undefined), as SB3's ``explained_variance``. The trainers
    report it with ``y_pred`` = rollout values and ``y_true`` = returns.

    Args:
        y_pred: predictions, float array [...].
        y_true: targets, same shape.

    Returns:
        A Python float (computed in float64).

    Raises:
        ValueError: shapes differ, an input is empty or not finite, or a variance overflows
            float64 (values above about 1e154 in magnitude).
    """
    pred = as_float_array(y_pred, "y_pred")
    true = as_float_array(y_true, "y_true")
    check_same_shape(true, "y_true", pred.shape, "y_pred")
    _nonempty(pred, "y_pred")
    with np.errstate(over="ignore", invalid="ignore"):
        var_y = float(np.var(true.astype(np.float64)))
        var_err = float(np.var(true.astype(np.float64) - pred.astype(np.float64)))
    if not math.isfinite(var_y):
        raise ValueError("y_true is too large in magnitude: its variance overflows float64")
    if not math.isfinite(var_err):
        raise ValueError("y_true - y_pred is too large in magnitude: its variance overflows "
                         "float64")
    if var_y == 0.0:
        return float("nan")
    return 1.0 - var_err / var_y
