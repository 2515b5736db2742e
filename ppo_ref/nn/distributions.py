"""Action distributions of the PPO policy head, with the backward pass of log-prob and entropy.

Categorical over ``A`` actions, parameterised by unnormalised ``logits [..., A]``:

    log pi(a) = z_a - logsumexp(z)                      (computed as log_softmax, below)
    H         = -sum_a pi(a) log pi(a)
    d log pi(a) / d z_k = [k = a] - pi(k)
    d H / d z_k         = -pi(k) (log pi(k) + H)

Action masking: a logit of ``-inf`` marks an invalid action. Its probability is exactly 0, its
log-probability ``-inf``, it contributes 0 to the entropy and gets gradient 0, and it is never
sampled or chosen as the mode (the convention of MaskablePPO in sb3-contrib, which sets masked
logits to a huge negative number; ``-inf`` is the exact version). A row whose actions are all
masked has no distribution and raises ``ValueError``, as do NaN and ``+inf`` logits.

Diagonal Gaussian over ``A`` action dimensions, with a state-independent ``log_std [A]``
(SB3 ``DiagGaussianDistribution``, CleanRL ``ppo_continuous_action.py``), ``sigma = exp(log_std)``
and ``u = (a - mean) / sigma``:

    log pi(a) = sum_j [ -u_j^2 / 2 - log_std_j - log(2 pi) / 2 ]
    H         = sum_j [ log_std_j + (1 + log(2 pi)) / 2 ]            (independent of the state)
    d log pi / d mean_j    = u_j / sigma_j
    d log pi / d log_std_j = u_j^2 - 1
    d H / d log_std_j      = 1

Log-probs and entropies are summed over action dimensions. The policy samples the raw action
(stored in the buffer, used for log-probs); clipping to the action space happens only on the
way to the env (SPEC §3), outside this module.

MultiDiscrete (``multi_categorical_*``): ``K`` independent categoricals over consecutive slices
of the logits, ``nvec[k]`` logits for component ``k``; log-prob and entropy are the sums of the
components' (the distribution is their product), and each component's slice gets its own
categorical gradient. These always compute and return float64.

dtype: results are float32 when every float array given is float32, float64 otherwise
(:func:`ppo_ref._checks.result_dtype`); integer inputs count as float64.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import numpy as np

from ppo_ref._checks import as_float_array as _as_float_array_checked
from ppo_ref._checks import check_same_shape
from ppo_ref._checks import result_dtype as _result_dtype_checked
from ppo_ref._numba import njit

__all__ = [
    "log_softmax", "categorical_entropy", "categorical_log_prob", "categorical_log_prob_backward",
    "categorical_entropy_backward", "categorical_sample", "categorical_mode",
    "gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
    "gaussian_entropy_backward", "gaussian_sample",
    "multi_categorical_log_prob", "multi_categorical_entropy",
    "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
    "multi_categorical_sample", "multi_categorical_mode",
]

_LOG_2PI = math.log(2.0 * math.pi)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


# These functions run several times per PPO minibatch on small arrays, where Python-level
# argument checks cost as much as the arithmetic. The two helpers below take a fast path for
# the common case (a float32/float64 ndarray) and defer to ppo_ref._checks otherwise, with
# the same results and the same errors.

def as_float_array(x, name, *, ndim=None, allow_nonfinite=False):
    """:func:`ppo_ref._checks.as_float_array`, fast for float32/float64 ndarrays."""
    if type(x) is np.ndarray and (x.dtype == _F64 or x.dtype == _F32) and (
            ndim is None or x.ndim in ndim) and (allow_nonfinite or np.isfinite(x).all()):
        return x
    return _as_float_array_checked(x, name, ndim=ndim, allow_nonfinite=allow_nonfinite)


def result_dtype(*arrays):
    """:func:`ppo_ref._checks.result_dtype`, fast when every array is float64."""
    if all(a.dtype == _F64 for a in arrays):
        return _F64
    return _result_dtype_checked(*arrays)


# --------------------------------------------------------------------------------------------
# categorical

def _as_logits(logits, dtype=None) -> np.ndarray:
    z = as_float_array(logits, "logits", allow_nonfinite=True)
    if z.ndim == 0:
        raise ValueError("logits must have at least 1 dimension [..., n_actions], got a scalar")
    if z.shape[-1] == 0:
        raise ValueError(f"logits must have at least one action (last dimension), got shape {z.shape}")
    if dtype is not None and z.dtype != dtype:
        z = z.astype(dtype)
    return z


# NumPy reductions over a short contiguous last axis (2-6 actions) cost tens of microseconds
# for a [256, A] batch (the reduction machinery runs once per row); A - 1 elementwise
# operations on column views cost about one. The max is order-independent; the column sum
# adds left to right, which for fewer than 8 terms is also the order of NumPy's own sum.
_SHORT_AXIS = 7


def _last_axis_max(a: np.ndarray) -> np.ndarray:
    """``a.max(axis=-1, keepdims=True)`` (NaN-propagating), fast for short last axes."""
    n = a.shape[-1]
    if n > _SHORT_AXIS:
        return a.max(axis=-1, keepdims=True)
    m = a[..., 0:1].copy()
    for j in range(1, n):
        np.maximum(m, a[..., j:j + 1], out=m)
    return m


def _last_axis_sum(a: np.ndarray, keepdims: bool = False) -> np.ndarray:
    """``a.sum(axis=-1)``, fast for short last axes."""
    n = a.shape[-1]
    if n > _SHORT_AXIS:
        return a.sum(axis=-1, keepdims=keepdims)
    s = a[..., 0:1].copy()
    for j in range(1, n):
        s += a[..., j:j + 1]
    return s if keepdims else s[..., 0]


def _row_max(z: np.ndarray) -> np.ndarray:
    """Row maxima ``[..., 1]``; ``ValueError`` for a NaN, a ``+inf`` or an all-masked row.

    ``max`` propagates NaN, is ``+inf`` iff the row holds ``+inf`` and is ``-inf`` iff every
    entry is ``-inf``, so one check on the maxima covers all three cases.
    """
    m = _last_axis_max(z)
    if not np.isfinite(m).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(m[..., 0]))[0]) if z.ndim > 1 else ()
        row = z[bad]
        if np.isnan(row).any():
            raise ValueError(f"logits must not contain NaN: found in row {bad}")
        if (row == np.inf).any():
            raise ValueError(f"logits must not contain +inf: found in row {bad}")
        raise ValueError(f"logits row {bad} has every action masked (-inf): no valid action")
    return m


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """log_softmax of validated logits, in ``z``'s dtype (a fresh array)."""
    out = z - _row_max(z)  # max entry 0, masked entries -inf
    lse = np.log(_last_axis_sum(np.exp(out), keepdims=True))  # in [0, log A]
    out -= lse
    return out


