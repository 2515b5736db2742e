"""Categorical (with -inf masking) and diagonal Gaussian of ppo_ref.spec.distributions: values,
gradients, sampling, errors; the compiled sampler of ppo_ref.fast.distributions against the
readable one (the other twins: tests/test_tiers.py)."""
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from ppo_ref.spec import distributions as spec_distributions
from ppo_ref.spec.distributions import (
    categorical_entropy, categorical_entropy_backward, categorical_log_prob,
    categorical_log_prob_backward, categorical_log_prob_entropy,
    categorical_log_prob_entropy_backward, categorical_mode, categorical_sample, gaussian_entropy,
    gaussian_entropy_backward, gaussian_log_prob, gaussian_log_prob_backward, gaussian_sample,
    log_softmax,
)

NEG_INF = -np.inf


def naive_log_softmax(row):
    """Textbook log(exp(z_a) / sum exp(z)) for one row of moderate, unmasked logits."""
    e = [math.exp(v) for v in row]
    s = sum(e)
    return [math.log(v / s) for v in e]


def random_masked_logits(rng, batch, n_actions, mask_prob):
    """Random logits with some -inf entries, at least one valid action per row."""
    z = 2.0 * rng.standard_normal((batch, n_actions))
    mask = rng.random((batch, n_actions)) < mask_prob
    mask[np.arange(batch), rng.integers(0, n_actions, batch)] = False
    z[mask] = NEG_INF
    return z


def valid_actions(rng, logits):
    """One unmasked action per row."""
    out = []
    for row in logits.reshape(-1, logits.shape[-1]):
        out.append(rng.choice(np.flatnonzero(np.isfinite(row))))
    return np.array(out, dtype=np.int64).reshape(logits.shape[:-1])


# --------------------------------------------------------------------------------------------
# log_softmax

def test_log_softmax_is_exact_for_large_shifted_logits():
    a = log_softmax(np.array([1000.0, 1001.0, 1002.0]))
    b = log_softmax(np.array([0.0, 1.0, 2.0]))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(b, naive_log_softmax([0.0, 1.0, 2.0]), rtol=1e-15)
    np.testing.assert_array_equal(log_softmax(np.array([-1000.0, -999.0, -998.0])), b)


def test_log_softmax_float32_rows_with_huge_negative_logits():
    """float32 logits are widened exactly to float64: the float64 result of the same values."""
    z = np.array([[0.0, -1e10, 1.0], [-1e10, -1e10, -1e10]], dtype=np.float32)
    out = log_softmax(z)
    assert out.dtype == np.float64 and np.isfinite(out).all()
    np.testing.assert_array_equal(out, log_softmax(z.astype(np.float64)))
    lse0 = math.log1p(math.exp(-1.0))  # the row's log-sum-exp after the shift
    np.testing.assert_allclose(out[0], [-1.0 - lse0, -1e10 - 1.0 - lse0, -lse0], rtol=1e-15)
    np.testing.assert_allclose(out[1], np.full(3, -math.log(3)), rtol=1e-15)
    np.testing.assert_allclose(np.exp(out).sum(axis=-1), 1.0, rtol=1e-15)


@given(batch=st.integers(1, 6), n_actions=st.integers(1, 8), seed=st.integers(0, 2**31))
@settings(max_examples=30)
def test_log_softmax_matches_naive_oracle(batch, n_actions, seed):
    z = 3.0 * np.random.default_rng(seed).standard_normal((batch, n_actions))
    out = log_softmax(z)
    expected = np.array([naive_log_softmax(row) for row in z])
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.exp(out).sum(axis=-1), 1.0, rtol=1e-14)


def test_masked_logits_have_zero_probability_and_finite_entropy():
    z = np.array([[0.0, NEG_INF, 0.0, NEG_INF], [1.0, 2.0, 3.0, NEG_INF]])
    lp = log_softmax(z)
    assert lp[0, 1] == NEG_INF and lp[0, 3] == NEG_INF and lp[1, 3] == NEG_INF
    np.testing.assert_allclose(lp[0, [0, 2]], math.log(0.5), rtol=1e-15)
    np.testing.assert_allclose(lp[1, :3], log_softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-15)
    h = categorical_entropy(z)
    assert np.isfinite(h).all()
    np.testing.assert_allclose(h[0], math.log(2), rtol=1e-15)
    np.testing.assert_allclose(h[1], categorical_entropy(np.array([1.0, 2.0, 3.0])), rtol=1e-15)


