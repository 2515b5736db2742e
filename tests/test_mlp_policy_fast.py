"""The compiled tier of the MLP policy (MLPPolicy on its parameter buffer,
ppo_ref.fast.actor_critic.flat_forward/flat_backward): agreement with the readable
actor_critic_forward/backward within the rtol its docstrings state, gradients against central
differences, acting methods against evaluate bit for bit, float32 compute, argument errors,
and the FlatArrays container it reads."""
import threading

import gymnasium as gym
import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.fast.flat import FlatArrays, FlatLayout, flatten_arrays, is_flat, same_layout
from ppo_ref.nn.actor_critic import actor_critic_backward, actor_critic_forward
from ppo_ref.policies import MLPPolicy

FORWARD_RTOL = 1e-12   # stated in MLPPolicy / flat_forward
BACKWARD_RTOL = 1e-10  # stated in MLPPolicy / flat_backward (of each array's largest entry)


def make_policy(rng, *, activation="tanh", net_arch=(16, 16), continuous=False, n_actions=3,
                shared_trunk=False, compute_dtype="float64"):
    obs_space = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64)
    act_space = (gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64) if continuous
                 else gym.spaces.Discrete(n_actions))
    config = PPOConfig(activation=activation, net_arch=net_arch, policy_head_gain=1.0,
                       shared_trunk=shared_trunk, compute_dtype=compute_dtype)
    policy = MLPPolicy(obs_space, act_space, config)
    params = policy.init_params(rng)
    for v in params.values():  # non-zero biases and log_std: every term of the gradient matters
        v[...] += 0.3 * rng.standard_normal(v.shape)
    return policy, params


def _batch(rng, rows, continuous, n_actions=3):
    obs = rng.standard_normal((rows, 5))
    actions = (rng.standard_normal((rows, 2)) if continuous else rng.integers(0, n_actions, rows))
    return obs, actions


