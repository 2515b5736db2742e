"""Tests of the readable LSTM (ppo_ref.spec.lstm) and LSTM actor-critic
(ppo_ref.spec.recurrent_networks).

Forward against the plain oracle of tests/oracles.py; BPTT against central differences and
against the oracle's forward-mode (Jacobian accumulation) gradient, a different derivation; the
step functions against the sequence functions; the reset semantics; argument validation (the
compiled twins are tests/test_tiers.py's rows).
"""
import ast

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gradcheck import check_gradients
from oracles import lstm_forward_oracle, lstm_gradient_oracle
from ppo_ref.spec import lstm as spec_lstm
from ppo_ref.spec import recurrent_networks as spec_rn
from ppo_ref.spec.lstm import (LSTMCache, LSTMStepCache, lstm_backward, lstm_forward, lstm_init,
                               lstm_step, step_backward, step_forward)
from ppo_ref.spec.recurrent_networks import (
    LSTMStates, initial_lstm_states, recurrent_actor_critic_backward,
    recurrent_actor_critic_forward, recurrent_actor_critic_init, recurrent_actor_critic_step,
    recurrent_value_step)


def make_problem(rng, n_steps, n_env, d_in, hidden, *, reset_prob=0.3):
    """Random parameters (non-zero bias), inputs, initial state and episode starts."""
    params = lstm_init(rng, d_in, hidden)
    params["b"] = 0.5 * rng.standard_normal(4 * hidden)
    x = rng.standard_normal((n_steps, n_env, d_in))
    h0 = 0.8 * rng.standard_normal((n_env, hidden))
    c0 = rng.standard_normal((n_env, hidden))
    starts = rng.random((n_steps, n_env)) < reset_prob
    return params, x, h0, c0, starts


def output_grads(rng, n_steps, n_env, hidden):
    return (rng.standard_normal((n_steps, n_env, hidden)), rng.standard_normal((n_env, hidden)),
            rng.standard_normal((n_env, hidden)))


def weighted_loss(params, x, h0, c0, starts, dh_seq, dh_T, dc_T):
    """L = <h_seq, dh_seq> + <h_T, dh_T> + <c_T, dc_T>: its gradients are lstm_backward's."""
    h_seq, (h_T, c_T), _ = lstm_forward(params, x, h0, c0, starts)
    total = float(np.sum(h_seq * dh_seq))
    if dh_T is not None:
        total += float(np.sum(h_T * dh_T))
    if dc_T is not None:
        total += float(np.sum(c_T * dc_T))
    return total


# ---------------------------------------------------------------------------------------------
# The readable tier itself
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [spec_lstm.__file__, spec_rn.__file__])
def test_spec_modules_do_not_import_numba(path):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "numba" for a in node.names), path
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "numba", path
            assert node.module != "ppo_ref._numba", path


@settings(max_examples=20)
@given(n_steps=st.integers(1, 6), n_env=st.integers(1, 3), d_in=st.integers(1, 4),
       hidden=st.integers(1, 5), reset_prob=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2**32 - 1))
def test_forward_matches_oracle(n_steps, n_env, d_in, hidden, reset_prob, seed):
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden,
                                             reset_prob=reset_prob)
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    want_seq, (want_h, want_c) = lstm_forward_oracle(params, x, h0, c0, starts)
    np.testing.assert_allclose(h_seq, want_seq, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(h_T, h_seq[-1])
    np.testing.assert_allclose(c_T, want_c, rtol=1e-12, atol=1e-14)
    assert isinstance(cache, LSTMCache)
    assert all(a.dtype == np.float64 for a in (h_seq, h_T, c_T))


@settings(max_examples=15)
@given(n_steps=st.integers(1, 6), n_env=st.integers(1, 3), d_in=st.integers(1, 3),
       hidden=st.integers(1, 4), reset_prob=st.sampled_from([0.0, 0.3, 1.0]),
       final_grads=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_bptt_matches_forward_mode_oracle(n_steps, n_env, d_in, hidden, reset_prob, final_grads,
                                          seed):
    """Every gradient of lstm_backward equals the forward-mode Jacobian accumulation of the
    oracle (no reverse recursion there), with and without dh_T / dc_T."""
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden,
                                             reset_prob=reset_prob)
    dh_seq, dh_T, dc_T = output_grads(rng, n_steps, n_env, hidden)
    if not final_grads:
        dh_T = dc_T = None
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    want_dx, want_grads, (want_dh0, want_dc0) = lstm_gradient_oracle(
        params, x, h0, c0, starts, dh_seq, dh_T, dc_T)
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, want_dx, **tol)
    np.testing.assert_allclose(dh0, want_dh0, **tol)
    np.testing.assert_allclose(dc0, want_dc0, **tol)
    assert list(grads) == ["w_ih", "w_hh", "b"]
    for k in params:
        np.testing.assert_allclose(grads[k], want_grads[k], err_msg=k, **tol)


