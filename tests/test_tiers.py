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
equal to NaN), with the same shape, and the same integer or boolean values; the containers are of
the same types (NamedTuples: the same field names) and every leaf of the fast result has the spec
result's type and dtype, except on a row with a ``compute_dtype``: there the fast twin computes in
that dtype (float32 inputs to a network, distribution or LSTM function) while the spec computes in
float64, and each float array or NumPy float of the fast result is of ``compute_dtype``.
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
    #: None: the fast result's dtypes are the spec result's; a float dtype: the fast twin computes
    #: in it (the spec in float64), and its float results are of that dtype
    compute_dtype: Any = None


BITS = dict(rtol=0.0, atol=0.0)

#: (module, function) -> the cases of that twin. Each section is owned by the module's author.
ROWS: Dict[Tuple[str, str], List[Case]] = {}

# --- masks, advantages -------------------------------------------------------------------------

def _flags(rng, shape, p_term=0.15, p_trunc=0.15):
    return rng.random(shape) < p_term, rng.random(shape) < p_trunc


def _trajectory(rng, shape=(17, 5), dtype=np.float64):
    term, trunc = _flags(rng, shape)
    term.reshape(shape[0], -1)[-1, 0] = trunc.reshape(shape[0], -1)[-2, 0] = True  # late flags
    term.reshape(shape[0], -1)[3, 0] = trunc.reshape(shape[0], -1)[3, 0] = True  # both on a step
    f = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    return dict(behaviour_log_probs=f(*shape) - 1.0, target_log_probs=f(*shape) - 1.0,
                rewards=f(*shape), values=f(*shape), terminated=term, truncated=trunc,
                last_values=f(*shape[1:]), final_values=f(*shape))


def _gae_case(dtype=np.float64, one_env=False, **given):
    def run(m, rng):
        options = dict(given)
        t = _trajectory(rng, (23,) if one_env else (17, 5), dtype)
        del t["behaviour_log_probs"], t["target_log_probs"]
        if one_env:
            t["last_values"] = dtype(t["last_values"])
        gamma = options.pop("gamma", 0.99)
        if isinstance(gamma, str):  # one discount per step
            gamma = rng.uniform(0.8, 1.0, t["rewards"].shape[0])
        return m.gae(**t, gamma=gamma, gae_lambda=options.pop("gae_lambda", 0.95), **options)
    return run


def _per_step_factors_case(fn):
    """gae with ``gamma [T, N]`` and ``gae_lambda [T]``; vtrace with ``gamma [T]`` and
    ``lambda_ [T, N]`` (discounts and lambdas that vary by step, as some libraries pass them)."""
    def run(m, rng):
        t = _trajectory(rng)
        shape = t["rewards"].shape
        per_row = rng.choice([0.0, 0.5, 0.9, 1.0], shape[0])
        per_entry = rng.choice([0.0, 0.7, 0.95, 1.0], shape)
        if fn == "gae":
            del t["behaviour_log_probs"], t["target_log_probs"]
            return m.gae(**t, gamma=per_entry, gae_lambda=per_row)
        return m.vtrace(**t, gamma=per_row, lambda_=per_entry, c_bar=0.9)
    return run


def _vtrace_case(dtype=np.float64, **given):
    def run(m, rng):
        options = dict(given)
        t = _trajectory(rng, dtype=dtype)
        lambda_ = options.pop("lambda_", 1.0)
        if isinstance(lambda_, str):  # one lambda per step and env
            lambda_ = rng.uniform(0.5, 1.0, t["rewards"].shape)
        out = m.vtrace(**t, gamma=0.99, lambda_=lambda_, **options)
        assert type(out).__name__ == "VTraceReturns"
        return out
    return run


def _episode_starts_case(shape, scalar_initial=False):
    def run(m, rng):
        term, trunc = _flags(rng, shape, 0.3, 0.2)
        initial = True if scalar_initial else rng.random(shape[1:]) < 0.5
        return m.episode_starts(term, trunc, initial)
    return run


def _transition_masks_case(truncation):
    def run(m, rng):
        term, trunc = _flags(rng, (13, 4), 0.3, 0.3)
        return tuple(m.transition_masks(term.astype(np.int8), trunc, truncation))
    return run


ROWS[("masks", "episode_starts")] = [
    Case("T_N", _episode_starts_case((19, 6)), **BITS),
    Case("T_only", _episode_starts_case((19,), scalar_initial=True), **BITS),
    Case("scalar_initial", _episode_starts_case((7, 3), scalar_initial=True), **BITS),
    Case("empty", _episode_starts_case((0, 3)), **BITS),
]
ROWS[("masks", "transition_masks")] = [
    Case(mode, _transition_masks_case(mode), **BITS)
    for mode in ("bootstrap", "terminate", "ignore")]
