"""Property tests of gae and vtrace against the slow oracles, and their structural identities."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles import gae_oracle, vtrace_oracle
from ppo_ref.spec.advantages import gae, vtrace

TRUNCATIONS = ["bootstrap", "terminate", "ignore"]


@st.composite
def trajectories(draw, max_T=40):
    """A random batch: shapes, dtype, flag patterns (both flags on one step, flags on the last
    row), flag encodings, log-probs with a random degree of off-policyness."""
    T = draw(st.integers(0, max_T))
    one_env = draw(st.booleans())
    shape = (T,) if one_env else (T, draw(st.integers(1, 6)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_term = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))
    p_trunc = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))
    terminated = rng.random(shape) < p_term
    truncated = rng.random(shape) < p_trunc
    if T and draw(st.booleans()):  # both flags on one random step
        idx = tuple(rng.integers(0, s) for s in shape)
        terminated[idx] = truncated[idx] = True
    if T:
        last = draw(st.sampled_from(["none", "terminated", "truncated", "both"]))
        terminated[-1] |= last in ("terminated", "both")
        truncated[-1] |= last in ("truncated", "both")
    scale = draw(st.sampled_from([0.1, 1.0, 10.0]))
    rewards = (scale * rng.normal(size=shape)).astype(dtype)
    values = (scale * rng.normal(size=shape)).astype(dtype)
    final_values = (scale * rng.normal(size=shape)).astype(dtype)
    last_values = (scale * rng.normal(size=shape[1:])).astype(dtype)
    if one_env:
        last_values = dtype(last_values)  # a NumPy scalar of the batch dtype
    behaviour = (rng.normal(size=shape) - 1.0).astype(dtype)
    spread = draw(st.sampled_from([0.0, 0.1, 1.0, 3.0]))
    target = (behaviour + spread * rng.normal(size=shape)).astype(dtype)
    encode = draw(st.sampled_from(["bool", "int", "float"]))
    if encode == "int":
        terminated, truncated = terminated.astype(np.int32), truncated.astype(np.int64)
    elif encode == "float":
        terminated, truncated = terminated.astype(dtype), truncated.astype(dtype)
    return dict(behaviour_log_probs=behaviour, target_log_probs=target, rewards=rewards,
                values=values, terminated=terminated, truncated=truncated,
                last_values=last_values, final_values=final_values)


def gae_args(traj, final=True):
    keys = ["rewards", "values", "terminated", "truncated", "last_values", "final_values"]
    args = [traj[k] for k in keys]
    if not final:
        args[-1] = None
    return args


def vtrace_args(traj):
    return [traj[k] for k in ["behaviour_log_probs", "target_log_probs", "rewards", "values",
                              "terminated", "truncated", "last_values", "final_values"]]


def tolerance(dtype):
    return dict(rtol=1e-4, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-9)


unit = st.sampled_from([0.0, 0.3, 0.9, 0.99, 1.0]) | st.floats(0.0, 1.0)
bars = st.sampled_from([0.5, 1.0, 2.0, 1e6]) | st.floats(0.05, 5.0)
options = st.fixed_dictionaries({"truncation": st.sampled_from(TRUNCATIONS),
                                 "bootstrap_terminal_last_row": st.booleans()})


# --- kernels == oracles -------------------------------------------------------------------

@settings(max_examples=100)
@given(trajectories(), unit, unit, options)
def test_gae_equals_oracle(traj, gamma, lam, opts):
    adv, ret = gae(*gae_args(traj), gamma=gamma, gae_lambda=lam, **opts)
    want_adv, want_ret = gae_oracle(*gae_args(traj), gamma=gamma, gae_lambda=lam, **opts)
    dtype = traj["rewards"].dtype
    assert adv.dtype == dtype and ret.dtype == dtype and adv.shape == traj["rewards"].shape
    np.testing.assert_allclose(adv, want_adv, **tolerance(dtype))
    np.testing.assert_allclose(ret, want_ret, **tolerance(dtype))


@settings(max_examples=80)
@given(trajectories(), unit, unit, bars, bars, st.none() | bars, options)
def test_vtrace_equals_oracle(traj, gamma, lambda_, rho_bar, c_bar, pg_rho_bar, opts):
    kw = dict(gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lambda_,
              **opts)
    vs, pg = vtrace(*vtrace_args(traj), **kw)
    want_vs, want_pg = vtrace_oracle(*vtrace_args(traj), **kw)
    dtype = traj["rewards"].dtype
    assert vs.dtype == dtype and pg.dtype == dtype and vs.shape == traj["rewards"].shape
    tol = tolerance(dtype)
    # pg advantages carry a factor up to pg_rho_bar (<= 1e6 here): scale the absolute tolerance
    scale = max(1.0, pg_rho_bar or rho_bar) if dtype == np.float32 else 1.0
    np.testing.assert_allclose(vs, want_vs, **tol)
    np.testing.assert_allclose(pg, want_pg, rtol=tol["rtol"], atol=tol["atol"] * scale)


# --- structural identities ------------------------------------------------------------------

def _done_rows(traj, truncation):
    term = np.asarray(traj["terminated"]).astype(bool)
    trunc = np.asarray(traj["truncated"]).astype(bool)
    return term if truncation == "ignore" else term | trunc


@given(trajectories(), unit, unit, bars, st.sampled_from(TRUNCATIONS))
def test_split_invariance(traj, gamma, lam, bar, truncation):
    """A batch holding several episodes equals each episode computed on its own."""
    traj = {k: (v[:, 0] if np.ndim(v) == 2 else v) for k, v in traj.items()}  # one env
    if np.ndim(traj["last_values"]):
        traj["last_values"] = traj["last_values"][0]
    T = len(traj["rewards"])
    done = _done_rows(traj, truncation)
    gae_kw = dict(gamma=gamma, gae_lambda=lam, truncation=truncation)
    vt_kw = dict(gamma=gamma, rho_bar=bar, c_bar=bar, lambda_=lam, truncation=truncation)
    full_gae = gae(*gae_args(traj), **gae_kw)
    full_vt = vtrace(*vtrace_args(traj), **vt_kw)
    starts = [0] + [t + 1 for t in range(T - 1) if done[t]]
    stops = starts[1:] + [T]
    for a, b in zip(starts, stops):
        piece = {k: v[a:b] for k, v in traj.items() if k != "last_values"}
        # an episode that ended inside the batch never reads last_values: poison it
        piece["last_values"] = traj["last_values"] if b == T else traj["rewards"].dtype.type(1e30)
        part_gae = gae(*gae_args(piece), **gae_kw)
        part_vt = vtrace(*vtrace_args(piece), **vt_kw)
        for got, want in zip(part_gae + part_vt, full_gae + full_vt):
            np.testing.assert_array_equal(got, want[a:b])


@given(trajectories(), unit, st.sampled_from([1.0, 1.5, 1e6]), options)
def test_on_policy_vtrace_equals_gae_lambda_one(traj, gamma, bar, opts):
    traj["target_log_probs"] = traj["behaviour_log_probs"]  # ratio = 1
    adv, ret = gae(*gae_args(traj), gamma=gamma, gae_lambda=1.0, **opts)
    vs, pg = vtrace(*vtrace_args(traj), gamma=gamma, rho_bar=bar, c_bar=bar, lambda_=1.0, **opts)
    tol = tolerance(traj["rewards"].dtype)
    np.testing.assert_allclose(vs, ret, **tol)
    np.testing.assert_allclose(pg, adv, **tol)


@given(trajectories(), unit, bars, options)
def test_gamma_zero_gives_one_step_advantage(traj, lam, bar, opts):
    r, v = traj["rewards"], traj["values"]
    adv, ret = gae(*gae_args(traj), gamma=0.0, gae_lambda=lam, **opts)
    np.testing.assert_array_equal(adv, r - v)
    np.testing.assert_allclose(ret, r, **tolerance(r.dtype))
    vs, pg = vtrace(*vtrace_args(traj), gamma=0.0, rho_bar=bar, pg_rho_bar=bar, **opts)
    ratio = np.exp(traj["target_log_probs"].astype(np.float64)
                   - traj["behaviour_log_probs"].astype(np.float64))
    rho = np.minimum(bar, ratio)
    tol = tolerance(r.dtype)
    atol = tol["atol"] * max(1, bar)
    np.testing.assert_allclose(vs, v + rho * (r - v), rtol=tol["rtol"], atol=atol)
    np.testing.assert_allclose(pg, rho * (r - v), rtol=tol["rtol"], atol=atol)


@given(trajectories(), unit, unit)
def test_sb3_reward_folding_equals_truncation_bootstrap(traj, gamma, lam):
    """SB3 folds the truncation bootstrap into the reward (r += gamma * V(final_obs)) and then
    treats the step as terminal; the advantages must be the same as bootstrapping."""
    term = np.asarray(traj["terminated"]).astype(bool)
    trunc = np.asarray(traj["truncated"]).astype(bool)
    r = traj["rewards"]
    bootstrap = r + r.dtype.type(gamma) * traj["final_values"]
    folded = np.where(trunc & ~term, bootstrap, r).astype(r.dtype)
    no_flags = np.zeros_like(trunc)
    adv, ret = gae(*gae_args(traj), gamma=gamma, gae_lambda=lam)
    adv_sb3, ret_sb3 = gae(folded, traj["values"], term | trunc, no_flags, traj["last_values"],
                           gamma=gamma, gae_lambda=lam)
    tol = tolerance(r.dtype)
    np.testing.assert_allclose(adv_sb3, adv, **tol)
    np.testing.assert_allclose(ret_sb3, ret, **tol)
    vs, pg = vtrace(*vtrace_args(traj), gamma=gamma, lambda_=lam)
    vs_sb3, pg_sb3 = vtrace(traj["behaviour_log_probs"], traj["target_log_probs"], folded,
                            traj["values"], term | trunc, no_flags, traj["last_values"],
                            gamma=gamma, lambda_=lam)
    np.testing.assert_allclose(vs_sb3, vs, **tol)
    np.testing.assert_allclose(pg_sb3, pg, **tol)


# --- an analytic chain under a time limit ---------------------------------------------------

@pytest.mark.parametrize("truncation", TRUNCATIONS)
def test_time_limited_chain_value_reaches_geometric_sum_only_with_bootstrap(truncation):
    """One state, reward 1 forever, never terminates, cut every L steps by a time limit.

    Its true value is 1/(1-gamma). Fitting V (one number: the observations are all alike) to the
    Monte-Carlo returns (gae_lambda = 1), repeatedly, reaches 1/(1-gamma) when truncation
    bootstraps V(final_obs); treating truncation as termination converges to the wrong fixed
    point, the average of the truncated sums (1 - gamma^(L-j)) / (1 - gamma) over the L positions
    j of the episode.
    """
    gamma, lam, L, T, N = 0.9, 1.0, 10, 40, 3
    rewards = np.ones((T, N))
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    truncated[L - 1::L] = True
    v = 0.0
    for _ in range(400):
        values = np.full((T, N), v)
        _, returns = gae(rewards, values, terminated, truncated, np.full(N, v), values,
                         gamma=gamma, gae_lambda=lam, truncation=truncation)
        v = returns.mean()
    true_value = 1.0 / (1.0 - gamma)
    wrong_value = np.mean([(1 - gamma ** (L - j)) / (1 - gamma) for j in range(L)])
    if truncation in ("bootstrap", "ignore"):  # "ignore" bootstraps the (identical) next state
        assert v == pytest.approx(true_value, rel=1e-9)
    else:
        assert v == pytest.approx(wrong_value, rel=1e-9)
        assert v < 0.7 * true_value


# --- the two tiers of the public functions ------------------------------------------------

@settings(max_examples=15)
@given(trajectories(max_T=12), unit, unit, bars, options)
def test_fast_twins_equal_the_spec_functions(traj, gamma, lam, bar, opts):
    """The spec functions (the loops interpreted) and their compiled twins give the same bits
    (dtypes included)."""
    from ppo_ref.fast import advantages as fast_adv, masks as fast_masks
    from ppo_ref.spec import advantages as spec_adv, masks as spec_masks
    fast = fast_adv.gae(*gae_args(traj), gamma=gamma, gae_lambda=lam, **opts)
    spec = spec_adv.gae(*gae_args(traj), gamma=gamma, gae_lambda=lam, **opts)
    for f, s in zip(fast, spec):
        assert f.dtype == s.dtype
        np.testing.assert_array_equal(f, s)
    kw = dict(gamma=gamma, rho_bar=bar, c_bar=bar, lambda_=lam, **opts)
    fast = fast_adv.vtrace(*vtrace_args(traj), **kw)
    spec = spec_adv.vtrace(*vtrace_args(traj), **kw)
    assert type(fast) is type(spec) is spec_adv.VTraceReturns
    for f, s in zip(fast, spec):
        assert f.dtype == s.dtype
        np.testing.assert_array_equal(f, s)
    term, trunc = traj["terminated"], traj["truncated"]
    initial = np.ones(np.shape(term)[1:], bool)
    np.testing.assert_array_equal(fast_masks.episode_starts(term, trunc, initial),
                                  spec_masks.episode_starts(term, trunc, initial))
    for f, s in zip(fast_masks.transition_masks(term, trunc, opts["truncation"]),
                    spec_masks.transition_masks(term, trunc, opts["truncation"])):
        np.testing.assert_array_equal(f, s)


def test_backend_is_checked():
    """The one place a backend becomes a tier rejects anything but "spec" and "fast"."""
    from ppo_ref.tiers import tier_for
    for bad in ("numba", None, "Fast"):
        with pytest.raises(ValueError, match="^backend must be one of"):
            tier_for(bad)
    assert tier_for("fast").advantages.__name__ == "ppo_ref.fast.advantages"
    assert tier_for("spec").advantages.__name__ == "ppo_ref.spec.advantages"
