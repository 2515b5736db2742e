"""Optimizer (public names): the readable definitions of :mod:`ppo_ref.spec.optim`, plus the npz
form of an Adam state (checkpoint helpers, not math).

The compiled step of the fast update is :func:`ppo_ref.fast.optim.clipped_adam_step`
(``clip_by_global_norm`` then ``adam_update`` fused on one parameter buffer).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Dict

import numpy as np

from ppo_ref._checks import check_same_keys
from ppo_ref.spec.optim import (CLIP_NORM_EPS, adam_init, adam_update, clip_by_global_norm,
                                global_norm, linear_schedule, scheduled_value)

__all__ = [
    "adam_init",
    "adam_update",
    "adam_state_to_arrays",
    "adam_state_from_arrays",
    "clip_by_global_norm",
    "global_norm",
    "linear_schedule",
    "scheduled_value",
    "CLIP_NORM_EPS",
]

Arrays = Dict[str, np.ndarray]


def adam_state_to_arrays(state: dict) -> Arrays:
    """Flatten an Adam state into ``{str: ndarray}`` for an npz checkpoint (no pickling).

    Layout: ``"t"`` -> 0-d int64 array; ``"m." + name`` and ``"v." + name`` -> the moment arrays
    (copies). Parameter names may themselves contain dots; only the first dot is a separator.
    Inverse: :func:`adam_state_from_arrays`.
    """
    if not isinstance(state, Mapping) or not {"t", "m", "v"} <= set(state):
        raise ValueError("state must be an Adam state from adam_init (keys 't', 'm', 'v')")
    for moment in ("m", "v"):
        if not isinstance(state[moment], Mapping):
            raise ValueError(f"state['{moment}'] must be a dict of arrays, got "
                             f"{type(state[moment]).__name__}")
    check_same_keys(state["m"], "state['m']", state["v"], "state['v']")
    out: Arrays = {"t": np.asarray(int(state["t"]), dtype=np.int64)}
    for k in state["m"]:
        out["m." + k] = np.array(state["m"][k], copy=True)
        out["v." + k] = np.array(state["v"][k], copy=True)
    return out


def adam_state_from_arrays(arrays: Mapping[str, np.ndarray]) -> dict:
    """Rebuild an Adam state from :func:`adam_state_to_arrays` output (bit exact).

    Raises:
        ValueError: ``"t"`` missing or not a non-negative integer, a key without the ``m.``/``v.``
            prefix, or a moment present in ``m`` but not in ``v`` (or vice versa).
    """
    if not isinstance(arrays, Mapping) or "t" not in arrays:
        raise ValueError("arrays must be a dict holding 't' and 'm.<name>'/'v.<name>' entries")
    t_arr = np.asarray(arrays["t"])
    if t_arr.shape != () or not np.issubdtype(t_arr.dtype, np.integer) or int(t_arr) < 0:
        raise ValueError(f"arrays['t'] must be a non-negative integer scalar, got {t_arr!r}")
    m: Arrays = {}
    v: Arrays = {}
    for key, value in arrays.items():
        if key == "t":
            continue
        prefix, _, name = key.partition(".")
        if prefix not in ("m", "v") or not name:
            raise ValueError(f"arrays has unexpected key {key!r} (expected 't', 'm.<name>', 'v.<name>')")
        (m if prefix == "m" else v)[name] = np.array(value, copy=True)
    check_same_keys(m, "first moments (m.*)", v, "second moments (v.*)")
    return {"t": int(t_arr), "m": m, "v": v}
