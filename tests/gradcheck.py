"""The one gradient-check helper every backward pass is tested with.

Central differences in float64: for each checked coordinate i of an input x,

    g_num[i] = (f(x + eps e_i) - f(x - eps e_i)) / (2 eps)

compared with the analytic gradient by the relative error

    err[i] = |g_ana[i] - g_num[i]| / max(|g_ana[i]|, |g_num[i]|, floor)

where ``floor`` (the small-value guard) keeps coordinates whose true gradient is ~0 from
dividing by ~0: below it the comparison is absolute. Large tensors are checked on a random
sample of coordinates (``max_coords``), always including the first and last entry.

Usage::

    def f():                       # reads the arrays in `inputs`, returns a scalar
        y, _ = layer_forward(params, x)
        return float(np.sum(y * dy))
    check_gradients(f, {"x": x, **params}, {"x": dx, **grads})

The arrays in ``inputs`` are perturbed *in place* and restored afterwards, so ``f`` must read
them (not copies made before the call).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np


def numerical_gradient(f: Callable[[], float], x: np.ndarray, index: tuple, eps: float) -> float:
    """Central difference of ``f`` along one coordinate ``index`` of ``x`` (restored after)."""
    old = x[index]
    x[index] = old + eps
    f_plus = float(f())
    x[index] = old - eps
    f_minus = float(f())
    x[index] = old
    return (f_plus - f_minus) / (2.0 * eps)


def check_gradients(f: Callable[[], float], inputs: Dict[str, np.ndarray],
                    analytic: Dict[str, np.ndarray], *, eps: float = 1e-6, tol: float = 1e-5,
                    floor: float = 1e-7, max_coords: int = 40,
                    rng: Optional[np.random.Generator] = None) -> float:
    """Assert that ``analytic[k]`` is the gradient of ``f`` w.r.t. ``inputs[k]`` for every k.

    Every array must be float64 (the check is meaningless in float32). Returns the largest
    relative error seen; raises ``AssertionError`` naming the input and coordinate otherwise.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    worst = 0.0
    missing = set(inputs) ^ set(analytic)
    assert not missing, f"inputs and analytic gradients have different keys: {sorted(missing)}"
    for name, x in inputs.items():
        g = np.asarray(analytic[name])
        assert x.dtype == np.float64, f"{name}: gradient checks need float64, got {x.dtype}"
        assert g.shape == x.shape, f"{name}: gradient shape {g.shape} != input shape {x.shape}"
        assert np.isfinite(g).all(), f"{name}: analytic gradient has non-finite entries"
        n = x.size
        if n == 0:
            continue
        if n <= max_coords:
            flat = np.arange(n)
        else:
            flat = np.unique(np.concatenate(
                [[0, n - 1], rng.choice(n, size=max_coords - 2, replace=False)]))
        for k in flat:
            idx = np.unravel_index(int(k), x.shape)
            num = numerical_gradient(f, x, idx, eps)
            ana = float(g[idx])
            err = abs(ana - num) / max(abs(ana), abs(num), floor)
            worst = max(worst, err)
            assert err <= tol, (
                f"gradient of {name}{list(idx)}: analytic {ana:.10g} vs numerical {num:.10g} "
                f"(relative error {err:.3g} > {tol:g})")
    return worst
