"""V-trace parity: rlax's published test vectors and an IMPALA-style double-sum ground truth.

Three checks, all printed as one table by ``main()``:

1. **rlax vectors** (``data/rlax_vtrace_test.json``, re-typed from google-deepmind/rlax
   ``rlax/_src/vtrace_test.py``). rlax takes a *per-step* discount ``discount_t`` (0 at a
   terminal), ppo_ref a constant ``gamma`` with ``terminated`` flags. With ``rho_bar = c_bar = 1``
   and ``lambda_ = 1`` (the settings of that test) ``rho[t] = c[t]``, so the recursion
   ``vs[t] = v[t] + rho[t] (r[t] + d[t] v[t+1] - v[t]) + d[t] c[t] (vs[t+1] - v[t+1])`` equals
   ``v[t] + rho[t] (r[t] + d[t] vs[t+1] - v[t])``: a one-step ppo_ref V-trace call with
   ``gamma = d[t]`` and ``last_values = vs[t+1]``. Chaining those calls backward reproduces the
   varying-discount trace with ppo_ref's own equations, and ``pg_advantages`` of each one-step
   call is rlax's ``pg_advantage`` (``q = r + d vs[t+1]``).
2. The same vectors through the slow double-sum oracle below (validates the oracle), and rlax's
   second test (``lambda_ = 0.8``: ``vs = v + rho (q - v)``) as an identity on ppo_ref with a
   constant discount.
3. **Double sum vs recursion**: ppo_ref.vtrace against the IMPALA paper's eq. (1) written as an
   explicit double sum (Espeholt et al. 2018, arXiv:1802.01561), on random off-policy rollouts
   with terminations, truncations, lambda < 1 and different rho/c/pg bars.

Run: ``python validation/parity_vtrace.py``.
"""
from __future__ import annotations

import numpy as np

from parity_common import Row, compare, load_json, print_table

import ppo_ref


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (independent of ppo_ref.spec.distributions, on purpose)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def vtrace_double_sum(values, next_values, rewards, bootstrap_discounts, trace_discounts,
                      continues, ratios, *, rho_bar, c_bar, pg_rho_bar, lambda_):
    """IMPALA eq. (1) as a double sum, for one trajectory ``[T]`` (slow on purpose).

    ``vs[s] = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} trace_discounts[i] c_i) rho_t delta_t``
    with ``delta_t = r_t + bootstrap_discounts[t] * next_values[t] - V(x_t)``; the product is
    zero past a step whose ``continues`` is False. ``q[s] = r_s + bootstrap_discounts[s] * X_s``
    with ``X_s = lambda_ vs[s+1] + (1 - lambda_) V(x_{s+1})`` when ``continues[s]``, else
    ``next_values[s]``; ``pg[s] = min(pg_rho_bar, ratio_s) (q[s] - V(x_s))``.

    Reference form (docs/specification.md §2): ``bootstrap_discounts = gamma (1 - terminated)``, ``trace_discounts = gamma``,
    ``continues = not done and t < T-1``, ``next_values`` = final/next/last value.
    rlax form: both discounts = ``discount_t``, ``next_values = v_t``, ``continues = t < T-1``.
    """
    T = len(rewards)
    rho = np.minimum(rho_bar, ratios)
    c = lambda_ * np.minimum(c_bar, ratios)
    delta = rewards + bootstrap_discounts * next_values - values
    vs = np.empty(T)
    for s in range(T):
        total, weight = 0.0, 1.0
        for t in range(s, T):
            total += weight * rho[t] * delta[t]
            if not continues[t]:
                break
            weight *= trace_discounts[t] * c[t]
        vs[s] = values[s] + total
    q = np.empty(T)
    for s in range(T):
        if continues[s]:
            x = lambda_ * vs[s + 1] + (1.0 - lambda_) * values[s + 1]
        else:
            x = next_values[s]
        q[s] = rewards[s] + bootstrap_discounts[s] * x
    pg = np.minimum(pg_rho_bar, ratios) * (q - values)
    return vs, pg


