"""GAE and V-trace: the per-env backward recursions over time-major ``[T, N]`` arrays.

:func:`gae` and :func:`vtrace` validate their arguments and run :func:`gae_recursion` and
:func:`vtrace_recursion`, written in the subset of Python numba compiles;
:mod:`ppo_ref.fast.advantages` runs the same validation (:func:`run_gae`, :func:`run_vtrace`)
with ``njit`` of these very functions, bit for bit. No float literal enters the arithmetic, so
float32 arrays are computed in float32 on both tiers.

Sources: Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", ICLR 2016 (arXiv:1506.02438), eq. (11)-(16); Espeholt et al.,
"IMPALA", ICML 2018 (arXiv:1802.01561), eq. (1) and section 4.2, with the trace mixing
``lambda_`` of DeepMind's rlax ``vtrace_td_error_and_advantage``.
"""
import math
from typing import NamedTuple, Optional

import numpy as np

from ppo_ref._checks import (as_flag_array, as_float_array, check_choice, check_positive,
                             check_same_shape, check_unit_interval, result_dtype)
from ppo_ref.spec.masks import TRUNCATION_MODES, transition_flags

__all__ = ["gae", "vtrace", "VTraceReturns"]


def finite_sum(a, b, c):
    """Whether ``a + b + c`` is finite: False when one of them is inf or nan, or when the sum
    of finite numbers overflows (the caller then re-checks the arrays one by one)."""
    return math.isfinite(a + b + c)


def next_value(bootstrap_final, last_row, final_value, last_value, following_value):
    """The value of the state after step ``t`` (:func:`ppo_ref.spec.masks.transition_flags`)::

        next_value[t] = 0                 if terminal[t]            (no bootstrap)
                      = final_values[t]   elif bootstrap_final[t]   (V(final_obs[t]))
                      = values[t+1]       elif t < T-1              (following_value)
                      = last_values       otherwise                 (V(obs[T]))

    All scalars; a terminal step drops the term instead of calling this (no ``gamma * 0``).
    ``following_value`` is ``values[min(t + 1, T - 1)]`` (unused on the last row)."""
    if bootstrap_final:
        return final_value
    if last_row:
        return last_value
    return following_value


def gae_recursion(rewards, values, terminated, truncated, last_values, final_values,
                  gammas, gamma_lambdas, truncation_mode, bootstrap_terminal_last_row,
                  advantages, returns):
    """The GAE recursion, backward over ``t = T-1 .. 0``; writes ``advantages`` and ``returns``::

        delta[t] = rewards[t] + gamma[t] * next_value[t] - values[t]                (eq. 11)
        A[t]     = delta[t] + gamma[t] * lambda[t] * (1 - done[t]) * A[t+1]         (A[T] = 0)
        returns[t] = A[t] + values[t]                 (the TD(lambda) return, value target)

    with :func:`next_value` and ``done`` of :func:`ppo_ref.spec.masks.transition_flags`;
    unrolled, ``A[t] = sum_l (gamma lambda)^l delta[t+l]`` (eq. 16) to the end of the episode
    or rollout. Arrays ``[T, N]`` of one float dtype (flags bool, ``last_values [N]``,
    ``gamma_lambdas`` = gamma * lambda rounded once); ``truncation_mode`` a code of
    :data:`ppo_ref.spec.masks.TRUNCATION_MODES`; ``bootstrap_terminal_last_row``: a terminal
    step on the last row still bootstraps ``last_values`` (thrust-rl 0.4). Returns whether
    ``rewards``, ``values``, ``final_values`` and the results are all finite.
    """
    n_steps, n_envs = rewards.shape
    all_finite = True
    for t in range(n_steps - 1, -1, -1):
        last_row = t == n_steps - 1
        for n in range(n_envs):
            terminal, from_final, done = transition_flags(terminated[t, n], truncated[t, n],
                                                          truncation_mode)
            reward, value, final_value = rewards[t, n], values[t, n], final_values[t, n]
            gamma = gammas[t, n]
            if terminal and not (last_row and bootstrap_terminal_last_row):
                delta = reward - value                               # next_value = 0
            else:
                following = values[min(t + 1, n_steps - 1), n]
                delta = (reward + gamma * next_value(from_final, last_row, final_value,
                                                     last_values[n], following)
                         - value)
            if done or last_row:
                adv = delta                                          # trace cut (or A[T] = 0)
            else:
                adv = delta + gamma_lambdas[t, n] * advantages[t + 1, n]
            ret = adv + value
            advantages[t, n] = adv
            returns[t, n] = ret
            all_finite &= finite_sum(reward, final_value, ret)       # (ret = adv + value)
    return all_finite


