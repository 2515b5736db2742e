"""GAE and V-trace: the per-env backward recursions, written once as plain Python loops.

Both take time-major ``[T, N]`` arrays (row ``t``, env ``n``) and run backward over
``t = T-1 .. 0``, all envs of a row side by side. With ``done`` and the bootstrap rule of
:func:`ppo_ref.spec.masks.transition_flags`, the value of the state after step ``t`` is::

    next_value[t] = 0                 if terminated[t]          (no bootstrap)
                  = final_values[t]   elif truncated[t]         (V(final_obs[t]))
                  = values[t+1]       elif t < T-1
                  = last_values       otherwise                 (V(obs[T]))

and the trace is cut after every ``done[t] = terminated[t] or truncated[t]``.

These functions are written in the subset of Python that numba compiles: the compiled tier
(``ppo_ref.fast.advantages``) is ``njit`` of these very functions, and the public,
validating wrappers ``ppo_ref.gae`` and ``ppo_ref.vtrace`` run either that (``backend="fast"``)
or the function below as plain Python (``backend="spec"``), with the same bits. No float
literal appears in the arithmetic: every scalar is passed in with the arrays' dtype, so float32
arrays are computed in float32 in both modes. The discount and the lambda are per-step arrays
``gammas[t, n]`` and ``gamma_lambdas[t, n]`` (rlax's ``discount_t`` and ``lambda_`` arrays); the
wrappers broadcast a scalar ``gamma``/``gae_lambda`` into them, so a constant discount is the
special case every row of which holds the same number.

Sources: Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", ICLR 2016 (arXiv:1506.02438), eq. (11)-(16); Espeholt et al.,
"IMPALA", ICML 2018 (arXiv:1802.01561), eq. (1) and section 4.2, with the trace mixing
``lambda_`` of DeepMind's rlax ``vtrace_td_error_and_advantage``.
"""
import math

from ppo_ref.spec.masks import transition_flags


def finite_sum(a, b, c):
    """Whether ``a + b + c`` is finite: False when one of them is inf or nan (they propagate
    through the sum), or when a sum of finite numbers overflows (the caller then re-checks the
    arrays one by one and reports an overflow)."""
    return math.isfinite(a + b + c)


def gae_recursion(rewards, values, terminated, truncated, last_values, final_values,
                  gammas, gamma_lambdas, truncation_mode, bootstrap_terminal_last_row,
                  advantages, returns):
    """The GAE recursion over ``[T, N]`` arrays; writes ``advantages`` and ``returns``::

        delta[t] = rewards[t] + gamma[t] * next_value[t] - values[t]                (eq. 11)
        A[t]     = delta[t] + gamma[t] * lambda[t] * (1 - done[t]) * A[t+1]         (A[T] = 0)
        returns[t] = A[t] + values[t]                 (the TD(lambda) return, value target)

    Unrolled, ``A[t] = sum_l (gamma lambda)^l delta[t+l]`` (eq. 16) up to the end of the
    episode or of the rollout.

    Args: ``rewards``, ``values``, ``final_values`` ``[T, N]`` float arrays of one dtype
    (``final_values`` read only where a step bootstraps from it); ``terminated``, ``truncated``
    ``[T, N]`` bool; ``last_values`` ``[N]``; ``gammas`` and ``gamma_lambdas`` (= gamma * lambda,
    rounded once to the arrays' dtype) ``[T, N]`` arrays of the arrays' dtype, the discount and
    the trace decay of step ``t`` (rlax ``discount_t``/``lambda_``); ``truncation_mode`` a code of
    :data:`ppo_ref.spec.masks.TRUNCATION_MODES`; ``bootstrap_terminal_last_row`` bool (True:
    a terminal step on the last row still bootstraps ``last_values``, as thrust-rl 0.4).

    Returns ``all_finite``: whether every entry of ``rewards``, ``values``, ``final_values``
    read and of the results is finite (see :func:`finite_sum`).
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
                if from_final:
                    next_value = final_value
                elif last_row:
                    next_value = last_values[n]
                else:
                    next_value = values[t + 1, n]
                delta = reward + gamma * next_value - value
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
    importance weight pi/mu); returns whether every difference is finite (so both inputs
    are)."""
    all_finite = True
    for i in range(out.size):
        out[i] = target_log_probs[i] - behaviour_log_probs[i]
        all_finite &= math.isfinite(out[i])
    return all_finite


def vtrace_recursion(ratios, rewards, values, terminated, truncated, last_values, final_values,
                     gammas, rho_bar, c_bar, pg_rho_bar, lambdas, one_minus_lambdas,
                     truncation_mode, bootstrap_terminal_last_row, vs, pg_advantages):
    """The V-trace recursion over ``[T, N]`` arrays; writes ``vs`` and ``pg_advantages``.

    With ``ratio[t] = pi(a_t|x_t) / mu(a_t|x_t)`` (``ratios``, may hold inf: the bars clip it),
    ``rho[t] = min(rho_bar, ratio[t])`` and ``c[t] = lambda[t] * min(c_bar, ratio[t])``::

        vs[t] = values[t] + rho[t] * (rewards[t] + gamma[t] * next_value[t] - values[t])
                + gamma[t] * (1 - done[t]) * c[t] * (vs[t+1] - values[t+1])   (0 at t = T-1)
        q[t]  = rewards[t] + gamma[t] * X[t],
                X[t] = 0                                    if terminated[t]
                     = next_value[t]                        elif done[t] or t = T-1
                     = lambda[t] * vs[t+1] + (1 - lambda[t]) * values[t+1]    otherwise
        pg_advantages[t] = min(pg_rho_bar, ratio[t]) * (q[t] - values[t])

    Unrolled, ``vs`` is IMPALA eq. (1), ``v_s = V(x_s) + sum_{t >= s} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) rho_t delta_t V``, up to the end of the episode or rollout.

    Args as :func:`gae_recursion`, plus ``ratios`` ``[T, N]``, the scalars ``rho_bar``, ``c_bar``,
    ``pg_rho_bar`` and the ``[T, N]`` arrays ``lambdas`` and ``one_minus_lambdas``
    (= 1 - lambda, rounded once), all of the arrays' dtype. Returns ``all_finite`` as :func:`gae_recursion` (the caller checks the
    log-probs).
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
            # the same next_value as in gae_recursion, written inline (a shared compiled helper
            # taking the arrays costs a call with array reference counting per element)
            if terminal and not (last_row and bootstrap_terminal_last_row):
                target = reward                                      # next_value = 0
            else:
                if from_final:
                    next_value = final_value
                elif last_row:
                    next_value = last_values[n]
                else:
                    next_value = values[t + 1, n]
                target = reward + gamma * next_value
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
