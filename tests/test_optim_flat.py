"""adam_update / clip_by_global_norm on one-buffer parameter dicts (ppo_ref.flat): the fused
paths give exactly the bits of the per-array paths and stay pure."""
import numpy as np
import pytest

from ppo_ref.flat import flatten_arrays, is_flat
from ppo_ref.optim import adam_init, adam_update, clip_by_global_norm, global_norm


def arrays(rng, scale=1.0):
    return {"w0": scale * rng.standard_normal((7, 3)), "b0": scale * rng.standard_normal(7),
            "w1": scale * rng.standard_normal((2, 7)), "b1": scale * rng.standard_normal(2)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_flat_adam_equals_per_array_adam_bit_for_bit(rng, dtype):
    p_dict = {k: v.astype(dtype) for k, v in arrays(rng).items()}
    p_flat = flatten_arrays(p_dict)
    s_dict, s_flat = adam_init(p_dict), adam_init(p_flat)
    assert is_flat(s_flat["m"]) and is_flat(s_flat["v"])
    for step in range(5):
        g = {k: v.astype(dtype) for k, v in arrays(rng).items()}
        g_flat = flatten_arrays(g)
        before = p_flat.flat.copy()
        p_dict, s_dict = adam_update(p_dict, g, s_dict, lr=1e-2, eps=1e-5)
        new_flat, s_flat = adam_update(p_flat, g_flat, s_flat, lr=1e-2, eps=1e-5)
        assert np.array_equal(p_flat.flat, before)  # pure: the inputs are untouched
        p_flat = new_flat
        assert is_flat(p_flat) and s_flat["t"] == s_dict["t"] == step + 1
        for k in p_dict:
            assert p_flat[k].dtype == dtype
            assert np.array_equal(p_flat[k], p_dict[k])
            assert np.array_equal(s_flat["m"][k], s_dict["m"][k])
            assert np.array_equal(s_flat["v"][k], s_dict["v"][k])


def test_flat_adam_errors_name_the_arrays(rng):
    p = flatten_arrays(arrays(rng))
    g = flatten_arrays(arrays(rng))
    g["w1"][0, 1] = np.nan
    state = adam_init(p)
    with pytest.raises(ValueError, match=r"grads\['w1'\]"):
        adam_update(p, g, state, lr=1e-3)
    with pytest.raises(ValueError, match="state\\['t'\\]"):
        adam_update(p, flatten_arrays(arrays(rng)), {"t": -1, "m": state["m"], "v": state["v"]},
                    lr=1e-3)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0])
def test_flat_clip_equals_per_array_clip(rng, scale):
    g = arrays(rng, scale)
    g_flat = flatten_arrays(g)
    clipped, norm = clip_by_global_norm(g, 0.5)
    clipped_flat, norm_flat = clip_by_global_norm(g_flat, 0.5)
    assert norm == norm_flat == global_norm(g_flat) == global_norm(g)
    assert is_flat(clipped_flat) and not np.shares_memory(clipped_flat.flat, g_flat.flat)
    for k in g:
        assert np.array_equal(clipped_flat[k], clipped[k])


def test_flat_clip_non_finite_names_arrays(rng):
    g = flatten_arrays(arrays(rng))
    g["b0"][3] = np.inf
    with pytest.raises(FloatingPointError, match="b0"):
        clip_by_global_norm(g, 0.5)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0])
