"""Slow, obviously-correct versions of the spec's recursions, written in the papers' notation.

These are the ground truth the spec (ppo_ref.spec.advantages, .masks, .lstm) is tested against.
They deliberately do NOT reproduce its backward recursions: GAE is the explicit discounted sum
of TD errors up to the end of the episode (Schulman et al. 2016, eq. 16) and V-trace is IMPALA's
double sum with products of trace coefficients (Espeholt et al. 2018, eq. 1), both with a
discount and a lambda per step where given so (a scalar, ``[T]`` or ``[T, N]``: a factor of
step ``t`` multiplies what lies beyond ``t``). Everything runs in Python floats (float64), one
env at a time, in O(T^2).

Conventions (docs/specification.md §1 and the ``truncation`` / ``bootstrap_terminal_last_row`` options):

* "the transition at t ends the episode" (done) when it terminated or truncated; under
  ``truncation="ignore"`` only when it terminated.
* the state it leads to is worth 0 when it terminated (or truncated under "terminate"),
  ``final_values[t]`` when it truncated (under "bootstrap"), else ``values[t+1]``, or
  ``last_values`` after the last row. With ``bootstrap_terminal_last_row`` a terminal last row
  is worth ``last_values`` too (thrust-rl).
"""
from __future__ import annotations

import numpy as np


def _columns(*arrays):
    """Yield the per-env 1-D columns of [T] or [T, N] arrays (None passes through)."""
    ref = np.asarray(arrays[0])
    if ref.ndim == 1:
        yield None, [None if a is None else np.asarray(a) for a in arrays]
        return
    for n in range(ref.shape[1]):
        yield n, [None if a is None else np.asarray(a)[..., n] for a in arrays]


def _per_step(factor, shape, n):
    """The factor of each step of env ``n`` (``None`` when there is one env) as a list of
    Python floats: ``factor`` a scalar, ``[T]`` (shared by the envs) or ``[T, N]``."""
    a = np.broadcast_to(np.asarray(factor, dtype=np.float64).reshape(
        np.shape(factor) + (1,) * (len(shape) - np.ndim(factor))), shape)
    return [float(x) for x in (a if n is None else a[:, n])]


def _episode_structure(terminated, truncated, truncation):
    """Per step: (episode ends after t, value of the next state is zero, next state is final)."""
    T = len(terminated)
    ends, worth_zero, is_final = [], [], []
    for t in range(T):
        term, trunc = bool(terminated[t]), bool(truncated[t])
        if truncation == "bootstrap":
            ends.append(term or trunc)
            worth_zero.append(term)
            is_final.append(trunc and not term)
        elif truncation == "terminate":
            ends.append(term or trunc)
            worth_zero.append(term or trunc)
            is_final.append(False)
        elif truncation == "ignore":
            ends.append(term)
            worth_zero.append(term)
            is_final.append(False)
        else:
            raise ValueError(truncation)
    return ends, worth_zero, is_final


def _bootstrap_values(values, last_values, final_values, worth_zero, is_final,
                      bootstrap_terminal_last_row):
    """V(x_{t+1}) as the target sees it, for every t (the state transition t leads to)."""
    T = len(values)
    out = []
    for t in range(T):
        last = t == T - 1
        if worth_zero[t] and not (last and bootstrap_terminal_last_row):
            out.append(0.0)
        elif is_final[t]:
            out.append(float(final_values[t]))
        elif last:
            out.append(float(last_values))
        else:
            out.append(float(values[t + 1]))
    return out


def _episode_end(ends, t):
    """Index of the last step of the episode containing t (within the rollout)."""
    k = t
    while k < len(ends) - 1 and not ends[k]:
        k += 1
    return k