def log_ratios(target_log_probs, behaviour_log_probs, out):
    """``out[i] = target_log_probs[i] - behaviour_log_probs[i]`` over 1-D arrays (the log of the
    importance weight pi/mu); returns whether every difference is finite."""
    all_finite = True
    for i in range(out.size):
        out[i] = target_log_probs[i] - behaviour_log_probs[i]
        all_finite &= math.isfinite(out[i])
    return all_finite


def vtrace_recursion(ratios, rewards, values, terminated, truncated, last_values, final_values,
                     gammas, rho_bar, c_bar, pg_rho_bar, lambdas, one_minus_lambdas,
                     truncation_mode, bootstrap_terminal_last_row, vs, pg_advantages):
    """The V-trace recursion, backward over ``t = T-1 .. 0``; writes ``vs`` and
    ``pg_advantages``.

    With ``ratio[t] = pi(a_t|x_t) / mu(a_t|x_t)`` (``ratios``; inf allowed: the bars clip it),
    ``rho[t] = min(rho_bar, ratio[t])``, ``c[t] = lambda[t] * min(c_bar, ratio[t])`` and
    :func:`next_value`::

        vs[t] = values[t] + rho[t] * (rewards[t] + gamma[t] * next_value[t] - values[t])
                + gamma[t] * (1 - done[t]) * c[t] * (vs[t+1] - values[t+1])   (0 at t = T-1)
        q[t]  = rewards[t] + gamma[t] * X[t],
                X[t] = 0                                    if terminal[t]
                     = next_value[t]                        elif done[t] or t = T-1
                     = lambda[t] * vs[t+1] + (1 - lambda[t]) * values[t+1]    otherwise
        pg_advantages[t] = min(pg_rho_bar, ratio[t]) * (q[t] - values[t])

    Unrolled, ``vs`` is IMPALA eq. (1), ``v_s = V(x_s) + sum_{t >= s} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) rho_t delta_t V``. On-policy (ratio 1, bars >= 1, lambda 1) these
    are GAE's returns and advantages with ``gae_lambda = 1``. Arguments and result as
    :func:`gae_recursion`, plus ``ratios``, ``lambdas``, ``one_minus_lambdas`` (rounded once)
    ``[T, N]`` and the scalars ``rho_bar``, ``c_bar``, ``pg_rho_bar``, of the arrays' dtype.
    """
    n_steps, n_envs = rewards.shape
    all_finite = True
    for t in range(n_steps - 1, -1, -1):
        last_row = t == n_steps - 1
        for n in range(n_envs):
            terminal, from_final, done = transition_flags(terminated[t, n], truncated[t, n],
                                                          truncation_mode)
            ratio = ratios[t, n]
            reward, value, final_value = rewards[t, n], values[t, n], final_values[t, n]
            gamma = gammas[t, n]
            if terminal and not (last_row and bootstrap_terminal_last_row):
                target = reward                                      # next_value = 0
            else:
                following = values[min(t + 1, n_steps - 1), n]
                target = reward + gamma * next_value(from_final, last_row, final_value,
                                                     last_values[n], following)
            v_s = value + min(rho_bar, ratio) * (target - value)
            if done or last_row:
                q = target                                           # X[t] = next_value[t]
            else:
                lambda_ = lambdas[t, n]
                c = lambda_ * min(c_bar, ratio)
                v_s = v_s + gamma * c * (vs[t + 1, n] - values[t + 1, n])
                q = reward + gamma * (lambda_ * vs[t + 1, n]
                                      + one_minus_lambdas[t, n] * values[t + 1, n])
            pg_advantage = min(pg_rho_bar, ratio) * (q - value)
            vs[t, n] = v_s
            pg_advantages[t, n] = pg_advantage
            all_finite &= finite_sum(reward, final_value, v_s + pg_advantage)  # (v_s has value)
    return all_finite


