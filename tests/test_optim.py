"""Adam, global-norm clipping and schedules, checked against values derived by hand."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_ref.io.state import adam_state_from_arrays, adam_state_to_arrays
from ppo_ref.spec.optim import (adam_init, adam_update, clip_by_global_norm, global_norm,
                                linear_schedule, scheduled_value)


# ----------------------------------------------------------------------------------------------
# Adam
# ----------------------------------------------------------------------------------------------

def test_adam_init_zero_moments_and_dtypes():
    params = {"w": np.ones((2, 3)), "b": np.zeros(3, dtype=np.float32)}
    state = adam_init(params)
    assert state["t"] == 0
    for k, p in params.items():
        for moment in ("m", "v"):
            assert state[moment][k].shape == p.shape
            assert state[moment][k].dtype == p.dtype
            assert not state[moment][k].any()


def test_adam_first_two_steps_by_hand():
    # One scalar parameter theta = 1.0, lr = 0.1, betas (0.9, 0.999), eps = 1e-5.
    params = {"theta": np.array([1.0])}
    state = adam_init(params)

    # Step 1, g = 0.5:
    #   m1 = 0.9*0 + 0.1*0.5 = 0.05            v1 = 0.999*0 + 0.001*0.25 = 0.00025
    #   bias corrections 1 - 0.9 = 0.1, 1 - 0.999 = 0.001
    #   m_hat = 0.05/0.1 = 0.5                  sqrt(v_hat) = sqrt(0.00025/0.001) = 0.5
    #   theta1 = 1 - 0.1 * 0.5 / (0.5 + 1e-5) = 1 - 0.05/0.50001
    p1, s1 = adam_update(params, {"theta": np.array([0.5])}, state, lr=0.1)
    assert s1["t"] == 1
    assert s1["m"]["theta"][0] == pytest.approx(0.05, rel=1e-15)
    assert s1["v"]["theta"][0] == pytest.approx(0.00025, rel=1e-15)
    assert p1["theta"][0] == pytest.approx(1.0 - 0.05 / 0.50001, rel=1e-15)

    # Step 2, g = -0.25:
    #   m2 = 0.9*0.05 + 0.1*(-0.25) = 0.045 - 0.025 = 0.02
    #   v2 = 0.999*0.00025 + 0.001*0.0625 = 0.00024975 + 0.0000625 = 0.00031225
    #   bias corrections 1 - 0.81 = 0.19, 1 - 0.998001 = 0.001999
    #   theta2 = theta1 - (0.1/0.19) * 0.02 / (sqrt(0.00031225)/sqrt(0.001999) + 1e-5)
    p2, s2 = adam_update(p1, {"theta": np.array([-0.25])}, s1, lr=0.1)
    assert s2["t"] == 2
    assert s2["m"]["theta"][0] == pytest.approx(0.02, rel=1e-13)
    assert s2["v"]["theta"][0] == pytest.approx(0.00031225, rel=1e-13)
    expected = (1.0 - 0.05 / 0.50001) - (0.1 / 0.19) * 0.02 / (
        math.sqrt(0.00031225) / math.sqrt(0.001999) + 1e-5)
    assert p2["theta"][0] == pytest.approx(expected, rel=1e-13)


def test_adam_eps_is_added_after_sqrt_of_v_hat():
    # g = 1e-6 on step 1: m_hat = 1e-6 and sqrt(v_hat) = 1e-6 exactly in exact arithmetic, so the
    # torch placement gives lr * 1e-6 / (1e-6 + 1e-5) = lr / 11. eps inside the sqrt would give
    # lr * 1e-6 / sqrt(1e-12 + 1e-5) ~ lr * 3.2e-4; eps before the bias correction would give
    # lr * 1e-6 / (1e-6 + 1e-5 / sqrt(0.001)) ~ lr / 317.
    params = {"theta": np.array([0.0])}
    p1, _ = adam_update(params, {"theta": np.array([1e-6])}, adam_init(params), lr=1.0)
    assert p1["theta"][0] == pytest.approx(-1.0 / 11.0, rel=1e-9)


def test_adam_first_step_moves_every_coordinate_by_about_lr(rng):
    # On step 1 the update is lr * g / (|g| + eps): magnitude ~lr whatever the gradient scale.
    params = {"w": rng.normal(size=(4, 5)), "b": rng.normal(size=5)}
    grads = {"w": rng.normal(size=(4, 5)) * 100.0, "b": rng.normal(size=5) * 0.01}
    new, _ = adam_update(params, grads, adam_init(params), lr=1e-3, eps=0.0)
    for k in params:
        np.testing.assert_allclose(params[k] - new[k], 1e-3 * np.sign(grads[k]), rtol=1e-12)


def test_adam_is_pure(rng):
    params = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    grads = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    state = adam_init(params)
    state = adam_update(params, grads, state, lr=0.01)[1]  # non-zero moments
    copies = ({k: v.copy() for k, v in params.items()}, {k: v.copy() for k, v in grads.items()},
              {k: v.copy() for k, v in state["m"].items()}, {k: v.copy() for k, v in state["v"].items()})
    new_params, new_state = adam_update(params, grads, state, lr=0.01)
    for before, after in zip(copies, (params, grads, state["m"], state["v"])):
        for k in before:
            np.testing.assert_array_equal(before[k], after[k])
    assert state["t"] == 1 and new_state["t"] == 2
    for k in params:
        assert new_params[k] is not params[k]
        assert not np.shares_memory(new_params[k], params[k])
        assert not np.shares_memory(new_state["m"][k], state["m"][k])


def test_adam_keeps_float32():
    params = {"w": np.ones(3, dtype=np.float32)}
    new, state = adam_update(params, {"w": np.ones(3, dtype=np.float32)}, adam_init(params), lr=0.1)
    assert new["w"].dtype == np.float32 and state["m"]["w"].dtype == np.float32
    assert state["v"]["w"].dtype == np.float32


def test_adam_key_mismatch_names_the_key():
    params = {"a": np.zeros(2), "b": np.zeros(2)}
    state = adam_init(params)
    with pytest.raises(ValueError, match=r"missing.*'b'"):
        adam_update(params, {"a": np.zeros(2)}, state, lr=0.1)
    with pytest.raises(ValueError, match=r"extra.*'c'"):
        adam_update(params, {"a": np.zeros(2), "b": np.zeros(2), "c": np.zeros(1)}, state, lr=0.1)


@pytest.mark.parametrize("kwargs, match", [
    ({"lr": -1.0}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"lr": 0.1, "eps": -1e-8}, "eps"),
    ({"lr": 0.1, "betas": (1.0, 0.999)}, r"betas\[0\]"),
    ({"lr": 0.1, "betas": (0.9, -0.1)}, r"betas\[1\]"),
    ({"lr": 0.1, "betas": (0.9,)}, "betas"),
])
def test_adam_bad_hyperparameters(kwargs, match):
    params = {"a": np.zeros(2)}
    with pytest.raises(ValueError, match=match):
        adam_update(params, {"a": np.ones(2)}, adam_init(params), **kwargs)


def test_adam_bad_grads_and_state():
    params = {"a": np.zeros(2)}
    state = adam_init(params)
    with pytest.raises(ValueError, match=r"grads\['a'\].*shape"):
        adam_update(params, {"a": np.ones(3)}, state, lr=0.1)
    with pytest.raises(ValueError, match=r"grads\['a'\].*finite"):
        adam_update(params, {"a": np.array([1.0, np.nan])}, state, lr=0.1)
    with pytest.raises(ValueError, match="state"):
        adam_update(params, {"a": np.ones(2)}, {"t": 0}, lr=0.1)
    with pytest.raises(ValueError, match=r"state\['m'\]"):
        adam_update(params, {"a": np.ones(2)}, adam_init({"b": np.zeros(2)}), lr=0.1)


def test_adam_state_arrays_round_trip_bit_exact(rng):
    params = {"pi.w0": rng.normal(size=(3, 2)), "vf.b1": rng.normal(size=4).astype(np.float32)}
    grads = {k: rng.normal(size=v.shape).astype(v.dtype) for k, v in params.items()}
    state = adam_update(params, grads, adam_init(params), lr=0.01)[1]
    arrays = adam_state_to_arrays(state)
    assert set(arrays) == {"t", "m.pi.w0", "m.vf.b1", "v.pi.w0", "v.vf.b1"}
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    back = adam_state_from_arrays(arrays)
    assert back["t"] == 1 and isinstance(back["t"], int)
    for moment in ("m", "v"):
        for k in params:
            assert back[moment][k].dtype == state[moment][k].dtype
            np.testing.assert_array_equal(back[moment][k], state[moment][k])
    # the restored state continues exactly like the original
    a = adam_update(params, grads, state, lr=0.01)[0]
    b = adam_update(params, grads, back, lr=0.01)[0]
    for k in params:
        np.testing.assert_array_equal(a[k], b[k])


def test_adam_state_from_arrays_errors():
    with pytest.raises(ValueError, match="'t'"):
        adam_state_from_arrays({"m.a": np.zeros(1), "v.a": np.zeros(1)})
    with pytest.raises(ValueError, match="unexpected key 'x.a'"):
        adam_state_from_arrays({"t": np.array(1), "x.a": np.zeros(1)})
    with pytest.raises(ValueError, match="second moments"):
        adam_state_from_arrays({"t": np.array(1), "m.a": np.zeros(1)})


# ----------------------------------------------------------------------------------------------
# Global-norm clipping
# ----------------------------------------------------------------------------------------------

def test_clip_below_threshold_leaves_gradients_unchanged():
    # norm = sqrt(0.3^2 + 0.4^2) = 0.5 < max_norm 1: scale 1/(0.5 + 1e-6) > 1, not applied.
    grads = {"a": np.array([0.3]), "b": np.array([[0.4]])}
    out, norm = clip_by_global_norm(grads, 1.0)
    assert norm == pytest.approx(0.5, rel=1e-15)
    for k in grads:
        np.testing.assert_array_equal(out[k], grads[k])
        assert out[k] is not grads[k]


def test_clip_above_threshold_by_hand():
    # a = [3], b = [4, 0]: global norm sqrt(9 + 16) = 5 (not the per-array norms 3 and 4).
    # max_norm 0.5: scale = 0.5 / (5 + 1e-6); clipped norm = 5 * scale = 0.4999999.
    grads = {"a": np.array([3.0]), "b": np.array([4.0, 0.0])}
    out, norm = clip_by_global_norm(grads, 0.5)
    assert norm == 5.0  # the pre-clip norm
    scale = 0.5 / (5.0 + 1e-6)
    np.testing.assert_allclose(out["a"], [3.0 * scale], rtol=1e-15)
    np.testing.assert_allclose(out["b"], [4.0 * scale, 0.0], rtol=1e-15)
    assert global_norm(out) == pytest.approx(0.5 * 5.0 / (5.0 + 1e-6), rel=1e-14)
    np.testing.assert_array_equal(grads["a"], [3.0])  # input untouched


def test_clip_at_threshold_applies_the_tiny_scale():
    # norm == max_norm: scale = 1 / (1 + 1e-6) < 1, so torch (and we) still rescale slightly.
    out, norm = clip_by_global_norm({"a": np.array([1.0])}, 1.0)
    assert norm == 1.0
    assert out["a"][0] == pytest.approx(1.0 / (1.0 + 1e-6), rel=1e-15)


@given(st.integers(0, 2**31), st.floats(0.01, 10.0))
@settings(max_examples=25)
def test_clip_property_norm_bounded_and_direction_kept(seed, max_norm):
    r = np.random.default_rng(seed)
    grads = {f"g{i}": r.normal(size=r.integers(1, 6, size=r.integers(1, 3))) * r.uniform(0.01, 10)
             for i in range(3)}
    out, norm = clip_by_global_norm(grads, max_norm)
    flat = np.concatenate([g.ravel() for g in grads.values()])
    assert norm == pytest.approx(np.linalg.norm(flat), rel=1e-12)
    assert global_norm(out) <= max_norm * (1 + 1e-12) or norm < max_norm
    if norm > max_norm:
        np.testing.assert_allclose(np.concatenate([g.ravel() for g in out.values()]),
                                   flat * max_norm / (norm + 1e-6), rtol=1e-12)


def test_clip_nonfinite_raises_and_names_parameters():
    grads = {"pi.w0": np.array([1.0, np.nan]), "vf.w0": np.array([1.0]), "vf.b0": np.array([np.inf])}
    before = {k: v.copy() for k, v in grads.items()}
    with pytest.raises(FloatingPointError) as info:
        clip_by_global_norm(grads, 0.5)
    msg = str(info.value)
    assert "pi.w0" in msg and "vf.b0" in msg and "vf.w0" not in msg
    for k in grads:  # nothing updated
        np.testing.assert_array_equal(grads[k], before[k])


def test_clip_overflowing_sum_of_squares_raises():
    grads = {"big": np.array([1e200, 1e200]), "small": np.array([1.0])}
    with pytest.raises(FloatingPointError, match="overflow.*big"):
        clip_by_global_norm(grads, 0.5)


def test_clip_keeps_float32_and_validates():
    out, _ = clip_by_global_norm({"a": np.full(4, 10.0, dtype=np.float32)}, 1.0)
    assert out["a"].dtype == np.float32
    with pytest.raises(ValueError, match="max_norm"):
        clip_by_global_norm({"a": np.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="grads"):
        clip_by_global_norm([np.ones(2)], 1.0)


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------

def test_linear_schedule():
    assert linear_schedule(1e-3, 1.0) == 1e-3        # start of training
    assert linear_schedule(1e-3, 0.25) == 2.5e-4     # three quarters done
    assert linear_schedule(1e-3, 0.0) == 0.0         # end
    with pytest.raises(ValueError, match="progress_remaining"):
        linear_schedule(1e-3, 1.5)
    with pytest.raises(ValueError, match="initial"):
        linear_schedule(-1.0, 0.5)


def test_scheduled_value():
    assert scheduled_value("constant", 0.2, 0.1) == 0.2
    assert scheduled_value("linear", 0.2, 0.5) == 0.1
    with pytest.raises(ValueError, match="schedule"):
        scheduled_value("cosine", 0.2, 0.5)
    with pytest.raises(ValueError, match="progress_remaining"):
        scheduled_value("constant", 0.2, -0.1)


def test_adam_kernel_bit_equal_to_numpy_formula(rng):
    # torch's single-tensor Adam written with NumPy in the same operation order
    params = {"w": rng.normal(size=(5, 3)), "b": rng.normal(size=3)}
    state = adam_init(params)
    lr, (b1, b2), eps = 3e-3, (0.9, 0.999), 1e-5
    expected = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    for t in range(1, 4):
        grads = {k: rng.normal(size=p.shape) for k, p in params.items()}
        params, state = adam_update(params, grads, state, lr=lr)
        for k in expected:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v2[k] = b2 * v2[k] + (1 - b2) * grads[k] * grads[k]
            denom = np.sqrt(v2[k]) / (1 - b2 ** t) ** 0.5 + eps
            expected[k] = expected[k] - (lr / (1 - b1 ** t)) * m[k] / denom
            np.testing.assert_array_equal(params[k], expected[k])
            np.testing.assert_array_equal(state["m"][k], m[k])
            np.testing.assert_array_equal(state["v"][k], v2[k])


def test_global_norm_of_float32_gradients_accumulates_in_float64():
    # 3e38 fits float32, its square does not: the norm must still be the finite sqrt(3) * 3e38
    grads = {"w": np.full(3, 3e38, dtype=np.float32)}
    expected = math.sqrt(3.0) * float(np.float32(3e38))
    assert global_norm(grads) == pytest.approx(expected, rel=1e-12)
    out, norm = clip_by_global_norm(grads, 1.0)
    assert norm == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(out["w"], 1.0 / math.sqrt(3.0), rtol=1e-6)


def test_adam_non_finite_params_or_moments_raise_naming_them():
    params = {"a": np.array([0.0, np.nan])}
    match = r"^params\['a'\] and state\['m'/'v'\]\['a'\] must be finite"
    with pytest.raises(ValueError, match=match):
        adam_update(params, {"a": np.ones(2)}, adam_init(params), lr=0.1)
    params = {"a": np.zeros(2)}
    state = adam_init(params)
    state["v"]["a"][1] = np.inf
    with pytest.raises(ValueError, match=r"^params\['a'\] and state"):
        adam_update(params, {"a": np.ones(2)}, state, lr=0.1)
    with pytest.raises(ValueError, match=r"^state\['m'\] must be a dict"):
        bad_state = {"t": 0, "m": [np.zeros(2)], "v": {"a": np.zeros(2)}}
        adam_update(params, {"a": np.ones(2)}, bad_state, lr=0.1)
    with pytest.raises(ValueError, match=r"^state\['v'\] must be a dict"):
        adam_state_to_arrays({"t": 0, "m": {}, "v": []})


def test_adam_update_takes_and_returns_plain_dicts(rng):
    """Views of one buffer in, plain dicts of new arrays out (the same values as from separate
    arrays), sharing no memory with the inputs."""
    params = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    grads = {k: rng.normal(size=v.shape) for k, v in params.items()}
    a, sa = adam_update(params, grads, adam_init(params), lr=0.01)
    buffer = np.concatenate([params["w"].ravel(), params["b"]])
    views = {"w": buffer[:6].reshape(3, 2), "b": buffer[6:]}
    b, sb = adam_update(views, grads, adam_init(views), lr=0.01)
    assert type(b) is dict and type(sb["m"]) is dict
    for k in params:
        np.testing.assert_array_equal(a[k], b[k])
        assert not np.shares_memory(b[k], buffer)


def test_adam_float32_params_with_float64_grads_round_the_grads_first():
    params = {"w": np.ones(2, dtype=np.float32)}
    g64 = {"w": np.array([0.1, 1.0 / 3.0])}
    g32 = {"w": g64["w"].astype(np.float32)}
    a = adam_update(params, g64, adam_init(params), lr=0.1)[0]
    b = adam_update(params, g32, adam_init(params), lr=0.1)[0]
    np.testing.assert_array_equal(a["w"], b["w"])


# ----------------------------------------------------------------------------------------------
# the compiled twins (ppo_ref.fast.optim): pure, whatever dicts they are given
# ----------------------------------------------------------------------------------------------

def _dicts(rng, scale=1.0):
    return {"w": scale * rng.standard_normal((5, 3)), "b": scale * rng.standard_normal(5),
            "v": scale * rng.standard_normal(2)}


def test_fast_twins_never_write_their_inputs_and_follow_edited_outputs():
    """The twins read their own outputs in place: editing a returned array in place, or
    putting another array in a returned dict, gives what the spec gives on the same dicts; no
    input is ever written."""
    from ppo_ref.fast import optim as fast
    rng = np.random.default_rng(11)
    params, grads = _dicts(rng), _dicts(rng, 0.3)
    fp, fs = fast.adam_update(params, fast.clip_by_global_norm(grads, 0.5)[0],
                              adam_init(params), lr=1e-2)
    sp, ss = adam_update(params, clip_by_global_norm(grads, 0.5)[0], adam_init(params), lr=1e-2)
    fp["w"][0, 0] += 1.0  # in place: the next step reads the edit
    sp["w"][0, 0] += 1.0
    fs["m"]["b"] = fs["m"]["b"] * 2.0  # replaced: the next step reads the new array
    ss["m"]["b"] = ss["m"]["b"] * 2.0
    fp["v"], fp["b"] = fp["b"][:2].copy(), fp["b"]  # another array, and one moved
    sp["v"], sp["b"] = sp["b"][:2].copy(), sp["b"]
    snapshot = [{k: a.copy() for k, a in d.items()} for d in (fp, fs["m"], fs["v"])]
    new_grads = _dicts(rng, 0.3)
    fp2, fs2 = fast.adam_update(fp, new_grads, fs, lr=1e-2)
    sp2, ss2 = adam_update(sp, new_grads, ss, lr=1e-2)
    for f, s in ((fp2, sp2), (fs2["m"], ss2["m"]), (fs2["v"], ss2["v"])):
        assert list(f) == list(s)
        for k in s:
            np.testing.assert_array_equal(f[k], s[k])
    for before, now in zip(snapshot, (fp, fs["m"], fs["v"])):
        for k in before:
            np.testing.assert_array_equal(now[k], before[k])


def test_fast_twins_raise_for_non_finite_results_and_mismatched_dicts():
    from ppo_ref.fast import optim as fast
    params = {"a": np.ones(3)}
    state = adam_init(params)
    with pytest.raises(FloatingPointError, match="^ppo_ref.fast.optim.clip_by_global_norm"):
        fast.clip_by_global_norm({"a": np.array([np.inf, 1.0])}, 1.0)
    with pytest.raises(FloatingPointError, match="^ppo_ref.fast.optim.adam_update"):
        fast.adam_update(params, {"a": np.array([np.nan, 0.0, 0.0])}, state, lr=1e-3)
    with pytest.raises(ValueError, match="keys of params"):
        fast.adam_update(params, {"b": np.ones(3)}, state, lr=1e-3)
    with pytest.raises(ValueError, match="shapes of params"):
        fast.adam_update(params, {"a": np.ones(4)}, state, lr=1e-3)


def _chain(tier, params, grads_seq, keep_every=0):
    """clip_by_global_norm then adam_update over ``grads_seq``, as the trainer steps; every
    ``keep_every``-th result is kept (with a copy of its values taken when it was returned)."""
    state, kept = adam_init(params), []
    for i, grads in enumerate(grads_seq):
        clipped, _ = tier.clip_by_global_norm(grads, 0.5)
        params, state = tier.adam_update(params, clipped, state, lr=1e-2)
        if keep_every and i % keep_every == 0:
            kept.append(((params, state, clipped),
                         [{k: a.copy() for k, a in d.items()} for d in (params, state["m"],
                                                                       state["v"], clipped)]))
    return params, state, kept


def test_fast_twins_never_rewrite_results_the_caller_keeps():
    """Over many steps, results the caller keeps (dicts, single arrays, views of them, weak
    references) keep their values, and the chain gives the spec's bits at every step."""
    import weakref
    from ppo_ref.fast import optim as fast
    from ppo_ref.spec import optim as spec
    rng = np.random.default_rng(12)
    params = _dicts(rng)
    grads_seq = [_dicts(rng, 0.3) for _ in range(40)]
    sp, ss, _ = _chain(spec, params, grads_seq)
    fp, fs, kept = _chain(fast, params, grads_seq, keep_every=3)
    for d_spec, d_fast in ((sp, fp), (ss["m"], fs["m"]), (ss["v"], fs["v"])):
        for k in d_spec:
            np.testing.assert_array_equal(d_fast[k], d_spec[k])
    for (p, s, c), copies in kept:
        for d, copy in zip((p, s["m"], s["v"], c), copies):
            for k in d:
                np.testing.assert_array_equal(d[k], copy[k])
    # one array, a view of one, a weak reference: each held alone across further steps
    held, _ = fast.adam_update(fp, _dicts(rng, 0.3), fs, lr=1e-2)
    single, part, weak = held["w"], held["b"][1:], weakref.ref(held["v"])
    before = (single.copy(), part.copy(), held["v"].copy())
    del held
    _chain(fast, fp, grads_seq[:10])
    np.testing.assert_array_equal(single, before[0])
    np.testing.assert_array_equal(part, before[1])
    if weak() is not None:
        np.testing.assert_array_equal(weak(), before[2])
    # a weak reference alone (nothing else of that result held)
    kept.clear()
    held = fast.adam_update(fp, _dicts(rng, 0.3), fs, lr=1e-2)[0]
    weak, before = weakref.ref(held["w"]), held["w"].copy()
    del held
    _chain(fast, fp, grads_seq[:10])
    if weak() is not None:
        np.testing.assert_array_equal(weak(), before)


def test_fast_twins_in_two_threads_give_each_its_own_results():
    """Two chains of clip and Adam in two threads at once give the bits of each run alone."""
    import threading
    from ppo_ref.fast import optim as fast
    rng = np.random.default_rng(13)
    runs = [(_dicts(rng), [_dicts(rng, 0.3) for _ in range(200)]) for _ in range(2)]
    alone = [_chain(fast, p, g)[:2] for p, g in runs]
    together = [None, None]

    def run(i):
        together[i] = _chain(fast, *runs[i])[:2]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (pa, sa), (pt, st_) in zip(alone, together):
        for da, dt in ((pa, pt), (sa["m"], st_["m"]), (sa["v"], st_["v"])):
            for k in da:
                np.testing.assert_array_equal(dt[k], da[k])
