"""Action distributions of the PPO policy head: log-probabilities, entropies, their gradients,
sampling and modes, in float64.

Categorical over ``A`` actions, parameterised by unnormalised logits ``z [..., A]``
(``torch.distributions.Categorical(logits=z)``)::

    log pi(a) = z_a - log sum_k exp(z_k)                 (computed as log_softmax, below)
    H         = -sum_k pi(k) log pi(k)
    d log pi(a) / d z_k = [k = a] - pi(k)
    d H / d z_k         = -pi(k) (log pi(k) + H)

Action masks: a logit of ``-inf`` marks an invalid action. Its probability is exactly 0, its
log-probability ``-inf``, it contributes 0 to the entropy (``0 log 0 = 0``) and gets gradient 0
(unless it is the action whose log-probability is differentiated), and it is never sampled or
chosen as the mode. This is the exact form of MaskablePPO (sb3-contrib), which sets masked
logits to a large negative number. A row whose actions are all masked has no distribution and
raises ``ValueError``, as do NaN and ``+inf`` logits.

MultiDiscrete (``gymnasium.spaces.MultiDiscrete(nvec)``): independent categoricals over
consecutive slices of the logits ``[..., sum(nvec)]``, component ``j`` reading
``z[..., o_j : o_j + nvec[j]]`` with ``o_j = nvec[0] + ... + nvec[j-1]``; actions are
``[..., len(nvec)]``. The log-probability and the entropy are the sums of the components'
(SB3 ``MultiCategoricalDistribution``).

Diagonal Gaussian over ``A`` action dimensions with a state-independent ``log_std [A]``
(SB3 ``DiagGaussianDistribution``, CleanRL ``ppo_continuous_action.py``), ``sigma =
exp(log_std)`` and ``u = (a - mean) / sigma``::

    log pi(a) = -1/2 sum_j u_j^2 - sum_j log_std_j - A/2 log(2 pi)
    H         = sum_j log_std_j + A/2 (1 + log(2 pi))          (the same for every state)
    d log pi / d mean_j    = u_j / sigma_j
    d log pi / d log_std_j = u_j^2 - 1
    d H / d log_std_j      = 1

Log-probabilities and entropies are in nats and summed over the action dimensions. The
Gaussian action is the raw, unclipped sample (clipping to the action space happens on the way
to the environment, outside this module).

Every input is cast to float64 and every float result is float64; actions are int64.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple, Union

import numpy as np

from ppo_ref._checks import (as_float_array, as_index_array, as_shape, check_generator,
                             check_last_dim, check_logits, check_positive_int, check_same_shape)

__all__ = [
    "log_softmax", "categorical_log_prob", "categorical_entropy",
    "categorical_log_prob_backward", "categorical_entropy_backward",
    "categorical_log_prob_entropy", "categorical_log_prob_entropy_backward", "categorical_sample",
    "categorical_mode", "inverse_cdf_actions",
    "multi_categorical_log_prob", "multi_categorical_entropy",
    "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
    "multi_categorical_sample", "multi_categorical_mode",
    "gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
    "gaussian_entropy_backward", "gaussian_sample",
]

LOG_2PI = math.log(2.0 * math.pi)


def _as_float64(x, name: str, allow_nonfinite: bool = False) -> np.ndarray:
    return as_float_array(x, name, allow_nonfinite=allow_nonfinite).astype(np.float64, copy=False)


def _as_logits(logits) -> np.ndarray:
    """``logits`` as float64 ``[..., A]``, checked by :func:`ppo_ref._checks.check_logits`."""
    z = _as_float64(logits, "logits", allow_nonfinite=True)
    check_logits(z, "logits")
    return z


def as_upstream(d, name: str, shape: tuple, ref_name: str) -> np.ndarray:
    """An upstream gradient: finite float64 of exactly ``shape``."""
    d = _as_float64(d, name)
    check_same_shape(d, name, shape, ref_name)
    return d


# --------------------------------------------------------------------------------------------
# categorical

def _log_softmax(z: np.ndarray) -> np.ndarray:
    """log_softmax of checked float64 logits (see :func:`log_softmax`)."""
    m = np.max(z, axis=-1, keepdims=True)
    s = z - m
    return s - np.log(np.sum(np.exp(s), axis=-1, keepdims=True))


def log_softmax(logits) -> np.ndarray:
    """Numerically stable log-softmax over the last axis:

        m = max_k z_k
        s = z - m
        log pi = s - log sum_k exp(s_k)

    The shift makes the largest ``exp`` exactly 1 and the sum lie in ``[1, A]``: no overflow,
    no ``log 0`` (``[1000, 1001, 1002]`` gives exactly what ``[0, 1, 2]`` gives). A masked
    logit (``-inf``) gives ``-inf``.

    Args:
        logits: ``[..., A]`` real array; ``-inf`` allowed, NaN and ``+inf`` not.

    Returns:
        float64 log-probabilities of the shape of ``logits``.

    Raises:
        ValueError: NaN or ``+inf`` logits, a row with every action ``-inf``, a finite logit
            so far below its row's maximum that ``z - m`` overflows float64 (e.g. ``[1.7e308,
            -1.7e308]``), a scalar or an empty last axis.
    """
    return _log_softmax(_as_logits(logits))


def _zero_where_masked(log_pi: np.ndarray) -> np.ndarray:
    """``log pi`` with the ``-inf`` entries (masked actions) replaced by 0, so that
    ``pi * log pi = 0 * 0 = 0`` there (the convention ``0 log 0 = 0``)."""
    return np.where(log_pi == -np.inf, 0.0, log_pi)


def categorical_log_prob(logits, actions) -> np.ndarray:
    """``log pi(a) = log_softmax(z)[..., a]`` for each row's action ``a``.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.
        actions: integers ``[...]`` in ``[0, A)`` (integral floats accepted).

    Returns:
        float64 ``[...]`` (``-inf`` for a masked action).

    Raises:
        ValueError: as :func:`log_softmax`; ``actions`` of the wrong shape, non-integral or
            out of range.
    """
    z = _as_logits(logits)
    a = as_index_array(actions, "actions", z.shape[:-1], "logits[..., 0]", z.shape[-1])
    log_pi = _log_softmax(z)
    return np.take_along_axis(log_pi, a[..., None], axis=-1)[..., 0]


def categorical_entropy(logits) -> np.ndarray:
    """``H = -sum_k pi(k) log pi(k)`` of each row; masked actions contribute 0.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.

    Returns:
        float64 ``[...]`` in ``[0, log(number of unmasked actions)]``.

    Raises:
        ValueError: as :func:`log_softmax`.
    """
    log_pi = _log_softmax(_as_logits(logits))
    pi = np.exp(log_pi)  # exactly 0 where masked
    return -np.sum(pi * _zero_where_masked(log_pi), axis=-1)


def categorical_log_prob_backward(logits, actions, d_log_probs) -> np.ndarray:
    """Gradient w.r.t. the logits of ``sum d_log_probs * log pi(actions)``:

        d_logits[..., k] = d_log_probs * ([k = a] - pi(k))

    A masked action gets exactly 0 (``pi(k) = 0``) unless it is the action ``a``.

    Args:
        logits: ``[..., A]``; actions: ``[...]``, as :func:`categorical_log_prob`.
        d_log_probs: ``[...]`` finite upstream gradient ``dL/dlog_prob``.

    Returns:
        float64 ``d_logits [..., A]``.

    Raises:
        ValueError: as :func:`categorical_log_prob`; ``d_log_probs`` of the wrong shape or
            non-finite.
    """
    z = _as_logits(logits)
    d = as_upstream(d_log_probs, "d_log_probs", z.shape[:-1], "logits[..., 0]")
    a = as_index_array(actions, "actions", z.shape[:-1], "logits[..., 0]", z.shape[-1])
    pi = np.exp(_log_softmax(z))
    one_hot = np.arange(z.shape[-1]) == a[..., None]
    return d[..., None] * one_hot - d[..., None] * pi


def categorical_entropy_backward(logits, d_entropy) -> np.ndarray:
    """Gradient w.r.t. the logits of ``sum d_entropy * H``:

        d_logits[..., k] = -d_entropy * pi(k) * (log pi(k) + H)

    Masked actions get exactly 0.

    Args:
        logits: ``[..., A]``, as :func:`log_softmax`.
        d_entropy: ``[...]`` finite upstream gradient ``dL/dH``.

    Returns:
        float64 ``d_logits [..., A]``.

    Raises:
        ValueError: as :func:`log_softmax`; ``d_entropy`` of the wrong shape or non-finite.
    """
    z = _as_logits(logits)
    d = as_upstream(d_entropy, "d_entropy", z.shape[:-1], "logits[..., 0]")
    log_pi = _log_softmax(z)
    pi = np.exp(log_pi)  # exactly 0 where masked
    log_pi = _zero_where_masked(log_pi)  # so pi * log_pi and the result are 0 there
    entropy = -np.sum(pi * log_pi, axis=-1, keepdims=True)
    return -d[..., None] * pi * (log_pi + entropy)


def categorical_log_prob_entropy(logits, actions) -> Tuple[np.ndarray, np.ndarray]:
    """``(categorical_log_prob(logits, actions), categorical_entropy(logits))``: the two
    quantities a policy head evaluates per minibatch, in one call. Defined by composing the two
    functions (their equations are stated there, once).

    Returns:
        ``(log_probs, entropy)``, float64 ``[...]`` each.

    Raises:
        ValueError: as :func:`categorical_log_prob`.
    """
    return categorical_log_prob(logits, actions), categorical_entropy(logits)


def categorical_log_prob_entropy_backward(logits, actions, d_log_probs, d_entropy) -> np.ndarray:
    """Gradient w.r.t. the logits of ``sum d_log_probs * log pi(actions) + d_entropy * H``:
    :func:`categorical_log_prob_backward` plus :func:`categorical_entropy_backward` (the
    equations are stated there, once); ``d_entropy`` None counts as zero (the first alone).

    Args:
        logits: ``[..., A]``; actions: ``[...]``, as :func:`categorical_log_prob`.
        d_log_probs: ``[...]`` finite; d_entropy: ``[...]`` finite, or None.

    Returns:
        float64 ``d_logits [..., A]``.

    Raises:
        ValueError: as :func:`categorical_log_prob_backward` and
            :func:`categorical_entropy_backward`.
    """
    d_logits = categorical_log_prob_backward(logits, actions, d_log_probs)
    if d_entropy is None:
        return d_logits
    return d_logits + categorical_entropy_backward(logits, d_entropy)


def logit_row_max(z, i):
    """The maximum ``m = max_k z[i, k]`` of row ``i`` of the logits ``z [R, A]`` (float64, or
    float32 widened entry by entry) when :func:`log_softmax` accepts the row, else NaN: the row
    holds a NaN or ``+inf``, has no finite maximum (every action masked), or has a finite logit
    whose shift ``z[i, k] - m`` overflows float64. The one row check of the sampling loops
    (:func:`inverse_cdf_actions`, :func:`logit_rows_valid`)."""
    n = z.shape[1]
    m = -math.inf
    for k in range(n):
        v = np.float64(z[i, k])
        if math.isnan(v) or v == math.inf:
            return math.nan
        if v > m:
            m = v
    if m == -math.inf:
        return math.nan
    for k in range(n):
        v = np.float64(z[i, k])
        if v - m == -math.inf and v != -math.inf:  # the spread overflows float64
            return math.nan
    return m


def logit_rows_valid(z):
    """Whether :func:`log_softmax` accepts every row of the logits ``z [R, A]``
    (:func:`logit_row_max` of each row is not NaN): the check pass a sampler runs before it
    draws anything."""
    for i in range(z.shape[0]):
        if math.isnan(logit_row_max(z, i)):
            return False
    return True


def inverse_cdf_actions(z, u, actions):
    """The inverse-CDF action of each row, written once (the compiled tier compiles this very
    loop: :func:`ppo_ref.fast.distributions.categorical_sample`). For logits ``z [R, A]``
    (float64, or float32 widened entry by entry) and uniforms ``u [R]`` in ``[0, 1)``, writes
    into ``actions [R]`` (int64)::

        m    = max_k z_k
        lse  = log(exp(z_0 - m) + ... + exp(z_{A-1} - m))       (sum left to right)
        pi_k = exp((z_k - m) - lse)                             (softmax, as log_softmax)
        C_k  = pi_0 + ... + pi_k                                (running sum, left to right)
        a    = #{k : C_k <= u * C_{A-1}}                        (the first k with C_k > u C_{A-1})

    A masked action (``z_k = -inf``, ``pi_k = 0``) has ``C_k = C_{k-1}`` and so is never that
    first ``k``. If rounding makes ``u * C_{A-1}`` reach ``C_{A-1}`` (a count of ``A``), the last
    action with ``pi_k > 0`` is written instead.

    Returns False (and stops) at the first row :func:`log_softmax` refuses
    (:func:`logit_row_max`); True otherwise.
    """
    rows, n = z.shape
    for i in range(rows):
        m = logit_row_max(z, i)
        if math.isnan(m):
            return False
        s = 0.0
        for k in range(n):
            s += math.exp(np.float64(z[i, k]) - m)
        lse = math.log(s)
        total = 0.0
        for k in range(n):
            total += math.exp((np.float64(z[i, k]) - m) - lse)
        threshold = u[i] * total
        cdf = 0.0
        count = 0
        last_valid = 0
        for k in range(n):
            p = math.exp((np.float64(z[i, k]) - m) - lse)
            cdf += p
            if cdf <= threshold:
                count += 1
            if p > 0.0:
                last_valid = k
        actions[i] = count if count < n else last_valid
    return True


def categorical_sample(rng: np.random.Generator, logits) -> np.ndarray:
    """One action per row by inverse-CDF sampling: the logits are checked, one uniform
    ``u ~ U[0, 1)`` is drawn per row (``rng.random``, C order over rows), and
    :func:`inverse_cdf_actions` turns each row's logits and uniform into its action. A refused
    call draws nothing; the same generator state gives the same actions.

    Args:
        rng: ``np.random.Generator``, the only source of randomness.
        logits: ``[..., A]``, as :func:`log_softmax`.

    Returns:
        int64 ``[...]`` of actions in ``[0, A)`` (0-d for a single ``[A]`` row); a masked
        action is never drawn.

    Raises:
        ValueError: ``rng`` not a Generator, or as :func:`log_softmax`.
    """
    check_generator(rng)
    z = _as_logits(logits)
    u = rng.random(z.shape[:-1])
    z2 = np.ascontiguousarray(z.reshape(-1, z.shape[-1]))
    actions = np.empty(z2.shape[0], dtype=np.int64)
    inverse_cdf_actions(z2, u.reshape(-1), actions)
    return actions.reshape(z.shape[:-1])


def categorical_mode(logits) -> np.ndarray:
    """The most probable action of each row, ``argmax_k z_k`` (the first on ties).

    Masked actions are never chosen. Returns int64 ``[...]``. Raises ``ValueError`` as
    :func:`log_softmax`.
    """
    z = _as_logits(logits)
    return np.argmax(z, axis=-1).astype(np.int64)


# --------------------------------------------------------------------------------------------
# MultiDiscrete: independent categoricals over consecutive slices of the logits

def _as_nvec(nvec) -> Tuple[int, ...]:
    try:
        sizes = [n for n in nvec]
    except TypeError:
        raise ValueError(f"nvec must be a sequence of positive ints, got {nvec!r}") from None
    if not sizes:
        raise ValueError("nvec must have at least one component, got an empty sequence")
    return tuple(check_positive_int(n, "nvec entries") for n in sizes)


def multi_components(logits, nvec) -> Tuple[np.ndarray, Tuple[int, ...], List[slice]]:
    """Checked ``(z, nvec, slices)``: ``z[..., slices[j]]`` are component ``j``'s logits."""
    sizes = _as_nvec(nvec)
    z = _as_float64(logits, "logits", allow_nonfinite=True)
    check_last_dim(z, "logits", sum(sizes))  # sum(nvec)
    slices = []
    start = 0
    for n in sizes:
        slices.append(slice(start, start + n))
        start += n
    for j, s in enumerate(slices):
        check_logits(z[..., s], f"logits of component {j}")
    return z, sizes, slices


