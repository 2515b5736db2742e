"""Tests of ppo_ref.fast.lstm (the compiled LSTM): forward against a slow oracle in the cell's own
notation, every gradient against central differences, the reset semantics (a reset equals a fresh
sequence, a garbage state before a reset is ignored and gets exactly zero gradient), step-by-step
equals whole-sequence, truncated BPTT composes through dh_T / dc_T, no mutation, argument
validation."""
import os
import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gradcheck import check_gradients
from ppo_ref._numba import njit
from ppo_ref.fast import lstm as lstm_mod
from ppo_ref.fast.lstm import LSTMCache, lstm_backward, lstm_forward, lstm_step
from ppo_ref.spec.lstm import lstm_init


# ---------------------------------------------------------------------------------------------
# Oracle: the cell written exactly as the equations (sigmoid = 1 / (1 + exp(-z))), one env and
# one step at a time, no vectorisation tricks.
# ---------------------------------------------------------------------------------------------

def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def oracle_forward(params, x, h0, c0, episode_starts):
    w_ih, w_hh, b = params["w_ih"], params["w_hh"], params["b"]
    n_steps, n_env, _ = x.shape
    hidden = w_hh.shape[1]
    h_seq = np.zeros((n_steps, n_env, hidden))
    c_last = np.zeros((n_env, hidden))
    for n in range(n_env):
        h, c = h0[n].copy(), c0[n].copy()
        for t in range(n_steps):
            if episode_starts[t, n]:
                h, c = np.zeros(hidden), np.zeros(hidden)
            z = w_ih @ x[t, n] + w_hh @ h + b
            i = _sigmoid(z[0:hidden])
            f = _sigmoid(z[hidden:2 * hidden])
            g = np.tanh(z[2 * hidden:3 * hidden])
            o = _sigmoid(z[3 * hidden:4 * hidden])
            c = f * c + i * g
            h = o * np.tanh(c)
            h_seq[t, n] = h
        c_last[n] = c
    return h_seq, c_last


def make_problem(rng, n_steps, n_env, d_in, hidden, *, reset_prob=0.3, scale=1.0):
    """Random parameters (non-zero bias), inputs, initial state and episode starts."""
    params = lstm_init(rng, d_in, hidden)
    params = {k: v * scale for k, v in params.items()}
    params["b"] = 0.5 * rng.standard_normal(4 * hidden)
    x = rng.standard_normal((n_steps, n_env, d_in))
    h0 = 0.8 * rng.standard_normal((n_env, hidden))
    c0 = rng.standard_normal((n_env, hidden))
    starts = rng.random((n_steps, n_env)) < reset_prob
    return params, x, h0, c0, starts


def weighted_loss(params, x, h0, c0, starts, dh_seq, dh_T, dc_T):
    """L = <h_seq, dh_seq> + <h_T, dh_T> + <c_T, dc_T>: its gradients are the backward's."""
    h_seq, (h_T, c_T), _ = lstm_forward(params, x, h0, c0, starts)
    total = float(np.sum(h_seq * dh_seq))
    if dh_T is not None:
        total += float(np.sum(h_T * dh_T))
    if dc_T is not None:
        total += float(np.sum(c_T * dc_T))
    return total


def run_gradcheck(rng, params, x, h0, c0, starts, dh_seq, dh_T, dc_T, max_coords=40):
    """Check every gradient. The loss sums up to ~100 terms of order 1, so each central
    difference carries ~1e-10 of rounding noise; ``floor=1e-4`` compares gradients smaller than
    1e-4 absolutely (to 1e-9) instead of relatively (with the default floor, random problems
    failed on gradients of ~1e-6 at a rate of about 1 in 300)."""
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    f = lambda: weighted_loss(params, x, h0, c0, starts, dh_seq, dh_T, dc_T)  # noqa: E731
    return check_gradients(
        f, {"x": x, "h0": h0, "c0": c0, **params},
        {"x": dx, "h0": dh0, "c0": dc0, **grads}, max_coords=max_coords, floor=1e-4, rng=rng)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

@settings(max_examples=25)
@given(n_steps=st.integers(1, 7), n_env=st.integers(1, 4), d_in=st.integers(1, 5),
       hidden=st.integers(1, 6), reset_prob=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2**32 - 1))
