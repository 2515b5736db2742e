"""The one table of twins: every public function of a ``ppo_ref.fast.<module>`` equals its
namesake in ``ppo_ref.spec.<module>``, bit for bit or within the row's tolerance.

The rows are derived from the spec modules' ``__all__``: for every module both tiers have and
every function of ``spec.<module>.__all__`` that ``fast.<module>`` defines, there is exactly one
entry in :data:`ROWS`, holding one or more :class:`Case` s. A case's ``run(tier, rng)`` draws its
inputs from ``rng``, calls the tier's function (and whatever of the same tier it needs first, such
as the forward pass whose cache a backward reads) and returns what is compared. Both tiers get a
generator of the same seed, so sampling functions see the same draws.

A result compares equal when every array or float in it satisfies
``|fast - spec| <= atol + rtol * max|spec|`` (per array; ``rtol = atol = 0``: the same bits, NaN
equal to NaN), with the same shape, and the same integer or boolean values.
"""
from __future__ import annotations

import importlib
import math
import pkgutil
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import numpy as np
import pytest

import ppo_ref.fast
import ppo_ref.spec


class Case(NamedTuple):
    """One way of calling a twin: ``run(tier_module, rng) -> result``; ``tier_module`` is the
    module ``ppo_ref.spec.<m>`` or ``ppo_ref.fast.<m>`` (or the package, for cases that need
    several modules of the tier: then ``run`` receives the ``Tier`` of :func:`ppo_ref.tiers.tier_for`)."""
    name: str
    run: Callable[[Any, np.random.Generator], Any]
    rtol: float = 0.0
    atol: float = 0.0
    whole_tier: bool = False


BITS = dict(rtol=0.0, atol=0.0)

#: (module, function) -> the cases of that twin. Each section is owned by the module's author.
ROWS: Dict[Tuple[str, str], List[Case]] = {}

# --- masks, advantages -------------------------------------------------------------------------

# --- distributions -----------------------------------------------------------------------------

# --- losses, optim -----------------------------------------------------------------------------

# --- layers, networks --------------------------------------------------------------------------
# The MLP and actor-critic twins. A float32 case gives the fast tier float32 parameters and
# inputs and the spec the same values widened to float64 (the spec computes in float64).

from ppo_ref.spec import layers as spec_layers, networks as spec_networks  # noqa: E402

MLP_F64 = dict(rtol=1e-12, atol=1e-14)
MLP_F32 = dict(rtol=1e-4, atol=1e-6)


def _as(tier, dtype, arrays):
    """``arrays`` (a dict or one array) rounded to ``dtype``, widened back to float64 for the
    spec tier."""
    spec = tier.__name__.startswith("ppo_ref.spec")

    def cast(a):
        a = np.asarray(a).astype(dtype)
        return a.astype(np.float64) if spec else a
    return {k: cast(v) for k, v in arrays.items()} if isinstance(arrays, dict) else cast(arrays)


def _jitter(rng, params):
    """``params`` with every entry moved a little (non-zero biases, a policy head that is not
    nearly zero)."""
    return {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in params.items()}


def _mlp_case(lead, hidden, activation="tanh", dtype=np.float64, backward=False):
    def run(tier, rng):
        params = _as(tier, dtype, _jitter(rng, spec_layers.mlp_init(
            rng, 5, hidden, 3)))
        x = _as(tier, dtype, rng.standard_normal(lead + (5,)))
        y, cache = tier.mlp_forward(params, x, activation)
        if not backward:
            return y
        return tier.mlp_backward(params, cache, _as(tier, dtype, rng.standard_normal(y.shape)))
    return run


def _mlp_cases(backward):
    return [Case("f64", _mlp_case((33,), (64, 64), backward=backward), **MLP_F64),
            Case("f64 [T, N, H]", _mlp_case((7, 3), (16,), backward=backward), **MLP_F64),
            Case("f64 no hidden", _mlp_case((9,), (), backward=backward), **MLP_F64),
            Case("f64 relu", _mlp_case((20,), (32, 8), "relu", backward=backward), **MLP_F64),
            Case("f32", _mlp_case((4, 33), (64, 64), dtype=np.float32, backward=backward),
                 **MLP_F32)]


ROWS[("layers", "mlp_forward")] = _mlp_cases(False)
ROWS[("layers", "mlp_backward")] = _mlp_cases(True)


def _net_case(what, net_arch=(64, 64), shared_trunk=False, activation="tanh",
              dtype=np.float64, rows=40):
    def run(tier, rng):
        params = _as(tier, dtype, _jitter(rng, spec_networks.actor_critic_init(
            rng, 6, 3, net_arch=net_arch, shared_trunk=shared_trunk)))
        obs = _as(tier, dtype, rng.standard_normal((rows, 6)))
        if what == "value":
            return tier.value_forward(params, obs, activation, shared_trunk)
        policy_out, values, cache = tier.actor_critic_forward(params, obs, activation,
                                                              shared_trunk)
        if what == "forward":
            return policy_out, values
        d_policy_out, d_values = (_as(tier, dtype, rng.standard_normal(a.shape))
                                  for a in (policy_out, values))
        return tier.actor_critic_backward(params, cache, d_policy_out, d_values)
    return run


