"""Argument validation shared by every public function.

Each helper raises ``ValueError`` (or ``TypeError`` for a wrong kind of object) whose message
starts with the argument's name, so a caller always learns *which* input was wrong and *how*.
Public wrappers call these before handing arrays to a numba kernel, so a bad input never
surfaces as a numba typing error, a silent NaN or a wrong answer.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def result_dtype(*arrays: Optional[np.ndarray]) -> np.dtype:
    """float32 when every *float* array given is float32, float64 otherwise.

    Integer or bool arrays and ``None`` entries are ignored (Python scalars never reach here).
    With no float array at all the result is float64.
    """
    floats = [a.dtype for a in arrays if a is not None and np.issubdtype(a.dtype, np.floating)]
    if floats and all(d == np.float32 for d in floats):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def as_float_array(x, name: str, *, ndim: Optional[Sequence[int]] = None,
                   allow_nonfinite: bool = False) -> np.ndarray:
    """Convert ``x`` to a float32/float64 ndarray, checking rank and finiteness.

    Integer and bool inputs become float64; float16 becomes float32; floats stored in the
    non-native byte order (e.g. big-endian ``>f8`` read from a file) are converted to native
    order; complex, object and string inputs are rejected. ``ndim`` is the set of accepted ranks (``None``: any).
    Raises ``ValueError`` naming ``name``.
    """
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if arr.dtype.kind == "f" and not arr.dtype.isnative:  # big-endian data from a file
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.float64)
    elif arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    elif arr.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a real float array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim not in tuple(ndim):
        want = " or ".join(str(d) for d in ndim)
        raise ValueError(f"{name} must have rank {want}, got shape {arr.shape}")
    if not allow_nonfinite and arr.size and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        where = tuple(int(i) for i in bad)
        raise ValueError(f"{name} must be finite: found {arr[tuple(bad)]} at index {where}")
    return arr


def as_flag_array(x, name: str, *, ndim: Optional[Sequence[int]] = None) -> np.ndarray:
    """Convert a bool or 0/1-number array to a bool ndarray.

    Any value other than 0 or 1 (including NaN) raises ``ValueError`` naming ``name``.
    """
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if ndim is not None and arr.ndim not in tuple(ndim):
        want = " or ".join(str(d) for d in ndim)
        raise ValueError(f"{name} must have rank {want}, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return arr
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must hold booleans or 0/1 numbers, got dtype {arr.dtype}")
    ok = (arr == 0) | (arr == 1)
    if not ok.all():
        bad = tuple(int(i) for i in np.argwhere(~ok)[0])
        raise ValueError(f"{name} must hold booleans or 0/1 numbers: found {arr[bad]} at index {bad}")
    return arr.astype(np.bool_)


def check_same_shape(arr: np.ndarray, name: str, shape: tuple, ref_name: str) -> None:
    """Raise ``ValueError`` unless ``arr.shape == shape`` (the shape of ``ref_name``)."""
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(shape)}, got {arr.shape}")


def _one_line_repr(value, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (arrays print over many)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_real_scalar(value, name: str) -> float:
    """Return ``value`` as a Python float; raise ``ValueError`` unless it is a finite real number."""
    if isinstance(value, (list, tuple, np.ndarray)) and not (isinstance(value, np.ndarray)
                                                             and value.ndim == 0):
        raise ValueError(f"{name} must be a real number, got {type(value).__name__} of length "
                         f"{len(value)}" if not isinstance(value, np.ndarray) else
                         f"{name} must be a real number, got an array of shape {value.shape}")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a real number, got bool {value!r}")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a real number, got the string {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {_one_line_repr(value)}") from None
    if np.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(value)}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def check_unit_interval(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``0 <= value <= 1``."""
    v = check_real_scalar(value, name)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v}")
    return v


def check_positive(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``value > 0``."""
    v = check_real_scalar(value, name)
    if not v > 0.0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


def check_nonnegative(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``value >= 0``."""
    v = check_real_scalar(value, name)
    if not v >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    return v


def check_choice(value, name: str, choices: Sequence) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def check_count(value, name: str, minimum: int) -> int:
    """Return ``value`` as a Python int; raise ``ValueError`` naming ``name`` unless it is an
    integer (Python or NumPy; not a bool, float or string) with ``value >= minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} "
                         f"{_one_line_repr(value)}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v