def multi_actions(actions, z: np.ndarray, sizes: Tuple[int, ...]) -> np.ndarray:
    return as_index_array(actions, "actions", z.shape[:-1] + (len(sizes),),
                          "[..., len(nvec)]", sizes)


def multi_categorical_log_prob(logits, actions, nvec: Sequence[int]) -> np.ndarray:
    """``log pi(a) = sum_j log pi_j(a_j)``, ``pi_j = softmax(z[..., o_j : o_j + nvec[j]])``.

    Args:
        logits: ``[..., sum(nvec)]``; each component's slice as :func:`log_softmax` (masks
            allowed, at least one unmasked action per component and row).
        actions: integers ``[..., len(nvec)]`` with ``actions[..., j]`` in ``[0, nvec[j])``.
        nvec: the number of actions of each component (positive ints).

    Returns:
        float64 ``[...]`` (``-inf`` if any component's action is masked).

    Raises:
        ValueError: bad ``nvec``, ``logits`` whose last dimension is not ``sum(nvec)`` or with
            a bad component (as :func:`log_softmax`), bad ``actions``.
    """
    z, sizes, slices = multi_components(logits, nvec)
    a = multi_actions(actions, z, sizes)
    total = np.zeros(z.shape[:-1])
    for j, s in enumerate(slices):
        total = total + categorical_log_prob(z[..., s], a[..., j])
    return total