def test_clipped_adam_step_equals_clip_then_adam(rng, scale):
    from ppo_ref.optim import clipped_adam_step
    p = flatten_arrays(arrays(rng))
    state = adam_init(p)
    ref_p, ref_state = p, state
    for _ in range(3):
        g = flatten_arrays(arrays(rng, scale))
        clipped, ref_norm = clip_by_global_norm(g, 0.5)
        ref_p, ref_state = adam_update(ref_p, clipped, ref_state, lr=1e-2)
        p, state, norm = clipped_adam_step(p, g, state, max_norm=0.5, lr=1e-2)
        assert norm == ref_norm and state["t"] == ref_state["t"] and is_flat(p)
        for k in p:
            assert np.array_equal(p[k], ref_p[k])
            assert np.array_equal(state["m"][k], ref_state["m"][k])
            assert np.array_equal(state["v"][k], ref_state["v"][k])
    assert clipped_adam_step(dict(p), g, state, max_norm=0.5, lr=1e-2) is None
    g = flatten_arrays(arrays(rng))
    g["w0"][1, 1] = np.nan
    with pytest.raises(FloatingPointError, match="w0"):
        clipped_adam_step(p, g, state, max_norm=0.5, lr=1e-2)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_norm": 0.0}, "max_norm"), ({"max_norm": float("nan")}, "max_norm"),
    ({"max_norm": float("inf")}, "max_norm"), ({"lr": -1e-3}, "lr"),
    ({"lr": float("inf")}, "lr"), ({"lr": True}, "lr"), ({"eps": float("nan")}, "eps"),
    ({"betas": (0.9, 1.0)}, r"betas\[1\]"), ({"betas": (-0.1, 0.999)}, r"betas\[0\]"),
    ({"betas": (0.9, "x")}, r"betas\[1\]"), ({"betas": (0.9,)}, "betas"),
])
def test_clipped_adam_step_checks_scalars(rng, kwargs, match):
    from ppo_ref.optim import clipped_adam_step
    p = flatten_arrays(arrays(rng))
    g = flatten_arrays(arrays(rng))
    args = {"max_norm": 0.5, "lr": 1e-2, **kwargs}
    with pytest.raises(ValueError, match=match):
        clipped_adam_step(p, g, adam_init(p), **args)
    for bad_t in (True, -1, 1.0):
        with pytest.raises(ValueError, match="state"):
            clipped_adam_step(p, g, {**adam_init(p), "t": bad_t}, max_norm=0.5, lr=1e-2)


def test_clipped_adam_step_numpy_scalars_same_bits(rng):
    """numpy scalar arguments take the general checks and give the bits of Python floats."""
    from ppo_ref.optim import clipped_adam_step
    p = flatten_arrays(arrays(rng))
    g = flatten_arrays(arrays(rng, 3.0))
    a = clipped_adam_step(p, g, adam_init(p), max_norm=0.5, lr=1e-2, eps=1e-5)
    b = clipped_adam_step(p, g, {**adam_init(p), "t": np.int64(0)}, max_norm=np.float64(0.5),
                          lr=np.float64(1e-2), eps=np.float64(1e-5),
                          betas=(np.float64(0.9), 0.999))
    assert a[2] == b[2]
    assert np.array_equal(a[0].flat, b[0].flat) and np.array_equal(a[1]["v"].flat, b[1]["v"].flat)


def test_clipped_adam_step_out_same_bits_and_checks(rng):
    """``out=`` writes the same bits into the given buffers (alternating two sets over steps,
    as run_epochs does) and leaves the inputs untouched; overlapping targets are refused."""
    from ppo_ref.optim import clipped_adam_step
    p0 = flatten_arrays(arrays(rng))
    sets = [tuple(p0.empty_like() for _ in range(3)) for _ in range(2)]
    p_ref, s_ref = p0, adam_init(p0)
    p, s = p0, adam_init(p0)
    p0_bits = p0.flat.copy()
    for step in range(4):
        g = flatten_arrays(arrays(rng, 3.0))
        p_ref, s_ref, n_ref = clipped_adam_step(p_ref, g, s_ref, max_norm=0.5, lr=1e-2)
        out = sets[step % 2]
        p, s, n = clipped_adam_step(p, g, s, max_norm=0.5, lr=1e-2, out=out)
        assert p is out[0] and s["m"] is out[1] and s["v"] is out[2] and is_flat(p)
        assert n == n_ref and s["t"] == s_ref["t"] == step + 1
        assert np.array_equal(p.flat, p_ref.flat)
        assert np.array_equal(s["m"].flat, s_ref["m"].flat)
        assert np.array_equal(s["v"].flat, s_ref["v"].flat)
    assert np.array_equal(p0.flat, p0_bits)
    g = flatten_arrays(arrays(rng))
    state = adam_init(p0)
    fresh = tuple(p0.empty_like() for _ in range(3))
    bad_outs = [
        (p0, fresh[1], fresh[2]),  # the params themselves
        (fresh[0], state["m"], fresh[2]),  # a moment buffer
        (fresh[0], fresh[0], fresh[2]),  # one buffer twice
        (fresh[0], fresh[1]),  # not a triple
        (dict(fresh[0]), fresh[1], fresh[2]),  # not a FlatArrays
    ]
    from ppo_ref.flat import FlatArrays
    view_owner = np.empty(2 * p0.flat.size)
    bad_outs.append((FlatArrays.from_buffer(view_owner[:p0.flat.size], p0.layout),
                     fresh[1], fresh[2]))  # a view
    for bad in bad_outs:
        with pytest.raises(ValueError, match="out"):
            clipped_adam_step(p0, g, state, max_norm=0.5, lr=1e-2, out=bad)


