"""The readable distributions (ppo_ref.spec.distributions): categorical with action masks,
MultiDiscrete and diagonal Gaussian against oracles written here and central differences
(tests/gradcheck.py), sampling frequencies; and the argument errors of ppo_ref.spec.layers,
.networks and .distributions, each naming the argument. (The gradients of the layers and the
actor-critic are tests/test_mlp.py's and tests/test_actor_critic.py's; the compiled twins are
checked against these functions in tests/test_tiers.py.)"""
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from ppo_ref.spec import distributions as sd
from ppo_ref.spec import layers as sl
from ppo_ref.spec import networks as sn

RTOL = 1e-12
NEG_INF = -np.inf


def assert_close(actual, expected, atol=0.0):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=atol)


def masked_logits(rng, shape, mask_prob=0.3):
    """Random logits ``shape = [..., A]`` with some ``-inf``, at least one valid action per row."""
    z = 2.0 * rng.standard_normal(shape)
    rows = z.reshape(-1, shape[-1])
    mask = rng.random(rows.shape) < mask_prob
    mask[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] = False
    rows[mask] = NEG_INF
    return z


def valid_actions(rng, logits):
    """One unmasked action per row of ``logits [..., A]``, int64 ``[...]``."""
    rows = logits.reshape(-1, logits.shape[-1])
    return np.array([rng.choice(np.flatnonzero(np.isfinite(r))) for r in rows],
                    dtype=np.int64).reshape(logits.shape[:-1])


# --------------------------------------------------------------------------------------------
# categorical

def test_categorical_backwards_do_not_mutate_their_inputs(rng):
    z = masked_logits(rng, (5, 4))
    a = valid_actions(rng, z)
    d = rng.standard_normal(5)
    z0, a0, d0 = z.copy(), a.copy(), d.copy()
    sd.categorical_log_prob_backward(z, a, d)
    sd.categorical_entropy_backward(z, d)
    for got, want in ((z, z0), (a, a0), (d, d0)):
        np.testing.assert_array_equal(got, want)


def test_categorical_gradients_with_masks(rng):
    z = masked_logits(rng, (6, 5))
    a = valid_actions(rng, z)
    d_lp = rng.standard_normal(6)
    d_h = rng.standard_normal(6)
    g_lp = sd.categorical_log_prob_backward(z, a, d_lp)
    g_h = sd.categorical_entropy_backward(z, d_h)
    masked = z == NEG_INF
    assert masked.any()
    assert np.all(g_lp[masked] == 0.0) and np.all(g_h[masked] == 0.0)

    def f():
        return float(np.sum(d_lp * sd.categorical_log_prob(z, a))
                     + np.sum(d_h * sd.categorical_entropy(z)))
    check_gradients(f, {"logits": z}, {"logits": g_lp + g_h})


def test_masked_actions_have_probability_zero_and_are_never_drawn(rng):
    z = masked_logits(rng, (40, 6), mask_prob=0.5)
    masked = z == NEG_INF
    log_pi = sd.log_softmax(z)
    assert np.all(log_pi[masked] == NEG_INF) and np.all(np.exp(log_pi)[masked] == 0.0)
    h = sd.categorical_entropy(z)
    n_valid = (~masked).sum(axis=-1)
    assert np.isfinite(h).all() and np.all(h >= 0.0)
    assert np.all(h <= np.log(n_valid) + 1e-12)
    # the log-prob of a masked action is -inf, its gradient finite: d * (onehot - pi)
    rows, cols = np.nonzero(masked)
    lp = sd.categorical_log_prob(z[rows], cols)
    assert np.all(lp == NEG_INF)
    d = rng.standard_normal(rows.size)
    g = sd.categorical_log_prob_backward(z[rows], cols, d)
    assert np.isfinite(g).all()
    np.testing.assert_array_equal(g[np.arange(rows.size), cols], d)
    samples = np.stack([sd.categorical_sample(rng, z) for _ in range(200)])
    assert not np.any(masked[np.arange(40), samples])
    assert not np.any(masked[np.arange(40), sd.categorical_mode(z)])


def test_categorical_sample_frequencies_follow_the_probabilities():
    z = np.array([0.5, NEG_INF, -1.0, 1.5, 0.0])
    pi = np.exp(sd.log_softmax(z))
    n = 20000
    draws = sd.categorical_sample(np.random.default_rng(11), np.broadcast_to(z, (n, 5)))
    freq = np.bincount(draws, minlength=5) / n
    assert freq[1] == 0.0
    assert np.all(np.abs(freq - pi) <= 5.0 * np.sqrt(pi * (1 - pi) / n)), (freq, pi)  # 5 sigma


