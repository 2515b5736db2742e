"""The one-buffer fast path of the MLP policy (ppo_ref.flat, nn.actor_critic.fused_*,
MLPPolicy.evaluate/backward): gradients against central differences, agreement with the
checked per-array path, and the fall-backs."""
import gymnasium as gym
import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.flat import FlatArrays, FlatLayout, flatten_arrays, is_flat, same_layout
from ppo_ref.nn.actor_critic import fused_layout
from ppo_ref.policies import MLPPolicy, _FusedPolicyCache


def make_policy(rng, *, activation="tanh", net_arch=(16, 16), continuous=False, n_actions=3):
    obs_space = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64)
    act_space = (gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64) if continuous
                 else gym.spaces.Discrete(n_actions))
    config = PPOConfig(activation=activation, net_arch=net_arch, policy_head_gain=1.0)
    policy = MLPPolicy(obs_space, act_space, config)
    params = policy.init_params(rng)
    for v in params.values():  # non-zero biases and log_std: every term of the gradient matters
        v[...] += 0.3 * rng.standard_normal(v.shape)
    return policy, params


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("net_arch", [(16, 16), (8,), (8, 6, 4)])
def test_fused_policy_gradient_matches_central_differences(rng, continuous, activation, net_arch):
    policy, params = make_policy(rng, activation=activation, net_arch=net_arch,
                                 continuous=continuous)
    assert is_flat(params) and params.layout == fused_layout(params)
    obs = rng.standard_normal((11, 5))
    actions = (rng.standard_normal((11, 2)) if continuous else rng.integers(0, 3, 11))
    w_lp, w_h, returns = rng.standard_normal(11), rng.standard_normal(11), rng.standard_normal(11)

    def loss_and_grads():
        ev = policy.evaluate(params, obs, actions)
        loss = (np.sum(w_lp * ev.log_probs) + np.sum(w_h * ev.entropy)
                + np.sum((ev.values - returns) ** 2))
        return loss, ev, policy.backward(params, ev.cache, w_lp, w_h, 2.0 * (ev.values - returns))

    _, ev, grads = loss_and_grads()
    assert isinstance(ev.cache, _FusedPolicyCache)
    assert is_flat(grads) and grads.layout == params.layout
    check_gradients(lambda: loss_and_grads()[0], dict(params), dict(grads), rng=rng)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_fused_path_agrees_with_checked_path(rng, continuous, activation):
    policy, params = make_policy(rng, activation=activation, continuous=continuous)
    obs = rng.standard_normal((64, 5))
    actions = (rng.standard_normal((64, 2)) if continuous else rng.integers(0, 3, 64))
    d_lp, d_h, d_v = rng.standard_normal(64), rng.standard_normal(64), rng.standard_normal(64)
    fast = policy.evaluate(params, obs, actions)
    plain = dict(params)  # an ordinary dict: the checked per-array path
    slow = policy.evaluate(plain, obs, actions)
    assert isinstance(fast.cache, _FusedPolicyCache) and not isinstance(slow.cache, _FusedPolicyCache)
    for a, b in zip(fast[:3], slow[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    g_fast = policy.backward(params, fast.cache, d_lp, d_h, d_v)
    g_slow = policy.backward(plain, slow.cache, d_lp, d_h, d_v)
    assert list(g_fast) == list(g_slow) == list(params)
    for k in params:
        np.testing.assert_allclose(g_fast[k], g_slow[k], rtol=1e-11, atol=1e-12, err_msg=k)


def test_fast_path_is_deterministic_and_row_order_free(rng):
    """The stored behaviour log-probs/values come from one batch, the minibatches from row
    subsets of it: per-row results must not depend on the other rows."""
    policy, params = make_policy(rng, net_arch=(64, 64), n_actions=2)
    obs = rng.standard_normal((256, 5))
    actions = rng.integers(0, 2, 256)
    full = policy.evaluate(params, obs, actions)
    perm = rng.permutation(256)
    for idx in (perm, perm[:64], perm[100:228]):
        part = policy.evaluate(params, obs[idx], actions[idx])
        assert np.array_equal(part.log_probs, full.log_probs[idx])
        assert np.array_equal(part.values, full.values[idx])


def test_fallbacks_and_errors(rng):
    policy, params = make_policy(rng)
    obs = rng.standard_normal((4, 5))
    actions = rng.integers(0, 3, 4)
    # out-of-range actions and non-finite observations go to the checked path (its errors)
    with pytest.raises(ValueError, match="actions"):
        policy.evaluate(params, obs, np.array([0, 1, 2, 3]))
    bad = obs.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="obs"):
        policy.evaluate(params, bad, actions)
    ev = policy.evaluate(params, obs, actions)
    with pytest.raises(ValueError, match="d_values"):
        policy.backward(params, ev.cache, np.ones(4), None, np.array([1.0, np.inf, 0.0, 0.0]))
    with pytest.raises(ValueError, match="d_log_probs"):
        policy.backward(params, ev.cache, np.ones(3), None, np.ones(4))
    # replacing an entry turns the FlatArrays into an ordinary dict for the fast paths
    params2 = policy.as_flat(params)
    params2["pi.b0"] = params2["pi.b0"].copy()
    assert not is_flat(params2)
    assert not isinstance(policy.evaluate(params2, obs, actions).cache, _FusedPolicyCache)


def test_shared_trunk_uses_the_checked_path_with_a_flat_buffer(rng):
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float64)
    policy = MLPPolicy(obs_space, gym.spaces.Discrete(2), PPOConfig(shared_trunk=True))
    params = policy.init_params(rng)
    assert is_flat(params) and fused_layout(params) is None
    ev = policy.evaluate(params, rng.standard_normal((5, 3)), rng.integers(0, 2, 5))
    assert not isinstance(ev.cache, _FusedPolicyCache)
    grads = policy.backward(params, ev.cache, np.ones(5), None, np.ones(5))
    assert list(grads) == list(params)