def test_clipped_adam_step_in_place_same_bits_and_refusals(rng):
    """The in-place step (run_epochs from its second step on) gives the bits of
    clipped_adam_step, writing into the given params and moments; it declines (None, nothing
    written) when a buffer is shared or a view, checks its arguments before writing, and names
    the array whose step is not finite."""
    from ppo_ref.flat import FlatArrays
    from ppo_ref.optim import _clipped_adam_step_in_place, clipped_adam_step
    p0 = flatten_arrays(arrays(rng))
    p_ref, s_ref = p0, adam_init(p0)
    p, s = clipped_adam_step(p0, flatten_arrays(arrays(rng, 0.0)), adam_init(p0), max_norm=0.5,
                             lr=0.0)[:2]  # own buffers (lr 0: the values of p0)
    s = {**s, "t": 0}
    assert np.array_equal(p.flat, p0.flat)
    buffers = (p.flat, s["m"].flat, s["v"].flat)
    for step in range(4):
        g = flatten_arrays(arrays(rng, 3.0 if step % 2 else 0.01))  # clipped, then not
        p_ref, s_ref, n_ref = clipped_adam_step(p_ref, g, s_ref, max_norm=0.5, lr=1e-2)
        p_new, s, n = _clipped_adam_step_in_place(p, g, s, max_norm=0.5, lr=1e-2)
        assert p_new is p and p.flat is buffers[0]
        assert s["m"].flat is buffers[1] and s["v"].flat is buffers[2]
        assert n == n_ref and s["t"] == s_ref["t"] == step + 1
        for a, b in ((p, p_ref), (s["m"], s_ref["m"]), (s["v"], s_ref["v"])):
            assert np.array_equal(a.flat, b.flat)
    g = flatten_arrays(arrays(rng))
    before = [b.copy() for b in buffers]
    view = FlatArrays.from_buffer(np.empty(2 * p.flat.size)[:p.flat.size], p.layout)
    declined = [(p, p, s), (p, g, {**s, "m": p}), (view, g, s),
                (p, FlatArrays.from_buffer(p.flat[:], p.layout), s), (dict(p), g, s)]
    for args in declined:
        assert _clipped_adam_step_in_place(*args, max_norm=0.5, lr=1e-2) is None
    for kwargs in ({"max_norm": 0.0, "lr": 1e-2}, {"max_norm": 0.5, "lr": -1.0},
                   {"max_norm": 0.5, "lr": 1e-2, "betas": (0.9, 1.0)}):
        with pytest.raises(ValueError):
            _clipped_adam_step_in_place(p, g, s, **kwargs)
    g_bad = flatten_arrays(arrays(rng))
    g_bad["b1"][0] = np.inf
    with pytest.raises(FloatingPointError, match="b1"):
        _clipped_adam_step_in_place(p, g_bad, s, max_norm=0.5, lr=1e-2)
    assert all(np.array_equal(a, b) for a, b in zip(buffers, before))  # nothing written
    s["v"]["w1"][1, 2] = np.nan
    with pytest.raises(ValueError, match=r"params\['w1'\]"):
        _clipped_adam_step_in_place(p, g, s, max_norm=0.5, lr=1e-2)


