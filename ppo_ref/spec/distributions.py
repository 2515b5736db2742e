"""Action distributions of the PPO policy head: log-probabilities, entropies, their gradients,
sampling and modes, in float64 (actions int64; nats, summed over action dimensions).

Categorical from logits ``z [..., A]`` (``torch.distributions.Categorical(logits=z)``); a logit
of ``-inf`` masks an action (probability exactly 0, log-probability ``-inf``, entropy term 0,
gradient 0 unless it is the differentiated action, never sampled or the mode: sb3-contrib
MaskablePPO's rule, exactly). NaN or ``+inf`` logits and fully masked rows raise ``ValueError``.
MultiDiscrete (``gymnasium.spaces.MultiDiscrete(nvec)``, SB3 ``MultiCategoricalDistribution``):
independent categoricals over consecutive slices of ``z [..., sum(nvec)]``, actions ``[...,
len(nvec)]``. Diagonal Gaussian with a state-independent ``log_std [A]`` (SB3
``DiagGaussianDistribution``, CleanRL ``ppo_continuous_action.py``); the action is the raw,
unclipped sample. Generalized state-dependent exploration (gSDE; Raffin, Kober & Stulp 2021,
"Smooth Exploration for Robotic Reinforcement Learning", arXiv:2005.05719; SB3
``StateDependentNoiseDistribution`` without squashing): the ``gsde_*`` functions.
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
    "gsde_std", "gsde_log_prob", "gsde_log_prob_backward", "gsde_entropy",
    "gsde_entropy_backward", "gsde_exploration_matrices", "gsde_action",
]

LOG_2PI = math.log(2.0 * math.pi)
#: gSDE's epsilon: added to the variance, and to ``theta`` inside ``log1p`` of ``expln``
#: (SB3 ``StateDependentNoiseDistribution(epsilon=1e-6)``)
GSDE_EPS = 1e-6


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


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = np.max(z, axis=-1, keepdims=True)
    s = z - m
    return s - np.log(np.sum(np.exp(s), axis=-1, keepdims=True))


def log_softmax(logits) -> np.ndarray:
    """Numerically stable log-softmax over the last axis::

        m = max_k z_k,    s = z - m,    log pi = s - log sum_k exp(s_k)

    The largest ``exp`` is exactly 1 and the sum lies in ``[1, A]``: no overflow, no ``log 0``.
    ``logits``: ``[..., A]`` real, ``-inf`` allowed (gives ``-inf``). Returns float64 of its
    shape. Raises ``ValueError`` for NaN or ``+inf`` logits, a row with every action ``-inf``,
    a finite logit so far below its row's maximum that ``z - m`` overflows float64, a scalar or
    an empty last axis.
    """
    return _log_softmax(_as_logits(logits))


def _zero_where_masked(log_pi: np.ndarray) -> np.ndarray:
    """``log pi`` with ``-inf`` (masked) entries set to 0, so that ``pi * log pi = 0`` there."""
    return np.where(log_pi == -np.inf, 0.0, log_pi)


def categorical_log_prob(logits, actions) -> np.ndarray:
    """``log pi(a) = log_softmax(z)[..., a]`` for each row's action ``a``.

    ``logits``: ``[..., A]`` as :func:`log_softmax`; ``actions``: integers ``[...]`` in
    ``[0, A)`` (integral floats accepted). Returns float64 ``[...]`` (``-inf`` for a masked
    action). Raises ``ValueError`` as :func:`log_softmax`, or for ``actions`` of the wrong
    shape, non-integral or out of range.
    """
    z = _as_logits(logits)
    a = as_index_array(actions, "actions", z.shape[:-1], "logits[..., 0]", z.shape[-1])
    log_pi = _log_softmax(z)
    return np.take_along_axis(log_pi, a[..., None], axis=-1)[..., 0]


def categorical_entropy(logits) -> np.ndarray:
    """``H = -sum_k pi(k) log pi(k)`` of each row; masked actions add 0.

    Returns float64 ``[...]`` in ``[0, log(number of unmasked actions)]``. Raises
    ``ValueError`` as :func:`log_softmax`.
    """
    log_pi = _log_softmax(_as_logits(logits))
    pi = np.exp(log_pi)  # exactly 0 where masked
    return -np.sum(pi * _zero_where_masked(log_pi), axis=-1)


def categorical_log_prob_backward(logits, actions, d_log_probs) -> np.ndarray:
    """Gradient in the logits of ``sum d_log_probs * log pi(actions)``::

        d_logits[..., k] = d_log_probs * ([k = a] - pi(k))

    ``d_log_probs``: finite ``[...]``. Returns float64 ``[..., A]``. Raises ``ValueError`` as
    :func:`categorical_log_prob`, or for ``d_log_probs`` of the wrong shape or non-finite.
    """
    z = _as_logits(logits)
    d = as_upstream(d_log_probs, "d_log_probs", z.shape[:-1], "logits[..., 0]")
    a = as_index_array(actions, "actions", z.shape[:-1], "logits[..., 0]", z.shape[-1])
    pi = np.exp(_log_softmax(z))
    one_hot = np.arange(z.shape[-1]) == a[..., None]
    return d[..., None] * one_hot - d[..., None] * pi


def categorical_entropy_backward(logits, d_entropy) -> np.ndarray:
    """Gradient in the logits of ``sum d_entropy * H``::

        d_logits[..., k] = -d_entropy * pi(k) * (log pi(k) + H)

    (0 for masked actions). ``d_entropy``: finite ``[...]``. Returns float64 ``[..., A]``.
    Raises ``ValueError`` as :func:`log_softmax`, or for ``d_entropy`` of the wrong shape or
    non-finite.
    """
    z = _as_logits(logits)
    d = as_upstream(d_entropy, "d_entropy", z.shape[:-1], "logits[..., 0]")
    log_pi = _log_softmax(z)
    pi = np.exp(log_pi)  # exactly 0 where masked
    log_pi = _zero_where_masked(log_pi)  # so pi * log_pi and the result are 0 there
    entropy = -np.sum(pi * log_pi, axis=-1, keepdims=True)
    return -d[..., None] * pi * (log_pi + entropy)


def categorical_log_prob_entropy(logits, actions) -> Tuple[np.ndarray, np.ndarray]:
    """``(categorical_log_prob(logits, actions), categorical_entropy(logits))`` in one call.
    Raises ``ValueError`` as :func:`categorical_log_prob`."""
    return categorical_log_prob(logits, actions), categorical_entropy(logits)


def categorical_log_prob_entropy_backward(logits, actions, d_log_probs, d_entropy) -> np.ndarray:
    """:func:`categorical_log_prob_backward` plus :func:`categorical_entropy_backward`
    (``d_entropy`` None: the first alone). Returns float64 ``d_logits [..., A]``; raises
    ``ValueError`` as those two."""
    d_logits = categorical_log_prob_backward(logits, actions, d_log_probs)
    if d_entropy is None:
        return d_logits
    return d_logits + categorical_entropy_backward(logits, d_entropy)


def logit_row_max(z, i):
    """``m = max_k z[i, k]`` of row ``i`` of the logits ``z [R, A]`` (float64, or float32
    widened entry by entry) when :func:`log_softmax` accepts the row, else NaN (a NaN or
    ``+inf``, every action masked, or a shift ``z[i, k] - m`` that overflows float64)."""
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


def inverse_cdf_actions(z, u, actions):
    """The inverse-CDF action of each row (compiled as it stands by
    :func:`ppo_ref.fast.distributions.categorical_sample`). For logits ``z [R, A]`` (float64, or
    float32 widened entry by entry) and uniforms ``u [R]`` in ``[0, 1)``, writes int64
    ``actions [R]``::

        m    = max_k z_k
        lse  = log(exp(z_0 - m) + ... + exp(z_{A-1} - m))       (sum left to right)
        pi_k = exp((z_k - m) - lse)
        C_k  = pi_0 + ... + pi_k                                (left to right)
        a    = #{k : C_k <= u * C_{A-1}}                        (the first k with C_k > u C_{A-1})

    A masked action has ``C_k = C_{k-1}`` and is never that ``k``; if rounding gives a count of
    ``A``, the last action with ``pi_k > 0`` is written. Returns False (and stops) at the first
    row :func:`logit_row_max` refuses, else True.
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
    """One action per row: after the logits are checked, one ``u ~ U[0, 1)`` per row
    (``rng.random``, C order) and :func:`inverse_cdf_actions`. A refused call draws nothing.

    ``rng``: ``np.random.Generator``, the only source of randomness; ``logits`` as
    :func:`log_softmax`. Returns int64 ``[...]`` in ``[0, A)`` (0-d for one ``[A]`` row).
    Raises ``ValueError`` for ``rng`` not a Generator, or as :func:`log_softmax`.
    """
    check_generator(rng)
    z = _as_logits(logits)
    u = rng.random(z.shape[:-1])
    z2 = np.ascontiguousarray(z.reshape(-1, z.shape[-1]))
    actions = np.empty(z2.shape[0], dtype=np.int64)
    inverse_cdf_actions(z2, u.reshape(-1), actions)
    return actions.reshape(z.shape[:-1])


