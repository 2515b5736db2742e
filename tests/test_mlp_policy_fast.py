"""The MLP policy (ppo_ref.train.policies.MLPPolicy: the actor-critic of a tier and a head) by
behaviour: its gradients against central differences on both tiers, acting on the compiled
tier gives the bits the update's evaluate recomputes (so the first minibatch has ratio 1), and
``compute_dtype="float32"`` computes in float32 behind float64 interfaces. (The network and
distribution twins are tests/test_tiers.py's rows; the trainers are tests/test_ppo.py's.)"""
import gymnasium as gym
import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.config import PPOConfig
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import MLPPolicy

SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64),
    "multi": gym.spaces.MultiDiscrete([3, 1, 2]),
}
OBS = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float64)


def make_policy(rng, kind="discrete", backend="fast", **config):
    config = PPOConfig(**{"net_arch": (16, 16), "policy_head_gain": 1.0, **config})
    policy = MLPPolicy(OBS, SPACES[kind], config, tier_for(backend))
    params = policy.init_params(rng)
    for v in params.values():  # non-zero biases and log_std: every term of the gradient matters
        v[...] += 0.3 * rng.standard_normal(v.shape)
    return policy, params


def batch(rng, rows, kind):
    obs = rng.standard_normal((rows, 5))
    if kind == "box":
        actions = rng.standard_normal((rows, 2))
    elif kind == "multi":
        actions = np.stack([rng.integers(0, n, rows) for n in (3, 1, 2)], axis=-1)
    else:
        actions = rng.integers(0, 3, rows)
    return obs, actions


@pytest.mark.parametrize("backend", ["spec", "fast"])
@pytest.mark.parametrize("kind, shared_trunk, activation", [
    ("discrete", False, "tanh"), ("box", True, "relu"), ("multi", False, "relu"),
    ("box", False, "tanh"), ("discrete", True, "tanh")])
def test_policy_gradient_matches_central_differences(rng, backend, kind, shared_trunk,
                                                     activation):
    """backward of evaluate's cache (head and network, log_std included) is the gradient of
    ``sum(w_lp * log_probs + w_h * entropy + (values - returns)^2)``."""
    policy, params = make_policy(rng, kind, backend, net_arch=(8, 6), activation=activation,
                                 shared_trunk=shared_trunk)
    obs, actions = batch(rng, 11, kind)
    w_lp, w_h, returns = rng.standard_normal(11), rng.standard_normal(11), rng.standard_normal(11)

    def loss_and_grads():
        log_probs, entropy, values, cache = policy.evaluate(params, (obs, actions))
        loss = (np.sum(w_lp * log_probs) + np.sum(w_h * entropy)
                + np.sum((values - returns) ** 2))
        return loss, policy.backward(params, cache, w_lp, w_h, 2.0 * (values - returns))

    _, grads = loss_and_grads()
    assert list(grads) == list(params) and all(g.dtype == np.float64 for g in grads.values())
    check_gradients(lambda: loss_and_grads()[0], params, grads, rng=rng)


@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("compute_dtype", ["float64", "float32"])
def test_acting_gives_the_bits_the_update_recomputes(rng, kind, shared_trunk, compute_dtype):
    """A rollout acted in three steps: the policy outputs of the steps, the behaviour
    log-probs and values computed from them afterwards, and evaluate of the same rows in one
    call (as the update's first minibatch) are the same bits, and so are the outputs of one
    acting call on all the rows; sampling again from the steps' outputs with a generator of
    the same seed draws the same actions; the deterministic prediction is the mode."""
    policy, params = make_policy(rng, kind, shared_trunk=shared_trunk,
                                 compute_dtype=compute_dtype)
    cparams = policy.compute_params(params)
    obs, _ = batch(rng, 9, kind)
    gen = np.random.default_rng(3)
    steps = [policy.act(cparams, obs[lo:hi], None, None, gen)
             for lo, hi in ((0, 4), (4, 5), (5, 9))]
    actions = np.concatenate([s.actions for s in steps])
    outs = np.concatenate([s.policy_out for s in steps])
    log_probs, values = policy.behaviour(cparams, obs, actions, outs, [s.values for s in steps])
    ev_log_probs, _, ev_values, _ = policy.evaluate(params, (obs, actions))
    assert np.array_equal(log_probs, ev_log_probs) and np.array_equal(values, ev_values)
    assert np.array_equal(values, policy.values(cparams, obs, None, None))
    again = policy.act(cparams, obs, None, None, np.random.default_rng(3))
    assert np.array_equal(again.policy_out, outs)
    replay = np.random.default_rng(3)
    for s in steps:
        assert np.array_equal(policy.head.sample(replay, s.policy_out, cparams), s.actions)
    greedy, state = policy.predict(params, obs, None, None, None, deterministic=True)
    assert state is None
    if kind == "box":
        assert np.array_equal(greedy, np.clip(outs, -1.0, 1.0))
    elif kind == "discrete":
        assert np.array_equal(greedy, np.argmax(outs, axis=1))
    else:
        parts = np.split(outs, [3, 4], axis=1)
        assert np.array_equal(greedy, np.stack([np.argmax(p, axis=1) for p in parts], -1))


