"""The readable MLP actor-critic (ppo_ref.spec.networks): init, the forward pass as the
composition of ppo_ref.spec.layers' MLPs, every gradient against central differences
(tests/gradcheck.py, with the categorical head of ppo_ref.spec.distributions on top), argument
errors. (The compiled twins, ppo_ref.fast.networks, are checked against these in
tests/test_tiers.py.)"""
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from ppo_ref.spec.distributions import (
    categorical_entropy, categorical_entropy_backward, categorical_log_prob,
    categorical_log_prob_backward,
)
from ppo_ref.spec.layers import mlp_forward
from ppo_ref.spec.networks import (
    ActorCriticCache, actor_critic_backward, actor_critic_forward, actor_critic_init, value_forward,
)


def sub(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def randomize_biases(rng, params):
    for k in params:
        if ".b" in k:
            params[k] = 0.3 * rng.standard_normal(params[k].shape)
    return params


def assert_orthogonal(w, gain):
    rows, cols = w.shape
    if rows <= cols:
        np.testing.assert_allclose(w @ w.T, gain**2 * np.eye(rows), atol=1e-12)
    else:
        np.testing.assert_allclose(w.T @ w, gain**2 * np.eye(cols), atol=1e-12)


# --------------------------------------------------------------------------------------------
# init

def test_separate_towers_init_keys_shapes_gains_and_zero_biases(rng):
    p = actor_critic_init(rng, 4, 2)
    assert list(p) == ["pi.w0", "pi.b0", "pi.w1", "pi.b1", "pi.w2", "pi.b2",
                       "vf.w0", "vf.b0", "vf.w1", "vf.b1", "vf.w2", "vf.b2"]
    shapes = {"w0": (64, 4), "w1": (64, 64), "w2": None}
    for tower, head_rows, head_gain in (("pi", 2, 0.01), ("vf", 1, 1.0)):
        assert p[f"{tower}.w0"].shape == shapes["w0"] and p[f"{tower}.w1"].shape == shapes["w1"]
        assert p[f"{tower}.w2"].shape == (head_rows, 64)
        assert_orthogonal(p[f"{tower}.w0"], math.sqrt(2))
        assert_orthogonal(p[f"{tower}.w1"], math.sqrt(2))
        assert_orthogonal(p[f"{tower}.w2"], head_gain)
    for k, v in p.items():
        assert v.dtype == np.float64
        if ".b" in k:
            assert np.all(v == 0.0)
    # the two towers are independent draws
    assert not np.allclose(p["pi.w0"], p["vf.w0"])


def test_shared_trunk_init_keys_shapes_and_gains(rng):
    p = actor_critic_init(rng, 3, 5, net_arch=(32, 16), shared_trunk=True,
                          policy_gain=0.5, value_gain=2.0, activation="relu")
    assert list(p) == ["trunk.w0", "trunk.b0", "trunk.w1", "trunk.b1",
                       "pi.w0", "pi.b0", "vf.w0", "vf.b0"]
    assert p["trunk.w0"].shape == (32, 3) and p["trunk.w1"].shape == (16, 32)
    assert p["pi.w0"].shape == (5, 16) and p["vf.w0"].shape == (1, 16)
    assert_orthogonal(p["trunk.w0"], math.sqrt(2))
    assert_orthogonal(p["trunk.w1"], math.sqrt(2))
    assert_orthogonal(p["pi.w0"], 0.5)
    assert_orthogonal(p["vf.w0"], 2.0)
    assert all(np.all(v == 0.0) for k, v in p.items() if ".b" in k)


def test_init_is_reproducible_and_validates(rng):
    a = actor_critic_init(np.random.default_rng(1), 4, 2)
    b = actor_critic_init(np.random.default_rng(1), 4, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="obs_dim"):
        actor_critic_init(rng, 0, 2)
    with pytest.raises(ValueError, match="net_arch"):
        actor_critic_init(rng, 4, 2, net_arch=(64, 0))
    with pytest.raises(ValueError, match="activation"):
        actor_critic_init(rng, 4, 2, activation="gelu")
    with pytest.raises(ValueError, match="policy_gain"):
        actor_critic_init(rng, 4, 2, policy_gain=float("inf"))


# --------------------------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_separate_forward_equals_two_mlps(rng, activation):
    p = randomize_biases(rng, actor_critic_init(rng, 4, 3, net_arch=(8, 6)))
    obs = rng.standard_normal((7, 4))
    logits, values, cache = actor_critic_forward(p, obs, activation)
    assert isinstance(cache, ActorCriticCache) and logits.shape == (7, 3) and values.shape == (7,)
    np.testing.assert_array_equal(logits, mlp_forward(sub(p, "pi."), obs, activation)[0])
    np.testing.assert_array_equal(values, mlp_forward(sub(p, "vf."), obs, activation)[0][:, 0])
    np.testing.assert_array_equal(value_forward(p, obs, activation), values)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_shared_forward_equals_trunk_then_heads(rng, activation):
    p = randomize_biases(rng, actor_critic_init(rng, 4, 3, net_arch=(8, 6), shared_trunk=True))
    obs = rng.standard_normal((7, 4))
    logits, values, _ = actor_critic_forward(p, obs, activation, shared_trunk=True)
    a, _ = mlp_forward(sub(p, "trunk."), obs, activation)  # last trunk layer is not activated there
    z = np.tanh(a) if activation == "tanh" else np.maximum(a, 0.0)
    np.testing.assert_allclose(logits, z @ p["pi.w0"].T + p["pi.b0"], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(values, (z @ p["vf.w0"].T + p["vf.b0"])[:, 0], rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(value_forward(p, obs, activation, shared_trunk=True), values)


def test_initial_policy_is_near_uniform_and_float32_obs_accepted(rng):
    p = actor_critic_init(rng, 4, 2)
    obs = rng.standard_normal((256, 4)).astype(np.float32)
    logits, values, _ = actor_critic_forward(p, obs)
    assert logits.dtype == np.float64 and values.dtype == np.float64
    assert np.abs(logits).max() < 0.2  # gain 0.01 on a [-1, 1]^64 input: |logit| <= 0.08
    logits64, _, _ = actor_critic_forward(p, obs.astype(np.float64))
    np.testing.assert_array_equal(logits, logits64)


# --------------------------------------------------------------------------------------------
# gradients

@given(batch=st.integers(1, 5), obs_dim=st.integers(1, 4), out_dim=st.integers(1, 3),
       net_arch=st.lists(st.integers(1, 6), min_size=0, max_size=2),
       activation=st.sampled_from(["tanh", "relu"]), shared_trunk=st.booleans(),
       seed=st.integers(0, 2**31))
@settings(max_examples=30)
def test_actor_critic_gradients_every_parameter(batch, obs_dim, out_dim, net_arch, activation,
                                                shared_trunk, seed):
    rng = np.random.default_rng(seed)
    # larger gains than PPO's so every head gradient is well above the check's floor
    p = randomize_biases(rng, actor_critic_init(rng, obs_dim, out_dim, net_arch=net_arch,
                                                shared_trunk=shared_trunk, policy_gain=1.0))
    obs = rng.standard_normal((batch, obs_dim))
    d_pi = rng.standard_normal((batch, out_dim))
    d_v = rng.standard_normal(batch)
    _, _, cache = actor_critic_forward(p, obs, activation, shared_trunk)
    grads = actor_critic_backward(p, cache, d_pi, d_v)
    assert list(grads) == list(p)

    def f():
        logits, values, _ = actor_critic_forward(p, obs, activation, shared_trunk)
        return np.sum(logits * d_pi) + np.sum(values * d_v)
    check_gradients(f, p, grads, rng=rng)


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_full_categorical_policy_loss_gradient(rng, shared_trunk, activation):
    """Towers + categorical log-prob and entropy (with a masked action) + a value term."""
    p = randomize_biases(rng, actor_critic_init(rng, 4, 3, net_arch=(16, 16),
                                                shared_trunk=shared_trunk, policy_gain=1.0))
    obs = rng.standard_normal((12, 4))
    mask = np.zeros((12, 3))
    mask[::3, 1] = -np.inf  # action 1 invalid in every third row
    actions = np.where(np.arange(12) % 3 == 0, 2, rng.integers(0, 3, 12))
    w_lp, w_h, returns = rng.standard_normal(12), rng.standard_normal(12), rng.standard_normal(12)

    def loss_and_grads():
        logits, values, cache = actor_critic_forward(p, obs, activation, shared_trunk)
        logits = logits + mask
        lp = categorical_log_prob(logits, actions)
        h = categorical_entropy(logits)
        loss = np.sum(w_lp * lp) + np.sum(w_h * h) + np.sum((values - returns) ** 2)
        d_logits = (categorical_log_prob_backward(logits, actions, w_lp)
                    + categorical_entropy_backward(logits, w_h))
        return loss, actor_critic_backward(p, cache, d_logits, 2.0 * (values - returns))

    _, grads = loss_and_grads()
    check_gradients(lambda: loss_and_grads()[0], p, grads, rng=rng)


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_backward_does_not_mutate_its_inputs(rng, shared_trunk):
    p = actor_critic_init(rng, 4, 2, shared_trunk=shared_trunk)
    obs = rng.standard_normal((9, 4))
    _, _, cache = actor_critic_forward(p, obs, "tanh", shared_trunk)
    d_pi, d_v = rng.standard_normal((9, 2)), rng.standard_normal(9)
    before = copy.deepcopy((p, cache, d_pi, d_v, obs))
    g1 = actor_critic_backward(p, cache, d_pi, d_v)
    g2 = actor_critic_backward(p, cache, d_pi, d_v)
    after = (p, cache, d_pi, d_v, obs)
    for a, b in zip(after[:1] + after[2:], before[:1] + before[2:]):
        if isinstance(a, dict):
            assert all(np.array_equal(a[k], b[k]) for k in a)
        else:
            np.testing.assert_array_equal(a, b)
    def arrays(c):  # every array of a (nested) cache
        if isinstance(c, np.ndarray):
            return [c]
        if isinstance(c, tuple):
            return [a for x in c for a in arrays(x)]
        return []
    flat_after, flat_before = arrays(cache), arrays(before[1])
    assert len(flat_after) == len(flat_before) > 0
    for a, b in zip(flat_after, flat_before):
        np.testing.assert_array_equal(a, b)
    assert all(np.array_equal(g1[k], g2[k]) for k in g1)


# --------------------------------------------------------------------------------------------
# validation

def test_validation_errors(rng):
    sep = actor_critic_init(rng, 4, 2)
    sh = actor_critic_init(rng, 4, 2, shared_trunk=True)
    obs = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match="shared_trunk=True"):
        actor_critic_forward(sh, obs)
    with pytest.raises(ValueError, match="one-layer heads"):
        actor_critic_forward(sep, obs, shared_trunk=True)
    with pytest.raises(ValueError, match=r"obs must have shape \[batch, 4\]"):
        actor_critic_forward(sep, obs[0])
    with pytest.raises(ValueError, match="obs must have last dimension 4"):
        actor_critic_forward(sep, rng.standard_normal((3, 5)))
    with pytest.raises(ValueError, match="obs must be finite"):
        value_forward(sep, np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="activation"):
        actor_critic_forward(sep, obs, "swish")
    with pytest.raises(ValueError, match="vf.w2"):
        actor_critic_forward(dict(sep, **{"vf.w2": np.zeros((2, 64)), "vf.b2": np.zeros(2)}), obs)
    _, _, cache = actor_critic_forward(sep, obs)
    with pytest.raises(ValueError, match=r"d_policy_out must have the shape of policy_out \(3, 2\)"):
        actor_critic_backward(sep, cache, np.zeros((3, 3)), np.zeros(3))
    with pytest.raises(ValueError, match=r"d_values must have the shape of values \(3,\)"):
        actor_critic_backward(sep, cache, np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="cache must be an ActorCriticCache"):
        actor_critic_backward(sep, None, np.zeros((3, 2)), np.zeros(3))


def _malformed_networks():
    """``(name, params, shared_trunk, match)``: actor-critic parameters wrong in one way, and
    what the error names."""
    rng = np.random.default_rng(0)
    separate = actor_critic_init(rng, 3, 2, net_arch=(4, 5))
    shared = actor_critic_init(rng, 3, 2, net_arch=(4,), shared_trunk=True)
    cases = []

    def change(name, base, shared_trunk, match, **edits):
        params = {k: v.copy() for k, v in base.items()}
        for k, v in edits.items():
            k = k.replace("__", ".")
            if v is None:
                del params[k]
            else:
                params[k] = v
        cases.append((name, params, shared_trunk, match))
    change("missing bias", separate, False, "pi.b1", pi__b1=None)
    change("widths do not chain", separate, False, "pi.w1", pi__w1=np.zeros((5, 3)))
    change("two value outputs", separate, False, "vf.w2", vf__w2=np.zeros((2, 5)),
           vf__b2=np.zeros(2))
    change("non-finite weight", separate, False, "pi.w0", pi__w0=np.full((4, 3), np.nan))
    change("towers of different inputs", separate, False, "vf.w0", vf__w0=np.zeros((4, 2)))
    change("extra key", separate, False, "extra", extra=np.zeros(1))
    change("trunk keys without shared_trunk", shared, False, "shared_trunk=True")
    change("two-layer heads on a trunk", separate, True, "one-layer heads")
    change("head not reading the trunk", shared, True, "vf.w0", vf__w0=np.zeros((1, 3)))
    return cases


@pytest.mark.parametrize("name, params, shared_trunk, match", _malformed_networks(),
                         ids=[c[0] for c in _malformed_networks()])
def test_malformed_networks_are_refused_naming_what_is_wrong(name, params, shared_trunk, match):
    """The one check of an actor-critic's parameters (actor_critic_towers) refuses each
    malformed network, in the forward pass and in the value pass."""
    obs = np.zeros((1, 3))
    for call in (lambda: actor_critic_forward(params, obs, shared_trunk=shared_trunk),
                 lambda: value_forward(params, obs, shared_trunk=shared_trunk)):
        with pytest.raises(ValueError, match=match):
            call()