ARCHS = [(16, 16), (8,), (8, 6, 4), ()]


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("net_arch", ARCHS)
def test_fast_policy_equals_the_readable_network_within_the_stated_rtol(
        rng, shared_trunk, continuous, activation, net_arch):
    policy, params = make_policy(rng, activation=activation, net_arch=net_arch,
                                 continuous=continuous, shared_trunk=shared_trunk)
    obs, actions = _batch(rng, 64, continuous)
    ev = policy.evaluate(params, obs, actions)
    net = {k: v for k, v in params.items() if k != "log_std"}
    out, values, cache = actor_critic_forward(net, obs, activation, shared_trunk)
    np.testing.assert_allclose(ev.values, values, rtol=FORWARD_RTOL, atol=0)
    np.testing.assert_allclose(ev.log_probs, policy.head.log_prob(out, params, actions),
                               rtol=FORWARD_RTOL, atol=0)
    np.testing.assert_allclose(ev.entropy, policy.head.entropy(out, params),
                               rtol=FORWARD_RTOL, atol=0)
    d_lp, d_h, d_v = (rng.standard_normal(64) for _ in range(3))
    grads = policy.backward(params, ev.cache, d_lp, d_h, d_v)
    d_out, head_grads = policy.head.backward(out, params, actions, d_lp, d_h)
    want = actor_critic_backward(net, cache, d_out, d_v)
    want.update(head_grads)
    assert is_flat(grads) and grads.layout == params.layout and list(grads) == list(params)
    for k in params:
        scale = np.abs(want[k]).max()
        np.testing.assert_allclose(grads[k], want[k], rtol=0, atol=BACKWARD_RTOL * scale,
                                   err_msg=k)


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_fast_policy_gradient_matches_central_differences(rng, shared_trunk, continuous,
                                                          activation):
    policy, params = make_policy(rng, activation=activation, net_arch=(8, 6),
                                 continuous=continuous, shared_trunk=shared_trunk)
    obs, actions = _batch(rng, 11, continuous)
    w_lp, w_h, returns = rng.standard_normal(11), rng.standard_normal(11), rng.standard_normal(11)

    def loss_and_grads():
        ev = policy.evaluate(params, obs, actions)
        loss = (np.sum(w_lp * ev.log_probs) + np.sum(w_h * ev.entropy)
                + np.sum((ev.values - returns) ** 2))
        return loss, policy.backward(params, ev.cache, w_lp, w_h, 2.0 * (ev.values - returns))

    _, grads = loss_and_grads()
    check_gradients(lambda: loss_and_grads()[0], dict(params), dict(grads), rng=rng)


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
def test_acting_methods_give_the_bits_of_evaluate(rng, shared_trunk, continuous, compute_dtype):
    policy, params = make_policy(rng, continuous=continuous, shared_trunk=shared_trunk,
                                 compute_dtype=compute_dtype)
    obs, _ = _batch(rng, 9, continuous)
    actions, values, log_probs = policy.act(params, obs, np.random.default_rng(3))
    ev = policy.evaluate(params, obs, actions)
    assert np.array_equal(log_probs, ev.log_probs) and np.array_equal(values, ev.values)
    assert values.dtype == log_probs.dtype == np.float64
    assert np.array_equal(policy.values(params, obs), ev.values)
    out = policy.policy_out_fn(params)(obs)
    assert np.array_equal(out, ev.cache.out)
    # a rollout's rows: the acting outputs of its steps (here three calls) stacked
    forward = policy.policy_out_fn(params)
    steps = np.concatenate([forward(obs[:4]), forward(obs[4:5]), forward(obs[5:])])
    lp, v = policy.rollout_log_probs_values(params, obs, actions, steps)
    assert lp.dtype == v.dtype == np.float64
    assert np.array_equal(lp, ev.log_probs) and np.array_equal(v, ev.values)
    again = policy.head.sample(np.random.default_rng(3), out, params)
    assert np.array_equal(again, actions)
    greedy = policy.predict(params, obs, deterministic=True)
    if continuous:
        assert np.array_equal(greedy, np.clip(out, -1.0, 1.0))
    else:
        assert np.array_equal(greedy, np.argmax(out, axis=1))


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("net_arch", [(), (7,), (16, 9)])
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_acting_forward_gives_the_policy_output_of_flat_forward(rng, shared_trunk, activation,
                                                                net_arch, rows):
    from ppo_ref.fast.actor_critic import acting_forward, acting_weights, flat_forward
    policy, params = make_policy(rng, activation=activation, net_arch=net_arch,
                                 shared_trunk=shared_trunk)
    net = policy._check_params(params)
    x = np.ascontiguousarray(rng.standard_normal((rows, 5)))
    want = flat_forward(net, params.flat, x, activation == "relu", value=False)[0]
    flat_t, trunk, pi = acting_weights(net, params.flat)
    got = acting_forward(x, flat_t, trunk, pi, activation == "relu")
    assert got.shape == want.shape and np.array_equal(got, want)
    assert not np.shares_memory(flat_t, params.flat)


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
@pytest.mark.parametrize("net_arch", [(), (7, 5)])
def test_flat_forward_and_backward_give_the_bits_of_the_policy_passes(rng, shared_trunk,
                                                                       compute_dtype, net_arch):
    """flat_forward / flat_backward (fresh buffers, the documented twins) and MLPPolicy's
    passes (the compiled drivers on its own buffers) compute the same bits."""
    from ppo_ref.fast.actor_critic import flat_backward, flat_forward
    if shared_trunk and not net_arch:
        net_arch = (4,)
    policy, params = make_policy(rng, continuous=True, shared_trunk=shared_trunk,
                                 compute_dtype=compute_dtype, net_arch=net_arch)
    obs, actions = _batch(rng, 13, True)
    ev = policy.evaluate(params, obs, actions)
    dt = np.dtype(compute_dtype)
    net = policy._check_params(params)
    flat = params.flat.astype(dt)
    x = obs.astype(dt)
    out, values, cache = flat_forward(net, flat, x, False)
    assert out.dtype == values.dtype == dt
    assert np.array_equal(out, ev.cache.out) and np.array_equal(values, ev.values)
    d_lp, d_h, d_v = (rng.standard_normal(13) for _ in range(3))
    grads = policy.backward(params, ev.cache, d_lp, d_h, d_v)
    d_out, _ = policy.head.backward(out.astype(np.float64), params, actions, d_lp, d_h)
    g = np.full(flat.size, np.nan, dt)
    flat_backward(net, flat, cache, np.ascontiguousarray(d_out, dtype=dt), d_v.astype(dt),
                  False, g)
    network = [k for k in params if k != "log_std"]
    for k in network:
        got = g[params.layout.offset(k):][:params[k].size].reshape(params[k].shape)
        assert np.array_equal(got, grads[k]), k
    assert np.isnan(g[params.layout.offset("log_std")])  # the head's entries: untouched


