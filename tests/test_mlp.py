"""The readable layers (ppo_ref.spec.layers): orthogonal init, the linear layer, the
activations and the MLP, against oracles written here and central differences
(tests/gradcheck.py); their argument errors. (The compiled MLP, ppo_ref.fast.layers, is checked
against these in tests/test_tiers.py.)"""
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from ppo_ref.spec.layers import (
    ActivationCache, LinearCache, MLPCache, linear_backward, linear_forward, linear_init,
    mlp_backward, mlp_forward, mlp_init, orthogonal, relu_backward, relu_forward, tanh_backward,
    tanh_forward,
)


def deep_copy_arrays(obj):
    """A deep copy of nested dicts/tuples/NamedTuples of arrays (for no-mutation checks)."""
    return copy.deepcopy(obj)


def assert_same_arrays(a, b):
    """Nested structures of arrays are bit-identical."""
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same_arrays(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_arrays(x, y)
    else:
        assert a == b


# --------------------------------------------------------------------------------------------
# orthogonal init

@given(rows=st.integers(1, 40), cols=st.integers(1, 40), gain=st.floats(0.01, 3.0),
       seed=st.integers(0, 2**31))
def test_orthogonal_rows_or_columns_are_orthonormal_times_gain(rows, cols, gain, seed):
    w = orthogonal(np.random.default_rng(seed), (rows, cols), gain)
    assert w.shape == (rows, cols) and w.dtype == np.float64
    if rows <= cols:  # wide (or square): orthogonal rows
        np.testing.assert_allclose(w @ w.T, gain**2 * np.eye(rows), atol=1e-12 * max(1, gain**2))
    if rows >= cols:  # tall (or square): orthogonal columns
        np.testing.assert_allclose(w.T @ w, gain**2 * np.eye(cols), atol=1e-12 * max(1, gain**2))


def test_orthogonal_higher_rank_flattens_trailing_dimensions(rng):
    w = orthogonal(rng, (3, 2, 5), 2.0)
    assert w.shape == (3, 2, 5)
    flat = w.reshape(3, 10)
    np.testing.assert_allclose(flat @ flat.T, 4.0 * np.eye(3), atol=1e-12)


def test_orthogonal_is_reproducible_and_seed_dependent():
    a = orthogonal(np.random.default_rng(7), (5, 3))
    b = orthogonal(np.random.default_rng(7), (5, 3))
    c = orthogonal(np.random.default_rng(8), (5, 3))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_orthogonal_sign_correction_makes_entries_symmetric():
    # Without multiplying Q by sign(diag R), LAPACK's Householder QR gives Q[0, 0] < 0 for every
    # draw; Haar-distributed matrices have P(W[0, 0] > 0) = 1/2.
    for shape in [(6, 6), (3, 8), (8, 3)]:
        positive = [orthogonal(np.random.default_rng(s), shape)[0, 0] > 0 for s in range(400)]
        assert 0.4 < np.mean(positive) < 0.6, shape


def test_orthogonal_square_entry_variance_is_one_over_n():
    # Haar orthogonal n x n: E[W_ij] = 0, E[W_ij^2] = 1/n.
    n = 8
    w = np.stack([orthogonal(np.random.default_rng(s), (n, n)) for s in range(300)])
    assert abs(w.mean()) < 0.01
    assert abs((w**2).mean() - 1.0 / n) < 1e-12  # exact: rows have unit norm
    assert abs(w[:, 0, 0].var() - 1.0 / n) < 0.03


@pytest.mark.parametrize("shape", [(3,), (), (0, 3), (3, -1)])
def test_orthogonal_rejects_bad_shapes(rng, shape):
    with pytest.raises(ValueError, match="shape"):
        orthogonal(rng, shape)


def test_orthogonal_rejects_bad_gain_and_rng(rng):
    with pytest.raises(ValueError, match="gain"):
        orthogonal(rng, (2, 2), float("nan"))
    with pytest.raises(ValueError, match="rng"):
        orthogonal(np.random.RandomState(0), (2, 2))


# --------------------------------------------------------------------------------------------
# linear layer and activations

def test_linear_init_is_orthogonal_with_zero_bias(rng):
    p = linear_init(rng, 7, 3, 0.5)
    assert set(p) == {"w", "b"} and p["w"].shape == (3, 7) and p["b"].shape == (3,)
    np.testing.assert_allclose(p["w"] @ p["w"].T, 0.25 * np.eye(3), atol=1e-12)
    assert np.all(p["b"] == 0.0)
    with pytest.raises(ValueError, match="in_dim"):
        linear_init(rng, 0, 3, 1.0)
    with pytest.raises(ValueError, match="out_dim"):
        linear_init(rng, 2, 2.5, 1.0)


def test_linear_forward_is_torch_layout_and_keeps_leading_shape(rng):
    p = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(3)}
    x = rng.standard_normal((2, 5, 4))
    y, cache = linear_forward(p, x)
    assert isinstance(cache, LinearCache) and y.shape == (2, 5, 3)
    expected = np.einsum("tni,oi->tno", x, p["w"]) + p["b"]
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-13)
    y1, _ = linear_forward(p, x[0, 0])  # a single vector
    np.testing.assert_allclose(y1, expected[0, 0], rtol=1e-13, atol=1e-13)