def spec_double_sum(behaviour_log_probs, target_log_probs, rewards, values, terminated,
                    truncated, last_values, final_values, *, gamma, rho_bar, c_bar, pg_rho_bar,
                    lambda_):
    """V-trace of docs/specification.md §2 on ``[T, N]`` arrays via :func:`vtrace_double_sum`, env by env."""
    T, N = rewards.shape
    vs = np.empty((T, N))
    pg = np.empty((T, N))
    for n in range(N):
        term = terminated[:, n].astype(bool)
        trunc = truncated[:, n].astype(bool) & ~term
        done = term | trunc
        nxt = np.append(values[1:, n], last_values[n])
        nxt = np.where(trunc, final_values[:, n], nxt)
        nxt = np.where(term, 0.0, nxt)
        continues = ~done & (np.arange(T) < T - 1)
        vs[:, n], pg[:, n] = vtrace_double_sum(
            values[:, n], nxt, rewards[:, n], gamma * (~term), np.full(T, gamma), continues,
            np.exp(target_log_probs[:, n] - behaviour_log_probs[:, n]),
            rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lambda_)
    return vs, pg


def rlax_inputs():
    """The rlax test inputs as float64 arrays ``[B, T]`` plus importance ratios."""
    d = load_json("rlax_vtrace_test.json")
    actions = np.asarray(d["actions"])
    lp_b = np.take_along_axis(log_softmax(d["behavior_policy_logits"]), actions[..., None], -1)[..., 0]
    lp_t = np.take_along_axis(log_softmax(d["target_policy_logits"]), actions[..., None], -1)[..., 0]
    arr = {k: np.asarray(d[k], dtype=np.float64)
           for k in ("rewards", "discounts", "values", "bootstrap_value")}
    return d, lp_b, lp_t, arr


def _relative_row(case, quantity, got, expected, rtol, note) -> Row:
    """Row on ``max |got - expected| / max(|expected|, 1e-3) <= rtol``."""
    rel = np.abs(got - expected) / np.maximum(np.abs(expected), 1e-3)
    worst = float(rel.max())
    return Row(case, quantity, worst, rtol, worst <= rtol, note)


def rlax_rows() -> list[Row]:
    d, lp_b, lp_t, a = rlax_inputs()
    rtol = d["settings"]["rtol"]
    exp_td = np.asarray(d["expected_td_errors"])
    exp_pg = np.asarray(d["expected_pg_advantages"])
    # rlax asserts rtol=1e-3 on float32 results. One expected entry is -8.3e-5 (a float32
    # cancellation), so the error is measured relative to max(|expected|, 1e-3).
    rows = []
    B, T = a["rewards"].shape

    # 1. chained one-step ppo_ref calls (see the module docstring)
    td = np.empty((B, T))
    pg = np.empty((B, T))
    for b in range(B):
        nxt_vs = a["bootstrap_value"][b]
        for t in range(T - 1, -1, -1):
            out = ppo_ref.vtrace(lp_b[b, t:t + 1], lp_t[b, t:t + 1], a["rewards"][b, t:t + 1],
                                 a["values"][b, t:t + 1], [False], [False], nxt_vs,
                                 gamma=a["discounts"][b, t], rho_bar=1.0, c_bar=1.0,
                                 pg_rho_bar=d["settings"]["clip_pg_rho_threshold"], lambda_=1.0)
            td[b, t] = out.vs[0] - a["values"][b, t]
            pg[b, t] = out.pg_advantages[0]
            nxt_vs = out.vs[0]
    for name, got, exp in (("errors (vs - v)", td, exp_td), ("pg_advantage", pg, exp_pg)):
        rows.append(_relative_row("rlax vtrace_test (ppo_ref, chained)", name, got, exp, rtol,
                                  "relative error; per-step discounts via one-step calls"))

    # 2a. the double-sum oracle on the same vectors (rlax's discount form)
    td_o = np.empty((B, T))
    pg_o = np.empty((B, T))
    for b in range(B):
        v = a["values"][b]
        v_next = np.append(v[1:], a["bootstrap_value"][b])
        vs_b, pg_b = vtrace_double_sum(
            v, v_next, a["rewards"][b], a["discounts"][b], a["discounts"][b],
            np.arange(T) < T - 1, np.exp(lp_t[b] - lp_b[b]),
            rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, lambda_=1.0)
        td_o[b], pg_o[b] = vs_b - v, pg_b
    for name, got, exp in (("errors (vs - v)", td_o, exp_td), ("pg_advantage", pg_o, exp_pg)):
        rows.append(_relative_row("rlax vtrace_test (double sum)", name, got, exp, rtol,
                                  "relative error; validates the oracle"))

    # 2b. rlax test_lambda_q_estimate as an identity on ppo_ref (constant gamma, lambda 0.8):
    # vs = v + rho * (q - v) with q = v + pg / min(pg_rho_bar, ratio), when rho_bar = c_bar = 1.
    ratio = np.exp(lp_t - lp_b).T                       # time-major [T, B]
    out = ppo_ref.vtrace(lp_b.T, lp_t.T, a["rewards"].T, a["values"].T,
                         (a["discounts"] == 0).T, np.zeros((T, B), bool), a["bootstrap_value"],
                         gamma=0.9, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, lambda_=0.8)
    q = a["values"].T + out.pg_advantages / np.minimum(1.0, ratio)
    vs_from_q = a["values"].T + np.minimum(1.0, ratio) * (q - a["values"].T)
    rows.append(compare("rlax test_lambda_q_estimate (identity)", "vs vs v+rho(q-v)",
                        out.vs, vs_from_q, 1e-10, "gamma 0.9, lambda_ 0.8, rlax inputs"))
    return rows