class TrajectoryInputs(NamedTuple):
    """Validated C-contiguous inputs, ``[T, N]`` (``last_values``: ``[N]``)."""

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
    """Whether ``raw`` takes part in the float32/float64 decision: arrays and NumPy scalars of
    a floating dtype do, Python scalars never (np.float64 subclasses float but counts)."""
    if isinstance(raw, (bool, int, float)) and not isinstance(raw, np.generic):
        return False
    return np.asarray(raw).dtype.kind == "f"


def prepare_trajectory(float_inputs: dict, terminated, truncated, last_values,
                       final_values: Optional[object], truncation: str,
                       bootstrap_terminal_last_row) -> TrajectoryInputs:
    """Validate the trajectory arguments of :func:`gae` / :func:`vtrace` (``float_inputs``: name
    -> ``[T]``/``[T, N]`` array, shaped like ``float_inputs["rewards"]``) and convert them to
    C-contiguous ``[T, N]`` arrays of one float dtype. Raises ``ValueError`` naming the argument.
    Finiteness of the ``[T, N]`` arrays is left to the recursions' flag
    (:func:`explain_not_finite`)."""
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
        raise ValueError("final_values is required: truncated has True entries")

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
    """Called when a recursion's finiteness flag is False: raises ``ValueError`` naming the
    first of ``names`` that holds inf or nan (with its index), else the first of ``results``
    (name -> array) that is not finite ("overflow"); returns when all is finite (a false alarm
    of the loop's check on huge finite numbers)."""
    for name in names:
        if name in inputs.given:
            as_float_array(inputs.given[name], name)  # raises, naming the argument
    for name, result in results.items():
        if not np.isfinite(result).all():
            given = ", ".join(n for n in ("rewards", "values", "final_values", "last_values")
                              if n in inputs.given)
            raise ValueError(f"{name} overflow {inputs.dtype}: {given} are too large in magnitude")


def _finish(inputs: TrajectoryInputs, *outputs: np.ndarray):
    """Reshape ``[T, 1]`` results back to ``[T]`` when the caller passed one env."""
    if inputs.one_env:
        return tuple(o.reshape(o.shape[0]) for o in outputs)
    return outputs


def per_step_unit_interval(value, name: str, shape) -> np.ndarray:
    """``gamma``, ``gae_lambda`` or ``lambda_`` as a C-contiguous float64 ``[T, N]`` array for
    the trajectory shape ``shape`` (``(T,)`` or ``(T, N)``): from a scalar, an array of
    ``shape``, or for ``[T, N]`` a ``[T]`` array shared by the envs. Raises ``ValueError``
    naming ``name`` for another shape, a non-finite entry or an entry outside [0, 1]."""
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


def run_gae(recursion, rewards, values, terminated, truncated, last_values, final_values,
            gamma, gae_lambda, truncation, bootstrap_terminal_last_row):
    """:func:`gae` with its recursion given (:func:`gae_recursion` or its compiled twin):
    validates, runs ``recursion`` on the prepared ``[T, N]`` arrays."""
    inputs = prepare_trajectory({"rewards": rewards, "values": values}, terminated, truncated,
                                last_values, final_values, truncation, bootstrap_terminal_last_row)
    r, v = inputs.arrays["rewards"], inputs.arrays["values"]
    shape = r.shape[:1] if inputs.one_env else r.shape
    gammas = per_step_unit_interval(gamma, "gamma", shape)
    lambdas = per_step_unit_interval(gae_lambda, "gae_lambda", shape)
    advantages = np.empty(r.shape, dtype=inputs.dtype)
    returns = np.empty(r.shape, dtype=inputs.dtype)
    if r.shape[0] > 0:
        dtype = inputs.dtype
        all_finite = recursion(r, v, inputs.terminated, inputs.truncated, inputs.last_values,
                               inputs.final_values, gammas.astype(dtype, copy=False),
                               (gammas * lambdas).astype(dtype),
                               inputs.truncation_mode, inputs.bootstrap_terminal_last_row,
                               advantages, returns)
        if not all_finite:
            explain_not_finite(inputs, ("rewards", "values", "final_values"),
                               {"advantages": advantages, "returns": returns})
    return _finish(inputs, advantages, returns)


