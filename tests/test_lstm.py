"""More properties of the readable LSTM (ppo_ref.spec.lstm), beside tests/test_spec_lstm.py: the
gradients of a loss on the final state alone (central differences), the bias gradient, the
gradient cut at a reset inside the sequence, truncated BPTT composing through dh_T / dc_T, and
the orthogonal initialisation. (The compiled twins are tests/test_tiers.py's rows.)"""
import numpy as np
import pytest

from gradcheck import check_gradients
from ppo_ref.spec.lstm import lstm_backward, lstm_forward, lstm_init


def make_problem(rng, n_steps, n_env, d_in, hidden, *, reset_prob=0.3):
    """Random parameters (non-zero bias), inputs, initial state and episode starts."""
    params = lstm_init(rng, d_in, hidden)
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
    """Check every gradient against central differences. The loss sums up to ~100 terms of
    order 1, so each difference carries ~1e-10 of rounding noise; ``floor=1e-4`` compares
    gradients smaller than 1e-4 absolutely (to 1e-9) instead of relatively."""
    _, _, cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    f = lambda: weighted_loss(params, x, h0, c0, starts, dh_seq, dh_T, dc_T)  # noqa: E731
    return check_gradients(
        f, {"x": x, "h0": h0, "c0": c0, **params},
        {"x": dx, "h0": dh0, "c0": dc0, **grads}, max_coords=max_coords, floor=1e-4, rng=rng)


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


def test_bias_gradient_is_sum_of_gate_gradients(rng):
    """db is the gradient of torch's b_ih and b_hh alike; dw_ih = sum dz^T x, so with x = 1 in
    one feature column dw_ih[:, k] equals db."""
    params, x, h0, c0, starts = make_problem(rng, 5, 3, 2, 4)
    x[..., 1] = 1.0
    h_seq, _, cache = lstm_forward(params, x, h0, c0, starts)
    _, grads, _ = lstm_backward(params, cache, rng.standard_normal(h_seq.shape))
    np.testing.assert_allclose(grads["w_ih"][:, 1], grads["b"], rtol=1e-12, atol=1e-14)


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