def test_forward_matches_oracle(n_steps, n_env, d_in, hidden, reset_prob, seed):
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden,
                                             reset_prob=reset_prob)
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    want_h, want_c = oracle_forward(params, x, h0, c0, starts)
    np.testing.assert_allclose(h_seq, want_h, rtol=0, atol=1e-14)
    np.testing.assert_allclose(c_T, want_c, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(h_T, h_seq[-1])
    assert isinstance(cache, LSTMCache)
    assert h_seq.dtype == h_T.dtype == c_T.dtype == np.float64


def test_saturated_gates_stay_finite_without_warnings(rng):
    params, x, h0, c0, starts = make_problem(rng, 4, 3, 2, 3)
    x = 1e4 * x  # pre-activations far beyond exp's overflow point (|z| > 709)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
        dx, grads, (dh0, dc0) = lstm_backward(params, cache, np.ones_like(h_seq))
    with np.errstate(over="ignore"):
        want_h, want_c = oracle_forward(params, x, h0, c0, starts)
    np.testing.assert_allclose(h_seq, want_h, rtol=0, atol=1e-14)
    for arr in (h_seq, c_T, dx, dh0, dc0, *grads.values()):
        assert np.isfinite(arr).all()
    assert np.abs(cache.gates).max() <= 1.0


def test_float_int_and_bool_episode_starts_agree(rng):
    params, x, h0, c0, starts = make_problem(rng, 6, 3, 2, 4)
    dh_seq = rng.standard_normal((6, 3, 4))
    results = []
    for flags in (starts, starts.astype(np.float64), starts.astype(np.int64),
                  starts.astype(np.float32)):
        h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, flags)
        dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq)
        results.append((h_seq, c_T, dx, grads["w_hh"], dh0, dc0))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_float32_inputs_are_computed_in_float64(rng):
    params, x, h0, c0, starts = make_problem(rng, 3, 2, 3, 4)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    args32 = [a.astype(np.float32) for a in (x, h0, c0)]
    h32, (_, c32), cache = lstm_forward(p32, *args32, starts)
    p64 = {k: v.astype(np.float64) for k, v in p32.items()}
    h64, (_, c64), _ = lstm_forward(p64, *[a.astype(np.float64) for a in args32], starts)
    assert h32.dtype == c32.dtype == cache.gates.dtype == np.float64
    np.testing.assert_array_equal(h32, h64)
    np.testing.assert_array_equal(c32, c64)


# ---------------------------------------------------------------------------------------------
# Gradients (central differences, float64)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag_dtype", [np.bool_, np.float64])
def test_gradients_every_input_with_resets_inside(rng, flag_dtype):
    n_steps, n_env, d_in, hidden = 7, 3, 4, 5
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.0)
    starts[3, 0] = starts[5, 1] = starts[1, 1] = True  # resets inside; env 2 never resets
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_T = rng.standard_normal((n_env, hidden))
    dc_T = rng.standard_normal((n_env, hidden))
    run_gradcheck(rng, params, x, h0, c0, starts.astype(flag_dtype), dh_seq, dh_T, dc_T)


@pytest.mark.parametrize("which", ["dh_T", "dc_T"])
def test_gradients_through_final_state_only(rng, which):
    """A loss on h_T or c_T alone (dh_seq = 0): all gradients flow in through dh_T / dc_T."""
    n_steps, n_env, d_in, hidden = 6, 2, 3, 4
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.0)
    starts[2, 1] = True
    dh_seq = np.zeros((n_steps, n_env, hidden))
    g = rng.standard_normal((n_env, hidden))
    dh_T, dc_T = (g, None) if which == "dh_T" else (None, g)
    run_gradcheck(rng, params, x, h0, c0, starts, dh_seq, dh_T, dc_T)
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    assert np.abs(dx[:, 0]).max() > 0  # env 0 never resets: gradient reaches every step
    assert np.abs(dh0[0]).max() > 0 and np.abs(dc0[0]).max() > 0
    np.testing.assert_array_equal(dx[:2, 1], 0.0)  # env 1 reset at t = 2: nothing before it
    np.testing.assert_array_equal(dh0[1], 0.0)
    np.testing.assert_array_equal(dc0[1], 0.0)


@settings(max_examples=15)
@given(n_steps=st.integers(1, 6), n_env=st.integers(1, 3), d_in=st.integers(1, 4),
       hidden=st.integers(1, 5), reset_prob=st.sampled_from([0.0, 0.25, 0.6, 1.0]),
       final_grads=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_gradients_property(n_steps, n_env, d_in, hidden, reset_prob, final_grads, seed):
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden,
                                             reset_prob=reset_prob)
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_T = rng.standard_normal((n_env, hidden)) if final_grads else None
    dc_T = rng.standard_normal((n_env, hidden)) if final_grads else None
    run_gradcheck(rng, params, x, h0, c0, starts, dh_seq, dh_T, dc_T, max_coords=12)