def categorical_mode(logits) -> np.ndarray:
    """The most probable action of each row, ``argmax_k z_k`` (the first on ties; never a
    masked one). Returns int64 ``[...]``; raises ``ValueError`` as :func:`log_softmax`."""
    z = _as_logits(logits)
    return np.argmax(z, axis=-1).astype(np.int64)


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
    check_last_dim(z, "logits", sum(sizes))
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
    """``log pi(a) = sum_j log pi_j(a_j)`` with :func:`categorical_log_prob` of each component.

    Args:
        logits: ``[..., sum(nvec)]``; each component as :func:`log_softmax` (masks allowed).
        actions: integers ``[..., len(nvec)]``, ``actions[..., j]`` in ``[0, nvec[j])``.
        nvec: the number of actions of each component (positive ints).

    Returns float64 ``[...]`` (``-inf`` if a component's action is masked). Raises
    ``ValueError`` for a bad ``nvec``, ``logits`` whose last dimension is not ``sum(nvec)`` or
    with a bad component, or bad ``actions``.
    """
    z, sizes, slices = multi_components(logits, nvec)
    a = multi_actions(actions, z, sizes)
    total = np.zeros(z.shape[:-1])
    for j, s in enumerate(slices):
        total = total + categorical_log_prob(z[..., s], a[..., j])
    return total