def test_rollout_log_probs_values_checks_its_arguments(rng):
    policy, params = make_policy(rng)
    obs, actions = _batch(rng, 6, False)
    out = policy.policy_out_fn(params)(obs)
    with pytest.raises(ValueError, match="policy_out must be a float array of shape"):
        policy.rollout_log_probs_values(params, obs, actions, out[:5])
    with pytest.raises(ValueError, match="policy_out must be a float array of shape"):
        policy.rollout_log_probs_values(params, obs, actions, out[:, :2])
    with pytest.raises(ValueError, match="actions must be in"):
        policy.rollout_log_probs_values(params, obs, actions + 3, out)
    with pytest.raises(ValueError, match="obs must be finite"):
        policy.rollout_log_probs_values(params, np.full_like(obs, np.nan), actions, out)
    bad = out.copy()
    bad[2, 0] = np.inf
    with pytest.raises(ValueError, match="logits"):
        policy.rollout_log_probs_values(params, obs, actions, bad)


def test_policy_out_fn_keeps_the_parameters_it_was_given(rng):
    policy, params = make_policy(rng)
    obs, _ = _batch(rng, 4, False)
    forward = policy.policy_out_fn(params)
    before = forward(obs).copy()
    params.flat[:] *= 2.0
    assert np.array_equal(forward(obs), before)


@pytest.mark.parametrize("continuous", [False, True])
def test_float32_compute_agrees_with_float64_and_keeps_float64_interfaces(rng, continuous):
    policy64, params = make_policy(rng, continuous=continuous)
    policy32 = MLPPolicy(gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64),
                         gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64) if continuous
                         else gym.spaces.Discrete(3),
                         PPOConfig(net_arch=(16, 16), policy_head_gain=1.0,
                                   compute_dtype="float32"))
    obs, actions = _batch(rng, 64, continuous)
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


@pytest.mark.parametrize("continuous", [False, True])
def test_float32_backward_results_independent_of_later_calls(rng, continuous):
    """The float32 gradients are computed in a reused per-thread buffer: each returned dict is
    its own float64 buffer, unchanged by later calls (other inputs, other thread) and equal
    to the same call repeated."""
    policy, params = make_policy(rng, continuous=continuous, compute_dtype="float32")
    calls = []
    for _ in range(2):
        obs, actions = _batch(rng, 32, continuous)
        calls.append((obs, actions, [rng.standard_normal(32) for _ in range(3)]))

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


def test_errors_name_the_argument(rng):
    policy, params = make_policy(rng)
    obs, actions = _batch(rng, 4, False)
    with pytest.raises(ValueError, match="params must be a FlatArrays"):
        policy.evaluate(dict(params), obs, actions)
    replaced = policy.as_flat(params)
    replaced["pi.b0"] = replaced["pi.b0"].copy()
    with pytest.raises(ValueError, match="no longer all views"):
        policy.evaluate(replaced, obs, actions)
    with pytest.raises(ValueError, match="params must be float64"):
        policy.evaluate(flatten_arrays(params, params.layout, dtype=np.float32), obs, actions)
    broken = policy.as_flat(params)
    broken["vf.w1"][0, 0] = np.inf
    with pytest.raises(ValueError, match=r"params\['vf.w1'\] must be finite"):
        policy.values(broken, obs)
    other = MLPPolicy(gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(3),
                      policy.config).init_params(rng)
    with pytest.raises(ValueError, match="observations of size 4"):
        policy.evaluate(other, obs, actions)
    with pytest.raises(ValueError, match="obs must have shape"):
        policy.evaluate(params, obs[:, :4], actions)
    with pytest.raises(ValueError, match="at least one row"):
        policy.evaluate(params, obs[:0], actions[:0])
    bad = obs.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="obs must be finite; row 2"):
        policy.evaluate(params, bad, actions)
    with pytest.raises(ValueError, match="obs must be finite"):
        policy.policy_out_fn(params)(bad)
    with pytest.raises(ValueError, match=r"actions must be in \[0, 3\)"):
        policy.evaluate(params, obs, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="actions must be integers"):
        policy.evaluate(params, obs, np.zeros(4))
    with pytest.raises(ValueError, match="actions must have shape"):
        policy.evaluate(params, obs, actions[:3])
    with pytest.raises(ValueError, match="rng is required"):
        policy.predict(params, obs)
    ev = policy.evaluate(params, obs, actions)
    with pytest.raises(ValueError, match="d_values"):
        policy.backward(params, ev.cache, np.ones(4), None, np.array([1.0, np.inf, 0.0, 0.0]))
    with pytest.raises(ValueError, match="d_log_probs"):
        policy.backward(params, ev.cache, np.ones(3), None, np.ones(4))
    with pytest.raises(ValueError, match="d_entropy"):
        policy.backward(params, ev.cache, np.ones(4), np.ones(5), np.ones(4))
    with pytest.raises(ValueError, match="cache must be the cache of MLPPolicy.evaluate"):
        policy.backward(params, (None,), np.ones(4), None, np.ones(4))
    reordered = flatten_arrays(params, FlatLayout.in_order(
        [(k, v.shape) for k, v in params.items()], list(params)[::-1]))
    with pytest.raises(ValueError, match="layout of the params given to evaluate"):
        policy.backward(reordered, ev.cache, np.ones(4), None, np.ones(4))


