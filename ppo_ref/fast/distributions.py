"""The compiled twins of :mod:`ppo_ref.spec.distributions`: the categorical (with action masks),
MultiDiscrete and diagonal-Gaussian functions the policy heads call, with the spec's signatures.

Tolerances, ``|fast - spec| <= atol + rtol * max|spec|`` per result array, float64 inputs:

* ``categorical_sample``, ``multi_categorical_sample``: the same actions, bit for bit (the same
  uniforms, one per row and component in the spec's order, and the spec's
  :func:`~ppo_ref.spec.distributions.inverse_cdf_actions` compiled);
* ``categorical_mode``, ``multi_categorical_mode``: the same actions (the spec's ``argmax``);
* ``gaussian_log_prob``, ``gaussian_log_prob_backward``, ``gaussian_entropy``,
  ``gaussian_entropy_backward``, ``gaussian_sample``: bit for bit (the spec's NumPy
  arithmetic, without its checks);
* ``log_softmax``, ``categorical_log_prob``, ``categorical_entropy``,
  ``categorical_log_prob_backward``, ``categorical_entropy_backward`` and the
  ``multi_categorical_*`` log-probabilities, entropies and gradients: rtol 1e-12, atol 1e-15.
  Compiled loops per row (:func:`_row_log_normalizer`): the row maximum, then ``log sum_k
  exp(z_k - max)`` added left to right, with the C library's ``exp`` and ``log``, and ``pi_k =
  exp(z_k - max) / sum``; the spec sums the row pairwise with NumPy's own vectorised
  ``exp``/``log`` and takes ``pi_k = exp(log pi_k)`` (a few ulp).
  The results of a row do not depend on the other rows of the call.

float32: when every float array given is float32, these functions compute in float32 and
return float32 (the samplers draw the spec's float64 uniforms and normals); the tolerance
against the spec (which computes in float64) is then rtol 1e-5, atol 1e-6 (actions: the same
unless a uniform falls within float32 rounding of a CDF step).

Action masks: a ``-inf`` logit has probability 0, log-probability ``-inf``, adds 0 to the
entropy, gets gradient 0 unless it is the differentiated action, and is never sampled or the
mode, as the spec says. The twins do not check their inputs: a row the spec refuses (a NaN or
``+inf`` logit, every action masked, a spread whose shift overflows) raises
``FloatingPointError`` (:func:`ppo_ref._checks.non_finite_result`) from the compiled pass (the
samplers: after drawing), and an action outside ``[0, A)`` a ``ValueError``. Run the spec on
the same inputs to learn which argument is wrong.
"""
from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from ppo_ref._checks import non_finite_result
from ppo_ref._numba import NJIT_OPTIONS, njit
from ppo_ref.spec import distributions as _spec
from ppo_ref.spec.distributions import LOG_2PI

__all__ = [
    "log_softmax", "categorical_log_prob", "categorical_entropy",
    "categorical_log_prob_backward", "categorical_entropy_backward", "categorical_sample",
    "categorical_mode",
    "multi_categorical_log_prob", "multi_categorical_entropy",
    "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
    "multi_categorical_sample", "multi_categorical_mode",
    "gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
    "gaussian_entropy_backward", "gaussian_sample",
]

# the spec's sampling loop and its row check, usable from compiled code (returned unchanged)
register_jitable(**NJIT_OPTIONS)(_spec.logit_row_max)
_inverse_cdf_actions = njit(_spec.inverse_cdf_actions)

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_OK, _BAD_ROW, _BAD_ACTION = 0, 1, 2


def _float(x) -> np.ndarray:
    """``x`` as a float32 or float64 ndarray (other kinds to float64, float16 to float32)."""
    a = np.asarray(x)
    if a.dtype == _F64 or a.dtype == _F32:
        return a
    return a.astype(_F32 if a.dtype == np.float16 else _F64)


def _common(*arrays):
    """The arrays in their common compute dtype: float32 when all are float32, else float64."""
    if all(a.dtype == _F32 for a in arrays):
        return arrays
    return tuple(a.astype(_F64, copy=False) for a in arrays)


