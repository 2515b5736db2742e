"""The fused in-place clipped-Adam step of the fast update (ppo_ref.fast.optim.clipped_adam_step) on
one-buffer parameter dicts (ppo_ref.fast.flat), against the spec's clip_by_global_norm + adam_update
on plain dicts."""
import math

import numpy as np
import pytest

from ppo_ref.fast.flat import FlatArrays, flatten_arrays
from ppo_ref.fast.optim import (_adam_pass_in_place,
                                _first_non_finite_result, _layout_segments,
                                _segmented_global_norm,
                                clipped_adam_step)
from ppo_ref.optim import adam_init, adam_update, clip_by_global_norm, global_norm
from ppo_ref.spec.optim import adam_element


def arrays(rng, scale=1.0):
    return {"w0": scale * rng.standard_normal((7, 3)), "b0": scale * rng.standard_normal(7),
            "w1": scale * rng.standard_normal((2, 7)), "b1": scale * rng.standard_normal(2)}


def own_state(p):
    """A FlatArrays state with buffers of its own, as the fast run_epochs makes."""
    return {"t": 0, "m": flatten_arrays(adam_init(p)["m"], p.layout),
            "v": flatten_arrays(adam_init(p)["v"], p.layout)}


def test_clipped_adam_step_equals_spec_clip_then_adam(rng):
    """In place, step after step (clipped and not): the spec's results. The global norms are
    summed in another order (sequence vs NumPy's pairwise sum): equal within 1e-14 relative,
    and the results bit for bit whenever no clipping happens."""
    p_ref = arrays(rng)
    s_ref = adam_init(p_ref)
    p = flatten_arrays(p_ref)
    s = own_state(p)
    buffers = (p.flat, s["m"].flat, s["v"].flat)
    for step in range(6):
        clipping = step % 2 == 1
        g_ref = arrays(rng, 3.0 if clipping else 0.01)
        clipped, n_ref = clip_by_global_norm(g_ref, 0.5)
        p_ref, s_ref = adam_update(p_ref, clipped, s_ref, lr=1e-2)
        p_new, s, n = clipped_adam_step(p, flatten_arrays(g_ref), s, max_norm=0.5, lr=1e-2)
        assert p_new is p and p.flat is buffers[0]  # in place
        assert s["m"].flat is buffers[1] and s["v"].flat is buffers[2]
        assert s["t"] == s_ref["t"] == step + 1
        assert n == pytest.approx(n_ref, rel=1e-14)
        for k in p_ref:
            for a, b in ((p[k], p_ref[k]), (s["m"][k], s_ref["m"][k]), (s["v"][k], s_ref["v"][k])):
                if step == 0:  # (no clipping yet: the same bits)
                    np.testing.assert_array_equal(a, b)
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_clipped_adam_step_without_clipping_is_bit_exact(rng):
    p_ref = arrays(rng)
    s_ref = adam_init(p_ref)
    p = flatten_arrays(p_ref)
    s = own_state(p)
    for _ in range(4):
        g_ref = arrays(rng, 0.01)  # global norm far below max_norm: scale 1
        p_ref, s_ref = adam_update(p_ref, clip_by_global_norm(g_ref, 10.0)[0], s_ref, lr=1e-2)
        p, s, _ = clipped_adam_step(p, flatten_arrays(g_ref), s, max_norm=10.0, lr=1e-2)
    for k in p_ref:
        np.testing.assert_array_equal(p[k], p_ref[k])
        np.testing.assert_array_equal(s["v"][k], s_ref["v"][k])