def multi_categorical_entropy(logits, nvec: Sequence[int]) -> np.ndarray:
    """``H = sum_j H_j``: float64 ``[...]``. Raises ``ValueError`` as
    :func:`multi_categorical_log_prob`."""
    z, _, slices = multi_components(logits, nvec)
    total = np.zeros(z.shape[:-1])
    for s in slices:
        total = total + categorical_entropy(z[..., s])
    return total


def multi_categorical_log_prob_backward(logits, actions, nvec: Sequence[int],
                                        d_log_probs) -> np.ndarray:
    """Gradient in the logits of ``sum d_log_probs * log pi(actions)``: on each component's
    slice, :func:`categorical_log_prob_backward` with the same ``d_log_probs``. Returns float64
    ``[..., sum(nvec)]``; raises ``ValueError`` as :func:`multi_categorical_log_prob`, or for
    ``d_log_probs`` of the wrong shape or non-finite."""
    z, sizes, slices = multi_components(logits, nvec)
    a = multi_actions(actions, z, sizes)
    d = as_upstream(d_log_probs, "d_log_probs", z.shape[:-1], "logits[..., 0]")
    return np.concatenate([categorical_log_prob_backward(z[..., s], a[..., j], d)
                           for j, s in enumerate(slices)], axis=-1)


def multi_categorical_entropy_backward(logits, nvec: Sequence[int], d_entropy) -> np.ndarray:
    """Gradient in the logits of ``sum d_entropy * H``: on each component's slice,
    :func:`categorical_entropy_backward` with the same ``d_entropy``. Returns float64
    ``[..., sum(nvec)]``; raises ``ValueError`` as :func:`multi_categorical_log_prob_backward`
    (naming ``d_entropy``)."""
    z, _, slices = multi_components(logits, nvec)
    d = as_upstream(d_entropy, "d_entropy", z.shape[:-1], "logits[..., 0]")
    return np.concatenate([categorical_entropy_backward(z[..., s], d) for s in slices], axis=-1)


