"""RecurrentPolicy, the compiled tier (one-buffer parameters only: both LSTMs in one compiled
call, row-wise towers, compiled categorical head), against SpecRecurrentPolicy and the spec
network functions (ppo_ref.spec.recurrent_networks), its own methods against each other (bit for
bit), its argument handling, and its float32 variant (``compute_dtype="float32"``).

Tolerances (the ones RecurrentPolicy's docstring states): float64 rtol 1e-12, atol 1e-13, each
gradient array within 1e-12 of its largest entry. The LSTM arithmetic is the same in both tiers
(its hidden states are compared bit for bit with ppo_ref.fast.lstm below); the fast towers compute
``b + x @ w.T`` and the backward products as fused multiply-add chains in a documented order
(ppo_ref/nn/mlp.py) where the spec calls NumPy/BLAS, and the fast categorical head uses compiled
``exp``/``log``: a few roundings per output, ~1e-16 relative, amplified by the network's
condition (small here). float32 compute: rtol 1e-4, atol 1e-5, gradients 2e-4 of the largest
entry (float32 rounding, ~6e-8 relative, through 8 to 32 recurrent steps).
"""
import numpy as np
import pytest
from gradcheck import check_gradients
from gymnasium import spaces

from ppo_ref.config import PPOConfig
from ppo_ref.fast.flat import FlatArrays, flatten_arrays, is_flat
from ppo_ref.fast.lstm import _linear_rows, lstm_forward
from ppo_ref.recurrent_policies import (LSTMStates, RecurrentPolicy, SpecRecurrentPolicy,
                                        _FastCache, recurrent_actor_critic_step)

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float64)
DISCRETE = spaces.Discrete(3)
BOX = spaces.Box(-1.0, 1.0, (2,), np.float64)
F64 = dict(rtol=1e-12, atol=1e-13)
F32 = dict(rtol=1e-4, atol=1e-5)


def assert_grads_close(got, want, rel):
    """Every gradient array of ``got`` within ``rel`` of the largest entry of ``want``'s."""
    assert list(got) == list(want)
    for k in want:
        scale = float(np.max(np.abs(want[k])))
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=rel * scale, err_msg=k)


def make_policy(action_space=DISCRETE, **kw):
    config = dict(lstm_hidden_size=16, net_arch=(8,), policy_head_gain=1.0, ent_coef=0.01)
    config.update(kw)
    return RecurrentPolicy(OBS, action_space, PPOConfig(**config))


def spec_twin(policy):
    """The SpecRecurrentPolicy of the same network and head (float64)."""
    space = DISCRETE if policy.head.kind == "categorical" else BOX
    return SpecRecurrentPolicy(OBS, space, policy.config.replace(compute_dtype="float64",
                                                                 backend="spec"))


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


def net_params(policy, params):
    """The network's entries of ``params`` (no head keys) as a plain dict."""
    return {k: v for k, v in params.items() if k != "log_std"}


CASES = [(DISCRETE, False, "tanh"), (DISCRETE, True, "relu"), (BOX, False, "relu"),
         (BOX, True, "tanh")]


# ---------------------------------------------------------------- against the spec tier

@pytest.mark.parametrize("space,shared,act", CASES)
def test_evaluate_and_backward_equal_the_spec_policy(rng, space, shared, act):
    policy = make_policy(space, lstm_shared=shared, activation=act)
    spec = spec_twin(policy)
    params = perturbed_params(rng, policy)
    assert is_flat(params)
    data = make_data(rng, policy)
    fast = policy.evaluate(params, *data)
    ref = spec.evaluate(dict(params), *data)
    assert isinstance(fast.cache, _FastCache)
    for name in ("log_probs", "entropy", "values"):
        assert getattr(fast, name).dtype == np.float64
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), **F64,
                                   err_msg=name)
    # the LSTM part is the same arithmetic as ppo_ref.fast.lstm: the hidden states bit for bit
    names = ["lstm"] if shared else ["lstm_pi", "lstm_vf"]
    T, n = data[3].shape
    for l, name in enumerate(names):
        sub = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(name + ".")}
        h_seq, (h_T, c_T), _ = lstm_forward(sub, data[0], data[2].h[l], data[2].c[l], data[3])
        np.testing.assert_array_equal(fast.cache.h_seq[l], h_seq)      # the towers' input
        np.testing.assert_array_equal(fast.cache.c_prev[l, T], c_T)
    w = [rng.normal(size=(T, n)) for _ in range(3)]
    g_fast = policy.backward(params, fast.cache, *w)
    g_ref = spec.backward(dict(params), ref.cache, *w)
    assert is_flat(g_fast) and g_fast.layout == params.layout and list(g_fast) == list(params)
    assert_grads_close(g_fast, g_ref, 1e-12)