def _rows(z: np.ndarray) -> np.ndarray:
    """Logits ``[..., A]`` as a C-contiguous ``[R, A]`` array."""
    return np.ascontiguousarray(z).reshape(-1, z.shape[-1])


def _row_actions(actions, rows: int, upper, where: str) -> np.ndarray:
    """``actions`` as int64 ``[rows]`` (or ``[rows, K]``) indices; ``ValueError`` unless one
    per row (and component). The range is checked in the compiled pass."""
    a = np.asarray(actions)
    if a.dtype != np.int64:
        a = a.astype(np.int64)
    if a.size != rows * upper:
        raise ValueError(f"{where}: actions must have one entry per row"
                         f"{' and component' if upper > 1 else ''}, got shape {a.shape}")
    return a.reshape(-1) if upper == 1 else a.reshape(rows, upper)


def _raise(status: int, where: str):
    if status == _BAD_ACTION:
        raise ValueError(f"{where}: an action is outside [0, number of actions)")
    raise non_finite_result(where)


@register_jitable(**NJIT_OPTIONS)
def _row_log_normalizer(z, i, lo, hi, one, e):
    """``(m, lse, s, ok)`` of the logits ``z[i, lo:hi]``: ``m = max_k z_k``, ``e[k - lo] =
    exp(z_k - m)``, ``s = sum_k e_k`` (added left to right from 0, in ``z``'s dtype) and ``lse
    = log s``, so that ``log pi_k = (z_k - m) - lse`` and ``pi_k = e_k / s``. ``ok`` is False
    for a row the spec refuses: a NaN, ``m`` not finite (``+inf``, or every action masked), or
    a finite logit whose shift ``z_k - m`` overflows. (``exp`` is not called where its value
    is known exactly: ``one`` for a shift of 0, 0 for a masked logit.)"""
    m = z[i, lo]
    for k in range(lo, hi):
        v = z[i, k]
        if v != v:
            return m, m, m, False
        if v > m:
            m = v
    s = m - m  # 0 in z's dtype (nan when m is inf)
    if not (m > -math.inf and m < math.inf):
        return m, s, s, False
    for k in range(lo, hi):
        v = z[i, k]
        shifted = v - m
        if shifted == -math.inf:
            if v != -math.inf:
                return m, s, s, False
            e[k - lo] = s - s
        elif shifted == 0:
            e[k - lo] = one
        else:
            e[k - lo] = math.exp(shifted)
        s += e[k - lo]
    return m, math.log(s), s, True


@njit
def _log_softmax_rows(z, zero, out):
    """``out[i, k] = (z[i, k] - m_i) - lse_i`` (:func:`_row_log_normalizer`; ``zero``: 0 in
    ``z``'s dtype)."""
    e = np.empty(z.shape[1], z.dtype)
    one = math.exp(zero)
    for i in range(z.shape[0]):
        m, lse, _, ok = _row_log_normalizer(z, i, 0, z.shape[1], one, e)
        if not ok:
            return _BAD_ROW
        for k in range(z.shape[1]):
            out[i, k] = (z[i, k] - m) - lse
    return _OK


#: what :func:`_categorical_rows` computes
_LOG_PROB, _ENTROPY, _LOG_PROB_BACKWARD, _ENTROPY_BACKWARD = 0, 1, 2, 3


