"""Tests of the LSTM actor-critic network (ppo_ref.spec.recurrent_networks) and of the acting
methods of the one RecurrentPolicy (ppo_ref.train.policies) on both tiers."""
import numpy as np
import pytest
from gradcheck import check_gradients

from ppo_ref.spec.layers import mlp_forward
from ppo_ref.spec.lstm import lstm_forward
from ppo_ref.spec.recurrent_networks import (
    LSTMStates, initial_lstm_states, recurrent_actor_critic_backward,
    recurrent_actor_critic_forward, recurrent_actor_critic_init, recurrent_actor_critic_step,
    recurrent_value_step,
)


def _setup(rng, lstm_shared, T=6, N=4, D=3, P=2, H=5, net_arch=(4,), random_state=True):
    params = recurrent_actor_critic_init(rng, D, P, hidden_size=H, lstm_shared=lstm_shared,
                                         net_arch=net_arch, policy_gain=1.0)
    obs = rng.normal(size=(T, N, D))
    starts = rng.random((T, N)) < 0.3
    state = initial_lstm_states(params, N, lstm_shared)
    if random_state:
        state = LSTMStates(rng.normal(size=state.h.shape), rng.normal(size=state.c.shape))
    return params, obs, starts, state


@pytest.mark.parametrize("lstm_shared", [False, True])
def test_keys_and_state_layout(rng, lstm_shared):
    params, _, _, state = _setup(rng, lstm_shared, random_state=False)
    lstms = ["lstm"] if lstm_shared else ["lstm_pi", "lstm_vf"]
    expected = {f"{l}.{k}" for l in lstms for k in ("w_ih", "w_hh", "b")}
    expected |= {f"{t}.{k}{i}" for t in ("pi", "vf") for k in "wb" for i in range(2)}
    assert set(params) == expected
    assert state.h.shape == (len(lstms), 4, 5) and not state.h.any() and not state.c.any()
    with pytest.raises(ValueError, match="lstm_shared"):
        initial_lstm_states(params, 4, not lstm_shared)


@pytest.mark.parametrize("lstm_shared", [False, True])
def test_forward_is_lstm_then_towers(rng, lstm_shared):
    """The composition, written out with the layer functions: actor LSTM -> pi tower,
    critic LSTM (or the same one) -> vf tower."""
    params, obs, starts, state = _setup(rng, lstm_shared)
    policy_out, values, final_state, _ = recurrent_actor_critic_forward(
        params, obs, state, starts, "tanh", lstm_shared)
    sub = lambda p: {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(p + ".")}
    names = ["lstm"] if lstm_shared else ["lstm_pi", "lstm_vf"]
    h_seqs = []
    for l, name in enumerate(names):
        h_seq, (h_T, c_T), _ = lstm_forward(sub(name), obs, state.h[l], state.c[l], starts)
        h_seqs.append(h_seq)
        np.testing.assert_array_equal(final_state.h[l], h_T)
        np.testing.assert_array_equal(final_state.c[l], c_T)
    np.testing.assert_array_equal(policy_out, mlp_forward(sub("pi"), h_seqs[0])[0])
    np.testing.assert_array_equal(values, mlp_forward(sub("vf"), h_seqs[-1])[0][..., 0])