@settings(max_examples=30)
@given(n_rows=st.integers(1, 5), n_actions=st.integers(1, 9),
       mask_prob=st.sampled_from([0.0, 0.5, 0.9]), seed=st.integers(0, 2 ** 32 - 1))
def test_categorical_properties(n_rows, n_actions, mask_prob, seed):
    rng = np.random.default_rng(seed)
    z = masked_logits(rng, (n_rows, n_actions), mask_prob)
    pi = np.exp(sd.log_softmax(z))
    np.testing.assert_allclose(pi.sum(axis=-1), 1.0, rtol=1e-14)
    # softmax is invariant to adding a constant to a row: the gradient rows sum to 0
    a = valid_actions(rng, z)
    g = sd.categorical_log_prob_backward(z, a, np.ones(n_rows))
    g_h = sd.categorical_entropy_backward(z, np.ones(n_rows))
    np.testing.assert_allclose(g.sum(axis=-1), 0.0, atol=1e-14)
    np.testing.assert_allclose(g_h.sum(axis=-1), 0.0, atol=1e-14)


# --------------------------------------------------------------------------------------------
# MultiDiscrete

NVEC = (3, 1, 4)


def multi_logits(rng, batch):
    return np.concatenate([masked_logits(rng, (batch, n)) for n in NVEC], axis=-1)


def multi_actions(rng, logits):
    parts = np.split(logits, np.cumsum(NVEC)[:-1], axis=-1)
    return np.stack([valid_actions(rng, p) for p in parts], axis=-1)


def test_multi_categorical_is_the_sum_of_its_components(rng):
    z = multi_logits(rng, 6)
    a = multi_actions(rng, z)
    parts = np.split(z, np.cumsum(NVEC)[:-1], axis=-1)
    lp = sum(sd.categorical_log_prob(p, a[:, j]) for j, p in enumerate(parts))
    h = sum(sd.categorical_entropy(p) for p in parts)
    assert_close(sd.multi_categorical_log_prob(z, a, NVEC), lp)
    assert_close(sd.multi_categorical_entropy(z, NVEC), h, atol=1e-15)
    np.testing.assert_array_equal(sd.multi_categorical_mode(z, NVEC),
                                  np.stack([sd.categorical_mode(p) for p in parts], -1))
    # one component: the plain categorical
    assert_close(sd.multi_categorical_log_prob(parts[0], a[:, :1], [3]),
                 sd.categorical_log_prob(parts[0], a[:, 0]))


def test_multi_categorical_gradients(rng):
    z = multi_logits(rng, 5)
    a = multi_actions(rng, z)
    d_lp = rng.standard_normal(5)
    d_h = rng.standard_normal(5)
    g = (sd.multi_categorical_log_prob_backward(z, a, NVEC, d_lp)
         + sd.multi_categorical_entropy_backward(z, NVEC, d_h))
    assert g.shape == z.shape and np.all(g[z == NEG_INF] == 0.0)

    def f():
        return float(np.sum(d_lp * sd.multi_categorical_log_prob(z, a, NVEC))
                     + np.sum(d_h * sd.multi_categorical_entropy(z, NVEC)))
    check_gradients(f, {"logits": z}, {"logits": g})


def test_multi_categorical_sample_draws_component_by_component(rng):
    z = multi_logits(rng, 30)
    parts = np.split(z, np.cumsum(NVEC)[:-1], axis=-1)
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    a = sd.multi_categorical_sample(rng_a, z, NVEC)
    b = np.stack([sd.categorical_sample(rng_b, p) for p in parts], axis=-1)
    assert a.shape == (30, 3) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert rng_a.bit_generator.state == rng_b.bit_generator.state
    assert np.all(np.isfinite(sd.multi_categorical_log_prob(z, a, NVEC)))  # never masked


@settings(max_examples=20)
@given(nvec=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       batch_shape=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
       seed=st.integers(0, 2 ** 32 - 1))
def test_multi_categorical_shapes(nvec, batch_shape, seed):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(batch_shape + (sum(nvec),))
    a = sd.multi_categorical_sample(rng, z, nvec)
    assert a.shape == batch_shape + (len(nvec),)
    assert np.all(a < np.array(nvec)) and np.all(a >= 0)
    lp = sd.multi_categorical_log_prob(z, a, nvec)
    h = sd.multi_categorical_entropy(z, nvec)
    assert lp.shape == h.shape == batch_shape
    assert np.all(lp <= 0.0) and np.all(h >= 0.0)
    assert np.all(h <= np.sum(np.log(nvec)) + 1e-12)
    g = sd.multi_categorical_log_prob_backward(z, a, nvec, np.ones(batch_shape))
    assert g.shape == z.shape