def test_linear_accepts_float32_and_computes_in_float64(rng):
    p = linear_init(rng, 4, 2, 1.0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y, cache = linear_forward(p, x)
    assert y.dtype == np.float64 and cache.x.dtype == np.float64
    np.testing.assert_array_equal(y, x.astype(np.float64) @ p["w"].T + p["b"])


@given(batch=st.lists(st.integers(1, 4), min_size=0, max_size=2), in_dim=st.integers(1, 6),
       out_dim=st.integers(1, 5), seed=st.integers(0, 2**31))
@settings(max_examples=25)
def test_linear_gradients(batch, in_dim, out_dim, seed):
    rng = np.random.default_rng(seed)
    p = {"w": rng.standard_normal((out_dim, in_dim)), "b": rng.standard_normal(out_dim)}
    x = rng.standard_normal(tuple(batch) + (in_dim,))
    dy = rng.standard_normal(tuple(batch) + (out_dim,))
    _, cache = linear_forward(p, x)
    dx, grads = linear_backward(p, cache, dy)

    def f():
        return np.sum(linear_forward(p, x)[0] * dy)
    check_gradients(f, {"x": x, **p}, {"x": dx, **grads})


def _away_from_zero(rng, shape):
    """Normal draws pushed away from 0 so relu's kink is not inside the finite difference."""
    z = rng.standard_normal(shape)
    return np.sign(z) * (0.05 + np.abs(z))


@pytest.mark.parametrize("name", ["tanh", "relu"])
def test_activation_values_and_gradients(rng, name):
    fwd, bwd = {"tanh": (tanh_forward, tanh_backward), "relu": (relu_forward, relu_backward)}[name]
    x = _away_from_zero(rng, (4, 6))
    y, cache = fwd(x)
    assert isinstance(cache, ActivationCache)
    np.testing.assert_array_equal(y, np.tanh(x) if name == "tanh" else np.where(x > 0, x, 0.0))
    dy = rng.standard_normal(x.shape)
    dx = bwd(cache, dy)
    check_gradients(lambda: np.sum(fwd(x)[0] * dy), {"x": x}, {"x": dx})


def test_relu_derivative_at_zero_is_zero():
    y, cache = relu_forward(np.array([-1.0, 0.0, 2.0]))
    np.testing.assert_array_equal(relu_backward(cache, np.ones(3)), [0.0, 0.0, 1.0])


# --------------------------------------------------------------------------------------------
# MLP

def test_mlp_init_keys_gains_and_zero_biases(rng):
    p = mlp_init(rng, 5, [16, 8], 3, hidden_gain=math.sqrt(2), out_gain=0.01)
    assert list(p) == ["w0", "b0", "w1", "b1", "w2", "b2"]
    assert p["w0"].shape == (16, 5) and p["w1"].shape == (8, 16) and p["w2"].shape == (3, 8)
    np.testing.assert_allclose(p["w0"].T @ p["w0"], 2.0 * np.eye(5), atol=1e-12)  # tall
    np.testing.assert_allclose(p["w1"] @ p["w1"].T, 2.0 * np.eye(8), atol=1e-12)  # wide
    np.testing.assert_allclose(p["w2"] @ p["w2"].T, 1e-4 * np.eye(3), atol=1e-15)
    for i in range(3):
        assert p[f"b{i}"].dtype == np.float64 and np.all(p[f"b{i}"] == 0.0)
    single = mlp_init(rng, 4, (), 2)
    assert list(single) == ["w0", "b0"] and single["w0"].shape == (2, 4)


def _naive_mlp(params, x, activation):
    """Layer-by-layer with explicit loops over samples (an obviously-correct oracle)."""
    act = np.tanh if activation == "tanh" else (lambda a: np.maximum(a, 0.0))
    n = len(params) // 2
    out = []
    for row in x.reshape(-1, x.shape[-1]):
        h = row
        for i in range(n):
            w, b = params[f"w{i}"], params[f"b{i}"]
            a = np.array([sum(w[o, j] * h[j] for j in range(w.shape[1])) + b[o]
                          for o in range(w.shape[0])])
            h = act(a) if i < n - 1 else a
        out.append(h)
    return np.array(out).reshape(x.shape[:-1] + (out[0].shape[0],))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_forward_matches_naive_oracle(rng, activation):
    p = mlp_init(rng, 3, [5, 4], 2)
    for k in p:
        if k.startswith("b"):
            p[k] = rng.standard_normal(p[k].shape)
    x = rng.standard_normal((2, 3, 3))
    y, cache = mlp_forward(p, x, activation)
    assert isinstance(cache, MLPCache) and y.shape == (2, 3, 2)
    np.testing.assert_allclose(y, _naive_mlp(p, x, activation), rtol=1e-12, atol=1e-13)


@given(batch=st.integers(1, 5), in_dim=st.integers(1, 5),
       hidden=st.lists(st.integers(1, 7), min_size=0, max_size=3), out_dim=st.integers(1, 4),
       activation=st.sampled_from(["tanh", "relu"]), seed=st.integers(0, 2**31))
@settings(max_examples=30)
def test_mlp_gradients_inputs_and_every_parameter(batch, in_dim, hidden, out_dim, activation, seed):
    rng = np.random.default_rng(seed)
    p = mlp_init(rng, in_dim, hidden, out_dim)
    for k in p:  # non-zero biases so their path is exercised
        if k.startswith("b"):
            p[k] = 0.3 * rng.standard_normal(p[k].shape)
    x = rng.standard_normal((batch, in_dim))
    dy = rng.standard_normal((batch, out_dim))
    _, cache = mlp_forward(p, x, activation)
    dx, grads = mlp_backward(p, cache, dy)
    assert list(grads) == list(p)

    def f():
        return np.sum(mlp_forward(p, x, activation)[0] * dy)
    check_gradients(f, {"x": x, **p}, {"x": dx, **grads}, rng=rng)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_backward_does_not_mutate_its_inputs(rng, activation):
    p = mlp_init(rng, 4, [6, 6], 3)
    x = rng.standard_normal((5, 4))
    dy = rng.standard_normal((5, 3))
    _, cache = mlp_forward(p, x, activation)
    before = deep_copy_arrays((p, cache, dy))
    mlp_backward(p, cache, dy)
    mlp_backward(p, cache, dy)
    assert_same_arrays((p, cache, dy), before)
    lin = {"w": p["w0"], "b": p["b0"]}
    _, lcache = linear_forward(lin, x)
    dyl = rng.standard_normal((5, 6))
    before = deep_copy_arrays((lin, lcache, dyl))
    linear_backward(lin, lcache, dyl)
    assert_same_arrays((lin, lcache, dyl), before)


def test_mlp_leading_dimensions_equal_flattened_batch(rng):
    p = mlp_init(rng, 3, [4], 2)
    x = rng.standard_normal((4, 2, 3))
    dy = rng.standard_normal((4, 2, 2))
    y, cache = mlp_forward(p, x)
    dx, grads = mlp_backward(p, cache, dy)
    y2, cache2 = mlp_forward(p, x.reshape(8, 3))
    dx2, grads2 = mlp_backward(p, cache2, dy.reshape(8, 2))
    np.testing.assert_array_equal(y.reshape(8, 2), y2)
    np.testing.assert_array_equal(dx.reshape(8, 3), dx2)
    assert_same_arrays(grads, grads2)


def test_mlp_validation_errors_name_the_argument(rng):
    p = mlp_init(rng, 3, [4], 2)
    x = rng.standard_normal((5, 3))
    with pytest.raises(ValueError, match="activation"):
        mlp_forward(p, x, "sigmoid")
    with pytest.raises(ValueError, match="x must have last dimension 3"):
        mlp_forward(p, rng.standard_normal((5, 4)))
    with pytest.raises(ValueError, match="x must be finite"):
        mlp_forward(p, np.array([[0.0, np.nan, 1.0]]))
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        mlp_forward(p, 1.0)
    with pytest.raises(ValueError, match="missing key .b1."):
        mlp_forward({k: v for k, v in p.items() if k != "b1"}, x)
    with pytest.raises(ValueError, match="unexpected"):
        mlp_forward({**p, "extra": np.zeros(1)}, x)
    bad = dict(p, w1=rng.standard_normal((2, 5)))
    with pytest.raises(ValueError, match="input width"):
        mlp_forward(bad, x)
    with pytest.raises(ValueError, match="float64"):
        mlp_forward(dict(p, w0=p["w0"].astype(np.float32)), x)
    with pytest.raises(ValueError, match="params must be a dict"):
        mlp_forward([1, 2], x)
    _, cache = mlp_forward(p, x)
    with pytest.raises(ValueError, match=r"dy must have the shape of the forward output \(5, 2\)"):
        mlp_backward(p, cache, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="dy must be finite"):
        mlp_backward(p, cache, np.full((5, 2), np.inf))
    with pytest.raises(ValueError, match="cache"):
        mlp_backward(p, (1, 2), np.zeros((5, 2)))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_backward_is_the_matrix_chain_rule(rng, activation):
    """One hidden layer, written out: the same operations, so the same bits."""
    p = mlp_init(rng, 3, [5], 2)
    p["b0"] = rng.standard_normal(5)
    x = rng.standard_normal((6, 3))
    dy = rng.standard_normal((6, 2))
    a = x @ p["w0"].T + p["b0"]
    h = np.tanh(a) if activation == "tanh" else np.maximum(a, 0.0)
    dh = dy @ p["w1"]
    da = dh * (1.0 - h * h) if activation == "tanh" else dh * (a > 0.0)
    _, cache = mlp_forward(p, x, activation)
    dx, grads = mlp_backward(p, cache, dy)
    np.testing.assert_array_equal(grads["w1"], dy.T @ h)
    np.testing.assert_array_equal(grads["b1"], dy.sum(axis=0))
    np.testing.assert_array_equal(grads["w0"], da.T @ x)
    np.testing.assert_array_equal(grads["b0"], da.sum(axis=0))
    np.testing.assert_array_equal(dx, da @ p["w0"])
