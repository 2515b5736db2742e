"""Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

The recursion is :func:`ppo_ref.spec.advantages.gae_recursion`; this wrapper validates every
argument and runs it compiled (``backend="fast"``) or as plain Python (``backend="spec"``).
"""
from __future__ import annotations

import numpy as np

from ppo_ref.fast import advantages as _kernels
from ppo_ref.kernels._inputs import (check_backend, explain_not_finite, finish,
                                     per_step_unit_interval, prepare_trajectory)

__all__ = ["gae"]


def gae(rewards, values, terminated, truncated, last_values, final_values=None, *,
        gamma, gae_lambda, truncation="bootstrap", bootstrap_terminal_last_row=False, backend="fast"):
    r"""Generalized Advantage Estimation: advantages and lambda-returns.

    Per env, backward over ``t = T-1 .. 0``::

        next_value[t] = 0                 if terminated[t]
                      = final_values[t]   elif truncated[t]
                      = values[t+1]       elif t < T-1
                      = last_values       otherwise
        delta[t] = rewards[t] + gamma[t] * next_value[t] - values[t]
        A[t]     = delta[t] + gamma[t] * gae_lambda[t] * (1 - done[t]) * A[t+1]     (A[T] = 0)
        returns[t] = A[t] + values[t]

    with ``done = terminated or truncated``. Unrolled, ``A[t]`` is Schulman et al. (2016)
    eq. (16), :math:`\sum_l (\gamma\lambda)^l \delta_{t+l}`, summed up to the end of the episode
    (or of the rollout). ``returns`` are the TD(lambda) returns used as the value target.

    Args:
        rewards: ``[T, N]`` (or ``[T]`` for one env) float32/float64, reward of the action at t.
        values: same shape, ``V(obs[t])`` recorded at collection.
        terminated: same shape, bool or 0/1: a true terminal state was reached (no bootstrap).
        truncated: same shape, bool or 0/1: the episode was cut (bootstrap ``final_values``);
            termination wins when both are set.
        last_values: ``[N]`` (scalar for ``[T]`` input): ``V(obs[T])``, after the last step.
        final_values: ``[T, N]`` or None: ``V(final_obs[t])``, used only where step t truncated
            without terminating (put 0 elsewhere; every entry must be finite). Required when
            such a step exists (and ``truncation="bootstrap"``).
        gamma: discount in [0, 1]: a scalar, or one per step: an array shaped like ``rewards``
            (or ``[T]`` for ``[T, N]`` rewards, shared by the envs), as rlax's ``discount_t``
            (there ``discount_t = 0`` also marks a terminal; here the flags do that).
        gae_lambda: GAE lambda in [0, 1] (0: one-step TD, 1: Monte Carlo with bootstrap): a
            scalar or one per step, shaped as ``gamma`` may be (rlax's ``lambda_`` array).
            ``gamma[t] * gae_lambda[t]`` is formed in float64 and rounded once to the result
            dtype.
        truncation: convention option (keyword-only). ``"bootstrap"`` (SB3, the default),
            ``"terminate"`` (CleanRL: truncation treated as termination, no bootstrap) or
            ``"ignore"`` (thrust-rl 0.4: the truncated flag is not read; the next row's value
            is bootstrapped and the trace runs on).
        bootstrap_terminal_last_row: convention option (keyword-only). ``True`` reproduces
            thrust-rl 0.4, where a terminal transition on the last row still bootstraps
            ``last_values``. Default ``False``.
        backend: ``"fast"`` (default): the compiled recursion; ``"spec"``: the same function,
            :func:`ppo_ref.spec.advantages.gae_recursion`, run as plain Python (slow; a reader
            can step through it). Both give the same bits.

    Returns:
        ``(advantages, returns)``, each with the shape of ``rewards``; float32 when every float
        array given is float32 (Python scalars do not count), float64 otherwise. Same units as
        ``rewards``. Empty arrays when T = 0.

    Raises:
        ValueError: naming the argument: a rank other than 1 or 2, a shape that disagrees with
            ``rewards``, a non-finite entry (with its index), a flag not bool/0/1,
            ``gamma``/``gae_lambda`` outside [0, 1] (or an array of another shape), an unknown option or ``backend``, or a missing
            ``final_values`` ("final_values is required: truncated has True entries"); also
            finite inputs so large that a result overflows the dtype (never inf or nan out).

    Source: Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", ICLR 2016 (arXiv:1506.02438), eq. (16); truncation
    bootstrap as in Stable-Baselines3 (Pardo et al. 2018, "Time Limits in Reinforcement
    Learning", arXiv:1712.00378); per-step discounts and lambdas as DeepMind's rlax
    ``truncated_generalized_advantage_estimation(r_t, discount_t, lambda_, values)``.
    """
    recursion = check_backend(backend, _kernels.gae_recursion)
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
    return finish(inputs, advantages, returns)