ROWS[("advantages", "gae")] = [
    Case("float64", _gae_case(), **BITS),
    Case("float32", _gae_case(np.float32), **BITS),
    Case("one_env", _gae_case(one_env=True), **BITS),
    Case("terminate", _gae_case(truncation="terminate"), **BITS),
    Case("ignore_thrust_last_row", _gae_case(truncation="ignore",
                                             bootstrap_terminal_last_row=True), **BITS),
    Case("per_step_gamma", _gae_case(gamma="per_step", gae_lambda=0.0), **BITS),
    Case("per_step_gamma_T_N_lambda_T", _per_step_factors_case("gae"), **BITS),
    Case("empty_float32", lambda m, rng: m.gae(*(np.zeros((0, 3), np.float32),) * 4,
                                              np.zeros(3, np.float32), gamma=0.9,
                                              gae_lambda=0.9), **BITS),
]
ROWS[("advantages", "vtrace")] = [
    Case("float64", _vtrace_case(), **BITS),
    Case("float32", _vtrace_case(np.float32), **BITS),
    Case("bars_lambda", _vtrace_case(rho_bar=0.8, c_bar=1.3, pg_rho_bar=2.0, lambda_=0.9),
         **BITS),
    Case("per_step_lambda_terminate", _vtrace_case(lambda_="per_step", truncation="terminate"),
         **BITS),
    Case("per_step_gamma_T_lambda_T_N", _per_step_factors_case("vtrace"), **BITS),
    Case("empty_float32", lambda m, rng: m.vtrace(*(np.zeros((0, 3), np.float32),) * 6,
                                                 np.zeros(3, np.float32), gamma=0.9), **BITS),
]

# --- distributions -----------------------------------------------------------------------------

#: the categorical twins (compiled row loops, libm exp/log, sums left to right): rtol 1e-12,
#: atol 1e-15 against the spec's NumPy; float32 inputs are computed in float32
CAT_TOL = dict(rtol=1e-12, atol=1e-15)
F32_TOL = dict(rtol=1e-5, atol=1e-6, compute_dtype=np.float32)


def _logits(rng, shape=(40, 5), masked=0.0, dtype=np.float64):
    """Logits with ~``masked`` of the entries -inf (never a whole row: the first stays)."""
    z = 3.0 * rng.standard_normal(shape)
    z[(rng.random(shape) < masked) & (np.arange(shape[-1]) > 0)] = -np.inf
    return z.astype(dtype)


def _finite_and_mask(x):
    """``(x with -inf as 0, where x is -inf)``: a masked log-probability compares exactly."""
    x = np.asarray(x)
    return np.where(np.isneginf(x), 0.0, x), np.isneginf(x)


def _actions(rng, z):
    return rng.integers(0, z.shape[-1], z.shape[:-1])


def _cat_case(fn, dtype=np.float64, shape=(40, 5), masked=0.0):
    def run(m, rng):
        z = _logits(rng, shape, masked, dtype)
        a = _actions(rng, z)
        d = rng.standard_normal(z.shape[:-1]).astype(dtype)
        d_entropy = rng.standard_normal(z.shape[:-1]).astype(dtype)
        args = {"log_softmax": (z,), "categorical_log_prob": (z, a),
                "categorical_entropy": (z,), "categorical_log_prob_backward": (z, a, d),
                "categorical_entropy_backward": (z, d), "categorical_log_prob_entropy": (z, a),
                "categorical_log_prob_entropy_backward": (z, a, d, d_entropy),
                "categorical_log_prob_entropy_backward_no_entropy": (z, a, d, None)}[fn]
        out = getattr(m, fn.replace("_no_entropy", ""))(*args)
        outs = out if isinstance(out, tuple) else (out,)
        if m.__name__.startswith("ppo_ref.fast"):
            assert all(o.dtype == dtype for o in outs)
        return [_finite_and_mask(o) for o in outs]
    return run


def _cat_rows(fn):
    return [Case("plain", _cat_case(fn), **CAT_TOL),
            Case("masked_3d", _cat_case(fn, shape=(4, 6, 9), masked=0.4), **CAT_TOL),
            Case("one_row", _cat_case(fn, shape=(7,), masked=0.3), **CAT_TOL),
            Case("float32", _cat_case(fn, np.float32, masked=0.3), **F32_TOL)]


for _fn in ("log_softmax", "categorical_log_prob", "categorical_entropy",
            "categorical_log_prob_backward", "categorical_entropy_backward",
            "categorical_log_prob_entropy", "categorical_log_prob_entropy_backward"):
    ROWS[("distributions", _fn)] = _cat_rows(_fn)
ROWS[("distributions", "categorical_log_prob_entropy_backward")] += [
    Case("no_entropy", _cat_case("categorical_log_prob_entropy_backward_no_entropy", masked=0.3),
         **CAT_TOL),
    Case("no_entropy_float32", _cat_case("categorical_log_prob_entropy_backward_no_entropy",
                                         np.float32, masked=0.3), **F32_TOL),
]


def _sample_case(dtype=np.float64, shape=(64, 5), masked=0.4):
    def run(m, rng):
        z = _logits(rng, shape, masked, dtype)
        return m.categorical_sample(rng, z), rng.random()  # the actions and the rng after
    return run


ROWS[("distributions", "categorical_sample")] = [
    Case("masked", _sample_case(), **BITS),
    Case("float32", _sample_case(np.float32), **BITS),
    Case("one_row", _sample_case(shape=(3,), masked=0.0), **BITS),
    Case("batch_2d", _sample_case(shape=(3, 4, 2), masked=0.0), **BITS),
]
ROWS[("distributions", "categorical_mode")] = [
    Case("masked", lambda m, rng: m.categorical_mode(_logits(rng, (30, 6), 0.5)), **BITS),
    Case("ties", lambda m, rng: m.categorical_mode(np.array([[1.0, 1.0, -np.inf],
                                                             [-np.inf, 2.0, 2.0]])), **BITS),
]

