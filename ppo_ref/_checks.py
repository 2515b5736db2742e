"""Argument validation at the public boundary: each helper raises ``ValueError`` whose message
starts with the argument's name and says what was expected (never a numba typing error or a
silent NaN)."""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def result_dtype(*arrays: Optional[np.ndarray]) -> np.dtype:
    """float32 when every float array given is float32, else float64 (others are ignored)."""
    floats = [a.dtype for a in arrays if a is not None and a.dtype.kind == "f"]
    if floats and all(d == np.float32 for d in floats):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def as_float_array(x, name: str, *, ndim: Optional[Sequence[int]] = None,
                   allow_nonfinite: bool = False) -> np.ndarray:
    """``x`` as a float32/float64 ndarray of a rank in ``ndim`` (None: any), finite unless
    ``allow_nonfinite``: integers and bools become float64, float16 float32, non-native byte
    order native; complex, object and string inputs raise ``ValueError`` naming ``name``."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if arr.dtype.kind == "f" and not arr.dtype.isnative:  # big-endian data from a file
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype.kind in "biu":  # bool, signed or unsigned integer
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
    """A bool or 0/1-number array as a bool ndarray; any other value (NaN too) raises
    ``ValueError`` naming ``name``."""
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if ndim is not None and arr.ndim not in tuple(ndim):
        want = " or ".join(str(d) for d in ndim)
        raise ValueError(f"{name} must have rank {want}, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind not in "iuf":  # integer or floating
        raise ValueError(f"{name} must hold booleans or 0/1 numbers, got dtype {arr.dtype}")
    ok = (arr == 0) | (arr == 1)
    if not ok.all():
        bad = tuple(int(i) for i in np.argwhere(~ok)[0])
        raise ValueError(f"{name} must hold booleans or 0/1 numbers: found {arr[bad]} at "
                         f"index {bad}")
    return arr.astype(np.bool_)


def check_same_shape(arr: np.ndarray, name: str, shape: tuple, ref_name: str) -> None:
    """Raise ``ValueError`` unless ``arr.shape == shape`` (the shape of ``ref_name``)."""
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(shape)}, "
                         f"got {arr.shape}")


def one_line(text, limit: Optional[int] = None) -> str:
    """``str(text)`` with every run of white space (newlines too) as one space, cut to
    ``limit`` characters (ending ``...``) when longer."""
    text = " ".join(str(text).split())
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def one_line_repr(value, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (arrays print over many)."""
    return one_line(repr(value), limit)


def check_real_scalar(value, name: str) -> float:
    """``value`` as a Python float; ``ValueError`` unless it is a finite real number."""
    if isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a real number, got {type(value).__name__} of length "
                         f"{len(value)}")
    if isinstance(value, np.ndarray) and value.ndim != 0:
        raise ValueError(f"{name} must be a real number, got an array of shape {value.shape}")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a real number, got bool {value!r}")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a real number, got the string {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {one_line_repr(value)}") from None
    if type(value) is not float and np.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(value)}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _bounded(value, name: str, ok, what: str) -> float:
    v = check_real_scalar(value, name)
    if not ok(v):
        raise ValueError(f"{name} must be {what}, got {v}")
    return v


