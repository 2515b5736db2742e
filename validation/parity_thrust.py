"""thrust-rl parity: its published GAE and V-trace test cases, reproduced with the kernel options
of ``PPOConfig.preset("thrust")``, and the same inputs under the reference conventions, showing where
and why the numbers differ.

Sources (re-typed as data in ``data/thrust_rl_cases.json``, each case names file, commit and
test): thrust-rl (GitHub rjwalters/thrust) ``src/buffer/rollout/tests.rs``,
``src/buffer/rollout/gae.rs`` and ``src/buffer/rollout/vtrace.rs``.

thrust-rl's advantage kernels read ``terminated`` only (there is no truncated input), and on the
last row they check ``t == T-1`` *before* the terminal flag, so a terminal last row still
bootstraps ``last_values``. ppo_ref reproduces both with ``truncation="ignore"`` and
``bootstrap_terminal_last_row=True``.

Sections of the table:

* **published**: thrust-rl's expected numbers vs ppo_ref with the thrust options (must match),
  and ppo_ref with the reference defaults (equal: none of these cases has a terminal last row or a
  truncation, so the conventions agree).
* **identities**: two thrust-rl tests publish an identity rather than numbers ("on-policy V-trace
  equals thrust GAE(lambda=1)", both bootstrapping a terminal last row). The expected values are
  computed by :func:`thrust_gae_oracle`, a line-by-line Python transcription of thrust-rl's
  ``compute_gae_single_env`` recursion; ppo_ref (thrust options) must match, the reference result
  must differ on the rows of the episode that terminates on the last row.
* **constructed** (clearly not from thrust-rl's tests; built from docs/specification.md §8 because thrust-rl
  publishes no truncation case): a truncation mid-rollout, where thrust-rl ignores the flag. The
  expected values again come from the transcribed recursions.

Run: ``python validation/parity_thrust.py``.
"""
from __future__ import annotations

import numpy as np

from parity_common import Row, compare, expect_difference, load_json, print_table

import ppo_ref


def thrust_kernel_options() -> dict:
    """The kernel convention options of the ``thrust`` preset (from ppo_ref.config)."""
    from ppo_ref.config import PPOConfig
    cfg = PPOConfig.preset("thrust")
    return {"truncation": cfg.truncation,
            "bootstrap_terminal_last_row": cfg.bootstrap_terminal_last_row}


# --- transcriptions of thrust-rl's recursions (one env, [T]); used only for expected values ----

def thrust_gae_oracle(rewards, values, terminated, last_value, gamma, gae_lambda):
    """thrust-rl ``compute_gae_single_env``: reset the accumulator on a terminal step; the last
    row bootstraps ``last_value`` even when terminal; ``truncated`` is not an input."""
    T = len(rewards)
    adv = np.zeros(T)
    acc = 0.0
    for t in range(T - 1, -1, -1):
        if terminated[t]:
            acc = 0.0
        if t == T - 1:
            next_value = last_value
        elif terminated[t]:
            next_value = 0.0
        else:
            next_value = values[t + 1]
        delta = rewards[t] + gamma * next_value - values[t]
        acc = delta + gamma * gae_lambda * acc
        adv[t] = acc
    return adv, adv + np.asarray(values, dtype=np.float64)


def thrust_vtrace_oracle(rewards, values, behaviour, target, terminated, bootstrap, gamma,
                         rho_bar, c_bar):
    """thrust-rl ``compute_vtrace_single_env`` (IMPALA Algorithm 1, no lambda)."""
    T = len(rewards)
    vs = np.zeros(T)
    adv = np.zeros(T)
    for t in range(T - 1, -1, -1):
        last = t == T - 1
        if last:
            next_value, next_vs, carry = bootstrap, bootstrap, 0.0
        elif terminated[t]:
            next_value, next_vs, carry = 0.0, 0.0, 0.0
        else:
            next_value, next_vs, carry = values[t + 1], vs[t + 1], vs[t + 1] - values[t + 1]
        ratio = np.exp(target[t] - behaviour[t])
        rho, c = min(ratio, rho_bar), min(ratio, c_bar)
        vs[t] = values[t] + rho * (rewards[t] + gamma * next_value - values[t]) + gamma * c * carry
        adv[t] = rho * (rewards[t] + gamma * next_vs - values[t])
    return vs, adv


def _columns(a):
    """[T] or [T, N] -> list of [T] columns."""
    a = np.asarray(a)
    return [a] if a.ndim == 1 else [a[:, n] for n in range(a.shape[1])]