def test_clipped_adam_step_refuses_what_it_cannot_write_in_place(rng):
    p = flatten_arrays(arrays(rng))
    s = own_state(p)
    g = flatten_arrays(arrays(rng))
    view = FlatArrays.from_buffer(np.empty(2 * p.flat.size)[:p.flat.size], p.layout)
    other_view = FlatArrays.from_buffer(view.flat.base[p.flat.size:], p.layout)
    refused = [(dict(p), g, s), (p, dict(g), s), (p, p, s), (p, g, {**s, "m": p}),
               (view, g, {**s, "m": other_view}),
               (p, flatten_arrays(arrays(rng), dtype=np.float32), s)]
    before = [b.copy() for b in (p.flat, s["m"].flat, s["v"].flat)]
    for args in refused:
        with pytest.raises(ValueError, match="clipped_adam_step"):
            clipped_adam_step(*args, max_norm=0.5, lr=1e-2)
    for kwargs, match in (({"max_norm": 0.0, "lr": 1e-2}, "max_norm"),
                          ({"max_norm": 0.5, "lr": -1.0}, "lr"),
                          ({"max_norm": 0.5, "lr": 1e-2, "betas": (0.9, 1.0)}, r"betas\[1\]"),
                          ({"max_norm": 0.5, "lr": 1e-2, "eps": math.nan}, "eps")):
        with pytest.raises(ValueError, match=match):
            clipped_adam_step(p, g, s, **kwargs)
    with pytest.raises(ValueError, match=r"state\['t'\]"):
        clipped_adam_step(p, g, {**s, "t": -1}, max_norm=0.5, lr=1e-2)
    g_bad = flatten_arrays(arrays(rng))
    g_bad["b1"][0] = np.inf
    with pytest.raises(FloatingPointError, match="b1"):
        clipped_adam_step(p, g_bad, s, max_norm=0.5, lr=1e-2)
    assert all(np.array_equal(a, b) for a, b in zip((p.flat, s["m"].flat, s["v"].flat), before))
    s["v"]["w1"][1, 2] = np.nan
    kept = [a.copy() for a in (p.flat, s["m"].flat, s["v"].flat)]
    with pytest.raises(ValueError, match=r"params\['w1'\].*nothing was changed"):
        clipped_adam_step(p, g, s, max_norm=0.5, lr=1e-2)
    # a refused step changes nothing: not the parameters, not the moments
    for a, b in zip((p.flat, s["m"].flat, s["v"].flat), kept):
        np.testing.assert_array_equal(a, b)
    # finite inputs whose step overflows: b1[0] = 1.7e308 moves up by about lr = 1e308
    s["v"]["w1"][1, 2] = 0.0
    s["m"]["b1"][0] = s["v"]["b1"][0] = 0.0
    g_up = flatten_arrays(dict(g))
    g_up["b1"][0] = -1.0
    p["b1"][0] = 1.7e308
    kept = [a.copy() for a in (p.flat, s["m"].flat, s["v"].flat)]
    with pytest.raises(ValueError, match="must be finite"):
        clipped_adam_step(p, g_up, {**s, "t": 0}, max_norm=0.5, lr=1e308)
    for a, b in zip((p.flat, s["m"].flat, s["v"].flat), kept):
        np.testing.assert_array_equal(a, b)


def test_flat_global_norm_kernel_within_rounding_of_spec(rng):
    for scale in (1e-3, 1.0, 1e3):
        g = flatten_arrays(arrays(rng, scale))
        assert _segmented_global_norm(g.flat, *_layout_segments(g.layout)) == pytest.approx(
            global_norm(dict(g)), rel=1e-14)
    # arrays of the sizes of the policies' weights (up to 256 x 64), and of a few entries
    big = {"w": rng.standard_normal((256, 64)), "b": rng.standard_normal(256),
           "u": rng.standard_normal((1, 3)), "c": rng.standard_normal(1)}
    g = flatten_arrays(big)
    assert _segmented_global_norm(g.flat, *_layout_segments(g.layout)) == pytest.approx(
        global_norm(big), rel=1e-14)




def test_in_place_kernel_is_the_spec_element_and_changes_nothing_unless_finite(rng):
    """The compiled in-place kernel (and its interpreted py_func) writes adam_element(param,
    g * scale, m, v, ...) of the spec, bit for bit; when a parameter, moment or result at any
    position (vector body and remainder) is not finite it returns False and every buffer holds
    what it held before (nan where it was nan)."""
    n = 1037  # not a multiple of any vector width
    p, g, m = (rng.standard_normal(n) for _ in range(3))
    v = rng.standard_normal(n) ** 2
    args = (0.9, 0.999, 1e-3 / 0.19, math.sqrt(0.001999), 1e-5)
    kernels = [_adam_pass_in_place] + (
        [_adam_pass_in_place.py_func]
        if hasattr(_adam_pass_in_place, "py_func") else [])
    for scale in (0.37, 1.0):
        want = np.stack(adam_element(p, g * scale, m, v, *args))
        for kernel in kernels:
            pm, mm, vm = p.copy(), m.copy(), v.copy()
            assert kernel(pm, g, scale, mm, vm, *args, np.full((3, n), np.nan))
            np.testing.assert_array_equal(np.stack([pm, mm, vm]), want)
    for which in range(3):
        for pos in (0, 5, n - 1):
            for bad in (np.inf, -np.inf, np.nan):
                work = [p.copy(), m.copy(), v.copy()]
                work[which][pos] = bad
                before = np.stack(work)
                with np.errstate(invalid="ignore"):
                    assert _first_non_finite_result(work[0], g, 1.0, work[1], work[2],
                                                    *args) == pos
                    for kernel in kernels:
                        assert not kernel(work[0], g, 1.0, work[1], work[2], *args,
                                          np.empty((3, n)))
                        np.testing.assert_array_equal(np.stack(work), before)
    work = [p.copy(), m.copy(), v.copy()]
    assert not _adam_pass_in_place(work[0], np.full(n, 1e300), 1.0, work[1], work[2],
                                             *args, np.empty((3, n)))
    np.testing.assert_array_equal(np.stack(work), np.stack([p, m, v]))
