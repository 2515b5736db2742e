"""Cross-check of ppo_ref.fast.lstm (the compiled LSTM) against torch.nn.LSTM (float64, CPU).

The weights are copied into a one-layer ``torch.nn.LSTM`` with ``weight_ih_l0 = w_ih``,
``weight_hh_l0 = w_hh``, ``bias_ih_l0 = b``, ``bias_hh_l0 = 0`` (torch adds both biases, so its
gradient of each equals our ``db``). torch has no episode resets, so the reference with resets
runs the torch module one step at a time and multiplies the carried ``(h, c)`` by
``1 - episode_starts[t]`` with torch ops before each step (what sb3-contrib's
``RecurrentActorCriticPolicy._process_sequence`` does); autograd then supplies every gradient.
Without resets the reference is torch's own whole-sequence call. Agreement to 1e-9.

Run: ``pytest validation/test_torch_lstm.py`` (skipped when torch is not installed).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ppo_ref.fast.lstm import lstm_backward, lstm_forward, lstm_step
from ppo_ref.spec.lstm import lstm_init

torch = pytest.importorskip("torch")

TOL = 1e-9


def make_problem(rng, n_steps, n_env, d_in, hidden, reset_prob):
    params = lstm_init(rng, d_in, hidden)
    params["b"] = 0.5 * rng.standard_normal(4 * hidden)
    x = rng.standard_normal((n_steps, n_env, d_in))
    h0 = 0.8 * rng.standard_normal((n_env, hidden))
    c0 = rng.standard_normal((n_env, hidden))
    starts = rng.random((n_steps, n_env)) < reset_prob
    dh_seq = rng.standard_normal((n_steps, n_env, hidden))
    dh_T = rng.standard_normal((n_env, hidden))
    dc_T = rng.standard_normal((n_env, hidden))
    return params, x, h0, c0, starts, dh_seq, dh_T, dc_T


def torch_lstm(params):
    four_h, d_in = params["w_ih"].shape
    module = torch.nn.LSTM(d_in, four_h // 4).to(torch.float64)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.from_numpy(params["w_ih"]))
        module.weight_hh_l0.copy_(torch.from_numpy(params["w_hh"]))
        module.bias_ih_l0.copy_(torch.from_numpy(params["b"]))
        module.bias_hh_l0.zero_()
    return module


def torch_reference(params, x, h0, c0, starts, dh_seq, dh_T, dc_T, *, whole_sequence):
    """h_seq, c_T and every gradient of L = <h_seq, dh_seq> + <h_T, dh_T> + <c_T, dc_T>."""
    module = torch_lstm(params)
    xt = torch.tensor(x, requires_grad=True)
    h0t = torch.tensor(h0, requires_grad=True)
    c0t = torch.tensor(c0, requires_grad=True)
    if whole_sequence:
        assert not starts.any()
        h_seq, (h_T, c_T) = module(xt, (h0t[None], c0t[None]))
        h_T, c_T = h_T[0], c_T[0]
    else:
        keep = 1.0 - torch.tensor(starts, dtype=torch.float64)
        h, c = h0t[None], c0t[None]
        outs = []
        for t in range(x.shape[0]):
            h = h * keep[t][None, :, None]
            c = c * keep[t][None, :, None]
            y, (h, c) = module(xt[t:t + 1], (h, c))
            outs.append(y[0])
        h_seq, h_T, c_T = torch.stack(outs), h[0], c[0]
    loss = ((h_seq * torch.from_numpy(dh_seq)).sum() + (h_T * torch.from_numpy(dh_T)).sum()
            + (c_T * torch.from_numpy(dc_T)).sum())
    loss.backward()
    np.testing.assert_allclose(module.bias_ih_l0.grad.numpy(), module.bias_hh_l0.grad.numpy(),
                               rtol=0, atol=TOL)
    return {
        "h_seq": h_seq.detach().numpy(), "h_T": h_T.detach().numpy(),
        "c_T": c_T.detach().numpy(), "dx": xt.grad.numpy(),
        "dh0": h0t.grad.numpy(), "dc0": c0t.grad.numpy(),
        "w_ih": module.weight_ih_l0.grad.numpy(), "w_hh": module.weight_hh_l0.grad.numpy(),
        "b": module.bias_ih_l0.grad.numpy(),
    }


def ours(params, x, h0, c0, starts, dh_seq, dh_T, dc_T):
    h_seq, (h_T, c_T), cache = lstm_forward(params, x, h0, c0, starts)
    dx, grads, (dh0, dc0) = lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    return {"h_seq": h_seq, "h_T": h_T, "c_T": c_T, "dx": dx, "dh0": dh0, "dc0": dc0, **grads}


def assert_match(got, want):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=TOL, err_msg=k)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (5, 3, 4, 6), (32, 8, 4, 64), (16, 4, 64, 64)])
def test_matches_torch_whole_sequence_without_resets(shape):
    rng = np.random.default_rng(sum(shape))
    problem = make_problem(rng, *shape, reset_prob=0.0)
    assert_match(ours(*problem), torch_reference(*problem, whole_sequence=True))


@pytest.mark.parametrize("shape,reset_prob", [
    ((6, 3, 4, 5), 0.3), ((12, 5, 3, 8), 0.15), ((32, 8, 4, 64), 0.05), ((4, 2, 3, 3), 1.0),
])
def test_matches_torch_with_resets(shape, reset_prob):
    rng = np.random.default_rng(7 * sum(shape))
    problem = make_problem(rng, *shape, reset_prob=reset_prob)
    problem[4][0, 0] = True   # a reset on the first step (h0, c0 ignored for env 0) ...
    problem[4][-1, -1] = True  # ... and one on the last step
    assert_match(ours(*problem), torch_reference(*problem, whole_sequence=False))


@settings(max_examples=10)
@given(n_steps=st.integers(1, 8), n_env=st.integers(1, 4), d_in=st.integers(1, 5),
       hidden=st.integers(1, 7), reset_prob=st.sampled_from([0.0, 0.2, 0.5]),
       seed=st.integers(0, 2**32 - 1))
def test_matches_torch_property(n_steps, n_env, d_in, hidden, reset_prob, seed):
    problem = make_problem(np.random.default_rng(seed), n_steps, n_env, d_in, hidden, reset_prob)
    assert_match(ours(*problem), torch_reference(*problem, whole_sequence=False))


def test_lstm_step_matches_torch_cell():
    rng = np.random.default_rng(11)
    params, x, h0, c0, starts, *_ = make_problem(rng, 1, 6, 3, 5, reset_prob=0.5)
    cell = torch.nn.LSTMCell(3, 5).to(torch.float64)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(params["w_ih"]))
        cell.weight_hh.copy_(torch.from_numpy(params["w_hh"]))
        cell.bias_ih.copy_(torch.from_numpy(params["b"]))
        cell.bias_hh.zero_()
        keep = torch.from_numpy(1.0 - starts[0].astype(np.float64))[:, None]
        h_t, c_t = cell(torch.from_numpy(x[0]), (torch.from_numpy(h0) * keep,
                                                  torch.from_numpy(c0) * keep))
    h, c = lstm_step(params, x[0], h0, c0, starts[0])
    np.testing.assert_allclose(h, h_t.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(c, c_t.numpy(), rtol=0, atol=TOL)