def test_bias_gradient_is_sum_of_gate_gradients(rng):
    """db is the gradient of torch's b_ih and b_hh alike; dw_ih = sum dz^T x, so with x = 1 in
    one feature column dw_ih[:, k] equals db."""
    params, x, h0, c0, starts = make_problem(rng, 5, 3, 2, 4)
    x[..., 1] = 1.0
    h_seq, _, cache = lstm_forward(params, x, h0, c0, starts)
    _, grads, _ = lstm_backward(params, cache, rng.standard_normal(h_seq.shape))
    np.testing.assert_allclose(grads["w_ih"][:, 1], grads["b"], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Reset semantics
# ---------------------------------------------------------------------------------------------

@settings(max_examples=20)
@given(n_steps=st.integers(2, 8), split=st.integers(1, 7), n_env=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_reset_inside_equals_two_independent_sequences(n_steps, split, n_env, seed):
    split = min(split, n_steps - 1)
    rng = np.random.default_rng(seed)
    d_in, hidden = 3, 4
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.2)
    starts[split] = True  # every env starts a new episode at `split`
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_T = rng.standard_normal((n_env, hidden))
    dc_T = rng.standard_normal((n_env, hidden))
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)

    # First part from (h0, c0); second from the zero state with its own starts.
    h_a, _, cache_a = lstm_forward(params, x[:split], h0, c0, starts[:split])
    zeros = np.zeros((n_env, hidden))
    h_b, (h_Tb, c_Tb), cache_b = lstm_forward(params, x[split:], zeros, zeros, starts[split:])
    np.testing.assert_allclose(h_seq, np.concatenate([h_a, h_b]), rtol=0, atol=1e-14)
    np.testing.assert_allclose(c_T, c_Tb, rtol=0, atol=1e-14)
    dx_a, g_a, (dh0_a, dc0_a) = lstm_backward(params, cache_a, dh_seq[:split])
    dx_b, g_b, _ = lstm_backward(params, cache_b, dh_seq[split:], dh_T, dc_T)
    np.testing.assert_allclose(dx, np.concatenate([dx_a, dx_b]), rtol=1e-12, atol=1e-14)
    for k in grads:
        np.testing.assert_allclose(grads[k], g_a[k] + g_b[k], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dh0, dh0_a, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dc0, dc0_a, rtol=1e-12, atol=1e-14)


def test_garbage_state_is_ignored_after_reset(rng):
    n_steps, n_env, d_in, hidden = 6, 4, 3, 5
    params, x, _, _, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.0)
    starts[0, [0, 2]] = True  # envs 0 and 2 start an episode at t = 0
    zeros = np.zeros((n_env, hidden))
    garbage_h = 0.5 * rng.standard_normal((n_env, hidden))  # envs 1, 3: a real carried state
    garbage_c = rng.standard_normal((n_env, hidden))
    garbage_h[[0, 2]] = 1e6 * rng.standard_normal((2, hidden))  # envs 0, 2: garbage
    garbage_c[[0, 2]] = -1e6 * rng.standard_normal((2, hidden))
    h_clean, (_, c_clean), _ = lstm_forward(params, x, zeros, zeros, starts)
    h_dirty, (_, c_dirty), cache = lstm_forward(params, x, garbage_h, garbage_c, starts)
    for n in (0, 2):
        np.testing.assert_array_equal(h_dirty[:, n], h_clean[:, n])
        np.testing.assert_array_equal(c_dirty[n], c_clean[n])
    assert not np.allclose(h_dirty[:, 1], h_clean[:, 1])  # env 1 does carry its state
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    _, _, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_seq[-1], dh_seq[0])
    for n in (0, 2):  # the gradient w.r.t. an ignored state is exactly zero
        assert np.all(dh0[n] == 0.0) and np.all(dc0[n] == 0.0)
    assert np.abs(dh0[1]).max() > 0 and np.abs(dc0[3]).max() > 0


def test_gradient_stops_at_a_reset_inside(rng):
    """Losses after a reset at t = k send exactly zero gradient to x[:k], h0 and c0."""
    n_steps, n_env, d_in, hidden, k = 7, 2, 3, 4, 4
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.0)
    starts[k] = True
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_seq[:k] = 0.0
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, _, (dh0, dc0) = lstm_backward(params, cache, dh_seq, rng.standard_normal((n_env, hidden)),
                                      rng.standard_normal((n_env, hidden)))
    assert np.all(dx[:k] == 0.0) and np.all(dh0 == 0.0) and np.all(dc0 == 0.0)
    assert np.abs(dx[k:]).min() > 0


