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

from ppo_ref._checks import check_count, check_real_scalar

__all__ = ["orthogonal"]


def orthogonal(rng: np.random.Generator, shape: Sequence[int], gain: float = 1.0) -> np.ndarray:
    """A random (semi-)orthogonal matrix scaled by ``gain``, as ``torch.nn.init.orthogonal_``.

    Saxe, McClelland & Ganguli 2014, "Exact solutions to the nonlinear dynamics of learning in
    deep linear neural networks" (arXiv:1312.6120). The procedure is torch's:

    1. ``rows = shape[0]``, ``cols = prod(shape[1:])``; draw ``A ~ N(0, 1)^{rows x cols}``
       from ``rng``;
    2. if ``rows < cols`` transpose ``A`` (so the QR below is of a tall matrix);
    3. ``Q, R = qr(A)`` (reduced), then ``Q <- Q * sign(diag(R))`` column-wise, which makes
       the result Haar-distributed (Mezzadri 2007, arXiv:math-ph/0609050);
    4. transpose back if step 2 transposed; return ``gain * Q`` reshaped to ``shape``.

    The result ``W`` (flattened to ``[rows, cols]``) satisfies ``W W^T = gain^2 I_rows`` when
    ``rows <= cols`` (wide, e.g. a policy head ``[out, in]`` with ``out < in``) and
    ``W^T W = gain^2 I_cols`` when ``rows >= cols`` (tall). A zero diagonal entry of ``R``
    (probability zero) keeps sign +1 here, where torch's ``sign`` would zero the column.
    The values differ from torch's for the same seed (different generators); the
    distribution is the same.

    Args:
        rng: the ``np.random.Generator`` all randomness is drawn from (``rows * cols`` standard
            normal draws, in C order).
        shape: at least two positive dimensions, torch layout ``[out, in, ...]``.
        gain: multiplicative scale (a finite real number; 0 gives a zero matrix).

    Returns:
        float64 ndarray of ``shape``.

    Raises:
        ValueError: ``rng`` is not a Generator, ``shape`` has fewer than two dimensions or a
            dimension that is not an integer >= 1 (a float, bool or string), or ``gain`` is not a finite real number.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}")
    if len(shape) < 2:
        raise ValueError(f"shape must have at least 2 dimensions (torch semantics), got {tuple(shape)}")
    dims = tuple(check_count(d, f"shape[{k}]", 1) for k, d in enumerate(shape))
    g = check_real_scalar(gain, "gain")
    rows, cols = dims[0], math.prod(dims[1:])
    a = rng.standard_normal((rows, cols))
    wide = rows < cols
    if wide:
        a = a.T
    q, r = np.linalg.qr(a)  # reduced: q is [max, min] with orthonormal columns
    signs = np.where(np.diagonal(r) < 0.0, -1.0, 1.0)
    q *= signs  # column j times sign(R_jj)
    if wide:
        q = q.T
    return np.ascontiguousarray(g * q).reshape(dims)