NVEC = (3, 1, 4)


def _multi_case(fn, dtype=np.float64, masked=0.3, batch=(24,)):
    def run(m, rng):
        z = 3.0 * rng.standard_normal(batch + (sum(NVEC),))
        first = np.zeros(sum(NVEC), bool)
        first[np.cumsum((0,) + NVEC[:-1])] = True  # each component keeps its first action
        z[(rng.random(z.shape) < masked) & ~first] = -np.inf
        z = z.astype(dtype)
        a = np.stack([rng.integers(0, n, batch) for n in NVEC], axis=-1)
        d = rng.standard_normal(batch).astype(dtype)
        args = {"multi_categorical_log_prob": (z, a, NVEC),
                "multi_categorical_entropy": (z, NVEC),
                "multi_categorical_log_prob_backward": (z, a, NVEC, d),
                "multi_categorical_entropy_backward": (z, NVEC, d),
                "multi_categorical_sample": (rng, z, NVEC),
                "multi_categorical_mode": (z, NVEC)}[fn]
        out = getattr(m, fn)(*args)
        if fn.endswith(("sample", "mode")):
            return out, rng.random()
        return _finite_and_mask(out)
    return run


for _fn in ("multi_categorical_log_prob", "multi_categorical_entropy",
            "multi_categorical_log_prob_backward", "multi_categorical_entropy_backward",
            "multi_categorical_sample", "multi_categorical_mode"):
    _tol = BITS if _fn.endswith(("sample", "mode")) else CAT_TOL
    ROWS[("distributions", _fn)] = [
        Case("masked", _multi_case(_fn), **_tol),
        Case("batch_2d", _multi_case(_fn, masked=0.0, batch=(3, 5)), **_tol),
        Case("float32", _multi_case(_fn, np.float32), **(BITS if _tol is BITS else F32_TOL)),
    ]


def _gaussian_case(fn, dtype=np.float64, batch=(32,)):
    def run(m, rng):
        mean = rng.standard_normal(batch + (3,)).astype(dtype)
        log_std = rng.uniform(-1.0, 0.5, 3).astype(dtype)
        actions = (mean + rng.standard_normal(mean.shape)).astype(dtype)
        d = rng.standard_normal(batch).astype(dtype)
        args = {"gaussian_log_prob": (mean, log_std, actions),
                "gaussian_log_prob_backward": (mean, log_std, actions, d),
                "gaussian_entropy": (log_std, batch),
                "gaussian_entropy_backward": (log_std, d),
                "gaussian_sample": (rng, mean, log_std)}[fn]
        out = getattr(m, fn)(*args)
        return (out, rng.random()) if fn == "gaussian_sample" else out
    return run


for _fn in ("gaussian_log_prob", "gaussian_log_prob_backward", "gaussian_entropy",
            "gaussian_entropy_backward", "gaussian_sample"):
    ROWS[("distributions", _fn)] = [
        Case("float64", _gaussian_case(_fn), **BITS),
        Case("batch_2d", _gaussian_case(_fn, batch=(4, 5)), **BITS),
        Case("float32", _gaussian_case(_fn, np.float32), **F32_TOL),
    ]


#: the gSDE twins: gsde_std and the matrices the spec's NumPy arithmetic (bits); the rest sum
#: their products in compiled loops (the spec's are BLAS's)
GSDE_F64 = dict(rtol=1e-12, atol=1e-14)
GSDE_BITS_FNS = ("gsde_std", "gsde_exploration_matrices")


def _gsde_case(fn, dtype=np.float64, full_std=True, use_expln=False, batch=32, latent=16):
    def run(m, rng):
        n_actions = 3
        mean = rng.standard_normal((batch, n_actions)).astype(dtype)
        log_std = rng.uniform(-1.5, 1.0, (latent, n_actions if full_std else 1)).astype(dtype)
        features = np.tanh(rng.standard_normal((batch, latent))).astype(dtype)
        actions = (mean + rng.standard_normal(mean.shape)).astype(dtype)
        d = rng.standard_normal(batch).astype(dtype)
        matrices = (0.3 * rng.standard_normal((batch, latent, n_actions))).astype(dtype)
        args = {"gsde_std": (log_std, use_expln),
                "gsde_log_prob": (mean, log_std, features, actions, use_expln),
                "gsde_log_prob_backward": (mean, log_std, features, actions, d, use_expln),
                "gsde_entropy": (log_std, features, n_actions, use_expln),
                "gsde_entropy_backward": (log_std, features, n_actions, d, use_expln),
                "gsde_exploration_matrices": (rng, log_std, batch, n_actions, use_expln),
                "gsde_action": (mean, features, matrices)}[fn]
        out = getattr(m, fn)(*args)
        return (out, rng.random()) if fn == "gsde_exploration_matrices" else out
    return run


