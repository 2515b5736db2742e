"""The recurrent policy (ppo_ref.train.policies.RecurrentPolicy: the LSTM actor-critic of a tier
and a head) by behaviour: its gradients (backpropagation through time, resets inside) against
central differences on both tiers; acting step by step on the compiled tier gives the bits the
update's replay recomputes, for every subset of envs (so the first minibatch has ratio 1);
``compute_dtype="float32"`` computes in float32 behind float64 interfaces, and a float32
trainer keeps ratio 1. (The LSTM and recurrent network twins are tests/test_tiers.py's rows;
the trainer is tests/test_recurrent_ppo.py's.)"""
import numpy as np
import pytest
from gymnasium import spaces

from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import RecurrentPolicy

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float64)
SPACES = {"discrete": spaces.Discrete(3), "box": spaces.Box(-1.0, 1.0, (2,), np.float64)}


def make_policy(rng, kind="discrete", backend="fast", **config):
    config = PPOConfig(**{"lstm_hidden_size": 16, "net_arch": (8,), "policy_head_gain": 1.0,
                          **config})
    policy = RecurrentPolicy(OBS, SPACES[kind], config, tier_for(backend))
    params = policy.init_params(rng)
    for v in params.values():   # non-trivial biases, bigger logits
        v[...] += 0.3 * rng.standard_normal(v.shape)
    return policy, params


def make_data(rng, policy, kind, T=6, n=5):
    """``(obs [T, n, 3], actions [T, n, ...], start state [L, n, H], episode_starts [T, n])``
    with resets inside the sequence and env 0 starting at t = 0."""
    obs = rng.normal(size=(T, n, 3))
    actions = rng.integers(0, 3, size=(T, n)) if kind == "discrete" else rng.normal(size=(T, n, 2))
    starts = rng.random((T, n)) < 0.25
    starts[0, 0] = True
    shape = (policy.n_lstm, n, policy.hidden_size)
    state = LSTMStates(rng.normal(scale=0.5, size=shape), rng.normal(scale=0.5, size=shape))
    return obs, actions, state, starts


@pytest.mark.parametrize("backend", ["spec", "fast"])
@pytest.mark.parametrize("kind, shared, act", [("discrete", False, "tanh"),
                                               ("discrete", True, "relu"),
                                               ("box", False, "relu")])
def test_gradients_match_central_differences(rng, backend, kind, shared, act):
    """backward of evaluate's cache (through time, resets inside, log_std included) is the
    gradient of ``sum(w0 * log_probs + w1 * entropy + w2 * values)``."""
    policy, params = make_policy(rng, kind, backend, lstm_shared=shared, activation=act)
    obs, actions, state, starts = make_data(rng, policy, kind, T=5, n=3)
    w = [rng.normal(size=15) for _ in range(3)]

    def f():
        log_probs, entropy, values, _ = policy.evaluate(params, (obs, actions, state, starts))
        return float(np.sum(w[0] * log_probs) + np.sum(w[1] * entropy) + np.sum(w[2] * values))

    cache = policy.evaluate(params, (obs, actions, state, starts))[3]
    grads = policy.backward(params, cache, *w)
    assert list(grads) == list(params) and all(g.dtype == np.float64 for g in grads.values())
    check_gradients(f, params, grads, floor=1e-4, max_coords=25, rng=rng)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind, shared", [("discrete", False), ("discrete", True),
                                          ("box", False)])
