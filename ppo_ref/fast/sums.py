"""NumPy's pairwise summation, written out for the compiled tier.

The readable tier sums arrays with NumPy (``np.sum``, ``np.mean``); on a contiguous float64
array NumPy adds in its pairwise order. :func:`pairwise_sum` adds in that order, written here
as a fixed sequence of operations, so the compiled tier's sums (the entropy mean of the loss,
each array's sum of squares in the global gradient norm) are those of the spec wherever NumPy
keeps that order (NumPy 2.4 does), and never depend on the machine, the vector width or the
compiler (no fast-math, no reassociation). ``tests/test_sums.py`` checks it against a Python
oracle of the order documented below, not against NumPy.
"""
from __future__ import annotations

import numpy as np

from ppo_ref._numba import njit

__all__ = ["pairwise_sum", "PAIRWISE_BLOCK"]

#: Up to this many terms are one block (eight partial sums); more are summed in two parts.
PAIRWISE_BLOCK = 128

# room for the pending tasks of pairwise_sum: three per halving, fewer than 63 halvings
_STACK = 192


@njit
def _block_sum(y, squares):
    """One block of :func:`pairwise_sum` (1-D float64, at most :data:`PAIRWISE_BLOCK` terms;
    the term ``i`` is ``y[i]``, or ``y[i] * y[i]`` when ``squares``): fewer than 8 terms added
    left to right to 0.0, else eight partial sums ``a_j`` of the terms ``j, j + 8, ...`` below
    ``n - n % 8`` combined as ``((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7))``,
    then the last ``n % 8`` terms added left to right."""
    size = y.size
    if size < 8:
        s = 0.0
        for i in range(size):
            s += y[i] * y[i] if squares else y[i]
        return s
    if squares:
        a0, a1, a2, a3 = y[0] * y[0], y[1] * y[1], y[2] * y[2], y[3] * y[3]
        a4, a5, a6, a7 = y[4] * y[4], y[5] * y[5], y[6] * y[6], y[7] * y[7]
    else:
        a0, a1, a2, a3, a4, a5, a6, a7 = y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]
    n8 = size - size % 8
    for i in range(8, n8, 8):
        z = y[i:i + 8]  # (constant indices below: no negative-index handling)
        if squares:
            a0 += z[0] * z[0]
            a1 += z[1] * z[1]
            a2 += z[2] * z[2]
            a3 += z[3] * z[3]
            a4 += z[4] * z[4]
            a5 += z[5] * z[5]
            a6 += z[6] * z[6]
            a7 += z[7] * z[7]
        else:
            a0 += z[0]
            a1 += z[1]
            a2 += z[2]
            a3 += z[3]
            a4 += z[4]
            a5 += z[5]
            a6 += z[6]
            a7 += z[7]
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for i in range(n8, size):
        s += y[i] * y[i] if squares else y[i]
    return s


@njit
def pairwise_sum(x, squares):
    """``sum_i t_i`` of a 1-D float64 array in NumPy's pairwise order, with ``t_i = x[i]``, or
    ``t_i = x[i] * x[i]`` (the float64 square) when ``squares`` is True:

    * at most :data:`PAIRWISE_BLOCK` (128) terms: one block (:func:`_block_sum`);
    * more: split at ``h = n // 2 - (n // 2) % 8``; the sum is ``S(first h) + S(last n - h)``,
      each part summed the same way.

    The recursion runs as a loop over a stack of tasks: a range to sum, or (size -1) the
    addition of the two sums on top of the stack of sums; a range of more than 128 terms is
    replaced by "first part, rest, add", so the additions are those of the recursion, in its
    order. A sum that overflows is inf (no warning). The empty sum is 0.0."""
    task_first = np.empty(_STACK, np.int64)
    task_size = np.empty(_STACK, np.int64)
    sums = np.empty(_STACK)
    task_first[0] = 0
    task_size[0] = x.size
    n_tasks = 1
    n_sums = 0
    while n_tasks > 0:
        n_tasks -= 1
        first = task_first[n_tasks]
        size = task_size[n_tasks]
        if size < 0:  # both parts summed: S(first part) + S(rest)
            n_sums -= 1
            sums[n_sums - 1] = sums[n_sums - 1] + sums[n_sums]
        elif size > PAIRWISE_BLOCK:  # pushed in reverse: the first part is summed first
            half = size // 2
            half -= half % 8
            task_first[n_tasks] = first
            task_size[n_tasks] = -1
            task_first[n_tasks + 1] = first + half
            task_size[n_tasks + 1] = size - half
            task_first[n_tasks + 2] = first
            task_size[n_tasks + 2] = half
            n_tasks += 3
        else:
            sums[n_sums] = _block_sum(x[first:first + size], squares)
            n_sums += 1
    return sums[0]