@pytest.mark.parametrize("net_arch,shared,act", [((), False, "relu"), ((8, 5), True, "tanh"),
                                                  ((8, 5), False, "relu")])
def test_towers_of_any_depth_equal_the_spec_policy(rng, net_arch, shared, act):
    """Towers of 1 and 3 layers (linear heads on the LSTM; two hidden layers) on the compiled
    tower kernels: outputs and every gradient as SpecRecurrentPolicy's, including the shared
    LSTM's summed dL/dh from both towers."""
    policy = make_policy(BOX, lstm_shared=shared, activation=act, net_arch=net_arch)
    spec = spec_twin(policy)
    params = perturbed_params(rng, policy)
    data = make_data(rng, policy)
    fast = policy.evaluate(params, *data)
    ref = spec.evaluate(dict(params), *data)
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), **F64,
                                   err_msg=name)
    w = [rng.normal(size=data[3].shape) for _ in range(3)]
    assert_grads_close(policy.backward(params, fast.cache, *w),
                       spec.backward(dict(params), ref.cache, *w), 1e-12)


@pytest.mark.parametrize("space,shared,act", CASES[:3])
def test_gradients_match_central_differences(rng, space, shared, act):
    policy = make_policy(space, lstm_shared=shared, activation=act)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=5, n=3)
    T, n = starts.shape
    w = [rng.normal(size=(T, n)) for _ in range(3)]

    def f():
        ev = policy.evaluate(params, obs, actions, state, starts)
        return float(np.sum(w[0] * ev.log_probs) + np.sum(w[1] * ev.entropy)
                     + np.sum(w[2] * ev.values))

    ev = policy.evaluate(params, obs, actions, state, starts)
    grads = policy.backward(params, ev.cache, *w)
    check_gradients(f, params, grads, floor=1e-4, max_coords=25, rng=rng)


@pytest.mark.parametrize("shared,dtype", [(False, "float64"), (True, "float64"),
                                          (False, "float32"), (True, "float32")])
@pytest.mark.parametrize("space", [DISCRETE, BOX])
def test_acting_equals_the_spec_policy(rng, shared, dtype, space):
    """act / policy_out_step / values / predict against SpecRecurrentPolicy's, one step from a
    random state with some resets: the same actions from the same generator, the rest within
    the stated tolerance of the compute dtype."""
    policy = make_policy(space, lstm_shared=shared, activation="relu", compute_dtype=dtype)
    spec = spec_twin(policy)
    tol = F64 if dtype == "float64" else F32
    params = perturbed_params(rng, policy)
    obs, _, state, starts = make_data(rng, policy, T=1, n=5)
    plain = dict(params)
    a, v, lp, s = policy.act(params, obs[0], state, starts[0], np.random.default_rng(4))
    a_s, v_s, lp_s, s_s = spec.act(plain, obs[0], state, starts[0], np.random.default_rng(4))
    if space is DISCRETE:
        np.testing.assert_array_equal(a, a_s)
    else:
        np.testing.assert_allclose(a, a_s, **tol)
    for got, want in ((v, v_s), (lp, lp_s), (s.h, s_s.h), (s.c, s_s.c)):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, **tol)
    out, s2 = policy.policy_out_step(params, obs[0], state, starts[0])
    out_s, _ = spec.policy_out_step(plain, obs[0], state, starts[0])
    np.testing.assert_allclose(out, out_s, **tol)
    np.testing.assert_allclose(policy.values(params, obs[0], state, starts[0]),
                               spec.values(plain, obs[0], state, starts[0]), **tol)
    greedy, _ = policy.predict(params, obs[0], state, starts[0], deterministic=True)
    greedy_s, _ = spec.predict(plain, obs[0], state, starts[0], deterministic=True)
    if space is DISCRETE:
        np.testing.assert_array_equal(greedy, greedy_s)
    else:
        np.testing.assert_allclose(greedy, greedy_s, **tol)