def multi_categorical_sample(rng: np.random.Generator, logits, nvec: Sequence[int]) -> np.ndarray:
    """:func:`categorical_sample` of component 0, then 1, ... (one uniform per row each: SB3's
    order), after every argument is checked. Returns int64 ``[..., len(nvec)]``; raises
    ``ValueError`` for ``rng`` not a Generator or as :func:`multi_categorical_log_prob`."""
    check_generator(rng)
    z, _, slices = multi_components(logits, nvec)
    return np.stack([categorical_sample(rng, z[..., s]) for s in slices], axis=-1)


def multi_categorical_mode(logits, nvec: Sequence[int]) -> np.ndarray:
    """:func:`categorical_mode` of each component: int64 ``[..., len(nvec)]``. Raises
    ``ValueError`` as :func:`multi_categorical_log_prob`."""
    z, _, slices = multi_components(logits, nvec)
    return np.stack([categorical_mode(z[..., s]) for s in slices], axis=-1)


def _as_mean_log_std(mean, log_std) -> Tuple[np.ndarray, np.ndarray]:
    mu = _as_float64(mean, "mean")
    if mu.ndim == 0:
        raise ValueError("mean must have at least 1 dimension [..., action_dim], got a scalar")
    ls = _as_float64(log_std, "log_std")
    check_same_shape(ls, "log_std", mu.shape[-1:], "mean's last axis (state-independent, "
                     "one per action dimension)")
    return mu, ls


def _standardized(mu: np.ndarray, ls: np.ndarray, actions) -> Tuple[np.ndarray, np.ndarray]:
    """``(sigma, u) = (exp(log_std), (a - mean) / sigma)``; ``ValueError`` naming ``actions``
    if ``a - mean`` overflows float64, ``log_std`` if ``u^2`` does (or is 0/0)."""
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
    if not np.isfinite(x).all():
        raise ValueError(f"{what} overflows float64")
    return x


def gaussian_log_prob(mean, log_std, actions) -> np.ndarray:
    """``log N(a; mean, diag(sigma^2))`` summed over the action dimensions::

        sigma = exp(log_std),    u = (a - mean) / sigma
        log pi(a) = -1/2 sum_j u_j^2 - (sum_j log_std_j + A/2 log(2 pi))

    ``mean``: ``[..., A]``, ``log_std``: ``[A]``, ``actions``: ``[..., A]`` (raw), all finite.
    Returns float64 ``[...]``. Raises ``ValueError`` for non-finite input, mismatched shapes,
    or an overflow (naming ``actions`` when ``actions - mean`` overflows, ``log_std`` when
    ``u^2`` or the sums do, e.g. ``log_std = -800``).
    """
    mu, ls = _as_mean_log_std(mean, log_std)
    sigma, u = _standardized(mu, ls, actions)
    with np.errstate(over="ignore", invalid="ignore"):
        log_prob = -0.5 * np.sum(u * u, axis=-1) - (np.sum(ls) + 0.5 * LOG_2PI * ls.shape[0])
    return _finite_result(log_prob, "log_std or actions - mean is too large: the log-density")