def multi_categorical_entropy(logits, nvec: Sequence[int]) -> np.ndarray:
    """``H = sum_j H_j`` (the components are independent). float64 ``[...]``.

    Raises ``ValueError`` as :func:`multi_categorical_log_prob`.
    """
    z, _, slices = multi_components(logits, nvec)
    total = np.zeros(z.shape[:-1])
    for s in slices:
        total = total + categorical_entropy(z[..., s])
    return total


def multi_categorical_log_prob_backward(logits, actions, nvec: Sequence[int],
                                        d_log_probs) -> np.ndarray:
    """Gradient w.r.t. the logits of ``sum d_log_probs * log pi(actions)``: on component ``j``'s
    slice, :func:`categorical_log_prob_backward` of that component with the same upstream
    ``d_log_probs`` (``d log pi / d log pi_j = 1``).

    Args:
        logits, actions, nvec: as :func:`multi_categorical_log_prob`.
        d_log_probs: ``[...]`` finite.

    Returns:
        float64 ``d_logits [..., sum(nvec)]``.

    Raises:
        ValueError: as :func:`multi_categorical_log_prob`; ``d_log_probs`` of the wrong shape
            or non-finite.
    """
    z, sizes, slices = multi_components(logits, nvec)
    a = multi_actions(actions, z, sizes)
    d = as_upstream(d_log_probs, "d_log_probs", z.shape[:-1], "logits[..., 0]")
    return np.concatenate([categorical_log_prob_backward(z[..., s], a[..., j], d)
                           for j, s in enumerate(slices)], axis=-1)