# ---------------------------------------------------------------- bit for bit within the tier

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("space,shared", [(DISCRETE, False), (DISCRETE, True), (BOX, False)])
def test_act_policy_out_step_predict_values_and_evaluate_agree_bit_for_bit(rng, dtype, space,
                                                                           shared):
    """Stepping T steps with act, policy_out_step, predict(deterministic), values and
    acting_step_fn from the same state gives, at every step, the LSTM states, policy outputs,
    values and log-probs that one evaluate of the whole [T, n] sequence (with the actions act
    drew) computes for it: bit for bit, in float64 and in float32."""
    policy = make_policy(space, lstm_shared=shared, activation="tanh", compute_dtype=dtype)
    params = perturbed_params(rng, policy)
    obs, _, state, starts = make_data(rng, policy, T=7, n=4)
    T, n = starts.shape
    step = policy.acting_step_fn(params)
    gen_act, gen_predict = np.random.default_rng(9), np.random.default_rng(9)
    s_act = s_out = s_step = s_pred = state
    acted, log_probs, values, outs = [], [], [], []
    for t in range(T):
        v_before = policy.values(params, obs[t], s_act, starts[t])
        a, v, lp, s_act = policy.act(params, obs[t], s_act, starts[t], gen_act)
        out, s_out = policy.policy_out_step(params, obs[t], s_out, starts[t])
        out_step, s_step = step(obs[t], s_step, starts[t])
        sampled, _ = policy.predict(params, obs[t], s_pred, starts[t], gen_predict)
        greedy, s_pred = policy.predict(params, obs[t], s_pred, starts[t], deterministic=True)
        np.testing.assert_array_equal(v_before, v)
        np.testing.assert_array_equal(out_step, out)
        np.testing.assert_array_equal(sampled, policy.head.to_env(a))
        np.testing.assert_array_equal(greedy, policy.head.to_env(policy.head.mode(out, params)))
        for s in (s_out, s_step, s_pred):
            np.testing.assert_array_equal(s.h, s_act.h)
            np.testing.assert_array_equal(s.c, s_act.c)
        assert s_act.h.dtype == np.float64 and out.dtype == np.float64
        acted.append(a)
        log_probs.append(lp)
        values.append(v)
        outs.append(out)
    ev = policy.evaluate(params, obs, np.stack(acted), state, starts)
    np.testing.assert_array_equal(ev.log_probs, np.stack(log_probs))
    np.testing.assert_array_equal(ev.values, np.stack(values))
    np.testing.assert_array_equal(ev.cache.policy_out.reshape(T, n, -1), np.stack(outs))
    L = 1 if shared else 2
    np.testing.assert_array_equal(ev.cache.h_prev[:, T], s_act.h.astype(ev.cache.x.dtype))
    np.testing.assert_array_equal(ev.cache.c_prev[:, T], s_act.c.astype(ev.cache.x.dtype))
    assert ev.cache.h_prev.shape[0] == L
    if dtype == "float32":     # really computed in float32
        assert ev.cache.x.dtype == np.float32
        assert np.array_equal(s_act.h, s_act.h.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("shared,act", [(False, "relu"), (True, "tanh")])
def test_acting_steps_are_the_replay_bit_for_bit(rng, shared, act):
    """Stepping with acting_step_fn gives policy outputs equal bit for bit to the replay of the
    whole sequence (the towers are row-wise, so the number of rows does not matter), for any
    subset of envs; its states equal the spec network's steps within the stated tolerance."""
    policy = make_policy(lstm_shared=shared, activation=act)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=7, n=6)
    step = policy.acting_step_fn(params)
    replay = policy.evaluate(params, obs, actions, state, starts)
    T, n = starts.shape
    s = s_spec = state
    for t in range(T):
        out, s = step(obs[t], s, starts[t])
        out_spec, _, s_spec = recurrent_actor_critic_step(
            net_params(policy, params), obs[t], s_spec, starts[t], policy.activation, shared)
        np.testing.assert_allclose(s.h, s_spec.h, **F64)
        np.testing.assert_allclose(s.c, s_spec.c, **F64)
        np.testing.assert_array_equal(out, replay.cache.policy_out.reshape(T, n, -1)[t])
        np.testing.assert_allclose(out, out_spec, **F64)
    for envs in (np.array([4, 1]), np.array([3])):
        sub = policy.evaluate(params, obs[:, envs], actions[:, envs], state.select(envs),
                              starts[:, envs])
        np.testing.assert_array_equal(sub.log_probs, replay.log_probs[:, envs])
        np.testing.assert_array_equal(sub.values, replay.values[:, envs])