def gaussian_log_prob_backward(mean, log_std, actions, d_log_probs
                               ) -> Tuple[np.ndarray, np.ndarray]:
    """Gradients of ``sum g * gaussian_log_prob`` (``g = d_log_probs``, finite ``[...]``)::

        d_mean    = g * u / sigma                  [..., A]
        d_log_std = sum_rows g * (u^2 - 1)         [A]   (log_std is shared by every row)

    Returns float64 ``(d_mean, d_log_std)``. Raises ``ValueError`` as
    :func:`gaussian_log_prob`, for a bad ``d_log_probs``, or a gradient that overflows.
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

    ``log_std``: finite ``[A]``; ``batch_shape``: int or tuple (``()``: 0-d). Returns float64
    ``[*batch_shape]``. Raises ``ValueError`` for a bad ``log_std`` (or a sum that overflows)
    or ``batch_shape``.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,)).astype(np.float64, copy=False)
    shape = as_shape(batch_shape, "batch_shape")
    with np.errstate(over="ignore"):
        entropy = np.sum(ls) + 0.5 * (1.0 + LOG_2PI) * ls.shape[0]
    _finite_result(entropy, "log_std is too large: the entropy sum(log_std) + ...")
    return np.full(shape, entropy)


def gaussian_entropy_backward(log_std, d_entropy) -> np.ndarray:
    """Gradient of ``sum d_entropy * H`` in ``log_std``: ``d_log_std_j = sum d_entropy``.

    ``d_entropy``: finite, any shape. Returns float64 ``[A]``. Raises ``ValueError`` for a bad
    ``log_std``, non-finite ``d_entropy`` or a sum that overflows.
    """
    ls = as_float_array(log_std, "log_std", ndim=(1,))
    d = _as_float64(d_entropy, "d_entropy")
    with np.errstate(over="ignore"):
        total = np.sum(d)
    _finite_result(total, "d_entropy is too large: its sum")
    return np.full(ls.shape, total)


def gaussian_sample(rng: np.random.Generator, mean, log_std) -> np.ndarray:
    """The raw sample ``a = mean + exp(log_std) * eps``, ``eps = rng.standard_normal(mean.shape)``
    drawn after the arguments are checked. Returns float64 ``[..., A]``.

    Raises ``ValueError`` for ``rng`` not a Generator, non-finite or mismatched ``mean`` /
    ``log_std``, ``exp(log_std)`` overflowing (``log_std`` above about 709.78; before drawing),
    or a sample that overflows (after drawing).
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


# --------------------------------------------------------------------------------------------
# gSDE: generalized state-dependent exploration
#
# Notation (SB3's parametrization of arXiv:2005.05719, whose features ``z_mu(s)`` and
# exploration parameters ``theta_eps`` are ``phi`` and ``E`` here): ``phi(s) [L]`` are the
# latent features (the policy tower's last hidden activation), ``theta [L, A]`` (``full_std``)
# or ``[L, 1]`` (one parameter per feature, shared by the A action dimensions: SB3
# ``full_std=False``) the trained ``log_std``, ``sigma = std(theta)`` the standard deviations
# of the entries of the exploration matrix ``E ~ N(0, sigma^2) [L, A]``. Given ``s`` and ``E``
# the action is ``a = mu(s) + phi(s) @ E``; over ``E`` it is Gaussian with independent
# dimensions of variance ``var_j(s) = sum_i phi_i(s)^2 sigma_ij^2`` (+ ``GSDE_EPS``).

def gsde_std(log_std, use_expln: bool = False) -> np.ndarray:
    """The standard deviations ``sigma`` of the exploration matrix's entries from ``log_std``
    (``theta``), entry by entry::

        sigma = exp(theta)                                          (use_expln False)
        sigma = exp(theta)                   where theta <= 0       (use_expln True: "expln",
                log1p(theta + GSDE_EPS) + 1  where theta > 0         logarithmic above 0)

    ``log_std``: finite ``[L, A]`` or ``[L, 1]``. Returns float64 of its shape. Raises
    ``ValueError`` for a ``log_std`` that is not a finite 2-D array or whose ``exp`` overflows
    float64. Source: SB3 ``StateDependentNoiseDistribution.get_std`` (expln: the paper).
    """
    theta = as_float_array(log_std, "log_std", ndim=(2,)).astype(np.float64, copy=False)
    return _gsde_std(theta, bool(use_expln))


def _gsde_std(theta: np.ndarray, use_expln: bool) -> np.ndarray:
    with np.errstate(over="ignore"):
        sigma = np.exp(theta)
    if use_expln:
        above = theta > 0.0
        sigma = np.where(above, np.log1p(np.where(above, theta, 0.0) + GSDE_EPS) + 1.0, sigma)
    if not np.isfinite(sigma).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(sigma))[0])
        raise ValueError(f"log_std is too large: exp(log_std) overflows float64 at index "
                         f"{where} (log_std {theta[where]})")
    return sigma


def _gsde_std_derivative(theta: np.ndarray, sigma: np.ndarray, use_expln: bool) -> np.ndarray:
    """``d sigma / d theta``: ``sigma`` (exp), or ``1 / (1 + theta + GSDE_EPS)`` where expln
    takes the log branch."""
    if not use_expln:
        return sigma
    return np.where(theta > 0.0, 1.0 / (1.0 + np.where(theta > 0.0, theta, 0.0) + GSDE_EPS),
                    sigma)