def _net_cases(what):
    return [Case("f64", _net_case(what), **MLP_F64),
            Case("f64 shared trunk", _net_case(what, shared_trunk=True), **MLP_F64),
            Case("f64 net_arch=()", _net_case(what, net_arch=()), **MLP_F64),
            Case("f64 shared net_arch=()", _net_case(what, net_arch=(), shared_trunk=True),
                 **MLP_F64),
            Case("f64 relu [32]", _net_case(what, net_arch=(32,), activation="relu"),
                 **MLP_F64),
            Case("f64 relu shared [16, 24]", _net_case(what, net_arch=(16, 24),
                                                      shared_trunk=True, activation="relu"),
                 **MLP_F64),
            Case("f32", _net_case(what, dtype=np.float32, rows=256), **MLP_F32),
            Case("f32 shared trunk", _net_case(what, shared_trunk=True, dtype=np.float32),
                 **MLP_F32)]


ROWS[("networks", "actor_critic_forward")] = _net_cases("forward")
ROWS[("networks", "actor_critic_backward")] = _net_cases("backward")
ROWS[("networks", "value_forward")] = _net_cases("value")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shared_trunk, activation", [(False, "tanh"), (True, "tanh"),
                                                      (False, "relu")])
def test_layers_and_networks_rows_do_not_depend_on_the_batch(dtype, shared_trunk, activation):
    """A row's outputs are the same bits whichever rows share the call (acting on a few rows
    and a minibatch agree): the forward of a batch is the concatenation of the forwards of
    its parts, and a tower on ``[T, N, in]`` is the tower on each ``[N, in]``."""
    from ppo_ref.fast import layers, networks
    rng = np.random.default_rng(5)
    params = {k: v.astype(dtype) for k, v in _jitter(rng, spec_networks.actor_critic_init(
        rng, 4, 2, shared_trunk=shared_trunk)).items()}
    obs = rng.standard_normal((256, 4)).astype(dtype)
    policy_out, values, _ = networks.actor_critic_forward(params, obs, activation, shared_trunk)
    parts = [networks.actor_critic_forward(params, obs[lo:hi], activation, shared_trunk)
             for lo, hi in ((0, 8), (8, 9), (9, 100), (100, 256))]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), policy_out)
    assert np.array_equal(np.concatenate([p[1] for p in parts]), values)
    assert np.array_equal(networks.value_forward(params, obs[3:11], activation, shared_trunk),
                          values[3:11])
    tower = {k[3:]: v for k, v in params.items() if k.startswith("vf.")}
    x = rng.standard_normal((5, 7, tower["w0"].shape[1])).astype(dtype)
    y, _ = layers.mlp_forward(tower, x, activation)
    for t in range(5):
        assert np.array_equal(layers.mlp_forward(tower, x[t], activation)[0], y[t])


def test_layers_and_networks_mixed_dtypes_compute_in_float64():
    """Float32 parameters with float64 observations, one float32 array among float64 ones,
    float64 biases among float32 arrays, or a weight of another layout: the pass computes in
    float64, as the all-float64 call on the same values."""
    from ppo_ref.fast import layers, networks
    rng = np.random.default_rng(6)
    params = _jitter(rng, spec_networks.actor_critic_init(rng, 4, 2))
    obs = rng.standard_normal((10, 4)).astype(np.float32).astype(np.float64)
    low = {k: v.astype(np.float32) for k, v in params.items()}
    widened = {k: v.astype(np.float64) for k, v in low.items()}
    expected = networks.actor_critic_forward(widened, obs)
    biases_f64 = {k: v.astype(np.float64) if ".b" in k else v for k, v in low.items()}
    for mixed, x in ((low, obs), ({**widened, "pi.b1": low["pi.b1"]}, obs),
                     (biases_f64, obs.astype(np.float32)),
                     ({**widened, "vf.w1": np.asfortranarray(widened["vf.w1"])}, obs)):
        policy_out, values, cache = networks.actor_critic_forward(mixed, x)
        assert policy_out.dtype == values.dtype == np.float64
        assert np.array_equal(policy_out, expected[0]) and np.array_equal(values, expected[1])
        grads = networks.actor_critic_backward(mixed, cache, np.ones((10, 2)), np.ones(10))
        assert list(grads) == list(params)
        assert all(g.dtype == np.float64 for g in grads.values())
    tower = {k[3:]: v for k, v in low.items() if k.startswith("pi.")}
    assert layers.mlp_forward(tower, obs)[0].dtype == np.float64
    assert layers.mlp_forward(tower, obs.astype(np.float32))[0].dtype == np.float32


