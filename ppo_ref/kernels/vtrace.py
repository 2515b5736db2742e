"""V-trace off-policy value targets and policy-gradient advantages.

Espeholt et al. 2018, "IMPALA" (arXiv:1802.01561), with the trace-cutting ``lambda_`` of rlax.
The recursion is :func:`ppo_ref.spec.advantages.vtrace_recursion`; this wrapper validates every
argument and runs it compiled (``backend="fast"``) or as plain Python (``backend="spec"``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppo_ref._checks import check_positive
from ppo_ref.fast import advantages as _kernels
from ppo_ref.kernels._inputs import (check_backend, explain_not_finite, finish,
                                     per_step_unit_interval, prepare_trajectory)

__all__ = ["vtrace", "VTraceReturns"]


class VTraceReturns(NamedTuple):
    """Result of :func:`vtrace`; both fields have the shape and dtype of ``rewards``.

    ``vs``: the V-trace value targets ``v_s`` (regress ``values`` towards them).
    ``pg_advantages``: ``min(pg_rho_bar, ratio) * (q_s - values[s])`` for the policy gradient.
    """

    vs: np.ndarray
    pg_advantages: np.ndarray


def vtrace(behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
           last_values, final_values=None, *, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None,
           lambda_=1.0, truncation="bootstrap", bootstrap_terminal_last_row=False,
           backend="fast") -> VTraceReturns:
    r"""V-trace targets ``vs`` and policy-gradient advantages (IMPALA, with rlax's lambda).

    With ``ratio[t] = exp(target_log_probs[t] - behaviour_log_probs[t])``,
    ``rho[t] = min(rho_bar, ratio[t])`` and ``c[t] = lambda_[t] * min(c_bar, ratio[t])``, per
    env, backward over ``t = T-1 .. 0`` (``next_value`` and ``done`` exactly as in :func:`gae`)::

        vs[t] = values[t] + rho[t] * (rewards[t] + gamma[t] * next_value[t] - values[t])
                + gamma[t] * (1 - done[t]) * c[t] * (vs[t+1] - values[t+1])  (0 at t = T-1)
        q[t]  = rewards[t] + gamma[t] * X[t]
                X[t] = 0                                      if terminated[t]
                     = next_value[t]                          elif done[t] or t = T-1
                     = lambda_[t] * vs[t+1] + (1 - lambda_[t]) * values[t+1]   otherwise
        pg_advantages[t] = min(pg_rho_bar, ratio[t]) * (q[t] - values[t])

    Unrolled, ``vs`` is IMPALA eq. (1): :math:`v_s = V(x_s) + \sum_{t \ge s} \gamma^{t-s}
    (\prod_{i=s}^{t-1} c_i)\, \rho_t \delta_t V`, summed to the end of the episode (or rollout).
    On-policy (ratio 1, bars >= 1, ``lambda_ = 1``) ``vs`` equals the GAE returns and
    ``pg_advantages`` the GAE advantages with ``gae_lambda = 1``.

    Args:
        behaviour_log_probs: ``[T, N]`` (or ``[T]``) float32/float64, log mu(a_t|x_t) of the
            policy that acted (nats).
        target_log_probs: same shape, log pi(a_t|x_t) under the policy being learned (nats).
        rewards, values, terminated, truncated, last_values, final_values: as in :func:`gae`.
        gamma: discount in [0, 1]: a scalar or one per step (an array shaped like ``rewards``,
            or ``[T]`` for ``[T, N]`` rewards), as rlax's ``discount_t``.
        rho_bar: truncation of the importance weight in the TD term, > 0 (IMPALA rho-bar).
        c_bar: truncation of the trace coefficients, > 0 (IMPALA c-bar).
        pg_rho_bar: truncation of the policy-gradient weight, > 0; None means ``rho_bar``.
        lambda_: trace mixing in [0, 1] (rlax ``lambda_``; 1 = the IMPALA paper): a scalar or
            one per step, shaped as ``gamma`` may be (rlax also takes a ``lambda_`` array).
        truncation, bootstrap_terminal_last_row: convention options, as in :func:`gae`.
        backend: ``"fast"`` (default, compiled) or ``"spec"``
            (:func:`ppo_ref.spec.advantages.vtrace_recursion` run as plain Python); same bits.

    Returns:
        :class:`VTraceReturns` ``(vs, pg_advantages)``, each with the shape of ``rewards`` and
        in the units of ``rewards``; float32 when every float array given is float32, float64
        otherwise. Empty when T = 0.

    Raises:
        ValueError: naming the argument, as in :func:`gae`; also ``rho_bar``, ``c_bar``,
            ``pg_rho_bar`` not > 0 and ``lambda_`` outside [0, 1]. (Finite log-probs whose
            difference overflows give a ratio of inf or 0, clipped by the bars as usual.)

    Source: Espeholt et al., "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
    Actor-Learner Architectures", ICML 2018 (arXiv:1802.01561), eq. (1) and section 4.2;
    ``lambda_`` as in DeepMind's rlax ``vtrace_td_error_and_advantage``.
    """
    recursion = check_backend(backend, _kernels.vtrace_recursion)
    ratio_loop = check_backend(backend, _kernels.log_ratios)
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
        # ratio = pi/mu in vectorised passes (faster than a scalar exp per element in the
        # loop); a huge ratio may overflow to inf, which the bars clip.
        ratios = np.empty_like(vs)
        if not ratio_loop(a["target_log_probs"].reshape(-1), a["behaviour_log_probs"].reshape(-1),
                          ratios.reshape(-1)):
            # (finite log-probs whose difference overflowed give a ratio of inf or 0, as below)
            explain_not_finite(inputs, ("behaviour_log_probs", "target_log_probs"), {})
        with np.errstate(over="ignore"):
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
    return VTraceReturns(*finish(inputs, vs, pg_advantages))