def test_acting_steps_give_the_bits_the_replay_recomputes(rng, dtype, kind, shared):
    """T acting steps from a start state (values before each step too) give, at every step,
    the policy outputs, values and behaviour log-probs that one replay of the whole [T, n]
    sequence from that state computes, bit for bit, and the replay of any subset of the envs
    gives those envs' bits; the prediction carries the same state."""
    policy, params = make_policy(rng, kind, lstm_shared=shared, activation="tanh",
                                 compute_dtype=dtype)
    cparams = policy.compute_params(params)
    obs, _, state, starts = make_data(rng, policy, kind, T=7, n=6)
    T, n = starts.shape
    state = LSTMStates(*(a.astype(policy.dtype) for a in state))
    gen, s, s_pred = np.random.default_rng(9), state, state
    steps = []
    for t in range(T):
        v_before = policy.values(cparams, obs[t], s, starts[t])
        step = policy.act(cparams, obs[t], s, starts[t], gen)
        assert np.array_equal(v_before, step.values)
        _, s_pred = policy.predict(params, obs[t], s_pred, starts[t], None, deterministic=True)
        assert np.array_equal(s_pred.h, step.state.h) and np.array_equal(s_pred.c, step.state.c)
        steps.append(step)
        s = step.state
    actions = np.stack([st.actions for st in steps])
    outs = np.concatenate([st.policy_out for st in steps])
    log_probs, values = policy.behaviour(cparams, obs.reshape(T * n, 3),
                                         actions.reshape((T * n,) + policy.head.action_shape),
                                         outs, [st.values for st in steps])
    ev_log_probs, _, ev_values, _ = policy.evaluate(params, (obs, actions, state, starts))
    assert np.array_equal(ev_log_probs, log_probs) and np.array_equal(ev_values, values)
    for envs in (np.array([4, 1]), np.array([3]), np.arange(n)[::-1]):
        sub = policy.evaluate(params, (obs[:, envs], actions[:, envs], state.select(envs),
                                       starts[:, envs]))
        assert np.array_equal(sub[0].reshape(T, -1), ev_log_probs.reshape(T, n)[:, envs])
        assert np.array_equal(sub[2].reshape(T, -1), ev_values.reshape(T, n)[:, envs])
    if dtype == "float32":   # really computed in float32
        assert s.h.dtype == np.float32 and outs.dtype == np.float32


@pytest.mark.parametrize("kind, shared, act", [("box", True, "tanh"), ("discrete", False, "relu")])
def test_float32_compute_is_close_to_the_spec_policy(rng, kind, shared, act):
    """compute_dtype float32 on the compiled tier: within float32 rounding (through 8
    recurrent steps) of the spec tier's float64 policy, float64 gradients with the keys of
    the parameters."""
    p32, params = make_policy(rng, kind, lstm_shared=shared, activation=act,
                              compute_dtype="float32")
    spec = RecurrentPolicy(OBS, SPACES[kind], p32.config.replace(compute_dtype="float64"),
                           tier_for("spec"))
    data = make_data(rng, p32, kind, T=8, n=4)
    e32, ref = p32.evaluate(params, data), spec.evaluate(params, data)
    for a, b in zip(e32[:3], ref[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(e32[2], ref[2])      # really computed in float32
    w = [rng.normal(size=32) for _ in range(3)]
    g32, g = p32.backward(params, e32[3], *w), spec.backward(params, ref[3], *w)
    assert list(g32) == list(params) and all(a.dtype == np.float64 for a in g32.values())
    for k in g:
        scale = float(np.max(np.abs(g[k])))
        np.testing.assert_allclose(g32[k], g[k], rtol=0, atol=2e-4 * scale, err_msg=k)


def test_float32_trainer_ratio_is_exactly_one():
    from ppo_ref import RecurrentPPOTrainer
    config = PPOConfig(n_envs=4, n_steps=7, batch_size=14, n_epochs=2, learning_rate=3e-3,
                       lstm_hidden_size=64, net_arch=(64,), activation="relu", gamma=0.9,
                       gae_lambda=0.9, compute_dtype="float32")
    trainer = RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=3,
                                  env_kwargs={"max_episode_steps": 12})
    try:
        for _ in range(4):
            rollout = trainer.collect_rollout()
            assert trainer.update(rollout)["first_max_abs_log_ratio"] == 0.0
        assert all(v.dtype == np.float64 for v in trainer.params.values())
    finally:
        trainer.close()
