"""The stacked LSTM helpers of ppo_ref.fast.lstm (the recurrent policy's fast path) against the
public, checked functions, and the float32 kernels."""
import numpy as np
import pytest
from numba import njit

from ppo_ref.fast.lstm import (backward_stacked, forward_stacked, _step_stack, _tanh_f32,
                              lstm_backward, lstm_forward, lstm_step)
from ppo_ref.spec.lstm import lstm_init


def problem(rng, T=5, N=6, D=3, H=8, L=2):
    params = [lstm_init(rng, D, H) for _ in range(L)]
    for p in params:
        p["b"] = 0.5 * rng.standard_normal(4 * H)
    x = rng.standard_normal((T, N, D))
    h0 = 0.8 * rng.standard_normal((L, N, H))
    c0 = rng.standard_normal((L, N, H))
    starts = rng.random((T, N)) < 0.3
    keep = np.ones((T + 1, N))
    keep[:-1] -= starts
    stack = {k: np.stack([p[k] for p in params]) for k in ("w_ih", "w_hh", "b")}
    return params, stack, x, h0, c0, starts, keep


def test_stacked_forward_backward_and_step_equal_the_public_functions_bitwise(rng):
    """Sizes with a 4-row block plus a remainder row and several 8-lane vectors per row."""
    params, st, x, h0, c0, starts, keep = problem(rng, N=5, H=16)
    h_seq, h_prev, c_prev, gates, tanh_c = forward_stacked(st["w_ih"], st["w_hh"], st["b"], x,
                                                            h0, c0, keep)
    dh = rng.standard_normal(h_seq.shape)
    g = [np.empty_like(st[k]) for k in ("w_ih", "w_hh", "b")]
    backward_stacked(st["w_hh"], x, h_prev, c_prev, gates, tanh_c, keep, dh, *g)
    T = x.shape[0]
    for l, p in enumerate(params):
        ref_h, (h_T, c_T), cache = lstm_forward(p, x, h0[l], c0[l], starts)
        np.testing.assert_array_equal(h_seq[l], ref_h)
        np.testing.assert_array_equal(h_prev[l, :T], cache.h_prev)
        np.testing.assert_array_equal(c_prev[l, T], c_T)
        np.testing.assert_array_equal(gates[l], cache.gates)
        _, grads, _ = lstm_backward(p, cache, dh[l])
        for k, gk in zip(("w_ih", "w_hh", "b"), g):
            np.testing.assert_array_equal(gk[l], grads[k])
        h_new = np.empty((2,) + h0.shape[1:])
        c_new = np.empty_like(h_new)
        keep1 = np.stack([keep[0], np.ones_like(keep[0])])
        _step_stack(x[0], np.ascontiguousarray(st["w_ih"].transpose(0, 2, 1)),
                    np.ascontiguousarray(st["w_hh"].transpose(0, 2, 1)), st["b"], keep1, h0, c0,
                    h_new, c_new)
        h1, c1 = lstm_step(p, x[0], h0[l], c0[l], starts[0])
        np.testing.assert_array_equal(h_new[l], h1)
        np.testing.assert_array_equal(c_new[l], c1)


@njit
def _tanh_f32_array(x, out):
    for i in range(x.size):
        out[i] = _tanh_f32(x[i])