@pytest.mark.parametrize("shared,dtype", [(False, "float64"), (True, "float64"),
                                          (False, "float32")])
def test_values_and_act_are_the_replay_bit_for_bit(rng, shared, dtype):
    """values() and act(): the critic's (every LSTM's) step by the stacked kernel and the
    towers on the parameter buffer, so values equal the replay's values of a one-step sequence
    bit for bit (and act's values equal values()); act's states equal policy_out_step's."""
    policy = make_policy(lstm_shared=shared, activation="relu", compute_dtype=dtype)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=1, n=5)
    replay = policy.evaluate(params, obs, actions, state, starts)
    v = policy.values(params, obs[0], state, starts[0])
    assert v.dtype == np.float64 and v.shape == (5,)
    np.testing.assert_array_equal(v, replay.values[0])
    a, v_act, lp, s_act = policy.act(params, obs[0], state, starts[0], np.random.default_rng(0))
    np.testing.assert_array_equal(v_act, v)
    _, s_out = policy.policy_out_step(params, obs[0], state, starts[0])
    np.testing.assert_array_equal(s_act.h, s_out.h)
    np.testing.assert_array_equal(s_act.c, s_out.c)
    # a list of 0/1 flags is converted (as_flag_array): the same bits
    listed = policy.values(params, obs[0], state, [int(f) for f in starts[0]])
    np.testing.assert_array_equal(listed, v)


# ---------------------------------------------------------------- arguments

def test_arguments_are_converted_where_well_defined(rng):
    """Float 0/1 flags, integer and integral-float actions, a Fortran-order state, float32
    observations, lists: converted to the arrays the kernels take, so the same bits as the
    converted arrays give (never another implementation)."""
    policy = make_policy()
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy)
    obs32 = obs.astype(np.float32)
    ref = policy.evaluate(params, obs32.astype(np.float64), actions, state, starts)
    for args in ((obs32, actions.astype(np.int32), state, starts.astype(np.float64)),
                 (obs32, actions.astype(np.float64),
                  LSTMStates(np.asfortranarray(state.h), state.c.tolist()), starts.tolist()),
                 (obs32.tolist(), actions.tolist(), tuple(state), starts.astype(np.uint8))):
        other = policy.evaluate(params, *args)
        assert isinstance(other.cache, _FastCache)
        for name in ("log_probs", "entropy", "values"):
            np.testing.assert_array_equal(getattr(other, name), getattr(ref, name))
    out, s = policy.policy_out_step(params, obs32[0], state, starts[0])
    out_l, s_l = policy.acting_step_fn(params)(obs32[0].tolist(), LSTMStates(
        np.asfortranarray(state.h), state.c), starts[0].astype(int))
    np.testing.assert_array_equal(out_l, out)
    np.testing.assert_array_equal(s_l.h, s.h)