for _fn in ("gsde_std", "gsde_log_prob", "gsde_log_prob_backward", "gsde_entropy",
            "gsde_entropy_backward", "gsde_exploration_matrices", "gsde_action"):
    _tol = BITS if _fn in GSDE_BITS_FNS else GSDE_F64
    ROWS[("distributions", _fn)] = [
        Case("full_std", _gsde_case(_fn), **_tol),
        Case("one_std_per_feature", _gsde_case(_fn, full_std=False), **_tol),
        Case("expln", _gsde_case(_fn, use_expln=True), **_tol),
        Case("expln_one_std_per_feature", _gsde_case(_fn, full_std=False, use_expln=True),
             **_tol),
        Case("one_row", _gsde_case(_fn, batch=1, latent=4), **_tol),
        Case("float32", _gsde_case(_fn, np.float32, use_expln=True), **F32_TOL),
    ]
del _fn, _tol


# --- losses, optim -----------------------------------------------------------------------------

def _loss_arrays(rng, n=96, dtype=np.float64):
    """Minibatch-like arrays with ratios at and past the clip bounds, zero advantages, value
    deltas at and past the value clip range, and a 0/1-and-half weight vector."""
    old = rng.normal(-1.0, 0.5, n)
    new = old + rng.normal(0.0, 0.2, n)
    new[:4] = old[:4] + np.log([0.8, 1.2, 1.0 / 1.2, 3.0])  # on the symmetric / reciprocal bounds
    new[4] = old[4] + 30.0                                  # a huge ratio
    adv = rng.standard_normal(n)
    adv[5:7] = 0.0
    values = rng.standard_normal(n)
    old_values = values + rng.normal(0.0, 0.4, n)
    old_values[7:11] = values[7:11] + np.array([0.3, -0.3, 1.0, -1.0])
    returns = values + rng.normal(0.0, 1.5, n)
    weights = (rng.random(n) < 0.7) * rng.choice([1.0, 0.5], n)
    entropy = rng.uniform(0.0, 1.5, n)
    cast = lambda a: a.astype(dtype)  # noqa: E731
    return dict(new=cast(new), old=cast(old), adv=cast(adv), values=cast(values),
                old_values=cast(old_values), returns=cast(returns), weights=weights,
                entropy=cast(entropy))


def _policy_loss_case(dtype=np.float64, weighted=False, shape=None, **options):
    def run(m, rng):
        a = _loss_arrays(rng, dtype=dtype)
        shaped = (lambda x: x.reshape(shape)) if shape else (lambda x: x)  # noqa: E731
        return m.policy_loss(shaped(a["new"]), shaped(a["old"]), shaped(a["adv"]), 0.2,
                             weights=shaped(a["weights"]) if weighted else None, **options)
    return run


def _value_loss_case(clip_range_vf, mode="max", dtype=np.float64, weighted=False, **options):
    def run(m, rng):
        a = _loss_arrays(rng, dtype=dtype)
        old_values = None if options.pop("no_old", False) else a["old_values"]
        return m.value_loss(a["values"], old_values, a["returns"], clip_range_vf, mode,
                            weights=a["weights"] if weighted else None, **options)
    return run


def _value_bound_case(mode, boundary_grad):
    """Dyadic values, a third of them exactly on ``old_values +- 0.25``: where
    ``boundary_grad`` acts."""
    def run(m, rng):
        old = rng.integers(-16, 16, 48) / 8.0
        step = rng.choice([-0.25, 0.25, 0.125, -0.5, 0.75], 48)
        returns = rng.integers(-16, 16, 48) / 4.0
        return m.value_loss(old + step, old, returns, 0.25, mode, boundary_grad=boundary_grad)
    return run


def _entropy_loss_case(dtype=np.float64, weighted=False, n=96):
    def run(m, rng):
        a = _loss_arrays(rng, n=n, dtype=dtype)
        return m.entropy_loss(a["entropy"], weights=a["weights"] if weighted else None)
    return run


def _approx_kl_case(estimator, weighted=False, dtype=np.float64):
    def run(m, rng):
        a = _loss_arrays(rng, dtype=dtype)
        return m.approx_kl(a["old"], a["new"], estimator,
                           weights=a["weights"] if weighted else None)
    return run


def _normalize_case(dtype=np.float64, n=96, **options):
    def run(m, rng):
        return m.normalize_advantages((3.0 * rng.standard_normal(n) + 1.0).astype(dtype),
                                      **options)
    return run