@njit
def _categorical_rows(mode, z, offsets, actions, d, zero, out):
    """One pass over the rows of the logits ``z [R, A]`` (components ``j``: the slices
    ``offsets[j]:offsets[j+1]``, each normalised by :func:`_row_log_normalizer`), ``log pi_k =
    (z_k - m) - lse`` and ``pi_k = e_k / s`` in each; ``mode``:

    * ``_LOG_PROB``: ``out[i, 0] = sum_j log pi(actions[i, j])`` (``-inf`` when masked);
    * ``_ENTROPY``: ``out[i, 0] = sum_j H_j``, ``H_j = -sum_k pi_k log pi_k`` over the
      unmasked ``k`` (a masked action adds nothing);
    * ``_LOG_PROB_BACKWARD``: ``out[i, k] = d[i] * [k = a_j] - d[i] * pi_k`` (the spec's
      expression: ``d * True = d``, ``d * False = d * 0``);
    * ``_ENTROPY_BACKWARD``: ``out[i, k] = (-d[i] * pi_k) * (log pi_k + H_j)``, ``log pi_k``
      taken as 0 where masked.

    Sums start from ``zero`` (0 in ``z``'s dtype) and run in component and entry order.
    Returns ``_OK``, ``_BAD_ROW`` (a row the spec refuses) or ``_BAD_ACTION``."""
    e = np.empty(z.shape[1], z.dtype)
    one = math.exp(zero)
    for i in range(z.shape[0]):
        total = zero
        for j in range(offsets.size - 1):
            lo = offsets[j]
            hi = offsets[j + 1]
            m, lse, s, ok = _row_log_normalizer(z, i, lo, hi, one, e)
            if not ok:
                return _BAD_ROW
            a = 0
            if mode == _LOG_PROB or mode == _LOG_PROB_BACKWARD:
                a = actions[i, j]
                if a < 0 or a >= hi - lo:
                    return _BAD_ACTION
            if mode == _LOG_PROB:
                total += (z[i, lo + a] - m) - lse
            elif mode == _LOG_PROB_BACKWARD:
                g = d[i]
                for k in range(lo, hi):
                    out[i, k] = (g if k - lo == a else g * zero) - g * (e[k - lo] / s)
            else:
                h = zero
                for k in range(lo, hi):
                    if z[i, k] != -math.inf:
                        h += (e[k - lo] / s) * ((z[i, k] - m) - lse)
                h = -h
                if mode == _ENTROPY:
                    total += h
                else:
                    g = d[i]
                    for k in range(lo, hi):
                        log_p = (z[i, k] - m) - lse if z[i, k] != -math.inf else zero
                        out[i, k] = (-g * (e[k - lo] / s)) * (log_p + h)
        if mode == _LOG_PROB or mode == _ENTROPY:
            out[i, 0] = total
    return _OK


_NO_ACTIONS = np.zeros((0, 0), dtype=np.int64)
_NO_UPSTREAM = {_F32: np.zeros(0, _F32), _F64: np.zeros(0, _F64)}


def _run(mode, z, offsets, actions, d, where: str) -> np.ndarray:
    """:func:`_categorical_rows` over the logits ``z [..., sum(nvec)]``: ``[...]`` for the
    log-probabilities and entropies, ``[..., sum(nvec)]`` for the gradients, in ``z``'s dtype
    (``d``, the upstream gradient, already in it)."""
    z2 = _rows(z)
    rows = z2.shape[0]
    per_row = mode == _LOG_PROB or mode == _ENTROPY
    out = np.empty((rows, 1) if per_row else z2.shape, z.dtype)
    if actions is None:
        actions = _NO_ACTIONS
    else:
        actions = _row_actions(actions, rows, offsets.size - 1, where).reshape(rows, -1)
    if d is None:
        d = _NO_UPSTREAM[z.dtype]
    elif d.size != rows:
        raise ValueError(f"{where}: the upstream gradient must have one entry per row, got "
                         f"shape {d.shape}")
    else:
        d = np.ascontiguousarray(d).reshape(-1)
    status = _categorical_rows(mode, z2, offsets, actions, d, z.dtype.type(0), out)
    if status:
        _raise(status, where)
    return out.reshape(z.shape[:-1] if per_row else z.shape)


_ONE_COMPONENT = {}


def _single(n_actions: int) -> np.ndarray:
    """The component offsets ``[0, A]`` of a plain categorical."""
    offsets = _ONE_COMPONENT.get(n_actions)
    if offsets is None:
        offsets = _ONE_COMPONENT[n_actions] = np.array([0, n_actions], dtype=np.int64)
    return offsets


