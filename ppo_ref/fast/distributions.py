"""The compiled twins of :mod:`ppo_ref.spec.distributions` (definitions and equations there).

Each docstring states its tolerance against the spec (float64). Samplers and modes give the
spec's actions (the same draws; its :func:`~ppo_ref.spec.distributions.inverse_cdf_actions`
compiled). The Gaussian and gSDE functions are the spec's NumPy arithmetic without its checks,
except gSDE's products, compiled loops in a fixed order (no BLAS): rtol 1e-12, atol 1e-14. The
categorical functions run one compiled pass over the rows (:func:`_categorical_rows`: the row
sum left to right with the C library's ``exp``/``log``, where the spec sums pairwise): rtol
1e-12, atol 1e-15; the MultiDiscrete ones compose them over the components as the spec does. A
row's results never depend on the other rows of the call.

float32: when every float array given is float32 these compute and return float32 (the samplers
draw the spec's float64 draws), within rtol 1e-5, atol 1e-6 of the spec. A row the spec refuses
(a NaN or ``+inf`` logit, every action masked, an overflow) raises ``FloatingPointError`` from
the compiled pass (the samplers: after drawing), an action outside ``[0, A)`` a ``ValueError``.
"""
from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from ppo_ref._checks import non_finite_result
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.fast.losses import _floats
from ppo_ref.spec import distributions as _spec
from ppo_ref.spec.distributions import GSDE_EPS, LOG_2PI

__all__ = [
    "log_softmax", "categorical_log_prob", "categorical_entropy",
    "categorical_log_prob_backward", "categorical_entropy_backward",
    "categorical_log_prob_entropy", "categorical_log_prob_entropy_backward", "categorical_sample",
    "categorical_mode",
    "multi_categorical_log_prob", "multi_categorical_entropy",
    "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
    "multi_categorical_sample", "multi_categorical_mode",
    "gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
    "gaussian_entropy_backward", "gaussian_sample",
    "gsde_std", "gsde_log_prob", "gsde_log_prob_backward", "gsde_entropy",
    "gsde_entropy_backward", "gsde_exploration_matrices", "gsde_action",
]

# the spec's sampling loop and its row check, usable from compiled code (returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec.logit_row_max)
_inverse_cdf_actions = njit(_spec.inverse_cdf_actions)

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_OK, _BAD_ROW, _BAD_ACTION = 0, 1, 2


def _common(*xs):
    """``xs`` as arrays of their common compute dtype (:func:`ppo_ref.fast.losses._floats`
    first): float32 when all are float32, else float64."""
    arrays = tuple(_floats(x) for x in xs)
    if all(a.dtype == _F32 for a in arrays):
        return arrays
    return tuple(a.astype(_F64, copy=False) for a in arrays)


def _logit_rows(logits):
    """``(z, batch_shape)``: the logits ``[..., A]`` as a C-contiguous float32 or float64
    ``[R, A]`` array, and the shape ``[...]`` of the per-row results (None when ``logits`` is
    already such an ``[R, A]`` array: the results are ``[R]``)."""
    z = _floats(logits)
    if z.ndim == 2 and z.flags.c_contiguous:
        return z, None
    return np.ascontiguousarray(z).reshape(-1, z.shape[-1]), z.shape[:-1]


def _upstream(z, d, where: str):
    """``(z, d)`` in their common compute dtype (:func:`_common`), ``d`` a C-contiguous ``[R]``
    vector; ``ValueError`` unless ``d`` has one entry per row of ``z [R, A]``."""
    if type(d) is not np.ndarray or d.dtype != z.dtype:
        z, d = _common(z, d)
    if d.size != z.shape[0]:
        raise ValueError(f"{where}: the upstream gradient must have one entry per row, got "
                         f"shape {d.shape}")
    if d.ndim != 1 or not d.flags.c_contiguous:
        d = np.ascontiguousarray(d).reshape(-1)
    return z, d