# ---------------------------------------------------------------------------------------------
# Step-by-step, truncated BPTT, no mutation
# ---------------------------------------------------------------------------------------------

@settings(max_examples=20)
@given(n_steps=st.integers(1, 8), n_env=st.integers(1, 4), d_in=st.integers(1, 4),
       hidden=st.integers(1, 5), reset_prob=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2**32 - 1))
def test_step_by_step_equals_whole_sequence(n_steps, n_env, d_in, hidden, reset_prob, seed):
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden,
                                             reset_prob=reset_prob)
    h_seq, (h_T, c_T), _ = lstm_forward(params, x, h0, c0, starts)
    h, c = h0, c0
    h1, c1 = h0, c0
    for t in range(n_steps):
        h, c = lstm_step(params, x[t], h, c, starts[t])
        y, (h1, c1), _ = lstm_forward(params, x[t:t + 1], h1, c1, starts[t:t + 1])
        # one compiled recursion for all three: the same bits
        np.testing.assert_array_equal(h, h_seq[t])
        np.testing.assert_array_equal(y[0], h_seq[t])
    np.testing.assert_array_equal(c, c_T)
    np.testing.assert_array_equal(c1, c_T)
    np.testing.assert_array_equal(h1, h_T)


@settings(max_examples=15)
@given(n_env=st.integers(2, 9), hidden=st.sampled_from([1, 3, 4, 8]), d_in=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
def test_an_envs_results_do_not_depend_on_the_other_envs(n_env, hidden, d_in, seed):
    """Every env's outputs and gradients are the same bits whichever envs share the call (the
    recurrent trainer relies on it: a minibatch of envs replays the collection exactly)."""
    rng = np.random.default_rng(seed)
    params, x, h0, c0, starts = make_problem(rng, 6, n_env, d_in, hidden)
    dh_seq = rng.standard_normal((6, n_env, hidden))
    h_seq, (_, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    dx, _, (dh0, dc0) = lstm_backward(params, cache, dh_seq)
    envs = np.sort(rng.choice(n_env, size=int(rng.integers(1, n_env)), replace=False))
    h_sub, (_, c_sub), cache_sub = lstm_forward(params, x[:, envs], h0[envs], c0[envs],
                                                starts[:, envs])
    dx_sub, _, (dh0_sub, dc0_sub) = lstm_backward(params, cache_sub, dh_seq[:, envs])
    np.testing.assert_array_equal(h_sub, h_seq[:, envs])
    np.testing.assert_array_equal(c_sub, c_T[envs])
    np.testing.assert_array_equal(dh0_sub, dh0[envs])
    np.testing.assert_array_equal(dc0_sub, dc0[envs])
    np.testing.assert_allclose(dx_sub, dx[:, envs], rtol=1e-13, atol=1e-15)  # BLAS after loop


def test_tanh_kernel_is_accurate_bounded_and_odd():
    """The module's vectorizable tanh against NumPy's: within 3 units in the last place over
    arguments from 1e-300 to beyond saturation; never above 1 in magnitude; odd; +-inf -> +-1."""
    rng = np.random.default_rng(0)
    scales = 10.0 ** rng.uniform(-12, 1.6, size=200_000)
    special = [0.0, 1e-300, 0.55, 0.5500000000000001, 19.0, 20.0, 21.0, 700.0, 1e300, np.inf]
    a = np.concatenate([rng.standard_normal(200_000) * scales, special])
    a = np.concatenate([a, -a])
    out = np.empty_like(a)
    _tanh_loop(a, out)
    want = np.tanh(a)
    ulps = np.abs(out - want) / np.spacing(np.maximum(np.abs(want), np.finfo(float).tiny))
    assert ulps.max() <= 3.0, ulps.max()
    assert np.abs(out).max() <= 1.0
    np.testing.assert_array_equal(out[: a.size // 2], -out[a.size // 2:])


@njit
def _tanh_loop(a, out):
    for i in range(a.size):
        out[i] = lstm_mod._tanh(a[i])


@pytest.mark.parametrize("split", [1, 3, 5])
def test_truncated_bptt_composes_through_dh_T_dc_T(rng, split):
    """Backward over [split:] then over [:split] with (dh_T, dc_T) = (dh0, dc0) of the later
    segment equals one backward over the whole sequence."""
    n_steps, n_env, d_in, hidden = 6, 3, 2, 4
    params, x, h0, c0, starts = make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob=0.15)
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_T = rng.standard_normal((n_env, hidden))
    dc_T = rng.standard_normal((n_env, hidden))
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)

    h_a, (h_mid, c_mid), cache_a = lstm_forward(params, x[:split], h0, c0, starts[:split])
    h_b, _, cache_b = lstm_forward(params, x[split:], h_mid, c_mid, starts[split:])
    np.testing.assert_allclose(np.concatenate([h_a, h_b]), h_seq, rtol=0, atol=1e-14)
    dx_b, g_b, (dh_mid, dc_mid) = lstm_backward(params, cache_b, dh_seq[split:], dh_T, dc_T)
    dx_a, g_a, (dh0_a, dc0_a) = lstm_backward(params, cache_a, dh_seq[:split], dh_mid, dc_mid)
    np.testing.assert_allclose(np.concatenate([dx_a, dx_b]), dx, rtol=1e-12, atol=1e-14)
    for k in grads:
        np.testing.assert_allclose(g_a[k] + g_b[k], grads[k], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dh0_a, dh0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dc0_a, dc0, rtol=1e-12, atol=1e-14)


def test_forward_backward_and_step_do_not_mutate(rng):
    params, x, h0, c0, starts = make_problem(rng, 5, 3, 2, 4)
    dh_seq = rng.standard_normal((5, 3, 4))
    dh_T, dc_T = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    inputs = [x, h0, c0, starts, dh_seq, dh_T, dc_T, *params.values()]
    saved = [a.copy() for a in inputs]
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    saved_cache = [a.copy() for a in cache]
    out1 = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    out2 = lstm_backward(params, cache, dh_seq, dh_T, dc_T)  # same answer twice
    lstm_step(params, x[0], h0, c0, starts[0])
    for a, b in zip(inputs, saved):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(cache, saved_cache):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out1[0], out2[0])
    for k in params:
        np.testing.assert_array_equal(out1[1][k], out2[1][k])
    # Results are fresh arrays: writing to them does not reach the cache or the inputs.
    h_T[...] = 7.0
    c_T[...] = 7.0
    assert not np.any(h_seq[-1] == 7.0) and not np.any(cache.c_prev == 7.0)
    dh0, dc0 = out1[2]
    dh0[...] = 3.0
    dc0[...] = 3.0
    np.testing.assert_array_equal(dh_T, saved[5])
    np.testing.assert_array_equal(dc_T, saved[6])


def test_lstm_step_accepts_bool_and_float_flags(rng):
    params, x, h0, c0, starts = make_problem(rng, 1, 4, 3, 2)
    flags = np.array([True, False, True, False])
    h_b, c_b = lstm_step(params, x[0], h0, c0, flags)
    h_f, c_f = lstm_step(params, x[0], h0, c0, flags.astype(np.float64))
    np.testing.assert_array_equal(h_b, h_f)
    np.testing.assert_array_equal(c_b, c_f)
    h_z, c_z = lstm_step(params, x[0], np.zeros_like(h0), np.zeros_like(c0), np.zeros(4))
    np.testing.assert_array_equal(h_b[[0, 2]], h_z[[0, 2]])
    np.testing.assert_array_equal(c_b[[0, 2]], c_z[[0, 2]])


# ---------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d_in,hidden", [(4, 64), (64, 64), (300, 16), (1, 1)])
def test_init_is_orthogonal_with_zero_bias(d_in, hidden):
    params = lstm_init(np.random.default_rng(3), d_in, hidden)
    assert set(params) == {"w_ih", "w_hh", "b"}
    assert params["w_ih"].shape == (4 * hidden, d_in)
    assert params["w_hh"].shape == (4 * hidden, hidden)
    assert params["b"].shape == (4 * hidden,)
    assert all(v.dtype == np.float64 for v in params.values())
    np.testing.assert_array_equal(params["b"], 0.0)
    for w in (params["w_ih"], params["w_hh"]):  # gain 1: orthonormal columns or rows
        gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        np.testing.assert_allclose(gram, np.eye(gram.shape[0]), atol=1e-12)
    again = lstm_init(np.random.default_rng(3), d_in, hidden)
    for k in params:
        np.testing.assert_array_equal(params[k], again[k])


# ---------------------------------------------------------------------------------------------
# Validation: a bad argument raises ValueError naming it
# ---------------------------------------------------------------------------------------------

def _good(rng):
    params, x, h0, c0, starts = make_problem(rng, 4, 3, 2, 5)
    return params, x, h0, c0, starts


def _with(params, **changes):
    out = dict(params)
    out.update(changes)
    return out


FORWARD_CASES = {
    "x": lambda p, x, h0, c0, s: (p, x[0], h0, c0, s),
    "x ": lambda p, x, h0, c0, s: (p, x[..., :1], h0, c0, s),
    "x  ": lambda p, x, h0, c0, s: (p, np.where(x > 1, np.nan, x), h0, c0, s),
    "x   ": lambda p, x, h0, c0, s: (p, x[:0], h0, c0, s[:0]),
    "x    ": lambda p, x, h0, c0, s: (p, x.astype(np.complex128), h0, c0, s),
    "h0": lambda p, x, h0, c0, s: (p, x, h0[:, :-1], c0, s),
    "h0 ": lambda p, x, h0, c0, s: (p, x, h0[0], c0, s),
    "c0": lambda p, x, h0, c0, s: (p, x, h0, c0[:-1], s),
    "c0 ": lambda p, x, h0, c0, s: (p, x, h0, np.full_like(c0, np.inf), s),
    "episode_starts": lambda p, x, h0, c0, s: (p, x, h0, c0, s[:, :-1]),
    "episode_starts ": lambda p, x, h0, c0, s: (p, x, h0, c0, s.astype(float) * 2.0),
    "episode_starts  ": lambda p, x, h0, c0, s: (p, x, h0, c0, s[0]),
    "params": lambda p, x, h0, c0, s: ({"w_ih": p["w_ih"], "w_hh": p["w_hh"]}, x, h0, c0, s),
    "params ": lambda p, x, h0, c0, s: ([p["w_ih"], p["w_hh"], p["b"]], x, h0, c0, s),
    "params['w_hh']": lambda p, x, h0, c0, s: (_with(p, w_hh=p["w_hh"][:, :-1]), x, h0, c0, s),
    "params['w_ih']": lambda p, x, h0, c0, s: (_with(p, w_ih=p["w_ih"][:-1]), x, h0, c0, s),
    "params['b']": lambda p, x, h0, c0, s: (_with(p, b=p["b"][:-1]), x, h0, c0, s),
}


@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_forward_rejects_bad_arguments(rng, case):
    args = FORWARD_CASES[case](*_good(rng))
    with pytest.raises(ValueError, match="^" + re.escape(case.strip())):
        lstm_forward(*args)


STEP_CASES = {
    "x": lambda p, x, h, c, s: (p, x[None], h, c, s),
    "h": lambda p, x, h, c, s: (p, x, h[:, :-1], c, s),
    "c": lambda p, x, h, c, s: (p, x, h, c[:-1], s),
    "episode_starts": lambda p, x, h, c, s: (p, x, h, c, s[None]),
    "episode_starts ": lambda p, x, h, c, s: (p, x, h, c, np.full(s.shape, 0.5)),
    "params['w_ih']": lambda p, x, h, c, s: (_with(p, w_ih=p["w_ih"][:-1]), x, h, c, s),
}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_step_rejects_bad_arguments(rng, case):
    params, x, h0, c0, starts = _good(rng)
    args = STEP_CASES[case](params, x[0], h0, c0, starts[0])
    with pytest.raises(ValueError, match="^" + re.escape(case.strip())):
        lstm_step(*args)


def test_backward_rejects_bad_arguments(rng):
    params, x, h0, c0, starts = _good(rng)
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    with pytest.raises(ValueError, match="^dh_seq"):
        lstm_backward(params, cache, h_seq[:-1])
    with pytest.raises(ValueError, match="^dh_seq"):
        lstm_backward(params, cache, np.full_like(h_seq, np.nan))
    with pytest.raises(ValueError, match="^dh_seq"):
        lstm_backward(params, cache, None)
    with pytest.raises(ValueError, match="^dh_T"):
        lstm_backward(params, cache, h_seq, h_T[:, :-1])
    with pytest.raises(ValueError, match="^dc_T"):
        lstm_backward(params, cache, h_seq, h_T, c_T[:-1])
    with pytest.raises(ValueError, match="^cache"):
        lstm_backward(params, tuple(cache), h_seq)
    other = lstm_init(rng, 3, 5)
    with pytest.raises(ValueError, match="^params"):
        lstm_backward(other, cache, h_seq)


@pytest.mark.parametrize("args,name", [
    ((np.random.default_rng(0), 0, 4), "input_size"),
    ((np.random.default_rng(0), 3, -1), "hidden_size"),
    ((np.random.default_rng(0), 3.0, 4), "input_size"),
    ((np.random.default_rng(0), 3, True), "hidden_size"),
    ((0, 3, 4), "rng"),
])
def test_init_rejects_bad_arguments(args, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        lstm_init(*args)


def test_weight_gradients_are_fma_chains_over_the_rows_in_order(rng):
    """``lstm_backward``'s weight gradients are, element for element, the documented sums over
    the rows ``m = t N + n`` in increasing order (one correctly rounded FMA per product term,
    from 0; a plain addition per bias term): bitwise equal to that chain computed in exact
    arithmetic from the cache's ``dz`` (recovered from the gate derivatives) on a problem with
    resets, rows not a multiple of 8 and widths not a multiple of 16; ``dx`` likewise."""
    T, N, D, H = 7, 3, 5, 6
    params, x, h0, c0, starts = make_problem(rng, T, N, D, H)
    h_seq, _, cache = lstm_forward(params, x, h0, c0, starts)
    dh_seq = rng.standard_normal((T, N, H))
    dx, grads, _ = lstm_backward(params, cache, dh_seq)
    # dz from the compiled BPTT kernel on copies (what lstm_backward computed internally)
    dz = np.empty((T, N, 4 * H))
    lstm_mod._backward_kernel(dh_seq, np.zeros((N, H)), np.zeros((N, H)), cache.keep,
                              cache.gates, cache.tanh_c, cache.c_prev,
                              np.ascontiguousarray(params["w_hh"]), dz)
    dz_rows = dz.reshape(T * N, 4 * H)
    zeros = np.zeros((4 * H, D + H))
    inputs = np.concatenate([cache.x.reshape(T * N, D), cache.h_prev.reshape(T * N, H)], axis=1)
    want = _products_oracle(zeros, np.ascontiguousarray(dz_rows.T), inputs)
    np.testing.assert_array_equal(grads["w_ih"], want[:, :D])
    np.testing.assert_array_equal(grads["w_hh"], want[:, D:])
    b = np.zeros(4 * H)
    for m in range(T * N):
        b = b + dz_rows[m]
    np.testing.assert_array_equal(grads["b"], b)
    want_dx = _products_oracle(np.zeros((T * N, D)), dz_rows, params["w_ih"])
    np.testing.assert_array_equal(dx.reshape(T * N, D), want_dx)


# ---------------------------------------------------------------------------------------------
# The products kernel: register blocks of 6 x 32 or 8 x 16, leftover rows and columns
# ---------------------------------------------------------------------------------------------

def _products_oracle(out, a, w_t):
    """``out[n, j]`` plus its terms one at a time in the order k = 0, 1, ..., each added by a
    correctly rounded fused multiply-add (exact rational arithmetic, then one rounding)."""
    res = out.astype(np.float64).copy()
    for n in range(a.shape[0]):
        for j in range(w_t.shape[1]):
            o = res[n, j]
            for k in range(a.shape[1]):
                o = lstm_mod._fma(float(a[n, k]), float(w_t[k, j]), o)
            res[n, j] = o
    return res


@pytest.mark.parametrize("shape", [(8, 64, 32), (19, 7, 37), (16, 3, 16), (8, 5, 2), (5, 9, 40),
                                   (25, 7, 64), (24, 3, 32), (30, 4, 48)])
def test_add_products_blocks_match_the_fma_chain_oracle_and_the_interpreted_loops(
        rng, monkeypatch, shape):
    """Every element of ``_add_products`` is the chain of FMAs in k order whichever code path
    computes it (6 x 32 register blocks for 24 rows or more and a width that 32 divides, else
    8 x 16 ones, the columns right of them, the rows below them):
    bitwise equal to an exact-arithmetic oracle and to the interpreted kernels; each row is
    independent of the other rows of the call (a subset of rows gives the same bits)."""
    n_rows, n_k, n_j = shape
    a = rng.standard_normal((n_rows, n_k))
    w_t = rng.standard_normal((n_k, n_j))
    out0 = rng.standard_normal((n_rows, n_j))
    compiled = out0.copy()
    lstm_mod._add_products(compiled, a, w_t)
    np.testing.assert_array_equal(compiled, _products_oracle(out0, a, w_t))
    rows = np.arange(1, n_rows, 2)
    sub = out0[rows].copy()
    lstm_mod._add_products(sub, np.ascontiguousarray(a[rows]), w_t)
    np.testing.assert_array_equal(sub, compiled[rows])
    monkeypatch.setattr(lstm_mod, "_add_products_loops", lstm_mod._add_products_loops.py_func)
    interpreted = out0.copy()
    lstm_mod._add_products.py_func(interpreted, a, w_t)
    np.testing.assert_array_equal(interpreted, compiled)


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="interpreted: no typing")
def test_add_products_takes_a_strided_a_and_refuses_other_layouts(rng):
    """The compiled product reads ``a`` as scalars, so any strides will do (a transposed view
    gives the bits of its C-contiguous copy); ``out`` and ``w_t`` are read as vectors and must
    be C-contiguous, and the dtypes one: anything else is a typing error, not a silently
    different code path."""
    from numba.core.errors import TypingError
    a = rng.standard_normal((24, 16))
    w_t = rng.standard_normal((24, 32))
    out0 = rng.standard_normal((16, 32))
    strided, copied = out0.copy(), out0.copy()
    lstm_mod._add_products(strided, a.T, w_t)
    lstm_mod._add_products(copied, np.ascontiguousarray(a.T), w_t)
    np.testing.assert_array_equal(strided, copied)
    with pytest.raises(TypingError, match="C-contiguous"):
        lstm_mod._add_products(np.zeros((8, 32))[:, ::2], np.zeros((8, 3)), np.zeros((3, 16)))
    with pytest.raises(TypingError, match="C-contiguous"):
        lstm_mod._add_products(np.zeros((8, 16)), np.zeros((8, 3)), np.zeros((3, 32))[:, ::2])
    with pytest.raises(TypingError, match="one dtype"):
        lstm_mod._add_products(np.zeros((8, 16)), np.zeros((8, 3), np.float32),
                               np.zeros((3, 16)))


@pytest.mark.parametrize("shape", [(16, 24, 48), (30, 24, 64)])
def test_add_products_blocks_float32(rng, monkeypatch, shape):
    """float32 operands: the vector blocks (8 x 16, and 6 x 32 for the second shape) compute
    float32 FMA chains in k order, the same bits as the interpreted float32 loops."""
    n_rows, n_k, n_j = shape
    a = rng.standard_normal((n_rows, n_k)).astype(np.float32)
    w_t = rng.standard_normal((n_k, n_j)).astype(np.float32)
    out0 = rng.standard_normal((n_rows, n_j)).astype(np.float32)
    fast = out0.copy()
    lstm_mod._add_products(fast, a, w_t)
    monkeypatch.setattr(lstm_mod, "_add_products_loops", lstm_mod._add_products_loops.py_func)
    slow = out0.copy()
    lstm_mod._add_products.py_func(slow, a, w_t)
    np.testing.assert_array_equal(fast, slow)
    ref = _products_oracle(out0, a, w_t)  # float64 chain: float32 agrees to float32 rounding
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


_AVX2_FEATURES = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,"
                  "+movbe,+pclmul,+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")

