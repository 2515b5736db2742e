"""The convention options found in other libraries: per-step discounts and lambdas, the
advantage-normalization eps placement and one-element result, asymmetric and reciprocal ratio
intervals, dual clip, the Huber value loss, the value-clip subgradient on the exact bound, per-row
weights (valid masks) and skrl's KL stop rule.

Each is checked on the readable tier (ppo_ref.spec) against an oracle in the notation of its
source (written here, or tests/oracles.py's GAE and V-trace) and against finite differences for
the gradients (tests/gradcheck.py).
(The compiled twins of these functions are checked against them, with these options, in
tests/test_tiers.py and tests/test_spec_update.py.)
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from oracles import gae_oracle, vtrace_oracle
from ppo_ref.config import PPOConfig
from ppo_ref.spec import advantages
from ppo_ref.spec.losses import (approx_kl, clip_bounds, entropy_loss, normalize_advantages,
                                 policy_loss, value_loss)
from ppo_ref.spec.update import minibatch_loss


# -- per-step discounts and lambdas ---------------------------------------------------------

def _factors(r, T, N, choices):
    """Per-step factors drawn from ``choices``: ``[T]`` (shared by the envs) or ``[T, N]``."""
    return r.choice(choices, T if r.random() < 0.5 else (T, N))


@given(seed=st.integers(0, 2 ** 31), T=st.integers(1, 12), N=st.integers(1, 3))
@settings(max_examples=20)
def test_gae_per_step_gamma_and_lambda_equal_the_oracle(seed, T, N):
    """Schulman et al. eq. (16) with a discount and a lambda per step (tests/oracles.py), with
    episode ends and truncations inside."""
    r = np.random.default_rng(seed)
    rew, val, final = r.normal(size=(T, N)), r.normal(size=(T, N)), r.normal(size=(T, N))
    term, trunc = r.random((T, N)) < 0.15, r.random((T, N)) < 0.15
    gammas = _factors(r, T, N, [0.0, 0.5, 0.9, 1.0])
    lambdas = _factors(r, T, N, [0.0, 0.7, 1.0])
    args = (rew, val, term, trunc, r.normal(size=N), final)
    adv, ret = advantages.gae(*args, gamma=gammas, gae_lambda=lambdas)
    want, _ = gae_oracle(*args, gamma=gammas, gae_lambda=lambdas)
    np.testing.assert_allclose(adv, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ret, adv + val)


@given(seed=st.integers(0, 2 ** 31), T=st.integers(1, 10), N=st.integers(1, 3))
@settings(max_examples=20)
def test_vtrace_per_step_gamma_and_lambda_equal_the_oracle(seed, T, N):
    """IMPALA eq. (1) with a discount per step and rlax's lambda per step (tests/oracles.py),
    with episode ends and truncations inside."""
    r = np.random.default_rng(seed)
    mu, pi = -r.uniform(0.1, 2, (T, N)), -r.uniform(0.1, 2, (T, N))
    rew, val, final = r.normal(size=(T, N)), r.normal(size=(T, N)), r.normal(size=(T, N))
    term, trunc = r.random((T, N)) < 0.15, r.random((T, N)) < 0.15
    gammas = _factors(r, T, N, [0.0, 0.5, 0.95, 1.0])
    lambdas = _factors(r, T, N, [0.0, 0.8, 1.0])
    args = (mu, pi, rew, val, term, trunc, r.normal(size=N), final)
    kw = dict(gamma=gammas, lambda_=lambdas, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.3)
    out = advantages.vtrace(*args, **kw)
    want_vs, want_pg = vtrace_oracle(*args, **kw)
    np.testing.assert_allclose(out.vs, want_vs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages, want_pg, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_constant_per_step_arrays_give_the_scalar_bits(dtype):
    r = np.random.default_rng(5)
    T, N = 9, 3
    args = (r.normal(size=(T, N)).astype(dtype), r.normal(size=(T, N)).astype(dtype),
            r.random((T, N)) < 0.2, r.random((T, N)) < 0.2, r.normal(size=N).astype(dtype),
            r.normal(size=(T, N)).astype(dtype))
    scalar = advantages.gae(*args, gamma=0.97, gae_lambda=0.9)
    full = advantages.gae(*args, gamma=np.full((T, N), 0.97), gae_lambda=np.full(T, 0.9))
    for a, b in zip(scalar, full):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)
    lp = (r.normal(size=(T, N)).astype(dtype), r.normal(size=(T, N)).astype(dtype))
    scalar = advantages.vtrace(*lp, *args, gamma=0.97, lambda_=0.9, c_bar=0.8)
    full = advantages.vtrace(*lp, *args, gamma=np.full(T, 0.97),
                             lambda_=np.full((T, N), 0.9), c_bar=0.8)
    for a, b in zip(scalar, full):
        np.testing.assert_array_equal(a, b)


def test_a_row_discount_is_shared_by_the_envs():
    r = np.random.default_rng(2)
    T, N = 6, 2
    rew, val, no = r.normal(size=(T, N)), r.normal(size=(T, N)), np.zeros((T, N), bool)
    gammas = np.array([1.0, 0.5, 0.0, 0.9, 0.9, 0.3])
    adv, _ = advantages.gae(rew, val, no, no, np.zeros(N), gamma=gammas, gae_lambda=0.8)
    for n in range(N):
        one, _ = advantages.gae(rew[:, n], val[:, n], no[:, 0], no[:, 0], 0.0, gamma=gammas,
                                gae_lambda=0.8)
        np.testing.assert_array_equal(adv[:, n], one)


@pytest.mark.parametrize("gamma, match", [
    (np.full((3, 2), 0.9), r"gamma must be a scalar or an array of shape \(4, 2\) or \(4,\)"),
    (np.array([0.9, 0.9, 1.5, 0.9]), r"gamma must be in \[0, 1\] at every step, got 1.5 at index"),
    (np.array([0.9, np.nan, 0.9, 0.9]), "gamma must be finite"),
])
def test_bad_per_step_gamma_is_refused(gamma, match):
    T, N = 4, 2
    z, no = np.zeros((T, N)), np.zeros((T, N), bool)
    with pytest.raises(ValueError, match=match):
        advantages.gae(z, z, no, no, np.zeros(N), gamma=gamma, gae_lambda=0.9)
    with pytest.raises(ValueError, match=match.replace("gamma", "lambda_")):
        advantages.vtrace(z, z, z, z, no, no, np.zeros(N), gamma=0.9, lambda_=gamma)


# -- advantage normalization: where eps goes ------------------------------------------------

def test_normalize_clamp_divides_by_max_std_eps():
    adv = np.array([1.0, 2.0, 4.0])
    std = float(np.std(adv, ddof=1))
    np.testing.assert_array_equal(normalize_advantages(adv, eps=1e-6, placement="clamp"),
                                  (adv - adv.mean()) / std)
    np.testing.assert_array_equal(normalize_advantages(adv, eps=1e-6),
                                  (adv - adv.mean()) / (std + 1e-6))
    # a std below eps: the clamp divides by eps itself (torchrl's clamp_min)
    tiny = np.array([0.0, 1e-9])
    np.testing.assert_allclose(normalize_advantages(tiny, ddof=0, eps=1e-7, placement="clamp"),
                               [-5e-3, 5e-3], rtol=1e-12)
    with pytest.raises(ValueError, match="placement"):
        normalize_advantages(adv, placement="max")


def test_one_element_normalizes_as_the_libraries_formulas():
    one = np.array([1.5])
    torch = pytest.importorskip("torch")
    t = torch.tensor(one)
    with pytest.warns(UserWarning):  # torch: "std(): degrees of freedom is <= 0"
        torch_result = ((t - t.mean()) / (t.std() + 1e-8)).numpy()   # CleanRL
    numpy_result = (one - one.mean()) / (one.std() + 1e-8)             # PureJaxRL (jnp std)
    np.testing.assert_array_equal(normalize_advantages(one, single_element="NaN"), torch_result)
    np.testing.assert_array_equal(normalize_advantages(one, single_element="zero"), numpy_result)
    np.testing.assert_array_equal(normalize_advantages(one), one)      # SB3: len > 1 only
    f32 = normalize_advantages(one.astype(np.float32), single_element="zero")
    assert f32.dtype == np.float32 and f32.shape == (1,)
    empty = normalize_advantages(np.zeros(0), single_element="NaN")
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="single_element must be one of"):
        normalize_advantages(one, single_element="nan")


def test_minibatch_loss_uses_the_configured_normalization():
    r = np.random.default_rng(1)
    n = 12
    new, old = r.normal(-1, 0.1, n), r.normal(-1, 0.1, n)
    adv = r.normal(size=n) * 1e-7  # std ~1e-7: eps placement matters
    config = PPOConfig(advantage_norm_eps=1e-6, advantage_norm_eps_placement="clamp")
    out = minibatch_loss(new, r.random(n), r.normal(size=n), old, adv, r.normal(size=n),
                         r.normal(size=n), config=config, clip_range=0.2)
    expected, _, _ = policy_loss(new, old, normalize_advantages(adv, eps=1e-6, placement="clamp"),
                                 0.2)
    assert out.policy_loss == expected


# -- ratio intervals and dual clip ----------------------------------------------------------

def test_clip_bounds():
    assert clip_bounds(0.2) == (1.0 - 0.2, 1.0 + 0.2, True)
    assert clip_bounds(0.2, 0.1, 0.3) == (1.0 - 0.1, 1.0 + 0.3, False)
    assert clip_bounds(0.1, clip_interval="reciprocal") == (1.0 / 1.1, 1.1, False)
    with pytest.raises(ValueError, match="clip_range_low must be None"):
        clip_bounds(0.1, 0.1, clip_interval="reciprocal")
    with pytest.raises(ValueError, match="clip_range_low must be < 1"):
        clip_bounds(0.1, 1.0)


def _surrogate_oracle(ratio, adv, low, high, dual=None):
    """Sample Factory / tianshou form: min(r A, clamp(r, low, high) A), then for A < 0
    max(., c A)."""
    s = np.minimum(ratio * adv, np.clip(ratio, low, high) * adv)
    if dual is not None:
        s = np.where(adv < 0, np.maximum(s, dual * adv), s)
    return -float(np.mean(s))


@pytest.mark.parametrize("options, low, high, dual", [
    ({"clip_interval": "reciprocal"}, 1.0 / 1.2, 1.2, None),
    ({"clip_range_low": 0.1, "clip_range_high": 0.3}, 0.9, 1.3, None),
    ({"dual_clip": 2.0}, 0.8, 1.2, 2.0),
    ({"clip_range_high": 0.5, "dual_clip": 1.5}, 0.8, 1.5, 1.5),
])
def test_policy_loss_options_equal_the_library_formulas(options, low, high, dual):
    r = np.random.default_rng(7)
    n = 200
    old = r.normal(size=n) - 1.0
    new = old + r.normal(scale=0.8, size=n)  # many ratios far outside, some ratio*A < c*A
    adv = r.normal(size=n)
    loss, _, info = policy_loss(new, old, adv, 0.2, **options)
    ratio = np.exp(new - old)
    assert loss == pytest.approx(_surrogate_oracle(ratio, adv, low, high, dual), rel=1e-13)
    assert info["clip_fraction"] == np.mean((ratio < low) | (ratio > high))


@pytest.mark.parametrize("options", [{"clip_interval": "reciprocal"},
                                     {"clip_range_low": 0.1, "clip_range_high": 0.3},
                                     {"dual_clip": 2.0}, {"dual_clip": 1.2, "clip_range_low": 0.3}])
@given(seed=st.integers(0, 2 ** 31))
@settings(max_examples=15)
def test_policy_loss_options_gradcheck(options, seed):
    r = np.random.default_rng(seed)
    n = 8
    old = r.normal(size=n) - 1.0
    new = old + r.normal(scale=0.6, size=n)
    adv = r.normal(size=n)
    adv[np.abs(adv) < 1e-2] = 0.5
    low, high, _ = clip_bounds(0.2, options.get("clip_range_low"), None,
                               options.get("clip_interval", "symmetric"))
    c = options.get("dual_clip")
    ratio = np.exp(new - old)
    # keep away from the kinks (ratio at a bound, min(...) equal to c * A)
    near = (np.abs(ratio - low) < 1e-3) | (np.abs(ratio - high) < 1e-3)
    if c is not None:
        s = np.minimum(ratio * adv, np.clip(ratio, low, high) * adv)
        near |= (adv < 0) & (np.abs(s - c * adv) < 1e-3)
    new[near] += 0.05
    _, d_new, _ = policy_loss(new, old, adv, 0.2, **options)
    check_gradients(lambda: policy_loss(new, old, adv, 0.2, **options)[0],
                    {"new_log_probs": new}, {"new_log_probs": d_new})


def test_dual_clip_bounds_negative_advantages_only():
    old = np.zeros(3)
    new = np.log(np.array([5.0, 5.0, 0.5]))  # ratio 5 (A < 0: bounded by c A), ratio 0.5
    adv = np.array([-1.0, 1.0, -1.0])
    loss, d_new, _ = policy_loss(new, old, adv, 0.2, dual_clip=3.0)
    # element 0: max(min(-5, -1.2), -3) = -3, gradient 0; element 1: clipped at 1.2, gradient 0;
    # element 2: min(-0.5, -0.8) = -0.8 (clipped), gradient 0
    assert loss == pytest.approx(-(-3.0 + 1.2 - 0.8) / 3, rel=1e-15)
    np.testing.assert_array_equal(d_new, [0.0, 0.0, 0.0])
    # at the tie ratio * A == c * A the gradient is halved (torch's max)
    new_tie = np.log(np.array([3.0]))
    c = math.exp(float(new_tie[0]))  # exactly the ratio the loss computes
    _, d_tie, _ = policy_loss(new_tie, np.zeros(1), -np.ones(1), 0.2, dual_clip=c)
    _, d_off, _ = policy_loss(new_tie, np.zeros(1), -np.ones(1), 0.2)
    assert d_tie[0] == 0.5 * d_off[0] != 0.0
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(new, old, adv, 0.2, dual_clip=1.0)


# -- Huber value loss -----------------------------------------------------------------------

def _huber(e, delta):
    z = np.abs(e)
    return np.where(z < delta, 0.5 * e * e, delta * (z - 0.5 * delta))


# the value clip on the exact bound: what autodiff of each formulation gives (torch written out
# five ways: its own max/clamp; TensorFlow's tie to the first operand; JAX's clip as
# minimum(maximum(x, lo), hi) with a max that splits ties; a clip that passes nothing at its
# bound, with the tie split and with the tie sent to the clipped term)
def _torch_value_loss(torch, values, old_values, returns, c, form):
    v = torch.tensor(values, requires_grad=True)
    old, ret = torch.tensor(old_values), torch.tensor(returns)
    delta = v - old
    c_t = torch.full_like(delta, c)
    if form in ("torch", "tf"):
        clipped = old + torch.clamp(delta, -c, c)
    elif form == "jax":
        clipped = old + torch.minimum(torch.maximum(delta, -c_t), c_t)
    else:  # no gradient through the clip at (and beyond) its bound
        clipped = torch.where(delta.abs() < c, v, old + c * torch.sign(delta.detach()))
    sq, sq_clip = (v - ret) ** 2, (clipped - ret) ** 2
    if form == "tf":
        term = torch.where(sq >= sq_clip, sq, sq_clip)
    elif form == "clipped_wins":
        term = torch.where(sq > sq_clip, sq, sq_clip)
    else:
        term = torch.maximum(sq, sq_clip)
    loss = term.mean()
    (grad,) = torch.autograd.grad(loss, v)
    return float(loss.detach()), grad.numpy()


@pytest.mark.parametrize("form, fraction", [("torch", 1.0), ("tf", 1.0), ("jax", 0.75),
                                            ("no_grad_at_bound", 0.5), ("clipped_wins", 0.0)])
def test_value_clip_boundary_grad_is_what_autodiff_gives(form, fraction):
    torch = pytest.importorskip("torch")
    c = 0.25
    old = np.array([0.5, -1.0, 2.0, 0.0, 1.0, 0.0, 0.0])
    values = old + np.array([c, -c, c, -c, 0.125, 0.5, 0.5])   # 4 on the bound, 1 inside
    returns = np.array([0.0, 1.0, -2.0, 3.0, 0.5, 0.75, -1.0])  # 2 outside (no mirror tie)
    want_loss, want_grad = _torch_value_loss(torch, values, old, returns, c, form)
    loss, grad = value_loss(values, old, returns, c, "max", boundary_grad=fraction)
    assert loss == pytest.approx(want_loss, rel=1e-15)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-15, atol=0.0)  # (1/n: rounding)
    # the reference (1.0) differs from the others exactly on the bound
    _, reference = value_loss(values, old, returns, c)
    on_bound = np.abs(values - old) == c
    np.testing.assert_allclose(reference[~on_bound], want_grad[~on_bound], rtol=1e-15)
    np.testing.assert_allclose(reference[on_bound] * fraction, want_grad[on_bound], rtol=1e-15)


def test_value_clip_boundary_grad_is_validated_and_ignored_by_sb3():
    v, old, ret = np.array([1.25, 0.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0])
    with pytest.raises(ValueError, match="boundary_grad must be in"):
        value_loss(v, old, ret, 0.25, boundary_grad=1.5)
    assert np.array_equal(value_loss(v, old, ret, 0.25, "sb3", boundary_grad=0.0)[1],
                          value_loss(v, old, ret, 0.25, "sb3")[1])


@pytest.mark.parametrize("clip, delta", [(None, 1.0), (None, 0.3), (0.2, 1.0), (0.5, 0.7)])
def test_huber_value_loss_equals_the_formula(clip, delta):
    r = np.random.default_rng(3)
    n = 50
    v, old, ret = r.normal(size=n) * 2, r.normal(size=n) * 2, r.normal(size=n) * 2
    loss, _ = value_loss(v, old, ret, clip, mode="huber", huber_delta=delta)
    terms = _huber(v - ret, delta)
    if clip is not None:
        terms = np.maximum(terms, _huber(old + np.clip(v - old, -clip, clip) - ret, delta))
    assert loss == pytest.approx(float(np.mean(terms)), rel=1e-14)


@pytest.mark.parametrize("clip", [None, 0.4])
@given(seed=st.integers(0, 2 ** 31))
@settings(max_examples=15)
def test_huber_value_loss_gradcheck(clip, seed):
    r = np.random.default_rng(seed)
    n = 8
    old = r.normal(size=n)
    v = old + r.uniform(-1.5, 1.5, n)
    ret = r.normal(size=n) * 2
    # away from |e| = delta, |V - V_old| = c and ties of the two terms
    for e in (v - ret,):
        v[np.abs(np.abs(e) - 0.6) < 1e-3] += 0.01
    if clip is not None:
        d = v - old
        v[np.abs(np.abs(d) - clip) < 1e-3] += 0.01
        vc = old + np.clip(v - old, -clip, clip)
        tie = np.abs(_huber(v - ret, 0.6) - _huber(vc - ret, 0.6)) < 1e-3
        ret[tie] += 0.05
    _, d_v = value_loss(v, old, ret, clip, mode="huber", huber_delta=0.6)
    check_gradients(lambda: value_loss(v, old, ret, clip, mode="huber", huber_delta=0.6)[0],
                    {"values": v}, {"values": d_v})


# -- per-row weights (valid masks) ----------------------------------------------------------

@given(seed=st.integers(0, 2 ** 31), n=st.integers(2, 20))
@settings(max_examples=25)
def test_a_mask_equals_dropping_the_masked_rows(seed, n):
    r = np.random.default_rng(seed)
    new, old = r.normal(size=n) - 1, r.normal(size=n) - 1
    adv, v, ov, ret, ent = (r.normal(size=n) for _ in range(5))
    mask = r.random(n) < 0.6
    mask[0] = True
    w = mask.astype(float)
    kept = (new[mask], old[mask], adv[mask])
    loss, d_new, info = policy_loss(new, old, adv, 0.2, weights=w, dual_clip=2.0)
    loss_k, d_new_k, info_k = policy_loss(*kept, 0.2, dual_clip=2.0)
    assert loss == pytest.approx(loss_k, rel=1e-14, abs=1e-15)
    assert info["clip_fraction"] == info_k["clip_fraction"]
    assert info["approx_kl"] == pytest.approx(info_k["approx_kl"], rel=1e-14, abs=1e-15)
    np.testing.assert_allclose(d_new[mask], d_new_k, rtol=1e-14, atol=0)
    assert not np.any(d_new[~mask])
    for mode in ("max", "huber"):
        vl, d_v = value_loss(v, ov, ret, 0.3, mode=mode, weights=w)
        vl_k, d_v_k = value_loss(v[mask], ov[mask], ret[mask], 0.3, mode=mode)
        assert vl == pytest.approx(vl_k, rel=1e-14, abs=1e-15)
        np.testing.assert_allclose(d_v[mask], d_v_k, rtol=1e-14, atol=0)
    el, d_e = entropy_loss(ent, weights=w)
    assert el == pytest.approx(-float(np.mean(ent[mask])), rel=1e-14, abs=1e-15)
    assert approx_kl(old, new, "k1", weights=w) == pytest.approx(
        approx_kl(old[mask], new[mask], "k1"), rel=1e-13, abs=1e-15)
    assert not np.any(d_e[~mask])


def test_weights_are_validated():
    x = np.zeros(3)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        policy_loss(x, x, x, 0.2, weights=[1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="weights must have a positive finite sum"):
        value_loss(x, x, x, weights=np.zeros(3))
    with pytest.raises(ValueError, match="weights"):
        policy_loss(x, x, x, 0.2, weights=np.ones(2))


def test_weighted_minibatch_loss_gradcheck():
    """The minibatch loss with weights and every loss option: its gradients are the derivatives
    of its total (finite differences)."""
    r = np.random.default_rng(11)
    n = 9
    new, old = r.normal(-1, 0.3, n), r.normal(-1, 0.3, n)
    ent, vals = r.uniform(0.1, 1, n), r.normal(size=n)
    adv, ret, oldv = r.normal(size=n), r.normal(size=n), r.normal(size=n)
    w = np.array([1, 0, 1, 0.5, 1, 1, 0, 2, 1.0])
    config = PPOConfig(ent_coef=0.01, clip_range_vf=0.3, value_loss_mode="huber",
                       huber_delta=0.5, clip_interval="reciprocal", dual_clip=2.0,
                       advantage_norm_eps_placement="clamp", advantage_norm_eps=1e-6)

    def total():
        return minibatch_loss(new, ent, vals, old, adv, ret, oldv, config=config,
                              clip_range=0.2, weights=w).loss
    out = minibatch_loss(new, ent, vals, old, adv, ret, oldv, config=config,
                         clip_range=0.2, weights=w)
    check_gradients(total, {"new": new, "ent": ent, "vals": vals},
                    {"new": out.d_log_probs, "ent": out.d_entropy, "vals": out.d_values})


# -- skrl's KL stop rule --------------------------------------------------------------------

def test_skrl_rule_skips_the_step_and_ends_only_the_current_epoch():
    """skrl (ppo.py lines 381-389 at c29ced63): per minibatch, before the step, break the
    minibatch loop when kl > kl_threshold; the epoch loop goes on."""
    from ppo_ref.spec.optim import adam_init
    from ppo_ref.spec.update import Minibatch, run_epochs
    B, MB = 16, 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal(B)
    old = np.log(rng.uniform(0.2, 0.8, B))
    adv, ret, oldv = rng.standard_normal(B), rng.standard_normal(B), rng.standard_normal(B)
    evaluated = []

    def evaluate(params, idx):
        evaluated.append(len(idx))
        return old[idx] + params["s"][0] * x[idx], np.zeros(len(idx)), \
            np.full(len(idx), params["v"][0]), idx

    def backward(params, idx, d_lp, d_e, d_v):
        return {"s": np.array([np.sum(d_lp * x[idx])]), "v": np.array([np.sum(d_v)])}

    def minibatches(epoch):
        return [Minibatch(old[i:i + MB], adv[i:i + MB], ret[i:i + MB], oldv[i:i + MB],
                          np.arange(i, i + MB)) for i in range(0, B, MB)]
    params = {"s": np.zeros(1), "v": np.zeros(1)}
    cfg = PPOConfig(n_steps=B, batch_size=MB, n_epochs=5, target_kl=1e-14, kl_stop_rule="skrl")
    _, _, stats = run_epochs(params, adam_init(params), config=cfg, lr=0.05, clip_range=0.2,
                             minibatches=minibatches, evaluate=evaluate, backward=backward)
    # epoch 0: minibatch 0 has KL 0 (stepped), minibatch 1 exceeds (skipped, epoch ends);
    # every later epoch: its first minibatch already exceeds, so no step, but all epochs run
    assert stats["n_gradient_steps"] == 1.0 and stats["n_epochs_run"] == 5.0
    assert stats["kl_stopped"] == 1.0 and len(evaluated) == 2 + 4
