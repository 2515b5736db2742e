"""PPO losses: hand-derived cases, gradient checks away from the kinks, branch routing at them."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_gradients
from ppo_ref.spec.losses import (approx_kl, entropy_loss, explained_variance, normalize_advantages,
                                 policy_loss, value_loss)

seeds = st.integers(0, 2**31 - 1)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=2).map(tuple)


# ----------------------------------------------------------------------------------------------
# policy_loss
# ----------------------------------------------------------------------------------------------

def test_policy_loss_by_hand():
    # clip_range 0.2, n = 4, old log-probs 0, so ratio = exp(new):
    #  i  ratio  A    ratio*A  clip(ratio)*A  min    active   d/d new = -A*ratio/4
    #  0  1.5    1    1.5      1.2            1.2    clipped  0
    #  1  0.5    1    0.5      0.8            0.5    unclip.  -0.5/4  = -0.125
    #  2  0.5   -2   -1.0     -1.6           -1.6    clipped  0
    #  3  1.1   -2   -2.2     -2.2           -2.2    inside   2*1.1/4 = 0.55
    # loss = -(1.2 + 0.5 - 1.6 - 2.2)/4 = 2.1/4 = 0.525
    # clip_fraction: |ratio-1| = 0.5, 0.5, 0.5, 0.1 -> 3/4
    # approx_kl k3 = mean(ratio - 1 - log ratio)
    ratio = np.array([1.5, 0.5, 0.5, 1.1])
    adv = np.array([1.0, 1.0, -2.0, -2.0])
    loss, d_new, info = policy_loss(np.log(ratio), np.zeros(4), adv, 0.2)
    assert loss == pytest.approx(0.525, rel=1e-14)
    np.testing.assert_allclose(d_new, [0.0, -0.125, 0.0, 0.55], rtol=1e-14)
    assert info["clip_fraction"] == 0.75
    assert info["approx_kl"] == pytest.approx(np.mean(ratio - 1 - np.log(ratio)), rel=1e-12)


def test_policy_loss_ratio_one_gives_minus_mean_advantage():
    # ratio 1 everywhere (the first minibatch of an update): loss = -mean(A), d = -A/n, no clipping.
    adv = np.array([0.5, -1.5, 2.0])
    lp = np.array([-0.3, -1.2, -2.0])
    loss, d_new, info = policy_loss(lp, lp.copy(), adv, 0.2)
    assert loss == pytest.approx(-1.0 / 3.0, rel=1e-15)
    np.testing.assert_allclose(d_new, -adv / 3.0, rtol=1e-15)
    assert info == {"clip_fraction": 0.0, "approx_kl": 0.0}


def _away_from_policy_kinks(r, shape, clip_range):
    """log-ratios whose ratio is at least 1e-3 away from 1 +- clip_range."""
    log_ratio = r.uniform(-0.5, 0.5, size=shape)
    ratio = np.exp(log_ratio)
    for bound in (1 - clip_range, 1 + clip_range):
        near = np.abs(ratio - bound) < 1e-3
        log_ratio[near] += 0.01
    return log_ratio


@given(seeds, shapes, st.sampled_from([0.1, 0.2, 0.3]))
@settings(max_examples=20)
def test_policy_loss_gradcheck(seed, shape, clip_range):
    r = np.random.default_rng(seed)
    old = r.normal(size=shape) - 1.0
    new = old + _away_from_policy_kinks(r, shape, clip_range)
    adv = r.normal(size=shape)
    adv[np.abs(adv) < 1e-3] = 0.5
    _, d_new, _ = policy_loss(new, old, adv, clip_range)
    check_gradients(lambda: policy_loss(new, old, adv, clip_range)[0],
                    {"new_log_probs": new}, {"new_log_probs": d_new})


@pytest.mark.parametrize("side", ["high", "low"])
def test_policy_loss_kink_routing(side):
    # Construct a ratio exactly on the boundary: r = exp(+-0.1) and clip_range = |r - 1| (exact by
    # Sterbenz), so 1 +- clip_range == r bit for bit.
    log_r = 0.1 if side == "high" else -0.1
    r = math.exp(log_r)
    eps = abs(r - 1.0)
    bound = 1.0 + eps if side == "high" else 1.0 - eps
    assert bound == r
    # the advantage sign for which this boundary binds: A > 0 at 1+eps, A < 0 at 1-eps
    a = 2.0 if side == "high" else -2.0
    # 1e-12 away in log space: a few thousand ulps, so exp() cannot round back onto the boundary
    outward = log_r + (1e-12 if side == "high" else -1e-12)
    inward = log_r - (1e-12 if side == "high" else -1e-12)
    new = np.array([log_r, outward, inward])
    _, d_new, info = policy_loss(new, np.zeros(3), np.full(3, a), eps)
    ratios = np.exp(new)
    # on the boundary (inclusive) and inside: the unclipped gradient; just outside: zero
    assert d_new[0] == pytest.approx(-a * ratios[0] / 3, rel=1e-15)
    assert d_new[1] == 0.0
    assert d_new[2] == pytest.approx(-a * ratios[2] / 3, rel=1e-15)
    # clip_fraction counts strictly outside only
    assert info["clip_fraction"] == pytest.approx(1.0 / 3.0)
    # with the opposite advantage sign the boundary does not bind: unclipped gradient everywhere
    _, d_new, _ = policy_loss(new, np.zeros(3), np.full(3, -a), eps)
    np.testing.assert_allclose(d_new, a * ratios / 3, rtol=1e-15)


def test_policy_loss_zero_advantage_has_zero_gradient():
    _, d_new, _ = policy_loss(np.array([0.5, -0.5, 0.0]), np.zeros(3), np.zeros(3), 0.2)
    np.testing.assert_array_equal(d_new, 0.0)


def test_policy_loss_float32():
    f32 = np.float32
    loss, d_new, info = policy_loss(np.array([0.1, -0.1], f32), np.zeros(2, f32),
                                    np.array([1.0, -1.0], f32), 0.2)
    assert d_new.dtype == np.float32 and isinstance(loss, float)
    _, d64, _ = policy_loss(np.array([0.1, -0.1]), np.zeros(2), np.array([1.0, -1.0]), 0.2)
    np.testing.assert_allclose(d_new, d64, rtol=1e-6)


@pytest.mark.parametrize("args, match", [
    (([0.0, 0.0], [0.0], [1.0, 1.0], 0.2), "old_log_probs"),
    (([0.0, 0.0], [0.0, 0.0], [1.0], 0.2), "advantages"),
    (([0.0, np.nan], [0.0, 0.0], [1.0, 1.0], 0.2), "new_log_probs"),
    (([0.0, 0.0], [0.0, np.inf], [1.0, 1.0], 0.2), "old_log_probs"),
    (([0.0, 0.0], [0.0, 0.0], [1.0, 1.0], 0.0), "clip_range"),
    (([0.0, 0.0], [0.0, 0.0], [1.0, 1.0], -0.2), "clip_range"),
    (([], [], [], 0.2), "new_log_probs"),
    (([800.0], [0.0], [1.0], 0.2), "overflows"),
])
def test_policy_loss_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        policy_loss(*args)


# ----------------------------------------------------------------------------------------------
# value_loss
# ----------------------------------------------------------------------------------------------

def test_value_loss_unclipped_by_hand():
    # V - R = [1, -2, 0.5]: loss = (1 + 4 + 0.25)/3 = 1.75; d = 2 (V - R)/3
    v, ret = np.array([1.0, 0.0, 2.5]), np.array([0.0, 2.0, 2.0])
    for mode in ("max", "sb3"):
        loss, d_v = value_loss(v, None, ret, mode=mode)
        assert loss == pytest.approx(1.75, rel=1e-15)
        np.testing.assert_allclose(d_v, [2 / 3, -4 / 3, 1 / 3], rtol=1e-15)


def test_value_loss_clipped_by_hand():
    # c = 0.25, V_old = 0.
    #  i  V     R      V_clip  (V-R)^2   (V_clip-R)^2   max      which     d_max (n=4)
    #  0  1.0  -1.0    0.25    4.0       1.5625         4.0      unclip.   2*2/4 = 1.0
    #  1  1.0   2.0    0.25    1.0       3.0625         3.0625   clipped   0
    #  2  0.1   1.0    0.1     0.81      0.81           0.81     inside    2*(-0.9)/4 = -0.45
    #  3 -0.5   0.0   -0.25    0.25      0.0625         0.25     unclip.   2*(-0.5)/4 = -0.25
    # max loss = (4 + 3.0625 + 0.81 + 0.25)/4 = 8.1225/4 = 2.030625
    # sb3 loss = mean((V_clip-R)^2) = (1.5625 + 3.0625 + 0.81 + 0.0625)/4 = 5.4975/4 = 1.374375
    # sb3 d    = 2 (V_clip - R)/4 where |V - V_old| <= c: [0, 0, -0.45, 0]
    v = np.array([1.0, 1.0, 0.1, -0.5])
    ret = np.array([-1.0, 2.0, 1.0, 0.0])
    old = np.zeros(4)
    loss, d_v = value_loss(v, old, ret, 0.25, mode="max")
    assert loss == pytest.approx(2.030625, rel=1e-14)
    np.testing.assert_allclose(d_v, [1.0, 0.0, -0.45, -0.25], rtol=1e-14)
    loss, d_v = value_loss(v, old, ret, 0.25, mode="sb3")
    assert loss == pytest.approx(1.374375, rel=1e-14)
    np.testing.assert_allclose(d_v, [0.0, 0.0, -0.45, 0.0], rtol=1e-14)


def test_value_loss_kink_routing():
    # All numbers exact in binary. c = 0.25, n = 3.
    # 0: |V - V_old| == c exactly (boundary, inclusive): V = 0.75, V_old = 0.5, R = 0:
    #    both modes pass the full gradient 2*0.75/3 = 0.5
    # 1: clip active and the two squared errors tie: V = 1, V_old = 0 -> V_clip = 0.25,
    #    R = 0.625 midway: (0.375)^2 == (-0.375)^2. max mode: half of 2(V-R)/3 = 0.375/3 = 0.125;
    #    sb3 mode: 0 (clip active)
    # 2: just outside the boundary, V = 0.75 + 2^-30 with V_old = 0.5 and R = 2 (the clipped
    #    term (0.75 - 2)^2 is larger than (0.75 + 2^-30 - 2)^2): max mode 0, sb3 mode 0.
    #    (One ulp outside would not do: 0.75 + ulp - 2 rounds to -1.25, a tie of the squares.)
    v = np.array([0.75, 1.0, 0.75 + 2.0 ** -30])
    old = np.array([0.5, 0.0, 0.5])
    ret = np.array([0.0, 0.625, 2.0])
    _, d_max = value_loss(v, old, ret, 0.25, mode="max")
    _, d_sb3 = value_loss(v, old, ret, 0.25, mode="sb3")
    np.testing.assert_allclose(d_max, [0.5, 0.125, 0.0], rtol=1e-15)
    np.testing.assert_allclose(d_sb3, [0.5, 0.0, 0.0], rtol=1e-15)


@given(seeds, shapes, st.sampled_from(["max", "sb3"]), st.sampled_from([None, 0.2, 1.0]))
@settings(max_examples=25)
def test_value_loss_gradcheck(seed, shape, mode, clip):
    r = np.random.default_rng(seed)
    old = r.normal(size=shape)
    delta = r.uniform(-1.5, 1.5, size=shape)
    if clip is not None:  # keep |V - V_old| away from c
        delta[np.abs(np.abs(delta) - clip) < 1e-3] += 0.01
    v = old + delta
    ret = r.normal(size=shape)
    if clip is not None and mode == "max":  # keep away from ties between the two squared errors
        v_clip = old + np.clip(delta, -clip, clip)
        tie = np.abs(np.abs(v - ret) - np.abs(v_clip - ret)) < 1e-3
        ret[tie & (np.abs(delta) > clip)] += 0.05
    _, d_v = value_loss(v, old, ret, clip, mode=mode)
    check_gradients(lambda: value_loss(v, old, ret, clip, mode=mode)[0], {"values": v}, {"values": d_v})


@pytest.mark.parametrize("kwargs, match", [
    ({"values": [1.0, 2.0], "old_values": [0.0], "returns": [0.0, 0.0], "clip_range_vf": 0.2}, "old_values"),
    ({"values": [1.0, 2.0], "old_values": None, "returns": [0.0], "clip_range_vf": None}, "returns"),
    ({"values": [1.0, np.nan], "old_values": None, "returns": [0.0, 0.0]}, "values"),
    ({"values": [1.0], "old_values": None, "returns": [0.0], "clip_range_vf": 0.2}, "old_values"),
    ({"values": [1.0], "old_values": [0.0], "returns": [0.0], "clip_range_vf": 0.0}, "clip_range_vf"),
    ({"values": [1.0], "old_values": [0.0], "returns": [0.0], "mode": "l1"}, "mode"),
    ({"values": [], "old_values": [], "returns": []}, "values"),
])
def test_value_loss_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        value_loss(**kwargs)


def test_torch_reference_routing_at_the_kinks():
    """Our gradients equal torch autograd on the SB3/CleanRL torch formulas, kinks included."""
    torch = pytest.importorskip("torch")
    r = math.exp(0.1)
    eps = r - 1.0  # ratio exactly on 1 + eps for the first entries
    log_ratio = np.array([0.1, 0.1, math.nextafter(0.1, 1.0), -0.3, 0.05, -0.05, 0.4, 0.0])
    adv = np.array([1.0, -1.0, 1.0, -1.0, 0.0, 2.0, -0.5, 1.5])
    old = np.linspace(-1.0, -0.2, 8)
    new = old + log_ratio
    # recompute so that new - old reproduces log_ratio bit for bit
    log_ratio = new - old
    _, d_new, _ = policy_loss(new, old, adv, eps)
    t_new = torch.tensor(new, requires_grad=True)
    t_ratio = torch.exp(t_new - torch.tensor(old))
    t_adv = torch.tensor(adv)
    t_loss = -torch.min(t_ratio * t_adv, torch.clamp(t_ratio, 1 - eps, 1 + eps) * t_adv).mean()
    t_loss.backward()
    np.testing.assert_allclose(d_new, t_new.grad.numpy(), rtol=1e-12, atol=1e-15)

    v = np.array([0.75, 1.0, math.nextafter(0.75, 2.0), 1.0, 1.0, -0.5, 0.1])
    old_v = np.array([0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
    ret = np.array([0.0, 0.625, 2.0, -1.0, 2.0, 0.0, 1.0])
    c = 0.25
    for mode in ("max", "sb3"):
        _, d_v = value_loss(v, old_v, ret, c, mode=mode)
        t_v = torch.tensor(v, requires_grad=True)
        t_old, t_ret = torch.tensor(old_v), torch.tensor(ret)
        t_clip = t_old + torch.clamp(t_v - t_old, -c, c)
        if mode == "max":  # CleanRL (without its 0.5)
            t_l = torch.max((t_v - t_ret) ** 2, (t_clip - t_ret) ** 2).mean()
        else:  # SB3
            t_l = torch.nn.functional.mse_loss(t_ret, t_clip)
        t_l.backward()
        np.testing.assert_allclose(d_v, t_v.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=mode)


# ----------------------------------------------------------------------------------------------
# entropy_loss, approx_kl, explained_variance
# ----------------------------------------------------------------------------------------------

def test_entropy_loss(rng):
    h = rng.uniform(0.1, 1.5, size=(3, 4))
    loss, d_h = entropy_loss(h)
    assert loss == pytest.approx(-h.mean(), rel=1e-15)
    check_gradients(lambda: entropy_loss(h)[0], {"entropy": h}, {"entropy": d_h})
    with pytest.raises(ValueError, match="entropy"):
        entropy_loss([np.nan])
    with pytest.raises(ValueError, match="entropy"):
        entropy_loss([])


def test_approx_kl_by_hand():
    # r = new - old = [log 2, log 0.5]
    # k3 terms: 2 - 1 - log 2 = 0.3069...,  0.5 - 1 + log 2 = 0.1931...; mean = 0.25
    # k1 = mean(old - new) = mean(-log 2, log 2) = 0
    old = np.zeros(2)
    new = np.log([2.0, 0.5])
    assert approx_kl(old, new) == pytest.approx(0.25, rel=1e-14)
    assert approx_kl(old, new, "k1") == pytest.approx(0.0, abs=1e-16)
    # k1 sign: new log-probs lower than old (taken actions became less likely) -> positive
    assert approx_kl(np.zeros(3), np.full(3, -0.1), "k1") == pytest.approx(0.1)
    assert approx_kl(np.zeros(3), np.full(3, 0.1), "k1") == pytest.approx(-0.1)


@given(seeds, shapes, st.floats(1e-12, 5.0))
@settings(max_examples=30)
def test_approx_kl_k3_never_negative(seed, shape, scale):
    r = np.random.default_rng(seed)
    old = r.normal(size=shape)
    new = old + r.normal(size=shape) * scale
    assert approx_kl(old, new, "k3") >= 0.0
    assert approx_kl(old.astype(np.float32), new.astype(np.float32), "k3") >= 0.0


def test_approx_kl_k3_precise_for_tiny_ratios():
    # k3 ~ r^2/2 for small r; exp(r) - 1 - r computed naively loses every digit at r = 1e-9.
    r = 1e-9
    assert approx_kl(np.zeros(1), np.array([r])) == pytest.approx(r * r / 2, rel=1e-6)


def test_approx_kl_k3_overflow_is_refused_not_inf():
    # exp(800) overflows: the k3 estimate is refused (naming the log-probs), never inf or nan
    with pytest.raises(ValueError, match="new_log_probs - old_log_probs"):
        approx_kl(np.zeros(2), np.array([800.0, 0.0]))
    assert approx_kl(np.zeros(2), np.array([800.0, 0.0]), "k1") == -400.0


def test_approx_kl_bad_inputs():
    with pytest.raises(ValueError, match="estimator"):
        approx_kl([0.0], [0.0], "k4")
    with pytest.raises(ValueError, match="new_log_probs"):
        approx_kl([0.0, 0.0], [0.0], "k3")
    with pytest.raises(ValueError, match="old_log_probs"):
        approx_kl([np.nan], [0.0])


def test_explained_variance():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(y, y) == 1.0
    assert explained_variance(np.full(4, y.mean()), y) == pytest.approx(0.0, abs=1e-15)
    # residual [1, -1, 1, -1]: Var = 1; Var[y] = 1.25 (population) -> 1 - 1/1.25 = 0.2
    assert explained_variance(y - np.array([1.0, -1.0, 1.0, -1.0]), y) == pytest.approx(0.2, rel=1e-14)
    assert math.isnan(explained_variance(np.array([1.0, 2.0]), np.array([3.0, 3.0])))
    with pytest.raises(ValueError, match="y_true"):
        explained_variance([1.0, 2.0], [1.0])


# ----------------------------------------------------------------------------------------------
# normalize_advantages
# ----------------------------------------------------------------------------------------------

def test_normalize_by_hand():
    # A = [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], sum of squares 14
    # ddof 1: std = sqrt(14/3); ddof 0: std = sqrt(14/4)
    a = np.array([1.0, 2.0, 3.0, 6.0])
    dev = np.array([-2.0, -1.0, 0.0, 3.0])
    np.testing.assert_allclose(normalize_advantages(a), dev / (math.sqrt(14 / 3) + 1e-8), rtol=1e-14)
    np.testing.assert_allclose(normalize_advantages(a, ddof=0), dev / (math.sqrt(3.5) + 1e-8), rtol=1e-14)
    np.testing.assert_array_equal(a, [1.0, 2.0, 3.0, 6.0])  # not modified


@pytest.mark.parametrize("ddof", [0, 1])
def test_normalize_size_one_unchanged(ddof):
    a = np.array([3.5])
    out = normalize_advantages(a, ddof=ddof)
    np.testing.assert_array_equal(out, a)
    assert out is not a
    assert normalize_advantages(np.zeros((0,))).shape == (0,)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("value", [0.0, 0.1, -7.3, 1e6, 3e30])
def test_normalize_constant_array_is_zero_not_nan(dtype, value):
    a = np.full(7, value, dtype=dtype)
    out = normalize_advantages(a)
    assert out.dtype == dtype
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, 0.0, atol=1e-2)


@given(seeds, shapes, st.sampled_from([0, 1]))
@settings(max_examples=25)
def test_normalize_statistics_float32_and_float64(seed, shape, ddof):
    r = np.random.default_rng(seed)
    a = r.normal(size=shape) * r.uniform(0.01, 100) + r.uniform(-50, 50)
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        out = normalize_advantages(a.astype(dtype), ddof=ddof)
        assert out.dtype == dtype and out.shape == a.shape and np.isfinite(out).all()
        if a.size > 1 and np.std(a) > 1e-3:
            # mean 0 and std s / (s + 1e-8), s the std of the input (in its dtype's values)
            s = float(np.std(a.astype(dtype).astype(np.float64), ddof=ddof))
            assert abs(float(np.mean(out, dtype=np.float64))) < tol
            assert float(np.std(out, ddof=ddof, dtype=np.float64)) == pytest.approx(
                s / (s + 1e-8), rel=tol)


def test_normalize_bad_inputs():
    with pytest.raises(ValueError, match="advantages"):
        normalize_advantages([1.0, np.inf])
    with pytest.raises(ValueError, match="ddof"):
        normalize_advantages([1.0, 2.0], ddof=2)
    with pytest.raises(ValueError, match="eps"):
        normalize_advantages([1.0, 2.0], eps=0.0)
    with pytest.raises(ValueError, match="too large"):
        normalize_advantages([1e300, -1e300, 1e300])


# ----------------------------------------------------------------------------------------------
# the loss functions against their equations written with NumPy (slow, obvious oracles)
# ----------------------------------------------------------------------------------------------

def _oracle_policy_loss(new, old, adv, eps):
    ratio = np.exp(new - old)
    loss = -np.mean(np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv))
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    d_new = np.where(clipped, 0.0, -adv * ratio / new.size)
    return loss, d_new, np.mean(np.abs(ratio - 1) > eps), np.mean(ratio - 1 - (new - old))


def _oracle_value_loss(v, old, ret, c, mode):
    n = v.size
    if c is None:
        return np.mean((v - ret) ** 2), 2 * (v - ret) / n
    inside = np.abs(v - old) <= c
    v_clip = old + np.clip(v - old, -c, c)
    if mode == "sb3":
        return np.mean((v_clip - ret) ** 2), np.where(inside, 2 * (v_clip - ret) / n, 0.0)
    sq, sq_clip = (v - ret) ** 2, (v_clip - ret) ** 2
    weight = np.where(inside | (sq > sq_clip), 1.0, np.where(sq == sq_clip, 0.5, 0.0))
    return np.mean(np.maximum(sq, sq_clip)), weight * 2 * (v - ret) / n


@given(seeds, shapes, st.sampled_from([0.05, 0.2]), st.sampled_from([None, 0.1, 0.5]),
       st.sampled_from(["max", "sb3"]))
@settings(max_examples=30)
def test_kernels_match_numpy_oracles(seed, shape, eps, clip_vf, mode):
    r = np.random.default_rng(seed)
    old = r.normal(size=shape)
    new = old + r.normal(size=shape) * 0.3
    adv = r.normal(size=shape)
    loss, d_new, info = policy_loss(new, old, adv, eps)
    o_loss, o_d, o_frac, o_kl = _oracle_policy_loss(new, old, adv, eps)
    assert loss == pytest.approx(o_loss, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(d_new, o_d, rtol=1e-13, atol=1e-16)
    assert info["clip_fraction"] == o_frac
    assert info["approx_kl"] == pytest.approx(o_kl, rel=1e-9, abs=1e-15)
    assert approx_kl(old, new, "k1") == pytest.approx(np.mean(old - new), rel=1e-12, abs=1e-15)

    v = r.normal(size=shape)
    ret = r.normal(size=shape)
    loss, d_v = value_loss(v, old, ret, clip_vf, mode=mode)
    o_loss, o_d = _oracle_value_loss(v, old, ret, clip_vf, mode)
    assert loss == pytest.approx(o_loss, rel=1e-12)
    np.testing.assert_allclose(d_v, o_d, rtol=1e-13, atol=1e-16)

    if adv.size > 1:
        np.testing.assert_allclose(normalize_advantages(adv),
                                   (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# float32 inputs: every element is widened to float64
# ----------------------------------------------------------------------------------------------

def test_float32_inputs_give_the_float64_results_of_the_same_numbers():
    r = np.random.default_rng(7)
    new, old, adv, v, old_v, ret = (r.normal(size=64).astype(np.float32) for _ in range(6))
    up = [x.astype(np.float64) for x in (new, old, adv, v, old_v, ret)]
    loss32, d32, info32 = policy_loss(new, old, adv, 0.2)
    loss64, d64, info64 = policy_loss(up[0], up[1], up[2], 0.2)
    assert loss32 == loss64 and info32 == info64
    np.testing.assert_array_equal(d32, d64.astype(np.float32))
    for mode in ("max", "sb3"):
        loss32, d32 = value_loss(v, old_v, ret, 0.5, mode=mode)
        loss64, d64 = value_loss(up[3], up[4], up[5], 0.5, mode=mode)
        assert loss32 == loss64
        np.testing.assert_array_equal(d32, d64.astype(np.float32))
    for estimator in ("k3", "k1", "k2"):
        assert approx_kl(old, new, estimator) == approx_kl(up[1], up[0], estimator)
    np.testing.assert_array_equal(normalize_advantages(adv),
                                  normalize_advantages(up[2]).astype(np.float32))


def test_policy_loss_float32_large_log_ratio_is_never_nan():
    f = np.float32
    new, old = np.array([100.0], f), np.zeros(1, f)  # ratio e^100 ~ 2.7e43 > float32 max
    loss, d_new, _ = policy_loss(new, old, np.zeros(1, f), 0.2)  # A = 0: nothing to gain
    assert loss == 0.0 and d_new[0] == 0.0
    loss, d_new, _ = policy_loss(new, old, np.ones(1, f), 0.2)  # A > 0: clipped, gradient 0
    assert loss == pytest.approx(-1.2) and d_new[0] == 0.0
    with pytest.raises(ValueError, match="^new_log_probs - old_log_probs.*overflows float32"):
        policy_loss(new, old, -np.ones(1, f), 0.2)  # A < 0: gradient e^100 / n overflows float32


@pytest.mark.parametrize("loss, damage", [
    ("policy_loss", "ratio_overflow"), ("policy_loss", "nan_advantage"),
    ("policy_loss", "zero_weights"), ("value_loss", "inf_value"), ("value_loss", "zero_weights"),
    ("approx_kl", "ratio_overflow"), ("entropy_loss", "inf_value")])
def test_fast_twins_raise_one_error_for_a_non_finite_result(loss, damage):
    """The compiled twins do not re-validate their inputs: a result that is not finite raises
    FloatingPointError naming the twin; the spec, on the same inputs, raises ValueError naming
    the cause."""
    from ppo_ref.fast import losses as fast
    from ppo_ref.spec import losses as spec
    r = np.random.default_rng(5)
    new, old, adv, v, ret = (r.normal(size=16) for _ in range(5))
    weights = np.zeros(16) if damage == "zero_weights" else None
    if damage == "ratio_overflow":
        new[3] = old[3] + 800.0
    elif damage == "nan_advantage":
        adv[2] = np.nan
    elif damage == "inf_value":
        v[1] = np.inf
    args = {"policy_loss": (new, old, adv, 0.2), "value_loss": (v, v, ret, 0.2),
            "approx_kl": (old, new), "entropy_loss": (v,)}[loss]
    kwargs = {} if weights is None else {"weights": weights}
    with pytest.raises(FloatingPointError, match=f"^ppo_ref.fast.losses.{loss}: non-finite"):
        getattr(fast, loss)(*args, **kwargs)
    with pytest.raises(ValueError):
        getattr(spec, loss)(*args, **kwargs)


def test_k2_estimator_is_half_the_mean_squared_log_ratio():
    """k2 (Schulman 2020, "Approximating KL divergence"): mean((log pi_new - log pi_old)^2 / 2),
    weighted by the weights when given."""
    rng = np.random.default_rng(11)
    old, new = rng.normal(size=50), rng.normal(size=50)
    r = new - old
    assert approx_kl(old, new, "k2") == pytest.approx(np.mean(r ** 2) / 2, rel=1e-14)
    w = rng.uniform(0.0, 2.0, size=50)
    assert approx_kl(old, new, "k2", weights=w) == pytest.approx(
        np.sum(w * r ** 2 / 2) / np.sum(w), rel=1e-14)
    assert approx_kl(old, old, "k2") == 0.0


@pytest.mark.parametrize("ddof", [0, 1])
def test_sqrt_placement_whitens_with_eps_inside_the_root(ddof):
    """placement "sqrt": (A - mean) / sqrt(var + eps), var the ddof-variance: the eps moves the
    result where var is near eps (unlike std + eps)."""
    rng = np.random.default_rng(12)
    for scale in (1.0, 1e-4, 1e-6):
        a = scale * rng.normal(size=40)
        eps = 1e-8
        expected = (a - a.mean()) / np.sqrt(np.var(a, ddof=ddof) + eps)
        np.testing.assert_allclose(
            normalize_advantages(a, ddof=ddof, eps=eps, placement="sqrt"), expected,
            rtol=1e-12, atol=0)
    one = np.array([3.0])
    np.testing.assert_array_equal(normalize_advantages(one, placement="sqrt"), one)


def test_active_clip_fraction_counts_where_the_clip_changes_the_term():
    """clip_fraction_mode="active" (verl's pg_clipfrac): A > 0 and ratio > 1 + eps, or A < 0
    and ratio < 1 - eps; "outside" counts |ratio - 1| > eps whatever the sign of A."""
    rng = np.random.default_rng(13)
    new, old, adv = rng.normal(0, 0.3, 200), rng.normal(0, 0.3, 200), rng.normal(size=200)
    ratio = np.exp(new - old)
    active = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    outside = np.abs(ratio - 1) > 0.2
    assert 0 < active.sum() < outside.sum()
    loss_a, d_a, info_a = policy_loss(new, old, adv, 0.2, clip_fraction_mode="active")
    loss_o, d_o, info_o = policy_loss(new, old, adv, 0.2)
    assert info_a["clip_fraction"] == pytest.approx(active.mean(), rel=1e-15)
    assert info_o["clip_fraction"] == pytest.approx(outside.mean(), rel=1e-15)
    assert loss_a == loss_o and np.array_equal(d_a, d_o)  # only the count differs
    with pytest.raises(ValueError, match="clip_fraction_mode must be one of"):
        policy_loss(new, old, adv, 0.2, clip_fraction_mode="inside")
