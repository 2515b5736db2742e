"""The fast path of RecurrentPolicy (one-buffer parameters: both LSTMs in one compiled call,
row-wise towers, compiled categorical head, parameters checked once per layout) against the
checked path (plain dict parameters), and its float32 variant (``compute_dtype="float32"``).

Tolerances: the LSTM arithmetic of both paths is the same (bit for bit, tested below), but the
fast towers compute their products (forward ``b + x @ w.T``, backward ``d.T @ h`` and
``d @ w``) as fused multiply-add chains in a documented order (ppo_ref/nn/mlp.py, tested bit for
bit in tests/test_mlp.py) where the checked path calls BLAS, hidden tanh is the project's own
(within 3 ulp of NumPy's), and the fast categorical head uses the compiled
``exp``/``log`` where the checked one uses NumPy's: each output differs by a few rounding
errors, ~1e-16 relative, amplified at most by the network's condition (small here).
float32 against float64: float32 rounding (~6e-8 relative) through 8 to 32 recurrent steps.
"""
import numpy as np
import pytest
from gradcheck import check_gradients
from gymnasium import spaces

from ppo_ref.config import PPOConfig
from ppo_ref.flat import FlatArrays, is_flat
from ppo_ref.nn.lstm import _linear_rows, lstm_forward
from ppo_ref.recurrent_policies import (LSTMStates, RecurrentPolicy, _FastCache,
                                        recurrent_actor_critic_step)

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float64)
DISCRETE = spaces.Discrete(3)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float64)


def make_policy(action_space=DISCRETE, **kw):
    config = dict(lstm_hidden_size=16, net_arch=(8,), policy_head_gain=1.0, ent_coef=0.01)
    config.update(kw)
    return RecurrentPolicy(OBS, action_space, PPOConfig(**config))


def make_data(rng, policy, T=6, n=5):
    obs = rng.normal(size=(T, n, 3))
    if policy.head.kind == "categorical":
        actions = rng.integers(0, 3, size=(T, n))
    else:
        actions = rng.normal(size=(T, n, 2))
    starts = rng.random((T, n)) < 0.25
    L = 1 if policy.lstm_shared else 2
    state = LSTMStates(rng.normal(scale=0.5, size=(L, n, 16)),
                       rng.normal(scale=0.5, size=(L, n, 16)))
    return obs, actions, state, starts


def perturbed_params(rng, policy):
    params = policy.init_params(rng)
    params.flat += 0.3 * rng.normal(size=params.flat.shape)   # non-trivial biases, bigger logits
    return params


CASES = [(DISCRETE, False, "tanh"), (DISCRETE, True, "relu"), (BOX, False, "relu"),
         (BOX, True, "tanh")]


@pytest.mark.parametrize("space,shared,act", CASES)
def test_fast_evaluate_and_backward_match_the_checked_path(rng, space, shared, act):
    policy = make_policy(space, lstm_shared=shared, activation=act)
    params = perturbed_params(rng, policy)
    assert is_flat(params)
    data = make_data(rng, policy)
    fast = policy.evaluate(params, *data)
    checked = policy.evaluate(dict(params), *data)        # a plain dict: the checked path
    assert isinstance(fast.cache, _FastCache) and not isinstance(checked.cache, _FastCache)
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(fast, name), getattr(checked, name),
                                   rtol=1e-12, atol=1e-13, err_msg=name)
    # the LSTM part is the same arithmetic: the hidden states are equal bit for bit
    names = ["lstm"] if shared else ["lstm_pi", "lstm_vf"]
    T, n = data[3].shape
    for l, name in enumerate(names):
        sub = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(name + ".")}
        h_seq, (h_T, c_T), _ = lstm_forward(sub, data[0], data[2].h[l], data[2].c[l], data[3])
        np.testing.assert_array_equal(fast.cache.h_seq[l], h_seq)      # the towers' input
        np.testing.assert_array_equal(fast.cache.c_prev[l, T], c_T)
    w = [rng.normal(size=(T, n)) for _ in range(3)]
    g_fast = policy.backward(params, fast.cache, *w)
    g_checked = policy.backward(dict(params), checked.cache, *w)
    assert is_flat(g_fast) and g_fast.layout == params.layout and list(g_fast) == list(params)
    for k in params:
        scale = max(1.0, float(np.max(np.abs(g_checked[k]))))
        np.testing.assert_allclose(g_fast[k], g_checked[k], rtol=0, atol=1e-11 * scale,
                                   err_msg=k)