ROWS[("losses", "policy_loss")] = [
    Case("plain", _policy_loss_case(), **BITS),
    Case("float32", _policy_loss_case(np.float32), **BITS),
    Case("weights_2d", _policy_loss_case(weighted=True, shape=(8, 12)), **BITS),
    Case("dual_clip_asymmetric", _policy_loss_case(dual_clip=2.0, clip_range_low=0.1,
                                                   clip_range_high=0.3), **BITS),
    Case("reciprocal_weights", _policy_loss_case(weighted=True, clip_interval="reciprocal"),
         **BITS),
    Case("active_clip_fraction", _policy_loss_case(weighted=True, dual_clip=2.0,
                                                   clip_fraction_mode="active"), **BITS),
]
ROWS[("losses", "value_loss")] = [
    Case("unclipped_no_old", _value_loss_case(None, no_old=True), **BITS),
    Case("max", _value_loss_case(0.3), **BITS),
    Case("sb3_float32", _value_loss_case(0.3, "sb3", np.float32), **BITS),
    Case("huber_weights", _value_loss_case(0.3, "huber", weighted=True, huber_delta=0.5),
         **BITS),
    Case("huber_unclipped", _value_loss_case(None, "huber"), **BITS),
    Case("on_the_bound_0.75", _value_bound_case("max", 0.75), **BITS),
    Case("huber_on_the_bound_0", _value_bound_case("huber", 0.0), **BITS),
]
ROWS[("losses", "entropy_loss")] = [
    Case("plain", _entropy_loss_case(), **BITS),
    Case("float32_long", _entropy_loss_case(np.float32, n=1000), **BITS),
    Case("float64_long", _entropy_loss_case(n=5000), **BITS),  # NumPy's pairwise sum, nested
    Case("weights", _entropy_loss_case(weighted=True), **BITS),
]
ROWS[("losses", "approx_kl")] = [
    Case("k3", _approx_kl_case("k3"), **BITS),
    Case("k1_weights", _approx_kl_case("k1", weighted=True), **BITS),
    Case("k3_weights_float32", _approx_kl_case("k3", True, np.float32), **BITS),
    Case("k2_weights", _approx_kl_case("k2", weighted=True), **BITS),
]
ROWS[("losses", "normalize_advantages")] = [
    Case("ddof1_add", _normalize_case(), **BITS),
    Case("ddof0_clamp_float32", _normalize_case(np.float32, ddof=0, placement="clamp"), **BITS),
    Case("ddof1_sqrt", _normalize_case(placement="sqrt"), **BITS),
    Case("one_element", _normalize_case(n=1), **BITS),
    Case("one_element_zero", _normalize_case(n=1, single_element="zero"), **BITS),
    Case("one_element_nan_float32", _normalize_case(np.float32, n=1, single_element="NaN"),
         **BITS),
    Case("constant", lambda m, rng: m.normalize_advantages(np.full(9, 2.5)), **BITS),
]


def _param_dict(rng, dtype=np.float64, scale=1.0):
    shapes = {"pi.w0": (16, 4), "pi.b0": (16,), "pi.w1": (3, 16), "pi.b1": (3,),
              "vf.w0": (16, 4), "vf.b0": (16,), "vf.w1": (1, 16), "vf.b1": (1,), "log_std": (3,)}
    return {k: (scale * rng.standard_normal(s)).astype(dtype) for k, s in shapes.items()}


def _adam_case(dtype=np.float64, t=0, steps=1, **options):
    """``steps`` Adam steps, each on the previous step's outputs (the compiled tier then reads
    its own buffers in place)."""
    def run(m, rng):
        params = _param_dict(rng, dtype)
        state = {"t": t, "m": _param_dict(rng, dtype, 0.01 if t else 0.0),
                 "v": {k: np.abs(a) for k, a in _param_dict(rng, dtype, 1e-4 if t else 0.0).items()}}
        for _ in range(steps):
            params, state = m.adam_update(params, _param_dict(rng, dtype, 0.1), state,
                                          lr=3e-4, **options)
        assert state["t"] == t + steps and type(params) is dict
        return params, state["m"], state["v"]
    return run


def _clip_case(dtype=np.float64, max_norm=0.5):
    def run(m, rng):
        grads = _param_dict(rng, dtype, 0.3)
        before = {k: a.copy() for k, a in grads.items()}
        clipped, norm = m.clip_by_global_norm(grads, max_norm)
        assert all(np.array_equal(grads[k], before[k]) for k in grads)  # inputs untouched
        assert all(clipped[k].dtype == grads[k].dtype for k in grads)
        return clipped, norm
    return run


def _clip_then_adam(m, rng):
    """The trainer's step, twice: clip_by_global_norm, then adam_update of its output."""
    tier = m
    params = _param_dict(rng)
    state = {"t": 0, "m": {k: np.zeros_like(a) for k, a in params.items()},
             "v": {k: np.zeros_like(a) for k, a in params.items()}}
    norms = []
    for _ in range(2):
        clipped, norm = tier.clip_by_global_norm(_param_dict(rng, scale=0.3), 0.5)
        params, state = tier.adam_update(params, clipped, state, lr=3e-4)
        norms.append(norm)
    return params, state["m"], state["v"], norms


#: clip_by_global_norm: the global norm's sums of squares in another order than NumPy's
#: pairwise sum (ppo_ref.fast.optim's docstring)
NORM_TOL = dict(rtol=1e-13, atol=0.0)

ROWS[("optim", "adam_update")] = [
    Case("first_step", _adam_case(), **BITS),
    Case("t7_options", _adam_case(t=7, betas=(0.8, 0.99), eps=1e-8), **BITS),
    Case("chained_steps", _adam_case(steps=3), **BITS),
    Case("float32", _adam_case(np.float32, t=2, steps=2), **BITS),
]
ROWS[("optim", "clip_by_global_norm")] = [
    Case("clipping", _clip_case(), **NORM_TOL),
    Case("no_clipping", _clip_case(max_norm=100.0), **NORM_TOL),
    Case("float32", _clip_case(np.float32), **NORM_TOL),
    Case("clip_then_adam", _clip_then_adam, **NORM_TOL),
]