def _resets_in_the_middle(rng, n_steps=7, n_env=3, d_in=3, hidden=4):
    params, x, h0, c0, _ = make_problem(rng, n_steps, n_env, d_in, hidden)
    starts = np.zeros((n_steps, n_env), dtype=bool)
    starts[3, 0] = True            # env 0: one reset in the middle
    starts[[2, 5], 1] = True       # env 1: two
    starts[0, 2] = True            # env 2: reset at step 0 (h0, c0 get no gradient)
    return params, x, h0, c0, starts


@pytest.mark.parametrize("final_grads", [True, False])
def test_lstm_backward_central_differences(rng, final_grads):
    """lstm_backward w.r.t. x, every weight, h0 and c0, resets in the middle, dh_T / dc_T given.

    The loss sums ~100 terms of order 1, so a central difference carries ~1e-10 of rounding;
    floor=1e-4 compares entries smaller than that absolutely (to 1e-9)."""
    params, x, h0, c0, starts = _resets_in_the_middle(rng)
    dh_seq, dh_T, dc_T = output_grads(rng, *x.shape[:2], h0.shape[1])
    if not final_grads:
        dh_T = dc_T = None
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    check_gradients(lambda: weighted_loss(params, x, h0, c0, starts, dh_seq, dh_T, dc_T),
                    {"x": x, "h0": h0, "c0": c0, **params},
                    {"x": dx, "h0": dh0, "c0": dc0, **grads}, floor=1e-4, rng=rng)
    assert not dh0[2].any() and not dc0[2].any()
    assert dh0[0].any() and dc0[1].any()


def test_step_backward_central_differences(rng):
    params, x, h0, c0, starts = make_problem(rng, 1, 4, 3, 5)
    starts = np.array([False, True, False, True])
    dh_new, dc_new = rng.standard_normal((2, 4, 5))

    def f():
        h_new, c_new, _ = step_forward(params, x[0], h0, c0, starts)
        return float(np.sum(h_new * dh_new) + np.sum(c_new * dc_new))

    _, _, cache = step_forward(params, x[0], h0, c0, starts)
    assert isinstance(cache, LSTMStepCache)
    dx, grads, dh, dc = step_backward(params, cache, dh_new, dc_new)
    check_gradients(f, {"x": x[0], "h": h0, "c": c0, **params},
                    {"x": dx, "h": dh, "c": dc, **grads}, floor=1e-4, rng=rng)
    np.testing.assert_array_equal(dh[starts], 0.0)
    np.testing.assert_array_equal(dc[starts], 0.0)