def _finite_log_probs(logp: np.ndarray) -> np.ndarray:
    """``logp`` with ``-inf`` (masked) entries replaced by 0, so ``p * logp`` is 0 there, not NaN."""
    masked = logp == -np.inf
    if masked.any():
        return np.where(masked, 0.0, logp).astype(logp.dtype, copy=False)
    return logp


def log_softmax(logits) -> np.ndarray:
    """Numerically stable ``log softmax`` over the last axis.

    ``m = max_a z_a``; ``s = z - m``; ``log pi = s - log(sum_a exp(s_a))``, computed in the input
    dtype. The shift makes the largest ``exp`` exactly 1 and the sum lie in ``[1, A]``, so there is
    no overflow and no underflow to ``log 0`` (e.g. ``[1000, 1001, 1002]`` gives the same as
    ``[0, 1, 2]`` exactly, and float32 rows holding ``-1e10`` stay finite). ``-inf`` logits
    (masked actions) give ``-inf``.

    Args:
        logits: ``[..., A]`` real array (float32 kept, float64, ints cast to float64); ``-inf``
            allowed, NaN and ``+inf`` not.

    Returns:
        log-probabilities, same shape and dtype as ``logits`` (after the int cast).

    Raises:
        ValueError: NaN or ``+inf`` logits, a row with every action ``-inf``, a scalar or an
            empty last axis.
    """
    return _log_softmax(_as_logits(logits))


def categorical_entropy(logits) -> np.ndarray:
    """Entropy ``H = -sum_a pi(a) log pi(a)`` of each row; masked actions contribute 0.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.

    Returns:
        ``[...]`` entropies in nats, in ``[0, log(#unmasked)]``, dtype of ``logits``.

    Raises:
        ValueError: as :func:`log_softmax`.
    """
    logp = log_softmax(logits)
    p = np.exp(logp)  # exactly 0 where masked
    p *= _finite_log_probs(logp)
    return -_last_axis_sum(p)


def _as_actions(actions, batch_shape: Tuple[int, ...], n_actions: int) -> np.ndarray:
    """Integer actions ``[...]`` in ``[0, n_actions)`` (integral floats accepted) as intp."""
    a = np.asarray(actions)
    kind = a.dtype.kind  # "i"/"u" integers, "f" floats, "b" bool, ...
    if kind not in "iuf":
        raise ValueError(f"actions must be integers, got dtype {a.dtype}")
    if kind == "f":
        if a.size and not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise ValueError("actions must hold integer values; got non-integral floats")
    check_same_shape(a, "actions", batch_shape, "logits[..., 0]")
    if a.size and (a.min() < 0 or a.max() >= n_actions):
        bad = a[(a < 0) | (a >= n_actions)].flat[0]
        raise ValueError(f"actions must be in [0, {n_actions}), got {bad}")
    return a.astype(np.intp, copy=False)