@pytest.mark.parametrize("net_arch,shared,act", [((), False, "relu"), ((8, 5), True, "tanh"),
                                                  ((8, 5), False, "relu")])
def test_fast_towers_of_any_depth_match_the_checked_path(rng, net_arch, shared, act):
    """Towers of 1 and 3 layers (linear heads on the LSTM; two hidden layers) on the compiled
    tower kernels: outputs and every gradient as the checked path (tolerances of the test
    above), including the shared LSTM's summed dL/dh from both towers."""
    policy = make_policy(BOX, lstm_shared=shared, activation=act, net_arch=net_arch)
    params = perturbed_params(rng, policy)
    data = make_data(rng, policy)
    fast = policy.evaluate(params, *data)
    checked = policy.evaluate(dict(params), *data)
    assert isinstance(fast.cache, _FastCache)
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(fast, name), getattr(checked, name),
                                   rtol=1e-12, atol=1e-13, err_msg=name)
    w = [rng.normal(size=data[3].shape) for _ in range(3)]
    g_fast = policy.backward(params, fast.cache, *w)
    g_checked = policy.backward(dict(params), checked.cache, *w)
    for k in params:
        scale = max(1.0, float(np.max(np.abs(g_checked[k]))))
        np.testing.assert_allclose(g_fast[k], g_checked[k], rtol=0, atol=1e-11 * scale,
                                   err_msg=k)


@pytest.mark.parametrize("space,shared,act", CASES[:3])
def test_fast_path_gradients_match_central_differences(rng, space, shared, act):
    policy = make_policy(space, lstm_shared=shared, activation=act)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=5, n=3)
    T, n = starts.shape
    w = [rng.normal(size=(T, n)) for _ in range(3)]

    def f():
        ev = policy.evaluate(params, obs, actions, state, starts)
        assert isinstance(ev.cache, _FastCache)
        return float(np.sum(w[0] * ev.log_probs) + np.sum(w[1] * ev.entropy)
                     + np.sum(w[2] * ev.values))

    ev = policy.evaluate(params, obs, actions, state, starts)
    grads = policy.backward(params, ev.cache, *w)
    check_gradients(f, params, grads, floor=1e-4, max_coords=25, rng=rng)


def test_fast_path_hands_unusual_inputs_to_the_checked_path(rng):
    policy = make_policy()
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy)
    ref = policy.evaluate(params, obs, actions, state, starts)
    # float 0/1 flags, int32 actions, a non-contiguous state: the checked path, same numbers
    other = policy.evaluate(params, obs, actions.astype(np.int32),
                            LSTMStates(np.asfortranarray(state.h), state.c),
                            starts.astype(np.float64))
    assert not isinstance(other.cache, _FastCache)
    np.testing.assert_allclose(other.log_probs, ref.log_probs, rtol=1e-12, atol=1e-13)
    bad = obs.copy()
    bad[2, 1, 0] = np.nan
    with pytest.raises(ValueError, match="x"):
        policy.evaluate(params, bad, actions, state, starts)
    out_of_range = actions.copy()
    out_of_range[0, 0] = 3
    with pytest.raises(ValueError, match="actions"):
        policy.evaluate(params, obs, out_of_range, state, starts)
    broken = policy.as_flat(params)
    broken["lstm_vf.w_hh"][0, 0] = np.inf
    with pytest.raises(ValueError, match="w_hh"):
        policy.evaluate(broken, obs, actions, state, starts)
    with pytest.raises(ValueError, match="d_values"):
        policy.backward(params, ref.cache, ref.log_probs, None, np.zeros(3))
    with pytest.raises(ValueError, match="d_log_probs"):
        policy.backward(params, ref.cache, np.full_like(ref.log_probs, np.nan), None,
                        ref.values)