def _row_actions(actions, rows: int, upper, where: str) -> np.ndarray:
    """``actions`` as a C-contiguous int64 vector of ``rows * upper`` indices (row by row,
    ``upper`` components per row); ``ValueError`` unless one per row (and component). The range
    is checked in the compiled pass."""
    a = actions if type(actions) is np.ndarray else np.asarray(actions)
    if a.dtype != _I64:
        a = a.astype(np.int64)
    if a.size != rows * upper:
        raise ValueError(f"{where}: actions must have one entry per row"
                         f"{' and component' if upper > 1 else ''}, got shape {a.shape}")
    if a.ndim != 1 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a).reshape(-1)
    return a


def _raise(status: int, where: str):
    if status == _BAD_ACTION:
        raise ValueError(f"{where}: an action is outside [0, number of actions)")
    raise non_finite_result(where)


@register_jitable(**NJIT_OPTIONS)
def _row_exp_sum(z, i, lo, hi, one, e):
    """``(m, s, ok)`` of the logits ``z[i, lo:hi]``: ``m = max_k z_k``, ``e[k - lo] = exp(z_k -
    m)`` and ``s = sum_k e_k`` (added left to right from 0, in ``z``'s dtype), so that ``pi_k =
    e_k / s`` and ``log pi_k = (z_k - m) - log s``. ``ok`` is False for a row the spec refuses:
    a NaN, ``m`` not finite (``+inf``, or every action masked), or a finite logit whose shift
    ``z_k - m`` overflows. (``exp`` is not called where its value is known exactly: ``one``
    for a shift of 0, 0 for a masked logit.)"""
    m = z[i, lo]
    for k in range(lo, hi):
        v = z[i, k]
        if v != v:
            return m, m, False
        if v > m:
            m = v
    s = m - m  # 0 in z's dtype (nan when m is inf)
    if not (m > -math.inf and m < math.inf):
        return m, s, False
    for k in range(lo, hi):
        v = z[i, k]
        shifted = v - m
        if shifted == -math.inf:
            if v != -math.inf:
                return m, s, False
            e[k - lo] = s - s
        elif shifted == 0:
            e[k - lo] = one
        else:
            e[k - lo] = math.exp(shifted)
        s += e[k - lo]
    return m, s, True


#: what :func:`_categorical_rows` computes: any combination of these flags
_LOG_PROB, _ENTROPY, _D_LOG_PROB, _D_ENTROPY, _LOG_SOFTMAX = 1, 2, 4, 8, 16