# --------------------------------------------------------------------------------------------
# categorical

def log_softmax(logits):
    """:func:`ppo_ref.spec.distributions.log_softmax`, compiled; rtol 1e-12, atol 1e-15
    (float32 in, float32 out: module docstring)."""
    z = _float(logits)
    out = np.empty(z.shape, z.dtype)
    status = _log_softmax_rows(_rows(z), z.dtype.type(0), out.reshape(-1, z.shape[-1]))
    if status:
        _raise(status, "ppo_ref.fast.distributions.log_softmax")
    return out


def categorical_log_prob(logits, actions):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob`, compiled; rtol 1e-12, atol
    1e-15 (``-inf`` entries: the same)."""
    z = _float(logits)
    return _run(_LOG_PROB, z, _single(z.shape[-1]), actions, None,
                "ppo_ref.fast.distributions.categorical_log_prob")


def categorical_entropy(logits):
    """:func:`ppo_ref.spec.distributions.categorical_entropy`, compiled; rtol 1e-12, atol
    1e-15."""
    z = _float(logits)
    return _run(_ENTROPY, z, _single(z.shape[-1]), None, None,
                "ppo_ref.fast.distributions.categorical_entropy")


def categorical_log_prob_backward(logits, actions, d_log_probs):
    """:func:`ppo_ref.spec.distributions.categorical_log_prob_backward`, compiled; rtol
    1e-12, atol 1e-15."""
    z, d = _common(_float(logits), _float(d_log_probs))
    return _run(_LOG_PROB_BACKWARD, z, _single(z.shape[-1]), actions, d,
                "ppo_ref.fast.distributions.categorical_log_prob_backward")


def categorical_entropy_backward(logits, d_entropy):
    """:func:`ppo_ref.spec.distributions.categorical_entropy_backward`, compiled; rtol 1e-12,
    atol 1e-15."""
    z, d = _common(_float(logits), _float(d_entropy))
    return _run(_ENTROPY_BACKWARD, z, _single(z.shape[-1]), None, d,
                "ppo_ref.fast.distributions.categorical_entropy_backward")


def categorical_sample(rng, logits):
    """:func:`ppo_ref.spec.distributions.categorical_sample`: the same uniforms
    (``rng.random``, one per row) and the spec's inverse-CDF loop compiled; the same actions,
    bit for bit. A refused row raises ``FloatingPointError`` after the draw."""
    z = _float(logits)
    u = rng.random(z.shape[:-1])
    z2 = _rows(z)
    actions = np.empty(z2.shape[0], dtype=np.int64)
    if not _inverse_cdf_actions(z2, u.reshape(-1), actions):
        raise non_finite_result("ppo_ref.fast.distributions.categorical_sample")
    return actions.reshape(z.shape[:-1])


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
    z = _float(logits)
    offsets = _offsets(nvec)
    if z.ndim == 0 or z.shape[-1] != offsets[-1]:
        raise ValueError(f"{where}: logits must have last dimension sum(nvec) = {offsets[-1]}, "
                         f"got shape {z.shape}")
    return z, offsets


def multi_categorical_log_prob(logits, actions, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_log_prob`, compiled (the components
    summed in order); rtol 1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_log_prob"
    z, offsets = _multi(logits, nvec, where)
    return _run(_LOG_PROB, z, offsets, actions, None, where)


