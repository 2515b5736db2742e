"""The JSON codec of golden vectors, results files and traces, and the bounded JSON reader.

* Arrays are nested JSON lists, row-major: bool arrays hold ``true``/``false``, integer arrays
  (actions) JSON integers, float arrays float64 in Python's shortest round-trip repr. The IEEE
  specials are the strings ``"inf"``, ``"-inf"``, ``"nan"`` (JSON has no literal for them).
* A dict of arrays (parameters, gradients) is a JSON object of arrays; a sequence of such dicts
  (Adam's gradient per step) is an object keyed ``"1"``, ``"2"``, ...
* Scalars are JSON numbers; ``None`` is ``null``.
"""
from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np

__all__ = ["FORMAT", "RESULTS_FORMAT", "DEFAULT_TOLERANCE", "encode", "decode", "decode_settings",
           "dumps", "read_json_file", "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "MAX_JSON_INT_DIGITS"]

#: The largest JSON file that is read: larger files, and endless ones such as a device, are
#: refused after reading at most this many bytes + 1.
MAX_JSON_BYTES = 64 * 2 ** 20
#: The deepest nesting of lists/objects accepted (cases need fewer than 10).
MAX_JSON_DEPTH = 64
#: The most digits a JSON integer may have (every count and integer array fits).
MAX_JSON_INT_DIGITS = 19

FORMAT = "ppo_ref.vectors/1"
RESULTS_FORMAT = "ppo_ref.results/1"
DEFAULT_TOLERANCE = {"atol": 1e-10, "rtol": 1e-9}
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _encode_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def encode(value):
    """Python/NumPy value -> JSON-safe value by the rules of the module docstring.
    ``ValueError``: a value or array dtype the rules do not cover (string arrays, objects)."""
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not (
            value and isinstance(value[0], (int, float, bool, np.generic))):
        return [encode(v) for v in value]
    if isinstance(value, (np.ndarray, list, tuple, np.generic)):
        arr = np.asarray(value)
        if arr.dtype == np.bool_:
            return arr.tolist()
        if np.issubdtype(arr.dtype, np.integer):
            return arr.astype(np.int64).tolist()
        if np.issubdtype(arr.dtype, np.floating):
            flat = [_encode_float(float(x)) for x in arr.astype(np.float64).ravel()]
            if arr.ndim == 0:
                return flat[0]
            return np.array(flat, dtype=object).reshape(arr.shape).tolist()
        raise ValueError(f"cannot encode array of dtype {arr.dtype}")
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return _encode_float(value)
    raise ValueError(f"cannot encode {type(value).__name__}")


def _has_float(value) -> bool:
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return isinstance(value, (float, str))


def _floats(value):
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, str):
        if value not in _SPECIAL:
            raise ValueError(f"unexpected string {value!r} in a numeric array")
        return _SPECIAL[value]
    return float(value)


def decode(value):
    """JSON value -> NumPy: lists become arrays (bool, int64 or float64 by their leaves),
    objects dicts, special-float strings floats. ``ValueError``: a ragged list or a string other
    than a special float inside an array."""
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        leaf = value
        while isinstance(leaf, list) and leaf:
            leaf = leaf[0]
        if isinstance(leaf, list):  # an empty innermost list
            return np.asarray(value, dtype=np.float64)
        if isinstance(leaf, bool):
            return np.asarray(value, dtype=np.bool_)
        if isinstance(leaf, int) and not _has_float(value):
            return np.asarray(value, dtype=np.int64)
        return np.asarray(_floats(value), dtype=np.float64)
    if isinstance(value, str) and value in _SPECIAL:
        return _SPECIAL[value]
    return value


def decode_settings(settings: Mapping) -> dict:
    """Settings with only the special-float strings decoded (lists such as ``betas`` stay lists)."""
    return {k: _SPECIAL[v] if isinstance(v, str) and v in _SPECIAL else v
            for k, v in settings.items()}


def flatten(value, prefix: str = "") -> dict:
    """Nested dicts as one ``{"grads/w_ih": array, ...}`` (keys joined by ``/``, order kept;
    a non-dict ``value`` is ``{prefix without its last "/": value}``)."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: value}


def dumps(doc: Mapping, indent: int = 1) -> str:
    """JSON text of a document: objects one key per line, each array on one line."""
    def render(value, level):
        if isinstance(value, dict) and value:
            pad = " " * (indent * (level + 1))
            items = [f"{pad}{json.dumps(k)}: {render(v, level + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * (indent * level) + "}"
        return json.dumps(value, allow_nan=False)
    return render(doc, 0)


def _bounded_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


def _depth_ok(value) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in children)
    return True


def read_json_file(path: str, what: str, max_bytes: int = MAX_JSON_BYTES):
    """The parsed JSON of the file ``path``, read within bounds: at most ``max_bytes`` bytes,
    UTF-8, nesting at most :data:`MAX_JSON_DEPTH` deep, integers of at most
    :data:`MAX_JSON_INT_DIGITS` digits. ``ValueError`` naming the file (``what`` says which
    kind) when it breaks a bound or is not JSON; ``OSError`` when it is missing or unreadable."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is larger than the limit of {max_bytes} bytes")
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"{what} {path} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} is not valid JSON ({exc})") from None
    except ValueError as exc:  # _bounded_int
        raise ValueError(f"{what} {path} holds {exc}") from None
    if not _depth_ok(value):
        raise ValueError(f"{what} {path} nests deeper than {MAX_JSON_DEPTH} levels")
    return value