_PRODUCTS_SCRIPT = """
import hashlib, sys
import numpy as np
import ppo_ref.fast.lstm as lstm_mod
rng = np.random.default_rng(7)
digest = hashlib.sha256()
for dtype in (np.float64, np.float32):
    for n_rows, n_k, n_j in ((8, 64, 256), (30, 24, 64), (256, 19, 64), (13, 7, 40)):
        a = rng.standard_normal((n_rows, n_k)).astype(dtype)
        w_t = rng.standard_normal((n_k, n_j)).astype(dtype)
        out = rng.standard_normal((n_rows, n_j)).astype(dtype)
        lstm_mod._add_products(out, a, w_t)
        digest.update(out.tobytes())
print(lstm_mod._VECTOR_BITS, lstm_mod._BLOCK_ROWS, lstm_mod._BLOCK_COLS, digest.hexdigest())
"""


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="interpreted: no target")
def test_add_products_blocks_of_an_avx2_target_give_the_same_bits(tmp_path):
    """The register blocks are chosen for the target's vector registers (6 x 8 for AVX2,
    8 x 16 and 6 x 32 for AVX-512); compiled for an AVX2-only target (as on an AMD EPYC
    machine), the products are the same bits as compiled for the default target."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(extra_env):
        env = dict(os.environ, PYTHONPATH=root, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
                   **extra_env)
        out = subprocess.run([sys.executable, "-c", _PRODUCTS_SCRIPT], env=env, check=True,
                             capture_output=True, text=True, timeout=600).stdout.split()
        return out
    avx2 = run({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _AVX2_FEATURES})
    assert avx2[:3] == ["256", "6", "8"]
    default = run({})
    assert default[3] == avx2[3]