def gae(rewards, values, terminated, truncated, last_values, final_values=None, *,
        gamma, gae_lambda, truncation="bootstrap", bootstrap_terminal_last_row=False):
    """Generalized Advantage Estimation: advantages and lambda-returns per env, with the
    truncation bootstrap (:func:`gae_recursion`).

    Args:
        rewards: ``[T, N]`` (or ``[T]`` for one env) float32/float64, reward of the action at t.
        values: same shape, ``V(obs[t])`` recorded at collection.
        terminated, truncated: same shape, bool or 0/1 (:mod:`ppo_ref.spec.masks`).
        last_values: ``[N]`` (scalar for ``[T]`` input): ``V(obs[T])``, after the last step.
        final_values: ``[T, N]`` or None: ``V(final_obs[t])``, read where step t truncated
            without terminating (finite everywhere; 0 elsewhere); required for such a step
            with ``truncation="bootstrap"``.
        gamma: discount in [0, 1]: a scalar, or per step shaped like ``rewards`` (or ``[T]``
            shared by the envs), as rlax's ``discount_t`` (the flags mark terminals).
        gae_lambda: in [0, 1] (0: one-step TD, 1: Monte Carlo), shaped as ``gamma`` may be;
            ``gamma * gae_lambda`` is formed in float64 and rounded once.
        truncation: a key of :data:`ppo_ref.spec.masks.TRUNCATION_MODES`.
        bootstrap_terminal_last_row: True reproduces thrust-rl 0.4 (:func:`gae_recursion`).

    Returns ``(advantages, returns)`` shaped like ``rewards``, float32 when every float array
    given is float32 (Python scalars do not count), else float64; empty when T = 0. Raises
    ``ValueError`` naming the argument: a rank other than 1 or 2, a shape that disagrees with
    ``rewards``, a non-finite entry (with its index), a flag not bool/0/1, ``gamma`` or
    ``gae_lambda`` outside [0, 1] or of another shape, an unknown option, a missing
    ``final_values``, or a result that overflows the dtype (never inf or nan out).

    Source: Schulman et al. 2016 (arXiv:1506.02438) eq. (16); truncation bootstrap as in
    Stable-Baselines3 (Pardo et al. 2018, arXiv:1712.00378); per-step discounts and lambdas as
    rlax ``truncated_generalized_advantage_estimation(r_t, discount_t, lambda_, values)``.
    """
    return run_gae(gae_recursion, rewards, values, terminated, truncated, last_values,
                   final_values, gamma, gae_lambda, truncation, bootstrap_terminal_last_row)


class VTraceReturns(NamedTuple):
    """Result of :func:`vtrace`, shaped like ``rewards``: ``vs``, the value targets ``v_s``;
    ``pg_advantages``, ``min(pg_rho_bar, ratio) * (q_s - values[s])``."""

    vs: np.ndarray
    pg_advantages: np.ndarray