def test_gaussian_errors_and_any_buffer_layout(rng):
    policy, params = make_policy(rng, continuous=True)
    obs, actions = _batch(rng, 4, True)
    bad = actions.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="actions must be finite"):
        policy.evaluate(params, obs, bad)
    # the same arrays stored in another order give the same results
    reordered = flatten_arrays(params, FlatLayout.in_order(
        [(k, v.shape) for k, v in params.items()], list(params)[::-1]))
    a, b = policy.evaluate(params, obs, actions), policy.evaluate(reordered, obs, actions)
    for x, y in zip(a[:3], b[:3]):
        assert np.array_equal(x, y)
    g = policy.backward(reordered, b.cache, np.ones(4), np.ones(4), np.ones(4))
    g0 = policy.backward(params, a.cache, np.ones(4), np.ones(4), np.ones(4))
    assert g.layout == reordered.layout
    for k in params:
        assert np.array_equal(g[k], g0[k]), k


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


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
def test_update_passes_give_the_bits_of_evaluate_and_backward(rng, shared_trunk, continuous,
                                                              compute_dtype):
    """The fast update's passes (rows checked once, then evaluate/backward on gathered rows)
    give exactly what the public evaluate and backward give for those rows; backward's one
    gradient FlatArrays per update is overwritten at every call with the new gradients."""
    policy, params = make_policy(rng, continuous=continuous, shared_trunk=shared_trunk,
                                 compute_dtype=compute_dtype)
    obs, actions = _batch(rng, 40, continuous)
    x, a, evaluate, backward = policy._update_passes(obs, actions)
    returned = []
    for rows in (rng.permutation(40)[:16], rng.permutation(40)[:24]):
        log_probs, entropy, values, cache = evaluate(params, (x[rows], a[rows]))
        want = policy.evaluate(params, obs[rows], actions[rows])
        for got, ref in ((log_probs, want.log_probs), (entropy, want.entropy),
                         (values, want.values)):
            assert got.dtype == np.float64 and np.array_equal(got, ref)
        d = [rng.standard_normal(rows.size) for _ in range(3)]
        grads = backward(params, cache, *d)
        ref = policy.backward(params, want.cache, *d)
        assert same_layout(grads, ref) and np.array_equal(grads.flat, ref.flat)
        returned.append(grads)
    assert returned[0] is returned[1]


def test_update_passes_check_rows_once_and_params_when_they_change(rng):
    """The rows are checked as evaluate checks them (same errors); the parameters are checked
    in full at the first call and whenever another object is given."""
    policy, params = make_policy(rng)
    obs, actions = _batch(rng, 8, False)
    bad_obs = obs.copy()
    bad_obs[3, 1] = np.nan
    for args in ((bad_obs, actions), (obs, actions + 3), (obs[:, :4], actions)):
        with pytest.raises(ValueError) as from_passes:
            policy._update_passes(*args)
        with pytest.raises(ValueError) as from_evaluate:
            policy.evaluate(params, *args)
        assert str(from_passes.value) == str(from_evaluate.value)
    x, a, evaluate, _ = policy._update_passes(obs, actions)
    evaluate(params, (x, a))
    other = FlatArrays.from_buffer(params.flat.copy(), params.layout)
    other.flat[0] = np.inf
    with pytest.raises(ValueError, match="must be finite"):
        evaluate(other, (x, a))
    with pytest.raises(ValueError, match="FlatArrays"):
        evaluate(dict(params), (x, a))