def random_rollout(rng, T, N):
    """Random off-policy rollout ``[T, N]`` with terminations and truncations."""
    terminated = rng.random((T, N)) < 0.15
    truncated = rng.random((T, N)) < 0.15                 # some overlap: termination wins
    return dict(
        behaviour_log_probs=-rng.exponential(1.0, (T, N)),
        target_log_probs=-rng.exponential(1.0, (T, N)),
        rewards=rng.normal(size=(T, N)),
        values=rng.normal(size=(T, N)),
        terminated=terminated,
        truncated=truncated,
        last_values=rng.normal(size=N),
        final_values=np.where(truncated, rng.normal(size=(T, N)), 0.0),
    )


def double_sum_rows(n_cases: int = 60, seed: int = 0) -> list[Row]:
    rng = np.random.default_rng(seed)
    worst_vs = worst_pg = 0.0
    for _ in range(n_cases):
        T, N = int(rng.integers(1, 12)), int(rng.integers(1, 4))
        x = random_rollout(rng, T, N)
        settings = dict(gamma=float(rng.choice([0.0, 0.5, 0.99, 1.0])),
                        rho_bar=float(rng.choice([0.5, 1.0, 2.0])),
                        c_bar=float(rng.choice([0.7, 1.0, 1.5])),
                        pg_rho_bar=float(rng.choice([0.8, 1.0, 3.0])),
                        lambda_=float(rng.choice([0.0, 0.6, 1.0])))
        out = ppo_ref.vtrace(**x, **settings)
        vs, pg = spec_double_sum(**x, **settings)
        worst_vs = max(worst_vs, float(np.max(np.abs(out.vs - vs))))
        worst_pg = max(worst_pg, float(np.max(np.abs(out.pg_advantages - pg))))
    note = f"{n_cases} random rollouts, terminations+truncations, float64"
    return [Row("IMPALA double sum vs ppo_ref", "vs", worst_vs, 1e-10, worst_vs <= 1e-10, note),
            Row("IMPALA double sum vs ppo_ref", "pg_advantages", worst_pg, 1e-10,
                worst_pg <= 1e-10, note)]


def run() -> list[Row]:
    return rlax_rows() + double_sum_rows()


def main() -> list[Row]:
    rows = run()
    print_table("V-trace: rlax test vectors and the IMPALA double sum", rows)
    return rows


if __name__ == "__main__":
    main()