def run_vtrace(recursion, ratio_loop, behaviour_log_probs, target_log_probs, rewards, values,
               terminated, truncated, last_values, final_values, gamma, rho_bar, c_bar,
               pg_rho_bar, lambda_, truncation, bootstrap_terminal_last_row) -> VTraceReturns:
    """:func:`vtrace` with its loops given (:func:`vtrace_recursion` and :func:`log_ratios`, or
    their compiled twins): validates, forms the ratios, runs ``recursion``."""
    rho_bar = check_positive(rho_bar, "rho_bar")
    c_bar = check_positive(c_bar, "c_bar")
    pg_rho_bar = rho_bar if pg_rho_bar is None else check_positive(pg_rho_bar, "pg_rho_bar")
    inputs = prepare_trajectory(
        {"behaviour_log_probs": behaviour_log_probs, "target_log_probs": target_log_probs,
         "rewards": rewards, "values": values},
        terminated, truncated, last_values, final_values, truncation, bootstrap_terminal_last_row)
    a = inputs.arrays
    shape = a["rewards"].shape[:1] if inputs.one_env else a["rewards"].shape
    gammas = per_step_unit_interval(gamma, "gamma", shape)
    lambdas = per_step_unit_interval(lambda_, "lambda_", shape)
    vs = np.empty(a["rewards"].shape, dtype=inputs.dtype)
    pg_advantages = np.empty(a["rewards"].shape, dtype=inputs.dtype)
    if vs.shape[0] > 0:
        scalar = inputs.dtype.type
        ratios = np.empty_like(vs)
        if not ratio_loop(a["target_log_probs"].reshape(-1), a["behaviour_log_probs"].reshape(-1),
                          ratios.reshape(-1)):
            # (finite log-probs whose difference overflowed give a ratio of inf or 0, as below)
            explain_not_finite(inputs, ("behaviour_log_probs", "target_log_probs"), {})
        with np.errstate(over="ignore"):  # a huge ratio may overflow to inf: the bars clip it
            np.exp(ratios, out=ratios)
        all_finite = recursion(
            ratios, a["rewards"], a["values"], inputs.terminated, inputs.truncated,
            inputs.last_values, inputs.final_values, gammas.astype(inputs.dtype), scalar(rho_bar),
            scalar(c_bar), scalar(pg_rho_bar), lambdas.astype(inputs.dtype),
            (1.0 - lambdas).astype(inputs.dtype), inputs.truncation_mode,
            inputs.bootstrap_terminal_last_row, vs, pg_advantages)
        if not all_finite:
            explain_not_finite(inputs, ("rewards", "values", "final_values"),
                               {"vs": vs, "pg_advantages": pg_advantages})
    return VTraceReturns(*_finish(inputs, vs, pg_advantages))


def vtrace(behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
           last_values, final_values=None, *, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
           lambda_=1.0, truncation="bootstrap",
           bootstrap_terminal_last_row=False) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages (:func:`vtrace_recursion`) with ``ratio =
    exp(target_log_probs - behaviour_log_probs)``.

    ``behaviour_log_probs`` (log mu(a_t|x_t) of the acting policy) and ``target_log_probs``
    (log pi(a_t|x_t) of the policy being learned): nats, shaped like ``rewards``; the other
    trajectory arguments, ``gamma``, ``truncation`` and ``bootstrap_terminal_last_row`` as
    :func:`gae`. ``rho_bar``, ``c_bar`` > 0: IMPALA's truncations of the TD weight and of the
    traces; ``pg_rho_bar`` > 0 (None: ``rho_bar``) of the policy-gradient weight; ``lambda_``
    in [0, 1] (1: the IMPALA paper), shaped as ``gamma`` may be.

    Returns :class:`VTraceReturns`, dtype and shape as :func:`gae`'s results. Raises
    ``ValueError`` as :func:`gae`, and for ``rho_bar``, ``c_bar``, ``pg_rho_bar`` not > 0 or
    ``lambda_`` outside [0, 1] (finite log-probs whose difference overflows give a ratio of
    inf or 0, clipped by the bars).

    Source: Espeholt et al., "IMPALA", ICML 2018 (arXiv:1802.01561), eq. (1) and section 4.2;
    ``lambda_`` as rlax ``vtrace_td_error_and_advantage``.
    """
    return run_vtrace(vtrace_recursion, log_ratios, behaviour_log_probs, target_log_probs,
                      rewards, values, terminated, truncated, last_values, final_values, gamma,
                      rho_bar, c_bar, pg_rho_bar, lambda_, truncation, bootstrap_terminal_last_row)