def test_flat_arrays_layout(rng):
    arrays = {"a": rng.standard_normal((2, 3)), "b": rng.standard_normal(4), "c": np.zeros((1,))}
    layout = FlatLayout.in_order([(k, v.shape) for k, v in arrays.items()], ["b", "c", "a"])
    flat = flatten_arrays(arrays, layout)
    assert list(flat) == ["a", "b", "c"] and flat.flat.shape == (11,)
    assert np.array_equal(flat.flat[:4], arrays["b"]) and np.array_equal(flat.flat[5:], arrays["a"].ravel())
    for k in arrays:
        assert np.array_equal(flat[k], arrays[k]) and np.shares_memory(flat[k], flat.flat)
    other = flat.empty_like()
    assert same_layout(flat, other) and not same_layout(flat, flatten_arrays(arrays))
    assert isinstance(flat, dict) and type(dict(flat)) is dict
    with pytest.raises(ValueError, match="tile"):
        FlatLayout([("a", 0, (2,)), ("b", 1, (2,))], 3)
    with pytest.raises(ValueError, match="shape"):
        flatten_arrays({"a": np.zeros(3), "b": np.zeros(4), "c": np.zeros(1)}, layout)
    with pytest.raises(ValueError, match="contiguous"):
        FlatArrays.from_buffer(np.zeros(22)[::2], layout)


@pytest.mark.parametrize("continuous", [False, True])
def test_float32_compute_agrees_with_float64_and_keeps_float64_interfaces(rng, continuous):
    policy64, params = make_policy(rng, continuous=continuous)
    obs_space, act_space = (gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64),
                            gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64) if continuous
                            else gym.spaces.Discrete(3))
    policy32 = MLPPolicy(obs_space, act_space,
                         PPOConfig(net_arch=(16, 16), policy_head_gain=1.0, compute_dtype="float32"))
    obs = rng.standard_normal((64, 5))
    actions = (rng.standard_normal((64, 2)) if continuous else rng.integers(0, 3, 64))
    d_lp, d_h, d_v = rng.standard_normal(64), rng.standard_normal(64), rng.standard_normal(64)
    e64, e32 = policy64.evaluate(params, obs, actions), policy32.evaluate(params, obs, actions)
    for a, b in zip(e32[:3], e64[:3]):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    g64 = policy64.backward(params, e64.cache, d_lp, d_h, d_v)
    g32 = policy32.backward(params, e32.cache, d_lp, d_h, d_v)
    assert is_flat(g32) and g32.flat.dtype == np.float64 and g32.layout == params.layout
    scale = max(np.abs(g64[k]).max() for k in g64)
    for k in g64:
        np.testing.assert_allclose(g32[k], g64[k], rtol=0, atol=1e-4 * scale, err_msg=k)
    # per-row results do not depend on the other rows (ratio exactly 1 on the first minibatch)
    idx = rng.permutation(64)[:40]
    part = policy32.evaluate(params, obs[idx], actions[idx])
    assert np.array_equal(part.log_probs, e32.log_probs[idx])
    assert np.array_equal(part.values, e32.values[idx])