def multi_categorical_entropy(logits, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_entropy`, compiled; rtol 1e-12,
    atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_entropy"
    z, offsets = _multi(logits, nvec, where)
    return _run(_ENTROPY, z, offsets, None, None, where)


def multi_categorical_log_prob_backward(logits, actions, nvec, d_log_probs):
    """:func:`ppo_ref.spec.distributions.multi_categorical_log_prob_backward`, compiled; rtol
    1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_log_prob_backward"
    z, offsets = _multi(logits, nvec, where)
    z, d = _common(z, _float(d_log_probs))
    return _run(_LOG_PROB_BACKWARD, z, offsets, actions, d, where)


def multi_categorical_entropy_backward(logits, nvec, d_entropy):
    """:func:`ppo_ref.spec.distributions.multi_categorical_entropy_backward`, compiled; rtol
    1e-12, atol 1e-15."""
    where = "ppo_ref.fast.distributions.multi_categorical_entropy_backward"
    z, offsets = _multi(logits, nvec, where)
    z, d = _common(z, _float(d_entropy))
    return _run(_ENTROPY_BACKWARD, z, offsets, None, d, where)


def multi_categorical_sample(rng, logits, nvec):
    """:func:`ppo_ref.spec.distributions.multi_categorical_sample`: the same uniforms (one
    per row for component 0, then for component 1, ...) and the spec's loop compiled; the same
    actions, bit for bit."""
    where = "ppo_ref.fast.distributions.multi_categorical_sample"
    z, offsets = _multi(logits, nvec, where)
    z2 = _rows(z)
    k = offsets.size - 1
    u = rng.random((k, z2.shape[0]))  # the spec's draws: component by component
    actions = np.empty((k, z2.shape[0]), dtype=np.int64)
    for j in range(k):
        if not _inverse_cdf_actions(np.ascontiguousarray(z2[:, offsets[j]:offsets[j + 1]]),
                                    u[j], actions[j]):
            raise non_finite_result(where)
    return actions.T.reshape(z.shape[:-1] + (k,))


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
    mu, ls, a = _common(_float(mean), _float(log_std), _float(actions))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        u = (a - mu) / np.exp(ls)
        log_prob = -0.5 * np.sum(u * u, axis=-1) - (np.sum(ls) + 0.5 * LOG_2PI * ls.shape[0])
    return _finite(log_prob, "ppo_ref.fast.distributions.gaussian_log_prob")


def gaussian_log_prob_backward(mean, log_std, actions, d_log_probs):
    """:func:`ppo_ref.spec.distributions.gaussian_log_prob_backward`; bit for bit."""
    where = "ppo_ref.fast.distributions.gaussian_log_prob_backward"
    mu, ls, a, g = _common(_float(mean), _float(log_std), _float(actions), _float(d_log_probs))
    g = g[..., None]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        sigma = np.exp(ls)
        u = (a - mu) / sigma
        d_mean = g * u / sigma
        d_log_std = np.sum((g * (u * u - 1.0)).reshape(-1, ls.shape[0]), axis=0)
    return _finite(d_mean, where), _finite(d_log_std, where)


def gaussian_entropy(log_std, batch_shape):
    """:func:`ppo_ref.spec.distributions.gaussian_entropy`; bit for bit."""
    ls = _float(log_std)
    with np.errstate(over="ignore"):
        entropy = np.sum(ls) + 0.5 * (1.0 + LOG_2PI) * ls.shape[0]
    _finite(entropy, "ppo_ref.fast.distributions.gaussian_entropy")
    return np.full(batch_shape, entropy, dtype=ls.dtype)


def gaussian_entropy_backward(log_std, d_entropy):
    """:func:`ppo_ref.spec.distributions.gaussian_entropy_backward`; bit for bit."""
    ls, d = _common(_float(log_std), _float(d_entropy))
    with np.errstate(over="ignore"):
        total = np.sum(d)
    _finite(total, "ppo_ref.fast.distributions.gaussian_entropy_backward")
    return np.full(ls.shape, total, dtype=ls.dtype)


def gaussian_sample(rng, mean, log_std):
    """:func:`ppo_ref.spec.distributions.gaussian_sample`: the same normals
    (``rng.standard_normal``, float64), bit for bit (float32 inputs: the sum in float32)."""
    mu, ls = _common(_float(mean), _float(log_std))
    with np.errstate(over="ignore", invalid="ignore"):
        sigma = np.exp(ls)
        eps = rng.standard_normal(mu.shape).astype(mu.dtype, copy=False)
        sample = mu + sigma * eps
    return _finite(sample, "ppo_ref.fast.distributions.gaussian_sample")