def test_float32_tanh_is_accurate_bounded_and_odd(rng):
    x = (rng.standard_normal(400_000) * np.exp(rng.uniform(-18, 3.5, 400_000))).astype(np.float32)
    x = np.concatenate([x, np.float32([0.55, -0.55, 10, -10, 20, 1e30, -np.inf, np.inf])])
    out = np.empty_like(x)
    _tanh_f32_array(x, out)
    ref = np.tanh(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(out.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    assert ulps[ref != 0].max() <= 4          # measured: 2
    assert np.all(np.abs(out) <= 1) and out[-1] == 1 and out[-2] == -1
    neg = np.empty_like(x)
    _tanh_f32_array(-x, neg)
    np.testing.assert_array_equal(neg, -out)


@pytest.mark.parametrize("L", [1, 2])
def test_float32_stacked_passes_are_close_to_float64(rng, L):
    params, st, x, h0, c0, starts, keep = problem(rng, T=12, N=8, D=4, H=64, L=L)
    f32 = {k: v.astype(np.float32) for k, v in st.items()}
    out64 = forward_stacked(st["w_ih"], st["w_hh"], st["b"], x, h0, c0, keep)
    out32 = forward_stacked(f32["w_ih"], f32["w_hh"], f32["b"], x.astype(np.float32),
                             h0.astype(np.float32), c0.astype(np.float32),
                             keep.astype(np.float32))
    assert all(a.dtype == np.float32 for a in out32)
    np.testing.assert_allclose(out32[0], out64[0], rtol=0, atol=2e-5)
    dh = rng.standard_normal(out64[0].shape)
    g64 = [np.empty_like(st[k]) for k in ("w_ih", "w_hh", "b")]
    g32 = [np.empty_like(f32[k]) for k in ("w_ih", "w_hh", "b")]
    backward_stacked(st["w_hh"], x, *out64[1:], keep, dh, *g64)
    backward_stacked(f32["w_hh"], x.astype(np.float32), *out32[1:], keep.astype(np.float32),
                      dh.astype(np.float32), *g32)
    for a, b in zip(g32, g64):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("n_env, hidden", [(11, 6), (8, 16), (17, 5)])
def test_stacked_forward_with_register_panels_equals_lstm_forward_bitwise(rng, n_env, hidden):
    """forward_stacked's one product per step over ``[x, h~]`` with packed panels: sizes with a
    full row block and leftover rows, and a last panel narrower than the block (4H not a
    multiple of the panel width), give lstm_forward's bits."""
    params, st, x, h0, c0, starts, keep = problem(rng, T=4, N=n_env, H=hidden)
    h_seq, h_prev, c_prev, gates, tanh_c = forward_stacked(st["w_ih"], st["w_hh"], st["b"], x,
                                                            h0, c0, keep)
    for l, p in enumerate(params):
        ref_h, (_, c_T), cache = lstm_forward(p, x, h0[l], c0[l], starts)
        np.testing.assert_array_equal(h_seq[l], ref_h)
        np.testing.assert_array_equal(gates[l], cache.gates)
        np.testing.assert_array_equal(c_prev[l, x.shape[0]], c_T)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear_panels_equal_linear_rows_and_the_interpreted_loops(rng, dtype):
    """_linear_panels (panel register blocks + leftover loops) gives _linear_rows' bits and the
    interpreted kernel's, for rows beyond one block and a partial last panel."""
    from ppo_ref.fast import lstm as lstm_mod
    n_rows, n_k, n_j = 19, 13, 2 * lstm_mod._PANEL_COLS + 3
    x = rng.standard_normal((n_rows, n_k)).astype(dtype)
    w = rng.standard_normal((n_j, n_k)).astype(dtype)
    b = rng.standard_normal(n_j).astype(dtype)
    w_p = np.full((lstm_mod._panel_count(n_j), n_k, lstm_mod._PANEL_COLS), np.nan, dtype)
    lstm_mod._pack_panels(w, w_p, 0)
    compiled = np.empty((n_rows, n_j), dtype)
    lstm_mod._linear_panels(x, w_p, b, compiled)
    rows = np.empty_like(compiled)
    lstm_mod._linear_rows(x, np.ascontiguousarray(w.T), b, rows)
    np.testing.assert_array_equal(compiled, rows)
    interpreted = np.empty_like(compiled)
    lstm_mod._linear_panels.py_func(x, w_p, b, interpreted)
    np.testing.assert_array_equal(interpreted, compiled)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("extra", [16, 16 + 5, 3 * 16 + 1])
def test_linear_panels_with_partial_panel_blocks_equal_linear_rows(rng, dtype, extra):
    """Full panels (in blocks of the dtype's full-panel width) followed by a partial panel of
    ``extra`` columns (blocks of _BLOCK_COLS as far as they fit, then the leftover columns):
    _linear_rows' bits and the interpreted kernel's."""
    from ppo_ref.fast import lstm as lstm_mod
    extra = extra % lstm_mod._PANEL_COLS or 1
    n_rows, n_k, n_j = 2 * lstm_mod._BLOCK_ROWS + 1, 11, lstm_mod._PANEL_COLS + extra
    x = rng.standard_normal((n_rows, n_k)).astype(dtype)
    w = rng.standard_normal((n_j, n_k)).astype(dtype)
    b = rng.standard_normal(n_j).astype(dtype)
    w_p = np.full((lstm_mod._panel_count(n_j), n_k, lstm_mod._PANEL_COLS), np.nan, dtype)
    lstm_mod._pack_panels(w, w_p, 0)
    compiled = np.full((n_rows, n_j), np.nan, dtype)
    lstm_mod._linear_panels(x, w_p, b, compiled)
    rows = np.empty_like(compiled)
    lstm_mod._linear_rows(x, np.ascontiguousarray(w.T), b, rows)
    np.testing.assert_array_equal(compiled, rows)
    interpreted = np.full_like(compiled, np.nan)
    lstm_mod._linear_panels.py_func(x, w_p, b, interpreted)
    np.testing.assert_array_equal(interpreted, compiled)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stacked_passes_into_given_arrays_equal_the_pooled_ones(rng, dtype):
    """forward_stacked/backward_stacked writing into a StackedArrays made once (reused for a
    second pass with other inputs) give the bits of the calls with pooled arrays; every array
    of StackedArrays starts at a 64-byte boundary and has the documented shape."""
    from ppo_ref.fast.lstm import StackedArrays
    params, st, x, h0, c0, starts, keep = problem(rng, T=4, N=9, D=3, H=16)
    st = {k: v.astype(dtype) for k, v in st.items()}
    L, (T, N, D), H = 2, x.shape, 16
    arrays = StackedArrays.empty(L, T, N, D, H, dtype)
    assert all(a.ctypes.data % 64 == 0 and a.dtype == dtype and a.flags.c_contiguous
               for a in arrays)
    assert arrays.h_seq.shape == (L, T, N, H) and arrays.gates.shape == (L, T, N, 4 * H)
    assert arrays.h_prev.shape == arrays.c_prev.shape == (L, T + 1, N, H)
    for _ in range(2):
        x = rng.standard_normal(x.shape).astype(dtype)
        args = (st["w_ih"], st["w_hh"], st["b"], x, h0.astype(dtype), c0.astype(dtype),
                keep.astype(dtype))
        pooled = [a.copy() for a in forward_stacked(*args)]
        given = forward_stacked(*args, arrays)
        assert given[0] is arrays.h_seq and given[3] is arrays.gates
        for a, b in zip(given, pooled):
            np.testing.assert_array_equal(a, b)
        dh = rng.standard_normal(arrays.h_seq.shape).astype(dtype)
        g_pooled = [np.empty_like(st[k]) for k in ("w_ih", "w_hh", "b")]
        g_given = [np.full_like(st[k], np.nan) for k in ("w_ih", "w_hh", "b")]
        backward_stacked(st["w_hh"], x, *pooled[1:], args[-1], dh, *g_pooled)
        backward_stacked(st["w_hh"], x, *given[1:], args[-1], dh, *g_given, arrays)
        for a, b in zip(g_given, g_pooled):
            np.testing.assert_array_equal(a, b)
