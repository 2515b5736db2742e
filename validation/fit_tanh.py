"""Derive the constants of the compiled tier's tanh (``ppo_ref.fast.lstm._tanh``, ``_tanh_f32``).

The compiled tanh reduces ``a = k ln2/2 + w`` (``|w| <= ln2/4``) and evaluates ``tanh(w) = w +
w^3 P(w^2)`` (see its docstring). This script recomputes, in 60-digit arithmetic (mpmath):

* ``2/ln2`` and the split ``ln2/2 = HI + LO`` (HI the double nearest ``ln2/2``, LO the double
  nearest the rest; float32 likewise);
* ``P`` by a Remez exchange: the polynomial in ``t = w^2`` of the given number of coefficients
  that minimizes the largest relative error of ``w + w^3 P(w^2)`` against ``tanh(w)`` on
  ``0 < w <= 0.1733`` (just above ``ln2/4``): 6 coefficients for float64, 3 for float32;
* the largest relative error of that polynomial once its coefficients are rounded to the
  working precision, evaluated in 60 digits at 3000 points of the interval.

It prints them next to the module's constants and exits 1 if a rounded coefficient or split
differs from the module's or an error exceeds the bound the module states. Needs ``mpmath`` (``pip install mpmath``); takes a few seconds.

Usage::

    python validation/fit_tanh.py
"""
from __future__ import annotations

import sys

import mpmath as mp
import numpy as np

from ppo_ref.fast import lstm

mp.mp.dps = 60
INTERVAL = mp.mpf("0.1733")   # |w| <= ln2/4 = 0.17329..., with a little margin
# the polynomials' relative errors with rounded coefficients that ppo_ref/fast/lstm.py states
BOUND_F64 = 4.8e-18
BOUND_F32 = 2.4e-10


def relative_error(coefs, w):
    """``(w + w^3 P(w^2)) / tanh(w) - 1`` for the polynomial with coefficients ``coefs``
    (constant term first), in working precision."""
    t = w * w
    p = sum(c * t ** j for j, c in enumerate(coefs))
    return (w + w ** 3 * p) / mp.tanh(w) - 1


def remez(n_coefs: int, iterations: int = 30):
    """The minimax coefficients (constant term first) and the levelled error ``E`` of the
    Remez exchange for ``tanh(w) ~ w + w^3 P(w^2)``, relative error, on ``0 < w <= INTERVAL``.

    In ``t = w^2`` the error is ``sum_j c_j phi_j(t) - F(t)`` with ``phi_j(t) = w^3 t^j /
    tanh(w)`` and ``F(t) = (tanh(w) - w) / tanh(w)``; each step solves for coefficients whose
    error alternates ``+-E`` on ``n_coefs + 1`` reference points, then moves the references to
    the error's extrema (a grid search refined by ternary search)."""
    top = INTERVAL ** 2
    n = n_coefs + 1

    def phi(j, t):
        w = mp.sqrt(t)
        return w ** 3 * t ** j / mp.tanh(w)

    def target(t):
        w = mp.sqrt(t)
        return (mp.tanh(w) - w) / mp.tanh(w)

    ref = [top * (1 - mp.cos(mp.pi * (i + mp.mpf(0.5)) / n)) / 2 for i in range(n)]
    ref[-1] = top
    coefs, level = None, None
    for _ in range(iterations):
        matrix, rhs = mp.matrix(n, n), mp.matrix(n, 1)
        for i, t in enumerate(ref):
            for j in range(n_coefs):
                matrix[i, j] = phi(j, t)
            matrix[i, n_coefs] = (-1) ** i
            rhs[i] = target(t)
        sol = mp.lu_solve(matrix, rhs)
        coefs, level = [sol[j] for j in range(n_coefs)], sol[n_coefs]

        def err(t):
            return sum(coefs[j] * phi(j, t) for j in range(n_coefs)) - target(t)

        grid_n = 2000
        grid = [top * mp.mpf(i) / grid_n for i in range(1, grid_n + 1)]
        vals = [err(t) for t in grid]
        extrema = []
        for i, v in enumerate(vals):
            left = vals[i - 1] if i > 0 else mp.mpf(0)
            right = vals[i + 1] if i + 1 < len(vals) else None
            if abs(v) >= abs(left) and (right is None or abs(v) >= abs(right)):
                extrema.append((grid[i], v))
        alternating = []   # consecutive extrema of one sign: keep the larger
        for t, v in extrema:
            if alternating and mp.sign(alternating[-1][1]) == mp.sign(v):
                if abs(v) > abs(alternating[-1][1]):
                    alternating[-1] = (t, v)
            else:
                alternating.append((t, v))
        while len(alternating) > n:   # drop the smaller end
            alternating.pop(0 if abs(alternating[0][1]) < abs(alternating[-1][1]) else -1)
        if len(alternating) < n:
            raise RuntimeError(f"Remez: {len(alternating)} alternating extrema, need {n}")
        step = top / grid_n
        new_ref = []
        for t, _ in alternating:
            lo, hi = max(t - step, step / 100), min(t + step, top)
            for _ in range(40):
                m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
                if abs(err(m1)) < abs(err(m2)):
                    lo = m1
                else:
                    hi = m2
            new_ref.append((lo + hi) / 2)
        ref = new_ref
        largest = max(abs(err(t)) for t in ref)
        if abs(largest - abs(level)) / abs(level) < 1e-6:
            break
    return coefs, level


def rounded_error(coefs, to_float) -> mp.mpf:
    """Largest relative error on 3000 points of ``(0, INTERVAL]`` with the coefficients rounded
    by ``to_float``, the polynomial evaluated in 60 digits."""
    rounded = [mp.mpf(float(to_float(float(c)))) for c in coefs]
    return max(abs(relative_error(rounded, INTERVAL * i / 3000)) for i in range(1, 3001))


def main() -> int:
    ln2 = mp.log(2)
    f32 = np.float32
    hi = float(ln2 / 2)
    lo = float(ln2 / 2 - mp.mpf(hi))
    hi32 = f32(float(ln2 / 2))
    lo32 = f32(float(ln2 / 2 - mp.mpf(float(hi32))))
    c64, e64 = remez(6)
    c32, e32 = remez(3)
    derived = {
        "_TWO_OVER_LN2": float(2 / ln2), "_HALF_LN2_HI": hi, "_HALF_LN2_LO": lo,
        "_TANH_P": tuple(float(c) for c in c64),
        "_TWO_OVER_LN2_F32": f32(float(2 / ln2)), "_HALF_LN2_HI_F32": hi32,
        "_HALF_LN2_LO_F32": lo32, "_TANH_P_F32": tuple(f32(float(c)) for c in c32),
    }
    ok = True
    for name, value in derived.items():
        module = getattr(lstm, name)
        same = np.array_equal(np.asarray(module), np.asarray(value))
        ok &= same
        print(f"{name:18s} derived {value!r}\n{'':18s} module  {module!r}  "
              f"{'same' if same else 'DIFFERENT'}")
    for label, coefs, level, to_float, bound in (("float64", c64, e64, float, BOUND_F64),
                                                 ("float32", c32, e32, f32, BOUND_F32)):
        error = rounded_error(coefs, to_float)
        ok &= error < bound
        print(f"{label}: minimax relative error {mp.nstr(abs(level), 5)}, with the coefficients "
              f"rounded {mp.nstr(error, 5)} (stated bound {bound:g}: "
              f"{'held' if error < bound else 'EXCEEDED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