def test_int_logits_are_cast_to_float64():
    assert log_softmax(np.array([1, 2, 3])).dtype == np.float64


# --------------------------------------------------------------------------------------------
# entropy and log-prob values

@given(batch=st.integers(1, 5), n_actions=st.integers(1, 12), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_entropy_matches_naive_oracle_with_masks(batch, n_actions, seed):
    z = random_masked_logits(np.random.default_rng(seed), batch, n_actions, 0.3)
    h = categorical_entropy(z)
    for row, hr in zip(z, h):
        valid = row[np.isfinite(row)]
        lp = naive_log_softmax(valid)
        assert hr == pytest.approx(-sum(math.exp(v) * v for v in lp), rel=1e-12, abs=1e-14)
        assert -1e-15 <= hr <= math.log(len(valid)) + 1e-12


def test_entropy_of_uniform_and_of_a_single_action():
    np.testing.assert_allclose(categorical_entropy(np.zeros((2, 5))), math.log(5), rtol=1e-15)
    assert categorical_entropy(np.array([NEG_INF, 3.0, NEG_INF])) == 0.0


def test_log_prob_gathers_the_action_entry_and_masked_action_is_minus_inf():
    z = np.array([[0.5, -1.0, NEG_INF], [2.0, 0.0, 1.0]])
    lp_all = log_softmax(z)
    np.testing.assert_array_equal(categorical_log_prob(z, np.array([1, 2])), [lp_all[0, 1], lp_all[1, 2]])
    assert categorical_log_prob(z, np.array([2, 0]))[0] == NEG_INF
    np.testing.assert_array_equal(categorical_log_prob(z, np.array([1.0, 2.0])),
                                  categorical_log_prob(z, np.array([1, 2])))
    lp3 = categorical_log_prob(np.zeros((2, 3, 4)), np.zeros((2, 3), dtype=np.int32))
    np.testing.assert_allclose(lp3, np.full((2, 3), -math.log(4)), rtol=1e-15)


# --------------------------------------------------------------------------------------------
# categorical gradients

@given(batch=st.integers(1, 5), n_actions=st.integers(1, 10), mask_prob=st.sampled_from([0.0, 0.4]),
       seed=st.integers(0, 2**31))
@settings(max_examples=30)
def test_categorical_log_prob_and_entropy_gradients(batch, n_actions, mask_prob, seed):
    rng = np.random.default_rng(seed)
    z = random_masked_logits(rng, batch, n_actions, mask_prob)
    actions = valid_actions(rng, z)
    d_lp = rng.standard_normal(batch)
    d_h = rng.standard_normal(batch)
    g_lp = categorical_log_prob_backward(z, actions, d_lp)
    g_h = categorical_entropy_backward(z, d_h)
    masked = np.isneginf(z)
    assert np.isfinite(g_lp).all() and np.isfinite(g_h).all()
    assert np.all(g_lp[masked] == 0.0) and np.all(g_h[masked] == 0.0)
    check_gradients(lambda: np.sum(categorical_log_prob(z, actions) * d_lp), {"z": z}, {"z": g_lp})
    check_gradients(lambda: np.sum(categorical_entropy(z) * d_h), {"z": z}, {"z": g_h})


@pytest.mark.parametrize("mask_prob", [0.0, 0.4])
def test_categorical_log_prob_entropy_and_its_joint_gradient(rng, mask_prob):
    """The joint functions are the pair of single ones and their summed gradients; the joint
    gradient passes the finite-difference check of sum(d_lp * log pi(a) + d_h * H)."""
    z = random_masked_logits(rng, 6, 5, mask_prob)
    actions = valid_actions(rng, z)
    d_lp, d_h = rng.standard_normal(6), rng.standard_normal(6)
    lp, h = categorical_log_prob_entropy(z, actions)
    np.testing.assert_array_equal(lp, categorical_log_prob(z, actions))
    np.testing.assert_array_equal(h, categorical_entropy(z))
    g = categorical_log_prob_entropy_backward(z, actions, d_lp, d_h)
    np.testing.assert_array_equal(g, categorical_log_prob_backward(z, actions, d_lp)
                                  + categorical_entropy_backward(z, d_h))
    np.testing.assert_array_equal(categorical_log_prob_entropy_backward(z, actions, d_lp, None),
                                  categorical_log_prob_backward(z, actions, d_lp))
    check_gradients(lambda: np.sum(categorical_log_prob(z, actions) * d_lp
                                   + categorical_entropy(z) * d_h), {"z": z}, {"z": g})


def test_categorical_gradients_with_leading_dimensions(rng):
    z = random_masked_logits(rng, 6, 4, 0.3).reshape(2, 3, 4)
    actions = valid_actions(rng, z)
    d = rng.standard_normal((2, 3))
    g = categorical_log_prob_backward(z, actions, d)
    assert g.shape == z.shape
    check_gradients(lambda: np.sum(categorical_log_prob(z, actions) * d), {"z": z}, {"z": g})
    g = categorical_entropy_backward(z, d)
    check_gradients(lambda: np.sum(categorical_entropy(z) * d), {"z": z}, {"z": g})


def test_categorical_backward_does_not_mutate_and_rows_sum_to_zero(rng):
    z = random_masked_logits(rng, 5, 4, 0.3)
    actions = valid_actions(rng, z)
    d = rng.standard_normal(5)
    before = copy.deepcopy((z, actions, d))
    g1 = categorical_log_prob_backward(z, actions, d)
    g2 = categorical_entropy_backward(z, d)
    for a, b in zip((z, actions, d), before):
        np.testing.assert_array_equal(a, b)
    # softmax is shift invariant: every logit gradient row sums to 0
    np.testing.assert_allclose(g1.sum(axis=-1), 0.0, atol=1e-14)
    np.testing.assert_allclose(g2.sum(axis=-1), 0.0, atol=1e-14)


def test_categorical_float32_inputs_give_the_float64_results(rng):
    z = rng.standard_normal((3, 4)).astype(np.float32)
    a = np.array([0, 1, 3])
    d = np.ones(3, np.float32)
    z64 = z.astype(np.float64)
    for got, want in ((categorical_log_prob(z, a), categorical_log_prob(z64, a)),
                      (categorical_entropy(z), categorical_entropy(z64)),
                      (categorical_entropy_backward(z, d), categorical_entropy_backward(z64, d)),
                      (categorical_log_prob_backward(z, a, d),
                       categorical_log_prob_backward(z64, a, d))):
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------
# sampling and mode

def test_sampling_frequencies_match_probabilities_and_masked_never_drawn():
    logits = np.array([0.5, -1.0, 2.0, NEG_INF, 0.0])
    n = 200_000
    draws = categorical_sample(np.random.default_rng(2024), np.broadcast_to(logits, (n, 5)))
    assert draws.dtype == np.int64 and draws.shape == (n,)
    counts = np.bincount(draws, minlength=5)
    assert counts[3] == 0
    p = np.exp(log_softmax(logits))
    valid = p > 0
    chi2 = np.sum((counts[valid] - n * p[valid]) ** 2 / (n * p[valid]))
    # 3 degrees of freedom: P(chi2 > 30) < 2e-6; a wrong sampler gives thousands here
    assert chi2 < 30.0, (counts, n * p)


@given(batch=st.integers(1, 30), n_actions=st.integers(1, 8), seed=st.integers(0, 2**31))
@settings(max_examples=30)
def test_sampled_actions_are_in_range_and_never_masked(batch, n_actions, seed):
    rng = np.random.default_rng(seed)
    z = random_masked_logits(rng, batch, n_actions, 0.5)
    z = np.repeat(z, 50, axis=0)  # 50 draws per row
    a = categorical_sample(rng, z)
    assert a.min() >= 0 and a.max() < n_actions
    assert np.isfinite(z[np.arange(z.shape[0]), a]).all()


def test_sampling_is_reproducible_and_uses_only_the_generator():
    z = np.zeros((100, 6))
    a = categorical_sample(np.random.default_rng(3), z)
    b = categorical_sample(np.random.default_rng(3), z)
    c = categorical_sample(np.random.default_rng(4), z)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    single = categorical_sample(np.random.default_rng(3), np.array([0.0, NEG_INF]))
    assert single.shape == () and int(single) == 0


def test_sampling_near_certain_action():
    z = np.array([[0.0, -800.0, NEG_INF]])  # p(1) underflows to 0 in float64
    a = categorical_sample(np.random.default_rng(0), np.repeat(z, 1000, axis=0))
    assert np.all(a == 0)


def test_mode_is_argmax_and_skips_masked():
    z = np.array([[NEG_INF, 1.0, 3.0], [5.0, NEG_INF, 5.0]])
    np.testing.assert_array_equal(categorical_mode(z), [2, 0])
    assert categorical_mode(z).dtype == np.int64


# --------------------------------------------------------------------------------------------
# categorical errors

ALL_MASKED = np.array([[0.0, 1.0], [NEG_INF, NEG_INF]])


@pytest.mark.parametrize("call", [
    lambda z: log_softmax(z),
    lambda z: categorical_entropy(z),
    lambda z: categorical_log_prob(z, np.array([0, 0])),
    lambda z: categorical_log_prob_backward(z, np.array([0, 0]), np.ones(2)),
    lambda z: categorical_entropy_backward(z, np.ones(2)),
    lambda z: categorical_sample(np.random.default_rng(0), z),
    lambda z: categorical_mode(z),
])
def test_all_masked_row_raises_everywhere(call):
    with pytest.raises(ValueError, match=r"row \(1,\) has every action masked"):
        call(ALL_MASKED)


def test_nan_and_plus_inf_logits_raise():
    with pytest.raises(ValueError, match="NaN"):
        log_softmax(np.array([[0.0, 1.0], [np.nan, 0.0]]))
    with pytest.raises(ValueError, match=r"\+inf"):
        categorical_entropy(np.array([0.0, np.inf]))
    with pytest.raises(ValueError, match="every action masked"):
        log_softmax(np.array([NEG_INF]))


def test_categorical_argument_errors():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match="actions must be in"):
        categorical_log_prob(z, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="actions must be in"):
        categorical_log_prob(z, np.array([0, -1, 1]))
    with pytest.raises(ValueError, match="actions must have the shape"):
        categorical_log_prob(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="actions must hold integer values"):
        categorical_log_prob(z, np.array([0.5, 1.0, 1.0]))
    with pytest.raises(ValueError, match="actions must be integers"):
        categorical_log_prob(z, np.array([True, False, True]))
    with pytest.raises(ValueError, match="d_log_probs must have the shape"):
        categorical_log_prob_backward(z, np.array([0, 1, 2]), np.ones(4))
    with pytest.raises(ValueError, match="d_entropy must be finite"):
        categorical_entropy_backward(z, np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="logits must have at least one action"):
        log_softmax(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="logits must have at least 1 dimension"):
        log_softmax(1.0)
    with pytest.raises(ValueError, match="rng"):
        categorical_sample(np.random.RandomState(0), z)


