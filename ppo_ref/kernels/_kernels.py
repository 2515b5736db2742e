"""The compiled kernels: every ``@njit`` function of ``ppo_ref.kernels``, in one module.

They take only arrays and scalars and run backward over time, all envs of a row side by side
(so ``[T, N]`` C-contiguous memory is read in order). The public, validating wrappers live in
``masks.py``, ``gae.py`` and ``vtrace.py``.

Why one module: numba's on-disk cache (``cache=True``) keys each function on its own source
file only. A kernel in ``gae.py`` calling :func:`_transition_flags` from ``masks.py`` would keep
running a stale, cached copy of the rule after ``masks.py`` changed. With the rule and its callers
in one file, any edit invalidates them together.

No float literal appears in the arithmetic: every scalar is passed in with the arrays' dtype,
so the float32 specialisation computes in float32.
"""

import math

from ppo_ref._numba import njit

# Integer codes of the ``truncation`` option (see masks.py), as passed to the kernels.
TRUNCATION_MODES = {"bootstrap": 0, "terminate": 1, "ignore": 2}


@njit
def _transition_flags(terminated, truncated, truncation_mode):
    """Flags of one step: ``(terminal, bootstrap_final, done)``, all bool.

    ``terminal``: the next value is 0 (no bootstrap). ``bootstrap_final``: the next value is
    ``final_values[t]``. ``done``: the lambda-trace is cut after this step. Neither of the first
    two set: the next value is ``values[t+1]`` (or ``last_values`` on the last row).
    ``truncation_mode`` is a code of ``TRUNCATION_MODES``.
    """
    if truncation_mode == 0:  # "bootstrap" (SPEC): termination wins over truncation
        return terminated, truncated and not terminated, terminated or truncated
    if truncation_mode == 1:  # "terminate" (CleanRL): truncation is a termination
        return terminated or truncated, False, terminated or truncated
    return terminated, False, terminated  # "ignore" (thrust-rl): truncated is not read


@njit
def _finite_sum(a, b, c):
    """Whether ``a + b + c`` is finite: True when all three are finite, False when one is inf or
    nan (they propagate through the sum). A sum of finite numbers that overflows also gives
    False: the wrapper then re-checks the arrays one by one and finds nothing wrong with them.

    The kernels fold their finiteness check into the loop this way, on values they load anyway,
    instead of the wrapper spending a separate pass over memory on every input.
    """
    return math.isfinite(a + b + c)


@njit
def _transition_masks_kernel(terminated, truncated, truncation_mode,
                             terminal, bootstrap_final, done):
    flat_term = terminated.ravel()
    flat_trunc = truncated.ravel()
    out_term = terminal.ravel()
    out_final = bootstrap_final.ravel()
    out_done = done.ravel()
    for i in range(flat_term.size):
        a, b, c = _transition_flags(flat_term[i], flat_trunc[i], truncation_mode)
        out_term[i] = a
        out_final[i] = b
        out_done[i] = c


@njit
def _gae_kernel(rewards, values, terminated, truncated, last_values, final_values,
                gamma, gamma_lambda, truncation_mode, bootstrap_terminal_last_row,
                advantages, returns):
    """Backward GAE recursion over ``[T, N]`` arrays; writes ``advantages`` and ``returns``.

    Scalars ``gamma`` and ``gamma_lambda`` (= gamma * gae_lambda) have the arrays' dtype, and
    no float literal appears below, so a float32 specialisation computes in float32.

    Returns ``all_finite``: whether every entry of ``rewards``, ``values``, ``final_values`` and
    of the results is finite (see :func:`_finite_sum`).
    """
    n_steps, n_envs = rewards.shape
    all_finite = True
    for t in range(n_steps - 1, -1, -1):
        last_row = t == n_steps - 1
        for n in range(n_envs):
            terminal, from_final, done = _transition_flags(terminated[t, n], truncated[t, n],
                                                           truncation_mode)
            reward, value, final_value = rewards[t, n], values[t, n], final_values[t, n]
            if terminal and not (last_row and bootstrap_terminal_last_row):
                delta = reward - value                             # next_value = 0
            else:
                if from_final:
                    next_value = final_value
                elif last_row:
                    next_value = last_values[n]
                else:
                    next_value = values[t + 1, n]
                delta = reward + gamma * next_value - value
            if done or last_row:
                adv = delta                                        # trace cut (or A[T] = 0)
            else:
                adv = delta + gamma_lambda * advantages[t + 1, n]
            ret = adv + value
            advantages[t, n] = adv
            returns[t, n] = ret
            all_finite &= _finite_sum(reward, final_value, ret)  # (ret = adv + value)
    return all_finite


@njit
def _vtrace_kernel(ratios, rewards, values, terminated, truncated, last_values, final_values,
                   gamma, rho_bar, c_bar, pg_rho_bar, lambda_, one_minus_lambda, truncation_mode,
                   bootstrap_terminal_last_row, vs, pg_advantages):
    """Backward V-trace recursion over ``[T, N]`` arrays; writes ``vs`` and ``pg_advantages``.

    ``ratios`` are the importance weights pi/mu = exp(target - behaviour log-probs), computed
    by the caller in one vectorised pass (may hold inf; the bars clip it).

    Every scalar has the arrays' dtype and no float literal appears below, so a float32
    specialisation computes in float32.

    Returns ``all_finite``: whether every entry of ``rewards``, ``values``, ``final_values`` and
    of the results is finite (see :func:`_finite_sum`; the caller checks the log-probs).
    """
    n_steps, n_envs = rewards.shape
    all_finite = True
    for t in range(n_steps - 1, -1, -1):
        last_row = t == n_steps - 1
        for n in range(n_envs):
            terminal, from_final, done = _transition_flags(terminated[t, n], truncated[t, n],
                                                           truncation_mode)
            ratio = ratios[t, n]
            reward, value, final_value = rewards[t, n], values[t, n], final_values[t, n]
            # next_value: the same selection as in _gae_kernel, written inline on purpose (a
            # shared @njit helper taking the arrays measured ~15x slower: a real call with
            # array reference counting per element, and no vectorization of the loop).
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
            # vs[t] = values[t] + rho * delta[t] + gamma * c * (vs[t+1] - values[t+1])
            v_s = value + min(rho_bar, ratio) * (target - value)
            if done or last_row:
                q = target                                           # X[t] = next_value[t]
            else:
                c = lambda_ * min(c_bar, ratio)
                v_s = v_s + gamma * c * (vs[t + 1, n] - values[t + 1, n])
                q = reward + gamma * (lambda_ * vs[t + 1, n] + one_minus_lambda * values[t + 1, n])
            pg_advantage = min(pg_rho_bar, ratio) * (q - value)
            vs[t, n] = v_s
            pg_advantages[t, n] = pg_advantage
            all_finite &= _finite_sum(reward, final_value, v_s + pg_advantage)  # (v_s has value)
    return all_finite


@njit
def _log_ratios(target_log_probs, behaviour_log_probs, out):
    """``out = target_log_probs - behaviour_log_probs`` over flat arrays; returns whether every
    difference is finite (so both inputs are). One vectorised pass, no temporary."""
    all_finite = True
    for i in range(out.size):
        out[i] = target_log_probs[i] - behaviour_log_probs[i]
        all_finite &= math.isfinite(out[i])
    return all_finite
