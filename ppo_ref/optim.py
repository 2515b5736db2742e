"""Optimizer pieces: Adam (torch convention), global-norm gradient clipping, schedules.

Parameters, gradients and Adam moments are dicts ``{name: float ndarray}`` with identical keys
(the layout of ``ppo_ref.nn``). Every function here is pure: it returns new dicts and new arrays
and never writes into its inputs, so a caller can keep the previous parameters for a comparison
or a rollback.

Sources: Kingma & Ba, "Adam: A Method for Stochastic Optimization" (arXiv:1412.6980),
Algorithm 1, with the placement of ``eps`` used by ``torch.optim.Adam`` (added to
``sqrt(v_hat)``, i.e. *after* the bias correction of the second moment); Pascanu, Mikolov &
Bengio, "On the difficulty of training recurrent neural networks" (arXiv:1211.5063) for clipping
by the global norm, in the convention of ``torch.nn.utils.clip_grad_norm_`` (scale
``max_norm / (norm + 1e-6)``, applied only when below 1). Schedules follow Stable-Baselines3's
``progress_remaining`` (1 at the start of training, 0 at the end).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Dict, Tuple

import numpy as np

from ppo_ref._numba import njit
from ppo_ref.flat import FlatArrays, is_flat, same_layout
from ppo_ref._checks import (check_choice, check_nonnegative, check_positive,
                             check_real_scalar, check_unit_interval)

__all__ = [
    "adam_init",
    "adam_update",
    "adam_state_to_arrays",
    "adam_state_from_arrays",
    "clip_by_global_norm",
    "clipped_adam_step",
    "global_norm",
    "linear_schedule",
    "scheduled_value",
    "CLIP_NORM_EPS",
]

#: Added to the global norm before dividing (torch ``clip_grad_norm_`` uses the same 1e-6).
CLIP_NORM_EPS = 1e-6

Arrays = Dict[str, np.ndarray]


def _check_param_dict(params, name: str) -> None:
    if not isinstance(params, Mapping):
        raise ValueError(f"{name} must be a dict of float arrays, got {type(params).__name__}")
    for key, value in params.items():
        if not isinstance(key, str):
            raise ValueError(f"{name} keys must be strings, got {key!r}")
        dtype = value.dtype if isinstance(value, np.ndarray) else np.asarray(value).dtype
        if dtype != np.float64 and dtype != np.float32:
            raise ValueError(f"{name}[{key!r}] must be a float32 or float64 array, got dtype {dtype}")


def _check_same_keys(a: Mapping, a_name: str, b: Mapping, b_name: str) -> None:
    missing = [k for k in a if k not in b]
    extra = [k for k in b if k not in a]
    if missing:
        raise ValueError(f"{b_name} is missing key(s) {missing} present in {a_name}")
    if extra:
        raise ValueError(f"{b_name} has extra key(s) {extra} not present in {a_name}")


def adam_init(params: Mapping[str, np.ndarray]) -> dict:
    """Fresh Adam state for ``params``: step count 0 and zero moments.

    Args:
        params: ``{name: float32/float64 ndarray}``.

    Returns:
        ``{"t": 0, "m": {name: zeros_like(p)}, "v": {name: zeros_like(p)}}`` where ``t`` is the
        number of updates taken so far (a Python int), ``m`` the first-moment (mean) estimates and
        ``v`` the second-moment (uncentered variance) estimates, each with the dtype and shape of
        its parameter.

    Raises:
        ValueError: ``params`` is not a dict of float arrays.
    """
    _check_param_dict(params, "params")
    if is_flat(params):  # moments in the same one-buffer layout (fused update)
        m, v = params.empty_like(), params.empty_like()
        m.flat[:] = 0.0
        v.flat[:] = 0.0
        return {"t": 0, "m": m, "v": v}
    return {
        "t": 0,
        "m": {k: np.zeros_like(np.asarray(p)) for k, p in params.items()},
        "v": {k: np.zeros_like(np.asarray(p)) for k, p in params.items()},
    }


def _check_adam_state(state, params: Mapping) -> int:
    if not isinstance(state, Mapping) or not {"t", "m", "v"} <= set(state):
        raise ValueError("state must be an Adam state from adam_init (keys 't', 'm', 'v')")
    t = state["t"]
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state['t'] must be a non-negative int, got {t!r}")
    for moment in ("m", "v"):
        moments = state[moment]
        if not isinstance(moments, Mapping):
            raise ValueError(f"state['{moment}'] must be a dict of arrays keyed like params, got "
                             f"{type(moments).__name__}")
        if moments.keys() != params.keys():
            _check_same_keys(params, "params", moments, f"state['{moment}']")
        for k, p in params.items():
            if np.shape(moments[k]) != np.shape(p):
                raise ValueError(f"state['{moment}'][{k!r}] has shape {np.shape(moments[k])}, "
                                 f"params[{k!r}] has shape {np.shape(p)}")
    return int(t)


@njit
def _adam_kernel(param, grad, m, v, beta1, beta2, step_size, bias_correction2_sqrt, eps,
                 param_out, m_out, v_out):
    """One Adam step over flat arrays (operation order of torch's single-tensor Adam).

    Arithmetic is float64 for float32 arrays too (each load widened with np.float64(), the
    results rounded once on store), so compiled and pure-Python runs agree bit for bit.

    Returns ``(grad_finite, result_finite)``: whether every gradient entry, and every new
    parameter and moment, is finite (a non-finite result from finite gradients means the
    parameters or moments given were not finite)."""
    grad_finite = True
    result_finite = True
    for i in range(param.size):
        g = np.float64(grad[i])
        m_i = beta1 * np.float64(m[i]) + (1.0 - beta1) * g
        v_i = beta2 * np.float64(v[i]) + (1.0 - beta2) * g * g
        denom = math.sqrt(v_i) / bias_correction2_sqrt + eps
        param_out[i] = np.float64(param[i]) - step_size * m_i / denom
        m_out[i] = m_i
        v_out[i] = v_i
        grad_finite &= math.isfinite(g)
        result_finite &= (math.isfinite(param_out[i]) & math.isfinite(m_out[i])
                          & math.isfinite(v_out[i]))
    return grad_finite, result_finite


#: The largest finite float64: ``abs(x) <= _FLOAT64_MAX`` is False exactly for inf and nan.
_FLOAT64_MAX = float(np.finfo(np.float64).max)


@njit
def _clipped_adam_element(param, grad, scale, m, v, beta1, beta2, step_size,
                          bias_correction2_sqrt, eps):
    """One entry of :func:`_clipped_adam_kernel`: ``(param', m', v', finite)`` for the
    gradient ``grad * scale``, ``finite`` 1 when all three results are finite, else 0 (LLVM
    inlines it into both kernel loops)."""
    g = grad * scale
    m_i = beta1 * m + (1.0 - beta1) * g
    v_i = beta2 * v + (1.0 - beta2) * g * g
    denom = np.true_divide(math.sqrt(v_i), bias_correction2_sqrt) + eps
    p_i = param - np.true_divide(step_size * m_i, denom)
    finite = ((abs(p_i) <= _FLOAT64_MAX) & (abs(m_i) <= _FLOAT64_MAX)
              & (abs(v_i) <= _FLOAT64_MAX))
    return p_i, m_i, v_i, finite


@njit
def _clipped_adam_kernel(param, grad, scale, m, v, beta1, beta2, step_size,
                         bias_correction2_sqrt, eps, param_out, m_out, v_out):
    """:func:`_adam_kernel` on the gradient ``grad * scale`` (float64 arrays; ``scale`` < 1, or
    exactly 1.0 when there is no clipping: ``g * 1.0`` is ``g`` bit for bit): the element-wise
    product :func:`clip_by_global_norm` computes, then the same Adam arithmetic
    (:func:`_clipped_adam_element`), in one pass. Returns whether every result is finite.

    Written so LLVM vectorizes it (about 2x faster than the scalar loop, same bits): the
    divisions are ``np.true_divide`` (IEEE division; numba's ``/`` on floats adds a
    ZeroDivisionError branch that blocks vectorization, and no denominator here can be 0 for
    a finite step: ``sqrt(v) / c2 + eps`` with ``c2 > 0``), and finiteness is counted with
    comparisons (an integer sum) instead of a boolean ``&=`` chain. The outputs must not
    overlap the inputs (LLVM checks at run time and takes its scalar loop if they do: use
    :func:`_clipped_adam_kernel_in_place` for an in-place step)."""
    n_finite = 0
    n = param.size
    for i in range(n):
        p_i, m_i, v_i, finite = _clipped_adam_element(
            param[i], grad[i], scale, m[i], v[i], beta1, beta2, step_size,
            bias_correction2_sqrt, eps)
        param_out[i] = p_i
        m_out[i] = m_i
        v_out[i] = v_i
        n_finite += finite
    return n_finite == n


@njit
def _clipped_adam_kernel_in_place(param, grad, scale, m, v, beta1, beta2, step_size,
                                  bias_correction2_sqrt, eps):
    """:func:`_clipped_adam_kernel` writing the results into ``param``, ``m`` and ``v``
    themselves (each entry read before it is written; ``grad`` must not overlap them), the same
    arithmetic (:func:`_clipped_adam_element`) and bits, vectorized as that kernel."""
    n_finite = 0
    n = param.size
    for i in range(n):
        p_i, m_i, v_i, finite = _clipped_adam_element(
            param[i], grad[i], scale, m[i], v[i], beta1, beta2, step_size,
            bias_correction2_sqrt, eps)
        param[i] = p_i
        m[i] = m_i
        v[i] = v_i
        n_finite += finite
    return n_finite == n


def clipped_adam_step(params, grads, state, *, max_norm: float, lr: float,
                      betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-5, out=None):
    """``clip_by_global_norm(grads, max_norm)`` then ``adam_update(params, clipped, state, lr=lr,
    betas=betas, eps=eps)`` in two kernel passes over one-buffer float64 dicts
    (:class:`~ppo_ref.flat.FlatArrays` of one layout): the same arithmetic, so the same bits,
    without materialising the clipped gradients.

    ``out``: optional ``(params_out, m_out, v_out)``, intact float64 ``FlatArrays`` of the same
    layout, each buffer owning its memory, distinct, and not ``params``, ``grads``,
    ``state["m"]``, ``state["v"]`` nor the base of any of them:
    the results are written into them and they are returned (``new_state`` is a new dict
    holding ``m_out``, ``v_out``), sparing three buffers and their views per step (a loop of
    steps can alternate between two sets). Anything else raises ``ValueError``.

    Returns ``(new_params, new_state, norm)`` (``norm`` before clipping), or ``None`` when the
    arguments are not such dicts (call the two functions instead). Raises as they do
    (``FloatingPointError`` for a non-finite norm, ``ValueError`` for bad arguments or a
    non-finite step).
    """
    if not (isinstance(state, Mapping) and "t" in state and "m" in state and "v" in state
            and _flat64_group((params, grads, state["m"], state["v"]))):
        return None
    return _flat_clipped_adam_step(params, grads, state, max_norm, lr, betas, eps, out, False)


def _clipped_adam_step_in_place(params, grads, state, *, max_norm: float, lr: float,
                                betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-5):
    """:func:`clipped_adam_step` writing the new parameters and moments into ``params.flat``,
    ``state["m"].flat`` and ``state["v"].flat`` themselves (same kernels, same bits): for a loop
    that owns those buffers (:func:`ppo_ref.update.run_epochs` from its second step on). Three
    fewer buffers stream through the caches per step than with ``out=``.

    Applies when ``params``, ``grads`` and both moments are intact float64 ``FlatArrays`` of one
    layout and the buffers of ``params`` and the moments own their memory and are distinct, and
    ``grads``' buffer is none of them nor a view of one (so nothing read overlaps another
    buffer's writes); returns ``None`` otherwise (nothing written). Returns ``(params,
    new_state, norm)``: ``params`` itself and a new state dict holding the same moment
    FlatArrays. Raises as :func:`clipped_adam_step`, the arguments checked before anything is
    written (a step whose results are not finite, only possible from non-finite parameters or
    moments or an overflow, raises ``ValueError`` naming the array after writing them).
    """
    if not (isinstance(state, Mapping) and "t" in state and "m" in state and "v" in state
            and _flat64_group((params, grads, state["m"], state["v"]))):
        return None
    owners = (params.flat, state["m"].flat, state["v"].flat)
    g = grads.flat
    for i, b in enumerate(owners):
        if b.base is not None or g is b or g.base is b or any(b is o for o in owners[:i]):
            return None
    return _flat_clipped_adam_step(params, grads, state, max_norm, lr, betas, eps, None, True)


def _flat_clipped_adam_step(params, grads, state, max_norm, lr, betas, eps, out, in_place):
    """The body of :func:`clipped_adam_step` (``in_place`` False) and
    :func:`_clipped_adam_step_in_place` (True), on checked one-buffer float64 dicts."""
    # the checks of the two functions; plain finite Python floats in range pass without the
    # general helpers (the same values: those helpers return float(value))
    if not (type(max_norm) is float and 0.0 < max_norm < math.inf):
        max_norm = check_positive(max_norm, "max_norm")
    starts, stops = _layout_segments(grads.layout)
    norm = _segmented_global_norm(grads.flat, starts, stops)
    if not math.isfinite(norm):
        clip_by_global_norm(grads, max_norm)  # raises, naming the arrays
    scale = max_norm / (norm + CLIP_NORM_EPS)
    t_prev = state["t"]
    if type(t_prev) is not int and (isinstance(t_prev, (bool, np.bool_))
                                     or not isinstance(t_prev, (int, np.integer))) \
            or t_prev < 0:
        raise ValueError(f"state['t'] must be a non-negative int, got {t_prev!r}")
    if not (type(lr) is float and 0.0 <= lr < math.inf):
        lr = check_nonnegative(lr, "lr")
    if not (type(eps) is float and 0.0 <= eps < math.inf):
        eps = check_nonnegative(eps, "eps")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    beta1, beta2 = betas
    if not (type(beta1) is float and type(beta2) is float and 0.0 <= beta1 < 1.0
            and 0.0 <= beta2 < 1.0):
        beta1 = check_real_scalar(beta1, "betas[0]")
        beta2 = check_real_scalar(beta2, "betas[1]")
        for b, name in ((beta1, "betas[0]"), (beta2, "betas[1]")):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {b}")
    t = int(t_prev) + 1
    step_size = lr / (1.0 - beta1 ** t)
    bias_correction2_sqrt = (1.0 - beta2 ** t) ** 0.5
    layout = params.layout
    targets = None
    if in_place:
        p_out, m_out, v_out = params.flat, state["m"].flat, state["v"].flat
    elif out is None:
        p_out, m_out, v_out = (np.empty(layout.size) for _ in range(3))
    else:
        targets = _check_step_out(out, params, grads, state)
        p_out, m_out, v_out = (a.flat for a in targets)
    if in_place:
        ok = _clipped_adam_kernel_in_place(p_out, grads.flat, scale if scale < 1.0 else 1.0,
                                           m_out, v_out, beta1, beta2, step_size,
                                           bias_correction2_sqrt, eps)
    else:
        ok = _clipped_adam_kernel(params.flat, grads.flat, scale if scale < 1.0 else 1.0,
                                  state["m"].flat, state["v"].flat, beta1, beta2, step_size,
                                  bias_correction2_sqrt, eps, p_out, m_out, v_out)
    if not ok:
        if in_place:  # the inputs are overwritten: name the array from the results
            bad = ~(np.isfinite(p_out) & np.isfinite(m_out) & np.isfinite(v_out))
            key = _key_at(layout, int(np.argmax(bad)))
            raise ValueError(f"params[{key!r}] and state['m'/'v'][{key!r}] must be finite: the "
                             "step gives inf or nan (the parameters or moments given already "
                             "hold them, or the step overflowed)")
        clipped, _ = clip_by_global_norm(grads, max_norm)
        adam_update(params, clipped, state, lr=lr, betas=betas, eps=eps)  # raises, naming it
        raise ValueError("the Adam step gives inf or nan")  # (not reached)
    if in_place:
        return params, {"t": t, "m": state["m"], "v": state["v"]}, norm
    if targets is not None:
        return targets[0], {"t": t, "m": targets[1], "v": targets[2]}, norm
    return (FlatArrays.from_buffer(p_out, layout),
            {"t": t, "m": FlatArrays.from_buffer(m_out, layout),
             "v": FlatArrays.from_buffer(v_out, layout)}, norm)


def _key_at(layout, index: int) -> str:
    """The key of a FlatLayout whose entry holds buffer position ``index``."""
    for key, start, stop, _ in layout.slices:
        if start <= index < stop:
            return key
    raise IndexError(index)


def _flat64_group(arrays) -> bool:
    """:func:`ppo_ref.flat.same_layout` of ``arrays`` with float64 buffers."""
    return same_layout(*arrays) and arrays[0].flat.dtype == np.float64


def _check_step_out(out, params, grads, state):
    """``out`` of :func:`clipped_adam_step` as a checked triple (see there); ``params`` has
    been checked (an intact float64 FlatArrays)."""
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise ValueError("out must be a triple (params_out, m_out, v_out) of FlatArrays")
    if not _flat64_group((params,) + tuple(out)):
        raise ValueError("out must hold intact FlatArrays in the layout and dtype of params")
    inputs = (params.flat, grads.flat, state["m"].flat, state["v"].flat)
    buffers = [a.flat for a in out]
    # a buffer that owns its memory overlaps another array only if that array is it or a
    # view of it (numpy's base is the owner); distinct owners never overlap
    for i, b in enumerate(buffers):
        if b.base is not None:
            raise ValueError("out buffers must own their memory (not be views)")
        for x in inputs:
            if x is b or x.base is b:
                raise ValueError("out buffers must not overlap the inputs")
        if any(b is y for y in buffers[:i]):
            raise ValueError("out buffers must be distinct")
    return tuple(out)


def adam_update(params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], state: dict,
                *, lr: float, betas: Tuple[float, float] = (0.9, 0.999),
                eps: float = 1e-5) -> Tuple[Arrays, dict]:
    """One Adam step, exactly the update of ``torch.optim.Adam`` (no weight decay, no amsgrad).

    With ``t`` the new step count (1 on the first call) and, per parameter array,

        m_t   = beta1 * m_{t-1} + (1 - beta1) * g
        v_t   = beta2 * v_{t-1} + (1 - beta2) * g**2
        theta = theta - (lr / (1 - beta1**t)) * m_t / (sqrt(v_t) / sqrt(1 - beta2**t) + eps)

    i.e. bias-corrected moments with ``eps`` added *after* ``sqrt(v_hat)`` (Kingma & Ba 2014,
    Algorithm 1; torch's placement of ``eps``). Torch updates ``m`` with ``lerp`` (``m + (1 -
    beta1) (g - m)``), which equals the first line up to rounding (~1 ulp). float32 parameters
    are updated in float64 arithmetic and rounded once to float32 (torch computes in float32:
    differences of about one float32 ulp).

    Args:
        params: ``{name: float ndarray}``, the current parameters.
        grads: ``{name: float ndarray}`` with exactly the keys and shapes of ``params``: the
            gradient of the loss to *minimize*. Must be finite.
        state: Adam state from :func:`adam_init` or a previous call (never modified).
        lr: learning rate (step size), >= 0.
        betas: ``(beta1, beta2)``, each in [0, 1).
        eps: added to the denominator, >= 0. PPO implementations use 1e-5 (SB3, CleanRL), not
            torch's 1e-8 default.

    Returns:
        ``(new_params, new_state)``: new dicts of new arrays (each in its parameter's dtype);
        ``new_state["t"] == state["t"] + 1``.

    One-buffer fast path: when ``params``, ``grads`` and both moments are intact
    :class:`~ppo_ref.flat.FlatArrays` of one layout and dtype (``adam_init`` of a FlatArrays
    gives such moments), the step is one kernel call over the whole buffer and the results are
    new FlatArrays of that layout. Same arithmetic per element, so the same bits.

    Raises:
        ValueError: key sets differ (the message names the missing or extra key), a shape differs,
            a gradient is not finite, a parameter or moment is not finite (or the step
            overflows), or ``lr``/``betas``/``eps`` are out of range.
    """
    flat = (isinstance(state, Mapping) and {"t", "m", "v"} <= state.keys()
            and same_layout(params, grads, state["m"], state["v"])
            and params.flat.dtype in (np.float64, np.float32))
    if flat:  # one layout and dtype: keys and shapes agree by construction
        t_prev = state["t"]
        if isinstance(t_prev, (bool, np.bool_)) or not isinstance(t_prev, (int, np.integer)) \
                or t_prev < 0:
            raise ValueError(f"state['t'] must be a non-negative int, got {t_prev!r}")
    else:
        _check_param_dict(params, "params")
        _check_param_dict(grads, "grads")
        if grads.keys() != params.keys():
            _check_same_keys(params, "params", grads, "grads")
        t_prev = _check_adam_state(state, params)
    lr = check_nonnegative(lr, "lr")
    eps = check_nonnegative(eps, "eps")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    beta1 = check_real_scalar(betas[0], "betas[0]")
    beta2 = check_real_scalar(betas[1], "betas[1]")
    for b, name in ((beta1, "betas[0]"), (beta2, "betas[1]")):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {b}")
    if not flat:
        for k, p in params.items():
            if np.shape(grads[k]) != np.shape(p):
                raise ValueError(f"grads[{k!r}] has shape {np.shape(grads[k])}, params[{k!r}] "
                                 f"has shape {np.shape(p)}")

    t = int(t_prev) + 1
    bias_correction1 = 1.0 - beta1 ** t
    bias_correction2 = 1.0 - beta2 ** t
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5

    if flat:
        # One buffer each (ppo_ref.flat): one kernel call over every parameter; element-wise
        # the same arithmetic as the per-array loop below, so the same bits.
        out = np.empty((3, params.layout.size), dtype=params.flat.dtype)
        grad_finite, result_finite = _adam_kernel(
            params.flat, grads.flat, state["m"].flat, state["v"].flat, beta1, beta2, step_size,
            bias_correction2_sqrt, eps, out[0], out[1], out[2])
        if grad_finite and result_finite:
            layout = params.layout
            return (FlatArrays.from_buffer(out[0], layout),
                    {"t": t, "m": FlatArrays.from_buffer(out[1], layout),
                     "v": FlatArrays.from_buffer(out[2], layout)})
        # otherwise the per-array loop below names the offending arrays

    new_params: Arrays = {}
    new_m: Arrays = {}
    new_v: Arrays = {}
    not_finite = []
    for k, p in params.items():
        p = np.asarray(p)
        dtype = p.dtype
        g, m, v = np.asarray(grads[k]), np.asarray(state["m"][k]), np.asarray(state["v"][k])
        if g.dtype != dtype:
            g = g.astype(dtype)
        if m.dtype != dtype or v.dtype != dtype:
            m, v = m.astype(dtype), v.astype(dtype)
        # one buffer for the three results; its rows are disjoint, contiguous arrays
        out = np.empty((3,) + p.shape, dtype=dtype)
        flat_out = out.reshape(3, -1)
        grad_finite, result_finite = _adam_kernel(
            p.ravel(), g.ravel(), m.ravel(), v.ravel(), beta1, beta2, step_size,
            bias_correction2_sqrt, eps, flat_out[0], flat_out[1], flat_out[2])
        if not grad_finite:
            not_finite.append(k)
        elif not result_finite:
            raise ValueError(f"params[{k!r}] and state['m'/'v'][{k!r}] must be finite: the step "
                             "gives inf or nan (the parameters or moments given already hold them, "
                             "or the step overflowed)")
        new_params[k], new_m[k], new_v[k] = out[0], out[1], out[2]
    if not_finite:
        raise ValueError(f"grads{not_finite} must be finite (clip_by_global_norm reports this as "
                         "FloatingPointError before the step)")
    return new_params, {"t": t, "m": new_m, "v": new_v}


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
    _check_same_keys(state["m"], "state['m']", state["v"], "state['v']")
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
    _check_same_keys(m, "first moments (m.*)", v, "second moments (v.*)")
    return {"t": int(t_arr), "m": m, "v": v}


@njit
def _sum_of_squares(x):
    total = 0.0
    for i in range(x.size):
        value = np.float64(x[i])  # (numba's float() would keep a float32 as float32)
        total += value * value
    return total


@njit
def _segment_sums_of_squares(x, starts, stops, out):
    """``out[j] = sum(x[starts[j]:stops[j]] ** 2)``, each accumulated as :func:`_sum_of_squares`."""
    for j in range(starts.size):
        total = 0.0
        for i in range(starts[j], stops[j]):
            value = np.float64(x[i])
            total += value * value
        out[j] = total


@njit
def _segmented_global_norm(x, starts, stops):
    """The global norm exactly as :func:`_array_norms` computes it for a one-buffer dict: per
    segment the sum of squares (as :func:`_sum_of_squares`), its square root, and the square
    root of the sum of those roots squared, segments in key order."""
    total = 0.0
    for j in range(starts.size):
        ss = 0.0
        for i in range(starts[j], stops[j]):
            value = np.float64(x[i])
            ss += value * value
        norm_j = math.sqrt(ss)
        total += norm_j * norm_j
    return math.sqrt(total)


_SEGMENTS: Dict = {}


def _layout_segments(layout):
    """``(starts, stops)`` int64 arrays of a FlatLayout's entries in key order (cached)."""
    seg = _SEGMENTS.get(layout)
    if seg is None:
        starts = np.array([o for _, o, _ in layout.entries], dtype=np.int64)
        sizes = np.array([int(np.prod(s, dtype=np.int64)) for _, _, s in layout.entries],
                         dtype=np.int64)
        seg = _SEGMENTS[layout] = (starts, starts + sizes)
    return seg


def _array_norms(grads: Mapping[str, np.ndarray]) -> Tuple[Dict[str, float], float]:
    """Per-array L2 norms and the global norm (the norm of the per-array norms, as torch),
    accumulated in float64; inf or nan propagate."""
    if is_flat(grads):  # one kernel call over the buffer, same sums in the same order
        starts, stops = _layout_segments(grads.layout)
        sums = np.empty(starts.size, dtype=np.float64)
        _segment_sums_of_squares(grads.flat, starts, stops, sums)
        per_array = {k: math.sqrt(ss) for k, ss in zip(grads, sums.tolist())}
    else:
        per_array = {k: math.sqrt(_sum_of_squares(np.asarray(g).ravel()))
                     for k, g in grads.items()}
    total = 0.0
    for value in per_array.values():
        total += value * value
    return per_array, math.sqrt(total)


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """``sqrt(sum_k sum_i grads[k][i]**2)``: the L2 norm of all gradients as one vector.

    Computed as the norm of the per-array norms (as torch does), in float64. May be inf or nan.
    """
    _check_param_dict(grads, "grads")
    return _array_norms(grads)[1]


def clip_by_global_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> Tuple[Arrays, float]:
    """Rescale gradients so that their global L2 norm is at most (about) ``max_norm``.

        norm  = sqrt(sum over every array and entry of g**2)
        scale = max_norm / (norm + 1e-6)
        g'    = g * scale   if scale < 1   else   g

    (torch ``clip_grad_norm_`` convention; SB3 and CleanRL call it with ``max_grad_norm``.)

    Args:
        grads: ``{name: float ndarray}``.
        max_norm: > 0.

    Returns:
        ``(clipped_grads, norm)``: a new dict of new arrays (input dtypes kept) and the global
        norm *before* clipping, a Python float. For an intact :class:`~ppo_ref.flat.FlatArrays`
        the per-array sums of squares are one kernel call (same sums, same order) and the
        result is a new FlatArrays of the same layout.

    Raises:
        FloatingPointError: the norm is inf or nan; the message names the parameters whose
            gradient holds a non-finite value (or, if every entry is finite but the sum of
            squares overflowed, the arrays with the largest norms). Nothing is returned or
            modified, so the caller can skip the step.
        ValueError: ``max_norm`` <= 0 or ``grads`` is not a dict of float arrays.
    """
    _check_param_dict(grads, "grads")
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
    if is_flat(grads):  # one buffer: one multiply (or copy), same layout
        return FlatArrays.from_buffer(grads.flat * scale if scale < 1.0 else grads.flat.copy(),
                                      grads.layout), norm
    if scale < 1.0:  # a Python float scale keeps float32 arrays float32
        out = {k: np.asarray(g) * scale for k, g in grads.items()}
    else:
        out = {k: np.array(g, copy=True) for k, g in grads.items()}
    return out, norm


def linear_schedule(initial: float, progress_remaining: float) -> float:
    """``initial * progress_remaining``: linear annealing from ``initial`` to 0.

    ``progress_remaining`` is Stable-Baselines3's convention: ``1 - steps_done / total_steps``,
    1.0 at the start of training and 0.0 at the end (rl-baselines3-zoo ``lin_<value>``). Which
    step count is used (before or after the current rollout) is the trainer's choice, see
    ``PPOConfig.schedule_progress``.

    Raises:
        ValueError: ``initial`` negative or not finite, ``progress_remaining`` outside [0, 1].
    """
    initial = check_nonnegative(initial, "initial")
    progress_remaining = check_unit_interval(progress_remaining, "progress_remaining")
    return initial * progress_remaining


def scheduled_value(schedule: str, initial: float, progress_remaining: float) -> float:
    """A hyperparameter's value under ``schedule`` ("constant" or "linear") at this progress.

    "constant" returns ``initial``; "linear" returns :func:`linear_schedule`. The trainers call
    this for ``learning_rate`` (``PPOConfig.lr_schedule``) and ``clip_range``
    (``PPOConfig.clip_range_schedule``).

    Raises:
        ValueError: unknown ``schedule``, or the arguments of :func:`linear_schedule` are invalid.
    """
    check_choice(schedule, "schedule", ("constant", "linear"))
    if schedule == "constant":
        check_unit_interval(progress_remaining, "progress_remaining")
        return check_nonnegative(initial, "initial")
    return linear_schedule(initial, progress_remaining)