def categorical_log_prob(logits, actions) -> np.ndarray:
    """``log pi(actions)``: the entry of :func:`log_softmax` at each row's action.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.
        actions: integer array ``[...]`` with values in ``[0, A)`` (integral floats accepted).

    Returns:
        ``[...]`` log-probabilities (``-inf`` for a masked action), dtype of ``logits``.

    Raises:
        ValueError: as :func:`log_softmax`; ``actions`` of the wrong shape, non-integral or out
            of range.
    """
    z = _as_logits(logits)
    a = _as_actions(actions, z.shape[:-1], z.shape[-1])
    logp = _log_softmax(z).reshape(-1, z.shape[-1])
    return logp[np.arange(logp.shape[0]), a.reshape(-1)].reshape(a.shape)


def categorical_log_prob_backward(logits, actions, d_log_probs) -> np.ndarray:
    """Gradient w.r.t. the logits: ``d_logits[..., k] = d_log_probs * ([k = a] - pi(k))``.

    Masked actions get exactly 0 (``pi(k) = 0``) unless they are the action taken.

    Args:
        logits: ``[..., A]``; actions: ``[...]`` as :func:`categorical_log_prob`.
        d_log_probs: ``[...]`` upstream gradient ``dL/dlog_prob``, finite.

    Returns:
        ``d_logits [..., A]``, dtype per the module rule.

    Raises:
        ValueError: as :func:`categorical_log_prob`; ``d_log_probs`` of the wrong shape or
            non-finite.
    """
    z = _as_logits(logits)
    d = as_float_array(d_log_probs, "d_log_probs")
    check_same_shape(d, "d_log_probs", z.shape[:-1], "logits[..., 0]")
    a = _as_actions(actions, z.shape[:-1], z.shape[-1])
    dt = result_dtype(z, d)
    z = z.astype(dt, copy=False)
    d = d.astype(dt, copy=False)
    g = np.exp(_log_softmax(z))  # pi
    g *= -d[..., None]
    flat = g.reshape(-1, z.shape[-1])  # a view of the fresh array g
    flat[np.arange(flat.shape[0]), a.reshape(-1)] += d.reshape(-1)
    return g


def categorical_entropy_backward(logits, d_entropy) -> np.ndarray:
    """Gradient of the entropy w.r.t. the logits: ``d_logits = -d_entropy * pi * (log pi + H)``.

    Masked actions get exactly 0.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.
        d_entropy: ``[...]`` upstream gradient ``dL/dH``, finite.

    Returns:
        ``d_logits [..., A]``, dtype per the module rule.

    Raises:
        ValueError: as :func:`log_softmax`; ``d_entropy`` of the wrong shape or non-finite.
    """
    z = _as_logits(logits)
    d = as_float_array(d_entropy, "d_entropy")
    check_same_shape(d, "d_entropy", z.shape[:-1], "logits[..., 0]")
    dt = result_dtype(z, d)
    logp = _log_softmax(z.astype(dt, copy=False))
    p = np.exp(logp)  # exactly 0 where masked
    logp = _finite_log_probs(logp)
    d = d.astype(dt, copy=False)
    h = _last_axis_sum(p * logp, keepdims=True)
    np.negative(h, out=h)
    g = logp + h
    g *= p
    g *= -d[..., None]
    return g