def test_flat_arrays_views_of_every_rank(rng):
    """0-d, 1-d and 2-d entries are views of the buffer with their own shapes."""
    arrays = {"s": np.array(2.5), "v": rng.standard_normal(3), "m": rng.standard_normal((2, 2))}
    flat = flatten_arrays(arrays, FlatLayout.in_order([(k, v.shape) for k, v in arrays.items()],
                                                      ["m", "s", "v"]))
    assert flat.flat.tolist() == arrays["m"].ravel().tolist() + [2.5] + arrays["v"].tolist()
    again = FlatArrays.from_buffer(flat.flat, flat.layout)
    assert list(again) == ["s", "v", "m"] and is_flat(again)
    for k, v in arrays.items():
        assert again[k].shape == v.shape and np.array_equal(again[k], v)
        assert np.shares_memory(again[k], flat.flat)
    again["v"][0] = 7.0
    assert flat["v"][0] == 7.0


@pytest.mark.parametrize("continuous", [False, True])
def test_float32_backward_results_independent_of_later_calls(rng, continuous):
    """The float32 gradients are computed in a reused per-thread buffer: each returned dict is
    its own float64 buffer, unchanged by later calls (other inputs, other thread) and equal
    to the same call repeated."""
    import threading
    obs_space = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64)
    act_space = (gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64) if continuous
                 else gym.spaces.Discrete(3))
    policy = MLPPolicy(obs_space, act_space,
                       PPOConfig(net_arch=(16, 16), policy_head_gain=1.0, compute_dtype="float32"))
    params = policy.as_flat(policy.init_params(rng))
    calls = []
    for _ in range(2):
        obs = rng.standard_normal((32, 5))
        actions = rng.standard_normal((32, 2)) if continuous else rng.integers(0, 3, 32)
        d = [rng.standard_normal(32) for _ in range(3)]
        calls.append((obs, actions, d))

    def grads_of(call):
        obs, actions, d = call
        return policy.backward(params, policy.evaluate(params, obs, actions).cache, *d)
    first = grads_of(calls[0])
    kept = first.flat.copy()
    second = grads_of(calls[1])
    other = {}
    worker = threading.Thread(target=lambda: other.setdefault("g", grads_of(calls[1])))
    worker.start()
    worker.join()
    assert not np.shares_memory(first.flat, second.flat) and is_flat(first) and is_flat(second)
    assert np.array_equal(first.flat, kept) and not np.array_equal(first.flat, second.flat)
    assert np.array_equal(grads_of(calls[0]).flat, kept)
    assert np.array_equal(other["g"].flat, second.flat)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("k_dim", [1, 3])
def test_head_backward_and_bias_kernels_against_numpy(rng, dtype, relu, k_dim):
    """The compiled pieces of the fused pass against their numpy formulas: ``_add_bias`` is
    ``a += b`` bit for bit; ``_backprop_head`` gives ``dw = dy.T @ h``, ``dw_b = sum dy``,
    ``dh = (dy @ w) * act'(h)`` and ``db = sum dh`` (row sums in order instead of BLAS's
    blocking: equal to a few ulps of the sums' magnitude), into a column block of a wider
    array as the fused backward uses it."""
    from ppo_ref.nn.actor_critic import _add_bias, _backprop_head
    a = rng.standard_normal((37, 11)).astype(dtype)
    b = rng.standard_normal(11).astype(dtype)
    want = a.copy()
    want += b
    _add_bias(a, b)
    assert np.array_equal(a, want)
    B, H = 53, 9
    dy = rng.standard_normal((B, k_dim)).astype(dtype)
    w = rng.standard_normal((k_dim, H)).astype(dtype)
    h = (np.maximum(rng.standard_normal((B, H)), 0.0) if relu
         else np.tanh(rng.standard_normal((B, H)))).astype(dtype)
    wide = np.zeros((B, 2 * H), dtype=dtype)
    dh = wide[:, H:]
    db, dw, dw_b = np.empty(H, dtype), np.empty((k_dim, H), dtype), np.empty(k_dim, dtype)
    _backprop_head(dy, w, h, relu, dh, db, dw, dw_b)
    x64 = [v.astype(np.float64) for v in (dy, w, h)]
    deriv = (x64[2] > 0.0) if relu else 1.0 - x64[2] ** 2
    dh_ref = (x64[0] @ x64[1]) * deriv
    tol = dict(rtol=0, atol=(1e-5 if dtype == np.float32 else 1e-12) * B)
    np.testing.assert_allclose(dw, x64[0].T @ x64[2], **tol)
    np.testing.assert_allclose(dw_b, x64[0].sum(axis=0), **tol)
    np.testing.assert_allclose(dh, dh_ref, **tol)
    np.testing.assert_allclose(db, dh_ref.sum(axis=0), **tol)
    assert not wide[:, :H].any()  # only the block was written