@pytest.mark.parametrize("shared,act", [(False, "relu"), (True, "tanh")])
def test_acting_steps_are_the_replay_bit_for_bit(rng, shared, act):
    """Stepping with acting_step_fn gives the LSTM states of policy_out_step bit for bit, and
    policy outputs equal bit for bit to the fast replay of the whole sequence (the towers are
    row-wise, so the number of rows does not matter), for any subset of envs."""
    policy = make_policy(lstm_shared=shared, activation=act)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=7, n=6)
    step = policy.acting_step_fn(params)
    replay = policy.evaluate(params, obs, actions, state, starts)
    T, n = starts.shape
    s = s_checked = state
    for t in range(T):
        out, s = step(obs[t], s, starts[t])
        out_c, _, s_checked = recurrent_actor_critic_step(
            policy._net(dict(params)), obs[t], s_checked, starts[t], policy.activation, shared)
        np.testing.assert_allclose(s.h, s_checked.h, rtol=1e-12, atol=1e-13)  # fast vs spec tier
        np.testing.assert_allclose(s.c, s_checked.c, rtol=1e-12, atol=1e-13)  # fast vs spec tier
        np.testing.assert_array_equal(out, replay.cache.policy_out.reshape(T, n, -1)[t])
        np.testing.assert_allclose(out, out_c, rtol=1e-12, atol=1e-13)
    for envs in (np.array([4, 1]), np.array([3])):
        sub = policy.evaluate(params, obs[:, envs], actions[:, envs], state.select(envs),
                              starts[:, envs])
        np.testing.assert_array_equal(sub.log_probs, replay.log_probs[:, envs])
        np.testing.assert_array_equal(sub.values, replay.values[:, envs])
    # unusual step inputs fall back to policy_out_step
    plain_step = policy.acting_step_fn(dict(params))      # plain dict: policy_out_step itself
    out_p, s_p = plain_step(obs[0], state, starts[0])
    out_c, s_c = policy.policy_out_step(dict(params), obs[0], state, starts[0])
    np.testing.assert_array_equal(out_p, out_c)
    np.testing.assert_array_equal(s_p.c, s_c.c)
    obs32 = obs[0].astype(np.float32)
    out, s2 = step(obs32, state, starts[0])
    out_c, s2_c = policy.policy_out_step(params, obs32, state, starts[0])
    np.testing.assert_array_equal(out, out_c)
    np.testing.assert_array_equal(s2.h, s2_c.h)


@pytest.mark.parametrize("shared,dtype", [(False, "float64"), (True, "float64"),
                                          (False, "float32")])
def test_values_and_act_are_the_fast_replay_bit_for_bit(rng, shared, dtype):
    """values() and act() on the fast path: the critic's (every LSTM's) step by the stacked
    kernel and the towers on the parameter buffer, so values equal the fast replay's values of
    a one-step sequence bit for bit (and act's values equal values()); the states equal
    lstm_step's (policy_out_step) bit for bit; float64 results within the tower tolerance of
    the checked path. Unusual step arguments take the checked path (same numbers to rounding)."""
    policy = make_policy(lstm_shared=shared, activation="relu", compute_dtype=dtype)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=1, n=5)
    replay = policy.evaluate(params, obs, actions, state, starts)
    assert isinstance(replay.cache, _FastCache)
    v = policy.values(params, obs[0], state, starts[0])
    assert v.dtype == np.float64 and v.shape == (5,)
    np.testing.assert_array_equal(v, replay.values[0])
    a, v_act, lp, s_act = policy.act(params, obs[0], state, starts[0], np.random.default_rng(0))
    np.testing.assert_array_equal(v_act, v)
    _, s_out = policy.policy_out_step(params, obs[0], state, starts[0])
    if dtype == "float64":
        np.testing.assert_allclose(s_act.h, s_out.h, rtol=1e-12, atol=1e-13)  # fast vs spec tier
        np.testing.assert_allclose(s_act.c, s_out.c, rtol=1e-12, atol=1e-13)  # fast vs spec tier
        checked = policy.values(dict(params), obs[0], state, starts[0])     # checked path
        np.testing.assert_allclose(v, checked, rtol=1e-12, atol=1e-13)
        a_c, v_c, lp_c, _ = policy.act(dict(params), obs[0], state, starts[0],
                                       np.random.default_rng(0))
        np.testing.assert_array_equal(a, a_c)
        np.testing.assert_allclose(lp, lp_c, rtol=1e-12, atol=1e-13)
    else:
        np.testing.assert_allclose(s_act.h, s_out.h, rtol=0, atol=1e-5)
    # a list of flags: the checked path
    listed = policy.values(params, obs[0], state, list(starts[0]))
    np.testing.assert_allclose(listed, v, rtol=1e-12 if dtype == "float64" else 1e-4,
                               atol=1e-13 if dtype == "float64" else 1e-5)