def _gsde_log_std(log_std, action_dim: int) -> Tuple[np.ndarray, int]:
    """Checked ``(theta [L, A or 1], A)``."""
    theta = as_float_array(log_std, "log_std", ndim=(2,)).astype(np.float64, copy=False)
    a_dim = check_positive_int(action_dim, "action_dim")
    if theta.shape[1] not in (a_dim, 1):
        raise ValueError(f"log_std must have shape [L, {a_dim}] (full_std) or [L, 1], got "
                         f"{theta.shape}")
    return theta, a_dim


def _gsde_inputs(log_std, features, action_dim: int
                 ) -> Tuple[np.ndarray, np.ndarray, int]:
    """Checked ``(theta [L, A or 1], phi [B, L], A)``."""
    theta, a_dim = _gsde_log_std(log_std, action_dim)
    phi = as_float_array(features, "features", ndim=(2,)).astype(np.float64, copy=False)
    if phi.shape[1] != theta.shape[0]:
        raise ValueError(f"features must have shape [batch, L] with L = log_std.shape[0] = "
                         f"{theta.shape[0]}, got {phi.shape}")
    return theta, phi, a_dim


def _gsde_variance(phi: np.ndarray, sigma: np.ndarray, a_dim: int) -> np.ndarray:
    """``var [B, A] = phi^2 @ sigma^2 + GSDE_EPS`` (columns repeated when ``sigma`` is
    ``[L, 1]``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        var = (phi * phi) @ (sigma * sigma) + GSDE_EPS
    _finite_result(var, "features or log_std are too large: the variance phi^2 @ sigma^2")
    return np.broadcast_to(var, (phi.shape[0], a_dim))


def _gsde_mean(mean) -> np.ndarray:
    mu = as_float_array(mean, "mean", ndim=(2,)).astype(np.float64, copy=False)
    if mu.shape[1] == 0:
        raise ValueError(f"mean must have shape [batch, action_dim >= 1], got {mu.shape}")
    return mu


def _gsde_actions(mu: np.ndarray, actions, batch: int) -> np.ndarray:
    """Checked ``actions`` of ``mean``'s shape, ``mean`` with one row per row of features."""
    check_same_shape(mu, "mean", (batch, mu.shape[1]), "[batch of features, action_dim]")
    a = _as_float64(actions, "actions")
    check_same_shape(a, "actions", mu.shape, "mean")
    return a


def _gsde_variance_backward(theta, sigma, phi, d_var, use_expln: bool
                            ) -> Tuple[np.ndarray, np.ndarray]:
    """``(d_log_std, d_features)`` of ``sum d_var * var`` (``d_var [B, A]``): the chain rule
    stated in :func:`gsde_log_prob_backward`."""
    with np.errstate(over="ignore", invalid="ignore"):
        d_sigma2 = (phi * phi).T @ d_var
        if theta.shape[1] == 1:
            d_sigma2 = np.sum(d_sigma2, axis=1, keepdims=True)
        d_log_std = d_sigma2 * 2.0 * sigma * _gsde_std_derivative(theta, sigma, use_expln)
        sigma2 = np.broadcast_to(sigma * sigma, (sigma.shape[0], d_var.shape[1]))
        d_features = 2.0 * phi * (d_var @ sigma2.T)
    what = "the gradient overflows float64 (inputs or upstream gradients too large):"
    return (_finite_result(d_log_std, what + " d_log_std"),
            _finite_result(d_features, what + " d_features"))