# --- layers, networks --------------------------------------------------------------------------
# The MLP and actor-critic twins. A float32 case gives the fast tier float32 parameters and
# inputs and the spec the same values widened to float64 (the spec computes in float64).

from ppo_ref.spec import layers as spec_layers, networks as spec_networks  # noqa: E402

MLP_F64 = dict(rtol=1e-12, atol=1e-14)
MLP_F32 = dict(rtol=1e-4, atol=1e-6, compute_dtype=np.float32)


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
        if what == "policy":
            return tier.policy_forward(params, obs, activation, shared_trunk)
        policy_out, values, cache = tier.actor_critic_forward(params, obs, activation,
                                                              shared_trunk)
        if what == "forward":
            return policy_out, values
        if what == "latent":
            return tier.policy_latent(params, cache)
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
ROWS[("networks", "policy_forward")] = (
    _net_cases("policy") + [Case("f64 8 rows", _net_case("policy", rows=8), **MLP_F64),
                            Case("f32 8 rows", _net_case("policy", dtype=np.float32, rows=8),
                                 **MLP_F32)])
ROWS[("networks", "policy_latent")] = (
    _net_cases("latent") + [Case("f64 8 rows", _net_case("latent", rows=8), **MLP_F64)])


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
    for lo, hi in ((0, 8), (8, 9), (9, 100), (100, 256)):   # acting on a few rows
        assert np.array_equal(networks.policy_forward(params, obs[lo:hi], activation,
                                                      shared_trunk), policy_out[lo:hi])
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
# The LSTM and the LSTM actor-critic. Episode starts inside the sequence and at t = 0 (env 0
# starts at t = 0, the others at random steps); a backward case runs the same tier's forward
# first. A float32 case gives the fast tier float32 parameters, inputs and states and the spec
# the same values widened to float64.

from ppo_ref.spec import lstm as spec_lstm, recurrent_networks as spec_rn  # noqa: E402

# float64: FMA chains against BLAS, at most 1e-15 of the largest entry on these cases. float32:
# at most 7e-7 on these cases (32 steps of 64 units; float32's unit roundoff is 6e-8).
LSTM_F64 = dict(rtol=1e-12, atol=1e-14)
LSTM_F32 = dict(rtol=1e-5, atol=1e-6, compute_dtype=np.float32)
LSTM_F32_BACKWARD = dict(rtol=2e-5, atol=1e-6, compute_dtype=np.float32)


def _widened(tier, dtype, arrays):
    """``arrays`` (a dict, a tuple or one array) rounded to ``dtype``; for the spec tier
    widened back to float64."""
    spec = tier.__name__.startswith("ppo_ref.spec")

    def cast(a):
        a = np.asarray(a).astype(dtype)
        return a.astype(np.float64) if spec else a
    if isinstance(arrays, dict):
        return {k: cast(v) for k, v in arrays.items()}
    if isinstance(arrays, tuple):
        return tuple(cast(a) for a in arrays)
    return cast(arrays)