def multi_categorical_entropy_backward(logits, nvec: Sequence[int], d_entropy) -> np.ndarray:
    """Gradient w.r.t. the logits of ``sum d_entropy * H``: on component ``j``'s slice,
    :func:`categorical_entropy_backward` of that component with the same ``d_entropy``.

    Returns float64 ``d_logits [..., sum(nvec)]``. Raises ``ValueError`` as
    :func:`multi_categorical_log_prob_backward` (naming ``d_entropy``).
    """
    z, _, slices = multi_components(logits, nvec)
    d = as_upstream(d_entropy, "d_entropy", z.shape[:-1], "logits[..., 0]")
    return np.concatenate([categorical_entropy_backward(z[..., s], d) for s in slices], axis=-1)


def multi_categorical_sample(rng: np.random.Generator, logits, nvec: Sequence[int]) -> np.ndarray:
    """One action per component and row: ``a_j = categorical_sample(rng, z[..., slice_j])``
    for ``j = 0, 1, ...`` in order, so the draws are one uniform per row for component 0,
    then one per row for component 1, ... (SB3's ``MultiCategoricalDistribution.sample``
    order). Everything is checked before anything is drawn.

    Returns int64 ``[..., len(nvec)]``. Raises ``ValueError`` for ``rng`` not a Generator or
    as :func:`multi_categorical_log_prob`.
    """
    check_generator(rng)
    z, _, slices = multi_components(logits, nvec)
    return np.stack([categorical_sample(rng, z[..., s]) for s in slices], axis=-1)