def test_bad_arguments_raise_value_errors_naming_them(rng):
    policy = make_policy()
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy)
    ev = policy.evaluate(params, obs, actions, state, starts)
    step = policy.acting_step_fn(params)
    one = (obs[0], state, starts[0])

    def raises(match, fn, *args):
        with pytest.raises(ValueError, match=match):
            fn(*args)

    # params: only this policy's finite one-buffer parameters
    for method in (policy.act, policy.policy_out_step, policy.values, policy.predict):
        extra = (np.random.default_rng(0),) if method in (policy.act, policy.predict) else ()
        raises("as_flat", method, dict(params), *one, *extra)
    raises("as_flat", policy.evaluate, dict(params), obs, actions, state, starts)
    raises("as_flat", policy.acting_step_fn, dict(params))
    raises("params", policy.backward, dict(params), ev.cache, ev.log_probs, None, ev.values)
    raises("layout", policy.evaluate, flatten_arrays(dict(params), None), obs, actions, state,
           starts)
    raises("float64", policy.evaluate, flatten_arrays(dict(params), params.layout,
                                                      dtype=np.float32), obs, actions, state,
           starts)
    replaced = policy.as_flat(params)
    replaced["pi.b0"] = np.zeros(8)
    raises("params", policy.evaluate, replaced, obs, actions, state, starts)
    broken = policy.as_flat(params)
    broken["lstm_vf.w_hh"][0, 0] = np.inf
    raises(r"params\['lstm_vf.w_hh'\] must be finite", policy.evaluate, broken, obs, actions,
           state, starts)
    raises("params", policy.acting_step_fn, broken)
    other = make_policy(lstm_shared=True)
    raises("params", other.evaluate, params, obs, actions, LSTMStates(state.h[:1], state.c[:1]),
           starts)
    # obs
    bad = obs.copy()
    bad[2, 1, 0] = np.nan
    raises("obs must be finite", policy.evaluate, params, bad, actions, state, starts)
    raises("obs must be finite", step, bad[2], state, starts[2])
    raises("obs must have shape", policy.evaluate, params, obs[..., :2], actions, state, starts)
    raises("obs must have shape", policy.act, params, obs, state, starts[0],
           np.random.default_rng(0))
    raises("obs must hold real numbers", policy.values, params, obs[0].astype(complex), state,
           starts[0])
    raises("obs", policy.evaluate, params, obs[:0], actions[:0], state, starts[:0])
    # actions
    out_of_range = actions.copy()
    out_of_range[0, 0] = 3
    raises("actions must be in", policy.evaluate, params, obs, out_of_range, state, starts)
    raises("integer values", policy.evaluate, params, obs, actions + 0.5, state, starts)
    raises("actions must have shape", policy.evaluate, params, obs, actions[:, :2], state,
           starts)
    # state
    raises("state must be a pair", policy.evaluate, params, obs, actions, None, starts)
    raises("state must be a pair", step, obs[0], (state.h, state.c, state.c), starts[0])
    raises("state.h", policy.evaluate, params, obs, actions, LSTMStates(state.h[:1], state.c),
           starts)
    raises("state.c must be finite", policy.act, params, obs[0],
           LSTMStates(state.h, np.full_like(state.c, np.nan)), starts[0],
           np.random.default_rng(0))
    raises("state.h", step, obs[0], LSTMStates(state.h[:, :2], state.c[:, :2]), starts[0])
    # episode_starts
    raises("episode_starts", policy.evaluate, params, obs, actions, state, np.full((6, 5), 2))
    raises("episode_starts", policy.evaluate, params, obs, actions, state, starts[:3])
    raises("episode_starts", step, obs[0], state, starts[0, :4])
    raises("episode_starts", policy.values, params, obs[0], state, starts)
    # backward
    raises("cache", policy.backward, params, (1, 2, 3), ev.log_probs, None, ev.values)
    raises("d_values", policy.backward, params, ev.cache, ev.log_probs, None, np.zeros(3))
    raises("d_log_probs", policy.backward, params, ev.cache,
           np.full_like(ev.log_probs, np.nan), None, ev.values)
    raises("d_entropy", policy.backward, params, ev.cache, ev.log_probs, np.ones((6, 4)),
           ev.values)
    raises("rng", policy.predict, params, *one)



