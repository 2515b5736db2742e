"""Optimizer pieces: Adam, global-norm gradient clipping, schedules.

Parameters, gradients and Adam moments are dicts ``{name: float ndarray}`` with the same keys.
Every function is pure: it returns new dicts of new arrays and never writes into its inputs.
The arithmetic of one Adam element is written once, in :func:`adam_element`, applied here to
float64 arrays and compiled per element by :func:`ppo_ref.fast.optim.adam_update` (same bits).

Sources: Kingma & Ba, "Adam: A Method for Stochastic Optimization" (arXiv:1412.6980),
Algorithm 1, with ``torch.optim.Adam``'s placement of ``eps``; Pascanu, Mikolov & Bengio,
"On the difficulty of training recurrent neural networks" (arXiv:1211.5063) for clipping by the
global norm, as ``torch.nn.utils.clip_grad_norm_``; schedules in Stable-Baselines3's
``progress_remaining`` (1 at the start of training, 0 at the end).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Dict, Tuple

import numpy as np

from ppo_ref._checks import (check_adam_hyperparameters, check_choice, check_nonnegative,
                             check_param_dict, check_positive, check_same_keys, check_step_count,
                             check_unit_interval)

__all__ = ["adam_init", "adam_update", "adam_element", "adam_step_scalars", "global_norm",
           "clip_by_global_norm", "linear_schedule", "scheduled_value", "CLIP_NORM_EPS"]

#: Added to the global norm before dividing (torch ``clip_grad_norm_`` uses the same 1e-6).
CLIP_NORM_EPS = 1e-6

Arrays = Dict[str, np.ndarray]


def adam_init(params: Mapping[str, np.ndarray]) -> dict:
    """Fresh Adam state ``{"t": 0, "m": {name: zeros_like(p)}, "v": {name: zeros_like(p)}}``:
    ``t`` the number of updates taken (a Python int), ``m`` and ``v`` the first and second
    moment estimates (dtype and shape of each parameter). Raises ``ValueError`` unless
    ``params`` is a dict of float arrays."""
    check_param_dict(params, "params")
    return {"t": 0,
            "m": {k: np.zeros(np.shape(p), np.asarray(p).dtype) for k, p in params.items()},
            "v": {k: np.zeros(np.shape(p), np.asarray(p).dtype) for k, p in params.items()}}


def adam_element(param, grad, m, v, beta1, beta2, step_size, bias_correction2_sqrt, eps):
    """One Adam step of one parameter entry (or, element-wise, of float64 arrays)::

        m'     = beta1 * m + (1 - beta1) * g
        v'     = beta2 * v + (1 - beta2) * g * g
        param' = param - step_size * m' / (sqrt(v') / bias_correction2_sqrt + eps)

    with ``step_size = lr / (1 - beta1**t)`` and ``bias_correction2_sqrt = sqrt(1 - beta2**t)``
    (:func:`adam_step_scalars`), so ``eps`` is added after ``sqrt(v_hat)`` in the operation
    order of torch's single-tensor Adam (torch updates ``m`` by ``lerp``: equal up to ~1 ulp).
    Returns ``(param', m', v')``.
    """
    m_new = beta1 * m + (1.0 - beta1) * grad
    v_new = beta2 * v + (1.0 - beta2) * grad * grad
    denom = np.true_divide(np.sqrt(v_new), bias_correction2_sqrt) + eps
    return param - np.true_divide(step_size * m_new, denom), m_new, v_new


def adam_step_scalars(t: int, lr: float, beta1: float, beta2: float) -> Tuple[float, float]:
    """``(step_size, bias_correction2_sqrt) = (lr / (1 - beta1**t), (1 - beta2**t) ** 0.5)``
    for the new step count ``t >= 1``."""
    return lr / (1.0 - beta1 ** t), (1.0 - beta2 ** t) ** 0.5


def _check_adam_state(state, params: Mapping) -> int:
    if not isinstance(state, Mapping) or not {"t", "m", "v"} <= set(state):
        raise ValueError("state must be an Adam state from adam_init (keys 't', 'm', 'v')")
    t = check_step_count(state["t"])
    for moment in ("m", "v"):
        moments = state[moment]
        if not isinstance(moments, Mapping):
            raise ValueError(f"state['{moment}'] must be a dict of arrays keyed like params, got "
                             f"{type(moments).__name__}")
        if moments.keys() != params.keys():
            check_same_keys(params, "params", moments, f"state['{moment}']")
        for k, p in params.items():
            if np.shape(moments[k]) != np.shape(p):
                raise ValueError(f"state['{moment}'][{k!r}] has shape {np.shape(moments[k])}, "
                                 f"params[{k!r}] has shape {np.shape(p)}")
    return t


def adam_update(params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], state: dict,
                *, lr: float, betas: Tuple[float, float] = (0.9, 0.999),
                eps: float = 1e-5) -> Tuple[Arrays, dict]:
    """One step of ``torch.optim.Adam`` (no weight decay, no amsgrad): :func:`adam_element` of
    every array with the new step count ``t = state["t"] + 1``. Gradients and moments are cast
    to the parameter's dtype, computed in float64 and rounded once to that dtype (torch
    computes float32 in float32: about one float32 ulp apart).

    Args:
        params: ``{name: float ndarray}``, the current parameters.
        grads: finite, with exactly the keys and shapes of ``params`` (of the loss to minimize).
        state: from :func:`adam_init` or a previous call (never modified).
        lr: keyword-only, >= 0.
        betas: ``(beta1, beta2)``, each in [0, 1).
        eps: >= 0 (PPO implementations use 1e-5, not torch's 1e-8).

    Returns ``(new_params, new_state)``, new dicts of new arrays in the parameters' dtypes.
    Raises ``ValueError`` when key sets differ (naming the key), a shape differs, a gradient,
    parameter or moment is not finite (or the step overflows), or ``lr``, ``betas`` or ``eps``
    are out of range.
    """
    check_param_dict(params, "params")
    check_param_dict(grads, "grads")
    if grads.keys() != params.keys():
        check_same_keys(params, "params", grads, "grads")
    t_prev = _check_adam_state(state, params)
    lr, beta1, beta2, eps = check_adam_hyperparameters(lr, betas, eps)
    for k, p in params.items():
        if np.shape(grads[k]) != np.shape(p):
            raise ValueError(f"grads[{k!r}] has shape {np.shape(grads[k])}, params[{k!r}] has "
                             f"shape {np.shape(p)}")
    t = t_prev + 1
    step_size, bias_correction2_sqrt = adam_step_scalars(t, lr, beta1, beta2)

    new_params: Arrays = {}
    new_m: Arrays = {}
    new_v: Arrays = {}
    not_finite = []
    for k, p in params.items():
        dtype = np.asarray(p).dtype

        def wide(x):  # in the parameter's dtype, then widened to float64 for the arithmetic
            return np.asarray(x).astype(dtype, copy=False).astype(np.float64)

        p64, g64, m64, v64 = wide(p), wide(grads[k]), wide(state["m"][k]), wide(state["v"][k])
        if not np.isfinite(g64).all():
            not_finite.append(k)
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            results = [r.astype(dtype) for r in adam_element(
                p64, g64, m64, v64, beta1, beta2, step_size, bias_correction2_sqrt, eps)]
        if not all(np.isfinite(r).all() for r in results):
            raise ValueError(f"params[{k!r}] and state['m'/'v'][{k!r}] must be finite: the step "
                             "gives inf or nan (the parameters or moments given already hold them, "
                             "or the step overflowed)")
        new_params[k], new_m[k], new_v[k] = results
    if not_finite:
        raise ValueError(f"grads{not_finite} must be finite (clip_by_global_norm reports this as "
                         "FloatingPointError before the step)")
    return new_params, {"t": t, "m": new_m, "v": new_v}


def _array_norms(grads: Mapping[str, np.ndarray]) -> Tuple[Dict[str, float], float]:
    """Per-array L2 norms (float64) and the global norm, the norm of the per-array norms (as
    torch computes it); inf or nan propagate."""
    per_array = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for k, g in grads.items():
            g64 = np.asarray(g, dtype=np.float64)
            per_array[k] = math.sqrt(float(np.sum(g64 * g64)))
    total = 0.0
    for value in per_array.values():
        total += value * value
    return per_array, math.sqrt(total)


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """``sqrt(sum_k sum_i grads[k][i]**2)``, the L2 norm of all gradients as one vector,
    computed as the norm of the per-array norms (as torch), in float64; may be inf or nan.
    Raises ``ValueError`` unless ``grads`` is a dict of float arrays."""
    check_param_dict(grads, "grads")
    return _array_norms(grads)[1]


def clip_by_global_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> Tuple[Arrays, float]:
    """Rescale gradients so that their global L2 norm is at most (about) ``max_norm``::

        norm  = sqrt(sum over every array and entry of g**2)        (float64)
        scale = max_norm / (norm + 1e-6)
        g'    = g * scale   if scale < 1   else   g

    (torch ``clip_grad_norm_``; SB3 and CleanRL pass ``max_grad_norm``). ``max_norm`` > 0.
    Returns ``(clipped_grads, norm)``: new arrays in the input dtypes and the norm before
    clipping (a Python float). Raises ``FloatingPointError`` when the norm is inf or nan,
    naming the arrays with non-finite values (or, after an overflow of finite values, the
    largest arrays), so the caller can skip the step; ``ValueError`` for ``max_norm`` <= 0 or
    ``grads`` not a dict of float arrays.
    """
    check_param_dict(grads, "grads")
    max_norm = check_positive(max_norm, "max_norm")
    per_array, norm = _array_norms(grads)
    if not math.isfinite(norm):
        bad = [k for k, g in grads.items() if not np.isfinite(np.asarray(g)).all()]
        if bad:
            raise FloatingPointError(
                f"gradient norm is {norm}: non-finite gradient values in {bad}")
        largest = sorted(per_array, key=lambda k: -per_array[k])[:3]
        raise FloatingPointError(
            f"gradient norm is {norm}: the sum of squares overflowed; largest arrays {largest}")
    scale = max_norm / (norm + CLIP_NORM_EPS)
    if scale < 1.0:
        return {k: np.asarray(g) * scale for k, g in grads.items()}, norm
    return {k: np.array(g, copy=True) for k, g in grads.items()}, norm


def linear_schedule(initial: float, progress_remaining: float) -> float:
    """``initial * progress_remaining``, with ``progress_remaining = 1 - steps_done /
    total_steps`` (rl-baselines3-zoo ``lin_<value>``; the step count is the trainer's choice,
    ``PPOConfig.schedule_progress``). Raises ``ValueError`` for ``initial`` negative or not
    finite, or ``progress_remaining`` outside [0, 1]."""
    initial = check_nonnegative(initial, "initial")
    progress_remaining = check_unit_interval(progress_remaining, "progress_remaining")
    return initial * progress_remaining


def scheduled_value(schedule: str, initial: float, progress_remaining: float) -> float:
    """A hyperparameter under ``schedule``: ``initial`` ("constant") or
    :func:`linear_schedule` ("linear"). Raises ``ValueError`` for an unknown ``schedule`` or
    arguments :func:`linear_schedule` refuses."""
    check_choice(schedule, "schedule", ("constant", "linear"))
    if schedule == "constant":
        check_unit_interval(progress_remaining, "progress_remaining")
        return check_nonnegative(initial, "initial")
    return linear_schedule(initial, progress_remaining)