@njit
def _categorical_rows(what, z, actions, d_log_probs, d_entropy, values, grads):
    """One pass over the rows ``i`` of the logits ``z [R, A]``: :func:`_row_exp_sum`, ``log
    pi_k = (z_k - m) - log s`` and ``pi_k = e_k / s``, ``a = actions[i]``, ``g =
    d_log_probs[i]``, ``g' = d_entropy[i]``; writes what the flags of ``what`` ask for:

    * ``_LOG_PROB``: ``values[0, i] = log pi(a)`` (``-inf`` when masked);
    * ``_ENTROPY``: ``values[1, i] = H = -sum_k pi_k log pi_k`` over the unmasked ``k``;
    * ``_D_LOG_PROB``: ``grads[i, k] = g * [k = a] - g * pi_k`` (the spec's expression: ``g *
      True = g``, ``g * False = g * 0``);
    * ``_D_ENTROPY``: ``(-g' * pi_k) * (log pi_k + H)``, ``log pi_k`` taken as 0 where masked:
      ``grads[i, k]``, or added to the ``_D_LOG_PROB`` term when both are asked for;
    * ``_LOG_SOFTMAX``: ``grads[i, k] = log pi_k``.

    ``log s`` is taken only when a flag needs it; sums run from 0 in ``z``'s dtype, in entry
    order. Returns ``_OK``, ``_BAD_ROW`` (a row the spec refuses) or ``_BAD_ACTION`` (an action
    outside ``[0, A)``, when ``_LOG_PROB`` or ``_D_LOG_PROB``)."""
    n = z.shape[1]
    if n == 0:  # no action: no distribution (the spec refuses the empty last axis)
        return _BAD_ROW if z.shape[0] else _OK
    e = np.zeros(n, z.dtype)
    zero = e[0]
    one = math.exp(zero)
    with_action = (what & (_LOG_PROB | _D_LOG_PROB)) != 0
    with_lse = (what & (_LOG_PROB | _ENTROPY | _D_ENTROPY | _LOG_SOFTMAX)) != 0
    with_entropy = (what & (_ENTROPY | _D_ENTROPY)) != 0
    for i in range(z.shape[0]):
        m, s, ok = _row_exp_sum(z, i, 0, n, one, e)
        if not ok:
            return _BAD_ROW
        lse = math.log(s) if with_lse else zero
        a = 0
        if with_action:
            a = actions[i]
            if a < 0 or a >= n:
                return _BAD_ACTION
        if what & _LOG_PROB:
            values[0, i] = (z[i, a] - m) - lse
        h = zero
        if with_entropy:
            for k in range(n):
                if z[i, k] != -math.inf:
                    h += (e[k] / s) * ((z[i, k] - m) - lse)
            h = -h
            if what & _ENTROPY:
                values[1, i] = h
        if what & _D_LOG_PROB:
            g = d_log_probs[i]
            for k in range(n):
                grads[i, k] = (g if k == a else g * zero) - g * (e[k] / s)
        if what & _D_ENTROPY:
            g = d_entropy[i]
            for k in range(n):
                log_p = (z[i, k] - m) - lse if z[i, k] != -math.inf else zero
                term = (-g * (e[k] / s)) * (log_p + h)
                if what & _D_LOG_PROB:
                    grads[i, k] += term
                else:
                    grads[i, k] = term
        if what & _LOG_SOFTMAX:
            for k in range(n):
                grads[i, k] = (z[i, k] - m) - lse
    return _OK


#: placeholders for the arrays a call of :func:`_categorical_rows` does not read or write
_NONE_1D = {_F32: np.zeros(0, _F32), _F64: np.zeros(0, _F64), _I64: np.zeros(0, _I64)}
_NONE_2D = {_F32: np.zeros((0, 0), _F32), _F64: np.zeros((0, 0), _F64)}


def _run(what, z, actions, d_log_probs, d_entropy, where: str):
    """:func:`_categorical_rows` over ``z [R, A]`` (checked ``actions`` and upstream gradients,
    or None); returns ``(values [2, R], grads [R, A])``, each None when not asked for."""
    dtype = z.dtype
    values = np.empty((2, z.shape[0]), dtype) if what & (_LOG_PROB | _ENTROPY) else None
    grads = (np.empty(z.shape, dtype) if what & (_D_LOG_PROB | _D_ENTROPY | _LOG_SOFTMAX)
             else None)
    none = _NONE_1D[dtype]
    status = _categorical_rows(
        what, z, _NONE_1D[_I64] if actions is None else actions,
        none if d_log_probs is None else d_log_probs, none if d_entropy is None else d_entropy,
        _NONE_2D[dtype] if values is None else values, _NONE_2D[dtype] if grads is None else grads)
    if status:
        _raise(status, where)
    return values, grads


def _per_row(x, batch_shape):
    """A per-row result ``[R]`` in the batch shape of the logits (unchanged when None)."""
    return x if batch_shape is None else x.reshape(batch_shape)


def _like_logits(grads, batch_shape):
    """A gradient ``[R, A]`` in the shape of the logits (unchanged when None)."""
    return grads if batch_shape is None else grads.reshape(batch_shape + grads.shape[-1:])


# --------------------------------------------------------------------------------------------
# categorical

def log_softmax(logits):
    """:func:`ppo_ref.spec.distributions.log_softmax`, compiled; rtol 1e-12, atol 1e-15
    (float32 in, float32 out: module docstring)."""
    z, batch = _logit_rows(logits)
    _, out = _run(_LOG_SOFTMAX, z, None, None, None,
                  "ppo_ref.fast.distributions.log_softmax")
    return _like_logits(out, batch)