def multi_categorical_mode(logits, nvec: Sequence[int]) -> np.ndarray:
    """``a_j = argmax z[..., slice_j]`` per component (first on ties); int64 ``[..., len(nvec)]``.

    Raises ``ValueError`` as :func:`multi_categorical_log_prob`.
    """
    z, _, slices = multi_components(logits, nvec)
    return np.stack([categorical_mode(z[..., s]) for s in slices], axis=-1)


# --------------------------------------------------------------------------------------------
# diagonal Gaussian

def _as_mean_log_std(mean, log_std) -> Tuple[np.ndarray, np.ndarray]:
    mu = _as_float64(mean, "mean")
    if mu.ndim == 0:
        raise ValueError("mean must have at least 1 dimension [..., action_dim], got a scalar")
    ls = _as_float64(log_std, "log_std")
    check_same_shape(ls, "log_std", mu.shape[-1:], "mean's last axis (state-independent, "
                     "one per action dimension)")
    return mu, ls


def _standardized(mu: np.ndarray, ls: np.ndarray, actions) -> Tuple[np.ndarray, np.ndarray]:
    """``(sigma, u)`` with ``sigma = exp(log_std)`` and ``u = (a - mean) / sigma`` for checked
    ``mean``/``log_std`` and the raw ``actions``; ``ValueError`` naming ``actions`` if
    ``a - mean`` overflows float64, naming ``log_std`` if ``u`` or ``u^2`` does (or is 0/0:
    ``exp(log_std)`` underflows to 0 below about -745)."""
    a = _as_float64(actions, "actions")
    check_same_shape(a, "actions", mu.shape, "mean")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        diff = a - mu
        sigma = np.exp(ls)
        u = diff / sigma
        bad = ~np.isfinite(u * u)
    if not np.isfinite(diff).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(diff))[0])
        raise ValueError(f"actions - mean overflows float64 at index {where}")
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"log_std is too small for actions - mean: ((actions - mean) / "
                         f"exp(log_std))^2 overflows float64 at index {where} (log_std "
                         f"{ls[where[-1]]})")
    return sigma, u