def categorical_sample(rng: np.random.Generator, logits) -> np.ndarray:
    """Draw one action per row by inverse-CDF sampling.

    With ``pi = softmax(logits)`` (float64), ``C_k = sum_{j<=k} pi_j`` and one uniform draw
    ``u ~ U[0, 1)`` per row (``rng.random``, C order over rows), the action is the first ``k``
    with ``C_k > u * C_{A-1}``. A masked action (``pi_k = 0``) has ``C_k = C_{k-1}`` and can
    never be that first index, so it is never drawn. (If rounding ever makes ``u * C_{A-1}``
    reach the total, the last unmasked action is returned.) The same generator state gives
    the same actions.

    Args:
        rng: ``np.random.Generator`` (the only source of randomness).
        logits: ``[..., A]``, as :func:`log_softmax`.

    Returns:
        int64 ndarray ``[...]`` of actions in ``[0, A)`` (0-d for a single ``[A]`` row).

    Raises:
        ValueError: as :func:`log_softmax`, or ``rng`` not a Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if (type(logits) is np.ndarray and logits.ndim == 2 and logits.shape[1] > 0
            and logits.dtype in (np.float64, np.float32) and logits.flags.c_contiguous):
        # the common case: the kernel validates each row (as _row_max) before drawing from it
        u = rng.random(logits.shape[0])
        actions = np.empty(logits.shape[0], dtype=np.int64)
        if _categorical_sample_kernel(logits, u, actions):
            return actions
        # a NaN, +inf or all-masked row: the checked path below raises, naming it
    z = _as_logits(logits, np.float64)
    _row_max(z)  # NaN, +inf and all-masked rows raise here
    u = rng.random(z.shape[:-1] + (1,))
    z2 = np.ascontiguousarray(z.reshape(-1, z.shape[-1]))
    actions = np.empty(z2.shape[0], dtype=np.int64)
    _categorical_sample_kernel(z2, u.reshape(-1), actions)
    return actions.reshape(z.shape[:-1])


@njit
def _categorical_sample_kernel(z, u, actions):
    """Inverse-CDF draws for logits ``z [R, A]`` (float64, or float32 widened entry by entry:
    the arithmetic of ``z.astype(np.float64)``) and uniforms ``u [R]``: ``pi =
    exp(log_softmax(z))`` (shift by the row max, subtract the log of the sum of exponentials
    taken left to right), ``C_k`` the running sums left to right, action = the number of
    ``C_k <= u * C_{A-1}``, or the last action with ``pi > 0`` if that count is A.

    Returns False, at the first row holding a NaN or +inf or no finite maximum (all -inf),
    before drawing from it (the rows :func:`_row_max` rejects); True otherwise."""
    rows, n = z.shape
    for i in range(rows):
        m = -math.inf
        for k in range(n):
            v = np.float64(z[i, k])
            if math.isnan(v) or v == math.inf:
                return False
            if v > m:
                m = v
        if m == -math.inf:
            return False
        s = 0.0
        for k in range(n):
            s += math.exp(np.float64(z[i, k]) - m)
        lse = math.log(s)
        total = 0.0
        for k in range(n):
            total += math.exp((np.float64(z[i, k]) - m) - lse)
        threshold = u[i] * total
        c = 0.0
        count = 0
        last_valid = 0
        for k in range(n):
            p = math.exp((np.float64(z[i, k]) - m) - lse)
            c += p
            if c <= threshold:
                count += 1
            if p > 0.0:
                last_valid = k
        actions[i] = count if count < n else last_valid
    return True


def categorical_mode(logits) -> np.ndarray:
    """The most probable action of each row, ``argmax_a logits[..., a]`` (first on ties).

    Returns int64 ``[...]``; masked actions are never chosen. Raises ``ValueError`` as
    :func:`log_softmax`.
    """
    z = _as_logits(logits)
    _row_max(z)
    return np.argmax(z, axis=-1).astype(np.int64)


# --------------------------------------------------------------------------------------------
# diagonal Gaussian

def _as_mean_log_std(mean, log_std):
    mu = as_float_array(mean, "mean")
    if mu.ndim == 0:
        raise ValueError("mean must have at least 1 dimension [..., action_dim], got a scalar")
    ls = as_float_array(log_std, "log_std", ndim=(1,))
    if ls.shape != mu.shape[-1:]:
        raise ValueError(f"log_std must have shape {mu.shape[-1:]} (state-independent, one per "
                         f"action dimension), got {ls.shape}")
    return mu, ls


def gaussian_log_prob(mean, log_std, actions) -> np.ndarray:
    """``log N(actions; mean, diag(exp(log_std))^2)`` summed over the action dimensions.

    ``sum_j [ -((a_j - mean_j) / sigma_j)^2 / 2 - log_std_j - log(2 pi) / 2 ]``,
    ``sigma = exp(log_std)``.

    Args:
        mean: ``[..., A]`` finite. log_std: ``[A]`` finite. actions: ``[..., A]`` finite
            (the raw, unclipped sample).

    Returns:
        ``[...]`` log-densities (nats), dtype per the module rule.

    Raises:
        ValueError: non-finite input or mismatched shapes.
    """
    mu, ls = _as_mean_log_std(mean, log_std)
    a = as_float_array(actions, "actions")
    check_same_shape(a, "actions", mu.shape, "mean")
    dt = result_dtype(mu, ls, a)
    ls = ls.astype(dt, copy=False)
    u = (a.astype(dt, copy=False) - mu.astype(dt, copy=False)) * np.exp(-ls)
    u *= u
    return -0.5 * _last_axis_sum(u) - (ls.sum() + dt.type(0.5 * _LOG_2PI * ls.shape[0]))


def gaussian_log_prob_backward(mean, log_std, actions, d_log_probs
                               ) -> Tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`gaussian_log_prob` w.r.t. ``mean`` and ``log_std``.

    With ``u = (a - mean) / sigma`` and upstream ``g = d_log_probs``:
    ``d_mean = g * u / sigma`` ``[..., A]`` and ``d_log_std = sum_batch g * (u^2 - 1)`` ``[A]``
    (``log_std`` is shared by every row, so its gradient sums over the batch).

    Args:
        mean, log_std, actions: as :func:`gaussian_log_prob`.
        d_log_probs: ``[...]`` finite.

    Returns:
        ``(d_mean [..., A], d_log_std [A])``.

    Raises:
        ValueError: as :func:`gaussian_log_prob`; ``d_log_probs`` of the wrong shape.
    """
    mu, ls = _as_mean_log_std(mean, log_std)
    a = as_float_array(actions, "actions")
    check_same_shape(a, "actions", mu.shape, "mean")
    d = as_float_array(d_log_probs, "d_log_probs")
    check_same_shape(d, "d_log_probs", mu.shape[:-1], "mean[..., 0]")
    dt = result_dtype(mu, ls, a, d)
    inv_sigma = np.exp(-ls.astype(dt, copy=False))
    u = (a.astype(dt, copy=False) - mu.astype(dt, copy=False)) * inv_sigma
    g = d.astype(dt, copy=False)[..., None]
    d_mean = g * u * inv_sigma
    u *= u
    u -= 1.0
    u *= g
    d_log_std = u.reshape(-1, u.shape[-1]).sum(axis=0)
    return d_mean, d_log_std