def test_layers_and_networks_errors():
    """A non-finite result raises FloatingPointError naming the twin; widths that do not
    chain raise ValueError."""
    from ppo_ref.fast import layers, networks
    rng = np.random.default_rng(7)
    params = spec_networks.actor_critic_init(rng, 4, 2)
    obs = rng.standard_normal((3, 4))
    huge = {**params, "vf.w2": np.full_like(params["vf.w2"], 1e308),
            "vf.b1": params["vf.b1"] + 30.0}  # tanh(.) = 1: 64 terms of 1e308
    with pytest.raises(FloatingPointError, match="actor_critic_forward"):
        networks.actor_critic_forward(huge, obs)
    with pytest.raises(FloatingPointError, match="value_forward"):
        networks.value_forward(huge, obs)
    _, _, cache = networks.actor_critic_forward(params, obs)
    with pytest.raises(FloatingPointError, match="actor_critic_backward"):
        networks.actor_critic_backward(params, cache, np.full((3, 2), np.nan), np.ones(3))
    with pytest.raises(ValueError, match="params"):
        networks.actor_critic_forward(params, rng.standard_normal((3, 5)))
    with pytest.raises(ValueError, match="params"):
        networks.actor_critic_forward({**params, "pi.w1": params["pi.w1"][:, :10]}, obs)
    tower = {k[3:]: v for k, v in params.items() if k.startswith("pi.")}
    with pytest.raises(FloatingPointError, match="mlp_forward"):
        layers.mlp_forward(tower, np.full((2, 4), np.inf))


# --- lstm, recurrent_networks ------------------------------------------------------------------


def twins() -> List[Tuple[str, str]]:
    """Every (module, function) with a public fast twin: the functions of
    ``ppo_ref.spec.<module>.__all__`` that ``ppo_ref.fast.<module>`` defines (classes aside)."""
    out = []
    for info in pkgutil.iter_modules(ppo_ref.fast.__path__):
        if info.name.startswith("_"):
            continue
        try:
            spec_module = importlib.import_module(f"ppo_ref.spec.{info.name}")
        except ModuleNotFoundError:
            continue
        fast_module = importlib.import_module(f"ppo_ref.fast.{info.name}")
        for name in getattr(spec_module, "__all__", ()):
            spec_obj = getattr(spec_module, name)
            if callable(spec_obj) and not isinstance(spec_obj, type) and hasattr(fast_module, name):
                out.append((info.name, name))
    return out


def _compare(spec_out, fast_out, rtol: float, atol: float, where: str) -> None:
    if isinstance(spec_out, (tuple, list)):
        assert isinstance(fast_out, (tuple, list)) and len(fast_out) == len(spec_out), where
        for i, (s, f) in enumerate(zip(spec_out, fast_out)):
            _compare(s, f, rtol, atol, f"{where}[{i}]")
        return
    if isinstance(spec_out, dict):
        assert isinstance(fast_out, dict) and list(fast_out) == list(spec_out), where
        for k in spec_out:
            _compare(spec_out[k], fast_out[k], rtol, atol, f"{where}[{k!r}]")
        return
    if spec_out is None:
        assert fast_out is None, where
        return
    s, f = np.asarray(spec_out), np.asarray(fast_out)
    assert s.shape == f.shape, f"{where}: shape {f.shape} != {s.shape}"
    if s.dtype.kind in "biu":
        np.testing.assert_array_equal(f, s, err_msg=where)
        return
    s64, f64 = s.astype(np.float64), f.astype(np.float64)
    if rtol == 0.0 and atol == 0.0:
        np.testing.assert_array_equal(f64, s64, err_msg=where)
        return
    scale = float(np.max(np.abs(s64[np.isfinite(s64)]), initial=0.0))
    bound = atol + rtol * scale
    both_nan = np.isnan(s64) & np.isnan(f64)
    gap = np.where(both_nan, 0.0, np.abs(f64 - s64))
    assert np.all(gap <= bound), f"{where}: max gap {float(np.max(gap))} > {bound}"


def _cases():
    for (module, name), cases in sorted(ROWS.items()):
        for case in cases:
            yield pytest.param(module, name, case, id=f"{module}.{name}:{case.name}")


def test_every_twin_has_a_row_and_every_row_a_twin():
    assert sorted(ROWS) == sorted(twins())
    for key, cases in ROWS.items():
        assert cases, f"{key} has no case"


def test_fast_public_names_are_spec_names():
    for info in pkgutil.iter_modules(ppo_ref.fast.__path__):
        if info.name.startswith("_"):
            continue
        fast_module = importlib.import_module(f"ppo_ref.fast.{info.name}")
        spec_module = importlib.import_module(f"ppo_ref.spec.{info.name}")
        for name in getattr(fast_module, "__all__", ()):
            assert name in getattr(spec_module, "__all__", ()), f"fast.{info.name}.{name}"


@pytest.mark.parametrize("module, name, case", list(_cases()))
def test_twin_equals_spec(module, name, case):
    from ppo_ref.tiers import tier_for
    if case.whole_tier:
        spec_side, fast_side = tier_for("spec"), tier_for("fast")
    else:
        spec_side = importlib.import_module(f"ppo_ref.spec.{module}")
        fast_side = importlib.import_module(f"ppo_ref.fast.{module}")
    spec_out = case.run(spec_side, np.random.default_rng(20261207))
    fast_out = case.run(fast_side, np.random.default_rng(20261207))
    _compare(spec_out, fast_out, case.rtol, case.atol, f"{module}.{name}:{case.name}")