# ---------------------------------------------------------------- the update's passes

def _group(x, a, start, keep, envs):
    """A minibatch's ``data`` for the envs ``envs``: the C-contiguous gathers
    ppo_ref.fast.update.recurrent_minibatches makes of the arrays _update_passes returns."""
    c = np.ascontiguousarray
    return (c(x[:, envs]), c(a[:, envs]), LSTMStates(c(start.h[:, envs]), c(start.c[:, envs])),
            c(keep[:, envs]))


@pytest.mark.parametrize("space,shared,act", CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_update_passes_give_the_bits_of_evaluate_and_backward(rng, space, shared, act, dtype):
    """The fast update's passes (the rollout checked once, then evaluate/backward on gathered
    env groups) give exactly what the public evaluate and backward give for those envs, for
    groups of several sizes (a size seen before reuses its buffers) and for another parameter
    object; backward's one gradient FlatArrays per update is overwritten at every call."""
    policy = make_policy(space, lstm_shared=shared, activation=act, compute_dtype=dtype)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=6, n=5)
    x, a, start, keep, evaluate, backward = policy._update_passes(obs, actions, state, starts)
    returned = []
    for envs in ([3, 0], [1, 4, 2], [2, 4], [0, 1, 2, 3, 4]):
        if len(returned) == 3:  # another object (the values of the next Adam step, say)
            params = policy.as_flat(params)
            params.flat += 0.01 * rng.normal(size=params.flat.shape)
        log_probs, entropy, values, cache = evaluate(params, _group(x, a, start, keep, envs))
        want = policy.evaluate(params, obs[:, envs], actions[:, envs],
                               LSTMStates(state.h[:, envs], state.c[:, envs]), starts[:, envs])
        for got, ref in ((log_probs, want.log_probs), (entropy, want.entropy),
                         (values, want.values)):
            assert got.dtype == np.float64 and got.shape == (6 * len(envs),)
            np.testing.assert_array_equal(got, ref.reshape(-1))
        d = [rng.normal(size=(6, len(envs))) for _ in range(3)]
        for d_entropy in (d[1], None):
            grads = backward(params, cache, d[0].reshape(-1),
                             None if d_entropy is None else d_entropy.reshape(-1),
                             d[2].reshape(-1))
            ref = policy.backward(params, want.cache, d[0], d_entropy, d[2])
            assert list(grads) == list(ref) and grads.layout == ref.layout
            np.testing.assert_array_equal(grads.flat, ref.flat)
            returned.append(grads)
    assert all(g is returned[0] for g in returned)