def _starts(rng, n_steps, n_env, p=0.2):
    """Episode starts with env 0 starting at t = 0 and resets inside the sequence."""
    starts = rng.random((n_steps, n_env)) < p
    starts[0, 0] = True
    starts[n_steps // 2, n_env - 1] = True
    return starts


def _lstm_case(what, n_steps=9, n_env=5, d_in=4, hidden=16, dtype=np.float64, final_grads=True):
    def run(tier, rng):
        params = spec_lstm.lstm_init(rng, d_in, hidden)
        params["b"] = 0.5 * rng.standard_normal(4 * hidden)
        params = _widened(tier, dtype, params)
        x, h0, c0 = _widened(tier, dtype, (rng.standard_normal((n_steps, n_env, d_in)),
                                           rng.standard_normal((n_env, hidden)),
                                           rng.standard_normal((n_env, hidden))))
        starts = _starts(rng, n_steps, n_env)
        if what == "step":
            return tier.lstm_step(params, x[0], h0, c0, starts[0])
        h_seq, final, cache = tier.lstm_forward(params, x, h0, c0, starts)
        if what == "forward":
            return h_seq, final
        dh_seq, dh_T, dc_T = _widened(tier, dtype, (rng.standard_normal(h_seq.shape),
                                                    rng.standard_normal(h0.shape),
                                                    rng.standard_normal(h0.shape)))
        if not final_grads:
            dh_T = dc_T = None
        return tier.lstm_backward(params, cache, dh_seq, dh_T, dc_T)
    return run


ROWS[("lstm", "lstm_forward")] = [
    Case("f64", _lstm_case("forward"), **LSTM_F64),
    Case("f64 T=32 N=8 H=64", _lstm_case("forward", 32, 8, 4, 64), **LSTM_F64),
    Case("f64 H=3 N=1", _lstm_case("forward", 6, 1, 2, 3), **LSTM_F64),
    Case("f32", _lstm_case("forward", 32, 8, 4, 64, np.float32), **LSTM_F32)]
ROWS[("lstm", "lstm_backward")] = [
    Case("f64 dh_T dc_T", _lstm_case("backward"), **LSTM_F64),
    Case("f64 no final grads", _lstm_case("backward", final_grads=False), **LSTM_F64),
    Case("f64 T=32 N=8 H=64", _lstm_case("backward", 32, 8, 4, 64), **LSTM_F64),
    Case("f64 H=3 N=1", _lstm_case("backward", 6, 1, 2, 3), **LSTM_F64),
    Case("f32", _lstm_case("backward", 32, 8, 4, 64, np.float32), **LSTM_F32_BACKWARD)]
ROWS[("lstm", "lstm_step")] = [
    Case("f64", _lstm_case("step"), **LSTM_F64),
    Case("f32", _lstm_case("step", dtype=np.float32), **LSTM_F32)]


def _rnn_case(what, lstm_shared=False, net_arch=(64,), activation="relu", n_steps=12,
              n_env=6, hidden=32, dtype=np.float64):
    def run(tier, rng):
        params = spec_rn.recurrent_actor_critic_init(
            rng, 4, 3, hidden_size=hidden, lstm_shared=lstm_shared, net_arch=net_arch,
            activation=activation)
        params = _widened(tier, dtype, {k: v + 0.2 * rng.standard_normal(v.shape)
                                        for k, v in params.items()})
        n_lstm = 1 if lstm_shared else 2
        obs, h, c = _widened(tier, dtype, (rng.standard_normal((n_steps, n_env, 4)),
                                           rng.standard_normal((n_lstm, n_env, hidden)),
                                           rng.standard_normal((n_lstm, n_env, hidden))))
        state = spec_rn.LSTMStates(h, c)
        starts = _starts(rng, n_steps, n_env)
        if what == "step":
            return tier.recurrent_actor_critic_step(params, obs[0], state, starts[0],
                                                    activation, lstm_shared)
        if what == "step no values":
            return tier.recurrent_actor_critic_step(params, obs[0], state, starts[0],
                                                    activation, lstm_shared,
                                                    with_values=False)
        if what == "value":
            return tier.recurrent_value_step(params, obs[0], state, starts[0], activation,
                                             lstm_shared)
        policy_out, values, final, cache = tier.recurrent_actor_critic_forward(
            params, obs, state, starts, activation, lstm_shared)
        if what == "forward":
            return policy_out, values, final
        d_policy_out, d_values = _widened(tier, dtype, (rng.standard_normal(policy_out.shape),
                                                        rng.standard_normal(values.shape)))
        return tier.recurrent_actor_critic_backward(params, cache, d_policy_out, d_values)
    return run


def _rnn_cases(what, f64, f32):
    return [Case("f64 separate", _rnn_case(what), **f64),
            Case("f64 shared", _rnn_case(what, lstm_shared=True), **f64),
            Case("f64 tanh net_arch=()", _rnn_case(what, net_arch=(), activation="tanh"),
                 **f64),
            Case("f64 shared tanh [8, 8]", _rnn_case(what, True, (8, 8), "tanh"), **f64),
            Case("f32 separate", _rnn_case(what, n_steps=32, n_env=8, hidden=64,
                                           dtype=np.float32), **f32),
            Case("f32 shared", _rnn_case(what, True, dtype=np.float32), **f32)]


ROWS[("recurrent_networks", "recurrent_actor_critic_forward")] = _rnn_cases(
    "forward", LSTM_F64, LSTM_F32)
ROWS[("recurrent_networks", "recurrent_actor_critic_backward")] = _rnn_cases(
    "backward", LSTM_F64, LSTM_F32_BACKWARD)
ROWS[("recurrent_networks", "recurrent_actor_critic_step")] = (
    _rnn_cases("step", LSTM_F64, LSTM_F32)
    + [Case("f64 no values", _rnn_case("step no values"), **LSTM_F64)])
ROWS[("recurrent_networks", "recurrent_value_step")] = _rnn_cases("value", LSTM_F64, LSTM_F32)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lstm_shared", [False, True])
def test_recurrent_rows_do_not_depend_on_the_other_envs(dtype, lstm_shared):
    """An env's results are the same bits whichever envs share the call: acting on N envs one
    step at a time, the replay of all T steps and a minibatch of some of the envs agree (the
    first minibatch of an update has ratio exactly 1), for the LSTM and the actor-critic."""
    from ppo_ref.fast import lstm, recurrent_networks as rn
    rng = np.random.default_rng(11)
    n_steps, n_env, hidden = 10, 7, 16
    params = {k: (v + 0.2 * rng.standard_normal(v.shape)).astype(dtype)
              for k, v in spec_rn.recurrent_actor_critic_init(
                  rng, 3, 2, hidden_size=hidden, lstm_shared=lstm_shared, net_arch=(16,),
                  activation="tanh").items()}
    n_lstm = 1 if lstm_shared else 2
    obs = rng.standard_normal((n_steps, n_env, 3)).astype(dtype)
    start = spec_rn.LSTMStates(*rng.standard_normal((2, n_lstm, n_env, hidden)).astype(dtype))
    starts = _starts(rng, n_steps, n_env, 0.3)
    policy_out, values, final, _ = rn.recurrent_actor_critic_forward(
        params, obs, start, starts, "tanh", lstm_shared)
    state = start
    for t in range(n_steps):   # acting, one step at a time
        v = rn.recurrent_value_step(params, obs[t], state, starts[t], "tanh", lstm_shared)
        assert np.array_equal(v, values[t])
        out, v, state = rn.recurrent_actor_critic_step(params, obs[t], state, starts[t],
                                                       "tanh", lstm_shared)
        assert np.array_equal(out, policy_out[t]) and np.array_equal(v, values[t])
    assert np.array_equal(state.h, final.h) and np.array_equal(state.c, final.c)
    for envs in ([2], [0, 5], [6, 1, 3]):   # minibatches of some envs, in any order
        sub = rn.recurrent_actor_critic_forward(params, obs[:, envs], start.select(envs),
                                                starts[:, envs], "tanh", lstm_shared)
        assert np.array_equal(sub[0], policy_out[:, envs])
        assert np.array_equal(sub[1], values[:, envs])
    lstm_params = {k[len("lstm_pi."):] if not lstm_shared else k[len("lstm."):]: v
                   for k, v in params.items() if k.startswith("lstm")
                   and (lstm_shared or k.startswith("lstm_pi."))}
    h_seq, _, _ = lstm.lstm_forward(lstm_params, obs, start.h[0], start.c[0], starts)
    h, c = start.h[0], start.c[0]
    for t in range(n_steps):
        h, c = lstm.lstm_step(lstm_params, obs[t], h, c, starts[t])
        assert np.array_equal(h, h_seq[t])
    assert np.array_equal(lstm.lstm_forward(lstm_params, obs[:, 3:5], start.h[0][3:5],
                                            start.c[0][3:5], starts[:, 3:5])[0], h_seq[:, 3:5])


@pytest.mark.parametrize("module, call", [
    ("lstm", lambda m, p, x, s: m.lstm_forward(p["lstm"], x, s.h[0], s.c[0],
                                               np.zeros(x.shape[:2], bool))),
    ("recurrent_networks", lambda m, p, x, s: m.recurrent_actor_critic_forward(
        p["net"], x, s, np.zeros(x.shape[:2], bool), "tanh", True))])
def test_recurrent_non_finite_results_raise(module, call):
    """A non-finite result (here from a NaN input, which the fast tier does not validate)
    raises FloatingPointError naming the fast function, never returns NaN."""
    import importlib
    m = importlib.import_module(f"ppo_ref.fast.{module}")
    rng = np.random.default_rng(3)
    net = spec_rn.recurrent_actor_critic_init(rng, 3, 2, hidden_size=8, lstm_shared=True,
                                              net_arch=(8,))
    params = {"net": net, "lstm": {k[5:]: v for k, v in net.items() if k.startswith("lstm.")}}
    x = rng.standard_normal((4, 2, 3))
    x[2, 1, 0] = np.nan
    state = spec_rn.LSTMStates(np.zeros((1, 2, 8)), np.zeros((1, 2, 8)))
    with pytest.raises(FloatingPointError, match=f"ppo_ref.fast.{module}"):
        call(m, params, x, state)




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


def _compare(spec_out, fast_out, rtol: float, atol: float, where: str,
             compute_dtype=None) -> None:
    if isinstance(spec_out, (tuple, list)):
        if hasattr(spec_out, "_fields"):  # a NamedTuple: each tier may define its own class
            fields = getattr(fast_out, "_fields", None)
            assert fields == spec_out._fields, (
                f"{where}: {type(fast_out).__name__} fields {fields} != "
                f"{type(spec_out).__name__} fields {spec_out._fields}")
        else:
            assert type(fast_out) is type(spec_out), (
                f"{where}: {type(fast_out).__name__} != {type(spec_out).__name__}")
        assert len(fast_out) == len(spec_out), where
        for i, (s, f) in enumerate(zip(spec_out, fast_out)):
            _compare(s, f, rtol, atol, f"{where}[{i}]", compute_dtype)
        return
    if isinstance(spec_out, dict):
        assert type(fast_out) is type(spec_out) and list(fast_out) == list(spec_out), where
        for k in spec_out:
            _compare(spec_out[k], fast_out[k], rtol, atol, f"{where}[{k!r}]", compute_dtype)
        return
    if spec_out is None:
        assert fast_out is None, where
        return
    numpy_float = (isinstance(spec_out, (np.ndarray, np.generic))
                   and spec_out.dtype.kind == "f")
    if compute_dtype is not None and numpy_float:
        want = np.dtype(compute_dtype)
        want_type = np.ndarray if isinstance(spec_out, np.ndarray) else want.type
    else:
        want, want_type = np.asarray(spec_out).dtype, type(spec_out)
    # a Python float and a NumPy float64 scalar are one kind of result (np.float64 subclasses
    # float; compiled code boxes a float64 scalar as a Python float): the dtype check decides
    same_kind = (type(fast_out) is want_type
                 or (isinstance(fast_out, float) and issubclass(want_type, float)))
    assert same_kind, f"{where}: type {type(fast_out).__name__} != {want_type.__name__}"
    got = np.asarray(fast_out).dtype
    assert got == want, f"{where}: dtype {got} != {want}"
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
    _compare(spec_out, fast_out, case.rtol, case.atol, f"{module}.{name}:{case.name}",
             case.compute_dtype)