def _as_batch_shape(batch_shape) -> Tuple[int, ...]:
    if isinstance(batch_shape, (int, np.integer)) and not isinstance(batch_shape, (bool, np.bool_)):
        shape = (int(batch_shape),)
    else:
        try:
            shape = tuple(int(s) for s in batch_shape)
        except (TypeError, ValueError):
            raise ValueError(f"batch_shape must be an int or a tuple of ints, got {batch_shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"batch_shape must be non-negative, got {shape}")
    return shape


def gaussian_entropy(log_std, batch_shape: Union[int, Sequence[int]]) -> np.ndarray:
    """Entropy ``sum_j [log_std_j + (1 + log(2 pi)) / 2]``, the same for every row.

    Args:
        log_std: ``[A]`` finite.
        batch_shape: the leading shape of the result (int or tuple; ``()`` gives a 0-d array).

    Returns:
        ``[*batch_shape]`` entropies (nats), dtype of ``log_std``.

    Raises:
        ValueError: non-finite or non-1-D ``log_std``, bad ``batch_shape``.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,))
    shape = _as_batch_shape(batch_shape)
    h = ls.sum() + ls.dtype.type(0.5 * (1.0 + _LOG_2PI) * ls.shape[0])
    return np.full(shape, h, dtype=ls.dtype)


def gaussian_entropy_backward(log_std, d_entropy) -> np.ndarray:
    """Gradient of :func:`gaussian_entropy` w.r.t. ``log_std``: ``sum(d_entropy)`` in every entry.

    Args:
        log_std: ``[A]`` finite. d_entropy: any shape (the ``batch_shape``), finite.

    Returns:
        ``d_log_std [A]``.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,))
    d = as_float_array(d_entropy, "d_entropy")
    dt = result_dtype(ls, d)
    return np.full(ls.shape, d.astype(dt, copy=False).sum(), dtype=dt)