def test_linear_rows_is_row_independent_and_a_dense_layer(rng):
    x = rng.normal(size=(11, 13))
    w = rng.normal(size=(9, 13))
    b = rng.normal(size=9)
    out = np.empty((11, 9))
    _linear_rows(x, np.ascontiguousarray(w.T), b, out)
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-13, atol=1e-13)
    for rows in ([3], [10, 0, 4], list(range(5))):
        sub = np.empty((len(rows), 9))
        _linear_rows(x[rows], np.ascontiguousarray(w.T), b, sub)
        np.testing.assert_array_equal(sub, out[rows])


def test_layout_stacks_the_lstms_and_keeps_keys(rng):
    policy = make_policy()
    params = policy.init_params(rng)
    layout = params.layout
    o = {k: layout.offset(k) for k in params}
    assert o["lstm_vf.w_ih"] == o["lstm_pi.w_ih"] + params["lstm_pi.w_ih"].size
    assert o["lstm_vf.w_hh"] == o["lstm_pi.w_hh"] + params["lstm_pi.w_hh"].size
    plain = dict(params)
    assert list(policy.as_flat(plain)) == list(plain)
    for k in plain:
        np.testing.assert_array_equal(policy.as_flat(plain)[k], plain[k])


# ---------------------------------------------------------------------------- float32 compute

def test_float32_gaussian_head_is_close_to_float64(rng):
    p64 = make_policy(BOX, lstm_shared=True)
    p32 = make_policy(BOX, lstm_shared=True, compute_dtype="float32")
    params = perturbed_params(rng, p64)
    data = make_data(rng, p64, T=8, n=4)
    e64, e32 = p64.evaluate(params, *data), p32.evaluate(params, *data)
    assert isinstance(e32.cache, _FastCache) and e32.cache.x.dtype == np.float32
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(e32, name), getattr(e64, name), rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    w = [rng.normal(size=data[3].shape) for _ in range(3)]
    g64, g32 = p64.backward(params, e64.cache, *w), p32.backward(params, e32.cache, *w)
    for k in params:
        scale = max(1.0, float(np.max(np.abs(g64[k]))))
        np.testing.assert_allclose(g32[k], g64[k], rtol=0, atol=2e-4 * scale, err_msg=k)


def test_float32_compute_is_close_to_float64(rng):
    p64 = make_policy(activation="relu")
    p32 = make_policy(activation="relu", compute_dtype="float32")
    params = perturbed_params(rng, p64)
    data = make_data(rng, p64, T=8, n=4)
    e64 = p64.evaluate(params, *data)
    e32 = p32.evaluate(params, *data)
    assert e32.cache.x.dtype == np.float32 and e32.log_probs.dtype == np.float64
    assert not np.array_equal(e32.log_probs, e64.log_probs)      # really computed in float32
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(e32, name), getattr(e64, name), rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    w = [rng.normal(size=data[3].shape) for _ in range(3)]
    g64 = p64.backward(params, e64.cache, *w)
    g32 = p32.backward(params, e32.cache, *w)
    assert g32.flat.dtype == np.float64 and g32.layout == params.layout
    for k in params:
        scale = max(1.0, float(np.max(np.abs(g64[k]))))
        np.testing.assert_allclose(g32[k], g64[k], rtol=0, atol=2e-4 * scale, err_msg=k)
    # acting in float32 reproduces the float32 replay bit for bit; states stay float64 arrays
    step = p32.acting_step_fn(params)
    s = data[2]
    T, n = data[3].shape
    for t in range(T):
        out, s = step(data[0][t], s, data[3][t])
        assert s.h.dtype == np.float64
        np.testing.assert_array_equal(out, e32.cache.policy_out.reshape(T, n, -1)[t])
    np.testing.assert_array_equal(s.h, e32.cache.h_prev[:, T].astype(np.float64))


def test_float32_trainer_ratio_is_exactly_one_and_it_learns_memory():
    from ppo_ref.recurrent_ppo import RecurrentPPOTrainer
    config = PPOConfig(n_envs=4, n_steps=7, batch_size=14, n_epochs=2, learning_rate=3e-3,
                       lstm_hidden_size=64, net_arch=(64,), activation="relu", gamma=0.9,
                       gae_lambda=0.9, compute_dtype="float32")
    trainer = RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=3,
                                  env_kwargs={"max_episode_steps": 12})
    for _ in range(4):
        rollout = trainer.collect_rollout()
        assert trainer.update(rollout)["first_max_abs_log_ratio"] == 0.0
    assert trainer.params.flat.dtype == np.float64
    assert isinstance(trainer.params, FlatArrays)