@pytest.mark.parametrize("lstm_shared", [False, True])
def test_stepping_equals_whole_sequence_and_env_subsets(rng, lstm_shared):
    """Acting step by step, and replaying any subset of envs from their stored start state,
    give the outputs of one whole-sequence forward pass: stepping bit for bit for the LSTM
    states (the sequence forward is a loop of the same step), everything else to rounding:
    these readable functions use NumPy's matrix products, whose rounding of a row can depend
    on the number of rows and on the BLAS kernel for the CPU. (The fast path's bit-for-bit
    replay of any env subset is tested in test_recurrent_fast.py.)"""
    params, obs, starts, state = _setup(rng, lstm_shared, T=9, N=6, H=16, net_arch=(8, 8))
    policy_out, values, final_state, _ = recurrent_actor_critic_forward(
        params, obs, state, starts, "tanh", lstm_shared)
    s = state
    for t in range(obs.shape[0]):
        v_only = recurrent_value_step(params, obs[t], s, starts[t], "tanh", lstm_shared)
        p_t, v_t, s = recurrent_actor_critic_step(params, obs[t], s, starts[t], "tanh", lstm_shared)
        np.testing.assert_allclose(p_t, policy_out[t], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(v_t, values[t], rtol=1e-13, atol=1e-15)
        np.testing.assert_array_equal(v_only, v_t)
    np.testing.assert_array_equal(s.h, final_state.h)
    np.testing.assert_array_equal(s.c, final_state.c)
    for envs in (np.array([5, 0]), np.array([1, 2, 4]), np.array([3])):
        p_sub, v_sub, s_sub, _ = recurrent_actor_critic_forward(
            params, obs[:, envs], state.select(envs), starts[:, envs], "tanh", lstm_shared)
        np.testing.assert_allclose(s_sub.h, final_state.h[:, envs], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(s_sub.c, final_state.c[:, envs], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(p_sub, policy_out[:, envs], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(v_sub, values[:, envs], rtol=1e-13, atol=1e-15)


def test_episode_start_resets_both_lstms(rng):
    """An env whose episode starts at t gives the same outputs from t on whatever came before."""
    params, obs, starts, state = _setup(rng, False, T=5, N=2)
    starts[:] = False
    starts[2, :] = True
    obs2 = obs.copy()
    obs2[:2, 1] = rng.normal(size=obs2[:2, 1].shape)         # different history for env 1
    state2 = LSTMStates(state.h.copy(), state.c.copy())
    state2.h[:, 1] += 1.0
    a = recurrent_actor_critic_forward(params, obs, state, starts)
    b = recurrent_actor_critic_forward(params, obs2, state2, starts)
    np.testing.assert_array_equal(a[0][2:], b[0][2:])
    np.testing.assert_array_equal(a[1][2:], b[1][2:])
    assert not np.array_equal(a[1][:2, 1], b[1][:2, 1])


@pytest.mark.parametrize("lstm_shared,net_arch", [(False, (4,)), (True, (4,)), (False, ()),
                                                  (True, (3, 4))])
def test_backward_matches_central_differences(rng, lstm_shared, net_arch):
    params, obs, starts, state = _setup(rng, lstm_shared, net_arch=net_arch)
    w_pi = rng.normal(size=(6, 4, 2))
    w_v = rng.normal(size=(6, 4))

    def f():
        p, v, _, _ = recurrent_actor_critic_forward(params, obs, state, starts, "tanh", lstm_shared)
        return float(np.sum(p * w_pi) + np.sum(v * w_v))

    _, _, _, cache = recurrent_actor_critic_forward(params, obs, state, starts, "tanh", lstm_shared)
    grads = recurrent_actor_critic_backward(params, cache, w_pi, w_v)
    assert list(grads) == list(params)
    # floor 1e-4: f is O(10), so central differences carry ~1e-9 absolute round-off; tiny
    # gradient entries are compared absolutely below the floor.
    check_gradients(f, params, grads, floor=1e-4)


def test_errors_name_the_argument(rng):
    params, obs, starts, state = _setup(rng, False)
    with pytest.raises(ValueError, match="obs"):
        recurrent_actor_critic_forward(params, obs[0], state, starts)
    with pytest.raises(ValueError, match="state.h"):
        recurrent_actor_critic_forward(params, obs[:, :2], state, starts[:, :2])
    with pytest.raises(ValueError, match="lstm_shared"):
        recurrent_actor_critic_forward(params, obs, state, starts, lstm_shared=True)
    with pytest.raises(ValueError, match="episode_starts"):
        recurrent_actor_critic_step(params, obs[0], state, np.full(4, 2))


@pytest.mark.parametrize("kind", ["fast", "spec"])
def test_recurrent_policy_acting_methods_agree(rng, kind):
    """act / predict / values of the recurrent policy step the same state, and act's outputs
    give the log-probs and values that evaluate computes for a one-step sequence: bit for bit
    on the compiled tier (row-wise arithmetic), to rounding on the readable tier (NumPy
    products, whose BLAS rounding may depend on the number of rows)."""
    import gymnasium as gym
    from ppo_ref.config import PPOConfig
    from ppo_ref.tiers import tier_for
    from ppo_ref.train.policies import RecurrentPolicy
    env = gym.make("ppo_ref/MemoryCue-v0")
    policy = RecurrentPolicy(env.observation_space, env.action_space,
                             PPOConfig(lstm_hidden_size=6, net_arch=(5,), policy_head_gain=1.0,
                                       backend=kind), tier_for(kind))
    if kind == "fast":
        def same(a, b):
            np.testing.assert_array_equal(a, b)
    else:
        def same(a, b):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    params = policy.init_params(rng)
    obs = rng.normal(size=(3, 2))
    starts = np.array([True, False, False])
    state = LSTMStates(rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6)))
    acted = policy.act(params, obs, state, starts, np.random.default_rng(1))
    assert acted.state.h.shape == (2, 3, 6) and not np.array_equal(acted.state.h, state.h)
    log_probs, values = policy.behaviour(params, obs, acted.actions, acted.policy_out,
                                         [acted.values])
    np.testing.assert_array_equal(values, acted.values)
    lp_eval, _, v_eval, _ = policy.evaluate(params, (obs[None], acted.actions[None], state,
                                                     starts[None]))
    same(lp_eval, log_probs)
    same(v_eval, values)
    np.testing.assert_array_equal(policy.values(params, obs, state, starts), values)
    greedy, s_pred = policy.predict(params, obs, state, starts, None, deterministic=True)
    np.testing.assert_array_equal(greedy, np.argmax(acted.policy_out, axis=1))
    np.testing.assert_array_equal(s_pred.h, acted.state.h)
    np.testing.assert_array_equal(s_pred.c, acted.state.c)
    sampled, _ = policy.predict(params, obs, state, starts, np.random.default_rng(1), False)
    np.testing.assert_array_equal(sampled, acted.actions)
