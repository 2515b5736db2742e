"""A trainer's state as arrays: each sub-env's own state (:func:`single_env_state`, for exact
resume) and an Adam state in npz form. Vetting a saved state is :mod:`ppo_ref.io.checkpoint`'s.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict

import numpy as np

from ppo_ref._checks import check_same_keys
from ppo_ref.io.checkpoint import generator_state, set_generator_state, vet_env_value

__all__ = ["single_env_state", "restore_single_env_state", "adam_state_to_arrays",
           "adam_state_from_arrays"]

_SKIP_ATTRS = frozenset({"env", "_env", "spec", "_cached_spec", "metadata", "_metadata",
                         "render_mode", "_action_space", "_observation_space", "action_space",
                         "observation_space", "_saved_kwargs", "_ezpickle_args",
                         "_ezpickle_kwargs"})
_MISSING = object()


def _is_skipped_value(value) -> bool:
    """Attribute values never saved nor restored: spaces and callables (a Generator is state)."""
    from gymnasium import Space
    return isinstance(value, Space) or (callable(value)
                                        and not isinstance(value, np.random.Generator))


def _encode_value(value):
    """JSON form of a plain attribute value, or raise TypeError when it cannot be saved."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.random.Generator):
        return {"__generator__": generator_state(value)}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"__scalar__": value.item(), "dtype": str(value.dtype)}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_value(v) for v in value]}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    raise TypeError(type(value).__name__)


def _decode_value(obj, current):
    """Inverse of :func:`_encode_value`; ``ValueError`` for a form it never writes."""
    if isinstance(obj, dict):
        if "__generator__" in obj:
            if not isinstance(current, np.random.Generator):
                current = np.random.default_rng()
            set_generator_state(current, obj["__generator__"])
            return current
        if "__scalar__" in obj or "__ndarray__" in obj:
            dtype = np.dtype(obj.get("dtype"))
            if dtype.kind not in "biuf":
                raise ValueError(f"saved env value has dtype {dtype}; only bool, integer and "
                                 "float values are restored")
            if "__scalar__" in obj:
                return dtype.type(obj["__scalar__"])
            return np.asarray(obj["__ndarray__"], dtype=dtype)
        if "__tuple__" in obj:
            return tuple(_decode_value(v, None) for v in obj["__tuple__"])
        raise ValueError(f"saved env value {sorted(obj)!r} is not a form ppo_ref writes")
    if isinstance(obj, list):
        return [_decode_value(v, None) for v in obj]
    return obj


def _layers(env) -> list:
    layers = [env]
    while hasattr(layers[-1], "env") and layers[-1] is not getattr(layers[-1], "unwrapped", None):
        layers.append(layers[-1].env)
    return layers


def single_env_state(env) -> Dict[str, Any]:
    """A JSON-safe snapshot of one (wrapped) gymnasium env's plain attributes: per wrapper layer
    down to ``env.unwrapped``, every instance attribute that is None, a bool/int/float/str, a
    numeric NumPy scalar or array, a tuple or list of those, or a Generator (its state). That is
    the whole dynamic state of the classic-control envs and the standard wrappers; other
    attributes (MuJoCo's ``MjData``, Box2D worlds) are listed as ``"unsupported"``
    (``layer.name``) so the caller can warn that a resume will not be exact."""
    layers_out = []
    unsupported = []
    for layer in _layers(env):
        attrs = {}
        for name, value in vars(layer).items():
            if name in _SKIP_ATTRS or _is_skipped_value(value):
                continue
            try:
                attrs[name] = _encode_value(value)
            except TypeError:
                if name in ("screen", "clock", "viewer", "window", "renderer"):
                    continue  # rendering handles: not dynamics state
                unsupported.append(f"{type(layer).__name__}.{name}")
        layers_out.append({"class": type(layer).__name__, "attrs": attrs})
    return {"layers": layers_out, "unsupported": unsupported}


def restore_single_env_state(env, state: Dict[str, Any]) -> None:
    """Write a :func:`single_env_state` snapshot back into ``env``: only plain attributes the env
    already has, its limits kept (:func:`ppo_ref.io.checkpoint.vet_env_value`). Raises
    ``ValueError`` for another wrapper chain, any other attribute, a value form
    :func:`single_env_state` never writes, or a changed limit."""
    layers = _layers(env)
    saved = state["layers"]
    chain = [type(layer).__name__ for layer in layers]
    if chain != [s["class"] for s in saved]:
        raise ValueError("env state was saved for wrapper chain "
                         f"{[s['class'] for s in saved]}, this env has {chain}")
    for layer, entry in zip(layers, saved):
        present = vars(layer)
        for name, obj in entry["attrs"].items():
            current = present.get(name, _MISSING)
            if current is _MISSING or name in _SKIP_ATTRS or _is_skipped_value(current):
                raise ValueError(f"saved env state sets {type(layer).__name__}.{name}, which is "
                                 "not a plain attribute this env has")
            value = _decode_value(obj, current)
            vet_env_value(type(layer).__name__, name, value, current,
                          present.get("_max_episode_steps"))
            setattr(layer, name, value)


def adam_state_to_arrays(state: dict) -> Dict[str, np.ndarray]:
    """An Adam state as ``{"t": 0-d int64, "m.<name>": m copy, "v.<name>": v copy}`` for an npz
    checkpoint (only the first dot separates). Inverse: :func:`adam_state_from_arrays`."""
    if not isinstance(state, Mapping) or not {"t", "m", "v"} <= set(state):
        raise ValueError("state must be an Adam state from adam_init (keys 't', 'm', 'v')")
    for moment in ("m", "v"):
        if not isinstance(state[moment], Mapping):
            raise ValueError(f"state['{moment}'] must be a dict of arrays, got "
                             f"{type(state[moment]).__name__}")
    check_same_keys(state["m"], "state['m']", state["v"], "state['v']")
    out: Dict[str, np.ndarray] = {"t": np.asarray(int(state["t"]), dtype=np.int64)}
    for k in state["m"]:
        out["m." + k] = np.array(state["m"][k], copy=True)
        out["v." + k] = np.array(state["v"][k], copy=True)
    return out


def adam_state_from_arrays(arrays: Mapping[str, np.ndarray]) -> dict:
    """The Adam state of :func:`adam_state_to_arrays` output (bit exact); ``ValueError`` for a
    ``"t"`` that is not an integer >= 0, another key, or ``m``/``v`` of different names."""
    if not isinstance(arrays, Mapping) or "t" not in arrays:
        raise ValueError("arrays must be a dict holding 't' and 'm.<name>'/'v.<name>' entries")
    t_arr = np.asarray(arrays["t"])
    if t_arr.shape != () or not np.issubdtype(t_arr.dtype, np.integer) or int(t_arr) < 0:
        raise ValueError(f"arrays['t'] must be a non-negative integer scalar, got {t_arr!r}")
    m: Dict[str, np.ndarray] = {}
    v: Dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key == "t":
            continue
        prefix, _, name = key.partition(".")
        if prefix not in ("m", "v") or not name:
            raise ValueError(f"arrays has unexpected key {key!r} (expected 't', 'm.<name>', "
                             "'v.<name>')")
        (m if prefix == "m" else v)[name] = np.array(value, copy=True)
    check_same_keys(m, "first moments (m.*)", v, "second moments (v.*)")
    return {"t": int(t_arr), "m": m, "v": v}