def gsde_log_prob(mean, log_std, features, actions, use_expln: bool = False) -> np.ndarray:
    """``log N(a; mean, diag(var))`` of gSDE's action distribution, summed over dimensions::

        sigma    = gsde_std(theta, use_expln)
        var_bj   = sum_i phi_bi^2 sigma_ij^2 + GSDE_EPS       (sigma_i0 for every j if [L, 1])
        log pi(a_b | s_b) = -1/2 sum_j [(a_bj - mean_bj)^2 / var_bj + log var_bj + log(2 pi)]

    Args:
        mean: finite ``[B, A]``, the mean action ``mu(s)`` (the policy tower's output).
        log_std: finite ``[L, A]`` (full_std) or ``[L, 1]``.
        features: finite ``[B, L]``, the latent features ``phi(s)``.
        actions: finite ``[B, A]``, raw (unclipped) actions.
        use_expln: as :func:`gsde_std`.

    Returns float64 ``[B]``. Raises ``ValueError`` for non-finite input, mismatched shapes or a
    result that overflows. Source: the paper (the variance of the noise ``theta_eps z_mu(s)``); SB3
    ``StateDependentNoiseDistribution.proba_distribution`` and ``log_prob`` (which add
    ``GSDE_EPS`` to the variance).
    """
    mu = _gsde_mean(mean)
    theta, phi, a_dim = _gsde_inputs(log_std, features, mu.shape[1])
    a = _gsde_actions(mu, actions, phi.shape[0])
    var = _gsde_variance(phi, _gsde_std(theta, bool(use_expln)), a_dim)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a - mu
        log_prob = -0.5 * np.sum(diff * diff / var + np.log(var) + LOG_2PI, axis=-1)
    return _finite_result(log_prob, "actions - mean is too large: the log-density")


def gsde_log_prob_backward(mean, log_std, features, actions, d_log_probs,
                           use_expln: bool = False
                           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of ``sum_b g_b log pi(a_b | s_b)`` (:func:`gsde_log_prob`, ``g =
    d_log_probs`` finite ``[B]``)::

        d_mean_bj = g_b (a_bj - mean_bj) / var_bj
        d_var_bj  = g_b (((a_bj - mean_bj)^2 / var_bj - 1) / (2 var_bj))

    then ``(d_log_std, d_features)`` from ``d_var`` by the chain rule through ``var = phi^2 @
    sigma^2 + eps`` and :func:`gsde_std`::

        d_log_std_ij  = 2 sigma_ij dsigma_ij/dtheta_ij sum_b phi_bi^2 d_var_bj
                        (dsigma/dtheta = sigma, or 1 / (1 + theta + eps) on expln's log branch;
                        summed over j when ``log_std`` is ``[L, 1]``)
        d_features_bi = 2 phi_bi sum_j d_var_bj sigma_ij^2

    Returns float64 ``(d_mean [B, A], d_log_std`` of ``log_std``'s shape``, d_features [B,
    L])``. SB3's PPO does not propagate ``d_features`` (``learn_features=False``). Raises
    ``ValueError`` as :func:`gsde_log_prob`, for a bad ``d_log_probs`` or a gradient that
    overflows.
    """
    mu = _gsde_mean(mean)
    theta, phi, a_dim = _gsde_inputs(log_std, features, mu.shape[1])
    a = _gsde_actions(mu, actions, phi.shape[0])
    g = as_upstream(d_log_probs, "d_log_probs", (phi.shape[0],), "features[:, 0]")[:, None]
    sigma = _gsde_std(theta, bool(use_expln))
    var = _gsde_variance(phi, sigma, a_dim)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a - mu
        d_mean = g * diff / var
        d_var = g * ((diff * diff / var - 1.0) / (2.0 * var))
    _finite_result(d_var, "actions - mean is too large: the gradient")
    d_log_std, d_features = _gsde_variance_backward(theta, sigma, phi, d_var, bool(use_expln))
    return _finite_result(d_mean, "the gradient d_mean"), d_log_std, d_features


def gsde_entropy(log_std, features, action_dim: int, use_expln: bool = False) -> np.ndarray:
    """The entropy of gSDE's action distribution at each state::

        H_b = sum_j 1/2 (1 + log(2 pi) + log var_bj)      (var as :func:`gsde_log_prob`)

    ``log_std``: finite ``[L, A]`` or ``[L, 1]``; ``features``: finite ``[B, L]``;
    ``action_dim``: A. Returns float64 ``[B]``. Raises ``ValueError`` for non-finite input or
    mismatched shapes. Source: SB3 ``StateDependentNoiseDistribution.entropy`` (the Normal's
    entropy summed over dimensions).
    """
    theta, phi, a_dim = _gsde_inputs(log_std, features, action_dim)
    var = _gsde_variance(phi, _gsde_std(theta, bool(use_expln)), a_dim)
    return 0.5 * np.sum(1.0 + LOG_2PI + np.log(var), axis=-1)


def gsde_entropy_backward(log_std, features, action_dim: int, d_entropy,
                          use_expln: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Gradients of ``sum_b d_entropy_b H_b`` (:func:`gsde_entropy`): ``d_var_bj = d_entropy_b
    / (2 var_bj)``, then ``(d_log_std, d_features)`` as :func:`gsde_log_prob_backward`.
    ``d_entropy``: finite ``[B]``. Returns float64 ``(d_log_std, d_features [B, L])``; raises
    ``ValueError`` as :func:`gsde_entropy` or for a bad ``d_entropy``."""
    theta, phi, a_dim = _gsde_inputs(log_std, features, action_dim)
    d = as_upstream(d_entropy, "d_entropy", (phi.shape[0],), "features[:, 0]")[:, None]
    sigma = _gsde_std(theta, bool(use_expln))
    var = _gsde_variance(phi, sigma, a_dim)
    return _gsde_variance_backward(theta, sigma, phi, d / (2.0 * var), bool(use_expln))