def _finite_result(x: np.ndarray, what: str) -> np.ndarray:
    """``x``; ``ValueError`` naming ``what`` unless every entry is finite."""
    if not np.isfinite(x).all():
        raise ValueError(f"{what} overflows float64")
    return x


def gaussian_log_prob(mean, log_std, actions) -> np.ndarray:
    """``log N(a; mean, diag(sigma^2))`` summed over the action dimensions:

        sigma = exp(log_std)
        u = (a - mean) / sigma
        log pi(a) = -1/2 sum_j u_j^2 - (sum_j log_std_j + A/2 log(2 pi))

    Args:
        mean: ``[..., A]`` finite. log_std: ``[A]`` finite. actions: ``[..., A]`` finite (the
            raw, unclipped sample).

    Returns:
        float64 ``[...]`` log-densities (nats).

    Raises:
        ValueError: non-finite input or mismatched shapes; finite input that overflows float64
            (naming ``actions`` when ``actions - mean`` does, ``log_std`` when ``u^2`` does,
            e.g. ``log_std = -800`` where ``exp(log_std)`` underflows to 0, or when the sums
            do).
    """
    mu, ls = _as_mean_log_std(mean, log_std)
    sigma, u = _standardized(mu, ls, actions)
    with np.errstate(over="ignore", invalid="ignore"):
        log_prob = -0.5 * np.sum(u * u, axis=-1) - (np.sum(ls) + 0.5 * LOG_2PI * ls.shape[0])
    return _finite_result(log_prob, "log_std or actions - mean is too large: the log-density")