def check_unit_interval(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``0 <= value <= 1``."""
    return _bounded(value, name, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")


def check_positive(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``value > 0``."""
    return _bounded(value, name, lambda v: v > 0.0, "> 0")


def check_nonnegative(value, name: str) -> float:
    """Return ``value`` as float; raise ``ValueError`` unless ``value >= 0``."""
    return _bounded(value, name, lambda v: v >= 0.0, ">= 0")


def check_choice(value, name: str, choices: Sequence) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def check_generator(rng, name: str = "rng") -> np.random.Generator:
    """Return ``rng``; raise ``ValueError`` unless it is a ``numpy.random.Generator``."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{name} must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_positive_int(value, name: str) -> int:
    """:func:`check_count` with minimum 1."""
    return check_count(value, name, 1)


def as_shape(value, name: str) -> Tuple[int, ...]:
    """An int or a sequence of ints as a tuple of non-negative ints (an array shape);
    ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        shape = (int(value),)
    else:
        try:
            shape = tuple(int(s) for s in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an int or a tuple of ints, got {value!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{name} must be non-negative, got {shape}")
    return shape


def check_last_dim(arr: np.ndarray, name: str, size: int) -> None:
    """Raise ``ValueError`` unless ``arr`` has a last dimension of ``size``."""
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension [..., {size}], got a scalar")
    if arr.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {size}, got shape {arr.shape}")


def as_index_array(x, name: str, shape: tuple, ref_name: str,
                   upper: Union[int, Sequence[int]]) -> np.ndarray:
    """Integer indices (integers or integral floats) of exactly ``shape`` (that of
    ``ref_name``) with ``0 <= x < upper``, as int64; ``upper`` is one bound, or one per
    position along the last axis (MultiDiscrete ``nvec``). ``ValueError`` naming ``name``."""
    a = np.asarray(x)
    kind = a.dtype.kind  # "i"/"u" integers, "f" floats, "b" bool, ...
    if kind not in "iuf":
        raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
    if kind == "f" and a.size and not (np.isfinite(a).all() and (a == np.round(a)).all()):
        raise ValueError(f"{name} must hold integer values; got non-integral floats")
    check_same_shape(a, name, shape, ref_name)
    bound = np.asarray(upper)
    bad = (a < 0) | (a >= bound)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        limit = int(bound) if bound.ndim == 0 else int(bound[where[-1]])
        raise ValueError(f"{name} must be in [0, {limit}), got {a[where]} at index {where}")
    return a.astype(np.int64)


def get_param(params, key: str, shape: Optional[Sequence[Optional[int]]] = None) -> np.ndarray:
    """``params[key]``, checked to be a finite float64 ndarray of ``shape`` (``None`` entries:
    any size); ``ValueError`` naming the mapping, the key or the entry otherwise."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a dict of arrays, got {type(params).__name__}")
    if key not in params:
        raise ValueError(f"params is missing key {key!r}")
    v = params[key]
    ok = isinstance(v, np.ndarray) and v.dtype == np.float64
    if ok and shape is not None:
        ok = v.ndim == len(shape) and all(s is None or s == d for s, d in zip(shape, v.shape))
    if not ok:
        want = "" if shape is None else " of shape [" + ", ".join(
            "*" if s is None else str(s) for s in shape) + "]"
        got = (f"{v.dtype} array of shape {v.shape}" if isinstance(v, np.ndarray)
               else type(v).__name__)
        raise ValueError(f"params[{key!r}] must be a float64 array{want}, got {got}")
    check_finite_param(v, key)
    return v


def check_finite_param(value: np.ndarray, key: str) -> None:
    """Raise ``ValueError`` naming ``params[key]`` and the first bad index unless ``value`` is
    finite."""
    if value.size and not np.isfinite(value).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
        raise ValueError(f"params[{key!r}] must be finite: found {value[where]} at index {where}")


def check_logits(z: np.ndarray, name: str = "logits") -> None:
    """Raise ``ValueError`` unless ``z [..., A]`` (A >= 1) defines a categorical distribution
    per row: ``-inf`` entries (masked actions) are allowed, NaN and ``+inf`` are not, a row
    needs an entry ``> -inf``, and ``z - max z`` must be finite (a stable log-softmax's shift).
    """
    if z.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension [..., n_actions], got a scalar")
    if z.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one action (last dimension), got shape "
                         f"{z.shape}")
    if np.isnan(z).any():
        raise ValueError(f"{name} must not contain NaN: found at index "
                         f"{tuple(int(i) for i in np.argwhere(np.isnan(z))[0])}")
    if (z == np.inf).any():
        raise ValueError(f"{name} must not contain +inf: found at index "
                         f"{tuple(int(i) for i in np.argwhere(z == np.inf)[0])}")
    all_masked = np.all(z == -np.inf, axis=-1)
    if all_masked.any():
        row = tuple(int(i) for i in np.argwhere(all_masked)[0]) if z.ndim > 1 else ()
        raise ValueError(f"{name} row {row} has every action masked (-inf): no valid action")
    with np.errstate(over="ignore"):
        shifted = z - np.max(z, axis=-1, keepdims=True)  # the shift of log_softmax
    overflow = np.isinf(shifted) & np.isfinite(z)
    if overflow.any():
        where = tuple(int(i) for i in np.argwhere(overflow)[0])
        raise ValueError(f"{name} spread too far: {name} - max({name}) overflows float64 at "
                         f"index {where} (value {z[where]}; the finite logits of a row must "
                         "lie within about 1.8e308 of its maximum)")


def check_param_dict(params, name: str) -> None:
    """Raise ``ValueError`` unless ``params`` maps strings to float32/float64 arrays."""
    if not isinstance(params, Mapping):
        raise ValueError(f"{name} must be a dict of float arrays, got {type(params).__name__}")
    for key, value in params.items():
        if not isinstance(key, str):
            raise ValueError(f"{name} keys must be strings, got {key!r}")
        dtype = value.dtype if isinstance(value, np.ndarray) else np.asarray(value).dtype
        if dtype != np.float64 and dtype != np.float32:
            raise ValueError(f"{name}[{key!r}] must be a float32 or float64 array, got dtype "
                             f"{dtype}")


def check_same_keys(a, a_name: str, b, b_name: str) -> None:
    """Raise ``ValueError`` naming the missing or extra keys unless ``b`` has the keys of ``a``."""
    missing = [k for k in a if k not in b]
    extra = [k for k in b if k not in a]
    if missing:
        raise ValueError(f"{b_name} is missing key(s) {missing} present in {a_name}")
    if extra:
        raise ValueError(f"{b_name} has extra key(s) {extra} not present in {a_name}")


def check_step_count(t) -> int:
    """The Adam step count ``state["t"]`` as int; ``ValueError`` unless an integer >= 0."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state['t'] must be a non-negative int, got {t!r}")
    return int(t)


def check_adam_hyperparameters(lr, betas, eps):
    """Return ``(lr, beta1, beta2, eps)`` as floats; ``ValueError`` naming the argument unless
    ``lr >= 0``, ``betas`` a pair in [0, 1) and ``eps >= 0`` (all finite)."""
    lr = check_nonnegative(lr, "lr")
    eps = check_nonnegative(eps, "eps")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    beta1 = check_real_scalar(betas[0], "betas[0]")
    beta2 = check_real_scalar(betas[1], "betas[1]")
    for b, name in ((beta1, "betas[0]"), (beta2, "betas[1]")):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {b}")
    return lr, beta1, beta2, eps


def check_count(value, name: str, minimum: int) -> int:
    """Return ``value`` as a Python int; raise ``ValueError`` naming ``name`` unless it is an
    integer (Python or NumPy; not a bool, float or string) with ``value >= minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} "
                         f"{one_line_repr(value)}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


LSTM_PARAM_KEYS = ("w_ih", "w_hh", "b")


def check_lstm_params(params) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 ``(w_ih [4H, D], w_hh [4H, H], b [4H])`` of an LSTM's ``params``;
    ``ValueError`` naming the bad entry (missing, wrong rank or shape, not finite)."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a dict with keys {list(LSTM_PARAM_KEYS)}, "
                         f"got {type(params).__name__}")
    missing = [k for k in LSTM_PARAM_KEYS if k not in params]
    if missing:
        raise ValueError(f"params is missing {missing} (needs {list(LSTM_PARAM_KEYS)})")
    w_ih, w_hh, b = (
        as_float_array(params[k], f"params['{k}']", ndim=(nd,)).astype(np.float64, copy=False)
        for k, nd in (("w_ih", 2), ("w_hh", 2), ("b", 1)))
    four_h, hidden = w_hh.shape
    if hidden < 1 or four_h != 4 * hidden:
        raise ValueError(f"params['w_hh'] must have shape [4H, H] with H >= 1, got {w_hh.shape}")
    if w_ih.shape[0] != four_h or w_ih.shape[1] < 1:
        raise ValueError(f"params['w_ih'] must have shape [4H, D] = [{four_h}, D] with D >= 1 "
                         f"(4H from params['w_hh']), got {w_ih.shape}")
    check_same_shape(b, "params['b']", (four_h,), "[4H]")
    return w_ih, w_hh, b


def check_lstm_state(arr, name: str, n_env: int, hidden: int) -> np.ndarray:
    """An LSTM state (or its gradient) ``[N, H]`` as finite float64; ``ValueError`` naming it."""
    a = as_float_array(arr, name, ndim=(2,)).astype(np.float64, copy=False)
    check_same_shape(a, name, (n_env, hidden), "[N, H]")
    return a


def non_finite_result(where: str) -> FloatingPointError:
    """The compiled tier's error for a non-finite result of the function ``where`` (the
    readable tier names the input or overflow that caused it)."""
    return FloatingPointError(f"{where}: non-finite result (rerun with backend='spec' to see "
                              "which input or overflow caused it)")


def env_value_problem(value, what: str) -> Optional[str]:
    """What is wrong with one env's ``what`` (``"reward"``, ``"terminated"`` or
    ``"truncated"``) as ``env.step`` returned it, or None: a reward must be a real number (never
    converted from a string, complex, array or None), a flag a bool or an integer 0 or 1. The
    text follows "env i returned ", e.g. ``reward '1.0' of type str; expected a real number``."""
    flag = what != "reward"
    try:
        a = np.asarray(value)
    except Exception:  # noqa: BLE001  (an object numpy cannot even look at)
        a = np.asarray(None)
    kinds = "biu" if flag else "biuf"
    ok = a.ndim == 0 and a.dtype.kind in kinds and (not flag or a.dtype.kind == "b"
                                                    or a in (0, 1))
    if ok:
        return None
    text = one_line_repr(value, 60)
    return (f"{what} {text} of type {type(value).__name__}; expected "
            f"{'a bool' if flag else 'a real number'}")
