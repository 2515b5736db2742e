"""Parameter initialisation: orthogonal matrices with a gain.

PPO implementations (OpenAI baselines, Stable-Baselines3, CleanRL) initialise every weight
matrix orthogonally and every bias to zero, with gain sqrt(2) for hidden layers, 0.01 for the
policy head and 1.0 for the value head (Huang et al. 2022, "The 37 Implementation Details of
PPO", detail 2). Here that is :func:`orthogonal`; the gains are chosen by the callers
(:mod:`ppo_ref.nn.mlp`, :mod:`ppo_ref.nn.actor_critic`, :mod:`ppo_ref.nn.lstm`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ppo_ref._checks import check_real_scalar
from ppo_ref._numba import njit

__all__ = ["orthogonal"]


def orthogonal(rng: np.random.Generator, shape: Sequence[int], gain: float = 1.0) -> np.ndarray:
    """A random (semi-)orthogonal matrix scaled by ``gain``, as ``torch.nn.init.orthogonal_``.

    Saxe, McClelland & Ganguli 2014, "Exact solutions to the nonlinear dynamics of learning in
    deep linear neural networks" (arXiv:1312.6120). The procedure is torch's:

    1. ``rows = shape[0]``, ``cols = prod(shape[1:])``; draw ``A ~ N(0, 1)^{rows x cols}``
       from ``rng``;
    2. if ``rows < cols`` transpose ``A`` (so the QR below is of a tall matrix);
    3. ``Q, R = qr(A)`` (reduced, by :func:`_householder_qr`), then ``Q <- Q * sign(diag(R))``
       column-wise, which makes the result Haar-distributed (Mezzadri 2007,
       arXiv:math-ph/0609050);
    4. transpose back if step 2 transposed; return ``gain * Q`` reshaped to ``shape``.

    The result ``W`` (flattened to ``[rows, cols]``) satisfies ``W W^T = gain^2 I_rows`` when
    ``rows <= cols`` (wide, e.g. a policy head ``[out, in]`` with ``out < in``) and
    ``W^T W = gain^2 I_cols`` when ``rows >= cols`` (tall). A zero diagonal entry of ``R``
    (probability zero) keeps sign +1 here, where torch's ``sign`` would zero the column.
    The values differ from torch's for the same seed (different generators); the
    distribution is the same. The QR is this module's own, in a fixed order of operations (not
    LAPACK's, whose rounding depends on the BLAS kernel chosen for the CPU), so the same seed
    gives the same bits on every machine; it equals ``numpy.linalg.qr``'s ``Q`` (after the sign
    correction) to rounding.

    Args:
        rng: the ``np.random.Generator`` all randomness is drawn from (``rows * cols`` standard
            normal draws, in C order).
        shape: at least two positive dimensions, torch layout ``[out, in, ...]``.
        gain: multiplicative scale (a finite real number; 0 gives a zero matrix).

    Returns:
        float64 ndarray of ``shape``.

    Raises:
        ValueError: ``rng`` is not a Generator, ``shape`` has fewer than two dimensions or a
            non-positive dimension, or ``gain`` is not a finite real number.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}") from None
    if len(dims) < 2:
        raise ValueError(f"shape must have at least 2 dimensions (torch semantics), got {dims}")
    if any(d <= 0 for d in dims):
        raise ValueError(f"shape must have positive dimensions, got {dims}")
    g = check_real_scalar(gain, "gain")
    rows, cols = dims[0], math.prod(dims[1:])
    a = rng.standard_normal((rows, cols))
    wide = rows < cols
    if wide:
        a = a.T
    q = np.empty(a.shape)
    r_diag = np.empty(a.shape[1])
    _householder_qr(np.ascontiguousarray(a), q, r_diag)  # q [max, min]: orthonormal columns
    signs = np.where(r_diag < 0.0, -1.0, 1.0)
    q *= signs  # column j times sign(R_jj)
    if wide:
        q = q.T
    return np.ascontiguousarray(g * q).reshape(dims)


@njit
def _householder_qr(a, q, r_diag):
    """Reduced QR of a tall ``a [m, n]`` (m >= n) by Householder reflections (Golub & Van Loan,
    "Matrix Computations", 4th ed., Alg. 5.2.1, with LAPACK's sign choice): writes
    ``q [m, n]`` with orthonormal columns and ``r_diag [n]``, the diagonal of ``R``
    (``a = q R``). ``a`` is not modified.

    Column k: ``x = R[k:, k]``, ``alpha = -sign(x_0) ||x||`` (+ for x_0 = 0 taken as +),
    ``v = x - alpha e_1``; every column j >= k of ``R[k:, :]`` becomes ``R_j - (2 v.R_j / v.v) v``
    and ``R_kk = alpha``; ``q`` = the reflections applied to ``I[:, :n]`` in reverse order.
    Every sum runs over its index in increasing order, one rounded multiplication and one
    rounded addition per term (no fused multiply-add, no reassociation), so the result is
    the same on every IEEE 754 machine."""
    m, n = a.shape
    r = a.copy()
    vs = np.zeros((m, n))
    vv = np.zeros(n)
    for k in range(n):
        ss = 0.0
        for i in range(k, m):
            ss += r[i, k] * r[i, k]
        norm = np.sqrt(ss)
        alpha = -norm if r[k, k] >= 0.0 else norm
        for i in range(k, m):
            vs[i, k] = r[i, k]
        vs[k, k] -= alpha
        vn = 0.0
        for i in range(k, m):
            vn += vs[i, k] * vs[i, k]
        vv[k] = vn
        r_diag[k] = alpha
        if vn == 0.0:  # x = 0 (probability zero): no reflection
            r_diag[k] = 0.0
            continue
        for j in range(k + 1, n):
            s = 0.0
            for i in range(k, m):
                s += vs[i, k] * r[i, j]
            f = 2.0 * s / vn
            for i in range(k, m):
                r[i, j] -= f * vs[i, k]
    for i in range(m):
        for j in range(n):
            q[i, j] = 1.0 if i == j else 0.0
    for k in range(n - 1, -1, -1):
        vn = vv[k]
        if vn == 0.0:
            continue
        for j in range(n):
            s = 0.0
            for i in range(k, m):
                s += vs[i, k] * q[i, j]
            f = 2.0 * s / vn
            for i in range(k, m):
                q[i, j] -= f * vs[i, k]