def gae_oracle(rewards, values, terminated, truncated, last_values, final_values=None, *,
               gamma, gae_lambda, truncation="bootstrap", bootstrap_terminal_last_row=False):
    """GAE as Schulman et al. (2016) eq. (16), truncated at the episode end:

    A_t = sum_{l=0}^{k-t} (prod_{i=t}^{t+l-1} gamma_i lambda_i) delta_{t+l},
    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t),    k = last step of t's episode in the rollout

    (with scalars: ``(gamma lambda)^l``). Returns float64 (advantages, returns = advantages +
    values).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros(rewards.shape)
    for n, (r, v, term, trunc, fv) in _columns(rewards, values, terminated, truncated,
                                               final_values):
        lv = np.asarray(last_values, dtype=np.float64) if n is None else np.asarray(last_values)[n]
        ends, zero, final = _episode_structure(term, trunc, truncation)
        v_next = _bootstrap_values(v, lv, fv, zero, final, bootstrap_terminal_last_row)
        g, lam = _per_step(gamma, rewards.shape, n), _per_step(gae_lambda, rewards.shape, n)
        T = len(r)
        delta = [float(r[t]) + g[t] * v_next[t] - float(v[t]) for t in range(T)]
        col = np.zeros(T)
        for t in range(T):
            k = _episode_end(ends, t)
            total, weight = 0.0, 1.0
            for l in range(k - t + 1):
                total += weight * delta[t + l]
                weight *= g[t + l] * lam[t + l]
            col[t] = total
        if n is None:
            adv[:] = col
        else:
            adv[:, n] = col
    return adv, adv + np.asarray(values, dtype=np.float64)


def vtrace_oracle(behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
                  last_values, final_values=None, *, gamma, rho_bar=1.0, c_bar=1.0,
                  pg_rho_bar=None, lambda_=1.0, truncation="bootstrap",
                  bootstrap_terminal_last_row=False):
    """V-trace as IMPALA eq. (1), the n-step target running to the episode end:

    v_s = V(x_s) + sum_{t=s}^{k} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t V,
    delta_t V = r_t + gamma_t V(x_{t+1}) - V(x_t),  rho_t = min(rho_bar, pi/mu),
    c_i = lambda_i min(c_bar, pi/mu)  (rlax's lambda),  k = last step of s's episode

    (with a scalar discount: ``gamma^(t-s)``). pg advantage (IMPALA section 4.2, rlax's
    lambda): min(pg_rho_bar, pi/mu) * (q_s - V(x_s)), q_s = r_s + gamma_s X_s where X_s = 0
    after a terminal, V(x_{s+1}) as bootstrapped when the episode (or the rollout) ends at s,
    else lambda_s v_{s+1} + (1 - lambda_s) V(x_{s+1}).

    Returns float64 (vs, pg_advantages).
    """
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    rewards = np.asarray(rewards, dtype=np.float64)
    vs_all = np.zeros(rewards.shape)
    pg_all = np.zeros(rewards.shape)
    for n, (mu, pi, r, v, term, trunc, fv) in _columns(
            behaviour_log_probs, target_log_probs, rewards, values, terminated, truncated,
            final_values):
        lv = np.asarray(last_values, dtype=np.float64) if n is None else np.asarray(last_values)[n]
        ends, zero, final = _episode_structure(term, trunc, truncation)
        v_next = _bootstrap_values(v, lv, fv, zero, final, bootstrap_terminal_last_row)
        g, lam = _per_step(gamma, rewards.shape, n), _per_step(lambda_, rewards.shape, n)
        T = len(r)
        ratio = [float(np.exp(float(pi[t]) - float(mu[t]))) for t in range(T)]
        rho = [min(rho_bar, x) for x in ratio]
        c = [lam[t] * min(c_bar, ratio[t]) for t in range(T)]
        delta = [rho[t] * (float(r[t]) + g[t] * v_next[t] - float(v[t])) for t in range(T)]
        vs = np.zeros(T)
        for s in range(T):
            k = _episode_end(ends, s)
            total = 0.0
            for t in range(s, k + 1):
                trace = 1.0
                for i in range(s, t):
                    trace *= g[i] * c[i]
                total += trace * delta[t]
            vs[s] = float(v[s]) + total
        pg = np.zeros(T)
        for s in range(T):
            if ends[s] or s == T - 1:
                x = v_next[s]  # 0 after a terminal, else the bootstrap value
            else:
                x = lam[s] * vs[s + 1] + (1.0 - lam[s]) * float(v[s + 1])
            q = float(r[s]) + g[s] * x
            pg[s] = min(pg_rho_bar, ratio[s]) * (q - float(v[s]))
        if n is None:
            vs_all[:], pg_all[:] = vs, pg
        else:
            vs_all[:, n], pg_all[:, n] = vs, pg
    return vs_all, pg_all


def episode_starts_oracle(terminated, truncated, initial):
    """Reset mask by labelling episodes: a row starts an episode iff its episode label differs
    from the previous row's (the label is the number of episode ends seen before the row), and
    row 0 starts one iff the previous rollout's last step ended one (``initial``)."""
    terminated = np.asarray(terminated)
    out = np.zeros(terminated.shape, dtype=bool)
    for n, (term, trunc) in _columns(terminated, truncated):
        T = len(term)
        label = []
        seen = 0
        for t in range(T):
            label.append(seen)
            if bool(term[t]) or bool(trunc[t]):
                seen += 1
        first = bool(np.asarray(initial)) if n is None else bool(np.asarray(initial)[n])
        col = [first if t == 0 else label[t] != label[t - 1] for t in range(T)]
        if n is None:
            out[:] = col
        else:
            out[:, n] = col
    return out


# ---------------------------------------------------------------------------------------------
# LSTM (torch.nn.LSTM cell, gate order i, f, g, o; the carried state is zeroed before a step
# that starts an episode). The forward pass runs one environment and one step at a time with
# sigmoid(z) = 1 / (1 + exp(-z)). The gradient is NOT backpropagation through time: it is
# forward-mode accumulation of the Jacobian of the state w.r.t. every input, differentiating
# each forward equation as written (product rule, chain rule for one step), carried forward in
# time; the loss's gradient is then the dot product of the output gradients with those
# Jacobians.
# ---------------------------------------------------------------------------------------------

def _logistic(z):
    return 1.0 / (1.0 + np.exp(-z))


def lstm_forward_oracle(params, x, h0, c0, episode_starts):
    """``(h_seq [T, N, H], (h_T, c_T))`` of the LSTM over ``x [T, N, D]`` from ``h0, c0``."""
    w_ih, w_hh, b = (np.asarray(params[k], dtype=np.float64) for k in ("w_ih", "w_hh", "b"))
    x = np.asarray(x, dtype=np.float64)
    n_steps, n_env, _ = x.shape
    hidden = w_hh.shape[1]
    h_seq = np.zeros((n_steps, n_env, hidden))
    h_last = np.zeros((n_env, hidden))
    c_last = np.zeros((n_env, hidden))
    for n in range(n_env):
        h = np.array(h0[n], dtype=np.float64)
        c = np.array(c0[n], dtype=np.float64)
        for t in range(n_steps):
            if episode_starts[t][n]:
                h = np.zeros(hidden)
                c = np.zeros(hidden)
            z = w_ih @ x[t, n] + w_hh @ h + b
            i = _logistic(z[:hidden])
            f = _logistic(z[hidden:2 * hidden])
            g = np.tanh(z[2 * hidden:3 * hidden])
            o = _logistic(z[3 * hidden:])
            c = f * c + i * g
            h = o * np.tanh(c)
            h_seq[t, n] = h
        h_last[n], c_last[n] = h, c
    return h_seq, (h_last, c_last)


def lstm_gradient_oracle(params, x, h0, c0, episode_starts, dh_seq, dh_T=None, dc_T=None):
    """Gradients of ``L = sum_t <dh_seq[t], h[t]> + <dh_T, h_T> + <dc_T, c_T>`` by forward-mode
    Jacobian accumulation, one environment at a time.

    For environment n, theta = (w_ih, w_hh, b, x[:, n], h0[n], c0[n]) flattened (P numbers) and
    ``J_h[t] = dh[t]/dtheta``, ``J_c[t] = dc[t]/dtheta`` (``[H, P]``) start as the selectors of
    ``h0[n]``, ``c0[n]`` in theta; a reset sets the carried Jacobians to 0 (the carried state is
    the constant 0). One step differentiates ``z = w_ih x + w_hh h + b`` entry by entry
    (``dz_j / dw_ih[j, d] = x_d``, ``dz_j / dw_hh[j, k] = h_k``, ``dz_j / db_j = 1``,
    ``dz / dx[t] = w_ih``, plus ``w_hh J_h`` through the carried state), then the gates (``sigma'
    = s (1 - s)``, ``tanh' = 1 - tanh^2``), ``c = f c + i g`` by the product rule and
    ``h = o tanh(c)``. ``dL/dtheta = sum_t dh_seq[t, n] J_h[t] + dh_T[n] J_h[T-1] +
    dc_T[n] J_c[T-1]``. Returns ``(dx, grads, (dh0, dc0))`` shaped as the inputs.
    """
    w_ih, w_hh, b = (np.asarray(params[k], dtype=np.float64) for k in ("w_ih", "w_hh", "b"))
    x = np.asarray(x, dtype=np.float64)
    n_steps, n_env, d_in = x.shape
    hidden = w_hh.shape[1]
    four_h = 4 * hidden
    zeros = np.zeros((n_env, hidden))
    dh_T = zeros if dh_T is None else np.asarray(dh_T, dtype=np.float64)
    dc_T = zeros if dc_T is None else np.asarray(dc_T, dtype=np.float64)
    # offsets of the blocks of theta
    sizes = [("w_ih", four_h * d_in), ("w_hh", four_h * hidden), ("b", four_h),
             ("x", n_steps * d_in), ("h0", hidden), ("c0", hidden)]
    offset = {}
    total = 0
    for name, size in sizes:
        offset[name] = (total, total + size)
        total += size
    eye_4h = np.eye(four_h)
    grads = {"w_ih": np.zeros_like(w_ih), "w_hh": np.zeros_like(w_hh), "b": np.zeros_like(b)}
    dx = np.zeros_like(x)
    dh0 = np.zeros((n_env, hidden))
    dc0 = np.zeros((n_env, hidden))
    for n in range(n_env):
        h = np.array(h0[n], dtype=np.float64)
        c = np.array(c0[n], dtype=np.float64)
        j_h = np.zeros((hidden, total))
        j_c = np.zeros((hidden, total))
        j_h[:, slice(*offset["h0"])] = np.eye(hidden)
        j_c[:, slice(*offset["c0"])] = np.eye(hidden)
        grad = np.zeros(total)
        for t in range(n_steps):
            if episode_starts[t][n]:
                h, c = np.zeros(hidden), np.zeros(hidden)
                j_h, j_c = np.zeros((hidden, total)), np.zeros((hidden, total))
            z = w_ih @ x[t, n] + w_hh @ h + b
            j_z = w_hh @ j_h                                        # through the carried h
            j_z[:, slice(*offset["w_ih"])] += np.kron(eye_4h, x[t, n][None, :])
            j_z[:, slice(*offset["w_hh"])] += np.kron(eye_4h, h[None, :])
            j_z[:, slice(*offset["b"])] += eye_4h
            lo = offset["x"][0] + t * d_in
            j_z[:, lo:lo + d_in] += w_ih
            i = _logistic(z[:hidden])
            f = _logistic(z[hidden:2 * hidden])
            g = np.tanh(z[2 * hidden:3 * hidden])
            o = _logistic(z[3 * hidden:])
            j_i = (i * (1.0 - i))[:, None] * j_z[:hidden]
            j_f = (f * (1.0 - f))[:, None] * j_z[hidden:2 * hidden]
            j_g = (1.0 - g * g)[:, None] * j_z[2 * hidden:3 * hidden]
            j_o = (o * (1.0 - o))[:, None] * j_z[3 * hidden:]
            j_c = f[:, None] * j_c + c[:, None] * j_f + g[:, None] * j_i + i[:, None] * j_g
            c = f * c + i * g
            tanh_c = np.tanh(c)
            j_h = tanh_c[:, None] * j_o + (o * (1.0 - tanh_c * tanh_c))[:, None] * j_c
            h = o * tanh_c
            grad += dh_seq[t, n] @ j_h
        grad += dh_T[n] @ j_h + dc_T[n] @ j_c
        grads["w_ih"] += grad[slice(*offset["w_ih"])].reshape(four_h, d_in)
        grads["w_hh"] += grad[slice(*offset["w_hh"])].reshape(four_h, hidden)
        grads["b"] += grad[slice(*offset["b"])]
        dx[:, n] = grad[slice(*offset["x"])].reshape(n_steps, d_in)
        dh0[n] = grad[slice(*offset["h0"])]
        dc0[n] = grad[slice(*offset["c0"])]
    return dx, grads, (dh0, dc0)