def _stack(cols, like):
    return cols[0] if np.asarray(like).ndim == 1 else np.stack(cols, axis=1)


def _differing_rows(a, b, tol=1e-9):
    diff = np.abs(np.asarray(a) - np.asarray(b))
    if diff.ndim > 1:
        diff = diff.max(axis=tuple(range(1, diff.ndim)))
    return [int(i) for i in np.nonzero(diff > tol)[0]]


def _gae_both(case, opts):
    r, v, term = (np.asarray(case[k], dtype=np.float64) for k in ("rewards", "values", "terminated"))
    trunc = np.asarray(case.get("truncated", np.zeros_like(term)), dtype=bool)
    fv = case.get("final_values")
    fv = None if fv is None else np.asarray(fv, dtype=np.float64)
    kw = dict(gamma=case["gamma"], gae_lambda=case["gae_lambda"])
    thrust = ppo_ref.gae(r, v, term.astype(bool), trunc, case["last_values"], fv, **kw, **opts)
    spec = ppo_ref.gae(r, v, term.astype(bool), trunc, case["last_values"], fv, **kw)
    return thrust, spec


def published_rows(data, opts) -> list[Row]:
    rows = []
    for case in data["gae"]:
        (adv_t, ret_t), (adv_s, ret_s) = _gae_both(case, opts)
        tol = case["tolerance"]
        got = {"advantages": adv_t, "returns": ret_t}
        spec = {"advantages": adv_s, "returns": ret_s}
        if "expected" in case:
            for q, exp in case["expected"].items():
                rows.append(compare(case["name"], q + " (thrust opts)", got[q], exp, tol,
                                    "published expected"))
                rows.append(compare(case["name"], q + " (reference)", spec[q], exp, tol,
                                    "same: no terminal last row, no truncation"))
        for q, entries in case.get("expected_at", {}).items():
            idx = [int(i) for i in entries]
            exp = [entries[k] for k in entries]
            rows.append(compare(case["name"], f"{q}{idx} (thrust opts)", got[q][idx], exp, tol,
                                "published assertion"))
            rows.append(compare(case["name"], f"{q}{idx} (reference)", spec[q][idx], exp, tol,
                                "same: no terminal last row"))
    for case in data["vtrace"]:
        args = [np.asarray(case[k], dtype=np.float64) for k in
                ("behaviour_log_probs", "target_log_probs", "rewards", "values")]
        term = np.asarray(case["terminated"], dtype=bool)
        kw = dict(gamma=case["gamma"], rho_bar=case["rho_bar"], c_bar=case["c_bar"])
        out_t = ppo_ref.vtrace(*args, term, np.zeros_like(term), case["last_values"], **kw, **opts)
        out_s = ppo_ref.vtrace(*args, term, np.zeros_like(term), case["last_values"], **kw)
        for q in ("vs", "pg_advantages"):
            rows.append(compare(case["name"], q + " (thrust opts)", getattr(out_t, q),
                                case["expected"][q], case["tolerance"], "published expected"))
            rows.append(compare(case["name"], q + " (reference)", getattr(out_s, q),
                                case["expected"][q], case["tolerance"],
                                "same: no terminal last row"))
    return rows