def categorical_log_prob(logits, actions):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob`, compiled; rtol 1e-12, atol
    1e-15 (``-inf`` entries: the same)."""
    where = "ppo_ref.fast.distributions.categorical_log_prob"
    z, batch = _logit_rows(logits)
    values, _ = _run(_LOG_PROB, z, _row_actions(actions, z.shape[0], 1, where), None, None,
                     where)
    return _per_row(values[0], batch)


def categorical_entropy(logits):
    """:func:`ppo_ref.spec.distributions.categorical_entropy`, compiled; rtol 1e-12, atol
    1e-15."""
    z, batch = _logit_rows(logits)
    values, _ = _run(_ENTROPY, z, None, None, None,
                     "ppo_ref.fast.distributions.categorical_entropy")
    return _per_row(values[1], batch)


def categorical_log_prob_backward(logits, actions, d_log_probs):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob_backward`, compiled; rtol
    1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.categorical_log_prob_backward"
    z, batch = _logit_rows(logits)
    z, d = _upstream(z, d_log_probs, where)
    _, grads = _run(_D_LOG_PROB, z, _row_actions(actions, z.shape[0], 1, where), d, None, where)
    return _like_logits(grads, batch)


def categorical_entropy_backward(logits, d_entropy):
    """:func:`ppo_ref.spec.distributions.categorical_entropy_backward`, compiled; rtol 1e-12,
    atol 1e-15."""
    where = "ppo_ref.fast.distributions.categorical_entropy_backward"
    z, batch = _logit_rows(logits)
    z, d = _upstream(z, d_entropy, where)
    _, grads = _run(_D_ENTROPY, z, None, None, d, where)
    return _like_logits(grads, batch)


def categorical_log_prob_entropy(logits, actions):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob_entropy`, one compiled pass for
    both (the bits of :func:`categorical_log_prob` and :func:`categorical_entropy` here); rtol
    1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.categorical_log_prob_entropy"
    z, batch = _logit_rows(logits)
    values, _ = _run(_LOG_PROB | _ENTROPY, z, _row_actions(actions, z.shape[0], 1, where), None,
                     None, where)
    return _per_row(values[0], batch), _per_row(values[1], batch)


def categorical_log_prob_entropy_backward(logits, actions, d_log_probs, d_entropy):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob_entropy_backward`, one compiled
    pass (each entry the sum of the two gradients :func:`categorical_log_prob_backward` and
    :func:`categorical_entropy_backward` give here); rtol 1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.categorical_log_prob_entropy_backward"
    z, batch = _logit_rows(logits)
    z, d = _upstream(z, d_log_probs, where)
    what = _D_LOG_PROB
    if d_entropy is not None:
        z, d_ent = _upstream(z, d_entropy, where)
        if d.dtype != z.dtype:  # (d_entropy float64 with the rest float32)
            d = d.astype(z.dtype)
        what |= _D_ENTROPY
    else:
        d_ent = None
    _, grads = _run(what, z, _row_actions(actions, z.shape[0], 1, where), d, d_ent, where)
    return _like_logits(grads, batch)


def categorical_sample(rng, logits):
    """:func:`ppo_ref.spec.distributions.categorical_sample`: the same uniforms
    (``rng.random``, one per row in C order) and the spec's inverse-CDF loop compiled; the same
    actions, bit for bit. A refused row raises ``FloatingPointError`` after the draw."""
    z, batch = _logit_rows(logits)
    u = rng.random(z.shape[0])
    actions = np.empty(z.shape[0], dtype=np.int64)
    if not _inverse_cdf_actions(z, u, actions):
        raise non_finite_result("ppo_ref.fast.distributions.categorical_sample")
    return _per_row(actions, batch)