def test_clipped_adam_kernel_compiled_equals_python_and_flags_non_finite(rng):
    """The vectorized clipped-Adam kernel: same bits as its interpreted version and as
    clip_by_global_norm + adam_update (the loop above), and its finiteness count catches a
    non-finite parameter, moment or result at any position (vector body and remainder)."""
    import math
    from ppo_ref.optim import _clipped_adam_kernel
    n = 1037  # not a multiple of any vector width
    p, g, m = (rng.standard_normal(n) for _ in range(3))
    v = rng.standard_normal(n) ** 2
    args = (0.9, 0.999, 1e-3 / 0.19, math.sqrt(0.001999), 1e-5)
    for scale in (0.37, 1.0):
        outs = [np.empty((3, n)) for _ in range(2)]
        kernels = [_clipped_adam_kernel] + ([_clipped_adam_kernel.py_func]
                                            if hasattr(_clipped_adam_kernel, "py_func") else [])
        flags = [k(p, g, scale, m, v, *args, *o) for k, o in zip(kernels, outs)]
        assert all(flags)
        if len(kernels) == 2:
            np.testing.assert_array_equal(outs[0], outs[1])
        # element-wise the formula of adam_update on the product g * scale
        m_ref = 0.9 * m + (1.0 - 0.9) * (g * scale)
        v_ref = 0.999 * v + (1.0 - 0.999) * (g * scale) * (g * scale)
        p_ref = p - args[2] * m_ref / (np.sqrt(v_ref) / args[3] + args[4])
        np.testing.assert_array_equal(outs[0], np.stack([p_ref, m_ref, v_ref]))
    out = np.empty((3, n))
    for name, arr in (("p", p), ("m", m), ("v", v)):
        for pos in (0, 5, n - 1):
            for bad in (np.inf, -np.inf, np.nan):
                a = arr.copy()
                a[pos] = bad
                call = {"p": (a, g, 1.0, m, v), "m": (p, g, 1.0, a, v), "v": (p, g, 1.0, m, a)}[name]
                with np.errstate(invalid="ignore"):
                    assert not _clipped_adam_kernel(*call, *args, *out), (name, pos, bad)
    big = np.full(n, 1e300)  # finite inputs whose step overflows
    assert not _clipped_adam_kernel(p, big, 1.0, m, v, *args, *out)


def test_clipped_adam_kernel_in_place_equals_out_of_place_kernel(rng):
    """The in-place kernel writes exactly the out-of-place kernel's results into its inputs
    (compiled and interpreted) and flags the same non-finite cases."""
    import math
    from ppo_ref.optim import _clipped_adam_kernel, _clipped_adam_kernel_in_place
    n = 1037
    p, g, m = (rng.standard_normal(n) for _ in range(3))
    v = rng.standard_normal(n) ** 2
    args = (0.9, 0.999, 1e-3 / 0.19, math.sqrt(0.001999), 1e-5)
    kernels = [_clipped_adam_kernel_in_place] + (
        [_clipped_adam_kernel_in_place.py_func]
        if hasattr(_clipped_adam_kernel_in_place, "py_func") else [])
    for scale in (0.37, 1.0):
        out = np.empty((3, n))
        assert _clipped_adam_kernel(p, g, scale, m, v, *args, *out)
        for kernel in kernels:
            pm, mm, vm = p.copy(), m.copy(), v.copy()
            assert kernel(pm, g, scale, mm, vm, *args)
            np.testing.assert_array_equal(np.stack([pm, mm, vm]), out)
    for which in range(3):
        for pos in (0, 5, n - 1):
            arrays = [p.copy(), m.copy(), v.copy()]
            arrays[which][pos] = np.nan
            with np.errstate(invalid="ignore"):
                assert not _clipped_adam_kernel_in_place(arrays[0], g, 1.0, arrays[1],
                                                         arrays[2], *args)
    assert not _clipped_adam_kernel_in_place(p.copy(), np.full(n, 1e300), 1.0, m.copy(),
                                             v.copy(), *args)
