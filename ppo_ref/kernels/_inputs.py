"""Shared validation of the GAE and V-trace inputs (private).

Both kernels take the same trajectory arrays (time-major ``[T]`` or ``[T, N]``), the same flags
and the same bootstrap values; this module turns what the caller passed into C-contiguous
``[T, N]`` arrays of one float dtype and bool flags, or raises ``ValueError`` naming the argument.

Finiteness of the ``[T, N]`` float arrays is the one check not made here: the loops fold it
into their loop (a separate pass would cost as much memory traffic as the kernel itself) and
return a flag; on False the wrapper calls :func:`explain_not_finite`, which names the argument.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ppo_ref._checks import (as_flag_array, as_float_array, check_choice, check_same_shape,
                             check_unit_interval,
                             result_dtype)
from ppo_ref.spec.masks import TRUNCATION_MODES

FINAL_VALUES_REQUIRED = "final_values is required: truncated has True entries"

BACKENDS = ("fast", "spec")


def check_backend(backend, compiled):
    """The function a wrapper runs for ``backend``: ``compiled`` (an ``njit`` of a spec loop)
    for ``"fast"``, the spec loop itself (its ``py_func``) for ``"spec"``. Raises
    ``ValueError`` for any other ``backend``."""
    check_choice(backend, "backend", BACKENDS)
    if backend == "fast":
        return compiled
    return getattr(compiled, "py_func", compiled)  # (NUMBA_DISABLE_JIT=1: already the function)


class TrajectoryInputs(NamedTuple):
    """Validated inputs, all 2-D ``[T, N]`` (``last_values``: ``[N]``), C-contiguous."""

    dtype: np.dtype
    one_env: bool               # the caller passed [T] arrays: squeeze the results back
    arrays: dict                # name -> [T, N] float array of ``dtype`` (finiteness unchecked)
    given: dict                 # name -> the [T]/[T, N] float argument as the caller passed it
    terminated: np.ndarray      # [T, N] bool
    truncated: np.ndarray       # [T, N] bool
    last_values: np.ndarray     # [N] of ``dtype``
    final_values: np.ndarray    # [T, N] of ``dtype`` (``values`` when not given: never read)
    truncation_mode: int
    bootstrap_terminal_last_row: bool


def _counts_for_dtype(raw) -> bool:
    """Whether ``raw`` takes part in the float32/float64 decision.

    Python scalars never count; arrays and NumPy scalars count when their dtype is floating.
    """
    if isinstance(raw, (bool, int, float)) and not isinstance(raw, np.generic):
        return False  # (np.float64 subclasses float, but it is a NumPy scalar: it counts)
    return np.asarray(raw).dtype.kind == "f"  # floating


def prepare_trajectory(float_inputs: dict, terminated, truncated, last_values,
                       final_values: Optional[object], truncation: str,
                       bootstrap_terminal_last_row) -> TrajectoryInputs:
    """Validate and convert; ``float_inputs`` maps names to ``[T]``/``[T, N]`` arrays.

    The reference shape is that of ``float_inputs["rewards"]``.
    """
    check_choice(truncation, "truncation", tuple(TRUNCATION_MODES))
    if not isinstance(bootstrap_terminal_last_row, (bool, np.bool_)):
        raise ValueError("bootstrap_terminal_last_row must be a bool, got "
                         f"{bootstrap_terminal_last_row!r}")

    converted = {name: as_float_array(x, name, ndim=(1, 2), allow_nonfinite=True)
                 for name, x in float_inputs.items()}
    shape = converted["rewards"].shape
    for name, arr in converted.items():
        check_same_shape(arr, name, shape, "rewards")
    term = as_flag_array(terminated, "terminated", ndim=(1, 2))
    check_same_shape(term, "terminated", shape, "rewards")
    trunc = as_flag_array(truncated, "truncated", ndim=(1, 2))
    check_same_shape(trunc, "truncated", shape, "rewards")

    last = as_float_array(last_values, "last_values")
    if last.shape != shape[1:]:
        kind = "a scalar" if len(shape) == 1 else f"shape {shape[1:]} (one per env)"
        raise ValueError(f"last_values must be {kind} for rewards of shape {shape}, "
                         f"got shape {last.shape}")
    final = None
    if final_values is not None:
        final = as_float_array(final_values, "final_values", ndim=(1, 2), allow_nonfinite=True)
        check_same_shape(final, "final_values", shape, "rewards")
    elif truncation == "bootstrap" and np.any(trunc & ~term):
        raise ValueError(FINAL_VALUES_REQUIRED)

    raws = list(float_inputs.values()) + [last_values, final_values]
    convs = list(converted.values()) + [last, final]
    dtype = result_dtype(*[c for r, c in zip(raws, convs)
                           if r is not None and _counts_for_dtype(r)])

    one_env = len(shape) == 1
    two_d = (shape[0], 1) if one_env else shape

    def fit(a):
        return np.ascontiguousarray(a.reshape(two_d), dtype=dtype)

    arrays = {name: fit(a) for name, a in converted.items()}
    with np.errstate(over="ignore"):  # only a Python float can overflow on this cast
        last_fit = np.ascontiguousarray(last.reshape(two_d[1:]), dtype=dtype)
    if not np.isfinite(last_fit).all():
        raise ValueError(f"last_values must be finite in {dtype}: got {last_values!r}")
    given = dict(float_inputs, last_values=last_values)
    if final_values is not None:
        given["final_values"] = final_values
    return TrajectoryInputs(
        dtype=dtype, one_env=one_env, arrays=arrays, given=given,
        terminated=np.ascontiguousarray(term.reshape(two_d)),
        truncated=np.ascontiguousarray(trunc.reshape(two_d)),
        last_values=last_fit,
        final_values=arrays["values"] if final is None else fit(final),
        truncation_mode=TRUNCATION_MODES[truncation],
        bootstrap_terminal_last_row=bool(bootstrap_terminal_last_row))


def explain_not_finite(inputs: TrajectoryInputs, names, results: dict) -> None:
    """Called when a kernel's finiteness flag is False (slow path, never taken on good input).

    Raises ``ValueError`` naming the first of ``names`` (arguments the kernel read) that holds
    inf or nan, with its index; otherwise, if one of ``results`` (name -> array) is not finite,
    a ``ValueError`` saying that finite inputs overflowed the dtype. Returns when everything is
    finite (the kernel's check can give a false alarm on huge finite numbers).
    """
    for name in names:
        if name in inputs.given:
            as_float_array(inputs.given[name], name)  # raises, naming the argument
    for name, result in results.items():
        if not np.isfinite(result).all():
            given = ", ".join(n for n in ("rewards", "values", "final_values", "last_values")
                              if n in inputs.given)
            raise ValueError(f"{name} overflow {inputs.dtype}: {given} are too large in magnitude")


def finish(inputs: TrajectoryInputs, *outputs: np.ndarray):
    """Reshape ``[T, 1]`` results back to ``[T]`` when the caller passed one env."""
    if inputs.one_env:
        return tuple(o.reshape(o.shape[0]) for o in outputs)
    return outputs


def per_step_unit_interval(value, name: str, shape) -> np.ndarray:
    """A per-step parameter in [0, 1] (``gamma``, ``gae_lambda``, ``lambda_``) as a C-contiguous
    float64 ``[T, N]`` array for the trajectory shape ``shape`` (``(T,)`` or ``(T, N)``, as the
    caller passed ``rewards``).

    ``value`` is a scalar (every step the same), an array of the shape of ``rewards`` (one
    number per step and env, rlax's ``discount_t``/``lambda_``), or for ``[T, N]`` trajectories
    a ``[T]`` array (one number per row, shared by the envs). Raises ``ValueError`` naming
    ``name`` for another shape, a non-finite entry or an entry outside [0, 1].
    """
    two_d = (shape[0], 1) if len(shape) == 1 else tuple(shape)
    if np.ndim(value) == 0:
        return np.full(two_d, check_unit_interval(value, name), dtype=np.float64)
    arr = as_float_array(value, name, ndim=(1, 2)).astype(np.float64)
    if arr.shape == tuple(shape):
        arr = arr.reshape(two_d)
    elif len(shape) == 2 and arr.shape == (shape[0],):
        arr = np.repeat(arr[:, None], shape[1], axis=1)
    else:
        extra = f" or ({shape[0]},)" if len(shape) == 2 else ""
        raise ValueError(f"{name} must be a scalar or an array of shape {tuple(shape)}{extra} "
                         f"(one per step), got shape {arr.shape}")
    bad = ~((arr >= 0.0) & (arr <= 1.0))
    if np.any(bad):
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be in [0, 1] at every step, got {arr[i]} at index {i}")
    return np.ascontiguousarray(arr)