def _unfused_mlp_backward(x, acts, flat, table, relu, dy, grads, dx):
    """mlp_backward_flat's documented operations one pass each, layer by layer: the weight
    gradient by _add_products (gw.T for a layer of < 16 inputs and >= 16 outputs), the bias
    gradient by _column_sums, the input gradient by _add_products into zeros, then the
    activation derivative by _activation_grad."""
    from ppo_ref.fast.lstm import _add_products, _column_sums, _transpose_into
    from ppo_ref.fast.mlp import _activation_grad
    rows = x.shape[0]
    ends = np.cumsum([rows * int(table[i, 2]) for i in range(table.shape[0])])
    d = dy
    for i in range(table.shape[0] - 1, -1, -1):
        w_off, b_off, n_out, n_in = (int(v) for v in table[i])
        h = x if i == 0 else acts[ends[i - 1] - rows * n_in:ends[i - 1]].reshape(rows, n_in)
        w = flat[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        gw = grads[w_off:w_off + n_out * n_in].reshape(n_out, n_in)
        if n_in < 16 and n_out >= 16:
            gw_t = np.zeros((n_in, n_out), dy.dtype)
            _add_products(gw_t, np.ascontiguousarray(h.T), d)
            _transpose_into(gw_t, gw)
        else:
            gw[:, :] = 0.0
            _add_products(gw, np.ascontiguousarray(d.T), h)
        _column_sums(d, grads[b_off:b_off + n_out])
        if i == 0:
            if dx is not None:
                _add_products(dx, d, w)
        else:
            d_prev = np.zeros((rows, n_in), dy.dtype)
            _add_products(d_prev, d, w)
            _activation_grad(d_prev, h, relu)
            d = d_prev


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("net_arch,n_actions", [((16, 16), 2), ((8, 6), 3), ((8, 3, 5), 5),
                                                ((), 2), ((40,), 1)])
def test_flat_backward_into_gives_the_bits_of_the_unfused_tower_backward(
        rng, shared_trunk, activation, dtype, net_arch, n_actions):
    """flat_backward_into (the towers by mlp_backward_flat, whose passes are fused) writes the
    bits of the towers' backward one pass at a time (_unfused_mlp_backward): narrow layers
    (1 to 5 outputs, above another layer or alone), a hidden layer of 3 units, relu and tanh,
    float64 and float32, separate towers and a shared trunk."""
    from ppo_ref.fast.actor_critic import flat_backward_into, flat_forward, tower_tables
    if shared_trunk and not net_arch:
        net_arch = (6,)
    if n_actions == 1:  # one logit: a Box of one dimension (Gaussian mean)
        obs_space = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64)
        config = PPOConfig(activation=activation, net_arch=net_arch, policy_head_gain=1.0,
                           shared_trunk=shared_trunk, compute_dtype=dtype)
        policy = MLPPolicy(obs_space, gym.spaces.Box(-1.0, 1.0, (1,)), config)
        params = policy.init_params(rng)
    else:
        policy, params = make_policy(rng, activation=activation, net_arch=net_arch,
                                     n_actions=n_actions, shared_trunk=shared_trunk,
                                     compute_dtype=dtype)
    for v in params.values():
        v[...] += 0.3 * rng.standard_normal(v.shape)
    dt = np.dtype(dtype)
    net = policy._check_params(params)
    flat = params.flat.astype(dt)
    relu = activation == "relu"
    for rows in (1, 7, 30):
        x = rng.standard_normal((rows, 5)).astype(dt)
        out, _, cache = flat_forward(net, flat, x, relu)
        d_out = rng.standard_normal(out.shape).astype(dt)
        d_v = rng.standard_normal(rows).astype(dt)
        got = np.full(flat.size, np.nan, dt)
        trunk, pi, vf = tower_tables(net)
        trunk_acts = cache.trunk_acts if cache.trunk_acts is not None else flat[:0]
        flat_backward_into(x, flat, trunk, pi, vf, relu, trunk_acts, cache.pi_acts,
                           cache.vf_acts, d_out, d_v, got)
        want = np.full(flat.size, np.nan, dt)
        dv = d_v.reshape(rows, 1)
        if net.trunk is None:
            _unfused_mlp_backward(x, cache.pi_acts, flat, pi, relu, d_out, want, None)
            _unfused_mlp_backward(x, cache.vf_acts, flat, vf, relu, dv, want, None)
        else:
            z = cache.z
            dz = np.zeros(z.shape, dt)
            _unfused_mlp_backward(z, cache.pi_acts, flat, pi, relu, d_out, want, dz)
            _unfused_mlp_backward(z, cache.vf_acts, flat, vf, relu, dv, want, dz)
            if relu:
                dz = np.where(z > 0, dz, 0).astype(dt)
            else:
                dz *= dt.type(1.0) - z * z
            _unfused_mlp_backward(x, cache.trunk_acts, flat, trunk, relu, dz, want, None)
        assert np.array_equal(got, want, equal_nan=True), rows
        for k in params:  # every network gradient written, the head's entries untouched
            entries = got[params.layout.offset(k):][:params[k].size]
            assert np.isnan(entries).all() if k == "log_std" else not np.isnan(entries).any()