# --------------------------------------------------------------------------------------------
# Gaussian

def test_gaussian_gradients(rng):
    mean = rng.standard_normal((2, 4, 3))
    log_std = 0.3 * rng.standard_normal(3)
    actions = mean + np.exp(log_std) * rng.standard_normal((2, 4, 3))
    d_lp = rng.standard_normal((2, 4))
    d_h = rng.standard_normal((2, 4))
    d_mean, d_log_std = sd.gaussian_log_prob_backward(mean, log_std, actions, d_lp)
    d_log_std = d_log_std + sd.gaussian_entropy_backward(log_std, d_h)

    def f():
        return float(np.sum(d_lp * sd.gaussian_log_prob(mean, log_std, actions))
                     + np.sum(d_h * sd.gaussian_entropy(log_std, (2, 4))))
    check_gradients(f, {"mean": mean, "log_std": log_std},
                    {"mean": d_mean, "log_std": d_log_std})


def test_gaussian_log_prob_is_the_written_out_density(rng):
    mean = rng.standard_normal((10, 3))
    log_std = 0.3 * rng.standard_normal(3)
    actions = mean + np.exp(log_std) * rng.standard_normal((10, 3))
    # against the density written out for one row
    row = [-0.5 * ((actions[0, j] - mean[0, j]) / math.exp(log_std[j])) ** 2 - log_std[j]
           - 0.5 * math.log(2 * math.pi) for j in range(3)]
    assert_close(sd.gaussian_log_prob(mean, log_std, actions)[0], math.fsum(row), atol=1e-14)


# --------------------------------------------------------------------------------------------
# argument errors name the argument