# --------------------------------------------------------------------------------------------
# diagonal Gaussian

def naive_gaussian_log_prob(mean, log_std, action):
    """Sum over dims of the scalar normal log-density, written from the textbook formula."""
    total = 0.0
    for m, s, a in zip(mean, log_std, action):
        sigma = math.exp(s)
        total += math.log(1.0 / (sigma * math.sqrt(2.0 * math.pi))) - (a - m) ** 2 / (2.0 * sigma**2)
    return total


@given(batch=st.integers(1, 5), action_dim=st.integers(1, 4), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_gaussian_log_prob_entropy_values_and_gradients(batch, action_dim, seed):
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal((batch, action_dim))
    log_std = 0.5 * rng.standard_normal(action_dim)
    actions = mean + np.exp(log_std) * rng.standard_normal((batch, action_dim))
    lp = gaussian_log_prob(mean, log_std, actions)
    for i in range(batch):
        assert lp[i] == pytest.approx(naive_gaussian_log_prob(mean[i], log_std, actions[i]), rel=1e-12)
    h = gaussian_entropy(log_std, batch)
    expected_h = sum(0.5 * math.log(2 * math.pi * math.e * math.exp(2 * s)) for s in log_std)
    np.testing.assert_allclose(h, np.full(batch, expected_h), rtol=1e-13)

    d_lp = rng.standard_normal(batch)
    d_mean, d_log_std = gaussian_log_prob_backward(mean, log_std, actions, d_lp)
    check_gradients(lambda: np.sum(gaussian_log_prob(mean, log_std, actions) * d_lp),
                    {"mean": mean, "log_std": log_std}, {"mean": d_mean, "log_std": d_log_std})
    d_h = rng.standard_normal(batch)
    g = gaussian_entropy_backward(log_std, d_h)
    check_gradients(lambda: np.sum(gaussian_entropy(log_std, batch) * d_h),
                    {"log_std": log_std}, {"log_std": g})


def test_gaussian_shapes_dtypes_and_no_mutation(rng):
    mean = rng.standard_normal((2, 3, 2))
    log_std = np.array([0.1, -0.3])
    actions = rng.standard_normal((2, 3, 2))
    d = rng.standard_normal((2, 3))
    before = copy.deepcopy((mean, log_std, actions, d))
    assert gaussian_log_prob(mean, log_std, actions).shape == (2, 3)
    dm, dls = gaussian_log_prob_backward(mean, log_std, actions, d)
    assert dm.shape == (2, 3, 2) and dls.shape == (2,)
    for a, b in zip((mean, log_std, actions, d), before):
        np.testing.assert_array_equal(a, b)
    assert gaussian_entropy(log_std, (2, 3)).shape == (2, 3)
    assert gaussian_entropy(log_std, ()).shape == ()
    f32 = [x.astype(np.float32) for x in (mean, log_std, actions)]
    assert gaussian_log_prob(*f32).dtype == np.float64  # the readable tier computes in float64
    assert gaussian_entropy(f32[1], 4).dtype == np.float64
    assert gaussian_sample(rng, f32[0], f32[1]).dtype == np.float64


def test_gaussian_sample_statistics_and_reproducibility():
    mean = np.array([1.0, -2.0])
    log_std = np.array([math.log(0.5), math.log(2.0)])
    x = gaussian_sample(np.random.default_rng(11), np.broadcast_to(mean, (100_000, 2)), log_std)
    # standard errors: 0.5/316 and 2/316; bounds are > 6 standard errors
    np.testing.assert_allclose(x.mean(axis=0), mean, atol=0.04)
    np.testing.assert_allclose(x.std(axis=0), np.exp(log_std), rtol=0.02)
    y = gaussian_sample(np.random.default_rng(11), np.broadcast_to(mean, (100_000, 2)), log_std)
    np.testing.assert_array_equal(x, y)


def test_gaussian_argument_errors(rng):
    mean = np.zeros((3, 2))
    with pytest.raises(ValueError, match="log_std must have the shape of mean's last axis"):
        gaussian_log_prob(mean, np.zeros(3), mean)
    with pytest.raises(ValueError, match=r"log_std must have the shape .* \(2,\), got \(3, 2\)"):
        gaussian_log_prob(mean, np.zeros((3, 2)), mean)
    with pytest.raises(ValueError, match="actions must have the shape"):
        gaussian_log_prob(mean, np.zeros(2), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="mean must be finite"):
        gaussian_log_prob(np.full((3, 2), np.nan), np.zeros(2), mean)
    with pytest.raises(ValueError, match="d_log_probs must have the shape"):
        gaussian_log_prob_backward(mean, np.zeros(2), mean, np.zeros(2))
    with pytest.raises(ValueError, match="batch_shape"):
        gaussian_entropy(np.zeros(2), (-1,))
    with pytest.raises(ValueError, match="rng"):
        gaussian_sample(None, mean, np.zeros(2))


@given(batch=st.integers(1, 20), n_actions=st.integers(1, 6), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_compiled_sampler_draws_the_readable_tiers_actions(batch, n_actions, seed):
    """ppo_ref.fast.distributions.categorical_sample (the spec's loop compiled) draws the
    actions of the readable categorical_sample from the same generator state, bit for bit, and
    leaves the generator where the readable one does; float32 logits are widened entry by entry
    (the actions of the float64 values)."""
    from ppo_ref.fast import distributions as fast
    rng = np.random.default_rng(seed)
    z = random_masked_logits(rng, batch, n_actions, 0.4)
    spec_rng = np.random.default_rng(seed + 1)
    want = categorical_sample(spec_rng, z)
    for dtype in (np.float64, np.float32):
        zc = np.ascontiguousarray(z.astype(dtype))
        fast_rng = np.random.default_rng(seed + 1)
        got = fast.categorical_sample(fast_rng, zc)
        np.testing.assert_array_equal(
            got, want if dtype == np.float64 else categorical_sample(
                np.random.default_rng(seed + 1), zc.astype(np.float64)))
        assert fast_rng.random() == np.random.default_rng(seed + 1).random(batch + 1)[-1]


@pytest.mark.parametrize("bad", [np.nan, np.inf, "all_masked"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_both_samplers_reject_bad_rows(bad, dtype):
    """A row the readable sampler rejects (ValueError naming the logits, its loop reporting
    False) makes the compiled one raise its one error (it does not re-validate: the spec
    explains)."""
    from ppo_ref.fast import distributions as fast
    z = np.zeros((3, 4), dtype=dtype)
    if bad == "all_masked":
        z[2] = NEG_INF
    else:
        z[1, 2] = bad
    with pytest.raises(ValueError, match="logits"):
        categorical_sample(np.random.default_rng(0), z)
    with pytest.raises(FloatingPointError, match="categorical_sample: non-finite"):
        fast.categorical_sample(np.random.default_rng(0), z)
    assert not spec_distributions.inverse_cdf_actions(z, np.full(3, 0.5),
                                                      np.empty(3, dtype=np.int64))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_categorical_functions_raise_one_error_for_refused_rows(dtype):
    """The compiled categorical functions do not re-validate: a row the spec refuses raises
    FloatingPointError naming the function, an action out of range ValueError."""
    from ppo_ref.fast import distributions as fast
    z = np.zeros((3, 4), dtype=dtype)
    a = np.array([0, 3, 1])
    d = np.ones(3, dtype=dtype)
    calls = {"categorical_log_prob_entropy": lambda z, a: fast.categorical_log_prob_entropy(z, a),
             "categorical_log_prob_entropy_backward":
                 lambda z, a: fast.categorical_log_prob_entropy_backward(z, a, d, d),
             "categorical_log_prob": lambda z, a: fast.categorical_log_prob(z, a),
             "categorical_entropy": lambda z, a: fast.categorical_entropy(z)}
    for name, call in calls.items():
        bad = z.copy()
        bad[1, 2] = np.nan
        with pytest.raises(FloatingPointError, match=f"fast.distributions.{name}: non-finite"):
            call(bad, a)
        if name != "categorical_entropy":
            with pytest.raises(ValueError, match="outside"):
                call(z, np.array([0, 4, 1]))


@pytest.mark.parametrize("bad", ["nan", "+inf", "all masked", "spread overflows"])
def test_a_refused_sample_draws_nothing(bad):
    """The spec checks every row before drawing: refused logits (in any row, here the last)
    raise and leave the Generator's state as it was, and the next draw is the one it would
    have been."""
    sample = spec_distributions.categorical_sample
    z = np.zeros((4, 3))
    z[-1] = {"nan": [0.0, np.nan, 1.0], "+inf": [np.inf, 0.0, 0.0],
             "all masked": [NEG_INF] * 3, "spread overflows": [1e308, -1e308, 0.0]}[bad]
    rng = np.random.default_rng(7)
    before = copy.deepcopy(rng.bit_generator.state)
    with pytest.raises(ValueError, match="logits"):
        sample(rng, z)
    assert rng.bit_generator.state == before
    np.testing.assert_array_equal(sample(rng, z[:-1]),
                                  sample(np.random.default_rng(7), z[:-1]))