@settings(max_examples=15)
@given(n_steps=st.integers(1, 7), n_env=st.integers(1, 3), hidden=st.integers(1, 4),
       reset_prob=st.sampled_from([0.0, 0.4, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_step_by_step_equals_whole_sequence(n_steps, n_env, hidden, reset_prob, seed):
    """step_forward / lstm_step chained over t give lstm_forward's states exactly (the same
    step), and step_backward chained back over t gives lstm_backward's gradients (the weight
    gradients summed per step instead of in one product: equal to rounding)."""
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, 3, hidden,
                                             reset_prob=reset_prob)
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    h, c = h0, c0
    hs, cs, caches = h0, c0, []
    for t in range(n_steps):
        h, c, step_cache = step_forward(params, x[t], h, c, starts[t])
        hs, cs = lstm_step(params, x[t], hs, cs, starts[t])
        np.testing.assert_array_equal(h, h_seq[t])
        np.testing.assert_array_equal(hs, h_seq[t])
        np.testing.assert_array_equal(cs, c)
        caches.append(step_cache)
    np.testing.assert_array_equal(c, c_T)
    np.testing.assert_array_equal(h, h_T)

    dh_seq, dh_T, dc_T = output_grads(rng, n_steps, n_env, hidden)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    dh, dc = dh_T, dc_T
    step_grads = {k: np.zeros_like(v) for k, v in params.items()}
    for t in reversed(range(n_steps)):
        dx_t, g, dh, dc = step_backward(params, caches[t], dh_seq[t] + dh, dc)
        np.testing.assert_allclose(dx_t, dx[t], rtol=1e-12, atol=1e-14)
        for k in step_grads:
            step_grads[k] += g[k]
    np.testing.assert_allclose(dh, dh0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dc, dc0, rtol=1e-12, atol=1e-14)
    for k in params:
        np.testing.assert_allclose(step_grads[k], grads[k], rtol=1e-12, atol=1e-13, err_msg=k)


@pytest.mark.parametrize("split", [1, 3, 5])
def test_one_trace_with_a_reset_equals_the_two_episodes_run_separately(rng, split):
    """A reset at ``split`` makes the trace two independent runs: the first episode from
    (h0, c0), the second from the zero state; the gradients are those of the two runs (the
    second contributes nothing to dh0, dc0; the first gets no gradient from the second)."""
    n_steps, n_env, hidden = 6, 2, 4
    params, x, h0, c0, _ = make_problem(rng, n_steps, n_env, 3, hidden)
    starts = np.zeros((n_steps, n_env), dtype=bool)
    starts[split] = True
    dh_seq, dh_T, dc_T = output_grads(rng, n_steps, n_env, hidden)
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)

    first = lstm_forward(params, x[:split], h0, c0, starts[:split])
    zeros = np.zeros((n_env, hidden))
    second = lstm_forward(params, x[split:], zeros, zeros, np.zeros((n_steps - split, n_env)))
    np.testing.assert_array_equal(h_seq, np.concatenate([first[0], second[0]]))
    np.testing.assert_array_equal(h_T, second[1][0])
    np.testing.assert_array_equal(c_T, second[1][1])
    dx1, g1, (dh0_1, dc0_1) = lstm_backward(params, first[2], dh_seq[:split])
    dx2, g2, _ = lstm_backward(params, second[2], dh_seq[split:], dh_T, dc_T)
    np.testing.assert_allclose(dx, np.concatenate([dx1, dx2]), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dh0, dh0_1, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dc0, dc0_1, rtol=1e-13, atol=1e-15)
    for k in params:
        np.testing.assert_allclose(grads[k], g1[k] + g2[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_garbage_state_before_a_reset_is_ignored(rng):
    params, x, h0, c0, _ = make_problem(rng, 4, 2, 3, 3)
    starts = np.zeros((4, 2), dtype=bool)
    starts[0] = True
    dh_seq = rng.standard_normal((4, 2, 3))
    a = lstm_forward(params, x, h0, c0, starts)
    b = lstm_forward(params, x, 1e3 * h0, -1e3 * c0, starts)
    np.testing.assert_array_equal(a[0], b[0])
    _, _, (dh0, dc0) = lstm_backward(params, a[2], dh_seq)
    np.testing.assert_array_equal(dh0, 0.0)
    np.testing.assert_array_equal(dc0, 0.0)


def test_saturated_gates_stay_finite_without_warnings(rng):
    params, x, h0, c0, starts = make_problem(rng, 3, 2, 2, 3)
    params = {k: 1e3 * v for k, v in params.items()}
    with np.errstate(all="raise"):
        h_seq, (h_T, c_T), cache = lstm_forward(params, 1e3 * x, h0, c0, starts)
        dx, grads, (dh0, dc0) = lstm_backward(params, cache, np.ones_like(h_seq))
    for a in (h_seq, c_T, dx, dh0, dc0, *grads.values()):
        assert np.isfinite(a).all()


def test_nothing_is_mutated(rng):
    params, x, h0, c0, starts = make_problem(rng, 4, 2, 3, 3)
    dh_seq, dh_T, dc_T = output_grads(rng, 4, 2, 3)
    before = [a.copy() for a in (*params.values(), x, h0, c0, starts, dh_seq, dh_T, dc_T)]
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    _, _, step_cache = step_forward(params, x[0], h0, c0, starts[0])
    step_backward(params, step_cache, dh_T, dc_T)
    lstm_step(params, x[0], h0, c0, starts[0])
    after = (*params.values(), x, h0, c0, starts, dh_seq, dh_T, dc_T)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_flag_and_input_dtypes_agree(rng):
    params, x, h0, c0, starts = make_problem(rng, 5, 3, 2, 3)
    want = lstm_forward(params, x, h0, c0, starts)[0]
    np.testing.assert_array_equal(lstm_forward(params, x, h0, c0, starts.astype(float))[0], want)
    np.testing.assert_array_equal(lstm_forward(params, x, h0, c0, starts.astype(int))[0], want)
    got = lstm_forward(params, x.astype(np.float32), h0, c0, starts)[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, lstm_forward(params, x.astype(np.float32).astype(float),
                                                    h0, c0, starts)[0])


@pytest.mark.parametrize("d_in,hidden", [(1, 1), (3, 5), (8, 2)])
def test_init_shapes_and_zero_bias(d_in, hidden):
    a = lstm_init(np.random.default_rng(7), d_in, hidden)
    assert list(a) == ["w_ih", "w_hh", "b"]
    assert a["w_ih"].shape == (4 * hidden, d_in) and a["w_hh"].shape == (4 * hidden, hidden)
    assert not a["b"].any()


# ---------------------------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------------------------

def _good(rng):
    params, x, h0, c0, starts = make_problem(rng, 3, 2, 4, 5)
    return params, x, h0, c0, starts


def _with(params, **changes):
    out = dict(params)
    out.update(changes)
    return out


@pytest.mark.parametrize("case,name", [
    ("params_not_dict", "params"), ("params_missing", "params"), ("w_hh_shape", "w_hh"),
    ("w_ih_rows", "w_ih"), ("b_shape", "params\\['b'\\]"), ("x_rank", "x"),
    ("x_features", "x"), ("x_empty", "x"), ("x_nan", "x"), ("h0_shape", "h0"),
    ("c0_inf", "c0"), ("starts_shape", "episode_starts"), ("starts_value", "episode_starts")])
def test_forward_rejects_bad_arguments(rng, case, name):
    params, x, h0, c0, starts = _good(rng)
    args = {"params": params, "x": x, "h0": h0, "c0": c0, "episode_starts": starts}
    bad_x = x.copy()
    bad_x[1, 0, 2] = np.nan
    bad_c0 = c0.copy()
    bad_c0[0, 0] = np.inf
    args.update({
        "params_not_dict": {"params": [1, 2]},
        "params_missing": {"params": {"w_ih": params["w_ih"]}},
        "w_hh_shape": {"params": _with(params, w_hh=params["w_hh"][:, :4])},
        "w_ih_rows": {"params": _with(params, w_ih=params["w_ih"][:8])},
        "b_shape": {"params": _with(params, b=params["b"][:3])},
        "x_rank": {"x": x[0]},
        "x_features": {"x": x[..., :2]},
        "x_empty": {"x": x[:0], "episode_starts": starts[:0]},
        "x_nan": {"x": bad_x},
        "h0_shape": {"h0": h0[:1]},
        "c0_inf": {"c0": bad_c0},
        "starts_shape": {"episode_starts": starts[:2]},
        "starts_value": {"episode_starts": np.full(starts.shape, 0.5)},
    }[case])
    with pytest.raises(ValueError, match=name):
        lstm_forward(**args)


@pytest.mark.parametrize("case,name", [("x", "x"), ("h", "h"), ("c", "c"),
                                       ("episode_starts", "episode_starts")])
def test_step_rejects_bad_arguments(rng, case, name):
    params, x, h0, c0, starts = _good(rng)
    args = {"x": x[0], "h": h0, "c": c0, "episode_starts": starts[0]}
    args[case] = {"x": x[0, :, :3], "h": h0.T, "c": c0[None],
                  "episode_starts": np.array([2, 0])}[case]
    with pytest.raises(ValueError, match=name):
        step_forward(params, **args)
    with pytest.raises(ValueError, match=name):
        lstm_step(params, **args)


def test_backward_rejects_bad_arguments(rng):
    params, x, h0, c0, starts = _good(rng)
    h_seq, _, cache = lstm_forward(params, x, h0, c0, starts)
    _, _, step_cache = step_forward(params, x[0], h0, c0, starts[0])
    dh = np.ones_like(h_seq)
    with pytest.raises(ValueError, match="cache"):
        lstm_backward(params, step_cache, dh)
    with pytest.raises(ValueError, match="cache"):
        lstm_backward(params, tuple(cache), dh)
    with pytest.raises(ValueError, match="cache"):
        step_backward(params, cache, h0, c0)
    with pytest.raises(ValueError, match="params do not match cache"):
        lstm_backward(lstm_init(rng, 4, 3), cache, dh)
    with pytest.raises(ValueError, match="dh_seq"):
        lstm_backward(params, cache, dh[:, :1])
    with pytest.raises(ValueError, match="dh_seq"):
        lstm_backward(params, cache, np.full_like(dh, np.nan))
    with pytest.raises(ValueError, match="dh_T"):
        lstm_backward(params, cache, dh, dh_T=h0[:1])
    with pytest.raises(ValueError, match="dc_T"):
        lstm_backward(params, cache, dh, dc_T=np.full_like(c0, np.inf))
    with pytest.raises(ValueError, match="dh_new"):
        step_backward(params, step_cache, h0[:, :2], c0)
    with pytest.raises(ValueError, match="dc_new"):
        step_backward(params, step_cache, h0, c0[:1])


@pytest.mark.parametrize("args,name", [((None, 2, 3), "rng"), ((0, 2, 3), "rng"),
                                       (("rng", 0, 3), "input_size"),
                                       (("rng", 2, True), "hidden_size"),
                                       (("rng", 2, 1.5), "hidden_size")])
def test_init_rejects_bad_arguments(args, name):
    args = tuple(np.random.default_rng(0) if a == "rng" else a for a in args)
    with pytest.raises(ValueError, match=name):
        lstm_init(*args)


# ---------------------------------------------------------------------------------------------
# The LSTM actor-critic (ppo_ref.spec.recurrent_networks)
# ---------------------------------------------------------------------------------------------

def _network(rng, lstm_shared, T=6, N=4, D=3, P=2, H=5, net_arch=(4,)):
    params = recurrent_actor_critic_init(rng, D, P, hidden_size=H, lstm_shared=lstm_shared,
                                         net_arch=net_arch, policy_gain=1.0)
    # non-zero biases: with zero ones a relu unit whose inputs are all dead sits exactly on
    # its kink, where central differences are meaningless
    params = {k: v + 0.3 * rng.standard_normal(v.shape) if k.split(".")[1].startswith("b")
              else v for k, v in params.items()}
    obs = rng.standard_normal((T, N, D))
    starts = rng.random((T, N)) < 0.3
    starts[T // 2, 0] = True
    L = 1 if lstm_shared else 2
    state = LSTMStates(rng.standard_normal((L, N, H)), rng.standard_normal((L, N, H)))
    return params, obs, starts, state


def _sub(params, prefix):
    return {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(prefix + ".")}


@pytest.mark.parametrize("lstm_shared", [False, True])
def test_network_stepping_equals_the_sequence(rng, lstm_shared):
    params, obs, starts, state = _network(rng, lstm_shared)
    out, values, final, _ = recurrent_actor_critic_forward(params, obs, state, starts,
                                                           "tanh", lstm_shared)
    s = state
    for t in range(obs.shape[0]):
        v = recurrent_value_step(params, obs[t], s, starts[t], "tanh", lstm_shared)
        o, v2, s = recurrent_actor_critic_step(params, obs[t], s, starts[t], "tanh", lstm_shared)
        np.testing.assert_array_equal(o, out[t])
        np.testing.assert_array_equal(v2, values[t])
        np.testing.assert_array_equal(v, values[t])
    np.testing.assert_array_equal(s.h, final.h)
    np.testing.assert_array_equal(s.c, final.c)
    o, v, _ = recurrent_actor_critic_step(params, obs[0], state, starts[0], "tanh", lstm_shared,
                                          with_values=False)
    assert v is None


@pytest.mark.parametrize("lstm_shared,net_arch,activation", [
    (False, (4,), "tanh"), (True, (4,), "tanh"), (False, (), "tanh"), (True, (3, 4), "relu")])
def test_network_backward_central_differences(rng, lstm_shared, net_arch, activation):
    params, obs, starts, state = _network(rng, lstm_shared, net_arch=net_arch)
    w_pi = rng.standard_normal((6, 4, 2))
    w_v = rng.standard_normal((6, 4))

    def f():
        out, values, _, _ = recurrent_actor_critic_forward(params, obs, state, starts,
                                                           activation, lstm_shared)
        return float(np.sum(out * w_pi) + np.sum(values * w_v))

    _, _, _, cache = recurrent_actor_critic_forward(params, obs, state, starts, activation,
                                                    lstm_shared)
    grads = recurrent_actor_critic_backward(params, cache, w_pi, w_v)
    assert list(grads) == list(params)
    # floor 1e-4: f is O(10), so a central difference carries ~1e-9 of rounding; entries
    # below the floor are compared absolutely.
    check_gradients(f, params, grads, floor=1e-4, rng=rng)


def test_network_initial_states(rng):
    for shared, L in ((False, 2), (True, 1)):
        params = recurrent_actor_critic_init(rng, 3, 2, hidden_size=5, lstm_shared=shared)
        state = initial_lstm_states(params, 4, shared)
        assert state.h.shape == state.c.shape == (L, 4, 5)
        assert not state.h.any() and not state.c.any()
        with pytest.raises(ValueError, match="lstm_shared"):
            initial_lstm_states(params, 4, not shared)
        with pytest.raises(ValueError, match="n_envs"):
            initial_lstm_states(params, 0, shared)


def test_network_rejects_bad_arguments(rng):
    params, obs, starts, state = _network(rng, False)
    forward = recurrent_actor_critic_forward
    with pytest.raises(ValueError, match="obs"):
        forward(params, obs[0], state, starts)
    with pytest.raises(ValueError, match="obs"):
        forward(params, obs[..., :2], state, starts)
    with pytest.raises(ValueError, match="state.h"):
        forward(params, obs[:, :2], state, starts[:, :2])
    with pytest.raises(ValueError, match="state.c"):
        forward(params, obs, LSTMStates(state.h, np.full_like(state.c, np.nan)), starts)
    with pytest.raises(ValueError, match="state"):
        forward(params, obs, state.h, starts)
    with pytest.raises(ValueError, match="episode_starts"):
        forward(params, obs, state, starts[:3])
    with pytest.raises(ValueError, match="lstm_shared"):
        forward(params, obs, state, starts, lstm_shared=True)
    with pytest.raises(ValueError, match="activation"):
        forward(params, obs, state, starts, activation="sigmoid")
    with pytest.raises(ValueError, match="log_std"):
        forward({**params, "log_std": np.zeros(2)}, obs, state, starts)
    with pytest.raises(ValueError, match="lstm_vf.b"):
        forward({k: v for k, v in params.items() if k != "lstm_vf.b"}, obs, state, starts)
    with pytest.raises(ValueError, match="episode_starts"):
        recurrent_actor_critic_step(params, obs[0], state, np.full(4, 2))
    with pytest.raises(ValueError, match="obs"):
        recurrent_value_step(params, obs, state, starts[0])
    out, values, _, cache = forward(params, obs, state, starts)
    backward = recurrent_actor_critic_backward
    with pytest.raises(ValueError, match="cache"):
        backward(params, tuple(cache), out, values)
    with pytest.raises(ValueError, match="d_values"):
        backward(params, cache, out, values[:, :2])
    with pytest.raises(ValueError, match="d_values"):
        backward(params, cache, out, np.full_like(values, np.inf))
    with pytest.raises(ValueError, match="d_policy_out"):
        backward(params, cache, out[..., :1], values)
    with pytest.raises(ValueError, match="d_policy_out"):
        backward(params, cache, out[0], values)