def _bad_calls():
    rng = np.random.default_rng(0)
    lin = sl.linear_init(rng, 3, 2, 1.0)
    mlp = sl.mlp_init(rng, 3, (4,), 2)
    _, lin_cache = sl.linear_forward(lin, np.ones((2, 3)))
    ac = sn.actor_critic_init(rng, 3, 2, net_arch=(4,))
    ac_shared = sn.actor_critic_init(rng, 3, 2, net_arch=(4,), shared_trunk=True)
    _, _, ac_cache = sn.actor_critic_forward(ac, np.ones((2, 3)))
    z = np.zeros((2, 3))
    mz = np.zeros((2, 4))
    return [
        (lambda: sl.orthogonal("seed", (2, 2)), "rng"),
        (lambda: sl.orthogonal(rng, (3,)), "shape"),
        (lambda: sl.orthogonal(rng, (2, 2), float("nan")), "gain"),
        (lambda: sl.linear_init(rng, 0, 2, 1.0), "in_dim"),
        (lambda: sl.mlp_init(rng, 3, (4, True), 2), "hidden_sizes"),
        (lambda: sl.linear_forward(lin, np.ones((2, 4))), "x"),
        (lambda: sl.linear_forward(lin, np.array([[1.0, np.nan, 0.0]])), "x"),
        (lambda: sl.linear_forward({"w": lin["w"].astype(np.float32), "b": lin["b"]},
                                   np.ones(3)), r"params\['w'\]"),
        (lambda: sl.linear_forward({"w": lin["w"]}, np.ones(3)), "params"),
        (lambda: sl.linear_backward(lin, lin_cache, np.ones((2, 3))), "dy"),
        (lambda: sl.linear_backward(lin, (np.ones((2, 3)),), np.ones((2, 2))), "cache"),
        (lambda: sl.tanh_backward(sl.tanh_forward(z)[1], np.ones(3)), "dy"),
        (lambda: sl.mlp_forward(mlp, np.ones(3), "gelu"), "activation"),
        (lambda: sl.mlp_forward({**mlp, "w9": mlp["w0"]}, np.ones(3)), "params"),
        (lambda: sl.mlp_forward({**mlp, "w1": np.ones((2, 5))}, np.ones(3)), r"params\['w1'\]"),
        (lambda: sn.actor_critic_init(rng, 0, 2), "obs_dim"),
        (lambda: sn.actor_critic_init(rng, 3, 2, net_arch=(4, -1)), "net_arch"),
        (lambda: sn.actor_critic_init(rng, 3, 2, activation="elu"), "activation"),
        (lambda: sn.actor_critic_init(rng, 3, 2, value_gain=np.inf), "value_gain"),
        (lambda: sn.actor_critic_forward(ac, np.ones((2, 4))), "obs"),
        (lambda: sn.actor_critic_forward(ac, np.ones(3)), "obs"),
        (lambda: sn.actor_critic_forward(ac, np.full((2, 3), np.inf)), "obs"),
        (lambda: sn.actor_critic_forward(ac_shared, np.ones((2, 3))), "params"),
        (lambda: sn.actor_critic_forward(ac, np.ones((2, 3)), shared_trunk=True), "params"),
        (lambda: sn.value_forward({k: v for k, v in ac.items() if k != "vf.b1"},
                                  np.ones((2, 3))), "params"),
        (lambda: sn.actor_critic_backward(ac, ac_cache, np.ones((2, 3)), np.ones(2)),
         "d_policy_out"),
        (lambda: sn.actor_critic_backward(ac, ac_cache, np.ones((2, 2)), np.ones(3)), "d_values"),
        (lambda: sn.actor_critic_backward(ac, None, np.ones((2, 2)), np.ones(2)), "cache"),
        (lambda: sd.log_softmax(np.array([0.0, np.nan])), "logits"),
        (lambda: sd.log_softmax(np.array([0.0, np.inf])), "logits"),
        (lambda: sd.log_softmax(np.array([[0.0, 1.0], [NEG_INF, NEG_INF]])), "logits"),
        (lambda: sd.log_softmax(1.0), "logits"),
        (lambda: sd.categorical_log_prob(z, np.array([0, 3])), "actions"),
        (lambda: sd.categorical_log_prob(z, np.array([0.5, 1.0])), "actions"),
        (lambda: sd.categorical_log_prob(z, np.array([True, False])), "actions"),
        (lambda: sd.categorical_log_prob(z, np.array([0, 1, 2])), "actions"),
        (lambda: sd.categorical_log_prob_backward(z, np.array([0, 1]), np.ones(3)), "d_log_probs"),
        (lambda: sd.categorical_entropy_backward(z, np.array([1.0, np.nan])), "d_entropy"),
        (lambda: sd.categorical_sample(None, z), "rng"),
        (lambda: sd.multi_categorical_log_prob(mz, np.zeros((2, 2)), (2, 3)), "logits"),
        (lambda: sd.multi_categorical_log_prob(mz, np.zeros((2, 2)), (4, 0)), "nvec"),
        (lambda: sd.multi_categorical_log_prob(mz, np.zeros((2, 2)), ()), "nvec"),
        (lambda: sd.multi_categorical_log_prob(mz, np.array([[0, 2], [0, 0]]), (2, 2)), "actions"),
        (lambda: sd.multi_categorical_entropy(np.array([[0.0, 1.0, NEG_INF, NEG_INF]] * 2),
                                              (2, 2)), "logits of component 1"),
        (lambda: sd.multi_categorical_sample(1, mz, (2, 2)), "rng"),
        (lambda: sd.gaussian_log_prob(np.ones((2, 3)), np.zeros(2), np.ones((2, 3))), "log_std"),
        (lambda: sd.gaussian_log_prob(np.full((2, 3), np.nan), np.zeros(3), np.ones((2, 3))),
         "mean"),
        (lambda: sd.gaussian_log_prob(np.ones((2, 3)), np.zeros(3), np.ones((3, 3))), "actions"),
        (lambda: sd.gaussian_log_prob_backward(np.ones((2, 3)), np.zeros(3), np.ones((2, 3)),
                                               np.ones(3)), "d_log_probs"),
        (lambda: sd.gaussian_entropy(np.zeros(3), (-1,)), "batch_shape"),
        (lambda: sd.gaussian_entropy_backward(np.zeros(3), np.array([np.inf])), "d_entropy"),
        (lambda: sd.gaussian_sample("rng", np.ones((2, 3)), np.zeros(3)), "rng"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_inputs_raise_value_error_naming_the_argument(index):
    call, name = _bad_calls()[index]
    with pytest.raises(ValueError, match=name):
        call()


def test_a_rejected_sample_draws_nothing():
    rng = np.random.default_rng(3)
    state = copy.deepcopy(rng.bit_generator.state)
    with pytest.raises(ValueError, match="logits"):
        sd.categorical_sample(rng, np.array([[0.0, 1.0], [NEG_INF, NEG_INF]]))
    with pytest.raises(ValueError, match="log_std"):
        sd.gaussian_sample(rng, np.ones((2, 3)), np.zeros(2))
    assert rng.bit_generator.state == state