def gaussian_sample(rng: np.random.Generator, mean, log_std) -> np.ndarray:
    """``mean + exp(log_std) * eps`` with ``eps ~ N(0, I)`` drawn from ``rng`` (float64, C order).

    Returns the raw (unclipped) sample ``[..., A]``, dtype per the module rule.

    Raises:
        ValueError: ``rng`` not a Generator, as :func:`gaussian_log_prob` otherwise.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    mu, ls = _as_mean_log_std(mean, log_std)
    dt = result_dtype(mu, ls)
    eps = rng.standard_normal(mu.shape)
    eps *= np.exp(ls.astype(np.float64))
    eps += mu
    return eps.astype(dt, copy=False)


# --------------------------------------------------------------------------------------------
# fused categorical kernels for the trainers' hot loop (finite logits only; unchecked)

@njit
def _categorical_eval_kernel(logits, actions, log_probs, entropy, probs):
    """Per row ``i`` of finite ``logits [B, A]``: ``log_probs[i] = log_softmax(logits)[i,
    actions[i]]``, ``entropy[i] = -sum_k pi_k log pi_k`` and ``probs[i] = pi`` (kept for
    :func:`_categorical_backward_kernel`). Same steps as :func:`log_softmax` (shift by the row
    max, subtract the log of the sum of exponentials, left to right). Returns False (and
    stops) at a non-finite logit or an action outside [0, A); the caller then takes the
    checked path."""
    rows, n = logits.shape
    for i in range(rows):
        if actions[i] < 0 or actions[i] >= n:
            return False
        m = logits[i, 0]
        for k in range(n):
            z = logits[i, k]
            if not math.isfinite(z):
                return False
            if z > m:
                m = z
        s = 0.0
        for k in range(n):
            s += math.exp(logits[i, k] - m)
        lse = math.log(s)
        h = 0.0
        for k in range(n):
            lp = (logits[i, k] - m) - lse
            p = math.exp(lp)
            probs[i, k] = p
            h -= p * lp
        log_probs[i] = (logits[i, actions[i]] - m) - lse
        entropy[i] = h
    return True


@njit
def _categorical_backward_kernel(probs, actions, entropy, d_log_probs, d_entropy, use_entropy,
                                 d_logits):
    """``d_logits = d_log_probs * (onehot(actions) - pi) - d_entropy * pi * (log pi + H)``
    (the sum of :func:`categorical_log_prob_backward` and :func:`categorical_entropy_backward`)
    from the ``probs``/``entropy`` of :func:`_categorical_eval_kernel`."""
    rows, n = probs.shape
    for i in range(rows):
        d = d_log_probs[i]
        for k in range(n):
            p = probs[i, k]
            g = -p * d
            if use_entropy and p > 0.0:
                g -= d_entropy[i] * p * (math.log(p) + entropy[i])
            d_logits[i, k] = g
        d_logits[i, actions[i]] += d


# --------------------------------------------------------------------------------------------
# MultiDiscrete: a product of independent categoricals over consecutive logit slices

def _as_nvec(nvec, n_logits: int) -> np.ndarray:
    """``nvec`` as int64 offsets ``[K + 1]`` (``offsets[k]`` = first logit of component k);
    ``ValueError`` unless it is a non-empty 1-D sequence of integers >= 1 summing to
    ``n_logits``."""
    v = np.asarray(nvec)
    if v.ndim != 1 or v.size == 0 or v.dtype.kind not in "iu":
        raise ValueError(f"nvec must be a non-empty 1-D array of integers (the number of choices "
                         f"of each component), got {nvec!r}")
    if (v < 1).any():
        raise ValueError(f"nvec entries must be >= 1, got {v.tolist()}")
    if int(v.sum()) != n_logits:
        raise ValueError(f"logits must have sum(nvec) = {int(v.sum())} entries in the last "
                         f"dimension (nvec={v.tolist()}), got {n_logits}")
    offsets = np.zeros(v.size + 1, dtype=np.int64)
    np.cumsum(v, out=offsets[1:])
    return offsets


def _multi_inputs(logits, nvec):
    """Validated ``(z [R, A] float64 C-contiguous, offsets [K + 1], batch_shape)``.

    Each component's slice is checked as :func:`log_softmax` checks a row (NaN, ``+inf``,
    every choice masked raise ``ValueError``, naming the component)."""
    z = _as_logits(logits)
    offsets = _as_nvec(nvec, z.shape[-1])
    batch_shape = z.shape[:-1]
    z2 = np.ascontiguousarray(z.reshape(-1, z.shape[-1]), dtype=np.float64)
    for k in range(offsets.size - 1):
        try:
            _row_max(z2[:, offsets[k]:offsets[k + 1]])
        except ValueError as exc:
            raise ValueError(f"component {k} of the MultiDiscrete logits: {exc}") from None
    return z2, offsets, batch_shape


def _multi_actions(actions, batch_shape, offsets) -> np.ndarray:
    """Integer actions ``[..., K]`` with ``actions[..., k]`` in ``[0, nvec[k])`` as int64
    ``[R, K]``; ``ValueError`` naming the component otherwise."""
    K = offsets.size - 1
    a = np.asarray(actions)
    expected = tuple(batch_shape) + (K,)
    if a.shape != expected:
        raise ValueError(f"actions must have shape {expected} (batch shape of logits, then one "
                         f"entry per component), got {a.shape}")
    a2 = a.reshape(-1, K)
    out = np.empty(a2.shape, dtype=np.int64)
    for k in range(K):
        try:
            out[:, k] = _as_actions(a2[:, k], (a2.shape[0],), int(offsets[k + 1] - offsets[k]))
        except ValueError as exc:
            raise ValueError(f"component {k}: {exc}") from None
    return out


@njit
def _multi_categorical_eval_kernel(z, offsets, actions, log_probs, entropy, probs, comp_entropy):
    """Per row ``i`` of validated logits ``z [R, A]`` (float64; each component's slice has a
    finite maximum, ``-inf`` marks a masked choice) and component ``k`` with slice
    ``offsets[k]:offsets[k+1]``: ``log pi_k = (z - max) - log(sum exp(z - max))`` (sums left
    to right), ``probs = exp(log pi_k)``, ``comp_entropy[i, k] = -sum_j p_j log pi_kj`` over
    ``p_j > 0``; ``log_probs[i] = sum_k log pi_k[actions[i, k]]`` and ``entropy[i] = sum_k
    comp_entropy[i, k]``, summed over k in order."""
    rows = z.shape[0]
    K = offsets.size - 1
    for i in range(rows):
        lp_sum = 0.0
        h_sum = 0.0
        for k in range(K):
            lo = offsets[k]
            hi = offsets[k + 1]
            m = -math.inf
            for j in range(lo, hi):
                if z[i, j] > m:
                    m = z[i, j]
            s = 0.0
            for j in range(lo, hi):
                s += math.exp(z[i, j] - m)
            lse = math.log(s)
            h = 0.0
            for j in range(lo, hi):
                lp = (z[i, j] - m) - lse
                p = math.exp(lp)
                probs[i, j] = p
                if p > 0.0:
                    h -= p * lp
            comp_entropy[i, k] = h
            h_sum += h
            lp_sum += (z[i, lo + actions[i, k]] - m) - lse
        log_probs[i] = lp_sum
        entropy[i] = h_sum


@njit
def _multi_categorical_backward_kernel(probs, offsets, actions, comp_entropy, d_log_probs,
                                       d_entropy, d_logits):
    """Per component slice of row ``i``: ``d_logits_j = d_log_probs[i] * ([j = a_k] - p_j)
    - d_entropy[i] * p_j * (log p_j + H_k)`` (0 where ``p_j = 0``), from the ``probs`` and
    ``comp_entropy`` of :func:`_multi_categorical_eval_kernel`; ``d_log_probs``/``d_entropy``
    ``[R]`` (zeros for a term that is absent)."""
    rows = probs.shape[0]
    K = offsets.size - 1
    for i in range(rows):
        d = d_log_probs[i]
        de = d_entropy[i]
        for k in range(K):
            h = comp_entropy[i, k]
            for j in range(offsets[k], offsets[k + 1]):
                p = probs[i, j]
                g = -p * d
                if p > 0.0:
                    g -= de * p * (math.log(p) + h)
                d_logits[i, j] = g
            d_logits[i, offsets[k] + actions[i, k]] += d


def _multi_eval(z2, offsets, a2):
    R = z2.shape[0]
    log_probs = np.empty(R)
    entropy = np.empty(R)
    probs = np.empty(z2.shape)
    comp_entropy = np.empty((R, offsets.size - 1))
    _multi_categorical_eval_kernel(z2, offsets, a2, log_probs, entropy, probs, comp_entropy)
    return log_probs, entropy, probs, comp_entropy


def multi_categorical_log_prob(logits, actions, nvec) -> np.ndarray:
    """Log-probability of MultiDiscrete actions under independent categoricals.

    The logits of component ``k`` are the slice ``logits[..., o_k : o_k + nvec[k]]`` with
    ``o_k = nvec[0] + ... + nvec[k-1]``; ``log pi(a) = sum_k log softmax(slice_k)[a_k]`` (the
    product of the components' probabilities; SB3 ``MultiCategoricalDistribution``, CleanRL
    ``ppo_multidiscrete.py``; Huang et al. 2022, MultiDiscrete detail). Compiled; equals
    ``sum_k categorical_log_prob(slice_k, actions[..., k])`` (and
    ``ppo_ref.spec.distributions.multi_categorical_log_prob``) within rtol 1e-12: the same
    per-component steps, the components summed in order.

    Args:
        logits: ``[..., sum(nvec)]`` real (float32 widened exactly to float64); ``-inf`` marks a
            masked choice, NaN and ``+inf`` are refused.
        nvec: ``[K]`` integers >= 1, the number of choices of each component.
        actions: integers ``[..., K]`` with ``actions[..., k]`` in ``[0, nvec[k])``.

    Returns:
        float64 ``[...]`` log-probabilities (nats; ``-inf`` if a chosen choice is masked).

    Raises:
        ValueError: bad ``nvec`` or ``logits`` size, NaN/``+inf`` logits or a component with
            every choice masked, ``actions`` of the wrong shape, non-integral or out of range
            (naming the component).
    """
    z2, offsets, batch_shape = _multi_inputs(logits, nvec)
    a2 = _multi_actions(actions, batch_shape, offsets)
    return _multi_eval(z2, offsets, a2)[0].reshape(batch_shape)


def multi_categorical_entropy(logits, nvec) -> np.ndarray:
    """Entropy of the product distribution: ``H = sum_k H(softmax(slice_k))`` (independent
    components; slices as :func:`multi_categorical_log_prob`). Compiled; equals the sum of
    :func:`categorical_entropy` over the slices within rtol 1e-12.

    Returns float64 ``[...]`` (nats). Raises ``ValueError`` as
    :func:`multi_categorical_log_prob`.
    """
    z2, offsets, batch_shape = _multi_inputs(logits, nvec)
    a2 = np.zeros((z2.shape[0], offsets.size - 1), dtype=np.int64)
    return _multi_eval(z2, offsets, a2)[1].reshape(batch_shape)


def _multi_backward(logits, nvec, actions, d_log_probs, d_entropy):
    z2, offsets, batch_shape = _multi_inputs(logits, nvec)
    R = z2.shape[0]
    if actions is None:
        a2 = np.zeros((R, offsets.size - 1), dtype=np.int64)
    else:
        a2 = _multi_actions(actions, batch_shape, offsets)
    zeros = np.zeros(R)
    d_lp = zeros
    d_ent = zeros
    if d_log_probs is not None:
        d = as_float_array(d_log_probs, "d_log_probs")
        check_same_shape(d, "d_log_probs", batch_shape, "logits[..., 0]")
        d_lp = np.ascontiguousarray(d.reshape(-1), dtype=np.float64)
    if d_entropy is not None:
        d = as_float_array(d_entropy, "d_entropy")
        check_same_shape(d, "d_entropy", batch_shape, "logits[..., 0]")
        d_ent = np.ascontiguousarray(d.reshape(-1), dtype=np.float64)
    _, _, probs, comp_entropy = _multi_eval(z2, offsets, a2)
    d_logits = np.empty(z2.shape)
    _multi_categorical_backward_kernel(probs, offsets, a2, comp_entropy, d_lp, d_ent, d_logits)
    return d_logits.reshape(tuple(batch_shape) + (z2.shape[1],))


def multi_categorical_log_prob_backward(logits, actions, nvec, d_log_probs) -> np.ndarray:
    """Gradient of :func:`multi_categorical_log_prob` w.r.t. the logits: in the slice of
    component ``k``, ``d_logits_j = d_log_probs * ([j = a_k] - pi_k(j))`` (each component's
    categorical gradient; the sum over components touches each slice once). Compiled; equals
    :func:`categorical_log_prob_backward` per slice within rtol 1e-12.

    Args:
        logits, actions, nvec: as :func:`multi_categorical_log_prob`.
        d_log_probs: ``[...]`` finite upstream gradient.

    Returns:
        float64 ``d_logits [..., sum(nvec)]``.

    Raises:
        ValueError: as :func:`multi_categorical_log_prob`; ``d_log_probs`` of the wrong shape
            or non-finite.
    """
    return _multi_backward(logits, nvec, actions, d_log_probs, None)


def multi_categorical_entropy_backward(logits, nvec, d_entropy) -> np.ndarray:
    """Gradient of :func:`multi_categorical_entropy` w.r.t. the logits: in the slice of
    component ``k``, ``d_logits_j = -d_entropy * pi_k(j) * (log pi_k(j) + H_k)`` (0 for a
    masked choice). Compiled; equals :func:`categorical_entropy_backward` per slice within
    rtol 1e-12.

    Returns float64 ``d_logits [..., sum(nvec)]``. Raises ``ValueError`` as
    :func:`multi_categorical_log_prob`, or for ``d_entropy`` of the wrong shape or non-finite.
    """
    return _multi_backward(logits, nvec, None, None, d_entropy)


def multi_categorical_sample(rng: np.random.Generator, logits, nvec) -> np.ndarray:
    """One independent draw per component: component ``k``'s actions are
    ``categorical_sample(rng, slice_k)`` for ``k = 0, 1, ...`` in order, so the generator gives
    one uniform per row for component 0 (rows in C order), then one per row for component 1,
    and so on (inverse-CDF sampling of :func:`categorical_sample`; masked choices are never
    drawn).

    Returns:
        int64 ``[..., K]`` actions, ``actions[..., k]`` in ``[0, nvec[k])``.

    Raises:
        ValueError: ``rng`` not a Generator, as :func:`multi_categorical_log_prob` otherwise.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    z2, offsets, batch_shape = _multi_inputs(logits, nvec)
    K = offsets.size - 1
    actions = np.empty((z2.shape[0], K), dtype=np.int64)
    for k in range(K):
        actions[:, k] = categorical_sample(
            rng, np.ascontiguousarray(z2[:, offsets[k]:offsets[k + 1]]))
    return actions.reshape(tuple(batch_shape) + (K,))


def multi_categorical_mode(logits, nvec) -> np.ndarray:
    """The most probable action of each component (argmax of its slice, first on ties): the
    mode of the product distribution. Returns int64 ``[..., K]``; raises ``ValueError`` as
    :func:`multi_categorical_log_prob`."""
    z2, offsets, batch_shape = _multi_inputs(logits, nvec)
    K = offsets.size - 1
    actions = np.empty((z2.shape[0], K), dtype=np.int64)
    for k in range(K):
        actions[:, k] = np.argmax(z2[:, offsets[k]:offsets[k + 1]], axis=-1)
    return actions.reshape(tuple(batch_shape) + (K,))