def categorical_mode(logits):
    """:func:`ppo_ref.spec.distributions.categorical_mode` (the spec's ``argmax``, unchecked);
    the same actions."""
    return np.argmax(np.asarray(logits), axis=-1).astype(np.int64)


# --------------------------------------------------------------------------------------------
# MultiDiscrete: independent categoricals over consecutive slices of the logits

_OFFSETS = {}


def _offsets(nvec) -> np.ndarray:
    """``[0, nvec[0], nvec[0] + nvec[1], ...]`` as int64 (cached per ``nvec``)."""
    key = tuple(int(n) for n in nvec)
    offsets = _OFFSETS.get(key)
    if offsets is None:
        offsets = _OFFSETS[key] = np.concatenate([[0], np.cumsum(key)]).astype(np.int64)
    return offsets


def _multi(logits, nvec, where):
    """``(components, batch_shape)``: the logits ``[..., sum(nvec)]`` as one C-contiguous ``[R,
    nvec[j]]`` array per component ``j`` (:func:`_logit_rows`, :func:`_offsets`);
    ``ValueError`` unless the last dimension is ``sum(nvec)``."""
    offsets = _offsets(nvec)
    z, batch = _logit_rows(logits)
    if z.shape[1] != offsets[-1]:
        raise ValueError(f"{where}: logits must have last dimension sum(nvec) = {offsets[-1]}, "
                         f"got shape {np.shape(logits)}")
    return [np.ascontiguousarray(z[:, offsets[j]:offsets[j + 1]])
            for j in range(offsets.size - 1)], batch


def _component_actions(actions, rows: int, k: int, where: str):
    """The actions ``[..., K]`` as ``K`` C-contiguous int64 vectors ``[R]``, one per
    component."""
    a = _row_actions(actions, rows, k, where).reshape(rows, k)
    return [np.ascontiguousarray(a[:, j]) for j in range(k)]