def test_update_passes_check_the_rollout_once_and_params_when_they_change(rng):
    """The rollout is checked as evaluate checks it (the same errors); the parameters are
    checked in full at the first call and whenever another object (or a FlatArrays whose
    entries were replaced) is given."""
    policy = make_policy()
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy)
    bad_obs = obs.copy()
    bad_obs[2, 1, 0] = np.nan
    out_of_range = actions.copy()
    out_of_range[0, 3] = 3
    for args in ((bad_obs, actions, state, starts), (obs, out_of_range, state, starts),
                 (obs, actions + 0.5, state, starts), (obs[..., :2], actions, state, starts),
                 (obs, actions, LSTMStates(state.h[:1], state.c), starts),
                 (obs, actions, None, starts), (obs, actions, state, np.full((6, 5), 2)),
                 (obs, actions, state, starts[:3])):
        with pytest.raises(ValueError) as from_passes:
            policy._update_passes(*args)
        with pytest.raises(ValueError) as from_evaluate:
            policy.evaluate(params, *args)
        assert str(from_passes.value) == str(from_evaluate.value)
    x, a, start, keep, evaluate, _ = policy._update_passes(obs, actions, state, starts)
    data = _group(x, a, start, keep, [0, 1])
    evaluate(params, data)
    other = policy.as_flat(params)
    other["lstm_vf.w_hh"][0, 0] = np.inf
    with pytest.raises(ValueError, match=r"params\['lstm_vf.w_hh'\] must be finite"):
        evaluate(other, data)
    with pytest.raises(ValueError, match="as_flat"):
        evaluate(dict(params), data)
    params["pi.b0"] = np.zeros(8)  # no longer a view of its buffer
    with pytest.raises(ValueError, match="params"):
        evaluate(params, data)
    wider = make_policy(lstm_hidden_size=12)  # another LSTM width than this policy's states
    with pytest.raises(ValueError, match="state.h") as from_passes:
        evaluate(policy.as_flat(dict(wider.init_params(rng))), data)
    with pytest.raises(ValueError, match="state.h") as from_evaluate:
        policy.evaluate(policy.as_flat(dict(wider.init_params(rng))), obs[:, :2],
                        actions[:, :2], LSTMStates(state.h[:, :2], state.c[:, :2]),
                        starts[:, :2])
    assert str(from_passes.value) == str(from_evaluate.value)

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


# ---------------------------------------------------------------------------- float32 compute

@pytest.mark.parametrize("space,shared,act", [(BOX, True, "tanh"), (DISCRETE, False, "relu")])
def test_float32_compute_is_close_to_the_spec_policy(rng, space, shared, act):
    p32 = make_policy(space, lstm_shared=shared, activation=act, compute_dtype="float32")
    p64 = make_policy(space, lstm_shared=shared, activation=act)
    spec = spec_twin(p32)
    params = perturbed_params(rng, p32)
    data = make_data(rng, p32, T=8, n=4)
    e32, e64 = p32.evaluate(params, *data), p64.evaluate(params, *data)
    ref = spec.evaluate(dict(params), *data)
    assert isinstance(e32.cache, _FastCache) and e32.cache.x.dtype == np.float32
    assert e32.log_probs.dtype == np.float64
    assert not np.array_equal(e32.values, e64.values)      # really computed in float32
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_allclose(getattr(e32, name), getattr(ref, name), **F32, err_msg=name)
    w = [rng.normal(size=data[3].shape) for _ in range(3)]
    g32 = p32.backward(params, e32.cache, *w)
    assert g32.flat.dtype == np.float64 and g32.layout == params.layout
    assert_grads_close(g32, spec.backward(dict(params), ref.cache, *w), 2e-4)


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


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("space,shared", [(DISCRETE, False), (DISCRETE, True), (BOX, False)])
def test_evaluate_hidden_of_the_acted_states_is_evaluate_bit_for_bit(rng, dtype, space, shared):
    """The towers and head on the hidden states acting produced (evaluate_hidden) give the
    log-probs, entropies and values of evaluate's replay, bit for bit; a hidden array of the
    wrong shape or with a non-finite entry is refused naming it."""
    policy = make_policy(space, lstm_shared=shared, compute_dtype=dtype)
    params = perturbed_params(rng, policy)
    obs, actions, state, starts = make_data(rng, policy, T=7, n=6)
    step = policy.acting_step_fn(params)
    s, hidden = state, []
    for t in range(starts.shape[0]):
        _, s = step(obs[t], s, starts[t])
        hidden.append(s.h)
    hidden = np.stack(hidden, axis=1)                  # [L, T, n, H]
    got = policy.evaluate_hidden(params, hidden, actions)
    want = policy.evaluate(params, obs, actions, state, starts)
    assert got.cache is None
    for name in ("log_probs", "entropy", "values"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    with pytest.raises(ValueError, match="hidden"):
        policy.evaluate_hidden(params, hidden[:, :, :, :-1], actions)
    bad = hidden.copy()
    bad[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="hidden"):
        policy.evaluate_hidden(params, bad, actions)
    with pytest.raises(ValueError, match="actions"):
        policy.evaluate_hidden(params, hidden, actions[:-1])