def gsde_exploration_matrices(rng: np.random.Generator, log_std, n_envs: int, action_dim: int,
                              use_expln: bool = False) -> np.ndarray:
    """One exploration matrix per env, ``E_n = sigma * eps_n``, ``eps = rng.standard_normal((
    n_envs, L, A))`` drawn after the arguments are checked (``sigma`` of :func:`gsde_std`,
    its columns repeated when ``[L, 1]``): each entry ``E_nij ~ N(0, sigma_ij^2)``.

    Returns float64 ``[n_envs, L, A]``. Raises ``ValueError`` for ``rng`` not a Generator, a
    bad ``log_std`` (as :func:`gsde_std`), or ``n_envs``/``action_dim`` not positive ints or
    not matching ``log_std``. Source: SB3 ``StateDependentNoiseDistribution.sample_weights``
    (``exploration_matrices``; its separate single ``exploration_mat`` is not kept).
    """
    check_generator(rng)
    n = check_positive_int(n_envs, "n_envs")
    theta, a_dim = _gsde_log_std(log_std, action_dim)
    sigma = np.broadcast_to(_gsde_std(theta, bool(use_expln)), (theta.shape[0], a_dim))
    eps = rng.standard_normal((n, theta.shape[0], a_dim))
    return _finite_result(sigma * eps, "log_std is too large: the exploration matrices")


def gsde_action(mean, features, exploration_matrices) -> np.ndarray:
    """The noisy action of each row with its own matrix::

        a_b = mean_b + phi_b @ E_b

    ``mean``: finite ``[B, A]``; ``features``: finite ``[B, L]``; ``exploration_matrices``:
    finite ``[B, L, A]`` (:func:`gsde_exploration_matrices`; row ``b`` is env ``b``). Returns
    float64 ``[B, A]`` (raw, unclipped). Raises ``ValueError`` for non-finite input, mismatched
    shapes or a result that overflows. Source: the paper (``a = mu(s) + eps(s; theta_eps)``,
    ``eps(s; theta_eps) = theta_eps z_mu(s)``); SB3 ``StateDependentNoiseDistribution.get_noise``
    and ``sample``.
    """
    mu = _gsde_mean(mean)
    phi = as_float_array(features, "features", ndim=(2,)).astype(np.float64, copy=False)
    e = as_float_array(exploration_matrices, "exploration_matrices",
                       ndim=(3,)).astype(np.float64, copy=False)
    check_same_shape(e, "exploration_matrices", (mu.shape[0], phi.shape[1], mu.shape[1]),
                     "[batch of mean, L of features, A of mean]")
    check_same_shape(phi, "features", (mu.shape[0], e.shape[1]), "[batch of mean, L]")
    with np.errstate(over="ignore", invalid="ignore"):
        action = mu + np.matmul(phi[:, None, :], e)[:, 0, :]
    return _finite_result(action, "mean, features or exploration_matrices are too large: the "
                                  "action")