@pytest.mark.parametrize("kind", ["discrete", "box"])
@pytest.mark.parametrize("shared_trunk", [False, True])
def test_float32_compute_is_close_to_float64_behind_float64_interfaces(rng, kind, shared_trunk):
    """compute_dtype float32 really computes in float32 (the results differ from float64's),
    within float32 rounding of them, and returns float64 gradients with the keys of the
    parameters."""
    p64, params = make_policy(rng, kind, shared_trunk=shared_trunk)
    p32 = MLPPolicy(OBS, SPACES[kind], p64.config.replace(compute_dtype="float32"),
                    tier_for("fast"))
    obs, actions = batch(rng, 64, kind)
    d = [rng.standard_normal(64) for _ in range(3)]
    e64, e32 = p64.evaluate(params, (obs, actions)), p32.evaluate(params, (obs, actions))
    for a, b in zip(e32[:3], e64[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(e32[2], e64[2])
    g64, g32 = p64.backward(params, e64[3], *d), p32.backward(params, e32[3], *d)
    assert list(g32) == list(params) and all(g.dtype == np.float64 for g in g32.values())
    scale = max(np.abs(g).max() for g in g64.values())
    for k in g64:
        np.testing.assert_allclose(g32[k], g64[k], rtol=0, atol=1e-4 * scale, err_msg=k)


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_results_held_across_calls_are_not_overwritten(rng, shared_trunk):
    """Evaluating, acting on and valuing many batches while holding every result (the fast
    tier reuses its buffers between calls) leaves each result and cache as it was: each held
    result keeps the bits it had when it was returned, calling again on a batch alone gives
    those bits in new memory, and the backward pass of an old cache gives that batch's
    gradients."""
    policy, params = make_policy(rng, shared_trunk=shared_trunk)
    batches = [batch(rng, 40, "discrete") for _ in range(7)]
    outs, out_copies, values, value_copies, held, held_copies = [], [], [], [], [], []
    for b in batches:
        out = policy.act(params, b[0], None, None, rng).policy_out
        outs.append(out)
        out_copies.append(out.copy())
    for b in batches:
        value = policy.values(params, b[0], None, None)
        values.append(value)
        value_copies.append(value.copy())
    for b in batches:
        result = policy.evaluate(params, b)
        held.append(result)
        held_copies.append([np.array(a, copy=True) for a in result[:3]])
    d = [rng.standard_normal(40) for _ in range(3)]
    first_grads = policy.backward(params, held[0][3], *d)
    first_grad_copies = {k: g.copy() for k, g in first_grads.items()}
    for b, old, old_copy, out, out_copy, value, value_copy in zip(
            batches, held, held_copies, outs, out_copies, values, value_copies):
        new = policy.evaluate(params, b)
        for u, u_copy, v in zip(old[:3], old_copy, new[:3]):
            assert np.array_equal(u, u_copy) and np.array_equal(v, u_copy)
            assert not np.shares_memory(u, v)
        new_out = policy.act(params, b[0], None, None, rng).policy_out
        assert np.array_equal(out, out_copy) and np.array_equal(new_out, out_copy)
        assert not np.shares_memory(out, new_out)
        new_value = policy.values(params, b[0], None, None)
        assert np.array_equal(value, value_copy) and np.array_equal(new_value, value_copy)
        assert not np.shares_memory(value, new_value)
    fresh = policy.backward(params, policy.evaluate(params, batches[0])[3], *d)
    for k in params:
        assert np.array_equal(first_grads[k], first_grad_copies[k]), k
        assert np.array_equal(fresh[k], first_grad_copies[k]), k
        assert not np.shares_memory(first_grads[k], fresh[k]), k