def gaussian_log_prob_backward(mean, log_std, actions, d_log_probs
                               ) -> Tuple[np.ndarray, np.ndarray]:
    """Gradients of ``sum g * gaussian_log_prob`` w.r.t. ``mean`` and ``log_std``, ``g =
    d_log_probs``:

        d_mean = g * u / sigma                          [..., A]
        d_log_std = sum_batch g * (u^2 - 1)             [A]  (log_std is shared by every row)

    Args:
        mean, log_std, actions: as :func:`gaussian_log_prob`.
        d_log_probs: ``[...]`` finite.

    Returns:
        ``(d_mean [..., A], d_log_std [A])``, float64.

    Raises:
        ValueError: as :func:`gaussian_log_prob`; ``d_log_probs`` of the wrong shape or
            non-finite; a gradient that overflows float64 (naming ``log_std`` and
            ``d_log_probs``).
    """
    mu, ls = _as_mean_log_std(mean, log_std)
    g = as_upstream(d_log_probs, "d_log_probs", mu.shape[:-1], "mean[..., 0]")[..., None]
    sigma, u = _standardized(mu, ls, actions)
    with np.errstate(over="ignore", invalid="ignore"):
        d_mean = g * u / sigma
        d_log_std = np.sum((g * (u * u - 1.0)).reshape(-1, ls.shape[0]), axis=0)
    what = "log_std too small or d_log_probs too large: the gradient"
    return _finite_result(d_mean, what), _finite_result(d_log_std, what)


def gaussian_entropy(log_std, batch_shape: Union[int, Sequence[int]]) -> np.ndarray:
    """``H = sum_j log_std_j + A/2 (1 + log(2 pi))``, the same for every row.

    Args:
        log_std: ``[A]`` finite.
        batch_shape: the leading shape of the result (int or tuple; ``()`` gives a 0-d array).

    Returns:
        float64 ``[*batch_shape]`` (nats).

    Raises:
        ValueError: non-finite or non-1-D ``log_std``, or its sum overflows float64; bad
            ``batch_shape``.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,)).astype(np.float64, copy=False)
    shape = as_shape(batch_shape, "batch_shape")
    with np.errstate(over="ignore"):
        entropy = np.sum(ls) + 0.5 * (1.0 + LOG_2PI) * ls.shape[0]
    _finite_result(entropy, "log_std is too large: the entropy sum(log_std) + ...")
    return np.full(shape, entropy)


def gaussian_entropy_backward(log_std, d_entropy) -> np.ndarray:
    """Gradient of ``sum d_entropy * H`` w.r.t. ``log_std``: ``d_log_std_j = sum d_entropy``.

    Args:
        log_std: ``[A]`` finite. d_entropy: any shape (the ``batch_shape``), finite.

    Returns:
        float64 ``d_log_std [A]``.

    Raises:
        ValueError: non-finite or non-1-D ``log_std``, non-finite ``d_entropy`` or one whose
            sum overflows float64.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,))
    d = _as_float64(d_entropy, "d_entropy")
    with np.errstate(over="ignore"):
        total = np.sum(d)
    _finite_result(total, "d_entropy is too large: its sum")
    return np.full(ls.shape, total)


def gaussian_sample(rng: np.random.Generator, mean, log_std) -> np.ndarray:
    """The raw (unclipped) sample ``a = mean + exp(log_std) * eps``, ``eps ~ N(0, I)``.

    ``eps`` is ``rng.standard_normal(mean.shape)`` (C order), drawn after the arguments are
    checked.

    Returns:
        float64 ``[..., A]``.

    Raises:
        ValueError: ``rng`` not a Generator; non-finite ``mean`` or ``log_std`` or mismatched
            shapes; ``exp(log_std)`` overflows float64 (``log_std`` above about 709.78;
            checked before drawing); the sample overflows float64 (``mean`` or
            ``exp(log_std)`` near the float64 limit; detected after drawing).
    """
    check_generator(rng)
    mu, ls = _as_mean_log_std(mean, log_std)
    with np.errstate(over="ignore"):
        sigma = np.exp(ls)
    if not np.isfinite(sigma).all():
        j = int(np.argmin(np.isfinite(sigma)))
        raise ValueError(f"log_std is too large: exp(log_std) overflows float64 at index {j} "
                         f"(log_std {ls[j]})")
    eps = rng.standard_normal(mu.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        sample = mu + sigma * eps
    return _finite_result(sample, "mean or log_std is too large: the sample mean + "
                                  "exp(log_std) * eps")