def multi_categorical_log_prob(logits, actions, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_log_prob`, compiled: the spec's sum
    over the components (in order) of this module's categorical log-probabilities; rtol
    1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_log_prob"
    parts, batch = _multi(logits, nvec, where)
    rows = parts[0].shape[0]
    total = np.zeros(rows, parts[0].dtype)
    for z, a in zip(parts, _component_actions(actions, rows, len(parts), where)):
        total = total + _run(_LOG_PROB, z, a, None, None, where)[0][0]
    return _per_row(total, batch)


def multi_categorical_entropy(logits, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_entropy`: the spec's sum over the
    components of this module's categorical entropies; rtol 1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_entropy"
    parts, batch = _multi(logits, nvec, where)
    total = np.zeros(parts[0].shape[0], parts[0].dtype)
    for z in parts:
        total = total + _run(_ENTROPY, z, None, None, None, where)[0][1]
    return _per_row(total, batch)


def multi_categorical_log_prob_backward(logits, actions, nvec, d_log_probs):
    """:func:`ppo_ref.spec.distributions.multi_categorical_log_prob_backward`: the components'
    categorical gradients side by side, as the spec; rtol 1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_log_prob_backward"
    parts, batch = _multi(logits, nvec, where)
    rows = parts[0].shape[0]
    grads = []
    for z, a in zip(parts, _component_actions(actions, rows, len(parts), where)):
        z, d = _upstream(z, d_log_probs, where)
        grads.append(_run(_D_LOG_PROB, z, a, d, None, where)[1])
    return _like_logits(np.concatenate(grads, axis=-1), batch)


def multi_categorical_entropy_backward(logits, nvec, d_entropy):
    """:func:`ppo_ref.spec.distributions.multi_categorical_entropy_backward`: the components'
    categorical gradients side by side, as the spec; rtol 1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_entropy_backward"
    parts, batch = _multi(logits, nvec, where)
    grads = []
    for z in parts:
        z, d = _upstream(z, d_entropy, where)
        grads.append(_run(_D_ENTROPY, z, None, None, d, where)[1])
    return _like_logits(np.concatenate(grads, axis=-1), batch)


def multi_categorical_sample(rng, logits, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_sample`: the same uniforms (one
    per row for component 0, then for component 1, ...) and the spec's loop compiled; the same
    actions, bit for bit."""
    where = "ppo_ref.fast.distributions.multi_categorical_sample"
    parts, batch = _multi(logits, nvec, where)
    k, rows = len(parts), parts[0].shape[0]
    u = rng.random((k, rows))  # the spec's draws: component by component
    actions = np.empty((k, rows), dtype=np.int64)
    for j, z in enumerate(parts):
        if not _inverse_cdf_actions(z, u[j], actions[j]):
            raise non_finite_result(where)
    return actions.T.reshape(np.shape(logits)[:-1] + (k,))


def multi_categorical_mode(logits, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_mode` (the spec's ``argmax`` per
    component, unchecked); the same actions."""
    z = np.asarray(logits)
    offsets = _offsets(nvec)
    return np.stack([np.argmax(z[..., offsets[j]:offsets[j + 1]], axis=-1)
                     for j in range(offsets.size - 1)], axis=-1).astype(np.int64)


# --------------------------------------------------------------------------------------------
# diagonal Gaussian: the spec's NumPy arithmetic, unchecked, in the inputs' common dtype

def _finite(x, where: str):
    if not np.isfinite(x).all():
        raise non_finite_result(where)
    return x


def gaussian_log_prob(mean, log_std, actions):
    """:func:`ppo_ref.spec.distributions.gaussian_log_prob`; bit for bit (float32 in, float32
    out)."""
    mu, ls, a = _common(mean, log_std, actions)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        u = (a - mu) / np.exp(ls)
        log_prob = -0.5 * np.sum(u * u, axis=-1) - (np.sum(ls) + 0.5 * LOG_2PI * ls.shape[0])
    return _finite(log_prob, "ppo_ref.fast.distributions.gaussian_log_prob")


def gaussian_log_prob_backward(mean, log_std, actions, d_log_probs):
    """:func:`ppo_ref.spec.distributions.gaussian_log_prob_backward`; bit for bit."""
    where = "ppo_ref.fast.distributions.gaussian_log_prob_backward"
    mu, ls, a, g = _common(mean, log_std, actions, d_log_probs)
    g = g[..., None]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        sigma = np.exp(ls)
        u = (a - mu) / sigma
        d_mean = g * u / sigma
        d_log_std = np.sum((g * (u * u - 1.0)).reshape(-1, ls.shape[0]), axis=0)
    return _finite(d_mean, where), _finite(d_log_std, where)


def gaussian_entropy(log_std, batch_shape):
    """:func:`ppo_ref.spec.distributions.gaussian_entropy`; bit for bit."""
    ls = _floats(log_std)
    with np.errstate(over="ignore"):
        entropy = np.sum(ls) + 0.5 * (1.0 + LOG_2PI) * ls.shape[0]
    _finite(entropy, "ppo_ref.fast.distributions.gaussian_entropy")
    return np.full(batch_shape, entropy, dtype=ls.dtype)


def gaussian_entropy_backward(log_std, d_entropy):
    """:func:`ppo_ref.spec.distributions.gaussian_entropy_backward`; bit for bit."""
    ls, d = _common(log_std, d_entropy)
    with np.errstate(over="ignore"):
        total = np.sum(d)
    _finite(total, "ppo_ref.fast.distributions.gaussian_entropy_backward")
    return np.full(ls.shape, total, dtype=ls.dtype)


def gaussian_sample(rng, mean, log_std):
    """:func:`ppo_ref.spec.distributions.gaussian_sample`: the same normals
    (``rng.standard_normal``, float64), bit for bit (float32 inputs: the sum in float32)."""
    mu, ls = _common(mean, log_std)
    with np.errstate(over="ignore", invalid="ignore"):
        sigma = np.exp(ls)
        eps = rng.standard_normal(mu.shape).astype(mu.dtype, copy=False)
        sample = mu + sigma * eps
    return _finite(sample, "ppo_ref.fast.distributions.gaussian_sample")


# --------------------------------------------------------------------------------------------
# gSDE: the spec's NumPy arithmetic, unchecked, in the inputs' common dtype; the variance a
# compiled row loop

def _expln(theta, use_expln: bool):
    """:func:`ppo_ref.spec.distributions.gsde_std`'s arithmetic and ``d sigma / d theta``."""
    with np.errstate(over="ignore"):
        sigma = np.exp(theta)
    if not use_expln:
        return sigma, sigma
    above = theta > 0
    zero = theta.dtype.type(0.0)
    positive = np.where(above, theta, zero)
    sigma = np.where(above, np.log1p(positive + GSDE_EPS) + 1.0, sigma).astype(theta.dtype)
    slope = np.where(above, 1.0 / (1.0 + positive + GSDE_EPS), sigma).astype(theta.dtype)
    return sigma, slope


@njit
def _gsde_variance(phi, sigma, action_dim, eps):
    """``var [B, A]``: ``var[b, j] = (sum_i phi[b, i]^2 sigma[i, j']^2, from 0 in feature
    order) + eps`` (``j' = 0`` when ``sigma`` is ``[L, 1]``); False when a value is not
    finite."""
    rows, n = phi.shape
    var = np.empty((rows, action_dim), phi.dtype)
    col = sigma.shape[1] != 1
    zero = np.zeros(1, phi.dtype)[0]
    ok = True
    for b in range(rows):
        for j in range(action_dim):
            jj = j if col else 0
            v = zero
            for i in range(n):
                p = phi[b, i] * phi[b, i]
                s = sigma[i, jj] * sigma[i, jj]
                v += p * s
            v += eps
            var[b, j] = v
            ok = ok and np.isfinite(v)
    return var, ok


def _variance(phi, sigma, action_dim: int, where: str):
    var, ok = _gsde_variance(np.ascontiguousarray(phi), np.ascontiguousarray(sigma),
                             int(action_dim), phi.dtype.type(GSDE_EPS))
    if not ok:
        raise non_finite_result(where)
    return var


@njit
def _gsde_variance_grads(phi, sigma, d_var):
    """``(d sigma^2 [L, A or 1], d_features [B, L])`` of ``sum d_var * var``: the spec's
    ``_gsde_variance_backward`` products, summed from 0 in row then action order (no BLAS)."""
    rows, n = phi.shape
    a_dim, cols = d_var.shape[1], sigma.shape[1]
    zero = np.zeros(1, phi.dtype)[0]
    d_sigma2 = np.zeros((n, cols), phi.dtype)
    d_features = np.empty((rows, n), phi.dtype)
    for b in range(rows):
        for i in range(n):
            p = phi[b, i] * phi[b, i]
            acc = zero
            for j in range(a_dim):
                jj = j if cols != 1 else 0
                d_sigma2[i, jj] += p * d_var[b, j]
                acc += d_var[b, j] * (sigma[i, jj] * sigma[i, jj])
            d_features[b, i] = (phi[b, i] + phi[b, i]) * acc
    return d_sigma2, d_features


@njit
def _gsde_noise(phi, exploration_matrices):
    """``phi_b @ E_b`` per row ``[B, A]``, summed from 0 in feature order (no BLAS)."""
    rows, n = phi.shape
    a_dim = exploration_matrices.shape[2]
    zero = np.zeros(1, phi.dtype)[0]
    noise = np.empty((rows, a_dim), phi.dtype)
    for b in range(rows):
        for j in range(a_dim):
            acc = zero
            for i in range(n):
                acc += phi[b, i] * exploration_matrices[b, i, j]
            noise[b, j] = acc
    return noise


def _variance_backward(theta, sigma, slope, phi, d_var, where: str):
    """The spec's ``_gsde_variance_backward``: its products by :func:`_gsde_variance_grads`."""
    d_sigma2, d_features = _gsde_variance_grads(np.ascontiguousarray(phi),
                                                np.ascontiguousarray(sigma),
                                                np.ascontiguousarray(d_var))
    with np.errstate(over="ignore", invalid="ignore"):
        d_log_std = d_sigma2 * 2.0 * sigma * slope
    return _finite(d_log_std, where), _finite(d_features, where)


def gsde_std(log_std, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_std`; bit for bit (float32 in, float32 out)."""
    sigma, _ = _expln(_floats(log_std), bool(use_expln))
    return _finite(sigma, "ppo_ref.fast.distributions.gsde_std")


def gsde_log_prob(mean, log_std, features, actions, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_log_prob`; rtol 1e-12, atol 1e-14 (module
    docstring)."""
    where = "ppo_ref.fast.distributions.gsde_log_prob"
    mu, theta, phi, a = _common(mean, log_std, features, actions)
    sigma, _ = _expln(theta, bool(use_expln))
    var = _variance(phi, sigma, mu.shape[1], where)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a - mu
        log_prob = -0.5 * np.sum(diff * diff / var + np.log(var) + LOG_2PI, axis=-1)
    return _finite(log_prob, where)


def gsde_log_prob_backward(mean, log_std, features, actions, d_log_probs, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_log_prob_backward`; rtol 1e-12, atol 1e-14."""
    where = "ppo_ref.fast.distributions.gsde_log_prob_backward"
    mu, theta, phi, a, g = _common(mean, log_std, features, actions, d_log_probs)
    sigma, slope = _expln(theta, bool(use_expln))
    var = _variance(phi, sigma, mu.shape[1], where)
    g = g[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a - mu
        d_mean = g * diff / var
        d_var = g * ((diff * diff / var - 1.0) / (2.0 * var))
    d_log_std, d_features = _variance_backward(theta, sigma, slope, phi, _finite(d_var, where),
                                               where)
    return _finite(d_mean, where), d_log_std, d_features


def gsde_entropy(log_std, features, action_dim, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_entropy`; rtol 1e-12, atol 1e-14."""
    where = "ppo_ref.fast.distributions.gsde_entropy"
    theta, phi = _common(log_std, features)
    sigma, _ = _expln(theta, bool(use_expln))
    var = _variance(phi, sigma, action_dim, where)
    return 0.5 * np.sum(1.0 + LOG_2PI + np.log(var), axis=-1)


def gsde_entropy_backward(log_std, features, action_dim, d_entropy, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_entropy_backward`; rtol 1e-12, atol 1e-14."""
    where = "ppo_ref.fast.distributions.gsde_entropy_backward"
    theta, phi, d = _common(log_std, features, d_entropy)
    sigma, slope = _expln(theta, bool(use_expln))
    var = _variance(phi, sigma, action_dim, where)
    return _variance_backward(theta, sigma, slope, phi, d[:, None] / (2.0 * var), where)


def gsde_exploration_matrices(rng, log_std, n_envs, action_dim, use_expln=False):
    """:func:`ppo_ref.spec.distributions.gsde_exploration_matrices`: the same normals
    (``rng.standard_normal``, float64), bit for bit (float32 ``log_std``: the product in
    float32)."""
    sigma, _ = _expln(_floats(log_std), bool(use_expln))
    sigma = np.broadcast_to(sigma, (sigma.shape[0], int(action_dim)))
    eps = rng.standard_normal((int(n_envs),) + sigma.shape).astype(sigma.dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        matrices = sigma * eps
    return _finite(matrices, "ppo_ref.fast.distributions.gsde_exploration_matrices")


def gsde_action(mean, features, exploration_matrices):
    """:func:`ppo_ref.spec.distributions.gsde_action`; rtol 1e-12, atol 1e-14 (module
    docstring)."""
    mu, phi, e = _common(mean, features, exploration_matrices)
    noise = _gsde_noise(np.ascontiguousarray(phi), np.ascontiguousarray(e))
    with np.errstate(over="ignore", invalid="ignore"):
        action = mu + noise
    return _finite(action, "ppo_ref.fast.distributions.gsde_action")
