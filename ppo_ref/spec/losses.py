"""PPO losses, each returned with its gradient.

Every loss is a (weighted) mean over a minibatch's elements, every gradient d(loss)/d(input)
of that mean; :func:`ppo_ref.spec.update.minibatch_loss` combines them. One element's arithmetic
is written once (:func:`clipped_surrogate_element`, :func:`value_element`, :func:`k3_element`)
in the subset of Python numba compiles; :mod:`ppo_ref.fast.losses` compiles the same functions
and sums in the same element order (same bits). Computed in float64.

Kinks take torch autograd's subgradient of the usual torch formulation (SB3, CleanRL): clamp
passes the gradient at its bounds; min/max split it half/half on a tie. The clipped surrogate
decides the active term from the ratio and the bounds, not the rounded products (so a ratio an
ulp beyond a bound whose products round equal passes no gradient here; torch: half).

Sources: Schulman et al., "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), eq. (7)
and (9); value clipping from OpenAI baselines ``ppo2`` (Huang et al., "The 37 Implementation
Details of PPO", 2022, detail 9); KL estimators k1, k2 and k3 from J. Schulman, "Approximating
KL divergence" (2020).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from ppo_ref._checks import (as_float_array, check_choice, check_positive, check_same_shape,
                             check_unit_interval, result_dtype)

__all__ = [
    "policy_loss",
    "value_loss",
    "entropy_loss",
    "approx_kl",
    "normalize_advantages",
    "advantage_moments",
    "single_element_result",
    "kl_term",
    "eps_scale",
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
    "KL_K3",
    "KL_K1",
    "KL_K2",
    "EPS_ADD",
    "EPS_CLAMP",
    "EPS_SQRT",
    "CLIP_FRACTION_MODES",
    "SINGLE_ELEMENT_RESULTS",
    "VALUE_CLIP_BOUNDARY_GRADS",
    "MAX_LOG_RATIO",
]

VALUE_LOSS_MODES = ("max", "sb3", "huber")
#: The codes of :data:`VALUE_LOSS_MODES` the element functions take (its indices).
VALUE_MODE_MAX, VALUE_MODE_SB3, VALUE_MODE_HUBER = 0, 1, 2
KL_ESTIMATORS = ("k3", "k1", "k2")
#: The codes of :data:`KL_ESTIMATORS` :func:`kl_term` takes (its indices).
KL_K3, KL_K1, KL_K2 = 0, 1, 2
CLIP_INTERVALS = ("symmetric", "reciprocal")
NORM_EPS_PLACEMENTS = ("add", "clamp", "sqrt")
#: The codes of :data:`NORM_EPS_PLACEMENTS` :func:`eps_scale` takes (its indices).
EPS_ADD, EPS_CLAMP, EPS_SQRT = 0, 1, 2
CLIP_FRACTION_MODES = ("outside", "active")
#: What :func:`normalize_advantages` returns for one element (the reference first).
SINGLE_ELEMENT_RESULTS = ("unchanged", "zero", "NaN")
#: The fractions of the unclipped gradient at the exact value-clip bound that autodiff of the
#: usual formulations gives (:func:`value_element`; the reference first).
VALUE_CLIP_BOUNDARY_GRADS = (1.0, 0.75, 0.5, 0.0)

#: ``exp(r)`` is finite for ``r <= 709.78``; past this bound a ratio counts as overflowing.
MAX_LOG_RATIO = 709.0


def k3_element(log_ratio):
    """The k3 term ``exp(r) - 1 - r`` of the log-ratio ``r = log pi_new - log pi_old``, with
    ``expm1`` for precision at small ``r``; >= 0 (the ``max`` guards the last ulp); ``inf``
    when ``exp(r)`` overflows."""
    if log_ratio > MAX_LOG_RATIO:
        return math.inf
    return max(math.expm1(log_ratio) - log_ratio, 0.0)


def clipped_surrogate_element(log_ratio, advantage, low, high, clip_range, symmetric,
                              dual_clip, count_active=False):
    """One term of the clipped surrogate (PPO eq. 7) and its derivative in ``log_ratio``.

    With ``ratio = exp(log_ratio)`` (``log_ratio <= MAX_LOG_RATIO``) and the interval
    ``[low, high]`` of :func:`clip_bounds` (the paper: ``[1 - eps, 1 + eps]``)::

        surrogate = min(ratio * A, clip(ratio, low, high) * A)
        d surrogate / d log_ratio = 0           if A > 0 and ratio > high, or A < 0 and ratio < low
                                  = A * ratio   otherwise (the bounds included)

    Dual clip (``dual_clip`` = c > 1, 0 is off; Ye et al. 2020, arXiv:1912.09729, eq. 5;
    tianshou): for ``A < 0`` the term is ``max(surrogate, c * A)``, derivative 0 where ``c * A``
    is larger, halved on a tie. Returns ``(surrogate, d_surrogate, counted)``; ``counted`` (the
    clip fraction's count) is ``|ratio - 1| > clip_range`` when ``symmetric`` (SB3, CleanRL),
    else ``ratio < low or ratio > high``; with ``count_active`` it is whether the clip changes
    the term instead, the zero-derivative case above (verl's ``pg_clipfrac``, the first clip
    only; verl compares the rounded products, which can differ at a ratio an ulp from a bound:
    module docstring).
    """
    ratio = math.exp(log_ratio)
    clipped_ratio = min(max(ratio, low), high)
    surrogate = min(ratio * advantage, clipped_ratio * advantage)
    clip_active = (advantage > 0.0 and ratio > high) or (advantage < 0.0 and ratio < low)
    d_surrogate = 0.0 if clip_active else advantage * ratio
    if dual_clip > 0.0 and advantage < 0.0:
        floor = dual_clip * advantage
        if floor > surrogate:
            surrogate = floor
            d_surrogate = 0.0
        elif floor == surrogate:
            d_surrogate = 0.5 * d_surrogate
    if count_active:
        counted = clip_active
    elif symmetric:
        counted = abs(ratio - 1.0) > clip_range
    else:
        counted = ratio < low or ratio > high
    return surrogate, d_surrogate, counted


def value_distance(err, mode, huber_delta):
    """The distance of one value error ``e = V - R`` and its derivative: ``(e^2, 2 e)``, or for
    ``VALUE_MODE_HUBER`` with ``delta = huber_delta``: ``(0.5 e^2, e)`` where ``|e| < delta``,
    else ``(delta (|e| - delta / 2), delta sign(e))`` (torch ``huber_loss``; torchrl's
    ``smooth_l1`` is delta 1)."""
    if mode == VALUE_MODE_HUBER:
        z = abs(err)
        if z < huber_delta:
            return 0.5 * err * err, err
        return huber_delta * (z - 0.5 * huber_delta), (huber_delta if err > 0.0 else -huber_delta)
    return err * err, 2.0 * err


def value_element(value, old_value, target, clip_range_vf, clip_on, mode, huber_delta,
                  boundary_grad=1.0):
    """One term of the value loss (no 0.5 factor) and its derivative in ``value``.

    With ``d`` = :func:`value_distance`, unclipped: ``d(V - R)``. Clipped, with c =
    ``clip_range_vf`` and ``V_clip = V_old + clip(V - V_old, -c, c)``:

    * ``VALUE_MODE_MAX``, ``VALUE_MODE_HUBER`` (baselines ppo2, CleanRL; torchrl
      ``clip_value``): ``max(d(V - R), d(V_clip - R))``; derivative::

          d'(V - R) * 1              where |V - V_old| < c, or the unclipped term is larger
                    * boundary_grad  where |V - V_old| == c exactly (V_clip = V: a tie)
                    * 0.5            on a tie while clipping is active (the max splits it)
                    * 0              where the clipped term is larger

      ``boundary_grad`` is what autodiff of the formulation gives at the bound: 1 for torch
      (``torch.max`` gives half to each tied term, ``torch.clamp`` passes the gradient at its
      bounds: 0.5 + 0.5) and TensorFlow (``tf.maximum`` gives a tie to its first argument, the
      unclipped term, and ``tf.clip_by_value`` passes at its bounds: baselines ppo2); 0.75 for
      JAX (``jnp.maximum`` splits the tie, ``jnp.clip`` = ``minimum(maximum(x, lo), hi)``
      passes half at a bound: 0.5 + 0.25; PureJaxRL); 0.5 where the clipped branch passes
      nothing at the bound (a clip written with a strict ``where``, or detached); 0 where the
      tie goes to a clipped branch that passes nothing (a hand-derived gradient with a strict
      ``|V - V_old| < c``). The spec's tie is the computed ``|V - V_old| == c``.
    * ``VALUE_MODE_SB3``: ``d(V_clip - R)``; derivative ``d'(V_clip - R)`` where
      ``|V - V_old| <= c``, else 0 (``boundary_grad`` is not read).

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
    if abs(delta) == clip_range_vf:
        weight = boundary_grad
    elif inside or sq > sq_clip:
        weight = 1.0
    elif sq == sq_clip:
        weight = 0.5
    else:
        weight = 0.0
    return max(sq, sq_clip), weight * d_sq


def clip_bounds(clip_range, clip_range_low=None, clip_range_high=None,
                clip_interval="symmetric"):
    """The ratio interval ``(low, high, symmetric)`` of the clipped surrogate.

    ``"symmetric"`` (the paper, SB3, CleanRL; torchrl's ``clip_epsilon=(low, high)``):
    ``[1 - eps_low, 1 + eps_high]``, each eps ``clip_range`` unless overridden.
    ``"reciprocal"`` (Sample Factory): ``[1 / (1 + eps_high), 1 + eps_high]``, with
    ``clip_range_low`` None. ``symmetric`` is True for ``[1 - clip_range, 1 + clip_range]``
    (no override). Raises ``ValueError`` for an unknown interval, an eps not > 0, or a lower
    eps >= 1.
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
    """``dual_clip`` for the element function: 0.0 for None (off), else c > 1 (tianshou's
    condition; ``ValueError`` otherwise)."""
    if dual_clip is None:
        return 0.0
    c = check_positive(dual_clip, "dual_clip")
    if not c > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {c}")
    return c


def _elements(arr: np.ndarray) -> list:
    """The entries of ``arr`` in C order as Python floats (float64)."""
    return np.asarray(arr, dtype=np.float64).ravel().tolist()


def _nonempty(arr: np.ndarray, name: str) -> None:
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty (a mean over zero elements is undefined)")


def _same_shape_inputs(**named) -> list:
    """The named arguments as finite float arrays of the first one's shape, which must not be
    empty (``ValueError`` naming the argument)."""
    arrays = [as_float_array(x, name) for name, x in named.items()]
    first = next(iter(named))
    for name, arr in zip(list(named)[1:], arrays[1:]):
        check_same_shape(arr, name, arrays[0].shape, first)
    _nonempty(arrays[0], first)
    return arrays


def _weights(weights, shape, name_of_shape: str):
    """The per-element weights as a float64 list (all 1.0 for None) and their sum in element
    order. Raises ``ValueError`` for another shape, a negative or non-finite weight, or a sum
    that is not positive and finite."""
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


def ratio_overflow_error(new_log_probs, old_log_probs, flat_index: int, dtype) -> ValueError:
    """The error for a ratio (or an active gradient ``-A * ratio / n``) that overflows
    ``dtype`` at ``flat_index``."""
    new = np.asarray(new_log_probs)
    i = tuple(int(j) for j in np.unravel_index(flat_index, new.shape))
    diff = float(new[i]) - float(np.asarray(old_log_probs)[i])
    return ValueError(f"new_log_probs - old_log_probs = {diff} at index {i}: the ratio "
                      f"exp(new - old) (times the advantage) overflows {np.dtype(dtype)}; the "
                      "policy moved too far from the one that collected the data")


def log_ratio_overflow_error(estimator: str) -> ValueError:
    """The error for log-ratios ``r`` whose ``estimator`` (k3, k1, k2) sum overflows float64."""
    what = {"k3": "exp(r) - 1 - r", "k1": "-r", "k2": "r^2 / 2"}[estimator]
    return ValueError(f"new_log_probs - old_log_probs is too large in magnitude: r or the sum "
                      f"of the {estimator} terms {what} overflows float64; the policy moved too "
                      "far from the one that collected the data")


def policy_loss(new_log_probs, old_log_probs, advantages, clip_range: float, *,
                clip_range_low: Optional[float] = None, clip_range_high: Optional[float] = None,
                clip_interval: str = "symmetric", dual_clip: Optional[float] = None,
                weights=None, clip_fraction_mode: str = "outside"
                ) -> Tuple[float, np.ndarray, Dict[str, float]]:
    """PPO clipped surrogate loss and its gradient with respect to ``new_log_probs``::

        loss = -sum_i w_i surrogate_i / sum_i w_i,    d loss / d new_log_probs[i]
             = -w_i d_surrogate_i / sum_i w_i

    with :func:`clipped_surrogate_element` of ``new_log_probs[i] - old_log_probs[i]`` and
    ``advantages[i]`` (float arrays of one shape, nats). ``clip_range``: eps > 0 (0.2 in the
    paper, SB3, CleanRL); ``clip_range_low``, ``clip_range_high``, ``clip_interval``: the ratio
    interval (:func:`clip_bounds`); ``dual_clip``: None or c > 1 (tianshou); ``weights``: None
    (all 1, the same bits as the plain mean) or weights >= 0 of the input shape (a 0/1 valid
    mask: torchrl, Sample Factory), which also weight both ``info`` means;
    ``clip_fraction_mode``: a key of :data:`CLIP_FRACTION_MODES`, what ``clip_fraction`` counts
    (the ratio outside the interval, or where the clip changes the term: the ``counted`` of
    :func:`clipped_surrogate_element`).

    Returns ``(loss, d_new_log_probs, info)``: a Python float; an array of the input shape,
    float32 if every input is float32, else float64; ``info`` with ``clip_fraction`` (the mean
    of ``counted``) and ``approx_kl`` (k3, :func:`approx_kl`). Raises ``ValueError``: shapes
    differ, an input is empty or not finite, a bad ``clip_range``, ``clip_range_low``,
    ``clip_range_high``, ``clip_interval``, ``dual_clip``, ``weights`` or
    ``clip_fraction_mode``; a log-ratio so large
    that ``exp`` or an active gradient overflows the result dtype (float32: above about 88),
    or so negative that it or the k3 sum overflows float64; a surrogate sum that overflows.
    """
    new, old, adv = _same_shape_inputs(new_log_probs=new_log_probs, old_log_probs=old_log_probs,
                                       advantages=advantages)
    eps = check_positive(clip_range, "clip_range")
    low, high, symmetric = clip_bounds(eps, clip_range_low, clip_range_high, clip_interval)
    dual = check_dual_clip(dual_clip)
    check_choice(clip_fraction_mode, "clip_fraction_mode", CLIP_FRACTION_MODES)
    active = clip_fraction_mode == "active"
    dtype = result_dtype(new, old, adv)
    w, n = _weights(weights, new.shape, "new_log_probs")  # n: sum of the weights

    d_new = np.empty(new.size, dtype=np.float64)
    surrogate_sum = 0.0
    n_counted = 0.0
    k3_sum = 0.0
    for i, (new_i, old_i, a) in enumerate(zip(_elements(new), _elements(old), _elements(adv))):
        log_ratio = new_i - old_i
        if log_ratio > MAX_LOG_RATIO:
            raise ratio_overflow_error(new, old, i, dtype)
        surrogate, d_surrogate, counted = clipped_surrogate_element(log_ratio, a, low, high, eps,
                                                                    symmetric, dual, active)
        surrogate_sum += w[i] * surrogate
        d_new[i] = -(w[i] * d_surrogate) / n
        n_counted += w[i] * counted
        k3_sum += w[i] * k3_element(log_ratio)
    with np.errstate(over="ignore"):
        d_new = d_new.astype(dtype)
    if not np.isfinite(d_new).all():
        raise ratio_overflow_error(new, old, int(np.argmin(np.isfinite(d_new))), dtype)
    if not math.isfinite(k3_sum):  # a log-ratio below about -1e308, or their sum
        raise log_ratio_overflow_error("k3")
    if not math.isfinite(surrogate_sum):
        raise ValueError("advantages are too large: the sum of the surrogate terms "
                         "ratio * advantages overflows float64")
    info = {"clip_fraction": n_counted / n, "approx_kl": k3_sum / n}
    return -surrogate_sum / n, d_new.reshape(new.shape), info


def value_loss(values, old_values, returns, clip_range_vf: Optional[float] = None,
               mode: str = "max", *, huber_delta: float = 1.0, weights=None,
               boundary_grad: float = 1.0) -> Tuple[float, np.ndarray]:
    """Value-function loss (no 0.5 factor) and its gradient with respect to ``values``::

        loss = sum_i w_i term_i / sum_i w_i,    d loss / d values[i] = w_i d_term_i / sum_i w_i

    with :func:`value_element` of ``values`` (V_theta(s)), ``old_values`` (recorded at
    collection; may be None without clipping) and ``returns`` (the targets), float arrays of
    one shape. ``clip_range_vf``: c > 0 (value units) or None; ``mode``: a key of
    :data:`VALUE_LOSS_MODES`, checked even without clipping: ``"max"`` (baselines ppo2,
    CleanRL, thrust-rl), ``"sb3"``, ``"huber"`` (torchrl ``smooth_l1``; note its 0.5);
    ``huber_delta`` > 0; ``weights`` as :func:`policy_loss`; ``boundary_grad`` in [0, 1]: the
    fraction of the unclipped gradient where ``|V - V_old| == clip_range_vf`` exactly in the
    max forms (:func:`value_element`; :data:`VALUE_CLIP_BOUNDARY_GRADS` lists those autodiff
    gives). The caller scales by ``vf_coef``.

    Returns ``(loss, d_values)``: a Python float and an array shaped like ``values``, float32
    if every input is float32, else float64. Raises ``ValueError``: shapes differ, an input is
    empty or not finite, ``clip_range_vf`` <= 0, ``old_values`` None while clipping, an unknown
    ``mode``, bad ``weights``, ``boundary_grad`` outside [0, 1], or the loss or its gradient
    overflows (``|values - returns|`` above about 1.3e154).
    """
    check_choice(mode, "mode", VALUE_LOSS_MODES)
    v, ret = _same_shape_inputs(values=values, returns=returns)
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
    boundary = check_unit_interval(boundary_grad, "boundary_grad")
    code = VALUE_LOSS_MODES.index(mode)
    w, n = _weights(weights, v.shape, "values")  # n: sum of the weights
    d_v = np.empty(v.size, dtype=np.float64)
    total = 0.0
    for i, (v_i, old_i, r_i) in enumerate(zip(_elements(v), _elements(old), _elements(ret))):
        term, d_term = value_element(v_i, old_i, r_i, c, clip_on, code, delta, boundary)
        total += w[i] * term
        d_v[i] = (w[i] * d_term) / n
    with np.errstate(over="ignore", invalid="ignore"):
        d_v = d_v.astype(dtype)
    if not (math.isfinite(total) and np.isfinite(d_v).all()):
        raise ValueError("values are too far from returns (or old_values): the squared error "
                         "(values - returns)^2, its mean or its gradient overflows float64")
    return total / n, d_v.reshape(v.shape)


def entropy_loss(entropy, weights=None) -> Tuple[float, np.ndarray]:
    """Entropy bonus as a loss and its gradient, for ``entropy`` (nats, any shape)::

        loss = -sum_i w_i H_i / sum_i w_i,    d loss / d H[i] = -w_i / sum_i w_i

    (``w_i = 1`` without ``weights``). The caller multiplies by ``ent_coef``. Returns ``(loss,
    d_entropy)``, a Python float and an array of ``entropy``'s shape and dtype. Raises
    ``ValueError`` for ``entropy`` empty or not finite, bad ``weights``, or an overflowing mean.
    """
    h = as_float_array(entropy, "entropy")
    _nonempty(h, "entropy")
    if weights is not None:
        w, total_w = _weights(weights, h.shape, "entropy")
        total = 0.0
        for w_i, h_i in zip(w, _elements(h)):
            total += w_i * h_i
        mean = total / total_w
        grad = np.array([-w_i / total_w for w_i in w]).reshape(h.shape).astype(h.dtype)
    else:
        with np.errstate(over="ignore"):
            mean = float(np.mean(h))
        grad = np.full(h.shape, -1.0 / h.size, dtype=h.dtype)
    if not math.isfinite(mean):
        raise ValueError("entropy is too large in magnitude: its mean overflows float64")
    return -mean, grad


def approx_kl(old_log_probs, new_log_probs, estimator: str = "k3", weights=None) -> float:
    """Sample estimate of KL(pi_old || pi_new) from log-probs (nats, one shape) of actions drawn
    from pi_old; note the order (old first), unlike :func:`policy_loss`.

    With ``r = new_log_probs - old_log_probs``: ``"k3"`` (SB3, CleanRL) ``mean(exp(r) - 1 -
    r)`` (:func:`k3_element`; unbiased, never negative); ``"k1"`` (thrust-rl) ``mean(-r)``
    (unbiased, can be negative); ``"k2"`` ``mean(r^2 / 2)`` (biased, never negative, low
    variance; OpenRLHF ``kl_estimator="k2"``, verl ``kl_penalty="mse"``); with ``weights``
    the weighted mean. Returns a finite Python
    float (float64, summed in element order). Raises ``ValueError``: shapes differ, an input is
    empty or not finite, an unknown ``estimator``, bad ``weights``, or ``r``, ``exp(r)`` (``r``
    above about 709.78) or the sum overflows.
    """
    check_choice(estimator, "estimator", KL_ESTIMATORS)
    old, new = _same_shape_inputs(old_log_probs=old_log_probs, new_log_probs=new_log_probs)
    w, n = _weights(weights, old.shape, "old_log_probs")
    total = 0.0
    for w_i, old_i, new_i in zip(w, _elements(old), _elements(new)):
        log_ratio = new_i - old_i
        total += w_i * kl_term(log_ratio, KL_ESTIMATORS.index(estimator))
    if not math.isfinite(total):
        raise log_ratio_overflow_error(estimator)
    return total / n


def kl_term(log_ratio, code):
    """One term of :func:`approx_kl` for the log-ratio ``r``: :func:`k3_element` (``code``
    ``KL_K3``), ``-r`` (``KL_K1``) or ``r * r / 2`` (``KL_K2``)."""
    if code == KL_K3:
        return k3_element(log_ratio)
    if code == KL_K1:
        return -log_ratio
    return 0.5 * (log_ratio * log_ratio)


def eps_scale(std, eps, code):
    """The divisor of :func:`normalize_advantages`: ``std + eps`` (``code`` ``EPS_ADD``),
    ``max(std, eps)`` (``EPS_CLAMP``) or ``sqrt(std * std + eps)`` (``EPS_SQRT``)."""
    if code == EPS_ADD:
        return std + eps
    if code == EPS_CLAMP:
        return max(std, eps)
    return math.sqrt(std * std + eps)


def advantage_moments(advantages, ddof):
    """The mean and standard deviation of :func:`normalize_advantages`::

        mean = (((A_0 + A_1) + A_2) + ... + A_{n-1}) / n
        std  = sqrt( sum_i (A_i - mean)^2 / (n - ddof) )

    each sum left to right in float64 (the mean first, then the squared deviations).
    ``advantages``: n >= 2 floats (a list, or a 1-D float64 array when compiled); ``ddof`` 0 or
    1. Returns Python floats, ``inf`` or ``nan`` when a sum overflows (the caller refuses them).
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


def normalize_advantages(advantages, ddof: int = 1, eps: float = 1e-8,
                         placement: str = "add", single_element: str = "unchanged"
                         ) -> np.ndarray:
    """Standardize advantages: ``(A - mean) / (std + eps)`` (``placement="add"``: SB3, CleanRL,
    tianshou, skrl, PureJaxRL), ``(A - mean) / max(std, eps)`` (``"clamp"``: torchrl,
    Sample Factory) or ``(A - mean) / sqrt(var + eps)`` (``"sqrt"``, ``var = std^2``: TRL's
    and verl's ``masked_whiten``), with :func:`advantage_moments` over all elements.

    ``ddof``: 0 or 1 (SB3 and CleanRL: 1 per minibatch; thrust-rl: 0 per batch); ``eps`` > 0.
    ``single_element`` (a key of :data:`SINGLE_ELEMENT_RESULTS`): what one element becomes:
    ``"unchanged"`` (SB3 normalizes only when ``len > 1``), ``"zero"`` (``ddof=0``: ``(A -
    A) / (0 + eps)``, NumPy/JAX std) or ``"NaN"`` (``ddof=1``: torch's ``std`` of one element
    is NaN, unguarded); an empty array is returned as it is. A constant array ``c`` maps to
    ``(c - mean) / scale``: 0 where the rounded mean equals ``c``, else the rounding of the
    mean over the eps (``[0.1, 0.1, 0.1]`` gives ``-1.39e-09`` each with eps 1e-8, ``add``).
    Returns a new array of the input's shape and dtype. Raises ``ValueError`` for non-finite
    ``advantages``, ``ddof`` not 0 or 1, ``eps`` <= 0, an unknown ``placement`` or
    ``single_element``, or values so large (> ~1e150) that the variance overflows.
    """
    adv = as_float_array(advantages, "advantages")
    if isinstance(ddof, (bool, np.bool_)) or ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    eps = check_positive(eps, "eps")
    check_choice(placement, "placement", NORM_EPS_PLACEMENTS)
    check_choice(single_element, "single_element", SINGLE_ELEMENT_RESULTS)
    if adv.size <= 1:
        return single_element_result(adv, single_element)
    a = adv.astype(np.float64)
    mean, std = advantage_moments(a.ravel().tolist(), int(ddof))
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise ValueError("advantages are too large to normalize: their variance overflows "
                         "float64")
    scale = eps_scale(std, eps, NORM_EPS_PLACEMENTS.index(placement))
    return ((a - mean) / scale).astype(adv.dtype)


def single_element_result(advantages: np.ndarray, single_element: str) -> np.ndarray:
    """:func:`normalize_advantages` of an array of at most one element: a copy, zeros or NaN
    (``single_element``), in its shape and dtype."""
    if single_element == "zero":
        return np.zeros_like(advantages)
    if single_element == "NaN":
        return np.full_like(advantages, np.nan)
    return advantages.copy()


def explained_variance(y_pred, y_true) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` with population variances, in float64.

    1 is a perfect prediction, 0 no better than the mean, negative worse; ``nan`` when
    ``Var[y_true] == 0`` (as SB3). ``y_pred``, ``y_true``: float arrays of one shape. Raises
    ``ValueError`` when shapes differ, an input is empty or not finite, or a variance
    overflows float64.
    """
    pred, true = _same_shape_inputs(y_pred=y_pred, y_true=y_true)
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