def identity_rows(data, opts) -> list[Row]:
    rows = []
    for case in data["identities"]:
        b, tg, r, v = (np.asarray(case[k], dtype=np.float64) for k in
                       ("behaviour_log_probs", "target_log_probs", "rewards", "values"))
        term = np.asarray(case["terminated"], dtype=bool)
        last = np.asarray(case["last_values"], dtype=np.float64)
        g = case["gamma"]
        # expected: thrust-rl's GAE(lambda=1) and V-trace recursions, column by column
        lasts = [float(last)] if last.ndim == 0 else list(last)
        cols = [thrust_gae_oracle(rc, vc, tc, lc, g, 1.0)
                for rc, vc, tc, lc in zip(_columns(r), _columns(v), _columns(term), lasts)]
        exp_ret = _stack([c[1] for c in cols], r)
        exp_adv = _stack([c[0] for c in cols], r)
        vt_cols = [thrust_vtrace_oracle(rc, vc, bc, tc_, tc, lc, g, case["rho_bar"], case["c_bar"])
                   for rc, vc, bc, tc_, tc, lc in zip(_columns(r), _columns(v), _columns(b),
                                                      _columns(tg), _columns(term), lasts)]
        oracle_vs = _stack([c[0] for c in vt_cols], r)
        kw = dict(gamma=g, rho_bar=case["rho_bar"], c_bar=case["c_bar"])
        zeros = np.zeros_like(term)
        out_t = ppo_ref.vtrace(b, tg, r, v, term, zeros, last, **kw, **opts)
        out_s = ppo_ref.vtrace(b, tg, r, v, term, zeros, last, **kw)
        gae_t = ppo_ref.gae(r, v, term, zeros, last, gamma=g, gae_lambda=1.0, **opts)
        name = case["name"]
        rows.append(compare(name, "thrust V-trace oracle vs GAE oracle", oracle_vs, exp_ret,
                            1e-12, "thrust-rl's published identity holds in the transcription"))
        rows.append(compare(name, "vs (thrust opts)", out_t.vs, exp_ret, 1e-12, "identity"))
        rows.append(compare(name, "pg_advantages (thrust opts)", out_t.pg_advantages, exp_adv,
                            1e-12, "identity"))
        rows.append(compare(name, "gae returns (thrust opts)", gae_t[1], exp_ret, 1e-12,
                            "identity"))
        where = _differing_rows(out_s.vs, exp_ret)
        rows.append(expect_difference(
            name, "vs (reference)", out_s.vs, exp_ret, 1e-6,
            f"rows {where}: the reference does not bootstrap a terminal last row (next_value 0); the "
            "difference flows back through the trace to the episode's start"))
    return rows


def constructed_rows(opts) -> list[Row]:
    """A truncation mid-rollout (docs/specification.md §8; not one of thrust-rl's tests)."""
    r = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    v = np.array([0.5, 0.6, 0.7, 0.8, 0.9])
    term = np.array([False, False, False, False, False])
    trunc = np.array([False, True, False, False, False])
    fv = np.array([0.0, 2.0, 0.0, 0.0, 0.0])
    last, g, lam = 0.4, 0.99, 0.95
    exp_adv, exp_ret = thrust_gae_oracle(r, v, term, last, g, lam)
    adv_t, ret_t = ppo_ref.gae(r, v, term, trunc, last, fv, gamma=g, gae_lambda=lam, **opts)
    adv_s, _ = ppo_ref.gae(r, v, term, trunc, last, fv, gamma=g, gae_lambda=lam)
    name = "constructed: truncation at t=1 (docs/specification.md §8)"
    rows = [compare(name, "advantages (thrust opts)", adv_t, exp_adv, 1e-12,
                    "expected from the transcribed thrust-rl recursion"),
            compare(name, "returns (thrust opts)", ret_t, exp_ret, 1e-12, "same")]
    rows.append(expect_difference(
        name, "advantages (reference)", adv_s, exp_adv, 1e-6,
        f"rows {_differing_rows(adv_s, exp_adv)}: the reference bootstraps V(final_obs)=2.0 at t=1 and "
        "cuts the trace; thrust-rl bootstraps values[2] (the next episode) and runs on"))
    b = np.array([-0.5, -1.0, -0.7, -0.2, -0.3])
    tg = np.array([-0.2, -1.5, -0.4, -0.6, -0.1])
    vs_exp, pg_exp = thrust_vtrace_oracle(r, v, b, tg, term, last, g, 1.0, 1.0)
    out_t = ppo_ref.vtrace(b, tg, r, v, term, trunc, last, fv, gamma=g, **opts)
    out_s = ppo_ref.vtrace(b, tg, r, v, term, trunc, last, fv, gamma=g)
    rows += [compare(name, "vtrace vs (thrust opts)", out_t.vs, vs_exp, 1e-12, "transcription"),
             compare(name, "vtrace pg_advantages (thrust opts)", out_t.pg_advantages, pg_exp,
                     1e-12, "transcription"),
             expect_difference(name, "vtrace vs (reference)", out_s.vs, vs_exp, 1e-6,
                               f"rows {_differing_rows(out_s.vs, vs_exp)}: same reason")]
    return rows


def run() -> list[Row]:
    data = load_json("thrust_rl_cases.json")
    opts = thrust_kernel_options()
    return published_rows(data, opts) + identity_rows(data, opts) + constructed_rows(opts)


def main() -> list[Row]:
    rows = run()
    print_table("thrust-rl cases: thrust preset options and reference", rows)
    return rows


if __name__ == "__main__":
    main()
